"""The capstone's design write-up, graded by hand in formgrader in a real browser (Debian's
Chromium, driven by Playwright) against `make instructor`, on a course of the capstone alone.

Its markdown answer cell (nbgrader's "manually graded answer": solution, grade, points, no
test) is left to a person by `autograder grade`, as by stock nbgrader: the submission needs a
manual grade, and its total counts the autograded points only. The instructor opens the
submission from formgrader's gradebook, reads the write-up under its rubric, types a score
and a comment; the gradebook then shows the sum, and so do `nbgrader export`'s grades.csv and
our grades.csv and grades-lms.csv (written again from the gradebook by the next `autograder
grade`, which grades nothing new). Screenshots: .test-screenshots/.
"""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

import browser
from engine_course import grade, solutions
from grading import Course, points

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser"), pytest.mark.integration]
SLUG = "11_capstone"
WRITEUP = "design"  # the grade_id of the write-up
WRITTEN = 4  # its points
MANUAL = 3.5  # what the instructor gives it
WRITEUP_TEXT = """**What is kept.** The logits, the targets and the weights: inputs, so 0 new bytes until backward.

**Where backward gets the rest.** It computes the softmax again with torch operations: gradgradcheck passes.

**What it costs.** A second softmax in backward; slower than F.cross_entropy in section 6.

**Another design.** Save each row's log-sum-exp as a second output: 8N bytes, no max again in backward."""


def _saves(kind):
    """Whether a response answers formgrader's save of a grade or a comment."""
    return lambda response: f"/formgrader/api/{kind}/" in response.url and response.request.method == "PUT"


def _row(page, student: str):
    return page.locator(f"table tbody tr:has(a.name-shown:text-is('{student}'))")


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The capstone released alone; alice hands in the model answers and a write-up, graded."""
    root = tmp_path_factory.mktemp("capstone") / "course"
    root.mkdir()
    course = Course(root, [SLUG])
    course.submit("alice", SLUG, {**solutions(SLUG), WRITEUP: WRITEUP_TEXT})
    graded = grade(course, SLUG)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    with Gradebook(course.db_url) as gb:
        written = gb.find_grade(WRITEUP, SLUG, SLUG, "alice")
        assert written.auto_score is None and written.needs_manual_grade  # left to a person, as nbgrader does
        assert gb.find_submission(SLUG, "alice").score == points(SLUG) - WRITTEN
    return course


def _grades(path: Path, student: str) -> dict:
    with open(path, newline="") as f:
        return next(row for row in csv.DictReader(f) if row.get("student_id", row.get("SIS User ID")) == student)


def test_an_instructor_grades_the_write_up_by_hand_and_the_total_counts_it(course, tmp_path):
    auto, top = points(SLUG) - WRITTEN, points(SLUG)
    with browser.chromium() as chromium, browser.lab("instructor", tmp_path, COURSE=str(course.root)) as base:
        page = browser.person(chromium)
        try:
            page.request.get(f"{base}/lab?token={browser.TOKEN}")  # logged in, as opening JupyterLab does
            page.goto(f"{base}/formgrader/gradebook/{SLUG}/{SLUG}?token={browser.TOKEN}")
            alice = _row(page, "alice")
            alice.wait_for(timeout=60_000)
            page.wait_for_function("() => document.querySelector('table tbody tr td.score')?.textContent.trim()",
                                   timeout=60_000)
            browser.screenshot(page, "manual-grading-before")
            assert alice.locator("td.score").inner_text() == f"{auto:g} / {top:g}"
            assert alice.locator("td.written-score").inner_text() == f"0 / {WRITTEN:g}"
            assert alice.locator("td.needs-manual-grade[data-search='needs manual grade']").count() == 1
            alice.locator("a.name-hidden, a.name-shown").first.click()
            score = page.locator(f"input.score#{WRITEUP}")
            score.wait_for(timeout=60_000)
            answer = page.locator(f".nbgrader_cell:has(input.score#{WRITEUP})")
            text = answer.inner_text()
            assert "Where backward gets the rest" in text  # the student's write-up
            rubric = page.locator(".cell:has-text('Your design, in writing')").first
            assert "What is kept" in rubric.inner_text() and "Another design" in rubric.inner_text()  # the rubric
            browser.element_screenshot(rubric, "manual-grading-rubric")
            # both saves awaited from before the first keystroke: leaving the score field saves the grade and
            # leaving the comment saves it, and on a loaded machine either answer may come in any order
            with page.expect_response(_saves("grade"), timeout=90_000), \
                    page.expect_response(_saves("comment"), timeout=90_000):
                score.fill(f"{MANUAL:g}")
                page.locator(f"textarea#{WRITEUP}-comment").fill("Kept, backward and the other design: full. Cost: "
                                                                  "no number from section 6, half a point.")
                page.keyboard.press("Tab")  # as a person leaves the field: formgrader saves it
            browser.element_screenshot(answer, "manual-grading-write-up")
            page.goto(f"{base}/formgrader/gradebook/{SLUG}/{SLUG}?token={browser.TOKEN}")
            _row(page, "alice").locator(f"td.score:text-is('{auto + MANUAL:g} / {top:g}')").wait_for(timeout=60_000)
            assert _row(page, "alice").locator("td.written-score").inner_text() == f"{MANUAL:g} / {WRITTEN:g}"
            browser.screenshot(page, "manual-grading-after")
        finally:
            browser.screenshot(page, "manual-grading-last")
            page.close()
    with Gradebook(course.db_url) as gb:
        assert gb.find_grade(WRITEUP, SLUG, SLUG, "alice").manual_score == MANUAL
    nbgrader = Path(sys.executable).with_name("nbgrader")
    exported = subprocess.run([str(nbgrader), "export", "--to", "exported.csv"], cwd=course.root,
                              capture_output=True, text=True, timeout=300)
    assert exported.returncode == 0, exported.stderr
    row = _grades(course.root / "exported.csv", "alice")
    assert (float(row["score"]), float(row["max_score"])) == (auto + MANUAL, top)
    again = grade(course, SLUG)  # nothing new to grade: the reports are written again from the gradebook
    assert again.returncode == 0, again.stdout + again.stderr
    assert float(_grades(course.root / "grades.csv", "alice")["score"]) == auto + MANUAL
    assert float(_grades(course.root / "grades-lms.csv", "alice")[SLUG]) == auto + MANUAL
