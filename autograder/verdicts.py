"""Trusted verdicts: a notebook's graded test cells, run again where student code never runs.

The grader executes each graded cell's source (the instructor's, restored from the
gradebook) in its own process, with fresh random inputs even where the visible checks use
fixed ones. Names the cell does not define itself — the student's
`ClippedReLU`, `grad`, `when_to_write` — resolve to the student's process: plain data is
copied over, anything else becomes a `Remote` proxy, so the checks choose fresh inputs,
ask for numbers only, and decide here. Scoring follows nbgrader: an exception scores 0, a
number as the last expression is partial credit, anything else full marks.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import io
import sys
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from nbgrader.utils import get_partial_grade

from .checks import inputs, probe
from .checks.remote import Remote, Transport, resolve


@dataclass
class Verdict:
    grade_id: str
    score: float
    max_score: float
    report: str  # what the checks printed, and the failure if any


class StudentNames(dict):
    """The cell's own names, falling back to the student's (fetched on first use)."""

    def __init__(self, transport: Transport) -> None:
        super().__init__()
        self.transport = transport
        self.fetched: dict[str, Any] = {}

    def __missing__(self, name: str) -> Any:
        if hasattr(builtins, name):
            raise KeyError(name)  # let Python find the builtin
        found = probe.invoke(resolve, Remote(name, self.transport))
        if not isinstance(found, dict) or not isinstance(found.get("data"), bool):
            raise probe.Malformed(f"malformed answer for the name {name!r}")
        value = found.get("value") if found["data"] else Remote(name, self.transport)
        self[name] = self.fetched[name] = value
        return value

    def forget(self) -> None:
        """Drop what was fetched (the student's later cells may change it); keep what the
        test cells defined themselves."""
        for name, value in self.fetched.items():
            if self.get(name) is value:
                del self[name]
        self.fetched.clear()


def run_cell(source: str, names: dict) -> Any:
    """Execute a cell like IPython: the value of a final expression is returned."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    context: dict = {"__name__": "__main__"}
    exec(compile(tree, "<test cell>", "exec"), context, names)
    if last is None:
        return None
    return eval(compile(ast.Expression(last.value), "<test cell>", "eval"), context, names)


def is_test_cell(cell: Any) -> bool:
    """Graded test cells, and locked `check_*` cells (visible checks that import names)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    if cell.get("cell_type") != "code" or meta.get("solution"):
        return False
    return bool(meta.get("grade")) or (bool(meta.get("locked")) and str(meta.get("grade_id", "")).startswith("check"))


class Judge:
    """The trusted verdicts of one notebook, each taken right after its test cell ran in the
    student's process (so it sees the student's names as that cell did, and a process that
    dies later cannot take back what was judged). The test cells share their own names, as
    in the notebook. `cells` must come from the instructor's source, not the submission."""

    def __init__(self, cells: list) -> None:
        self.tests = {index: cell for index, cell in enumerate(cells) if is_test_cell(cell)}
        self.names: StudentNames | None = None

    def judges(self, index: int) -> bool:
        return index in self.tests

    def judge(self, index: int, transport: Transport) -> Verdict | None:
        """Run test cell `index` against the student's process; its verdict if it is graded."""
        if self.names is None:
            self.names = StudentNames(transport)
        self.names.transport = transport
        self.names.forget()
        meta = self.tests[index]["metadata"]["nbgrader"]
        with inputs.fresh_inputs():  # inputs nobody has seen: hard-coded answers gain nothing
            result = verdict(meta["grade_id"], self.tests[index]["source"], meta.get("points", 0), self.names)
        return result if meta.get("grade") else None


def verdicts(cells: list, transport: Transport) -> list[Verdict]:
    """Trusted verdicts of a notebook's graded cells, all judged after the whole notebook ran."""
    judge = Judge(cells)
    return [v for index in judge.tests if (v := judge.judge(index, transport)) is not None]


class _ThreadOutput(io.TextIOBase):
    """sys.stdout or sys.stderr while verdicts are being judged: what a judging thread writes
    goes to that thread's buffer, anything else where it went before. (contextlib's
    redirect_stdout swaps the stream for every thread at once; the grader judges
    several notebooks at once.)"""

    def __init__(self, original) -> None:
        self.original = original

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return (getattr(_judging, "buffer", None) or self.original).write(text)

    def flush(self) -> None:
        self.original.flush()


_judging = threading.local()
_installed = {"count": 0, "lock": threading.Lock(), "streams": None}


@contextlib.contextmanager
def _captured() -> Iterator[io.StringIO]:
    with _installed["lock"]:
        if _installed["count"] == 0:
            _installed["streams"] = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = _ThreadOutput(sys.stdout), _ThreadOutput(sys.stderr)
        _installed["count"] += 1
    _judging.buffer = io.StringIO()
    try:
        yield _judging.buffer
    finally:
        _judging.buffer = None
        with _installed["lock"]:
            _installed["count"] -= 1
            if _installed["count"] == 0:
                sys.stdout, sys.stderr = _installed["streams"]


def verdict(grade_id: str, source: str, max_score: float, names: StudentNames) -> Verdict:
    """Run one test cell against the student's process and score it as nbgrader would."""
    score = float(max_score)
    with _captured() as printed:
        try:
            result = run_cell(source, names)
            if isinstance(result, (int, float)) and not isinstance(result, bool):
                score = get_partial_grade({"data": {"text/plain": repr(result)}}, max_score)
        except Exception as failure:  # a failed check, or the student's process gave up
            score = 0.0
            print(f"{type(failure).__name__}: {failure}")
        report = printed.getvalue()
    return Verdict(grade_id, score, float(max_score), report)
