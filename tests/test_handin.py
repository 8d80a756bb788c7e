"""hand_in(): one call writes a submission an instructor drops into submitted/ or collects
with `nbgrader zip_collect`."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import types
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbformat
import pytest

from autograder import authoring
from autograder.student import handin

SLUG = "03_function_basics"


def _released(tmp_path: Path, name: str = f"{SLUG}.ipynb") -> Path:
    path = tmp_path / name
    shutil.copy(authoring.ROOT / "course" / SLUG / f"{SLUG}.ipynb", path)
    return path


def test_hand_in_writes_the_notebook_where_nbgrader_expects_it(tmp_path, capsys):
    path = handin.hand_in("alice_92", notebook=_released(tmp_path))
    assert path == tmp_path / f"alice_92__{SLUG}.zip"
    names = zipfile.ZipFile(path).namelist()
    assert names == [f"alice_92/{SLUG}/{SLUG}.ipynb", f"alice_92/{SLUG}/timestamp.txt"]
    inside = json.loads(zipfile.ZipFile(path).read(names[0]))
    assert inside == json.loads((tmp_path / f"{SLUG}.ipynb").read_text())
    printed = capsys.readouterr().out
    assert f"Handed in {SLUG} for alice_92" in printed and "still raise NotImplementedError" in printed


def test_the_assignment_comes_from_the_notebook_name_even_a_copy(tmp_path):
    path = handin.hand_in("bob", notebook=_released(tmp_path, f"Copy of {SLUG} (1).ipynb"), to=tmp_path / "out")
    assert path.name == f"bob__{SLUG}.zip" and path.parent == tmp_path / "out"


def test_bad_student_ids_unknown_names_and_foreign_notebooks_say_what_to_do(tmp_path):
    with pytest.raises(handin.HandInError, match="not a student id"):
        handin.hand_in("alice smith", notebook=_released(tmp_path))
    with pytest.raises(handin.HandInError, match="assignment="):
        handin.hand_in("alice", notebook=_released(tmp_path, "homework.ipynb"))
    (tmp_path / "mine.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    with pytest.raises(handin.HandInError, match="none of the course's cells"):
        handin.hand_in("alice", SLUG, notebook=tmp_path / "mine.ipynb")


def test_in_colab_it_hands_in_the_open_notebook_and_downloads_it(tmp_path, monkeypatch):
    nb = json.loads(_released(tmp_path).read_text())
    nb["metadata"]["colab"] = {"name": f"Copy of {SLUG}.ipynb"}
    downloaded = []
    google = types.ModuleType("google")
    colab = types.ModuleType("google.colab")
    colab._message = types.SimpleNamespace(blocking_request=lambda kind, timeout_sec: {"ipynb": nb})
    colab.files = types.SimpleNamespace(download=downloaded.append)
    google.colab = colab
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.chdir(tmp_path)
    path = handin.hand_in("carol")
    assert downloaded == [str(path)] and path == tmp_path / f"carol__{SLUG}.zip"


def test_while_grading_it_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert handin.hand_in("alice", notebook=_released(tmp_path)) is None
    assert not list(tmp_path.glob("*.zip"))


def _handed_in_at(zipped: Path, when: datetime) -> Path:
    """The hand-in `zipped`, as if made at `when` (its timestamp.txt says so)."""
    with zipfile.ZipFile(zipped) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(zipped, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, when.strftime("%Y-%m-%d %H:%M:%S.%f %Z") if name.endswith("timestamp.txt") else data)
    return zipped


@pytest.mark.slow
def test_zip_collect_keeps_each_hand_ins_time_so_late_work_shows_as_late(tmp_path):
    """Hand-in zips as an LMS downloads them (renamed; bob handed in twice), collected with
    `nbgrader zip_collect` and the course's configuration: nothing skipped, each student's
    timestamp.txt as hand_in wrote it (bob's later hand-in kept), graded: with a due date,
    grades.csv and the gradebook show bob late and alice on time."""
    from nbgrader.api import Gradebook

    from engine_course import grade
    from grading import Course

    (tmp_path / "course").mkdir()
    course = Course(tmp_path / "course", [SLUG])
    due = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
    with Gradebook(course.db_url) as gb:
        gb.update_or_create_assignment(SLUG, duedate=due.replace(tzinfo=None))
    archive = course.root / "downloaded" / SLUG / "archive"
    archive.mkdir(parents=True)
    released = course.root / "course" / SLUG / f"{SLUG}.ipynb"
    for student, when in (("alice", due - timedelta(hours=2)), ("bob", due - timedelta(hours=1)),
                          ("bob", due + timedelta(minutes=30))):
        zipped = _handed_in_at(handin.hand_in(student, notebook=released, to=tmp_path / when.isoformat()), when)
        shutil.copy(zipped, archive / f"{student}_{when:%H%M}_5678_{zipped.name}")  # renamed as an LMS does
    nbgrader = Path(sys.executable).with_name("nbgrader")
    done = subprocess.run([str(nbgrader), "zip_collect", SLUG], cwd=course.root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "no match information" not in done.stderr, done.stderr  # timestamp.txt too is collected
    assert "6 files collected, 2 files skipped" in done.stderr, done.stderr  # bob's first hand-in: replaced
    for student, when in (("alice", due - timedelta(hours=2)), ("bob", due + timedelta(minutes=30))):
        folder = course.root / "submitted" / student / SLUG
        assert (folder / f"{SLUG}.ipynb").is_file()
        assert (folder / "timestamp.txt").read_text() == when.strftime("%Y-%m-%d %H:%M:%S.%f %Z")
    graded = grade(course, SLUG)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    with open(course.root / "grades.csv", newline="") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    assert rows["alice"]["timestamp"] < rows["alice"]["duedate"] < rows["bob"]["timestamp"], rows
    with Gradebook(course.db_url) as gb:
        assert gb.find_submission(SLUG, "bob").total_seconds_late == 30 * 60
        assert gb.find_submission(SLUG, "alice").total_seconds_late == 0


def test_unzipped_by_hand_the_hand_in_lands_where_nbgrader_expects_it(tmp_path):
    zipped = handin.hand_in("alice", notebook=_released(tmp_path))
    with zipfile.ZipFile(zipped) as archive:
        archive.extractall(tmp_path / "submitted")
    assert (tmp_path / "submitted" / "alice" / SLUG / f"{SLUG}.ipynb").is_file()
    assert (tmp_path / "submitted" / "alice" / SLUG / "timestamp.txt").read_text().endswith("UTC")


def test_in_jupyter_it_finds_the_notebook_its_kernel_runs(tmp_path):
    """A real kernel, started as Jupyter's server starts one: in the notebook's folder, with
    the notebook's path relative to the server's root in JPY_SESSION_NAME."""
    from jupyter_client.manager import start_new_kernel

    folder = tmp_path / "work" / SLUG
    folder.mkdir(parents=True)
    _released(folder)
    env = {**os.environ, "JPY_SESSION_NAME": f"{SLUG}/{SLUG}.ipynb"}
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(folder), env=env)
    try:
        reply = client.execute_interactive("from autograder.student.handin import hand_in\nhand_in('dora')", timeout=60)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok", reply["content"]
    path = folder / f"dora__{SLUG}.zip"
    assert zipfile.ZipFile(path).namelist()[0] == f"dora/{SLUG}/{SLUG}.ipynb"


def _kernel(folder: Path):
    """A real kernel started as Jupyter's server starts one for the notebook in `folder`."""
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "JPY_SESSION_NAME": f"{SLUG}/{SLUG}.ipynb"}
    return start_new_kernel(kernel_name="python3", cwd=str(folder), env=env)


def _errors(client, code: str) -> list[dict]:
    """The error outputs of running `code` in the kernel."""
    found = []
    client.execute_interactive(code, timeout=60, output_hook=lambda msg: found.append(msg["content"])
                               if msg["msg_type"] == "error" else None)
    return found


def test_a_kernel_whose_latest_cell_is_not_saved_refuses_in_one_line(tmp_path):
    """No page saves the file here (a kernel without JupyterLab): the answer run last is not
    in the file, so nothing is handed in and one line says to save — no traceback."""
    folder = tmp_path / SLUG
    folder.mkdir()
    _released(folder)
    manager, client = _kernel(folder)
    try:
        client.execute_interactive("answer = 42", timeout=60)
        errors = _errors(client, "from autograder.student.handin import hand_in\nhand_in('dora')")
        bad_id = _errors(client, "hand_in('Alice Smith')")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert [e["ename"] for e in errors] == ["HandInError"] and len(errors[0]["traceback"]) == 1, errors
    assert "does not hold your latest cells (In [1] is not in it): save the notebook" in errors[0]["traceback"][0]
    assert not list(folder.glob("*.zip"))
    assert len(bad_id[0]["traceback"]) == 1 and "is not a student id" in bad_id[0]["traceback"][0]


def test_the_placeholder_id_hands_in_nothing_and_says_what_to_write(tmp_path, capsys):
    assert handin.hand_in("", notebook=_released(tmp_path)) is None
    assert 'write your student id between the quotes, e.g. hand_in("alice_92")' in capsys.readouterr().out
    assert not list(tmp_path.glob("*.zip"))


def test_every_notebook_ends_with_the_hand_in_cell_written_by_release(tmp_path):
    """authoring.normalize writes it (once, whatever the notebook had there), and problems()
    asks for it; while grading, the cell prints nothing."""
    nb = nbformat.read(authoring.solution_path(SLUG), as_version=4)
    twice = authoring.normalize(authoring.normalize(nb))
    cells = [c for c in twice.cells if authoring.HAND_IN_TAG in c.metadata.get("tags", [])]
    assert cells == [twice.cells[-1]] and twice.cells[-1].id == "hand-in"
    assert f"YOUR-ID__{SLUG}.zip" in cells[0].source and cells[0].source.endswith('hand_in("");')
    assert not authoring.problems(twice)
    twice.cells.pop()
    assert "the last cell must be the hand-in cell (run `make release`)" in authoring.problems(twice)
