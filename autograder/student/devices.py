"""Which devices a check runs on, and moving arguments there."""
from __future__ import annotations

from typing import Any, Sequence

import torch

# What a check notes when it could not run on CUDA: what was skipped, and where it runs.
NO_CUDA = "skipped: no CUDA device, so these checks did not run on CUDA (on a GPU runtime, Colab's too, they do)"


def available() -> list[str]:
    """CPU always; CUDA when present (a check prints NO_CUDA otherwise)."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def where() -> str:
    """Where the checks run, for the setup cell."""
    if torch.cuda.is_available():
        return f"checks run on cpu and cuda ({torch.cuda.get_device_name()})"
    return "checks run on cpu (cuda skipped: no CUDA device here; on a GPU runtime, Colab's too, they also run on cuda)"


def prepare(args: Sequence[Any], device: str) -> tuple[Any, ...]:
    """Fresh copies of the arguments on `device`; floating-point tensors require grad."""

    def one(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        if device == "meta":
            t = torch.empty_like(a, device="meta")
        else:
            t = a.detach().to(device).clone()
        return t.requires_grad_() if t.is_floating_point() else t

    return tuple(one(a) for a in args)
