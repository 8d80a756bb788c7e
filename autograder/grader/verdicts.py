"""Trusted verdicts: a notebook's test cells, run where student code never runs.

The student's process runs the student's cells and the given ones; each test cell —
visible or hidden, its source the instructor's, from the gradebook — runs once, here, in
the grader's own process (`Judge`), at its place in the notebook, its checks' inputs drawn
from the cell's seed (the same for every student, unknown to them: `inputs.seeded`), even
where the visible checks use fixed ones. Names the cell does not define itself — the
student's `ClippedReLU`, `grad`, `when_to_write` — resolve to the student's process: plain
data is copied over, anything else becomes a `Remote` proxy, so the checks choose the
inputs, ask for numbers only, and decide here. Scoring follows nbgrader: an exception
scores 0, a number as the last expression is partial credit, anything else full marks; the
cell's outputs in the autograded notebook are what the checks printed and how they ended.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import importlib
import io
import sys
import threading
from typing import Any, Callable, Iterator, TextIO, cast

import torch
from nbgrader.utils import get_partial_grade

from ..checks import evidence, inputs
from ..checks.remote import Remote, RemoteError, Transport
from ..checks.shared_state import process_wide
from ..student import probe, report
from ..student.serve import resolve
from . import syntax
from .records import Verdict, cut, is_test_cell


def _module(name: Any) -> Any:
    """The grader's own module of that name (a module the notebook imported: torch,
    torch.nn.functional, math, ...), if the grader has loaded it; nothing is imported for a
    name a student chose."""
    if not isinstance(name, str) or name.split(".")[0] == __package__.split(".")[0]:
        return None
    return sys.modules.get(name)


class StudentNames(dict[str, Any]):
    """The cell's own names, falling back to the student's (fetched on first use)."""

    def __init__(self, transport: Transport) -> None:
        super().__init__()
        self.transport = transport
        self.fetched: dict[str, Any] = {}

    def __missing__(self, name: str) -> Any:
        if hasattr(builtins, name):
            raise KeyError(name)  # let Python find the builtin
        try:
            found = probe.invoke(resolve, Remote(name, self.transport))
        except RemoteError as error:
            if error.type == "NameError":  # as the notebook would say it
                raise NameError(f"name {name!r} is not defined (run the cell that defines it first)") from None
            raise
        if not isinstance(found, dict) or not isinstance(found.get("data"), bool):
            raise probe.Malformed(f"malformed answer for the name {name!r}")
        value = found.get("value") if found["data"] else _module(found.get("module")) or Remote(name, self.transport)
        self[name] = self.fetched[name] = value
        return value

    def forget(self) -> None:
        """Drop what was fetched (the student's later cells may change it); keep what the
        test cells defined themselves."""
        for name, value in self.fetched.items():
            if self.get(name) is value:
                del self[name]
        self.fetched.clear()


def run_cell(source: str, names: dict[str, Any]) -> Any:
    """Execute a cell like IPython: the value of a final expression is returned."""
    tree = syntax.parse(source)
    last = cast(ast.Expr, tree.body.pop()) if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    context: dict[str, Any] = {"__name__": "__main__"}
    exec(syntax.compiled(tree, "<test cell>", "exec"), context, names)
    if last is None:
        return None
    return eval(syntax.compiled(ast.Expression(last.value), "<test cell>", "eval"), context, names)


def is_hidden(cell: Any) -> bool:
    """A test cell with hidden tests: its messages show no values (`report.hidden`)."""
    return report.HIDDEN_TESTS in str(cell.get("source", ""))


class Judge:
    """The trusted verdicts of one notebook, each taken right after its test cell ran in the
    student's process (so it sees the student's names as that cell did, and a process that
    dies later cannot take back what was judged). The test cells share their own names, as
    in the notebook. `cells` must come from the instructor's source, not the submission."""

    def __init__(self, tests: dict[int, Any], seeds: dict[int, int], reveal: int | None = None) -> None:
        """`tests`: the test cells by index in the notebook; `seeds`: their checks' seeds;
        `reveal`: a hidden test cell judged a second time with every value shown, for the
        instructor (`Verdict.revealed`; `autograder replay`)."""
        self.tests, self.seeds, self.reveal = tests, seeds, reveal
        self.names: StudentNames | None = None

    @classmethod
    def of(cls, cells: list[Any], seed: Callable[[str], int], reveal: int | None = None) -> Judge:
        """The judge of a notebook's `cells`; `seed(grade_id)` is a test cell's seed (`inputs.cell_seed`)."""
        tests = {index: cell for index, cell in enumerate(cells) if is_test_cell(cell)}
        return cls(tests, {index: seed(cell["metadata"]["nbgrader"]["grade_id"]) for index, cell in tests.items()},
                   reveal)

    def judges(self, index: int) -> bool:
        return index in self.tests

    def judge(self, index: int, transport: Transport) -> Verdict:
        """Run test cell `index` against the student's process."""
        if self.names is None:
            self.names = StudentNames(transport)
        self.names.transport = transport
        self.names.forget()
        cell = self.tests[index]
        meta, hidden = cell["metadata"]["nbgrader"], is_hidden(cell)
        graded = bool(meta.get("grade"))
        points = meta.get("points", 0) if graded else 0
        with warmth.judging(), inputs.seeded(self.seeds[index]), report.hidden(hidden):
            found = verdict(meta["grade_id"], cell["source"], points, self.names, graded)
        found = dataclasses.replace(found, seed=self.seeds[index])
        if hidden and index == self.reveal:  # the same inputs again (the cell's seed), every value shown
            self.names.forget()
            with warmth.judging(), inputs.seeded(self.seeds[index]), report.hidden(False):
                shown = verdict(meta["grade_id"], cell["source"], points, self.names, graded)
            found = dataclasses.replace(found, revealed=shown.outputs)
        return found


def warm(modules: list[str]) -> None:
    """Pay the grader's first-call costs before the first verdict: the check modules the
    test cells import, and what torch imports at the first gradient given grad_outputs
    (sympy, about 0.5 s). Paid during a verdict, they would hold up every judge at once."""
    for name in modules:
        if name.split(".")[0] == __package__.split(".")[0]:
            with contextlib.suppress(ImportError):  # the test cell meets the same error, and reports it
                importlib.import_module(name)
    x = torch.ones(1, requires_grad=True)
    torch.autograd.grad(x * 2, x, torch.ones(1))


def warm_compiler() -> None:
    """What notebooks that use the compiler need: torch._dynamo and the jvp decompositions,
    which the first forward-mode derivative and some of torch's own operations import (1 s
    and more). Paid before the first of them is judged, not before the first verdict."""
    x = torch.ones(1)
    with process_wide, torch.autograd.forward_ad.dual_level():
        torch.autograd.forward_ad.make_dual(x, x) * 2


class Warmth:
    """The first-call costs paid so far. Paying one imports modules, and an import at the
    same time as a judge's can raise Python's import-deadlock error (a score would then
    depend on timing): judges pass together, a payment passes alone, and judges that come
    while one waits or runs wait for it."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._judges, self._paying = 0, False
        self.paid: set[Callable[[], None]] = set()

    @contextlib.contextmanager
    def judging(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._paying)
            self._judges += 1
        try:
            yield
        finally:
            with self._changed:
                self._judges -= 1
                self._changed.notify_all()

    def pay(self, cost: Callable[[], None]) -> None:
        """Pay `cost` once (never while judging: call it outside `judging`)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._paying)
            if cost in self.paid:
                return
            self._paying = True
            self._changed.wait_for(lambda: self._judges == 0)
        try:
            with contextlib.suppress(Exception):  # not the run's to fail on: a judge that needs it meets it too
                cost()
        finally:
            with self._changed:
                self.paid.add(cost)
                self._paying = False
                self._changed.notify_all()


warmth = Warmth()  # of this process, which judges


def verdicts(cells: list[Any], transport: Transport, seed: Callable[[str], int]) -> list[Verdict]:
    """Trusted verdicts of a notebook's graded cells, all judged after the whole notebook ran."""
    judge = Judge.of(cells, seed)
    return [v for index in judge.tests if (v := judge.judge(index, transport)).graded]


class _Captured:
    """What checks print while they judge, kept per thread: the grader judges several
    notebooks at once, and contextlib's redirect_stdout would swap sys.stdout for all
    threads. While any thread judges, sys.stdout and sys.stderr route each thread's writes
    to its own buffer, and other threads' writes where they went before."""

    def __init__(self) -> None:
        self.saved: tuple[Any, Any]  # sys.stdout and sys.stderr, while captured
        self.lock, self.users, self.saved = threading.Lock(), 0, (None, None)
        self.local = threading.local()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[io.StringIO]:
        with self.lock:
            if self.users == 0:
                self.saved = sys.stdout, sys.stderr
                sys.stdout, sys.stderr = _Routed(self, sys.stdout), _Routed(self, sys.stderr)
            self.users += 1
        self.local.buffer = io.StringIO()
        try:
            yield self.local.buffer
        finally:
            self.local.buffer = None
            with self.lock:
                self.users -= 1
                if self.users == 0:
                    sys.stdout, sys.stderr = self.saved


class _Routed(io.TextIOBase):
    def __init__(self, captured: _Captured, original: TextIO) -> None:
        self.captured, self.original = captured, original

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        written: int = (getattr(self.captured.local, "buffer", None) or self.original).write(text)
        return written

    def flush(self) -> None:
        self.original.flush()


_captured = _Captured()


MESSAGE = 4096  # characters of a failure's message written into the notebook
PRINTED = 8192  # characters of what a cell's checks printed (they echo what the student's process sent)


def verdict(grade_id: str, source: str, max_score: float, names: StudentNames, graded: bool = True) -> Verdict:
    """Run one test cell against the student's process and score it as nbgrader would."""
    ended: dict[str, Any] | None
    score, ended = float(max_score), None
    with _captured() as printed, evidence.collected() as flags:
        try:
            result = run_cell(source, names)
            if isinstance(result, (int, float)) and not isinstance(result, bool):
                ended = {"output_type": "execute_result", "execution_count": None,
                         "data": {"text/plain": repr(result)}, "metadata": {}}
                score = get_partial_grade(ended, max_score)
        except Exception as failure:  # a failed check, or the student's process gave up
            score = 0.0
            ename, evalue = type(failure).__name__, cut(str(failure), MESSAGE)
            ended = {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}
        text = cut(printed.getvalue(), PRINTED)
    outputs = ([{"output_type": "stream", "name": "stdout", "text": text}] if text else []) + ([ended] if ended else [])
    return Verdict(grade_id, score, float(max_score), graded, outputs, flags=list(flags))
