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

    def _render_traceback_(self) -> list[str]:
        """What IPython (Jupyter, Colab, the grader) shows for it: the message alone. The
        checks' frames tell a student nothing, would quote a hidden test's source, and
        cost ~75 ms to format in a fresh process."""
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


def fail(summary: str, *details: str, cause: str | None = None) -> None:
    """Raise :class:`CheckFailed` with a summary, indented details and a likely cause."""
    __tracebackhide__ = True
    lines = [summary, *("  " + line for d in details for line in d.splitlines())]
    if cause:
        lines.append(f"Likely cause: {cause}")
    raise CheckFailed("\n".join(lines))


def show(value: object, *, limit: int = 12) -> str:
    """A short, single-line rendering of a tensor (or anything else) for messages.

    Written by hand rather than with torch's repr, which costs ~100x more: checks render
    their inputs for every case they judge, failing or not."""
    if not isinstance(value, torch.Tensor):
        return repr(value)
    if value.device.type == "meta":
        return f"<meta tensor of shape {tuple(value.shape)}>"
    t = value.detach().cpu()
    dtype = "" if t.dtype in _PLAIN_DTYPES else f", dtype={t.dtype}"
    if t.numel() > limit:
        return f"tensor([{', '.join(map(_number, t.flatten()[:limit].tolist()))}, ...]{dtype}) of shape {tuple(t.shape)}"
    return f"tensor({_nested(t.tolist())}{dtype})"


_PLAIN_DTYPES = (torch.float64, torch.float32, torch.int64, torch.bool)


def _nested(values: object) -> str:
    if isinstance(values, list):
        return f"[{', '.join(map(_nested, values))}]"
    return _number(values)


def _number(v: object) -> str:
    return f"{v:.4g}" if isinstance(v, float) else repr(v)


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
