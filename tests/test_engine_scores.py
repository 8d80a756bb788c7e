"""`autograder grade` gives exactly stock `nbgrader autograde`'s scores on honest submissions.

Stock nbgrader grades a sample of the class batches (test_grading.py's) that covers every
kind of graded cell the course has: of the notebooks in COVERING, one wrong and one right
answer of every exercise (every exercise and graded cell of those notebooks, in two
submissions). `make compare-stock` (pytest --stock-all) compares every known answer and
the released notebook of every notebook instead.
"""
from __future__ import annotations

import shutil

import pytest
from nbgrader.api import Gradebook

from autograder import authoring
from grading import COVERING, ClassBatch, Course

SLUGS = authoring.assignments()
pytestmark = pytest.mark.slow


def pytest_generate_tests(metafunc):
    every = metafunc.config.getoption("--stock-all")
    metafunc.parametrize("graded", SLUGS if every else COVERING, indirect=True, scope="module")


def _scores(course: Course, slug: str, students: set[str]) -> dict:
    with Gradebook(course.db_url) as gb:
        return {
            (sub.student.id, g.name): (g.auto_score, g.max_score, g.needs_manual_grade)
            for sub in gb.assignment_submissions(slug) if sub.student.id in students
            for nb in sub.notebooks for g in nb.grades
        }


@pytest.fixture(scope="module")
def graded(request, class_batches, tmp_path_factory, pytestconfig):
    """(the class batch, the same submissions graded by stock nbgrader, who they are)."""
    batch = class_batches(request.param)
    assert batch.result.returncode == 0, batch.result.stderr
    stock = Course(tmp_path_factory.mktemp(f"stock-{batch.slug}"), [batch.slug])
    everyone = [p.name for p in (batch.course.root / "submitted").iterdir()]
    chosen = everyone if pytestconfig.getoption("--stock-all") else [s for s in ClassBatch.SAMPLE if s in everyone]
    for student in chosen:
        shutil.copytree(batch.course.root / "submitted" / student, stock.root / "submitted" / student)
    result = stock.autograde(batch.slug)
    assert result.returncode == 0, result.stderr
    return batch, stock, set(chosen)


def test_scores_are_stock_nbgraders(graded):
    """The same points on every cell of a sample that has a wrong and a right answer of every
    exercise; a flag asks for a person (needs_manual_grade) where stock nbgrader does not."""
    batch, stock, students = graded
    for exercise in batch.exercises:
        carriers = [s for s in students if exercise.answer_id in getattr(batch.submissions.get(s), "answers", {})]
        assert {batch.submissions[s].wrong for s in carriers} == {True, False}, exercise.answer_id
    expected, got = _scores(stock, batch.slug, students), _scores(batch.course, batch.slug, students)
    flagged = {sub.student for sub in batch.submissions.values() if any(a.flag for a in sub.answers.values())}
    assert expected and {k: v[:2] for k, v in got.items()} == {k: v[:2] for k, v in expected.items()}
    assert ({k: v[2] for k, v in got.items() if k[0] not in flagged}
            == {k: v[2] for k, v in expected.items() if k[0] not in flagged})
