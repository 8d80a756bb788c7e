"""Fault injection: the grader killed (SIGKILL) again and again — at random moments and in
the middle of saving a submission — and a warm worker killed mid-notebook; each time it is
run again. In the end the gradebook, autograded/ and grades.csv are those of a clean run:
nothing lost, nothing half-saved, nothing graded twice."""
from __future__ import annotations

import csv
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from autograder.grader.pool import Pool, Worker, WorkerError
from autograder.grader.records import Program, Run
from autograder.isolation import sandbox
from autograder.isolation.limits import Limits
from autograder.runner.protocol import Channel
from engine_course import clone, grade, run_state, solutions
from grading import Course

pytestmark = pytest.mark.slow
SLUG = "03_function_basics"
STUDENTS = [f"s{k:02d}" for k in range(12)]
# `make faults` (--faults-all): 12 kills at random moments and 9 while saving (each step at the
# 1st, 2nd and 3rd save); `make test`: 2 at random and one at each step (the 2nd save).
KILLS = {True: (12, (1, 2, 3)), False: (2, (2,))}
# A grader that kills itself at one step of its `at`-th save: before the gradebook
# transaction, inside it (writing the autograded notebooks), or after its commit and
# before the folder moves into autograded/.
FAULTY = """
import os, signal, sys
from autograder.grader import gradebook, writer
step, at = sys.argv[1], int(sys.argv[2])
saves = [0]

def dying(original, when):
    def wrapper(*args, **kwargs):
        if when == step:
            saves[0] += 1
            if saves[0] == at:
                os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)
    return wrapper

writer.gradebook.transaction = dying(gradebook.transaction, "before")
writer.nbjson.writes = dying(writer.nbjson.writes, "inside")
writer._set_permissions = dying(writer._set_permissions, "after commit")
from autograder.cli import app
sys.argv = ["autograder", "grade", "--jobs", "1", "--timeout", "60"]
app()
"""


def _graded_at(course: Course) -> dict[str, int]:
    return {s: (course.root / "autograded" / s / SLUG / f"{SLUG}.ipynb").stat().st_mtime_ns
            for s in STUDENTS if (course.root / "autograded" / s / SLUG / f"{SLUG}.ipynb").exists()}


AUTOGRADER = str(Path(sys.executable).with_name("autograder"))


def _start(course: Course, *command: str) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=course.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _kill(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture(scope="module")
def courses(tmp_path_factory):
    course = Course(tmp_path_factory.mktemp("faults"), [SLUG])
    model = solutions(SLUG)
    for k, student in enumerate(STUDENTS):
        course.submit(student, SLUG, model if k % 2 == 0 else {**model, "linear": "raise NotImplementedError"})
    clean = clone(course, tmp_path_factory.mktemp("clean"))
    assert grade(clean, "--jobs", "1").returncode == 0
    return course, clean


def test_killed_at_random_and_while_saving_it_ends_as_a_clean_run(courses, pytestconfig):
    course, clean = courses
    rng = random.Random(1)
    random_kills, saves = KILLS[pytestconfig.getoption("--faults-all")]
    faults = [("random", rng.uniform(0.5, 12.0)) for _ in range(random_kills)]
    faults += [(step, at) for step in ("before", "inside", "after commit") for at in saves]
    rng.shuffle(faults)
    first_seen: dict[str, int] = {}
    for kind, when in faults:
        if kind == "random":
            process = _start(course, AUTOGRADER, "grade", "--jobs", "1", "--timeout", "60")
            try:
                process.wait(timeout=when)
            except subprocess.TimeoutExpired:
                _kill(process)
        else:
            _start(course, sys.executable, "-c", FAULTY, kind, str(when)).wait(timeout=300)
        for student, mtime in _graded_at(course).items():  # once saved, never graded again
            assert first_seen.setdefault(student, mtime) == mtime, f"{student} was graded twice"
    result = grade(course, "--jobs", "1")
    assert result.returncode == 0, result.stderr
    assert all(first_seen.get(s, t) == t for s, t in _graded_at(course).items())
    assert run_state(course, SLUG) == run_state(clean, SLUG)


def test_a_worker_killed_mid_notebook_is_replaced_and_the_notebook_graded_once(courses, tmp_path):
    _, clean = courses
    course = clone(clean, tmp_path)
    grader = subprocess.Popen([AUTOGRADER, "grade", "--force", "--jobs", "1"],
                              cwd=course.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # The first notebook process seen after a kill is the killed notebook's rerun, which is
    # left alone (a second failure gives it up); the next one is killed. (Not "a notebook was
    # saved since": saves lag behind the runs, and the one saved may be the run before.)
    killed, victim, rerun = 0, None, None
    deadline = time.monotonic() + 120
    while killed < 2 and time.monotonic() < deadline and grader.poll() is None:
        running = [p for p in psutil.Process(grader.pid).children(recursive=True)
                   if p.pid != victim and _is_notebook(p)]
        if running and killed and rerun is None:
            rerun = running[0].pid
        elif running and running[0].pid != rerun:
            psutil.Process(running[0].ppid()).kill()
            killed, victim, rerun = killed + 1, running[0].pid, None
        time.sleep(0.02)
    assert grader.wait(timeout=300) == 0, grader.stderr.read()
    assert killed == 2
    status = course.root / "reports" / SLUG / "last-run.csv"
    problems = [(r["student"], r["status"], r["problems"]) for r in csv.DictReader(status.open()) if r["problems"]]
    assert run_state(course, SLUG) == run_state(clean, SLUG), problems



@pytest.fixture
def killed_worker(tmp_path):
    """A warm worker just killed: its channel closed, bubblewrap's processes above it still
    exiting (poll() says running)."""
    worker = Worker(sandbox.Isolation(None, 0, "none"), tmp_path, tmp_path, 0)
    ours, theirs = socket.socketpair()
    theirs.close()
    worker.control, worker.ready = Channel(ours), True
    worker.process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield worker
    worker.kill()


def test_a_worker_killed_mid_notebook_is_run_again_though_its_sandbox_is_still_exiting(killed_worker):
    """Its notebook is run again, not failed as one that "did not exit"."""
    with pytest.raises(WorkerError, match="died"):
        killed_worker._finish(Run(), time.monotonic(), Limits(), explain_exit=False)
    assert killed_worker.process is None


def test_a_worker_killed_between_notebooks_is_replaced_before_the_next(killed_worker):
    """The next notebook, sent to a dead worker (a broken pipe), is run again on a fresh one,
    not failed as the grader's own failure."""
    with pytest.raises(WorkerError, match="died"):
        killed_worker.run(Program([(0, "cell 1", "x = 1")]), Limits())


def test_closing_the_pool_does_not_wait_for_a_worker_still_warming_up(monkeypatch, tmp_path):
    """When every notebook has run before a worker is ready (a class of one), the pool closes
    at once: the worker still warming up is killed, not waited for (up to its start-up limit)."""
    real = sandbox.launch
    monkeypatch.setattr(sandbox, "launch", lambda *args: dataclasses.replace(real(*args), argv=["sleep", "600"]))
    pool = Pool(1, sandbox.Isolation(None, 0, "none"), tmp_path, Limits())
    while not pool._warming:  # (its thread has started it)
        time.sleep(0.01)
    closing = threading.Thread(target=pool.close)
    closing.start()
    closing.join(timeout=60)  # a hang detector: without the kill, close waits 300 s
    assert not closing.is_alive()
    assert pool.workers[0].process is None and not pool.workers[0].ready


def test_a_worker_closed_while_it_starts_is_not_started_again(monkeypatch, tmp_path):
    """The pool closes while its thread is starting a worker (between its being counted as
    warming and its process's start): the kill waits for the start, and the thread's wait
    for the worker to be ready then fails at once instead of starting it again and waiting
    STARTUP seconds (a grading run's end, and test_pools_running_at_once, hung 300 s so)."""
    real = sandbox.launch
    monkeypatch.setattr(sandbox, "launch", lambda *args: dataclasses.replace(real(*args), argv=["sleep", "600"]))
    worker = Worker(sandbox.Isolation(None, 0, "none"), tmp_path, tmp_path, 0)
    worker.start()
    worker.close()  # as Pool.close does to a worker warming up
    started = time.monotonic()
    with pytest.raises(WorkerError, match="closing"):
        worker.ensure_ready()
    assert worker.starts == 1 and worker.process is None and time.monotonic() - started < 5


def test_pools_running_at_once_run_their_notebooks_as_users_of_their_own(monkeypatch, tmp_path):
    """A worker's notebooks run as a user of its own (its slot), and the process limit counts
    per user across the machine: two grading runs at once (two courses, the Dask workers of a
    machine) never share a slot."""
    real = sandbox.launch
    monkeypatch.setattr(sandbox, "launch", lambda *args: dataclasses.replace(real(*args), argv=["sleep", "600"]))
    isolation = sandbox.Isolation(None, 0, "none")
    with Pool(2, isolation, tmp_path, Limits()) as first, Pool(1, isolation, tmp_path, Limits()) as second:
        taken = [w.slot for w in first.workers + second.workers]
        assert len(set(taken)) == 3

def _is_notebook(process: psutil.Process) -> bool:
    """A notebook's child: forked from a warm worker (the same Python command line; bubblewrap's
    own processes carry it as arguments)."""
    try:
        return all(_is_worker(p.cmdline()) for p in (process, process.parent()))
    except psutil.Error:
        return False


def _is_worker(command: list[str]) -> bool:
    return "autograder.runner.zygote" in command and not command[0].endswith("bwrap")
