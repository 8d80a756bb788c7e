"""`autograder replay`: judge one test cell of one submission again, with the seeds its
recorded verdict was drawn from, and say whether the verdict is the same. A hidden test
cell, whose messages showed the student no values, is judged once more with every value
shown (its inputs included), for the instructor.

The student's notebook runs as when it was graded (sandboxed, in a fresh child of a warm
worker) up to that cell; the test cells before it are judged too, as they were, for they
may leave names the cell uses. Nothing is written: the gradebook and autograded/ stay
as they are.

`check` answers a wrong assignment, student or cell at once, from the course's folders
alone, before torch, nbgrader and a worker load (which take many seconds).
"""
from __future__ import annotations

import difflib
import functools
import json
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import preflight
from .preflight import GradingError
from .records import Options, as_text, is_test_cell

if TYPE_CHECKING:
    import nbformat
    from nbgrader.coursedir import CourseDirectory

    from .records import Program, Run


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


def check(options: Options, assignment: str, student: str, grade_id: str) -> None:
    """GradingError (one line, naming the valid choices) for an assignment, a student or a
    test cell the course does not have: read from its folders, in well under a second."""
    options.assignments, options.students = [assignment], [student]
    config = preflight.check(options)
    cells = test_cells(config, assignment)
    if cells and grade_id not in cells:
        close = difflib.get_close_matches(grade_id, cells, n=1)
        guess = f" (did you mean {close[0]}?)" if close else ""
        raise GradingError(f"{assignment} has no test cell '{grade_id}'{guess}; its test cells: {', '.join(cells)}")


def test_cells(config: Any, assignment: str) -> list[str]:
    """The grade_ids of an assignment's test cells, in order, from its released notebooks (or
    its source notebooks where it was not released here); [] where neither can be read."""
    for name, default in (("release_directory", "release"), ("source_directory", "source")):
        folder = preflight.folder(config, name, default) / assignment
        try:
            notebooks = [json.loads(path.read_text()) for path in sorted(folder.glob("*.ipynb"))]
        except (OSError, ValueError):
            continue
        cells = [cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") for nb in notebooks
                 for cell in nb.get("cells", []) if isinstance(cell, dict) and is_test_cell(cell)]
        if cells:
            return [str(c) for c in cells]
    return []


def replay(options: Options, assignment: str, student: str, grade_id: str,
           phase: Callable[[str], None] = lambda _: None) -> Replayed:
    """Raises GradingError (one line for the instructor) when there is nothing to replay.
    `phase(what)` is told what it does now."""
    phase("loading nbgrader and the checks ...")
    import nbformat
    from nbgrader.coursedir import CourseDirectory

    from ..checks import inputs
    from . import discover, secret
    from .prepare import Preparer, Rejected
    from .records import Program
    from .verdicts import Judge

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
    phase(f"preparing {student}'s {notebook} ...")
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
    phase(f"starting a sandboxed worker, running {notebook} up to {grade_id} and judging it ...")
    run = _run(options, program)
    verdict = run.verdicts.get(index)
    cell = run.cells.get(index)
    return Replayed(grade_id, cell.outputs if cell else [], verdict.score if verdict else None,
                    *_recorded(recorded, coursedir, assignment, student, notebook, grade_id), where, run.failure,
                    verdict.revealed if verdict else None)


def _notebook_of(coursedir: CourseDirectory, assignment: str, grade_id: str) -> str:
    from nbgrader.api import Gradebook

    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        for nb in gb.find_assignment(assignment).notebooks:
            if any(cell.name == grade_id for cell in nb.source_cells):
                name: str = nb.name
                return name
    raise GradingError(f"{assignment} has no cell '{grade_id}'")


def _run(options: Options, program: Program) -> Run:
    from ..isolation import sandbox
    from .pool import Pool

    with Pool(1, sandbox.detect(options.sandbox, options.root), options.root, options.limits) as pool:
        pool.submit("replay", [program])
        _, (run,) = pool.result()
    return run


def _recorded(nb: nbformat.NotebookNode | None, coursedir: CourseDirectory, assignment: str, student: str,
              notebook: str, grade_id: str) -> tuple[list[dict[str, Any]] | None, float | None]:
    if nb is None:
        return None, None
    from nbgrader.api import Gradebook

    outputs = next(([dict(o) for o in c.outputs] for c in nb.cells
                    if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id), None)
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        grades = {g.name: g.auto_score for g in gb.find_submission_notebook(notebook, assignment, student).grades}
    return outputs, grades.get(grade_id)
