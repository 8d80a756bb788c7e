"""Run notebook cells with IPython in this process and record their outputs as nbformat outputs.

What a student sees in Jupyter is kept: magics, `display()` and rich outputs, inline
matplotlib figures, the value of a cell's last expression, tracebacks. Output is
captured at the Python level (sys.stdout, sys.stderr) and at the file-descriptor level
(C extensions, subprocesses), so "anything on stderr in a graded cell scores 0" stays
nbgrader's rule. The shell is built once in the warm worker; each forked child uses it
for one notebook.
"""
from __future__ import annotations

import io
import os
import sys
import tempfile
from typing import Any, Iterable

from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.interactiveshell import InteractiveShell

from ..isolation.limits import TRUNCATED

INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
KEPT = 1024  # characters of a result or error name kept past the output budget
STRUCTURE = 512  # bytes of budget an output costs besides its text: their number stays bounded
NO_TRACEBACK = ["ERROR: An error occurred while showtraceback was disabled"]  # nbgrader's text


class Recorder:
    """The outputs of the cell being run, within a byte budget for the whole notebook.

    Past the budget, content is dropped but not the fact that it was there: a stream
    that was written to (stderr above all) still gets an output, and errors and results
    are kept with their text cut, so scores do not change because output was cut.
    """

    def __init__(self, budget: int, scratch: str) -> None:
        self.budget = budget
        self.outputs: list[dict[str, Any]] = []
        self._clear_pending = False
        # fd-level capture: fds 1 and 2 write into unnamed files that are read back.
        self._files = {"stdout": tempfile.TemporaryFile(dir=scratch), "stderr": tempfile.TemporaryFile(dir=scratch)}
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(self._files[name].fileno(), fd)

    def _spend(self, text: str) -> str:
        size = len(text.encode("utf-8", "replace"))
        if size <= self.budget:
            self.budget -= size
            return text
        kept, self.budget = text[: max(self.budget, 0)], 0
        return f"{kept}\n{TRUNCATED}\n"

    def _append(self, output: dict[str, Any]) -> None:
        if self._clear_pending:
            self.outputs.clear()
            self._clear_pending = False
        self.outputs.append(output)

    def stream(self, name: str, text: str) -> None:
        if not text:
            return
        self.drain()  # what reached fds 1 and 2 before this write comes first
        last = self.outputs[-1] if self.outputs and not self._clear_pending else None
        if last is not None and last["output_type"] == "stream" and last["name"] == name:
            if not last["text"].endswith(f"{TRUNCATED}\n"):
                last["text"] += self._spend(text)
        elif not (self.budget <= 0 and self._cut(name)):  # past the budget, one cut output per stream
            self.budget = max(self.budget - STRUCTURE, 0)
            self._append({"output_type": "stream", "name": name, "text": self._spend(text)})

    def _cut(self, name: str) -> bool:
        """Whether the cell has an output of stream `name` that was cut."""
        return any(o.get("name") == name and o["text"].endswith(f"{TRUNCATED}\n") for o in self.outputs)

    def rich(self, output: dict[str, Any]) -> None:
        """A display_data or execute_result output. Over budget a display is dropped (one
        note says so), and only the start of a result's text survives (enough for a number,
        which nbgrader reads as partial credit)."""
        self.drain()
        data = output["data"]
        size = STRUCTURE + sum(len(str(v)) for v in (*data.values(), output["metadata"]))
        if size <= self.budget:
            self.budget -= size
        elif output["output_type"] == "display_data":
            self.budget = 0
            if not self._cut("stdout"):
                self._append({"output_type": "stream", "name": "stdout", "text": f"{TRUNCATED}\n"})
            return
        else:
            output = {**output, "data": {"text/plain": str(data.get("text/plain", ""))[:KEPT]}, "metadata": {}}
        self._append(output)

    def error(self, ename: str, evalue: str, traceback: list[str]) -> None:
        self.drain()
        if self.budget <= 0 and any(o["output_type"] == "error" for o in self.outputs):
            return  # past the budget, one error per cell (what scores it)
        self.budget = max(self.budget - STRUCTURE, 0)
        text = self._spend("\n".join(traceback))
        self._append({"output_type": "error", "ename": ename[:KEPT], "evalue": evalue[:KEPT],
                      "traceback": text.split("\n")})

    def clear(self, wait: bool) -> None:
        if wait:
            self._clear_pending = True
        else:
            self.outputs.clear()

    def drain(self) -> None:
        """Move what was written to fds 1 and 2 since the last call into outputs."""
        for stream in (sys.__stdout__, sys.__stderr__):
            assert stream is not None  # (a child has both)
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for name, file in self._files.items():
            fd = file.fileno()
            size = os.fstat(fd).st_size
            if size:
                data = os.pread(fd, size, 0)
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                self.stream(name, data.decode("utf-8", "replace"))

    def take(self) -> list[dict[str, Any]]:
        self.drain()
        outputs, self.outputs, self._clear_pending = self.outputs, [], False
        return outputs


RECORDER: Recorder = None  # type: ignore[assignment]  # set in the child (start) before the first cell


class _Stream(io.TextIOBase):
    """sys.stdout / sys.stderr of a running notebook."""

    def __init__(self, name: str, fd: int) -> None:
        self._name, self._fd = name, fd
        self.buffer = _BytesStream(self)

    encoding = "utf-8"
    errors = "replace"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        RECORDER.stream(self._name, str(text))
        return len(text)

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False


class _BytesStream(io.RawIOBase):
    def __init__(self, text: _Stream) -> None:
        self._text = text

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._text.write(bytes(data).decode("utf-8", "replace"))
        return len(data)


class _DisplayHook(DisplayHook):
    """The value of a cell's last expression, as an execute_result."""

    def start_displayhook(self) -> None:
        self._result = {"output_type": "execute_result", "execution_count": self.prompt_count, "data": {},
                        "metadata": {}}

    def write_output_prompt(self) -> None:
        pass

    def write_format_data(self, format_dict: dict[str, Any], md_dict: dict[str, Any] | None = None) -> None:
        self._result["data"] = dict(format_dict)
        self._result["metadata"] = dict(md_dict or {})

    def finish_displayhook(self) -> None:
        RECORDER.rich(self._result)


class _DisplayPublisher(DisplayPublisher):
    """display(), rich reprs and figures, as display_data outputs."""

    def publish(self, data: dict[str, Any], metadata: dict[str, Any] | None = None, source: Any = None, *,
                transient: Any = None, update: bool = False, **kwargs: Any) -> None:
        if not update:  # an update would rewrite an earlier output; the saved notebook keeps the first
            RECORDER.rich({"output_type": "display_data", "data": dict(data), "metadata": dict(metadata or {})})

    def clear_output(self, wait: bool = False) -> None:
        RECORDER.clear(wait)


class _Shell(InteractiveShell):
    displayhook_class = _DisplayHook
    display_pub_class = _DisplayPublisher

    def _showtraceback(self, etype: Any, evalue: Any, stb: Iterable[str]) -> None:
        RECORDER.error(getattr(etype, "__name__", str(etype)), str(evalue), list(stb))

    def enable_gui(self, gui: Any = None) -> None:  # no event loops in a grader
        pass

    def _format_exception_for_storage(self, exception: BaseException, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """IPython formats every traceback a second time for its history, which is off here."""
        return {"ename": type(exception).__name__, "evalue": str(exception), "traceback": []}


def make_shell() -> InteractiveShell:
    """The shell every child will use, built in the warm worker (no history file). Figures
    are PNG after each cell, as in Jupyter: matplotlib, once imported, loads the inline
    backend, which hooks itself into the shell."""
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    shell = _Shell.instance(history_length=0)
    assert shell.history_manager is not None  # (instance() made it)
    shell.history_manager.enabled = False
    return shell


def start(scratch: str, budget: int) -> None:
    """In the child: capture fds 1 and 2 and route sys.stdout and sys.stderr to the recorder."""
    global RECORDER
    RECORDER = Recorder(budget, scratch)
    sys.stdout, sys.stderr = _Stream("stdout", 1), _Stream("stderr", 2)


def execute(shell: InteractiveShell, source: str) -> tuple[list[dict[str, Any]], int]:
    """Run one cell; its outputs and execution count, as ipykernel and nbclient record them."""
    count = shell.execution_count
    result = shell.run_cell(source, store_history=True)
    error = result.error_before_exec or result.error_in_exec
    if error is not None and not any(
        o["output_type"] == "error" and o["ename"] == type(error).__name__ for o in RECORDER.outputs
    ):  # the traceback display was disabled: the error still counts (as in nbgrader)
        RECORDER.error(type(error).__name__, str(error), NO_TRACEBACK)
    return RECORDER.take(), count
