"""A PostgreSQL gradebook, for real: a server started here (Debian's PostgreSQL, a Unix
socket in a temporary directory, no TCP), the course released into it, graded by
`autograder grade --db postgresql+psycopg://...` with scores identical to the same class
graded on SQLite; one grader per course in that database even from another course folder;
formgrader and `nbgrader export` read it."""
from __future__ import annotations

import csv
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from nbgrader.api import Gradebook
from sqlalchemy import create_engine, text

import browser
import postgres_server
from autograder import authoring
from autograder.grader import class_report
from engine_course import clone, grade, solutions
from grading import Course

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres"), pytest.mark.integration]
SLUG = "03_function_basics"
STUDENTS = [f"s{k:02d}" for k in range(8)]
AUTOGRADER = str(Path(sys.executable).with_name("autograder"))


def _state(db_url: str) -> dict:
    """Every score, flag and comment of the assignment, and each submission's total."""
    with Gradebook(db_url) as gb:
        subs = gb.assignment_submissions(SLUG)
        return {
            "grades": {(s.student.id, nb.name, g.name): (g.auto_score, g.max_score, g.needs_manual_grade)
                       for s in subs for nb in s.notebooks for g in nb.grades},
            "flags": {(s.student.id, nb.name): nb.flagged for s in subs for nb in s.notebooks},
            "comments": {(s.student.id, nb.name, c.name): c.auto_comment for s in subs for nb in s.notebooks
                         for c in nb.comments},
            "totals": {s.student.id: (s.score, s.max_score) for s in subs},
        }


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _sorted(path: Path) -> list[tuple]:
    """A CSV's rows in a fixed order (nbgrader lists what the database returns first)."""
    return sorted(tuple(sorted(row.items())) for row in _rows(path))


def _seconds_per_save(course: Course) -> tuple[float, float]:
    """(steady-state seconds between saves, the engine's own CPU per submission: preparing and saving)."""
    rows = _rows(course.root / "reports" / SLUG / "last-run.csv")
    stamps = sorted(datetime.fromisoformat(r["graded_at"]).timestamp() for r in rows)
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1), sum(float(r["engine_cpu"]) for r in rows) / len(rows)


@pytest.fixture(scope="module")
def database():
    if postgres_server.binaries() is None:
        pytest.fail(f"PostgreSQL's server programs are missing: {postgres_server.INSTALL_HINT}")
    with postgres_server.server() as url:
        yield url


@pytest.fixture(scope="module")
def courses(database, tmp_path_factory):
    """The class batch twice: on SQLite (graded) and released into PostgreSQL (not graded yet),
    whose nbgrader_config.py names that database, as an instructor's would."""
    sqlite = Course(tmp_path_factory.mktemp("sqlite"), [SLUG])
    model = solutions(SLUG)
    wrong = {1: {"linear": "raise NotImplementedError"},
             2: {"clipped_relu": model["clipped_relu"].replace("(x > 0) & (x < ctx.clip)", "x > 0")}}
    for k, student in enumerate(STUDENTS):
        sqlite.submit(student, SLUG, {**model, **wrong.get(k % 3, {})})
    postgres = clone(sqlite, tmp_path_factory.mktemp("postgres"))
    (postgres.root / "gradebook.db").unlink()
    postgres.db_url = database
    with open(postgres.root / "nbgrader_config.py", "a") as config:
        config.write(f"\nc.CourseDirectory.db_url = {database!r}\n")
    authoring.release(postgres.root, db_url=database, slugs=[SLUG])
    started = time.monotonic()
    result = grade(sqlite, "--jobs", "2")
    assert result.returncode == 0, result.stderr
    return sqlite, postgres, time.monotonic() - started


def test_graded_on_postgresql_with_the_scores_of_sqlite_and_one_grader_per_course(courses, tmp_path):
    """Graded with --db postgresql+psycopg://...; meanwhile a second grader, from a copy of
    the course in another folder (another machine, as far as the folder's lock can tell), is
    refused by the database's own lock with exit code 3 and one line naming the holder."""
    sqlite, postgres, sqlite_seconds = courses
    elsewhere = tmp_path / "elsewhere"
    clone(postgres, elsewhere)
    started = time.monotonic()
    grader = subprocess.Popen([AUTOGRADER, "grade", "--jobs", "2", "--db", postgres.db_url], cwd=postgres.root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    engine = create_engine(postgres.db_url)
    try:
        deadline = time.monotonic() + 120
        # Until the grader holds the course's lock in the database (a statement a transaction:
        # PostgreSQL's activity view is a snapshot per transaction).
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            while time.monotonic() < deadline and grader.poll() is None and not connection.execute(text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE "
                    "l.locktype = 'advisory' AND a.application_name LIKE 'autograder grade%'")).scalar():
                time.sleep(0.05)
        second = subprocess.run([AUTOGRADER, "grade", "--jobs", "1"], cwd=elsewhere, capture_output=True, text=True,
                                timeout=120)
    finally:
        engine.dispose()
        _, stderr = grader.communicate(timeout=600)
    postgres_seconds = time.monotonic() - started
    assert grader.returncode == 0, stderr
    assert second.returncode == 3, second.stderr
    errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "being graded already in its gradebook's database" in errors[0], second.stderr
    assert "autograder grade" in errors[0] and "pid" in errors[0]  # who holds it
    assert not (elsewhere / "autograded").exists()

    assert _state(postgres.db_url) == _state(sqlite.db_url)
    assert _sorted(postgres.root / "grades.csv") == _sorted(sqlite.root / "grades.csv")
    assert _sorted(postgres.root / "grades-lms.csv") == _sorted(sqlite.root / "grades-lms.csv")
    (pg_steady, pg_engine), (lite_steady, lite_engine) = _seconds_per_save(postgres), _seconds_per_save(sqlite)
    print(f"\n{len(STUDENTS)} submissions, 2 at a time: SQLite run {sqlite_seconds:.1f} s, PostgreSQL run "
          f"{postgres_seconds:.1f} s; steady state {lite_steady:.3f} vs {pg_steady:.3f} s per submission; the "
          f"grader's own CPU (prepare and save) {lite_engine * 1000:.0f} vs {pg_engine * 1000:.0f} ms per submission")

    # Graded before: a second run skips everything, the lock is free again.
    again = grade(postgres, "--db", postgres.db_url)
    assert again.returncode == 0, again.stderr
    assert _state(postgres.db_url) == _state(sqlite.db_url)


def test_nbgrader_export_and_formgrader_read_the_postgresql_gradebook(courses, tmp_path):
    sqlite, postgres, _ = courses
    if not (postgres.root / "autograded").exists():
        assert grade(postgres, "--db", postgres.db_url).returncode == 0
    nbgrader = str(Path(sys.executable).with_name("nbgrader"))
    exported = subprocess.run([nbgrader, "export", "--to", str(tmp_path / "export.csv")], cwd=postgres.root,
                              capture_output=True, text=True, timeout=300)
    assert exported.returncode == 0, exported.stderr
    ours = sorted(tuple((k, v) for k, v in sorted(row.items()) if k in class_report.NBGRADER_EXPORT)
                  for row in _rows(sqlite.root / "grades.csv"))  # (grades.csv adds late work after nbgrader's columns)
    assert _sorted(tmp_path / "export.csv") == ours

    expected = _state(sqlite.db_url)
    with browser.lab("instructor", tmp_path, COURSE=str(postgres.root)) as base:
        shown = browser.get_json(f"{base}/formgrader/api/submissions/{SLUG}?token={browser.TOKEN}")
    assert {s["student"]: (s["score"], s["max_score"]) for s in shown} == expected["totals"]
    assert {s["student"] for s in shown if s.get("flagged")} == {k[0] for k, v in expected["flags"].items() if v}
