"""`autograder replay`: judge one test cell of one submission again, with the seeds its
recorded verdict was drawn from, and say whether the verdict is the same. A hidden test
cell, whose messages showed the student no values, is judged once more with every value
shown (its inputs included), for the instructor.

The student's notebook runs as when it was graded (sandboxed, in a fresh child of a warm
worker) up to that cell; the test cells before it are judged too, as they were, for they
may leave names the cell uses. Nothing is written: the gradebook and autograded/ stay
as they are.
"""
from __future__ import annotations

import functools
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
from nbgrader.api import Gradebook
from nbgrader.coursedir import CourseDirectory

from ..checks import inputs
from ..isolation import sandbox
from . import discover, preflight, secret
from .pool import Pool
from .preflight import GradingError
from .prepare import Preparer, Rejected
from .records import Options, Program, Run, as_text
from .verdicts import Judge, is_test_cell


@dataclass
class Replayed:
    grade_id: str
    outputs: list[dict[str, Any]]  # of the cell, now
    score: float | None  # now (None: a visible check that scores nothing)
    recorded_outputs: list[dict[str, Any]] | None  # in the autograded notebook (None: never graded)
    recorded_score: float | None
    seeds: str  # where the seeds came from
    failure: str | None  # why the notebook stopped before the cell, if it did
    revealed: list[dict[str, Any]] | None = None  # a hidden cell's outputs with its inputs shown (never the student's)

    @property
    def same(self) -> bool:
        """The verdict is the recorded one: its score and what it says (the recorded outputs
        went through nbgrader's scorers, which may shorten a traceback, not its text)."""
        return self.recorded_outputs is not None and self.score == self.recorded_score and \
            as_text(self.outputs) == as_text(self.recorded_outputs)


def replay(options: Options, assignment: str, student: str, grade_id: str) -> Replayed:
    """Raises GradingError (one line for the instructor) when there is nothing to replay."""
    options.assignments, options.students = [assignment], [student]
    config = preflight.check(options)
    coursedir = CourseDirectory(config=config)
    submission = next(iter(discover.find(coursedir, [assignment], [student])), None)
    if submission is None or submission.unusable:
        raise GradingError(f"{student} has no gradable submission of {assignment}")
    notebook = _notebook_of(coursedir, assignment, grade_id)
    autograded = Path(coursedir.format_path(coursedir.autograded_directory, student, assignment)) / f"{notebook}.ipynb"
    recorded = nbformat.read(autograded, as_version=4) if autograded.exists() else None
    seeds = (recorded.metadata.get("autograder", {}).get("seeds") if recorded else None) or {}
    key, _ = secret.load(options.root)
    where = "the seeds recorded when it was graded" if seeds else \
        f"the course's current secret ({secret.fingerprint(key)}: it was graded before seeds were recorded)"
    seed = functools.partial(inputs.cell_seed, key, assignment, notebook)
    released = Path(coursedir.format_path(coursedir.release_directory, ".", "."))
    with closing(Preparer(coursedir.db_url, coursedir.course_id, config, released)) as preparer:
        try:
            prepared = preparer.prepare(notebook, submission.read(f"{notebook}.ipynb"), student, assignment)
        except Rejected as error:
            raise GradingError(f"the notebook cannot be graded: {error}") from None
    index = next((i for i, cell in enumerate(prepared.nb.cells)
                  if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id and is_test_cell(cell)), None)
    if index is None:
        raise GradingError(f"'{grade_id}' is not a test cell of {notebook}")
    judge = Judge.of(prepared.nb.cells[: index + 1], lambda g: int(seeds[g]) if g in seeds else seed(g), reveal=index)
    program = Program([c for c in prepared.code_cells() if c[0] <= index], submission.files(coursedir.ignore), judge)
    run = _run(options, program)
    verdict = run.verdicts.get(index)
    cell = run.cells.get(index)
    return Replayed(grade_id, cell.outputs if cell else [], verdict.score if verdict else None,
                    *_recorded(recorded, coursedir, assignment, student, notebook, grade_id), where, run.failure,
                    verdict.revealed if verdict else None)


def _notebook_of(coursedir: CourseDirectory, assignment: str, grade_id: str) -> str:
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        for nb in gb.find_assignment(assignment).notebooks:
            if any(cell.name == grade_id for cell in nb.source_cells):
                name: str = nb.name
                return name
    raise GradingError(f"{assignment} has no cell '{grade_id}'")


def _run(options: Options, program: Program) -> Run:
    with Pool(1, sandbox.detect(options.sandbox, options.root), options.root, options.limits) as pool:
        pool.submit("replay", [program])
        _, (run,) = pool.result()
    return run


def _recorded(nb: nbformat.NotebookNode | None, coursedir: CourseDirectory, assignment: str, student: str,
              notebook: str, grade_id: str) -> tuple[list[dict[str, Any]] | None, float | None]:
    if nb is None:
        return None, None
    outputs = next(([dict(o) for o in c.outputs] for c in nb.cells
                    if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id), None)
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        grades = {g.name: g.auto_score for g in gb.find_submission_notebook(notebook, assignment, student).grades}
    return outputs, grades.get(grade_id)
