"""The course's grading secret: what every check's inputs are drawn from when grading.

Each test cell's checks draw their inputs from a seed derived from this secret, the
assignment, the notebook and the cell (`checks.inputs.cell_seed`): the same for every
student, so equal answers get equal scores and a regrade repeats the grade exactly, and
unknown to students, so inputs they have seen gain them nothing. It is made the first
time a course is graded, kept with the gradebook in the engine's folder of the course
root (never in the sandbox, never in what students get), and rotated with
`autograder secret --rotate` (each autograded notebook records its cells' seeds, so
earlier grades can still be replayed). A rotation keeps the secret it replaces beside it
(`secret.replaced-TIME`): nothing the instructor had is lost, and a rotation can be undone.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
import time
from pathlib import Path

from .preflight import STATE

NAME = "secret"
SIZE = 32  # bytes


def path(root: Path) -> Path:
    return root / STATE / NAME


def load(root: Path) -> tuple[bytes, bool]:
    """(the course's secret, whether it was made just now). Raises ValueError when the file
    does not hold one (damaged), OSError when it cannot be read or made."""
    where = path(root)
    try:
        return _read(where), False
    except FileNotFoundError:
        pass
    where.parent.mkdir(exist_ok=True)
    made = secrets.token_bytes(SIZE)
    staged = _staged(where, made)
    try:  # a link appears whole or not at all (a full disk leaves no empty secret behind),
        os.link(staged, where)  # and only if no other process made one meanwhile
    except FileExistsError:
        return _read(where), False
    finally:
        os.unlink(staged)
    return made, True


def rotate(root: Path) -> tuple[bytes, Path | None]:
    """A new secret in place of the old one (grades from now on draw other inputs); (the new
    secret, where the one it replaced is kept: None when there was none)."""
    where = path(root)
    where.parent.mkdir(exist_ok=True)
    kept = None
    if os.path.lexists(where):
        kept = where.with_name(f"{NAME}.replaced-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9:09d}")
        os.link(where, kept)  # a second name for the old file, before its first goes
    made = secrets.token_bytes(SIZE)
    os.replace(_staged(where, made), where)
    return made, kept


def _read(where: Path) -> bytes:
    try:
        found = bytes.fromhex(where.read_text().strip())
    except (ValueError, UnicodeDecodeError):
        found = b""
    if len(found) != SIZE:
        raise ValueError(f"it does not hold a secret of {SIZE} bytes")
    return found


def _staged(where: Path, secret: bytes) -> Path:
    """`secret` written and synced to disk under a temporary name beside `where`."""
    fd, name = tempfile.mkstemp(dir=where.parent, prefix=f".{NAME}-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secret.hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(name, 0o600)
    except BaseException:
        os.unlink(name)
        raise
    return Path(name)


def fingerprint(secret: bytes) -> str:
    """A name for the secret that reveals nothing of it (for messages and records)."""
    return hashlib.sha256(b"fingerprint:" + secret).hexdigest()[:12]
