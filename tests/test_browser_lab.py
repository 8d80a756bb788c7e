"""Each user's path in a real browser (Debian's Chromium, driven by Playwright) against real
JupyterLab servers started with `make lab` (a student) and `make instructor`.

The student: their own copy of a released notebook (never course/), no instructor panels,
Run All, a check that passes and one that fails with its message, notebook 07's graph
drawn. The instructor: submissions handed in with hand_in(), collected with `nbgrader
zip_collect`, graded with `autograder grade --feedback`; formgrader shows the scores and
the flag; feedback has no hidden test; formgrader's Autograde button grades a forged
submission with the engine. Screenshots: .test-screenshots/.
"""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import browser
from autograder import authoring
from autograder.student import handin
from engine_course import grade, solutions
from grading import Course, canvas_download, points

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser"), pytest.mark.integration]
SLUG = "03_function_basics"
GRAPHS = "07_double_backward"
WRONG_BIAS = ("grad_bias = grad_output.sum(0)", "grad_bias = grad_output.mean(0)")  # a known wrong answer
# mallory's ClippedReLU: a backward that ignores grad_output, and, in her own kernel, the course's
# check of it replaced by one that passes. Stock nbgrader runs the test cells in that kernel (15 / 15).
WRONG_BACKWARD = ("grad_output * inside, None", "inside.to(grad_output.dtype), None")
FORGERY = """
import autograder.exercises.function_basics as course_checks
course_checks.check_clipped_relu = lambda *args, **kwargs: print("✔ all good")
"""


def _answer(path: Path, answers: dict[str, str]) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    nbformat.write(nb, path)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def chromium():
    """One browser for the module: Playwright's sync API runs one at a time in a thread."""
    with browser.chromium() as it:
        yield it


@pytest.fixture(scope="module")
def student_lab(tmp_path_factory, chromium):
    """`make lab` with its own work folder; one server for every student test."""
    tmp = tmp_path_factory.mktemp("student-lab")
    before = {slug: _digest(authoring.ROOT / "course" / slug / f"{slug}.ipynb") for slug in (SLUG, GRAPHS)}
    with browser.lab("lab", tmp, WORK=str(tmp / "work")) as base:
        yield base, tmp / "work", chromium
    for slug, digest in before.items():  # the tracked notebooks were never touched
        assert _digest(authoring.ROOT / "course" / slug / f"{slug}.ipynb") == digest


def test_a_student_runs_a_notebook_and_sees_a_check_pass_and_one_fail(student_lab):
    base, work, chromium = student_lab
    copy = work / SLUG / f"{SLUG}.ipynb"
    assert copy.is_file()  # make lab copied the released notebook into the student's own folder
    model = solutions(SLUG)
    _answer(copy, {"clipped_relu": model["clipped_relu"], "linear": model["linear"].replace(*WRONG_BIAS)})
    page = browser.person(chromium)
    try:
        browser.open_notebook(page, base, f"{SLUG}/{SLUG}.ipynb")
        assert "Nbgrader" not in browser.menu_titles(page)  # no formgrader, no Create Assignment
        tabs = " ".join(page.evaluate("() => [...document.querySelectorAll('.lm-TabBar-tab')].map(e => e.title)"))
        assert "Assignment" not in tabs and "Course" not in tabs
        browser.run_all(page)
        browser.wait_for_output(page, "check_clipped_relu(ClippedReLU)", "✔")
        browser.wait_for_output(page, "check_linear(Linear)", "CheckFailed")
        passed = page.locator(".jp-Cell:has(.jp-InputArea:has-text('check_clipped_relu(ClippedReLU)')) .jp-OutputArea")
        failed = page.locator(".jp-Cell:has(.jp-InputArea:has-text('check_linear(Linear)')) .jp-OutputArea-output")
        browser.element_screenshot(page.locator(".jp-Cell:has(.jp-InputArea:has-text('check_linear(Linear)'))").first,
                                   "student-check-fails")
        message = " ".join(failed.all_inner_texts())
        assert "CheckFailed" in message and "bias" in message, message
        assert "Traceback" not in message or "autograder/checks" not in message  # no trace through the checks
        browser.element_screenshot(
            page.locator(".jp-Cell:has(.jp-InputArea:has-text('check_clipped_relu(ClippedReLU)'))").first,
            "student-check-passes")
        assert "✔" in " ".join(passed.all_inner_texts())
    finally:
        browser.screenshot(page, "student-notebook-last")
        page.close()


def test_a_student_sees_the_graphs_of_notebook_07(student_lab):
    base, _, chromium = student_lab
    page = browser.person(chromium)
    try:
        browser.open_notebook(page, base, f"{GRAPHS}/{GRAPHS}.ipynb")
        browser.run_all(page)
        svg = page.locator(".jp-RenderedSVG").first
        browser.wait_until(page, lambda: svg.count() > 0, "graph drawn as SVG")
        browser.element_screenshot(page.locator(".jp-Cell:has(.jp-RenderedSVG)").first, "student-graph-07")
        assert "SquareBackward" in svg.inner_html()
        text = page.locator(".jp-Notebook:visible").inner_text()
        assert "so the graph is shown as text" not in text and "so here is the graph as text" not in text
    finally:
        browser.screenshot(page, "student-graph-07-last")
        page.close()


@pytest.fixture(scope="module")
def graded_course(tmp_path_factory):
    """A course whose submissions came in as hand_in() zips in Canvas's download (alice: right
    answers, bob: edited a locked cell, which flags him; mallory: forged ClippedReLU's check),
    collected; alice's and bob's graded with feedback, mallory's left for formgrader's button."""
    root = tmp_path_factory.mktemp("instructor") / "course"
    root.mkdir()
    course = Course(root, [SLUG])
    model = solutions(SLUG)
    forged = {**model, "clipped_relu": model["clipped_relu"].replace(*WRONG_BACKWARD) + FORGERY}
    uploads = []
    for student, edit in (("alice", None), ("bob", "check_clipped_relu"), ("mallory", None)):
        notebook = root.parent / student / f"{SLUG}.ipynb"
        notebook.parent.mkdir()
        shutil.copy(root / "course" / SLUG / f"{SLUG}.ipynb", notebook)
        _answer(notebook, forged if student == "mallory" else model)
        if edit:
            nb = nbformat.read(notebook, as_version=4)
            cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == edit)
            cell.source = "pass  # the check, deleted"
            nbformat.write(nb, notebook)
        uploads.append((student, handin.hand_in(student, notebook=notebook), False))
    canvas_download(course, SLUG, uploads)  # as Canvas's "Download Submissions" gives them
    nbgrader = Path(sys.executable).with_name("nbgrader")
    done = subprocess.run([str(nbgrader), "zip_collect", SLUG], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    graded = grade(course, SLUG, "--student", "alice", "--student", "bob", "--feedback")
    assert graded.returncode == 0, graded.stdout + graded.stderr
    return course


def test_feedback_shows_no_hidden_test(graded_course):
    hidden = set()
    for cell in nbformat.read(authoring.solution_path(SLUG), as_version=4).cells:
        inside = False
        for line in cell.source.splitlines():
            if "### BEGIN HIDDEN TESTS" in line:
                inside = True
            elif "### END HIDDEN TESTS" in line:
                inside = False
            elif inside and len(line.strip()) >= 20:
                hidden.add(line.strip())
    assert hidden
    pages = list((graded_course.root / "feedback").glob(f"*/{SLUG}/*.html"))
    assert len(pages) == 2
    for page in pages:
        text = page.read_text()
        import html

        text = html.unescape(text)
        assert not [line for line in hidden if line in text], page


@pytest.fixture(scope="module")
def instructor_lab(graded_course, tmp_path_factory, chromium):
    """`make instructor` on the graded course; one server for every instructor test."""
    with browser.lab("instructor", tmp_path_factory.mktemp("instructor-lab"), COURSE=str(graded_course.root)) as base:
        yield base, chromium


def _row(page, student: str):
    """The table row of `student` on formgrader's submissions (its id column) or gradebook
    page (its hidden name, behind "Submission #N")."""
    return page.locator(f"table tbody tr:has(td.student-id:text-is('{student}'), a.name-shown:text-is('{student}'))")


def test_an_instructor_sees_scores_and_the_flag_in_formgrader(instructor_lab):
    base, chromium = instructor_lab
    page = browser.person(chromium)
    try:
        page.goto(f"{base}/lab?token={browser.TOKEN}")
        page.wait_for_selector("li.lm-MenuBar-item", timeout=60_000)
        assert "Nbgrader" in browser.menu_titles(page)
        # formgrader's first page: the assignment, and no banner that the exchange does not exist
        # (nbgrader_config.py gives the course one of its own where the hub's is missing).
        page.goto(f"{base}/formgrader/manage_assignments?token={browser.TOKEN}")
        page.wait_for_selector(f"table tbody tr:has-text('{SLUG}')", timeout=60_000)
        browser.screenshot(page, "instructor-assignments")
        assert not page.locator("#warning-exchange").count(), page.locator("#warning-exchange").inner_text()
        assert "does not exist" not in page.inner_text("body")
        page.goto(f"{base}/formgrader/gradebook/{SLUG}/{SLUG}?token={browser.TOKEN}")
        page.wait_for_function("() => document.querySelectorAll('table tbody tr').length >= 2", timeout=60_000)
        browser.screenshot(page, "instructor-formgrader")
        full = f"{points(SLUG):g} / {points(SLUG):g}"
        rows = [_row(page, student).inner_text() for student in ("alice", "bob")]
        assert all(full in r for r in rows), rows  # overall score of each
        # bob's edit of a locked cell: full points (the grader restores the cell), and flagged.
        flag = "td .glyphicon-flag, td .fa-flag"
        assert not _row(page, "alice").locator(flag).count() and _row(page, "bob").locator(flag).count() == 1
        # Each hand-in's time, kept through zip_collect (timestamp.txt): late work can be seen.
        page.goto(f"{base}/formgrader/manage_submissions/{SLUG}?token={browser.TOKEN}")
        page.wait_for_function("() => document.querySelectorAll('table tbody tr td.timestamp').length >= 3",
                               timeout=60_000)
        browser.screenshot(page, "instructor-submissions")
        shown = page.locator("table tbody tr td.timestamp").all_inner_texts()
        assert len(shown) == 3 and "None" not in shown and all(shown), shown
    finally:
        browser.screenshot(page, "instructor-last")
        page.close()


def test_formgraders_autograde_button_grades_with_the_engine(instructor_lab):
    """⚡ Autograde on mallory's forged submission: `autograder grade` grades it (sandboxed,
    verdicts in the grader), so the forgery gains nothing and is flagged; stock formgrader ran
    nbgrader's Autograde in a kernel beside the hidden tests (15 / 15, a checksum warning for
    every hidden test cell)."""
    base, chromium = instructor_lab
    page = browser.person(chromium)
    try:
        # Log in as opening JupyterLab does: the login cookie a formgrader page sets holds for its folder only.
        page.request.get(f"{base}/lab?token={browser.TOKEN}")
        page.goto(f"{base}/formgrader/manage_submissions/{SLUG}?token={browser.TOKEN}")
        mallory = _row(page, "mallory")
        mallory.locator("td.status:has-text('needs autograding')").wait_for(timeout=60_000)
        mallory.locator("td.autograde a").click()
        modal = page.locator("#success-modal, #error-modal")
        modal.wait_for(state="visible", timeout=600_000)
        page.wait_for_timeout(500)  # the modal's fade-in
        browser.screenshot(page, "instructor-autograde-button")
        log = modal.locator(".modal-body").inner_text()
        assert modal.get_attribute("id") == "success-modal", log
        assert f"autograder grade {SLUG} --student mallory --force" in log and "Grading summary" in log, log
        words = " ".join(re.sub("[│┃]", " ", log).split())  # the summary's table, its cells' lines joined
        assert "mallory flagged" in words and "reaches into the course's grading code" in words, log  # and why
        assert "checksum" not in log and "has changed" not in log, log
        modal.locator("button.btn-primary").click()
        honest = f"{points(SLUG) - points(SLUG, 'clipped_relu'):g} / {points(SLUG):g}"  # ClippedReLU's points lost
        mallory.locator(f"td.score:text-is('{honest}')").wait_for(timeout=60_000)
        page.locator(".modal-backdrop").wait_for(state="detached", timeout=10_000)  # the modal faded out
        browser.screenshot(page, "instructor-autograde-score")
        page.goto(f"{base}/formgrader/gradebook/{SLUG}/{SLUG}?token={browser.TOKEN}")
        _row(page, "mallory").locator("td .glyphicon-flag, td .fa-flag").wait_for(timeout=60_000)
        assert honest in _row(page, "mallory").inner_text()
        browser.screenshot(page, "instructor-autograde-flagged")
    finally:
        browser.screenshot(page, "instructor-autograde-last")
        page.close()
