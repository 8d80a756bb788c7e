"""Feedback without the hidden tests, from nbgrader's own feedback step.

nbgrader's ClearHiddenTests removes hidden tests from a cell's source, but a failing
hidden test's traceback quotes that source line by line. So the autograded notebook
keeps, for a cell that held hidden tests, only each error's name and message (which the
checks write for students): any feedback made from it, by `nbgrader generate_feedback`
or by `autograder grade --feedback`, shows no hidden test. `generate` runs nbgrader's
GenerateFeedback converter, with ClearHiddenTests always among its preprocessors.
"""
from __future__ import annotations

import copy

from nbformat import NotebookNode
from nbgrader.converters import GenerateFeedback, NbGraderException
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import ClearHiddenTests
from traitlets.config import Config

from .prepare import QUIET


def hide_test_tracebacks(nb: NotebookNode, config: Config) -> NotebookNode:
    """Errors of cells with hidden tests keep their name and message only."""
    marker = ClearHiddenTests(config=config).begin_test_delimeter
    for cell in nb.cells:
        if cell.cell_type == "code" and marker in cell.source:
            for output in cell.outputs:
                if output.output_type == "error":
                    output.traceback = [f"{output.ename}: {output.evalue}"]
    return nb


def generate(coursedir: CourseDirectory, config: Config, assignments: list[str]) -> list[str]:
    """nbgrader's generate_feedback for these assignments (submissions without up-to-date
    feedback only); returns the assignments it failed for."""
    config = copy.deepcopy(config)
    names = [p if isinstance(p, str) else f"{p.__module__}.{p.__qualname__}" for p in GenerateFeedback(config=config).preprocessors]
    if not any(name.endswith("ClearHiddenTests") for name in names):
        config.GenerateFeedback.preprocessors = [names[0], "nbgrader.preprocessors.ClearHiddenTests", *names[1:]]
    failed = []
    for assignment in assignments:
        config.CourseDirectory.assignment_id = assignment
        config.CourseDirectory.student_id = "*"
        try:
            GenerateFeedback(coursedir=CourseDirectory(config=config), config=config, log=QUIET).start()
        except NbGraderException:
            failed.append(assignment)
    return failed
