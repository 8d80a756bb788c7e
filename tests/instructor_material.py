"""The instructor's material, as lines to look for wherever students' code or students can
read: every solution and hidden-test line (quiz keys are in hidden tests) and every line of a
model written answer (a markdown cell a person grades) that the released notebooks do not show;
and the only ones the student package may hold, the earlier answers that later notebooks
import once their notebook is past due."""
from __future__ import annotations

from pathlib import PurePosixPath

import nbformat

from autograder import authoring, earlier_answers

SHORTEST = 20  # characters: shorter lines are too common to mean anything


def between(source: str, begin: str, end: str) -> list[str]:
    """The stripped lines of `source` between two marker lines."""
    found, inside = [], False
    for line in source.splitlines():
        if begin in line:
            inside = True
        elif end in line:
            inside = False
        elif inside:
            found.append(line.strip())
    return found


def released_text() -> str:
    return "\n".join(cell.source for path in sorted((authoring.ROOT / "course").glob("*/*.ipynb"))
                     for cell in nbformat.read(path, as_version=4).cells)


def instructor_lines() -> dict[str, str]:
    """{line: where it comes from} for every notebook in solutions/."""
    released = released_text()
    found: dict[str, str] = {}
    for slug in authoring.assignments():
        for cell in nbformat.read(authoring.solution_path(slug), as_version=4).cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "?")
            for kind, begin, end in (("hidden test", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"),
                                     ("solution", "### BEGIN SOLUTION", "### END SOLUTION")):
                for line in between(cell.source, begin, end):
                    if len(line) >= SHORTEST and not line.startswith("#") and line not in released:
                        found.setdefault(line, f"{slug} {grade_id} ({kind})")
            if cell.cell_type == "markdown" and cell.metadata.get("nbgrader", {}).get("solution"):
                for line in (line.strip() for line in cell.source.splitlines()):  # a written answer, whole
                    if len(line) >= SHORTEST and line not in released:
                        found.setdefault(line, f"{slug} {grade_id} (written answer)")
    return found


EARLIER = PurePosixPath("autograder/student/earlier")  # where the student package gives earlier answers


def earlier_lines(name: str) -> set[str]:
    """The stripped lines that the file `name` (a path in the student package) may hold of the
    solutions: for the module of a notebook listed as past due in autograder/student/earlier/, its
    model answers that later notebooks import; for any other file, none."""
    path = PurePosixPath(name)
    slug = {earlier_answers.topic(s): s for s in earlier_answers.past_due()}.get(path.stem)
    if path.parent != EARLIER or slug is None:
        return set()
    return {line.strip() for cell in earlier_answers.exported(slug) for line in cell.splitlines()}
