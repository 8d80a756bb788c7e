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
from dataclasses import dataclass
from typing import Any

from nbgrader.utils import get_partial_grade

from .checks import inputs, probe, wire
from .checks.remote import Remote, Transport


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

    def __missing__(self, name: str) -> Any:
        if hasattr(builtins, name):
            raise KeyError(name)  # let Python find the builtin
        found = probe.invoke(_resolve, Remote(name, self.transport))
        if not isinstance(found, dict) or not isinstance(found.get("data"), bool):
            raise probe.Malformed(f"malformed answer for the name {name!r}")
        value = found.get("value") if found["data"] else Remote(name, self.transport)
        self[name] = value
        return value


@probe.procedure
def _resolve(obj: Any) -> dict:
    """Plain data is copied to the grader; anything else stays where it is."""
    try:
        wire.encode(obj)
    except wire.WireError:
        return {"data": False}
    return {"data": True, "value": obj}


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


def verdicts(cells: list, transport: Transport) -> list[Verdict]:
    """Trusted verdicts of a notebook's graded cells (its test cells run in order, sharing
    names, as in the notebook). `cells` must come from the instructor's source, not from
    the submission."""
    names = StudentNames(transport)
    found = []
    with inputs.fresh_inputs():  # inputs nobody has seen: hard-coded answers gain nothing
        for cell in filter(is_test_cell, cells):
            meta = cell["metadata"]["nbgrader"]
            result = verdict(meta["grade_id"], cell["source"], meta.get("points", 0), names)
            if meta.get("grade"):
                found.append(result)
    return found


def verdict(grade_id: str, source: str, max_score: float, names: StudentNames) -> Verdict:
    """Run one test cell against the student's process and score it as nbgrader would."""
    printed = io.StringIO()
    score = float(max_score)
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            result = run_cell(source, names)
            if isinstance(result, (int, float)) and not isinstance(result, bool):
                score = get_partial_grade({"data": {"text/plain": repr(result)}}, max_score)
        except Exception as failure:  # a failed check, or the student's process gave up
            score = 0.0
            print(f"{type(failure).__name__}: {failure}")
    return Verdict(grade_id, score, float(max_score), printed.getvalue())
