"""The hard limits every notebook runs under."""
from __future__ import annotations

from dataclasses import asdict, dataclass

TRUNCATED = "[output truncated: the notebook's output limit was reached]"  # where output was cut


@dataclass(frozen=True)
class Limits:
    timeout: float = 120.0  # wall seconds for the whole notebook; then the process is killed
    memory: int = 2048  # MiB the notebook may allocate beyond what the warm worker already holds
    processes: int = 64  # processes and threads the notebook may run at once
    output: int = 8 << 20  # bytes of cell outputs kept for the notebook
    files: int = 64 << 20  # bytes of any one file it writes, and of its scratch directory

    @property
    def cpu(self) -> int:
        """CPU seconds: the wall budget (torch runs on one thread in a worker)."""
        return max(1, int(self.timeout + 0.999))

    def to_message(self) -> dict:
        return asdict(self)

    @classmethod
    def from_message(cls, message: dict) -> "Limits":
        return cls(**{name: message[name] for name in cls.__dataclass_fields__})
