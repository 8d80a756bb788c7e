"""A class on a JupyterHub, end to end with real components (tests/hub.py): the instructor
releases into nbgrader's exchange while the hub and both students' servers start; alice (in
JupyterLab) and bob (in Notebook 7), each at a browser of their own, log in, fetch, open the
notebook from the Assignment List, write an answer, Run All, hand in with the notebook's
hand-in cell without saving first (hand_in saves) and submit through the Assignment List,
working at the same time; the instructor collects, grades with `autograder grade --feedback`
and releases the feedback; alice fetches it and reads it.

The assignment is one exercise made for the test from notebook 03's first (its text, answer
cell, hint, check and hidden check), so Run All and grading take seconds, not minutes.
Screenshots: .test-screenshots/hub-*.png.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbgrader.api import Gradebook

import browser
import hub
from autograder import authoring
from engine_course import solutions
from grading import points

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser"), pytest.mark.integration]
SOURCE = "03_function_basics"  # the notebook whose first exercise the class does
SLUG = "00_clipped_relu"
NOTEBOOK = f"{SLUG}/{SLUG}.ipynb"
FORGOTTEN_CLIP = ("inside = (x > 0) & (x < ctx.clip)", "inside = x > 0")  # a known wrong answer
AUTOGRADER = str(Path(sys.executable).with_name("autograder"))


def _assignment(root: Path) -> None:
    """solutions/SLUG in `root`, in the course's stored form: notebook 03's exercise 3.1 (from
    its heading to the next section's) as a notebook of its own."""
    nb = nbformat.read(authoring.solution_path(SOURCE), as_version=4)
    headings = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown" and cell.source.startswith("## ")]
    start = next(i for i in headings if nb.cells[i].source.startswith("## Exercise 3.1"))
    end = next(i for i in headings if i > start)
    nb.cells = [nbformat.v4.new_markdown_cell("# A class on a hub: one exercise"),
                nbformat.v4.new_code_cell(""), nbformat.v4.new_code_cell("import torch"), *nb.cells[start:end]]
    nb = authoring.normalize(nb)  # the setup cell first, the hand-in cell last
    nb.cells[-1] = authoring.hand_in_cell(SLUG)  # named (a course notebook's summary cell names it)
    path = authoring.solution_path(SLUG, root)
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)


def _release(root: Path, exchange: Path) -> None:
    """The instructor's course root (this repository's configuration and the assignment),
    generated (course/ and the gradebook) and released into the exchange."""
    root.mkdir()
    shutil.copy(authoring.ROOT / "nbgrader_config.py", root)
    _assignment(root)
    authoring.release(root)
    _done(_formgrader(root, exchange).release_assignment(SLUG))


def _formgrader(root: Path, exchange: Path):
    """What the instructor's formgrader on the hub runs for its buttons (Release, Collect,
    Release feedback): nbgrader's API, with the course's configuration and the hub's exchange."""
    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    config.Exchange.root = str(exchange)  # what NBGRADER_EXCHANGE says on the hub
    return NbGraderAPI(config=config)


def _done(result: dict) -> str:
    """The log of an nbgrader API call that succeeded."""
    assert result["success"], result.get("error") or result.get("log")
    return result["log"]


@dataclass
class Student:
    name: str
    page: Any  # their browser's page on the hub: JupyterLab, or Notebook 7's file browser
    lab: bool  # JupyterLab (the notebook opens in a tab) or Notebook 7 (in a new browser tab)
    home: Path
    answer: str  # what they write in the answer cell
    check: str  # what the check says of it
    notebook: Any = None  # the page their notebook is open in


def _assignment_list(page) -> str:
    """Nbgrader → Assignment List (JupyterLab and Notebook 7 alike); what the menu offered."""
    page.click("li.lm-MenuBar-item:has-text('Nbgrader')")
    menu = page.locator(".lm-Menu").first.inner_text()
    page.click("li.lm-Menu-item:has-text('Assignment List')")
    page.wait_for_selector("#assignments_list_info", timeout=60_000)
    return menu


def _fetch(student: Student) -> None:
    page = student.page
    menu = _assignment_list(page)
    assert "Formgrader" not in menu and "Create Assignment" not in menu, menu  # no instructor's panels
    fetch = page.locator("#released_assignments_list button:has-text('Fetch')")
    fetch.wait_for(timeout=60_000)
    browser.screenshot(page, f"hub-{student.name}-released")
    fetch.click()
    page.wait_for_selector("#fetched_assignments_list button:has-text('Submit')", timeout=60_000)


def _open_notebook(student: Student) -> None:
    """The assignment's notebooks, listed under it in the Assignment List, then the notebook."""
    page = student.page
    page.click("#fetched_assignments_list a.assignment-notebooks-link")
    link = page.locator(f"#fetched_assignments_list .nested_list_item a:has-text('{SLUG}')")
    if student.lab:
        link.click()
        student.notebook = page
    else:
        with page.context.expect_page() as opened:
            link.click()
        student.notebook = opened.value


def _write_and_run(student: Student) -> None:
    """Once the notebook's kernel is up, write the answer to exercise 3.1 and Run All, as a
    person types and clicks."""
    browser.wait_for_kernel(student.notebook)
    browser.type_into(student.notebook, "class ClippedReLU(torch.autograd.Function)", student.answer)
    browser.run_all(student.notebook)


def _hand_in(student: Student) -> None:
    """Once the check has spoken, hand in with the notebook's last cell: never saving by hand
    (autosave is off), so what hand_in hands in was saved by hand_in."""
    page, name = student.notebook, student.name
    browser.wait_for_output(page, "check_clipped_relu(ClippedReLU)", student.check)
    browser.element_screenshot(browser.cell(page, "check_clipped_relu(ClippedReLU)"), f"hub-{name}-check")
    on_disk = _code(student.home / NOTEBOOK)
    typed = next(line for line in student.answer.splitlines() if line.strip() and line not in on_disk)
    hand_in = f'hand_in("{name}")'
    browser.type_into(page, 'hand_in("")', authoring.HAND_IN_CELL.format(slug=SLUG).replace('hand_in("")', hand_in))
    browser.run_cell(page, hand_in, "submit it in the Assignment List")  # on a hub, where the class submits
    browser.element_screenshot(browser.cell(page, hand_in), f"hub-{name}-handed-in")
    with zipfile.ZipFile(student.home / SLUG / f"{name}__{SLUG}.zip") as handed:
        inside = nbformat.reads(handed.read(f"{name}/{SLUG}/{SLUG}.ipynb").decode(), as_version=4)
    assert typed in _code(student.home / NOTEBOOK) and inside == nbformat.read(student.home / NOTEBOOK, as_version=4)


def _submit(student: Student) -> None:
    page = student.page
    _assignment_list(page)
    page.click("#fetched_assignments_list button:has-text('Submit')")
    page.wait_for_selector("#submitted_assignments_list .list_item", timeout=60_000)
    browser.screenshot(page, f"hub-{student.name}-submitted")


def _code(path: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


def _settings(folder: Path) -> Path:
    """Each student's JupyterLab settings: every cell rendered (a screenshot of any cell shows
    it), no autosave."""
    for plugin, values in (("notebook-extension/tracker", {"windowingMode": "none"}),
                           ("docmanager-extension/plugin", {"autosave": False})):
        path = folder / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    return folder


@pytest.fixture(scope="module")
def chromium():
    with browser.chromium() as it:
        yield it


def test_a_class_on_a_jupyterhub(tmp_path, chromium):
    started = time.monotonic()

    def stage(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f} s  {what}")

    model = solutions(SOURCE)["clipped_relu"]
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    exchange.chmod(0o1777)  # as the hub's admin creates it: everyone writes, no one deletes another's
    root, homes = tmp_path / "course", tmp_path / "home"
    with ThreadPoolExecutor(1) as instructor:
        released = instructor.submit(_release, root, exchange)  # while the hub and the students' servers start
        with hub.hub(tmp_path, ["alice", "bob"], exchange, _settings(tmp_path / "settings")) as url:
            hub.start_servers(url, ["alice", "bob"])  # as when the class logs in at once
            stage("the hub and both servers up")
            students = (Student("alice", browser.person(chromium), True, homes / "alice", model, "✔"),
                        Student("bob", browser.person(chromium), False, homes / "bob",
                                model.replace(*FORGOTTEN_CLIP), "CheckFailed"))  # bob forgets the upper clip
            try:
                _a_class(url, students, released, root, exchange, stage)
            finally:
                for student in students:
                    browser.screenshot(student.notebook or student.page, f"hub-{student.name}-last")
                    student.page.context.close()


def _a_class(url: str, students: tuple[Student, Student], released: Future, root: Path, exchange: Path,
             stage: Callable[[str], None]) -> None:
    alice, bob = students
    hub.log_in(alice.page, url, "alice")
    hub.log_in(bob.page, url, "bob", "/user/bob/tree")
    stage("both logged in")
    released.result()
    assert (exchange / "autograd-course" / "outbound" / SLUG / f"{SLUG}.ipynb").is_file()
    stage("assignment released")
    for step in (_fetch, _open_notebook, _write_and_run, _hand_in, _submit):  # the two at once, step by step
        for student in students:
            step(student)
        stage(step.__name__.strip("_"))

    # The instructor: Collect in formgrader, `autograder grade` in a terminal on the hub, then
    # Release feedback in formgrader.
    formgrader = _formgrader(root, exchange)
    _done(formgrader.collect(SLUG))
    assert sorted(p.name for p in (root / "submitted").iterdir()) == ["alice", "bob"]
    grade = [AUTOGRADER, "grade", SLUG, "--feedback", "--jobs", "1"]  # one worker for two notebooks of a second each
    graded = subprocess.run(grade, cwd=root, capture_output=True, text=True, timeout=300)
    said = graded.stdout + graded.stderr
    assert graded.returncode == 0 and "Feedback: 2 of 2 submissions" in said, said
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        submissions = {s.name: gb.find_submission(SLUG, s.name) for s in students}
        scores = {name: submission.score for name, submission in submissions.items()}
        assert all(submission.timestamp for submission in submissions.values())  # the exchange's
    clipped = points(SOURCE, "clipped_relu")
    assert scores == {"alice": clipped, "bob": 0.0}, scores
    _done(formgrader.release_feedback(SLUG))
    stage("collected, graded, feedback released")

    # alice, back at her Assignment List, fetches her feedback and reads it.
    page = alice.page
    _assignment_list(page)
    page.click("#submitted_assignments_list button:has-text('Fetch Feedback')")
    link = page.locator("#submitted_assignments_list a:has-text('view feedback')").first
    link.wait_for(timeout=60_000)
    browser.screenshot(page, "hub-alice-feedback-fetched")
    link.click()  # the file browser goes to the feedback's folder; its page, opened in the browser:
    (html,) = (alice.home / SLUG / "feedback").glob(f"*/{SLUG}.html")
    page.goto(f"{url}/user/alice/files/{html.relative_to(alice.home)}")
    text = page.inner_text("body")
    assert f"{SLUG} (Score: {clipped:g}" in text and "Exercise 3.1" in text, text[:300]
    browser.screenshot(page, "hub-alice-feedback")
    stage("alice read her feedback")
