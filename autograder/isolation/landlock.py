"""Confine a process's file access, TCP and signals with Linux Landlock (no privileges needed).

After `restrict`, the calling process and everything it starts can read only beneath the
`read` paths and write only beneath the `write` paths; it cannot open TCP connections or
listen, and (kernel ABI 6, Linux 6.12) cannot signal processes or reach abstract Unix
sockets outside its own domain. There is no way back.
"""
from __future__ import annotations

import ctypes
import os
import struct
import sys

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem access rights, by the ABI that introduced them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_DIR_CHANGES = sum(1 << bit for bit in range(4, 13))  # remove, make dir/file/socket/fifo/device/symlink
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS = {1: EXECUTE | WRITE_FILE | READ_FILE | READ_DIR | _DIR_CHANGES}
_FS[2] = _FS[1] | REFER
_FS[3] = _FS[4] = _FS[2] | TRUNCATE
_FS[5] = _FS[4] | IOCTL_DEV
_TCP = 0b11  # bind and connect (ABI 4)
_SCOPES = 0b11  # abstract Unix sockets and signals (ABI 6)
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # what applies to a non-directory

READ = EXECUTE | READ_FILE | READ_DIR
WRITE = READ | WRITE_FILE | _DIR_CHANGES | REFER | TRUNCATE | IOCTL_DEV


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi() -> int:
    """The Landlock ABI version of the running kernel; 0 where there is none."""
    if not sys.platform.startswith("linux"):
        return 0
    version = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION))
    return max(int(version), 0)


def restrict(read: list[str], write: list[str]) -> int:
    """Apply the rules to this process; returns the ABI used (0: Landlock is unavailable)."""
    version = abi()
    if version == 0:
        return 0
    libc = _libc()
    handled = _FS[min(version, 5)]
    attr = struct.pack("=QQQ", handled, _TCP if version >= 4 else 0, _SCOPES if version >= 6 else 0)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for paths, rights in ((read, READ), (write, WRITE)):
            for path in paths:
                _allow(libc, int(ruleset), path, rights & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return version


def _allow(libc: ctypes.CDLL, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        rule = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr is packed
        if libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.c_char_p(rule),
                        ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    finally:
        os.close(fd)
