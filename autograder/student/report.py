"""How checks talk to students: one exception type, readable tensors, no stray stderr."""
from __future__ import annotations

import contextlib
import contextvars
import linecache
import reprlib
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
    hidden = _current()
    if hidden is not None and hidden.described:
        lines.append(HIDDEN)
    raise CheckFailed("\n".join(lines))


# --- A hidden check's messages ------------------------------------------------------------------
#
# Every student's hidden checks draw the same inputs (from the course's secret), so what one
# student's feedback shows of them, every student could use. While the grader judges a hidden
# test cell, `show` describes a tensor by dtype and shape alone — an input, and what is
# computed from it (an expected value, the student's output) alike — and the checks name the
# first entry that differs and its two values (`checks.explain.differ`). The instructor sees
# everything with `autograder replay`.

class _Hidden:
    """A hidden test cell being judged: whether a message described a tensor without its values."""

    described = False


_hiding: contextvars.ContextVar[_Hidden | None] = contextvars.ContextVar("hiding", default=None)
HIDDEN = ("(A hidden check: its inputs are the course's secret, so tensors are described by dtype and shape, and "
          "only the first entry that differs is shown. The visible check shows its own inputs.)")


@contextlib.contextmanager
def hidden(hide: bool = True) -> Iterator[None]:
    """Judge a hidden test cell (with `hide`): messages show no values of tensors (per thread)."""
    token = _hiding.set(_Hidden() if hide else None)
    try:
        yield
    finally:
        _hiding.reset(token)


def hiding() -> bool:
    """Whether a hidden test cell is being judged (see `hidden`)."""
    return _current() is not None


def _current() -> _Hidden | None:
    return _hiding.get() or _kernel_cell


HIDDEN_TESTS = "### BEGIN HIDDEN TESTS"  # in the instructor's source of a hidden test cell (nbgrader's marker)
# A hidden test cell that an IPython kernel runs (stock `nbgrader autograde`, the instructor's
# notebook): the grader's `hidden` does not reach it, so the kernel's own hook says so.
_kernel_cell: _Hidden | None = None


def hidden_cells_in_kernel() -> None:
    """In an IPython kernel, judge each cell that holds hidden tests as `hidden` does: a
    notebook graded by running its test cells in the student's kernel (stock nbgrader)
    writes its messages into the autograded notebook and the feedback as well."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return
    for event, callback in (("pre_run_cell", _cell_starts), ("post_run_cell", _cell_ends)):
        if callback not in shell.events.callbacks[event]:  # (the setup cell may run twice)
            shell.events.register(event, callback)


def _cell_starts(info: Any) -> None:
    global _kernel_cell
    _kernel_cell = _Hidden() if HIDDEN_TESTS in str(getattr(info, "raw_cell", "")) else None


def _cell_ends(result: Any) -> None:
    global _kernel_cell
    _kernel_cell = None


def show(value: object, *, limit: int = 12) -> str:
    """A short, single-line rendering of a tensor (or anything else) for messages; in a
    hidden check, its dtype and shape only (see `hidden`).

    Written by hand rather than with torch's repr, which costs ~100x more: checks render
    their inputs for every case they judge, failing or not. It reads `limit` entries at
    most, whatever the tensor's shape (an empty tensor of shape (8000000, 0) is 8 million
    empty lists to `.tolist()`)."""
    if hiding():
        return _described(value)
    if not isinstance(value, torch.Tensor):
        return _SHORT.repr(value)
    if value.device.type == "meta":
        return f"<meta tensor of shape {tuple(value.shape)}>"
    dtype = "" if value.dtype in _PLAIN_DTYPES else f", dtype={value.dtype}"
    if value.numel() == 0:
        return f"tensor([], size={tuple(value.shape)}{dtype})"
    if value.numel() > limit:
        return (f"tensor([{', '.join(map(_number, first(value, limit)))}, ...]{dtype}) of shape "
                f"{tuple(value.shape)}")
    return f"tensor({_nested(value.detach().cpu().tolist())}{dtype})"


def value(number: float, spec: str = ".4g") -> str:
    """A number computed from a check's inputs (the largest of them, say) for a message; in
    a hidden check, not shown."""
    return "(not shown: a hidden check)" if hiding() else format(number, spec)


def first(t: torch.Tensor, n: int) -> list[Any]:
    """The first `n` entries of `t` in order, as numbers: `n` read, whatever its shape and strides."""
    if not t.dim():
        return [t.detach().cpu().item()]
    places = [unravel(k, tuple(t.shape)) for k in range(min(n, t.numel()))]
    if not places:
        return []
    index = tuple(torch.tensor(column, device=t.device) for column in zip(*places))
    return list(t.detach()[index].cpu().tolist())


def unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index of entry `flat` of a tensor of `shape`, in order (torch.unravel_index's cost
    grows with the shape's size)."""
    index = []
    for size in reversed(shape):
        flat, k = divmod(flat, size)
        index.append(k)
    return tuple(reversed(index))


def _described(value: object) -> str:
    """What a hidden check says of a value: numbers' kinds and tensors' shapes, not values."""
    if isinstance(value, torch.Tensor):
        hidden = _current()
        if hidden is not None:
            hidden.described = True
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_described(v) for v in value[:4]) + (", ..." if len(value) > 4 else "")
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return repr(value) if isinstance(value, (bool, int, str, type(None))) else f"a {type(value).__name__}"


_PLAIN_DTYPES = (torch.float64, torch.float32, torch.int64, torch.bool)
# Anything else, within bounds whatever its size (a student's process may return a list of millions).
_SHORT = reprlib.Repr()
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 12
_SHORT.maxstring = _SHORT.maxother = 400


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


_unsaid: contextvars.ContextVar[bool] = contextvars.ContextVar("unsaid", default=False)


@contextlib.contextmanager
def folded(what: str) -> Iterator[None]:
    """Run checks that repeat, on `what`, checks whose ✔ lines were printed already (no mistake
    tells the two apart): their failures raise as ever, their ✔ lines and notes become one
    note. Per thread (a context variable): the grader judges several notebooks at once."""
    token = _unsaid.set(True)
    try:
        yield
    finally:
        _unsaid.reset(token)
    note(f"and {what}: the same checks, the same result.")


def passed(message: str) -> None:
    """Tell the student a check passed (stdout, one line)."""
    if not _unsaid.get():
        print(f"✔ {message}")


def note(message: str) -> None:
    if not _unsaid.get():
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
