"""`autograder grade` gives exactly stock `nbgrader autograde`'s scores on honest submissions.

The submissions are those of test_grading.py (the model solution, every known wrong
answer, every unusual right answer, the untouched released notebook), graded by stock
nbgrader in one copy of the course and by the engine in another. The engine's results
are then used as nbgrader's tools use them: `nbgrader export` and feedback.
"""
from __future__ import annotations

import csv
import html
import re
import subprocess
import sys
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from answers import for_notebook
from autograder import authoring
from engine_course import clone, grade, notebook, solutions
from grading import Course
from test_grading import _packed

SLUGS = authoring.assignments()
pytestmark = pytest.mark.slow


def _scores(course: Course, slug: str) -> dict:
    with Gradebook(course.db_url) as gb:
        return {
            (sub.student.id, g.name): (g.auto_score, g.max_score, g.needs_manual_grade)
            for sub in gb.assignment_submissions(slug) for nb in sub.notebooks for g in nb.grades
        }


@pytest.fixture(scope="module", params=SLUGS)
def both(request, tmp_path_factory):
    """(stock-graded course, engine-graded course, the engine's output) for one notebook."""
    slug = request.param
    module = for_notebook(slug)
    stock = Course(tmp_path_factory.mktemp(f"stock-{slug}"), [slug])
    model = solutions(slug)
    stock.submit("correct", slug, model)
    stock.submit("released", slug, None)
    for sub in [*_packed("wrong", module.MUTANTS, True), *_packed("right", module.VARIANTS, False)]:
        stock.submit(sub.student, slug, {**model, **{ex: a.apply(model[ex]) for ex, a in sub.answers.items()}})
    engine = clone(stock, tmp_path_factory.mktemp(f"engine-{slug}"))
    result = stock.autograde(slug)
    assert result.returncode == 0, result.stderr
    graded = grade(engine, slug, "--feedback")
    assert graded.returncode == 0, graded.stderr
    return slug, stock, engine, graded


def _flags(slug: str) -> dict[str, list[str]]:
    """{student: why the engine flags their honest submission}: answers that are wrong in a
    way worth a person's look (a backward that asks autograd), nobody else."""
    module = for_notebook(slug)
    return {
        sub.student: [a.flag for a in sub.answers.values() if a.flag]
        for sub in [*_packed("wrong", module.MUTANTS, True), *_packed("right", module.VARIANTS, False)]
        if any(a.flag for a in sub.answers.values())
    }


def test_scores_are_stock_nbgraders(both):
    """The same points on every cell; a flag asks for a person (needs_manual_grade) where stock nbgrader does not."""
    slug, stock, engine, _ = both
    expected, got = _scores(stock, slug), _scores(engine, slug)
    flags = _flags(slug)
    assert expected and {k: v[:2] for k, v in got.items()} == {k: v[:2] for k, v in expected.items()}
    assert {k: v[2] for k, v in got.items() if k[0] not in flags} == {k: v[2] for k, v in expected.items() if k[0] not in flags}


def test_only_answers_worth_a_look_are_flagged(both):
    slug, _, engine, graded = both
    flags = _flags(slug)
    with Gradebook(engine.db_url) as gb:
        flagged = {sub.student.id for sub in gb.assignment_submissions(slug) for nb in sub.notebooks if nb.flagged}
    assert flagged == set(flags)
    for student, reasons in flags.items():
        top = notebook(engine, "autograded", student, slug).cells[0].source.lower()
        assert all("worth a look" in top and reason.lower() in top for reason in reasons), top
    assert ("Flagged for manual review" in graded.stderr) == bool(flags)


def test_feedback_has_scores_and_no_hidden_tests(both):
    """Not in sources, and not quoted by the tracebacks of failing hidden tests either:
    neither in `autograder grade --feedback`'s pages nor in stock `nbgrader generate_feedback`'s."""
    slug, _, engine, _ = both
    hidden = _hidden_lines(authoring.solution_path(slug).read_text())
    assert hidden
    _assert_no_hidden(engine, slug, hidden)
    nbgrader = Path(sys.executable).with_name("nbgrader")
    stock = subprocess.run([str(nbgrader), "generate_feedback", slug, "--force"], cwd=engine.root, capture_output=True, text=True)
    assert stock.returncode == 0, stock.stderr
    _assert_no_hidden(engine, slug, hidden)


def _assert_no_hidden(course: Course, slug: str, hidden: list[str]) -> None:
    pages = list((course.root / "feedback").glob(f"*/{slug}/{slug}.html"))
    assert len(pages) == len(list((course.root / "submitted").iterdir()))
    for page in pages:
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        assert "Score:" in text and "HIDDEN TESTS" not in text, page
        assert not [line for line in hidden if line in text], page


def _hidden_lines(source: str) -> list[str]:
    """The lines between hidden-test markers in a solution notebook (long enough to be telling),
    except those a visible cell also shows (a hidden test may repeat a visible call)."""
    import nbformat

    hidden, visible, inside = [], set(), False
    for cell in nbformat.reads(source, as_version=4).cells:
        for line in cell.source.splitlines():
            if "BEGIN HIDDEN TESTS" in line or "END HIDDEN TESTS" in line:
                inside = "BEGIN" in line
            elif len(line.strip()) >= 20:
                (hidden.append if inside else visible.add)(line.strip())
    return [line for line in hidden if line not in visible]


def test_nbgrader_export_reads_the_engines_gradebook(both):
    slug, _, engine, _ = both
    out = engine.root / "exported.csv"
    nbgrader = Path(sys.executable).with_name("nbgrader")
    result = subprocess.run([str(nbgrader), "export", "--to", str(out)], cwd=engine.root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    with open(out) as f:
        exported = {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}
    with open(engine.root / "grades.csv") as f:
        ours = {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}
    assert exported == ours and exported["correct"] == max(exported.values()) > 0 and exported["released"] == 0


def test_report_files(both):
    slug, _, engine, graded = both
    assert (engine.root / "reports" / slug / "grades.png").stat().st_size > 1000
    assert "Grading summary" in graded.stderr
