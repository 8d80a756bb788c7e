"""A class on a JupyterHub, end to end with real components (tests/hub.py): the instructor
releases into nbgrader's exchange; two students log in, fetch, work and submit through the
Assignment List in a real browser (alice in JupyterLab, bob in Notebook 7), handing in with
the notebook's hand-in cell without saving first (hand_in saves); the instructor collects,
grades with `autograder grade --feedback` and releases the feedback; alice fetches it and
reads it. Screenshots: .test-screenshots/hub-*.png.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import browser
import hub
import nbformat
import pytest
from engine_course import solutions
from grading import points
from nbgrader.api import Gradebook

from autograder import authoring

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]
SLUG = "03_function_basics"
NOTEBOOK = f"{SLUG}/{SLUG}.ipynb"
FORGOTTEN_CLIP = ("inside = (x > 0) & (x < ctx.clip)", "inside = x > 0")  # a known wrong answer
NBGRADER = str(Path(sys.executable).with_name("nbgrader"))
AUTOGRADER = str(Path(sys.executable).with_name("autograder"))


def _course(root: Path) -> None:
    """The instructor's course root (this repository's configuration and one notebook in its
    stored form), released: course/ and the gradebook."""
    root.mkdir()
    shutil.copy(authoring.ROOT / "nbgrader_config.py", root)
    path = authoring.solution_path(SLUG, root)
    path.parent.mkdir(parents=True)
    nb = authoring.normalize(nbformat.read(authoring.solution_path(SLUG), as_version=4))
    nbformat.write(nb, path)
    authoring.release(root)


def _instructor(root: Path, exchange: Path, *args: str) -> str:
    """A command in the course root, as the instructor runs it in a terminal on the hub."""
    done = subprocess.run(args, cwd=root, env={**os.environ, "NBGRADER_EXCHANGE": str(exchange)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def _work(page, home: Path, answer: str, check: str, student: str) -> None:
    """Write an answer to exercise 3.1, Run All (it stops at the first check that fails), then
    hand in with the notebook's last cell: never saving by hand (autosave is off), so what
    hand_in hands in was saved by hand_in."""
    browser.type_into(page, "class ClippedReLU(torch.autograd.Function)", answer)
    browser.run_all(page)
    browser.wait_for_output(page, "check_clipped_relu(ClippedReLU)", check)
    browser.element_screenshot(browser.cell(page, "check_clipped_relu(ClippedReLU)"), f"hub-{student}-check")
    on_disk = _code(home / NOTEBOOK)
    typed = next(line for line in answer.splitlines() if line.strip() and line not in on_disk)
    hand_in = f'hand_in("{student}")'
    browser.type_into(page, 'hand_in("")', authoring.HAND_IN_CELL.format(slug=SLUG).replace('hand_in("")', hand_in))
    browser.run_cell(page, hand_in, "Handed in")
    browser.element_screenshot(browser.cell(page, hand_in), f"hub-{student}-handed-in")
    with zipfile.ZipFile(home / SLUG / f"{student}__{SLUG}.zip") as handed:
        inside = nbformat.reads(handed.read(f"{student}/{SLUG}/{SLUG}.ipynb").decode(), as_version=4)
    assert typed in _code(home / NOTEBOOK) and inside == nbformat.read(home / NOTEBOOK, as_version=4)  # saved by hand_in


def _code(path: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


def _assignment_list(page) -> str:
    """Nbgrader → Assignment List (JupyterLab and Notebook 7 alike); what the menu offered."""
    page.click("li.lm-MenuBar-item:has-text('Nbgrader')")
    menu = page.locator(".lm-Menu").first.inner_text()
    page.click("li.lm-Menu-item:has-text('Assignment List')")
    page.wait_for_selector("#assignments_list_info", timeout=60_000)
    return menu


def _stage(what: str, started: list[float]) -> None:
    print(f"{time.monotonic() - started[0]:6.1f} s  {what}")


@pytest.fixture(scope="module")
def chromium():
    with browser.chromium() as context:
        yield context


def test_a_class_on_a_jupyterhub(tmp_path, chromium):
    started = [time.monotonic()]
    model = solutions(SLUG)
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    exchange.chmod(0o1777)  # as the hub's admin creates it: everyone writes, no one deletes another's
    root = tmp_path / "course"
    releasing = threading.Thread(target=lambda: (_course(root), _instructor(root, exchange, NBGRADER,
                                                                          "release_assignment", SLUG)))
    releasing.start()  # while the hub starts
    settings = tmp_path / "settings"  # each student's JupyterLab settings: every cell rendered, no autosave
    for plugin, values in (("notebook-extension/tracker", {"windowingMode": "none"}),
                           ("docmanager-extension/plugin", {"autosave": False})):
        path = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    homes = tmp_path / "home"
    with hub.hub(tmp_path, ["alice", "bob"], exchange, settings) as url:
        for student in ("alice", "bob"):  # as when the class logs in at once: the servers start together
            hub.spawn(url, student)
        releasing.join()
        assert (exchange / "autograd-course" / "outbound" / SLUG / f"{SLUG}.ipynb").is_file()  # released
        _stage("hub up, assignment released", started)
        page = chromium.new_page()
        try:
            # alice, in JupyterLab: Nbgrader → Assignment List → Fetch, her notebook, hand in, Submit.
            hub.log_in(page, url, "alice")
            _stage("alice in JupyterLab", started)
            menu = _assignment_list(page)
            assert "Formgrader" not in menu and "Create Assignment" not in menu, menu  # no instructor's panels
            page.wait_for_selector("#released_assignments_list button:has-text('Fetch')", timeout=60_000)
            browser.screenshot(page, "hub-alice-released")
            page.click("#released_assignments_list button:has-text('Fetch')")
            page.wait_for_selector("#fetched_assignments_list button:has-text('Submit')", timeout=60_000)
            browser.open_notebook(page, f"{url}/user/alice", NOTEBOOK)
            _work(page, homes / "alice", model["clipped_relu"], "✔", "alice")
            _stage("alice handed in", started)
            _assignment_list(page)
            page.click("#fetched_assignments_list button:has-text('Submit')")
            page.wait_for_selector("#submitted_assignments_list .list_item", timeout=60_000)
            browser.screenshot(page, "hub-alice-submitted")
            page.goto(f"{url}/hub/logout")
            _stage("alice submitted", started)

            # bob, in Notebook 7: the same, with a known wrong answer.
            hub.log_in(page, url, "bob", "/user/bob/tree")
            _assignment_list(page)
            page.click("#released_assignments_list button:has-text('Fetch')")
            page.wait_for_selector("#fetched_assignments_list button:has-text('Submit')", timeout=60_000)
            page.goto(f"{url}/user/bob/notebooks/{NOTEBOOK}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            page.wait_for_selector(browser.IDLE, timeout=60_000)
            _work(page, homes / "bob", model["clipped_relu"].replace(*FORGOTTEN_CLIP), "CheckFailed", "bob")
            page.goto(f"{url}/user/bob/tree")
            _assignment_list(page)
            page.click("#fetched_assignments_list button:has-text('Submit')")
            page.wait_for_selector("#submitted_assignments_list .list_item", timeout=60_000)
            browser.screenshot(page, "hub-bob-submitted")
            page.goto(f"{url}/hub/logout")
            _stage("bob submitted", started)

            # The instructor, in a terminal on the hub: collect, grade, release the feedback.
            _instructor(root, exchange, NBGRADER, "collect", SLUG)
            assert sorted(p.name for p in (root / "submitted").iterdir()) == ["alice", "bob"]
            graded = _instructor(root, exchange, AUTOGRADER, "grade", SLUG, "--feedback")
            assert "Feedback: 2 of 2 submissions" in graded, graded
            with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
                scores = {s: gb.find_submission(SLUG, s).score for s in ("alice", "bob")}
                assert all(gb.find_submission(SLUG, s).timestamp for s in scores)  # the exchange's
            clipped = points(SLUG, "clipped_relu")
            assert scores == {"alice": clipped, "bob": 0.0}, scores  # bob forgot the upper clip
            _instructor(root, exchange, NBGRADER, "release_feedback", SLUG)
            _stage("graded, feedback released", started)

            # alice fetches her feedback and reads it.
            hub.log_in(page, url, "alice")
            _assignment_list(page)
            page.click("#submitted_assignments_list button:has-text('Fetch Feedback')")
            link = page.locator("#submitted_assignments_list a:has-text('view feedback')").first
            link.wait_for(timeout=60_000)
            browser.screenshot(page, "hub-alice-feedback-fetched")
            link.click()  # the file browser goes to the feedback's folder; its page, opened in the browser:
            (html,) = (homes / "alice" / SLUG / "feedback").glob(f"*/{SLUG}.html")
            page.goto(f"{url}/user/alice/files/{html.relative_to(homes / 'alice')}")
            text = page.inner_text("body")
            assert f"{SLUG} (Score: {clipped:g}" in text and "Exercise 3.1" in text, text[:300]
            browser.screenshot(page, "hub-alice-feedback")
            _stage("alice read her feedback", started)
        finally:
            browser.screenshot(page, "hub-last")
            page.close()
