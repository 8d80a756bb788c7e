"""Courses for the engine's tests: stock nbgrader's course (tests/grading.py), graded by
`autograder grade`, with helpers to build submissions and read the gradebook."""
from __future__ import annotations

import copy
import csv
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
from nbgrader.api import Gradebook, SourceCell

from autograder import authoring
from grading import Course, exercises


def solutions(slug: str) -> dict[str, str]:
    """{answer grade_id: model solution} of a notebook."""
    nb = nbformat.read(authoring.solution_path(slug), as_version=4)
    return {e.answer_id: e.solution for e in exercises(nb)}


def run_state(course: Course, slug: str) -> dict:
    """What a grading run leaves of `slug`: every score and flag, each student's autograded
    files, grades.csv."""
    with Gradebook(course.db_url) as gb:
        submissions = gb.assignment_submissions(slug)
        grades = {(s.student.id, nb.name, g.name): (g.auto_score, g.needs_manual_grade)
                  for s in submissions for nb in s.notebooks for g in nb.grades}
        flags = {(s.student.id, nb.name): nb.flagged for s in submissions for nb in s.notebooks}
    autograded = course.root / "autograded"
    files = {folder.name: sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
             for folder in sorted(autograded.iterdir())} if autograded.exists() else {}
    with open(course.root / "grades.csv", newline="") as f:
        rows = sorted(tuple(sorted(row.items())) for row in csv.DictReader(f))
    return {"grades": grades, "flags": flags, "files": files, "grades.csv": rows}


def clone(course: Course, root: Path) -> Course:
    """A copy of a released course (with its submissions) in `root`."""
    shutil.copytree(course.root, root, dirs_exist_ok=True)
    twin = copy.copy(course)
    twin.root, twin.db_url = root, f"sqlite:///{root / 'gradebook.db'}"
    return twin


def submit_notebook(course: Course, student: str, slug: str, nb: nbformat.NotebookNode | str) -> Path:
    """Submit a notebook as given (a NotebookNode, or raw text for broken files)."""
    folder = course.root / "submitted" / student / slug
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{slug}.ipynb"
    if isinstance(nb, str):
        path.write_text(nb)
    else:
        nbformat.write(nb, path)
    return path


def with_answers(course: Course, slug: str, answers: dict[str, str]) -> nbformat.NotebookNode:
    nb = course.released(slug)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nb


def grade(course: Course, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`autograder grade ARGS` in the course root, as an instructor runs it."""
    command = Path(sys.executable).with_name("autograder")
    return subprocess.run(
        [str(command), "grade", *args], cwd=course.root, capture_output=True, text=True, timeout=timeout
    )


def watched(course: Course, *args: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess,
                                                                     set[tuple[int, float]]]:
    """`grade(course, *args)`, and every process it started (pid, start time), seen while it ran."""
    command = Path(sys.executable).with_name("autograder")
    grader = subprocess.Popen([str(command), "grade", *args], cwd=course.root, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    seen: set[tuple[int, float]] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            try:
                seen.update((p.pid, p.create_time()) for p in psutil.Process(grader.pid).children(recursive=True))
            except psutil.Error:
                pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = grader.communicate(timeout=timeout)
    done.set()
    watcher.join()
    return subprocess.CompletedProcess(grader.args, grader.returncode, out, err), seen


def survivors(started: set[tuple[int, float]], patience: float = 10.0) -> list[str]:
    """Those of `started` still alive after `patience` seconds (a sandbox dies a moment after its grader)."""
    deadline = time.monotonic() + patience
    while True:
        alive = []
        for pid, created in started:
            try:
                process = psutil.Process(pid)
                if process.create_time() == created:
                    alive.append(" ".join(process.cmdline()) or str(pid))
            except psutil.Error:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def rows(course: Course, exclude: set[str] = frozenset()) -> dict:
    """Every gradebook value that an attack by a student in `exclude` must leave alone:
    other students' grades, comments and flags, and the stored source cells (tests)."""
    found = {}
    with Gradebook(course.db_url) as gb:
        for cell in gb.db.query(SourceCell):
            found[("source", cell.notebook.name, cell.name)] = (cell.source, cell.checksum, cell.locked, cell.cell_type)
        for student in gb.students:
            if student.id in exclude:
                continue
            for submission in student.submissions:
                for nb in submission.notebooks:
                    found[(student.id, nb.name, "flagged")] = nb.flagged
                    for g in nb.grades:
                        found[(student.id, nb.name, g.name)] = (g.auto_score, g.manual_score, g.needs_manual_grade)
                    for c in nb.comments:
                        found[(student.id, nb.name, c.name, "comment")] = (c.auto_comment, c.manual_comment)
    return found


def notebook(course: Course, step: str, student: str, slug: str) -> nbformat.NotebookNode:
    return nbformat.read(course.root / step / student / slug / f"{slug}.ipynb", as_version=4)


def flagged(course: Course, slug: str, student: str) -> tuple[bool, list[bool]]:
    with Gradebook(course.db_url) as gb:
        row = gb.find_submission_notebook(slug, slug, student)
        return row.flagged, [g.needs_manual_grade for g in row.grades]
