"""How checks talk to students: one exception type, readable tensors, no stray stderr."""
from __future__ import annotations

import contextlib
import linecache
import sys
import warnings
from typing import Any, Callable, Iterator

import torch


class CheckFailed(AssertionError):
    """A check found a mistake; the message says where, what and the likely cause.

    Raised explicitly (never through a bare ``assert``), so it survives ``python -O``.
    """

    def _render_traceback_(self) -> list[str]:
        """What IPython (Jupyter, Colab, the grader) shows for it: the message alone. The
        checks' frames tell a student nothing, would quote a hidden test's source, and
        cost ~75 ms to format in a fresh process."""
        return one_line(type(self).__name__, str(self))


def one_line(kind: str, message: str) -> list[str]:
    """An error as IPython shows it (its traceback's lines): the kind in red, the message."""
    return [f"\x1b[0;31m{kind}\x1b[0m: {message}"]


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
        return (f"tensor([{', '.join(map(_number, t.flatten()[:limit].tolist()))}, ...]{dtype}) of shape "
                f"{tuple(t.shape)}")
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


def undefined(name: str) -> str:
    """What a check says of a name it needs that the notebook has not defined."""
    return (f"`{name}` is not defined yet: run the cell that defines it (and those above); an answer cell "
            "that raises an error defines nothing.")


def name_errors_in_one_line(is_check_cell: Callable[[str], bool]) -> None:
    """In an IPython kernel (JupyterLab, Colab, nbgrader's Validate), a NameError raised by a
    check cell itself (`is_check_cell(its source)`: the answer it checks was not run, or
    raised) is shown in one line, as every check message is; any other keeps its traceback,
    which points at the student's line."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return

    def show(shell: Any, kind: Any, error: Any, traceback: Any, tb_offset: Any = None) -> None:
        last = traceback
        while last.tb_next is not None:
            last = last.tb_next
        code = last.tb_frame.f_code  # where it was raised: the cell's own line, or code it called
        if code.co_name == "<module>" and error.name and is_check_cell("".join(linecache.getlines(code.co_filename))):
            error._render_traceback_ = lambda: one_line(kind.__name__, undefined(error.name))  # IPython's protocol
        shell.showtraceback((kind, error, traceback), tb_offset=tb_offset, running_compiled_code=True)

    shell.set_custom_exc((NameError,), show)
