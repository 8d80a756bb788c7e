"""What a forked child does to itself before any student code runs.

In order: its own session (so it can be killed as a group), no inherited descriptors but
its channel, the worker's own unprivileged user when the grader runs as root
(RLIMIT_NPROC does not apply to root, and counts per user), a fresh scratch directory
that is its home and temp directory, hard resource limits, and Landlock: read only the
system and Python, write only the scratch directory, no TCP, no signals to processes
outside (where the kernel has it). With a GPU, CUDA starts before the limits: it
reserves tens of GiB of address space at once, which the address-space limit (what the
worker maps, plus the memory budget) would refuse; the budget then bounds what the
notebook maps beyond that.
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import tempfile

from . import landlock
from .limits import Limits, WorkerConfig

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Be killed when the process that started this one dies (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def drop_privileges(uid: int | None) -> None:
    """As root, become the worker's unprivileged user: process limits and file permissions then apply."""
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


def confine(channel_fd: int, config: WorkerConfig, limits: Limits, files: dict[str, bytes]) -> tuple[str, int]:
    """Confine this process; returns its scratch directory and the Landlock ABI applied (0: none)."""
    os.setsid()
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails instead of killing
    os.closerange(3, channel_fd)
    os.closerange(channel_fd + 1, os.sysconf("SC_OPEN_MAX"))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    die_with_parent()
    if sys.platform.startswith("linux"):  # under memory pressure, the kernel kills notebooks first
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    drop_privileges(config.uid)

    scratch = tempfile.mkdtemp(prefix="notebook-", dir=config.scratch)
    for name, data in files.items():
        path = os.path.join(scratch, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    os.chdir(scratch)
    for name in ("HOME", "TMPDIR", "IPYTHONDIR", "MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        os.environ[name] = scratch
    os.environ["USER"] = os.environ["LOGNAME"] = "student"  # the user may have no passwd entry
    tempfile.tempdir = None

    if config.gpu:
        _start_cuda()
    _set_limits(limits, config.limit_processes)
    applied = landlock.restrict(read=[*config.readable, "/dev", "/proc", "/sys"], write=[scratch, "/dev"])
    return scratch, applied


def _start_cuda() -> None:
    """CUDA's context, made now (the worker never starts CUDA: a forked CUDA context is unusable)."""
    import torch

    torch.zeros(1, device="cuda")


def _set_limits(limits: Limits, processes: bool) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu, limits.cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.files, limits.files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if processes:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    if sys.platform.startswith("linux"):  # address space: what the warm worker maps, plus the budget
        resource.setrlimit(resource.RLIMIT_AS, (_mapped_bytes() + (limits.memory << 20),) * 2)


def _mapped_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")
