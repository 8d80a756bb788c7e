"""What an instructor takes away from grading: an LMS-ready CSV with roster names, and
grades.png with the total distribution, mean, median, even bins and statuses marked."""
from __future__ import annotations

import csv
import random
import statistics
from pathlib import Path

import pytest
from grading import Course, points
from nbgrader.api import Gradebook
from nbgrader.coursedir import CourseDirectory

from autograder.grader import course as grading_course
from autograder.grader import report
from autograder.grader.preflight import load_config
from autograder.grader.records import Options

SLUG = "03_function_basics"
SCREENSHOTS = Path(__file__).resolve().parent.parent / ".test-screenshots"  # kept for a person to look at


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Course:
    """A released course with 12 scored submissions: two students on the roster with names
    and e-mail, one flagged, one that failed (as last-run.csv says)."""
    root = tmp_path_factory.mktemp("grades") / "course"
    root.mkdir()
    course = Course(root, [SLUG])
    rng = random.Random(3)
    with Gradebook(course.db_url) as gb:
        gb.update_or_create_student("s01", first_name="Ada", last_name="Lovelace", email="ada@example.org")
        gb.update_or_create_student("s02", first_name="Alan", last_name="Turing")
        for k in range(1, 13):
            student = f"s{k:02d}"
            gb.update_or_create_student(student)
            submission = gb.add_submission(SLUG, student)
            notebook = submission.notebooks[0]
            for grade in notebook.grades:
                grade.auto_score = rng.choice([0, grade.max_score, grade.max_score])
            notebook.flagged = student == "s05"
        gb.db.commit()
        gb.update_or_create_student("s13", first_name="Grace", last_name="Hopper")  # submitted nothing
    (root / "reports" / SLUG).mkdir(parents=True)
    (root / "reports" / SLUG / "last-run.csv").write_text("student,status\ns07,failed\ns01,graded\n")
    return course


def _export(course: Course) -> None:
    coursedir = CourseDirectory(config=load_config(Options(root=course.root, db_url=course.db_url)))
    grading_course._export(coursedir, coursedir.config, {SLUG})


def test_the_lms_csv_has_canvas_columns_roster_names_and_totals(graded):
    _export(graded)
    with open(graded.root / "grades-lms.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", SLUG]
    by_id = {row[2]: row for row in rows[1:]}
    assert len(by_id) == 13
    assert by_id["s01"][:4] == ["Lovelace, Ada", "", "s01", "ada@example.org"]
    assert by_id["s02"][:4] == ["Turing, Alan", "", "s02", "s02"]  # no e-mail: the id logs in
    assert by_id["s03"][0] == "s03"  # not on a roster: the id
    assert by_id["s13"][5] == ""  # nothing submitted: left empty, not a zero
    with Gradebook(graded.db_url) as gb:
        assert float(by_id["s04"][5]) == gb.find_submission(SLUG, "s04").score


def test_grades_png_shows_totals_statuses_mean_and_median(graded):
    _export(graded)
    found = report.scores(graded.db_url, "autograd-course", SLUG, graded.root / "solutions" / SLUG,
                          report.read_failed(graded.root / "reports" / SLUG / "last-run.csv"))
    assert found.statuses["s05"] == "flagged" and found.statuses["s07"] == "failed"
    assert sum(s == "graded" for s in found.statuses.values()) == 10
    assert found.top == points(SLUG) and len(found.totals) == 12
    top = report.draw(found, SLUG).axes[0]
    legend = [text.get_text() for text in top.get_legend().get_texts()]
    totals = list(found.totals.values())
    assert f"mean {statistics.fmean(totals):.1f}" in legend and f"median {statistics.median(totals):g}" in legend
    assert {"flagged for review (1)", "failed (not fully run) (1)"} <= set(legend), legend
    stacked = [round(sum(bar.get_height() for bar in bars)) for bars in top.containers]
    assert stacked == [10, 1, 1]  # graded, flagged, failed: every submission drawn once
    png = graded.root / "reports" / SLUG / "grades.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    SCREENSHOTS.mkdir(exist_ok=True)
    (SCREENSHOTS / "grades.png").write_bytes(png.read_bytes())


def test_bins_are_even_and_cover_every_score():
    for top in (1, 3, 10, 17.5, 42, 100, 260):
        edges, width = report.even_bins(top)
        assert edges[0] == 0 and edges[-1] >= top and len(edges) - 1 <= 20
        assert all(abs((b - a) - width) < 1e-12 for a, b in zip(edges, edges[1:]))
