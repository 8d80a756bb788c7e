"""Find the submissions to grade in nbgrader's submitted/ tree."""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from nbgrader.coursedir import CourseDirectory
from nbgrader.utils import find_all_files


@dataclass
class Submission:
    """One student's submission of one assignment: nbgrader's submitted/STUDENT/ASSIGNMENT."""

    student: str
    assignment: str
    folder: Path
    timestamp: datetime | None
    notebooks: list[Path]
    extra_files: dict[str, Path] = field(default_factory=dict)  # other files, as nbgrader copies them

    @property
    def key(self) -> str:
        return f"{self.assignment}/{self.student}"


def find(coursedir: CourseDirectory, assignments: list[str], students: list[str]) -> list[Submission]:
    """Submissions of the given assignments and students (empty lists: all), sorted."""
    found = []
    for assignment in assignments or ["*"]:
        for student in students or ["*"]:
            pattern = coursedir.format_path(coursedir.submitted_directory, student, assignment)
            for folder in sorted(glob.glob(pattern)):
                if os.path.isdir(folder):
                    found.append(_submission(coursedir, Path(folder)))
    unique = {s.key: s for s in found}
    return sorted(unique.values(), key=lambda s: (s.assignment, s.student))


def _submission(coursedir: CourseDirectory, folder: Path) -> Submission:
    assignment, student = folder.name, folder.parent.name
    source = Path(coursedir.format_path(coursedir.source_directory, ".", assignment))
    extra: dict[str, Path] = {}
    for base in (folder, source):  # the instructor's files win, as in nbgrader autograde
        if base.is_dir():
            for path in find_all_files(str(base), coursedir.ignore + ["*.ipynb"]):
                extra[os.path.relpath(path, base)] = Path(path)
    return Submission(
        student, assignment, folder, coursedir.get_existing_timestamp(str(folder)),
        sorted(folder.glob(f"{coursedir.notebook_id}.ipynb")), extra,
    )


def is_done(coursedir: CourseDirectory, submission: Submission) -> bool:
    """Graded before, and not resubmitted since: nbgrader's own rule (autograded/ exists)."""
    dest = coursedir.format_path(coursedir.autograded_directory, submission.student, submission.assignment)
    if not os.path.isdir(dest):
        return False
    graded_at = coursedir.get_existing_timestamp(dest)
    return not (submission.timestamp and graded_at and submission.timestamp > graded_at)
