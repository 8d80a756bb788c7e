"""Feedback a student can read, without the hidden tests, from nbgrader's own feedback step.

nbgrader's ClearHiddenTests removes hidden tests from a cell's source, but a failing
hidden test's traceback quotes that source line by line. So the autograded notebook
keeps, for a cell that held hidden tests, only each error's name and message (which the
checks write for students): any feedback made from it, by `nbgrader generate_feedback`
or by `autograder grade --feedback`, shows no hidden test.

`configure` sets nbgrader's feedback step up as the course wants it (nbgrader_config.py
calls it, and so does `generate`): ClearHiddenTests always, `Readable` before it, and the
course's template (jupyter/templates/), which names each test cell by its exercise in the
table of contents and wraps long lines instead of cutting them.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from nbconvert import HTMLExporter
from nbformat import NotebookNode
from nbgrader import utils
from nbgrader.converters import GenerateFeedback, NbGraderException
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import ClearHiddenTests, NbGraderPreprocessor
from traitlets.config import Config

TEMPLATES = Path(__file__).resolve().parents[2] / "jupyter" / "templates"  # the course's feedback template
TEMPLATE = "autograd-feedback"
NBGRADER_TEMPLATES = Path(utils.__file__).parent / "server_extensions" / "formgrader" / "templates"
HAND_IN_TAG = "hand-in"  # authoring.HAND_IN_TAG: the notebook's hand-in cell
TITLE = "autograd_title"  # cell metadata: what the feedback's table of contents calls a test cell


class Readable(NbGraderPreprocessor):  # type: ignore[misc]  # (nbgrader is untyped)
    """Before ClearHiddenTests: each test cell named by the heading it belongs to ("Exercise
    3.1 · ClippedReLU with a non-tensor clip: hidden checks"); no output that says nothing to a
    student — a test cell's result value (nbgrader's partial credit, shown as "Out[24]:
    2.5"), the summary's and the hand-in cell's messages of grading time."""

    def preprocess(self, nb: NotebookNode, resources: dict[str, Any]) -> tuple[NotebookNode, dict[str, Any]]:
        marker = ClearHiddenTests(config=self.config).begin_test_delimeter
        heading = ""
        for cell in nb.cells:
            if cell.cell_type == "markdown" and cell.source.startswith("#"):
                heading = _title(cell.source.splitlines()[0])
            if cell.cell_type != "code":
                continue
            if utils.is_grade(cell) and not utils.is_solution(cell):
                kind = "hidden checks" if marker in cell.source else "check"
                cell.metadata[TITLE] = f"{heading}: {kind}" if heading else kind.capitalize()
                cell.outputs = [o for o in cell.outputs if o.output_type != "execute_result"]
            elif HAND_IN_TAG in cell.metadata.get("tags", []) or "autograder.student.summary import" in cell.source:
                cell.outputs = []
        return nb, resources


class FeedbackExporter(HTMLExporter):
    """nbgrader's feedback exporter under a name of its own, so that nbgrader_config.py can give
    it the course's template and leave formgrader's HTMLExporter its own."""


def _title(heading: str) -> str:
    """A markdown heading as plain text, without its difficulty and time ("(★☆☆, ~15 min)")."""
    text = re.sub(r"^#+\s*", "", heading).replace("`", "")
    return re.sub(r"\s*\([^()]*★[^()]*\)\s*$", "", text).strip()


def configure(config: Config) -> Config:
    """nbgrader's feedback step as the course wants it, whatever the course's configuration
    says (nbgrader_config.py names the same): Readable, then ClearHiddenTests, right after
    GetGrades; the course's template."""
    given = config.GenerateFeedback.get("preprocessors") or GenerateFeedback.class_traits()["preprocessors"].default()
    names = [_name(p) for p in given if not _name(p).endswith((".ClearHiddenTests", ".Readable"))]
    config.GenerateFeedback.preprocessors = [names[0], _name(Readable), _name(ClearHiddenTests), *names[1:]]
    config.HTMLExporter.template_name = TEMPLATE
    config.HTMLExporter.extra_template_basedirs = [str(NBGRADER_TEMPLATES), str(TEMPLATES)]
    return config


def _name(preprocessor: Any) -> str:
    return preprocessor if isinstance(preprocessor, str) else f"{preprocessor.__module__}.{preprocessor.__qualname__}"


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
    from .prepare import QUIET

    config = configure(copy.deepcopy(config))
    failed = []
    for assignment in assignments:
        config.CourseDirectory.assignment_id = assignment
        config.CourseDirectory.student_id = "*"
        try:
            GenerateFeedback(coursedir=CourseDirectory(config=config), config=config, log=QUIET).start()
        except NbGraderException:
            failed.append(assignment)
    return failed
