"""How checks talk to students: one exception type, readable tensors, no stray stderr."""
from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Iterator

import torch


class CheckFailed(AssertionError):
    """A check found a mistake; the message says where, what and the likely cause.

    Raised explicitly (never through a bare ``assert``), so it survives ``python -O``.
    """


def fail(summary: str, *details: str, cause: str | None = None) -> None:
    """Raise :class:`CheckFailed` with a summary, indented details and a likely cause."""
    __tracebackhide__ = True
    lines = [summary, *("  " + line for d in details for line in d.splitlines())]
    if cause:
        lines.append(f"Likely cause: {cause}")
    raise CheckFailed("\n".join(lines))


def show(value: object, *, limit: int = 12) -> str:
    """A short, single-line rendering of a tensor (or anything else) for messages."""
    if not isinstance(value, torch.Tensor):
        return repr(value)
    if value.device.type == "meta":
        return f"<meta tensor of shape {tuple(value.shape)}>"
    t = value.detach().cpu()
    if t.numel() > limit:
        flat = ", ".join(f"{v:.4g}" for v in t.flatten()[:limit].tolist())
        return f"tensor([{flat}, ...]) of shape {tuple(t.shape)}"
    with torch._tensor_str.printoptions(precision=4, sci_mode=False, linewidth=10_000):
        text = " ".join(repr(t).split())
    return text.replace(", dtype=torch.float64", "")


def shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


@contextlib.contextmanager
def quiet() -> Iterator[list[warnings.WarningMessage]]:
    """Run a check without writing to stderr.

    nbgrader gives zero points to a test cell with any stderr output, so a harmless
    warning from torch or from the student's code must not reach it. Warnings are
    recorded (and returned) instead of printed; anything else written to stderr is
    shown on stdout.
    """
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(sys.stdout):
        warnings.simplefilter("always")
        yield caught


def passed(message: str) -> None:
    """Tell the student a check passed (stdout, one line)."""
    print(f"✔ {message}")


def note(message: str) -> None:
    print(f"  {message}")
