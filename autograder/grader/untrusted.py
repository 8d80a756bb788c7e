"""Reading what students handed in: regular files only, never through a symbolic link,
never more than a size limit.

Everything under submitted/STUDENT/ASSIGNMENT/ comes from students (or an LMS zip). Each
path is opened one component at a time from the submitted/ folder, refusing symbolic
links at every step (O_NOFOLLOW), and a file is read only if it is a regular file no
larger than its limit: a link to the gradebook or the solutions, a FIFO, a device or a
directory named like a notebook is refused with the reason, never followed, waited on or
read without end.
"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import PurePosixPath
from typing import Iterator

FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnreadableFile(Exception):
    """Not a regular file within its limit; the message says what it is instead."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


@contextlib.contextmanager
def folder(root: str, parts: tuple[str, ...]) -> Iterator[int]:
    """A descriptor of root/parts..., every component a real directory (no link followed)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                inner = os.open(part, FLAGS | os.O_DIRECTORY, dir_fd=fd)
            except OSError as error:
                mode = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
                raise UnreadableFile(f"'{part}' is {_kind(mode)}, not a folder") from error
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def read(root: str, path: str, limit: int) -> bytes:
    """The bytes of root/path (path relative, '/'-separated), a regular file of at most
    `limit` bytes; raises UnreadableFile otherwise."""
    *parents, name = PurePosixPath(path).parts
    with folder(root, tuple(parents)) as parent:
        try:
            fd = os.open(name, FLAGS, dir_fd=parent)
        except OSError as error:
            try:
                mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            except OSError:
                raise UnreadableFile(f"'{path}' cannot be read ({error.strerror})") from None
            raise UnreadableFile(f"'{path}' is {_kind(mode)}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile(f"'{path}' is {_kind(info.st_mode)}")
        if info.st_size > limit:
            raise UnreadableFile(f"'{path}' is larger than {limit >> 20} MiB")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnreadableFile(f"'{path}' is larger than {limit >> 20} MiB")
    return data


def listing(root: str, parts: tuple[str, ...]) -> tuple[list[str], list[tuple[str, str]]]:
    """(regular files, [(entry, why it is refused)]) under root/parts, recursively, as
    '/'-separated paths relative to it; nothing followed."""
    files: list[str] = []
    refused: list[tuple[str, str]] = []

    def walk(fd: int, prefix: str) -> None:
        for entry in os.scandir(fd):
            relative = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=False) and entry.name.endswith(".ipynb"):
                refused.append((relative, "a directory"))  # named like a notebook, which it cannot be
            elif entry.is_dir(follow_symlinks=False):
                try:
                    inner = os.open(entry.name, FLAGS | os.O_DIRECTORY, dir_fd=fd)
                except OSError as error:
                    refused.append((relative, f"cannot be opened ({error.strerror})"))
                    continue
                try:
                    walk(inner, relative + "/")
                finally:
                    os.close(inner)
            elif entry.is_file(follow_symlinks=False):
                files.append(relative)
            else:
                refused.append((relative, _kind(entry.stat(follow_symlinks=False).st_mode)))

    with folder(root, parts) as fd:
        walk(fd, "")
    return sorted(files), sorted(refused)
