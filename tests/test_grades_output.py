"""What an instructor takes away from grading: an LMS-ready CSV with roster names, and
grades.png with the total distribution, mean, median, even bins and statuses marked."""
from __future__ import annotations

import csv
import os
import random
import re
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nbgrader.api import Gradebook
from nbgrader.coursedir import CourseDirectory

from autograder.grader import class_report
from autograder.grader import course as grading_course
from autograder.grader.preflight import load_config
from autograder.grader.records import Options
from grading import Course, points

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
    found = class_report.scores(graded.db_url, "autograd-course", SLUG, graded.root / "solutions" / SLUG,
                          class_report.read_failed(graded.root / "reports" / SLUG / "last-run.csv"))
    assert found.statuses["s05"] == "flagged" and found.statuses["s07"] == "failed"
    assert sum(s == "graded" for s in found.statuses.values()) == 10
    assert found.top == points(SLUG) and len(found.totals) == 12
    top = class_report.draw(found, SLUG).axes[0]
    legend = [text.get_text() for text in top.get_legend().get_texts()]
    totals = list(found.totals.values())
    assert f"mean {statistics.fmean(totals):.1f}" in legend and f"median {statistics.median(totals):g}" in legend
    assert {"flagged for review (1)", "failed (not fully run) (1)"} <= set(legend), legend
    stacked = [round(sum(bar.get_height() for bar in bars)) for bars in top.containers]
    assert stacked == [10, 1, 1]  # graded, flagged, failed: every submission drawn once
    figure = top.get_figure()
    figure.canvas.draw()  # where the legend and the bars are, as a reader sees them
    legend = top.get_legend().get_window_extent()
    bars = [bar.get_window_extent() for bars in top.containers for bar in bars if bar.get_height() > 0]
    assert not [b for b in bars if b.overlaps(legend)], "the legend hides a bar"
    inside = figure.bbox
    assert inside.x0 <= legend.x0 and legend.x1 <= inside.x1, "the legend is cut off"
    png = graded.root / "reports" / SLUG / "grades.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    SCREENSHOTS.mkdir(exist_ok=True)
    (SCREENSHOTS / "grades.png").write_bytes(png.read_bytes())


def test_bins_are_even_and_cover_every_score():
    for top in (1, 3, 10, 17.5, 42, 100, 260):
        edges, width = class_report.even_bins(top)
        assert edges[0] == 0 and edges[-1] >= top and len(edges) - 1 <= 20
        assert all(abs((b - a) - width) < 1e-12 for a, b in zip(edges, edges[1:]))


def _in_a_terminal(course: Course, *args: str, columns: int = 80) -> tuple[int, str, float, list[str]]:
    """`autograder grade ARGS` in a real terminal `columns` wide (a pseudo-terminal of that
    size, as a person's): (exit code, what the terminal got, seconds until the first
    status line, the command lines of the processes it started)."""
    import fcntl
    import pty
    import struct
    import termios

    import psutil

    ours, theirs = pty.openpty()
    fcntl.ioctl(theirs, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"TERM": "xterm-256color"}
    started = time.monotonic()
    grader = subprocess.Popen([str(Path(sys.executable).with_name("autograder")), "grade", *args], cwd=course.root,
                              stdin=theirs, stdout=theirs, stderr=theirs, env=env, start_new_session=True)
    os.close(theirs)
    out, first, commands = b"", None, set()
    while True:
        ready, _, _ = select.select([ours], [], [], 0.05)
        try:
            commands.update(" ".join(p.cmdline()) for p in psutil.Process(grader.pid).children(recursive=True))
        except psutil.Error:
            pass
        if ready:
            try:
                chunk = os.read(ours, 65536)
            except OSError:  # the terminal closed: the grader is done
                break
            if not chunk:
                break
            out += chunk
            if first is None and b"Grading" in out:
                first = time.monotonic() - started
    os.close(ours)
    return grader.wait(timeout=60), out.decode("utf-8", "replace"), first, sorted(commands)


def _screen_lines(output: str) -> list[str]:
    """Each line the terminal showed (rewritten lines included), colours and cursor moves removed."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)  # colours
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "\n", plain)  # cursor moves, titles
    return [line for part in plain.split("\n") for line in part.split("\r") if line.strip()]


@pytest.fixture(scope="module")
def terminal_run(tmp_path_factory) -> tuple[Course, tuple]:
    """alice (model answers, one quiz answer wrong: partial credit) and bob (the released
    notebook, untouched), graded with feedback in a terminal 80 columns wide."""
    from engine_course import solutions, submit_notebook, with_answers

    root = tmp_path_factory.mktemp("terminal") / "course"
    root.mkdir()
    course = Course(root, [SLUG])
    answers = solutions(SLUG)
    answers["when_to_write"] = answers["when_to_write"].replace('"a": "composite"', '"a": "function"')
    submit_notebook(course, "alice", SLUG, with_answers(course, SLUG, answers))
    course.submit("bob", SLUG, None)
    return course, _in_a_terminal(course, SLUG, "--feedback")


def test_the_status_line_shows_from_the_first_second_and_fits_80_columns(terminal_run):
    course, (code, output, first, _) = terminal_run
    assert code == 0, output[-3000:]
    assert first is not None and first < 10, first  # python, the options and the lock, then the line
    lines = _screen_lines(output)
    status = [line for line in lines if re.match(r"\s*Grading [━╸╺ ]", line)]
    assert status and all(len(line.rstrip()) <= 80 for line in status), [
        line for line in status if len(line.rstrip()) > 80]
    assert any("probing the sandbox" in line or "starting 2 workers" in line for line in status), status
    last = status[-1]  # the run's end: every submission counted, and the time since the run started
    assert re.search(r" 2/2 (\d\d:\d\d:\d\d) left ", last), last
    shown = re.search(r" 2/2 (\d\d):(\d\d):(\d\d) ", last).groups()
    total = float(re.search(r"2 graded in ([\d.]+) s", output).group(1))
    assert abs(int(shown[0]) * 3600 + int(shown[1]) * 60 + int(shown[2]) - total) <= 2, (last, total)


def test_feedback_with_nothing_left_to_grade_starts_no_worker(terminal_run):
    course, _ = terminal_run
    code, output, _, commands = _in_a_terminal(course, SLUG, "--feedback")
    assert code == 0, output[-3000:]
    assert not [c for c in commands if "autograder.runner" in c], commands  # no warm worker started
    plain = " ".join(_screen_lines(output))
    assert "0 graded in" in plain and "Feedback: 2 of 2 submissions have theirs" in plain, plain[-2000:]


def test_feedback_names_every_test_cell_wraps_long_lines_and_shows_nothing_of_grading_time(terminal_run, tmp_path):
    course, (code, output, _, _) = terminal_run
    assert code == 0, output[-3000:]
    import browser

    page_path = course.root / "feedback" / "alice" / SLUG / f"{SLUG}.html"
    html = page_path.read_text()
    toc = html[html.index('<div id="toc">'):html.index("</ol>")]
    assert "Test cell" not in toc
    assert "Exercise 3.1" in toc and ": hidden checks" in toc and ": check" in toc, toc
    assert "Out[" not in html and "being graded" not in html and "Nothing handed in yet" not in html
    with browser.chromium() as context:
        page = context.new_page()
        page.set_viewport_size({"width": 900, "height": 900})
        page.goto(page_path.as_uri())
        cut = page.evaluate("() => [...document.querySelectorAll('pre')].filter(p => p.scrollWidth > p.clientWidth + 1)"
                            ".map(p => p.textContent.slice(0, 80))")
        assert not cut, cut  # every line wraps: nothing is cut at the right edge
        browser.element_screenshot(page.locator("#toc"), "feedback-toc")
        quiz = page.locator(".cell:has-text('check_when_to_write_hidden')").first
        browser.element_screenshot(quiz, "feedback-quiz")
        page.close()
