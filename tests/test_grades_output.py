"""What an instructor takes away from grading: grades.csv (nbgrader's export, then late
work), an LMS-ready CSV with roster names, the run's summary with late work, and grades.png
with the total distribution, mean, median, bins that show a full score as full, and statuses
marked."""
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
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from nbgrader.api import Gradebook
from nbgrader.coursedir import CourseDirectory
from nbgrader.plugins.export import CsvExportPlugin
from rich.console import Console

from autograder.grader import class_report, discover
from autograder.grader import course as grading_course
from autograder.grader.preflight import load_config
from autograder.grader.records import Options
from grading import Course, points

SLUG = "03_function_basics"
DUE = datetime(2026, 3, 1, 12, 0)
SCREENSHOTS = Path(__file__).resolve().parent.parent / ".test-screenshots"  # kept for a person to look at


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Course:
    """A released course with 12 scored submissions: two students on the roster with names
    and e-mail, one flagged, one that failed (as last-run.csv says); due at DUE, s04 handed
    in 30 minutes late (its time the LMS's, as zip_collect recorded it; nbgrader's penalty 2
    points), s06 on time. Beside it, 02 with one submission (no due date) and 01 with none."""
    root = tmp_path_factory.mktemp("grades") / "course"
    root.mkdir()
    course = Course(root, [SLUG])
    rng = random.Random(3)
    with Gradebook(course.db_url) as gb:
        gb.update_or_create_student("s01", first_name="Ada", last_name="Lovelace", email="ada@example.org")
        gb.update_or_create_student("s02", first_name="Alan", last_name="Turing")
        gb.update_or_create_assignment(SLUG, duedate=DUE)
        times = {"s04": DUE + timedelta(minutes=30), "s06": DUE - timedelta(hours=1)}
        for k in range(1, 13):
            student = f"s{k:02d}"
            gb.update_or_create_student(student)
            submission = gb.add_submission(SLUG, student, **({"timestamp": times[student]} if student in times else {}))
            notebook = submission.notebooks[0]
            for grade in notebook.grades:
                grade.auto_score = rng.choice([0, grade.max_score, grade.max_score])
            notebook.flagged = student == "s05"
            notebook.late_submission_penalty = 2.0 if student == "s04" else None
        gb.update_or_create_assignment("01_tape_autograd")
        gb.update_or_create_assignment("02_higher_order_and_fusion")
        gb.add_submission("02_higher_order_and_fusion", "s01")
        gb.db.commit()
        gb.update_or_create_student("s13", first_name="Grace", last_name="Hopper")  # submitted nothing
    (root / "reports" / SLUG).mkdir(parents=True)
    (root / "reports" / SLUG / "last-run.csv").write_text("student,status\ns07,failed\ns01,graded\n")
    with open(discover.record_path(root, SLUG), "w", newline="") as f:
        writer = csv.DictWriter(f, discover.RECORD_FIELDS)
        writer.writeheader()
        writer.writerow({"download": "s04_attempt_2026-03-01-12-30-00_s04__03_function_basics.zip", "lms": "Timed",
                         "student": "s04", "uploaded": "2026-03-01 12:30:00.000000 UTC", "written": "",
                         "time_from": "lms", "lms_late": "", "outcome": "collected"})
    return course


def _export(course: Course) -> None:
    coursedir = CourseDirectory(config=load_config(Options(root=course.root, db_url=course.db_url)))
    grading_course._export(coursedir, {SLUG})


def test_the_lms_csv_has_canvas_columns_roster_names_and_totals(graded):
    """Canvas's columns; a column per graded assignment only, in course order (02 before 03,
    though only 03 has a due date; 01, with no submission, has none); points after the late
    penalty; how late, in a column of its own."""
    _export(graded)
    with open(graded.root / "grades-lms.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "02_higher_order_and_fusion", SLUG,
                       f"{SLUG} late"]
    by_id = {row[2]: dict(zip(rows[0], row)) for row in rows[1:]}
    assert len(by_id) == 13
    assert list(by_id["s01"].values())[:4] == ["Lovelace, Ada", "", "s01", "ada@example.org"]
    assert list(by_id["s02"].values())[:4] == ["Turing, Alan", "", "s02", "s02"]  # no e-mail: the id logs in
    assert by_id["s03"]["Student"] == "s03"  # not on a roster: the id
    assert by_id["s13"][SLUG] == "" and by_id["s13"][f"{SLUG} late"] == ""  # nothing submitted: empty, not a zero
    assert by_id["s01"]["02_higher_order_and_fusion"] == "0" and by_id["s02"]["02_higher_order_and_fusion"] == ""
    with Gradebook(graded.db_url) as gb:
        assert float(by_id["s06"][SLUG]) == gb.find_submission(SLUG, "s06").score
        assert float(by_id["s04"][SLUG]) == max(0.0, gb.find_submission(SLUG, "s04").score - 2)
    assert by_id["s04"][f"{SLUG} late"] == "0:30:00 late, penalty 2" and by_id["s06"][f"{SLUG} late"] == ""


def test_grades_csv_is_nbgraders_export_then_late_work(graded, tmp_path):
    """Every row and column of `nbgrader export`, the same values, then how many seconds
    late, where the time came from, and the LMS's word."""
    _export(graded)
    with Gradebook(graded.db_url) as gb:
        CsvExportPlugin(to=str(tmp_path / "nbgrader.csv")).export(gb)
    with open(tmp_path / "nbgrader.csv", newline="") as f:
        stock = list(csv.reader(f))
    with open(graded.root / "grades.csv", newline="") as f:
        ours = list(csv.reader(f))
    assert [row[:len(stock[0])] for row in ours] == stock and len(stock) == 1 + 3 * 13
    assert ours[0][len(stock[0]):] == ["seconds_late", "time_from", "lms_late"]
    late = {(row[0], row[3]): row[len(stock[0]):] for row in ours[1:]}
    assert late[(SLUG, "s04")] == ["1800", "lms", ""] and late[(SLUG, "s06")] == ["0", "student", ""]
    assert late[(SLUG, "s03")] == ["0", "", ""] and late[(SLUG, "s13")] == ["", "", ""]  # no time; nothing handed in


def test_the_runs_summary_counts_late_work_and_lists_it():
    """The summary's "late" column; the late hand-ins with how late, the penalty and where
    the time came from; a hand-in the LMS marks late though its own time is not, too."""
    def outcome(student: str, **late) -> class_report.Outcome:
        return class_report.Outcome(discover.Submission(student, SLUG, "", Path(), **late), "graded")

    outcomes = [outcome("ann", seconds_late=5400.0, late_penalty=2.0, time_from="lms"),
                outcome("ben", time_from="student", lms_late="yes"), outcome("cat", time_from="student")]
    console = Console(record=True, width=80)  # a terminal's, or a log's
    console.print(class_report.summary(outcomes, [], 12.0, "bubblewrap"))
    console.print(class_report.late_work(outcomes))
    text = console.export_text()
    row = next(line for line in text.splitlines() if line.startswith(f"│ {SLUG}"))
    assert [cell.strip() for cell in row.split("│")[1:-1]][:6] == [SLUG, "3", "0", "0", "1", "0"], text
    assert re.search(rf"{SLUG}/ann\s+│\s+1:30:00\s+│\s+2\s+│ LMS upload\s+│\s+│", text), text
    assert re.search(rf"{SLUG}/ben\s+│\s+on time\s+│\s+0\s+│ student's clock\s+│ late\s+│", text), text
    assert f"{SLUG}/cat" not in text
    assert class_report.late_work(outcomes[2:]) is None


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


def test_bins_cover_every_score_and_give_the_full_score_a_bar_of_its_own():
    import numpy as np

    for top in (1, 3, 10, 15, 17.5, 28, 42, 100, 260):
        width = class_report.bin_width(top)
        assert top / width <= 30
        for exact in (True, False):
            edges = class_report.bin_edges(top, width, exact)
            assert edges[0] <= 0 and edges[-1] > top and len(edges) - 1 <= 32
            assert all(abs((b - a) - width) < 1e-9 for a, b in zip(edges, edges[1:-2]))  # one width, but the last two
            below_top = top - (width if exact else min(width, 0.5) / 2)
            counts = np.histogram([0, below_top, top], edges)[0]
            assert counts[-1] == 1 and counts.sum() == 3, (top, exact, edges)  # the full score alone, in the last bar


def test_a_full_score_is_drawn_as_full(tmp_path):
    """15 of 15 is its own bar, named "15 full", never the 14-15 bar (the bars of a score each
    where totals are whole points; from 0 in steps where they are not, the full score last)."""
    for totals in ({"a": 15.0, "b": 15.0, "c": 14.0, "d": 7.0}, {"a": 15.0, "b": 15.0, "c": 14.75, "d": 7.0}):
        found = class_report.Scores(totals, 15.0, {"exercise": ([t / 3 for t in totals.values()], 5.0)},
                                    dict.fromkeys(totals, "graded"))
        figure = class_report.draw(found, SLUG)
        top = figure.axes[0]
        bars = [bar for bars in top.containers for bar in bars if bar.get_height() > 0]
        full = max(bars, key=lambda bar: bar.get_x())
        assert full.get_height() == 2 and full.get_x() >= 14.5, [(b.get_x(), b.get_height()) for b in bars]
        assert [t.get_text() for t in top.get_xticklabels()][-1] == "15\nfull"
        SCREENSHOTS.mkdir(exist_ok=True)
        figure.savefig(SCREENSHOTS / f"grades-full-score-{'whole' if totals['c'] == 14 else 'partial'}.png", dpi=100)


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
