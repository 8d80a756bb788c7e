"""Broken and tampered notebooks, crashes, and a grader killed mid-run.

Each problem stays with its own submission, is recorded with a clear reason and flagged
for a person; tampered notebooks are repaired exactly as stock nbgrader repairs them;
killing the grader leaves no partial records, and running it again grades only the rest.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from nbgrader.api import Gradebook

from engine_course import clone, flagged, grade, notebook, rows, solutions, submit_notebook, survivors, with_answers
from grading import Course, points

pytestmark = pytest.mark.slow
SLUG = "03_function_basics"


def _cells(nb, grade_id):
    return [c for c in nb.cells
            if isinstance(c.metadata.get("nbgrader"), dict) and c.metadata.nbgrader.get("grade_id") == grade_id]


def _tampered(course: Course, model: dict) -> dict[str, nbformat.NotebookNode]:
    def fresh():
        return with_answers(course, SLUG, model)

    deleted, retyped, duplicated, renamed = fresh(), fresh(), fresh(), fresh()
    deleted.cells.remove(_cells(deleted, "check_linear")[0])
    cell = _cells(retyped, "check_clipped_relu")[0]
    cell.cell_type = "markdown"
    del cell["outputs"], cell["execution_count"]
    copy = nbformat.from_dict(json.loads(json.dumps(_cells(duplicated, "check_linear")[0])))
    copy.id = "copied"
    duplicated.cells.insert(duplicated.cells.index(_cells(duplicated, "check_linear")[0]), copy)
    _cells(renamed, "check_linear_hidden")[0].metadata.nbgrader["grade_id"] = "my_renamed_check"
    moved, metadata = fresh(), fresh()
    hidden = _cells(moved, "check_linear_hidden")[0]  # above the answer it tests, which moves below its check
    moved.cells.remove(hidden)
    moved.cells.insert(moved.cells.index(_cells(moved, "linear")[0]), hidden)
    answer = _cells(moved, "linear")[0]
    moved.cells.remove(answer)
    moved.cells.insert(moved.cells.index(_cells(moved, "check_linear")[0]) + 1, answer)
    _cells(metadata, "check_clipped_relu_hidden")[0].metadata.nbgrader["points"] = "2"
    _cells(metadata, "check_linear")[0].metadata["nbgrader"] = ["grade", True]  # any JSON: nbformat's schema allows it
    return {"t_deleted": deleted, "t_retyped": retyped, "t_duplicated": duplicated, "t_renamed": renamed,
            "t_moved": moved, "t_metadata": metadata}


def _twin(cell, cell_id: str, cell_type: str = "code", source: str | None = None):
    twin = nbformat.from_dict(json.loads(json.dumps(cell)))
    twin.id = cell_id
    if cell_type != "code":
        twin.cell_type = cell_type
        del twin["outputs"], twin["execution_count"]
    if source is not None:
        twin.source = source
    return twin


NOTES = "My notes: Linear's backward must return None where needs_input_grad is False."


def _copied(course: Course, model: dict) -> dict[str, nbformat.NotebookNode]:
    """Cells claiming one grade_id many times over, as copy-paste leaves them (graded by us,
    not by stock nbgrader, which fails on every one)."""
    copies = with_answers(course, SLUG, model)
    hidden = _cells(copies, "check_clipped_relu_hidden")[0]
    for k, at in enumerate([0, 5, copies.cells.index(_cells(copies, "clipped_relu")[0]), len(copies.cells)]):
        copies.cells.insert(at, _twin(hidden, f"hidden-{k}"))  # before and after the released one
    copies.cells.insert(10, _twin(hidden, "hidden-md", "markdown"))
    copies.cells.append(_twin(_cells(copies, "setup")[0], "setup-again"))
    copies.cells.insert(3, _twin(_cells(copies, "summary")[0], "summary-early"))
    visible = _cells(copies, "check_when_to_write")[0]  # locked, scores nothing
    copies.cells.insert(copies.cells.index(visible), _twin(visible, "visible-again"))
    copies.cells.remove(_cells(copies, "check_when_to_write_hidden")[0])  # put back after a locked cell
    notes = _twin(_cells(copies, "check_polar_to_cartesian")[0], "notes", "markdown", NOTES)  # a test cell's metadata
    copies.cells.insert(copies.cells.index(_cells(copies, "polar_to_cartesian")[0]), notes)

    answers = with_answers(course, SLUG, {**model, "linear": "class Linear:  # first try\n    pass"})
    first = _cells(answers, "linear")[0]
    answers.cells.insert(answers.cells.index(first) + 1, _twin(first, "pasted", source=model["linear"]))
    polar = _cells(answers, "polar_to_cartesian")[0]  # the answer carries its check's metadata
    polar.metadata.nbgrader = json.loads(json.dumps(_cells(answers, "check_polar_to_cartesian")[0].metadata.nbgrader))
    _cells(answers, "check_clipped_relu_hidden")[0].metadata.nbgrader["grade"] = False
    return {"t_copies": copies, "t_answers": answers}


BROKEN = {
    "b_invalid_json": '{"cells": [',
    "b_wrong_nbformat": json.dumps({"nbformat": 99, "nbformat_minor": 0, "metadata": {}, "cells": []}),
    "b_not_a_notebook": "[1, 2, 3]",
}
EXPECTED_FLAGS = {
    "t_deleted": "'check_linear' was deleted",
    "t_retyped": "changed from code to markdown",
    "t_duplicated": "'check_linear' appears 2 times (a copied cell?): cell 39 is taken as the released cell; "
                    "dropped as unedited copies of a locked cell: cell 38",
    "t_copies": "'check_clipped_relu_hidden' appears 6 times",
    "t_answers": "kept as your own cells where they stand",
    "t_renamed": "unknown grade_id 'my_renamed_check'",
    "t_moved": "were out of the released order",
    "t_metadata": "the nbgrader metadata of cell",
    "b_invalid_json": "not a readable notebook",
    "b_wrong_nbformat": "not a readable notebook",
    "b_not_a_notebook": "not a readable notebook",
    "c_segfault": "segmentation fault",
}


# The tampered notebooks compared with stock nbgrader: two it repairs as the engine does, and
# a duplicated cell, on which it fails the whole notebook.
STOCK_COMPARED = ("t_deleted", "t_retyped", "t_duplicated")


@pytest.fixture(scope="module")
def malformed(tmp_path_factory):
    course = Course(tmp_path_factory.mktemp("malformed"), [SLUG])
    model = solutions(SLUG)
    course.submit("honest", SLUG, model)
    tampered = _tampered(course, model)
    for student, nb in tampered.items():
        submit_notebook(course, student, SLUG, nb)
    stock = clone(course, tmp_path_factory.mktemp("malformed-stock"))
    for submitted in (stock.root / "submitted").iterdir():  # stock grades the two it is compared on
        if submitted.name not in STOCK_COMPARED:
            shutil.rmtree(submitted)
    stock.autograde(SLUG)
    for student, nb in _copied(course, model).items():
        submit_notebook(course, student, SLUG, nb)
    assert grade(course, SLUG, "--student", "honest").returncode == 0
    before = rows(course)
    for student, text in BROKEN.items():
        submit_notebook(course, student, SLUG, text)
    crash = model["clipped_relu"] + "\nimport ctypes\nctypes.string_at(0)"
    submit_notebook(course, "c_segfault", SLUG, with_answers(course, SLUG, {**model, "clipped_relu": crash}))
    result = grade(course, SLUG)
    return course, stock, before, result


def _status(course: Course) -> dict[str, dict]:
    with open(course.root / "reports" / SLUG / "last-run.csv") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def test_each_problem_is_recorded_with_its_reason_and_flagged(malformed):
    course, _, _, result = malformed
    assert result.returncode == 0, result.stderr
    status = _status(course)
    for student, reason in EXPECTED_FLAGS.items():
        assert reason in status[student]["problems"], (student, status[student])
        assert status[student]["status"] in ("flagged", "failed")
        is_flagged, needs_manual = flagged(course, SLUG, student)
        assert is_flagged and all(needs_manual), student
    assert "Flagged for manual review" in result.stderr


def test_unreadable_notebooks_are_kept_as_they_came_and_score_zero(malformed):
    course = malformed[0]
    for student, text in BROKEN.items():
        assert (course.root / "autograded" / student / SLUG / f"{SLUG}.ipynb.unreadable").read_text() == text
        with Gradebook(course.db_url) as gb:
            assert all(g.score == 0 for g in gb.find_submission_notebook(SLUG, SLUG, student).grades)


def test_tampered_notebooks_are_repaired_and_scored_as_stock_nbgrader_does(malformed):
    course, stock, _, _ = malformed
    for student in ("t_deleted", "t_retyped"):
        with Gradebook(course.db_url) as ours, Gradebook(stock.db_url) as theirs:
            got = {g.name: g.auto_score for g in ours.find_submission_notebook(SLUG, SLUG, student).grades}
            want = {g.name: g.auto_score for g in theirs.find_submission_notebook(SLUG, SLUG, student).grades}
        assert got == want, student


def test_a_renamed_test_cell_runs_as_the_students_own_and_the_original_is_put_back(malformed):
    """Stock nbgrader 0.9.6 fails on a renamed grade_id (KeyError 'grade_id')."""
    course = malformed[0]
    with Gradebook(course.db_url) as ours:
        got = {g.name: g.auto_score for g in ours.find_submission_notebook(SLUG, SLUG, "t_renamed").grades}
        honest = {g.name: g.auto_score for g in ours.find_submission_notebook(SLUG, SLUG, "t_deleted").grades}
    assert got == honest and got["check_linear_hidden"] == 2


def test_cells_out_of_order_or_with_broken_metadata_are_repaired_and_graded(malformed):
    """A test cell moved above what it tests runs after it again (in the released order), and
    nbgrader metadata of any shape is ignored, the test cell put back: both are graded in
    full (model answers), where stock nbgrader scores the first 0 and stops on the second."""
    course = malformed[0]
    with Gradebook(course.db_url) as ours:
        full = {g.name: g.auto_score for g in ours.find_submission_notebook(SLUG, SLUG, "t_deleted").grades}
        for student in ("t_moved", "t_metadata"):
            got = {g.name: g.auto_score for g in ours.find_submission_notebook(SLUG, SLUG, student).grades}
            assert (got["check_linear_hidden"] == 2
                    and got["check_clipped_relu_hidden"] == full["check_clipped_relu_hidden"])


def test_copied_cells_are_graded_the_released_one_wins_and_no_answer_is_lost(malformed):
    """Cells claiming one grade_id (copies of a test, setup, summary or locked cell, before
    and after it, as markdown; an answer carrying its check's metadata; a copied answer):
    the released cell is graded, unedited copies of a locked cell are dropped, the others
    run as the student's own, so each scores as the honest student, where stock nbgrader
    0.9.6 fails the whole notebook (KeyError 'grade_id')."""
    course, stock = malformed[0], malformed[1]
    honest = course.scores(SLUG, "honest")
    for student in ("t_duplicated", "t_copies", "t_answers"):
        assert _status(course)[student]["status"] == "flagged", _status(course)[student]
        assert course.scores(SLUG, student) == honest, student
    with Gradebook(stock.db_url) as theirs:
        assert all(g.auto_score is None for g in theirs.find_submission_notebook(SLUG, SLUG, "t_duplicated").grades)
    copies = notebook(course, "autograded", "t_copies", SLUG)
    assert [c.source for c in copies.cells if c.cell_type == "markdown" and "nbgrader" not in c.metadata].count(NOTES)
    assert len([c for c in copies.cells if "Hidden tests" in c.source]) == 4  # the released one of each
    answers = notebook(course, "autograded", "t_answers", SLUG)
    assert [c.id for c in answers.cells if "first try" in c.source or c.id == "pasted"] == ["linear", "pasted"]


def test_a_crash_stays_with_its_submission(malformed):
    course, _, before, _ = malformed
    assert rows(course, exclude={p.name for p in (course.root / "submitted").iterdir() if p.name != "honest"}) == before


def test_without_sandbox_it_warns_and_still_grades(tmp_path):
    course = Course(tmp_path, [SLUG])
    course.submit("honest", SLUG, solutions(SLUG))
    result = grade(course, SLUG, "--no-sandbox")
    assert result.returncode == 0
    assert result.stderr.count("ISOLATION IS REDUCED") == 2  # before and after the summary
    assert sum(course.scores(SLUG, "honest")[g][0] for g in course.scores(SLUG, "honest")) == points(SLUG)


def _complete(course: Course) -> dict[str, bool]:
    """{student: every grade written} for the submissions the gradebook knows."""
    with Gradebook(course.db_url) as gb:
        return {
            sub.student.id: all(g.auto_score is not None for nb in sub.notebooks for g in nb.grades)
            for sub in gb.assignment_submissions(SLUG)
        }


def test_kill_and_resume(tmp_path):
    course = Course(tmp_path, [SLUG])
    model = solutions(SLUG)
    students = [f"s{k:02d}" for k in range(5)]
    for k, student in enumerate(students):
        course.submit(student, SLUG, model if k % 2 == 0 else {**model, "linear": "raise NotImplementedError"})
    command = [str(Path(sys.executable).with_name("autograder")), "grade", SLUG, "--jobs", "1"]
    grader = subprocess.Popen(command, cwd=course.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    autograded = course.root / "autograded"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(autograded.glob(f"*/{SLUG}"))) < 3:
        time.sleep(0.05)
    started = {(p.pid, p.create_time()) for p in psutil.Process(grader.pid).children(recursive=True)}
    os.killpg(grader.pid, signal.SIGKILL)
    grader.wait()

    done = sorted(p.parent.name for p in autograded.glob(f"*/{SLUG}"))
    assert 3 <= len(done) < len(students)
    complete = _complete(course)
    assert all(complete.values()), "a submission with partial records"  # written whole, or not at all
    assert set(done) <= set(complete) and len(complete) <= len(done) + 1  # the gradebook commits before the move
    before = {s: (autograded / s / SLUG / f"{SLUG}.ipynb").stat().st_mtime_ns for s in done}
    assert started and not survivors(started)  # the sandboxes die with the grader

    result = grade(course, SLUG)
    assert result.returncode == 0, result.stderr
    assert _complete(course) == {s: True for s in students}
    assert {s: (autograded / s / SLUG / f"{SLUG}.ipynb").stat().st_mtime_ns for s in done} == before  # not regraded
    status = {row["student"] for row in csv.DictReader(open(course.root / "reports" / SLUG / "last-run.csv"))}
    assert status == set(students) - set(done)
    for k, student in enumerate(students):
        total = sum(score for score, _ in course.scores(SLUG, student).values())
        assert total == points(SLUG) - (0 if k % 2 == 0 else points(SLUG, "linear")), student

    assert grade(course, SLUG, "--force").returncode == 0  # --force grades everything again
    assert all((autograded / s / SLUG / f"{SLUG}.ipynb").stat().st_mtime_ns != t for s, t in before.items())



def test_one_grader_per_course_the_second_is_told_who_holds_it(tmp_path):
    """A second run on the same course exits at once (code 3) naming the first; the first
    is not disturbed and grades everyone."""
    course = Course(tmp_path, [SLUG])
    model = solutions(SLUG)
    students = [f"s{k}" for k in range(6)]
    for student in students:
        course.submit(student, SLUG, model)
    command = [str(Path(sys.executable).with_name("autograder")), "grade", SLUG, "--jobs", "1"]
    first = subprocess.Popen(command, cwd=course.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lock = course.root / ".autograder" / "lock"
    deadline = time.monotonic() + 60
    while f'"pid": {first.pid}' not in (lock.read_text() if lock.exists() else ""):  # it has taken the course
        assert time.monotonic() < deadline and first.poll() is None, "the first run never took the course"
        time.sleep(0.01)
    started = time.monotonic()
    second = grade(course, SLUG)
    assert time.monotonic() - started < 10
    assert second.returncode == 3, second.stderr
    assert "being graded already" in second.stderr and f"pid {first.pid}" in second.stderr
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert _complete(course) == {s: True for s in students}


def test_feedback_for_submissions_graded_before(tmp_path):
    course = Course(tmp_path, [SLUG])
    course.submit("alice", SLUG, solutions(SLUG))
    assert grade(course, SLUG).returncode == 0
    assert not (course.root / "feedback").exists()
    result = grade(course, SLUG, "--feedback")  # nothing left to grade: feedback all the same
    assert result.returncode == 0, result.stderr
    assert (course.root / "feedback" / "alice" / SLUG / f"{SLUG}.html").exists()
    assert "Feedback: 1 of 1 submissions" in result.stderr


def test_cell_ids_nbformat_would_make_up_are_the_same_on_every_read():
    """A copied cell keeps its id in the file; nbformat renames the copy at random as it reads
    it (and names a cell without an id at random): the grader names them by their place, so a
    regrade writes the same autograded notebook."""
    from autograder.grader.prepare import read

    nb = json.loads(nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in "abc"])))
    nb["cells"][1]["id"] = nb["cells"][0]["id"]
    del nb["cells"][2]["id"]
    data = json.dumps(nb).encode()
    first, second = ([cell.id for cell in read(data).cells] for _ in range(2))
    assert first == second and len(set(first)) == 3 and first[0] == nb["cells"][0]["id"], (first, second)
