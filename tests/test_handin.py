"""hand_in(): one call writes a submission an instructor drops into submitted/ or collects
with `nbgrader zip_collect`."""
from __future__ import annotations

import csv
import json
import os
import re
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
from autograder.grader import handins
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


def _zip_collect(course) -> subprocess.CompletedProcess:
    nbgrader = Path(sys.executable).with_name("nbgrader")
    return subprocess.run([str(nbgrader), "zip_collect", SLUG], cwd=course.root, capture_output=True, text=True,
                          timeout=300)


def _notebook_of(zipped: Path) -> bytes:
    with zipfile.ZipFile(zipped) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith(".ipynb")))


def test_the_lms_default_names_are_canvas_and_moodle_as_they_write_them():
    """The names of canvas-lms lib/content_zipper.rb (get_filename, add_upload_submission)
    and Moodle's mod/assign/locallib.php (download_submissions), LMS times read as written."""
    canvas, moodle = re.compile(handins.CANVAS), re.compile(handins.MOODLE)
    found = canvas.match("lovelaceada_12345_67890_alice__03_function_basics.zip")
    assert found and found["lms_id"] == "12345" and not found["late"] and found["file"].startswith("alice__")
    found = canvas.match("o_brienpat_LATE_12345_67890_alice__03_function_basics-1.zip")
    assert found and found["lms_id"] == "12345" and found["late"] and found["name"] == "o_brienpat"
    assert not canvas.match("anon_aB3dE_67890_alice__03_function_basics.zip")  # anonymous grading: no user id
    for name in ("Ada Lovelace_123456_assignsubmission_file_alice__03_function_basics.zip",
                 "Ada Lovelace_123456_assignsubmission_file_/alice__03_function_basics.zip",  # "in folders"
                 "Participant_123456_assignsubmission_file_/alice__03_function_basics.zip"):  # blind marking
        found = moodle.match(name)
        assert found and found["lms_id"] == "123456" and found["file"] == "alice__03_function_basics.zip", name
        assert not canvas.match(name), name
    # nbgrader's own reading takes the "-30-00" for a zone (11:00); an LMS's is read as written
    assert handins.lms_time("2026-03-01-11-30-00") == datetime(2026, 3, 1, 11, 30)
    assert handins.lms_time("2026-03-01T12:30:00+01:00") == datetime(2026, 3, 1, 11, 30)
    assert handins.lms_time("2026-03-01 12:30", "Europe/Paris") == datetime(2026, 3, 1, 11, 30)


def test_a_download_that_is_not_just_its_uploaders_hand_in_is_refused_with_the_reason(tmp_path):
    """Whatever the zip holds besides UPLOADER/ASSIGNMENT/'s files: one line why, nothing used."""
    def zipped(*members: str, link: str | None = None) -> bytes:
        path = tmp_path / "z.zip"
        with zipfile.ZipFile(path, "w") as archive:
            for member in members:
                archive.writestr(member, "{}")
            if link:
                info = zipfile.ZipInfo(link)
                info.external_attr = 0o120777 << 16  # a symbolic link
                archive.writestr(info, "/etc/passwd")
        return path.read_bytes()

    ok = f"alice/{SLUG}/{SLUG}.ipynb"
    assert handins._files("d", zipped(ok, f"alice/{SLUG}/timestamp.txt"), "alice", SLUG).keys() == {
        f"{SLUG}.ipynb", "timestamp.txt"}
    for data, why in ((zipped(f"bob/{SLUG}/{SLUG}.ipynb"), "holds a hand-in of bob"),
                      (zipped(ok, f"bob/{SLUG}/{SLUG}.ipynb"), "holds a hand-in of bob"),
                      (zipped(f"alice/04_gradient_patterns/{SLUG}.ipynb"), "a hand-in of 04_gradient_patterns"),
                      (zipped(ok, f"alice/{SLUG}/../../x.ipynb"), "not a file in alice/"),
                      (zipped(ok, f"alice/{SLUG}/data/x.csv"), "not a file in alice/"),
                      (zipped(ok, f"./{SLUG}/{SLUG}.ipynb"), "not a file in alice/"),
                      (zipped(ok, link=f"alice/{SLUG}/secret.txt"), "not a file in alice/"),
                      (b"not a zip", "is not a hand_in() zip")):
        with pytest.raises(handins.Refused, match=re.escape(why)):
            handins._files("d", data, "alice", SLUG)


DUE = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
TIMED = r"(?P<student_id>[a-z]+)_attempt_(?P<timestamp>[0-9-]+)_"  # nbgrader's own example of an LMS's name


def _variant(released: Path, folder: Path, text: str) -> Path:
    """The released notebook with a first cell of its own (so its hand-in can be told apart)."""
    folder.mkdir()
    path = folder / released.name
    path.write_text(released.read_text().replace('"cells": [', '"cells": [{"cell_type": "markdown", "id": "mark", '
                                                 f'"metadata": {{}}, "source": "{text}"}},', 1))
    return path


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """One `nbgrader zip_collect` of two LMSes' downloads, with the course's configuration and
    a second naming (TIMED: an LMS that names the upload time). Canvas's zip (its names carry
    no time): alice, bob, carol (marked LATE by Canvas, though her own clock says on time),
    and eve, whose zip holds a hand-in made as bob, later. TIMED: dave twice (the first with
    a timestamp.txt that claims a later time than the second's upload), frank once, late,
    with a timestamp.txt that claims to be on time.
    (course, zip_collect's run, {uploader: zip} of Canvas's, {name: zip} of the timed ones)."""
    from grading import Course, canvas_download

    tmp_path = tmp_path_factory.mktemp("collect")
    (tmp_path / "course").mkdir()
    course = Course(tmp_path / "course", [SLUG])
    with open(course.root / "nbgrader_config.py", "a") as f:
        f.write(f'\nc.HandInExtractor.download_names.update({{"Timed": r"{TIMED}"}})\n')
    released = course.root / "course" / SLUG / f"{SLUG}.ipynb"
    forged = _variant(released, tmp_path / "forged", "eve was here")
    second = _variant(released, tmp_path / "second", "dave's second")
    canvas = {}
    for uploader, as_whom, notebook, when in (("alice", "alice", released, DUE - timedelta(hours=2)),
                                              ("bob", "bob", released, DUE - timedelta(hours=1)),
                                              ("eve", "bob", forged, DUE - timedelta(minutes=10)),
                                              ("carol", "carol", released, DUE - timedelta(hours=3))):
        canvas[uploader] = _handed_in_at(handin.hand_in(as_whom, notebook=notebook, to=tmp_path / uploader), when)
    archive = canvas_download(course, SLUG, [(u, z, u == "carol") for u, z in canvas.items()])
    timed = {}
    for student, notebook, uploaded, written in (
            ("dave", released, datetime(2026, 3, 1, 11, 0), datetime(2026, 3, 5, 9, 0)),  # forged: "later"
            ("dave", second, datetime(2026, 3, 1, 11, 30), datetime(2026, 3, 1, 11, 29)),
            ("frank", released, datetime(2026, 3, 1, 12, 30), datetime(2026, 3, 1, 11, 0))):  # forged: "on time"
        made = handin.hand_in(student, notebook=notebook, to=tmp_path / f"{student}{uploaded:%H%M}")
        name = f"{student}_attempt_{uploaded:%Y-%m-%d-%H-%M-%S}_{made.name}"
        timed[name] = _handed_in_at(made, written.replace(tzinfo=timezone.utc))
        shutil.copy(timed[name], archive / name)
    return course, _zip_collect(course), canvas, timed


def test_zip_collect_takes_the_student_from_the_lms_download_never_from_inside_the_zip(collected):
    """eve's zip, made as bob: refused in one line that names both, and bob's own hand-in,
    with his time, is what is collected; nothing is collected for eve."""
    course, done, canvas, _ = collected
    assert done.returncode == 0, done.stderr
    naming_both = [line for line in done.stderr.splitlines() if "eve" in line and "bob" in line]
    assert len(naming_both) == 1 and "not collected" in naming_both[0], done.stderr
    assert "10 files collected" in done.stderr and "skipped" not in done.stderr, done.stderr
    submitted = course.root / "submitted"
    assert sorted(p.name for p in submitted.iterdir()) == ["alice", "bob", "carol", "dave", "frank"]
    assert (submitted / "bob" / SLUG / f"{SLUG}.ipynb").read_bytes() == _notebook_of(canvas["bob"])
    assert (submitted / "bob" / SLUG / "timestamp.txt").read_text() == (DUE - timedelta(hours=1)).strftime(
        "%Y-%m-%d %H:%M:%S.%f UTC")


def test_of_two_uploads_the_later_by_the_lms_time_is_kept_and_a_forged_time_counts_for_nothing(collected):
    """dave's later upload is kept, with the LMS's time, though his first claims a later time;
    frank's time is the LMS's, not the earlier one his timestamp.txt claims; the run names
    dave's first upload as not collected."""
    course, done, _, timed = collected
    first, later, _ = sorted(timed)
    dave, frank = (course.root / "submitted" / student / SLUG for student in ("dave", "frank"))
    assert (dave / f"{SLUG}.ipynb").read_bytes() == _notebook_of(timed[later])
    assert (dave / "timestamp.txt").read_text() == "2026-03-01 11:30:00.000000 UTC"
    assert (frank / "timestamp.txt").read_text() == "2026-03-01 12:30:00.000000 UTC"
    assert [line for line in done.stderr.splitlines() if first in line and "not collected" in line], done.stderr


def test_the_grader_reads_where_each_time_came_from(collected):
    """zip_collect's record (reports/ASSIGNMENT/hand-ins.csv) tells the grader where each
    time came from: the LMS's upload, or the student's own clock; and what Canvas says of
    lateness."""
    from nbgrader.coursedir import CourseDirectory

    from autograder.grader import discover
    from autograder.grader.preflight import load_config
    from autograder.grader.records import Options

    course = collected[0]
    coursedir = CourseDirectory(config=load_config(Options(root=course.root, db_url=course.db_url)))
    found = {s.student: (s.time_from, s.lms_late) for s in discover.find(coursedir, [SLUG], [])}
    assert found == {"alice": ("student", "no"), "bob": ("student", "no"), "carol": ("student", "yes"),
                     "dave": ("lms", ""), "frank": ("lms", "")}


def test_without_the_map_from_the_lms_ids_zip_collect_stops_in_one_line(collected, tmp_path):
    """Canvas names its downloads by its own user ids: with no roster the collection stops
    before anything is collected, and says where the map goes."""
    from nbgrader.apps import ZipCollectApp
    from nbgrader.coursedir import CourseDirectory

    course, said = collected[0], []
    app = ZipCollectApp(coursedir=CourseDirectory(root=str(tmp_path), assignment_id=SLUG))  # no lms-roster.csv
    app.fail = lambda message: said.append(message) or sys.exit(1)
    with pytest.raises(SystemExit):
        handins.HandInExtractor(parent=app).extract(str(course.root / "downloaded" / SLUG / "archive"),
                                                    str(tmp_path / "extracted"))
    assert len(said) == 1 and "lms-roster.csv" in said[0] and "SIS User ID" in said[0], said
    assert not (tmp_path / "extracted").exists()


@pytest.mark.slow
def test_zip_collected_late_work_shows_as_late_in_the_grades_and_the_summary(collected):
    """The collected course graded with a due date: the gradebook, grades.csv and the run's
    summary show frank late, by how much, and that his time is the LMS's; carol on time by
    her own clock, and that Canvas marks her late."""
    from nbgrader.api import Gradebook

    from engine_course import grade

    course = collected[0]
    with Gradebook(course.db_url) as gb:
        gb.update_or_create_assignment(SLUG, duedate=DUE.replace(tzinfo=None))
    graded = grade(course, SLUG)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    with open(course.root / "grades.csv", newline="") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    assert {s: (r["seconds_late"], r["time_from"], r["lms_late"]) for s, r in rows.items()} == {
        "alice": ("0", "student", "no"), "bob": ("0", "student", "no"), "carol": ("0", "student", "yes"),
        "dave": ("0", "lms", ""), "frank": ("1800", "lms", "")}
    assert rows["alice"]["timestamp"] < rows["alice"]["duedate"] < rows["frank"]["timestamp"], rows
    with Gradebook(course.db_url) as gb:
        assert gb.find_submission(SLUG, "frank").total_seconds_late == 30 * 60
    summary = (graded.stdout + graded.stderr).split("Late hand-ins")[-1]
    assert re.search(rf"{SLUG}/frank\s+│\s+0:30:00\s+│\s+0\s+│ LMS upload ", summary), summary
    assert re.search(rf"{SLUG}/carol\s+│\s+on time\s+│\s+0\s+│ student's clock\s+│ late ", summary), summary
    assert f"{SLUG}/alice" not in summary


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
