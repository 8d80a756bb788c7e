"""`make gpu-check` (bench/gpu_check.py) runs where the GPU machine's python3 has only torch and
numpy: here it runs on the CPU, in such a bare interpreter, and says what it skipped."""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import gpu_check  # noqa: E402
import gpu_grade  # noqa: E402
import notebook_run  # noqa: E402
from answers import devices, for_notebook  # noqa: E402
from autograder.student import devices as student_devices  # noqa: E402
from autograder.student import setup  # noqa: E402


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python with the standard library, torch and numpy only (this machine's, linked): what
    the GPU machine offers."""
    root = tmp_path_factory.mktemp("bare")
    wanted = gpu_grade.requirements(["torch", "numpy"])
    linked = root / "packages"
    linked.mkdir()
    for dist in importlib.metadata.distributions():
        if re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower() not in wanted:
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or []} - {"..", "__pycache__", "bin"}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (linked / top).exists():
                (linked / top).symlink_to(source)
    venv = root / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "bare.pth").write_text(f"{linked}\n")
    return python


@pytest.mark.slow
def test_the_quick_check_runs_in_a_bare_python_and_says_what_it_skipped(bare_python, tmp_path):
    missing = subprocess.run([bare_python, "-c", "import torch, numpy\nfor m in ('nbgrader', 'nbformat', 'IPython', "
                              "'typer', 'rich', 'jupyter_client'):\n    try:\n        __import__(m)\n"
                              "    except ImportError:\n        print(m)"], capture_output=True, text=True)
    assert missing.stdout.split() == ["nbgrader", "nbformat", "IPython", "typer", "rich", "jupyter_client"], missing

    done = subprocess.run([bare_python, "bench/gpu_check.py", str(tmp_path), "--quick", "--jobs", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    finished = re.findall(r"^\[ *\d+ s\] 03_function_basics (\w+) \(CPU\): ok \(", done.stdout, re.M)
    assert sorted(finished) == ["device0", "device1", "model"], done.stdout  # one line per task, as it ends
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["complete"] and not report["not_run"]
    (notebook,) = report["notebooks"]
    assert notebook["notebook"] == "03_function_basics" and notebook["failed"] == 0
    assert notebook["model_points"][0] == notebook["model_points"][1] > 0
    assert not report["problems"]
    rows = {d["bug"]: d for d in report["devices"]}
    assert set(rows) == {a.label for a in devices.MUTANTS["03_function_basics"]}
    for answer in devices.MUTANTS["03_function_basics"]:
        row = rows[answer.label]
        if torch.cuda.is_available():
            assert row["verdict"] == "ok", row
        elif answer.device == "cuda":
            assert row["verdict"] == "skipped: only a GPU run catches it", row
        else:
            assert row["verdict"] == "ok" and row["caught"] == answer.device, row
    table = (tmp_path / "report.md").read_text()
    assert f"| 03_function_basics | {notebook['cells']}/{notebook['cells']} | 0 | 0 |" in table
    if not torch.cuda.is_available():
        assert "skipped: no CUDA" in table and "every CUDA run (no CUDA device)" in table
    assert "the class batch with the real grader: --quick" in table


class Clock:
    """gpu_check's time, moved on by the fake tasks alone."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def strftime(self, form: str) -> str:
        return "a day"


def test_the_most_valuable_work_comes_first_and_none_starts_that_cannot_end_within_the_budget(tmp_path,
                                                                                               monkeypatch):
    clock, ran, reports = Clock(), [], []

    def run(task, models, out, cuda, deadline):  # every notebook takes 30 s, the class batch 50
        reports.append(json.loads((out / "report.json").read_text()) if ran else None)
        ran.append((task, clock.now))
        clock.now += 50 if task.name == "class-batch" else 30
        task.result = {"table": "graded", "problems": []} if task.name == "class-batch" else {"cells": []}
        task.ended, task.seconds = True, 50 if task.name == "class-batch" else 30
        return task

    monkeypatch.setattr(gpu_check, "time", clock)
    monkeypatch.setattr(gpu_check, "run", run)
    monkeypatch.setattr(gpu_grade, "RUNS", 2)  # the class batch: 2 runs of its notebook, 60 s
    slugs = ["03_function_basics", "04_gradient_patterns"]
    todo = gpu_check.tasks(slugs, cuda=True, quick=False, class_batch=True)
    args = argparse.Namespace(out=tmp_path, budget=300, jobs=1, quick=False, class_batch=True)
    env = {"python": "3", "torch": "2", "cuda": "13.0", "device": "a GPU", "cores": 1}
    report = gpu_check.schedule(todo, args, {}, True, gpu_check.Report(args, env, todo, clock.now))

    assert [t.name for t, _ in ran[:2]] == ["model", "model"]  # every notebook's model answers on CUDA first
    only_cuda = [t for t in todo if t.part == 1]
    assert only_cuda and all(a.device == "cuda" and t.slug == "04_gradient_patterns" for t in only_cuda
                             for a in t.answers)  # 03 has no device bug only CUDA catches
    assert [t.part for t, _ in ran] == sorted(t.part for t, _ in ran)
    assert ran[2 + len(only_cuda)][0].name == "class-batch"
    for task, start in ran:  # each started where its estimate (the slowest run of its notebook, x1.25) fits
        assert start + (60 if task.name == "class-batch" else 1.25 * 30 if start else 0) <= 300
    assert clock.now <= 300 and len(ran) < len(todo)
    assert report["not_run"] == [t.label for t in todo if t not in [r for r, _ in ran]] and not report["complete"]
    for finished, written in enumerate(reports[1:], 1):  # rewritten after every task, incomplete meanwhile
        assert sum(p["tasks"][0] for p in written["parts"]) == finished and not written["final"]
    assert reports[1]["notebooks"][0]["notebook"] == "03_function_basics"
    table = (tmp_path / "report.md").read_text()
    assert f"INCOMPLETE: {len(report['not_run'])} task(s) left out for time" in table
    assert "## Not run: left out for time" in table and "graded" in table


def test_a_task_the_budget_stops_is_not_run_and_one_past_its_own_limit_scores_what_it_finished(tmp_path,
                                                                                                 monkeypatch):
    stopped = gpu_check.Finished('{"slug": "03_function_basics"}\n', "", -15, 1.0, timed_out=True)
    monkeypatch.setattr(gpu_check, "run_process", lambda argv, timeout, env: stopped)
    models = {"03_function_basics": {}}
    by_budget = gpu_check.run(gpu_check.Task("03_function_basics", "model", 0), models, tmp_path, False,
                              time.monotonic() + 30)
    assert by_budget.stopped_for_time and not by_budget.finished
    by_own_limit = gpu_check.run(gpu_check.Task("03_function_basics", "model", 0), models, tmp_path, False,
                                 time.monotonic() + 1000)
    assert by_own_limit.finished and by_own_limit.result == {"slug": "03_function_basics", "cells": []}
    assert by_own_limit.error == "stopped after 120 s: the cells it did not finish score 0"


def test_what_it_cannot_start_without_is_said_in_one_line(tmp_path, monkeypatch):
    without_site = subprocess.run([sys.executable, "-S", "bench/gpu_check.py", str(tmp_path / "out")], cwd=REPO,
                                  capture_output=True, text=True, timeout=60)  # -S: no torch, no numpy
    assert without_site.returncode == 2 and not without_site.stdout
    assert without_site.stderr == (f"error: {sys.executable} has no torch: run this with a Python that has torch and "
                                   f"numpy (here: make gpu-check PYTHON=.venv/bin/python; on the GPU machine: its "
                                   f"python3)\n")

    args = argparse.Namespace(out=tmp_path / "out", class_batch=False)
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "numpy" else found(name))
    assert gpu_check.refusal(args).startswith(f"{sys.executable} has no numpy: ")
    monkeypatch.setattr(importlib.util, "find_spec", found)
    assert gpu_check.refusal(args) is None
    (tmp_path / "a_file").write_text("")
    assert gpu_check.refusal(argparse.Namespace(out=tmp_path / "a_file" / "out", class_batch=False)) == (
        f"cannot write the report to {tmp_path / 'a_file' / 'out'}: Not a directory")

    args.class_batch = True  # the class batch needs the wheels and a bubblewrap
    for name, path in (("REPO", ""), ("CARRIED", "build/gpu-check"), ("WHEELS", "build/gpu-check/wheels"),
                       ("BWRAP", "build/gpu-check/bin/bwrap")):
        monkeypatch.setattr(gpu_grade, name, tmp_path / path)
    assert gpu_check.refusal(args) == ("no wheels in build/gpu-check/wheels for the class batch: run `make gpu-wheels` "
                                       "where PyPI is reached, and carry build/gpu-check; or pass --no-class-batch "
                                       "to run without it")
    gpu_grade.WHEELS.mkdir(parents=True)
    (gpu_grade.WHEELS / "python-version").write_text("2.7\n")
    assert "are for Python 2.7, this is Python 3." in gpu_check.refusal(args)
    (gpu_grade.WHEELS / "python-version").write_text(f"{sys.version_info.major}.{sys.version_info.minor}\n")
    monkeypatch.setattr(gpu_grade.shutil, "which", lambda name: None)
    assert gpu_check.refusal(args).startswith("no bubblewrap (bwrap) here: none carried in build/gpu-check/bin, none "
                                              "installed (make gpu-wheels")
    gpu_grade.BWRAP.parent.mkdir()
    gpu_grade.BWRAP.write_text("#!/bin/sh\necho 'bwrap: libcap.so.2: not found' >&2; exit 127\n")
    gpu_grade.BWRAP.chmod(0o755)
    said = gpu_check.refusal(args)
    assert "here: the one carried does not run (bwrap: libcap.so.2: not found), none installed" in said
    monkeypatch.setattr(gpu_grade.shutil, "which", lambda name: "/usr/bin/bwrap")
    assert gpu_check.refusal(args) is None


def _ended(pid: str) -> None:
    left = Path(f"/proc/{pid}/stat")
    for _ in range(100):  # killed: it ends (a zombie until init reaps it) once the kernel has delivered that
        if not left.exists() or left.read_text().split()[2] == "Z":
            return
        time.sleep(0.1)
    raise AssertionError(f"a process the task started still runs: {left.read_text()}")


def test_a_task_ends_with_all_it_started_and_its_cpu_is_counted():
    start = ("import subprocess, sys, time\n"
             "print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']).pid, flush=True)\n"
             "sum(i * i for i in range(2_000_000))\n")
    done = gpu_check.run_process([sys.executable, "-c", start], 60, {})  # ends, leaving a process behind
    assert not done.timed_out and done.returncode == 0 and done.cpu_seconds > 0
    _ended(done.stdout.strip())
    done = gpu_check.run_process([sys.executable, "-c", start + "time.sleep(60)\n"], 2, {})  # stopped for time
    assert done.timed_out and done.returncode < 0 and done.cpu_seconds > 0
    _ended(done.stdout.strip())


def test_an_environment_made_from_a_virtual_environment_gets_its_packages_linked_in(tmp_path):
    """The GPU machine's python3 is a virtual environment: a new one made from it, with its
    system site-packages, sees the base Python's packages, not its own torch and numpy (here: mistune)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import mistune"], capture_output=True).returncode == 0:
        pytest.skip("this Python's base installation has mistune")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    assert gpu_grade.with_own(["mistune"], python, site).startswith("linked in: ")
    seen = subprocess.run([python, "-I", "-c", "import mistune; print(mistune.__file__)"], capture_output=True,
                          text=True)
    assert seen.stdout.startswith(str(site)), seen.stderr


def test_every_device_bug_applies_and_says_where_it_is_caught():
    """...and is among its notebook's known wrong answers (graded by test_grading.py)."""
    for slug, answers in devices.MUTANTS.items():
        model = {c.grade_id: notebook_run.model_solution(c.source)
                 for c in notebook_run.cells(slug) if c.kind == "answer"}
        assert all(a in for_notebook(slug).MUTANTS for a in answers)
        for answer in answers:
            assert answer.device in ("cpu", "meta",
                                     "cuda") and answer.apply(model[answer.exercise]) != model[answer.exercise]


def _cells(*specs: tuple[str, str, float]) -> list[notebook_run.Cell]:
    return [notebook_run.Cell(k, f"cell{k}", kind, source, points) for k, (kind, source, points) in enumerate(specs)]


def test_cells_run_as_a_kernel_runs_them_and_are_scored_as_nbgrader_scores_them(monkeypatch):
    cells = _cells(
        ("demo", "%matplotlib inline\nx = 2", 0),
        ("answer", "### BEGIN SOLUTION\ny = x * 3\n### END SOLUTION", 0),
        ("check", "assert y == 6", 1),
        ("hidden", "import sys\nprint('harmless?', file=sys.stderr)", 2),  # nbgrader: 0 for writing to stderr
        ("hidden", "1.5", 3),  # partial credit
        ("demo", "import a_module_this_machine_lacks", 0),
        ("check", "assert y == 7, 'y is not 7'", 1),
    )
    monkeypatch.setattr(notebook_run, "cells", lambda slug: cells)
    results = list(notebook_run.run("fake"))
    assert [r.status for r in results] == ["ok", "ok", "ok", "ok", "ok", "skipped", "failed"]
    assert "1 IPython magic" in results[0].error
    assert [r.score for r in results if r.points] == [1, 0, 1.5, 0]
    assert "wrote to stderr" in results[3].error and "y is not 7" in results[6].error
    assert results[5].error == "needs a_module_this_machine_lacks, not installed here"
    assert [e.graded for e in notebook_run.exercises(cells)] == [["cell2", "cell3", "cell4", "cell6"]]


def test_where_a_failure_was_caught():
    assert gpu_check.caught_by(["on another device (meta) forward ..."], cuda=False) == "meta"
    assert gpu_check.caught_by(["AssertionError: Torch not compiled with CUDA enabled"], cuda=False) == "cpu"
    assert gpu_check.caught_by(["expected device cuda:0 but got cpu"], cuda=True) == "cuda"
    assert [name for name, _ in gpu_check.packed("device", devices.MUTANTS["03_function_basics"])] == ["device0",
                                                                                                       "device1"]


def test_the_setup_cell_says_where_the_checks_run_and_what_was_skipped(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    setup()
    assert "checks run on cpu (cuda skipped: no CUDA device here; on a GPU runtime" in capsys.readouterr().out
    assert student_devices.available() == ["cpu"] and "did not run on CUDA" in student_devices.NO_CUDA
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU runtime, as Colab's
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Tesla T4")
    setup()
    assert "checks run on cpu and cuda (Tesla T4)." in capsys.readouterr().out
    assert student_devices.available() == ["cpu", "cuda"]
