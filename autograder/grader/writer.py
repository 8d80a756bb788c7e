"""The one trusted writer: gradebook rows and autograded notebooks, one submission at a time.

Student code never runs in this process and cannot reach what it writes. For each
submission the autograded notebooks are scored by nbgrader's own autograde preprocessors
(SaveAutoGrades, AssignLatePenalties, LimitOutput, ...) inside one gradebook transaction,
so its rows, late penalties and comments are nbgrader's; then, in the same transaction,
`_trust` writes each graded cell's score again from the grader's own verdicts. That second
write is the score: nbgrader's scorers read the cells' outputs, which the grader wrote but
which say what happened, while the verdict is what the grader decided. After the commit
the folder moves into autograded/. As in nbgrader, that folder's presence means "graded":
a grader killed at any point grades that submission again next time and never leaves half
of one behind. Feedback made before a regrade is removed.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from nbformat.v4 import nbjson
from nbgrader.api import Gradebook
from nbgrader.converters import Autograde
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import CheckCellMetadata, Execute
from nbgrader.utils import rmtree
from traitlets.config import Config

from . import gradebook, preflight
from .discover import Submission
from .feedback import hide_test_tracebacks
from .prepare import QUIET
from .results import NotebookResult


class Writer:
    def __init__(self, coursedir: CourseDirectory, config: Config) -> None:
        self.coursedir, self.config = coursedir, config
        self.root = Path(coursedir.root)
        self.staging = self.root / preflight.STATE / "staging"
        if self.staging.exists():  # what a killed run left half-made
            rmtree(str(self.staging))
        self.staging.mkdir(parents=True)
        self.gradebook = Gradebook(coursedir.db_url, coursedir.course_id)
        self.scorers = [  # nbgrader's autograde step, without executing (done) or checking the metadata again
            cls(config=config, log=QUIET) for cls in Autograde(config=config).autograde_preprocessors
            if cls not in (Execute, CheckCellMetadata)  # (nbgrader's sanitizing step checked it: prepare.py)
        ]

    def _dest(self, step: str, submission: Submission) -> Path:
        return Path(self.coursedir.format_path(step, submission.student, submission.assignment))

    def save(self, submission: Submission, results: list[NotebookResult]) -> None:
        stage = Path(tempfile.mkdtemp(dir=self.staging))
        for name, data in submission.contents.items():  # timestamp.txt and data files, as nbgrader keeps them
            (stage / name).parent.mkdir(parents=True, exist_ok=True)
            (stage / name).write_bytes(data)
        with gradebook.transaction(self.gradebook) as gb:
            gb.update_or_create_student(submission.student)
            timestamp = {"timestamp": submission.timestamp} if submission.timestamp else {}
            gb.update_or_create_submission(submission.assignment, submission.student, **timestamp)
            self._zero_missing(gb, submission, {r.name for r in results})
            for result in results:
                if result.nb is None:  # unreadable: kept as it came for a person, under a name nbgrader skips
                    if result.data is not None:
                        (stage / f"{result.name}.ipynb.unreadable").write_bytes(result.data)
                else:
                    resources = self._resources(submission, result.name)
                    nb = result.nb
                    for score in self.scorers:
                        nb, resources = score(nb, resources)
                    self._trust(gb, submission, result)
                    # As nbformat.write does, without validating again what results.graded validated.
                    (stage / f"{result.name}.ipynb").write_text(nbjson.writes(hide_test_tracebacks(nb, self.config)))
                if result.problems:
                    self._flag(gb, submission, result)
            saved = gb.find_submission(submission.assignment, submission.student)  # (the run's summary says it)
            submission.seconds_late, submission.late_penalty = saved.total_seconds_late, saved.late_submission_penalty
            # Last before the commit: from here until the new folder is in place, the
            # submission counts as not graded, so an interruption means grading it again.
            for step in (self.coursedir.feedback_directory, self.coursedir.autograded_directory):
                self._remove(self._dest(step, submission))
        _set_permissions(stage, 0o444)
        dest = self._dest(self.coursedir.autograded_directory, submission)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(stage, dest)

    def _resources(self, submission: Submission, notebook: str) -> dict[str, Any]:
        return {"nbgrader": {"notebook": notebook, "assignment": submission.assignment,
                             "student": submission.student, "db_url": self.coursedir.db_url}}

    @staticmethod
    def _zero_missing(gb: Gradebook, submission: Submission, submitted: set[str]) -> None:
        """Notebooks of the assignment that were not submitted score 0 (as in nbgrader)."""
        for notebook in gb.find_assignment(submission.assignment).notebooks:
            if notebook.name not in submitted:
                row = gb.find_submission_notebook(notebook.name, submission.assignment, submission.student)
                for grade in row.grades:
                    grade.auto_score, grade.needs_manual_grade = 0, False
        gb.db.commit()

    @staticmethod
    def _trust(gb: Gradebook, submission: Submission, result: NotebookResult) -> None:
        """Each graded cell's score, written over what nbgrader's scorers read from its outputs:
        the grader's own verdict (the module's docstring says why both are written)."""
        grades = gb.grades(result.name, submission.assignment, submission.student)
        for grade_id, score in result.trusted_scores().items():
            grades[grade_id].auto_score = score
        gb.db.commit()

    @staticmethod
    def _flag(gb: Gradebook, submission: Submission, result: NotebookResult) -> None:
        row = gb.find_submission_notebook(result.name, submission.assignment, submission.student)
        row.flagged = True
        for grade in row.grades:
            grade.needs_manual_grade = True
            if result.nb is None:
                grade.auto_score = 0
        gb.db.commit()

    def _remove(self, folder: Path) -> None:
        if folder.exists():
            gone = Path(tempfile.mkdtemp(dir=self.staging))
            os.rename(folder, gone / "old")  # atomic: the folder is there whole, or not at all
            rmtree(str(gone))

    def close(self) -> None:
        self.gradebook.close()
        rmtree(str(self.staging))


def _set_permissions(folder: Path, mode: int) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(mode)
