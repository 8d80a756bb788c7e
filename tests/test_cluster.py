"""Grading on a Dask cluster with real processes: a `dask scheduler` and two `dask worker`s
(one thread each), started here on the loopback address. The class batch graded there
equals the local run exactly; a Dask worker killed in the middle of a notebook loses
nothing and grades nothing twice; a scheduler that goes away stops the run cleanly, and a
rerun on a new cluster grades only what was left."""
from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engine_course import clone, grade, run_state, solutions
from grading import Course

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster"), pytest.mark.integration]
SLUG = "03_function_basics"
STUDENTS = [f"s{k:02d}" for k in range(6)]
DASK = str(Path(sys.executable).with_name("dask"))
AUTOGRADER = str(Path(sys.executable).with_name("autograder"))


class Cluster:
    """A Dask scheduler and `workers` Dask workers (each under its nanny, one thread), on 127.0.0.1."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.started = folder, 0
        self.scheduler: subprocess.Popen | None = None
        self.nannies: list[subprocess.Popen] = []
        self.address = ""

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")
        return subprocess.Popen([DASK, *args], cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def start(self, workers: int) -> None:
        self.started += 1
        scheduler_file = self.folder / f"scheduler-{self.started}.json"
        self.scheduler = self._spawn(f"scheduler-{self.started}", "scheduler", "--host", "127.0.0.1", "--port", "0",
                                     "--no-dashboard", "--scheduler-file", str(scheduler_file))
        deadline = time.monotonic() + 120
        self.address = ""
        while not self.address and time.monotonic() < deadline and self.scheduler.poll() is None:
            with contextlib.suppress(OSError, ValueError):  # not there yet, or not whole yet (seen on a busy machine)
                self.address = json.loads(scheduler_file.read_text())["address"]
            time.sleep(0.1)
        log = self.folder / f"scheduler-{self.started}.log"
        assert self.address, f"the Dask scheduler wrote no address: {log.read_text()}"
        self.nannies = [self._spawn(f"worker-{self.started}-{k}", "worker", self.address, "--nthreads", "1",
                                    "--host", "127.0.0.1", "--no-dashboard", "--name", f"w{k}",
                                    "--local-directory", str(self.folder / f"w{self.started}-{k}"))
                        for k in range(workers)]
        self.wait_for(workers)

    def wait_for(self, workers: int) -> None:
        from distributed import Client

        with Client(self.address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(workers, timeout=180)

    def stop(self) -> None:
        for process in [*self.nannies, self.scheduler]:
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.nannies, self.scheduler = [], None

    def dask_worker_running_a_notebook(self) -> psutil.Process | None:
        """The Dask worker process (its nanny's child) with a notebook running now."""
        for nanny in self.nannies:
            try:
                for process in psutil.Process(nanny.pid).children(recursive=True):
                    if _is_notebook(process):
                        while process.ppid() != nanny.pid:
                            process = process.parent()
                        return process
            except psutil.Error:
                continue
        return None


def _is_notebook(process: psutil.Process) -> bool:
    """A notebook's child: forked from a warm worker (bubblewrap's processes carry the
    worker's command line as arguments)."""
    try:
        return all("autograder.runner.zygote" in p.cmdline() and not p.cmdline()[0].endswith("bwrap")
                   for p in (process, process.parent()))
    except psutil.Error:
        return False


def _last_run(course: Course) -> list[dict]:
    with open(course.root / "reports" / SLUG / "last-run.csv", newline="") as f:
        return list(csv.DictReader(f))


def _graded_at(course: Course) -> dict[str, int]:
    return {s: (course.root / "autograded" / s / SLUG / f"{SLUG}.ipynb").stat().st_mtime_ns
            for s in STUDENTS if (course.root / "autograded" / s / SLUG / f"{SLUG}.ipynb").exists()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    found = Cluster(tmp_path_factory.mktemp("dask"))
    try:
        found.start(workers=2)
        yield found
    finally:
        found.stop()


@pytest.fixture(scope="module")
def courses(tmp_path_factory):
    """The class batch, and the same batch graded locally (the reference)."""
    course = Course(tmp_path_factory.mktemp("class"), [SLUG])
    model = solutions(SLUG)
    wrong = {1: {"linear": "raise NotImplementedError"},
             2: {"clipped_relu": model["clipped_relu"].replace("(x > 0) & (x < ctx.clip)", "x > 0")}}
    for k, student in enumerate(STUDENTS):
        course.submit(student, SLUG, {**model, **wrong.get(k % 3, {})})
    local = clone(course, tmp_path_factory.mktemp("local"))
    result = grade(local, "--jobs", "2")
    assert result.returncode == 0, result.stderr
    return course, local


def test_the_class_graded_on_the_cluster_equals_the_local_run(cluster, courses, tmp_path):
    course, local = courses
    remote = clone(course, tmp_path / "remote")
    result = grade(remote, "--scheduler", cluster.address)
    assert result.returncode == 0, result.stderr
    assert "Dask cluster" in result.stderr and "bubblewrap sandbox" in result.stderr
    assert run_state(remote, SLUG) == run_state(local, SLUG)
    assert sorted(r["student"] for r in _last_run(remote)) == STUDENTS
    assert {r["status"] for r in _last_run(remote)} == {r["status"] for r in _last_run(local)}
    # The autograded notebooks hold the same outputs, test cells included (what the checks printed).
    for student in STUDENTS:
        ours, theirs = (json.loads((c.root / "autograded" / student / SLUG / f"{SLUG}.ipynb").read_text())
                        for c in (remote, local))
        assert [c.get("outputs") and [o.get("output_type") for o in c["outputs"]] for c in ours["cells"]] == \
               [c.get("outputs") and [o.get("output_type") for o in c["outputs"]] for c in theirs["cells"]]



@pytest.fixture
def faults(pytestconfig):
    """Killing a Dask worker or the scheduler mid-run is `make faults`' (--faults-all)."""
    if not pytestconfig.getoption("--faults-all"):
        pytest.skip("a Dask worker or scheduler killed mid-run: make faults")


def test_a_dask_worker_killed_mid_notebook_loses_nothing_and_grades_nothing_twice(faults, cluster, courses, tmp_path):
    _, local = courses
    course = clone(local, tmp_path / "course")
    grader = subprocess.Popen([AUTOGRADER, "grade", "--force", "--scheduler", cluster.address], cwd=course.root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 180
    while killed is None and time.monotonic() < deadline and grader.poll() is None:
        worker = cluster.dask_worker_running_a_notebook()
        if worker is not None:
            worker.kill()  # SIGKILL: the Dask worker and, with it, its sandboxed workers and the notebook
            killed = worker
        time.sleep(0.02)
    _, stderr = grader.communicate(timeout=600)
    assert killed is not None, f"no notebook was seen running on a Dask worker: {stderr}"
    assert grader.returncode == 0, stderr
    rows = _last_run(course)
    assert sorted(r["student"] for r in rows) == STUDENTS  # each saved once: none lost, none twice
    ours, theirs = run_state(course, SLUG), run_state(local, SLUG)
    for part in ours:
        assert ours[part] == theirs[part], ({k: v for k, v in ours[part].items() if theirs[part].get(k) != v}
                                            if isinstance(ours[part], dict) else rows)
    cluster.wait_for(2)  # its nanny started it again


def test_the_scheduler_gone_stops_the_run_and_a_rerun_grades_only_the_rest(faults, cluster, courses, tmp_path):
    ungraded, local = courses
    course = clone(ungraded, tmp_path / "course")
    cluster.stop()  # a cluster of its own (one worker), the same code as this grader's
    cluster.start(workers=1)
    grader = subprocess.Popen([AUTOGRADER, "grade", "--scheduler", cluster.address], cwd=course.root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and grader.poll() is None:
        if len(_graded_at(course)) >= 2:
            break
        time.sleep(0.02)
    os.killpg(cluster.scheduler.pid, signal.SIGKILL)
    _, stderr = grader.communicate(timeout=120)
    assert grader.returncode == 4, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Dask scheduler" in errors[0] and "run again" in errors[0], stderr
    assert "Traceback" not in stderr, stderr
    saved = _graded_at(course)
    assert 2 <= len(saved) < len(STUDENTS)

    cluster.stop()  # its worker ended with its scheduler: a new cluster, as an instructor would start one
    cluster.start(workers=1)
    result = grade(course, "--scheduler", cluster.address)
    assert result.returncode == 0, result.stderr
    assert sorted(r["student"] for r in _last_run(course)) == sorted(set(STUDENTS) - set(saved))
    assert all(_graded_at(course)[s] == at for s, at in saved.items())  # what was saved stays, not graded again
    assert run_state(course, SLUG) == run_state(local, SLUG)


def test_a_scheduler_that_is_not_there_is_one_line(courses):
    course, _ = courses
    result = subprocess.run([AUTOGRADER, "grade", "--scheduler", "tcp://127.0.0.1:9"], cwd=course.root,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "could not be reached" in errors[0] and "Traceback" not in result.stderr
    assert not (course.root / "autograded").exists()
