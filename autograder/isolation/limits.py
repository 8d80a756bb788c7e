"""What a worker is told: the hard limits every notebook runs under, and where it runs.

Both cross from the grader to the worker as plain JSON (`to_message`, `from_message`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Self

TRUNCATED = "[output truncated: the notebook's output limit was reached]"  # where output was cut


class Message:
    """A record that crosses to the worker as a JSON object of its fields."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass

    def to_message(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Self:
        return cls(**{name: message[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class WorkerConfig(Message):
    """Where a worker's notebooks run and what confines them."""

    sandboxed: bool  # inside bubblewrap (its own PID namespace, its own scratch file system)
    scratch: str  # the directory the notebooks' scratch directories are made in
    readable: list[str]  # what Landlock lets a notebook read
    # RLIMIT_NPROC counts every process of a user, and not root's: it works in a sandbox's
    # own user namespace or for the worker's own unprivileged user, not for the grader's
    # user outside a sandbox (where root may be the only user that can read the Python
    # installation, so children keep it).
    limit_processes: bool
    uid: int | None  # the unprivileged user the notebooks run as (when the grader is root)
    gpu: bool = False  # notebooks get the GPU: CUDA starts before the memory limit (see confine)


@dataclass(frozen=True)
class Limits(Message):
    timeout: float = 120.0  # wall seconds for the whole notebook; then the process is killed
    memory: int = 2048  # MiB the notebook may allocate beyond what the warm worker already holds
    processes: int = 64  # processes and threads the notebook may run at once
    output: int = 8 << 20  # bytes of cell outputs kept for the notebook
    files: int = 64 << 20  # bytes of any one file it writes, and of its scratch directory

    @property
    def cpu(self) -> int:
        """CPU seconds: the wall budget (torch runs on one thread in a worker)."""
        return max(1, int(self.timeout + 0.999))
