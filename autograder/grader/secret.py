"""The course's grading secret: what every check's inputs are drawn from when grading.

Each test cell's checks draw their inputs from a seed derived from this secret, the
assignment, the notebook and the cell (`checks.inputs.cell_seed`): the same for every
student, so equal answers get equal scores and a regrade repeats the grade exactly, and
unknown to students, so inputs they have seen gain them nothing. It is made the first
time a course is graded, kept with the gradebook in the engine's folder of the course
root (never in the sandbox, never in what students get), and rotated with
`autograder secret --rotate` (each autograded notebook records its cells' seeds, so
earlier grades can still be replayed).
"""
from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from .preflight import STATE

NAME = "secret"


def path(root: Path) -> Path:
    return root / STATE / NAME


def load(root: Path) -> tuple[bytes, bool]:
    """(the course's secret, whether it was made just now)."""
    where = path(root)
    try:
        return bytes.fromhex(where.read_text().strip()), False
    except FileNotFoundError:
        pass
    where.parent.mkdir(exist_ok=True)
    try:
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it meanwhile
        return bytes.fromhex(where.read_text().strip()), False
    made = secrets.token_bytes(32)
    with os.fdopen(fd, "w") as f:
        f.write(made.hex() + "\n")
    return made, True


def rotate(root: Path) -> bytes:
    """A new secret in place of the old one (grades from now on draw other inputs)."""
    where = path(root)
    where.parent.mkdir(exist_ok=True)
    made = secrets.token_bytes(32)
    staged = where.with_name(NAME + ".new")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(made.hex() + "\n")
    os.replace(staged, where)
    return made


def fingerprint(secret: bytes) -> str:
    """A name for the secret that reveals nothing of it (for messages and records)."""
    return hashlib.sha256(b"fingerprint:" + secret).hexdigest()[:12]
