"""Put what a notebook's run produced back into the notebook, as the autograded version.

A run that stopped early (time limit, crash, kill) leaves an error in the cell that was
running and in every graded cell after it, so those score 0 exactly as nbgrader scores
an error; the notebook is flagged for a human to look at, with the reason at its top.

The grade of a test cell is the grader's own verdict (:mod:`autograder.verdicts`), not
what the cell printed in the student's process. Where the two disagree, or the notebook
changed what the checks rely on, it is flagged "tampering suspected" with the evidence.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_markdown_cell, new_output
from nbgrader import utils

from .pool import Run
from .prepare import Prepared


@dataclass
class NotebookResult:
    """One graded notebook, ready to be saved."""

    name: str
    source: Path  # the submitted file
    nb: NotebookNode | None  # the autograded notebook; None when the submission could not be read
    problems: list[str] = field(default_factory=list)  # why a human should look at it
    run: Run | None = None

    def trusted_scores(self) -> dict[str, float]:
        """{grade_id: the grader's own score} of the test cells that were judged."""
        return {v.grade_id: v.score for v in self.run.verdicts.values()} if self.run else {}


def _error(ename: str, message: str) -> NotebookNode:
    return new_output("error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"])


def graded(prepared: Prepared, run: Run, path: Path) -> NotebookResult:
    nb = copy.deepcopy(prepared.nb)
    problems = list(prepared.flags)
    try:
        for index, cell in run.cells.items():
            nb.cells[index].outputs = [nbformat.from_dict(output) for output in cell.outputs]
            nb.cells[index].execution_count = cell.execution_count
        nbformat.validate(nb)
    except (nbformat.ValidationError, AttributeError, TypeError) as error:  # outputs are not nbformat's
        nb = copy.deepcopy(prepared.nb)
        run.failure, run.stopped_at = f"the notebook's process returned invalid outputs ({error})", None
    problems += _tampering(nb, run) + run.limits_reached
    if run.failure:
        problems.append(run.failure)
        _mark_stopped(nb, run)
    if problems:
        note = "**Flagged for review by a person.** " + " ".join(f"{p[0].upper()}{p[1:]}." for p in problems)
        nb.cells.insert(0, new_markdown_cell(note))
    return NotebookResult(prepared.name, path, nb, problems, run)


def _tampering(nb: NotebookNode, run: Run) -> list[str]:
    """Test cells whose output in the notebook disagrees with the grader's verdict (each gets
    a note saying so), and what the notebook changed in the modules the checks rely on."""
    found = []
    for index, verdict in sorted(run.verdicts.items()):
        cell = nb.cells[index]
        shown, _ = utils.determine_grade(cell)
        if shown == verdict.score:
            continue
        reason = verdict.report.strip().splitlines()[-1:] or ["it passed"]
        found.append(
            f"tampering suspected: the test cell '{verdict.grade_id}' showed {shown:g} of {verdict.max_score:g} "
            f"points in the notebook, but the grader's own check gave {verdict.score:g} ({reason[0][:300]})"
        )
        cell.outputs.append(new_output("stream", name="stdout", text=(
            f"\n[grader] This cell's output was not trusted: the grader's own check of it gave "
            f"{verdict.score:g} of {verdict.max_score:g} points. {reason[0][:300]}\n"
        )))
    if run.changed:
        found.append("tampering suspected: the notebook changed what the checks rely on: " + "; ".join(run.changed[:10]))
    return found


def _mark_stopped(nb: NotebookNode, run: Run) -> None:
    after = False
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if index == run.stopped_at or (run.stopped_at is None and not after):
            cell.outputs.append(_error("NotebookStopped", run.failure))
            after = True
        elif after and utils.is_grade(cell) and not utils.is_solution(cell):
            cell.outputs = [_error("NotRun", f"not run: the notebook stopped earlier ({run.failure})")]


def rejected(path: Path, reason: str) -> NotebookResult:
    return NotebookResult(path.stem, path, None, [reason])
