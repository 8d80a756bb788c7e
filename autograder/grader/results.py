"""Put what a notebook's run produced back into the notebook, as the autograded version.

A run that stopped early (time limit, crash, kill) leaves an error in the cell that was
running and in every graded cell after it, so those score 0 exactly as nbgrader scores
an error; the notebook is flagged for a human to look at, with the reason at its top.

Test cells ran in the grader (:mod:`.verdicts`): their outputs are the grader's report,
their scores its verdicts. A notebook whose process sent what no honest process sends, or
that changed what the probes rely on, is flagged "tampering suspected" with the evidence.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_markdown_cell, new_output
from nbgrader import utils

from .prepare import Prepared
from .records import Run, cut

PROBLEM = 1000  # characters of one reason a notebook is flagged (it may quote what the student's process sent)


@dataclass
class NotebookResult:
    """One graded notebook, ready to be saved."""

    name: str
    nb: NotebookNode | None  # the autograded notebook; None when the submission could not be read
    data: bytes | None = None  # the notebook as handed in, kept when it could not be graded
    problems: list[str] = field(default_factory=list)  # why a human should look at it
    run: Run | None = None

    def trusted_scores(self) -> dict[str, float]:
        """{grade_id: the grader's own score} of the test cells that were judged."""
        return {v.grade_id: v.score for v in self.run.verdicts.values()} if self.run else {}


def _error(ename: str, message: str) -> NotebookNode:
    output: NotebookNode = new_output("error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"])
    return output


def graded(prepared: Prepared, run: Run) -> NotebookResult:
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
    nb.metadata["autograder"] = {"seeds": dict(run.seeds)}  # each test cell's, to replay its verdict
    problems += _tampering(run) + run.limits_reached + [f"worth a look: {what}" for what in run.worth_a_look]
    if run.failure:
        if not run.tampering:
            problems.append(run.failure)
        _mark_stopped(nb, run)
    problems = [cut(p, PROBLEM) for p in problems]
    if problems:
        note = "**Flagged for review by a person.** " + " ".join(f"{p[0].upper()}{p[1:]}." for p in problems)
        nb.cells.insert(0, new_markdown_cell(note))
    return NotebookResult(prepared.name, nb, None, problems, run)


def _tampering(run: Run) -> list[str]:
    """The evidence of tampering the run left."""
    found = []
    if run.tampering:
        found.append(f"tampering suspected: the notebook's process sent {run.tampering}; the test cells not yet "
                     "judged score 0")
    if run.changed:
        found.append("tampering suspected: the notebook changed what the grader's probes rely on: "
                     + "; ".join(run.changed[:10]))
    return found


def _mark_stopped(nb: NotebookNode, run: Run) -> None:
    assert run.failure is not None  # (stopped)
    after = False
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if index == run.stopped_at or (run.stopped_at is None and not after):
            cell.outputs.append(_error("NotebookStopped", run.failure))
            after = True
        elif after and utils.is_grade(cell) and not utils.is_solution(cell):
            cell.outputs = [_error("NotRun", f"not run: the notebook stopped earlier ({run.failure})")]


def rejected(name: str, reason: str, data: bytes | None = None) -> NotebookResult:
    return NotebookResult(name, None, data, [reason])
