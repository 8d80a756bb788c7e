"""`make gpu-check` (bench/gpu_check.py) runs where the GPU machine's python3 has only torch and
numpy: here it runs on the CPU, in such a bare interpreter, and says what it skipped."""
from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import gpu_check  # noqa: E402
import notebook_run  # noqa: E402
from answers import devices, for_notebook  # noqa: E402
from autograder.student import devices as student_devices  # noqa: E402
from autograder.student import setup  # noqa: E402


def _requirements(name: str, seen: set[str]) -> None:
    """`name` and every distribution it requires (extras aside), installed here."""
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return
    seen.add(key)
    for requirement in dist.requires or []:
        if "extra ==" not in requirement:
            _requirements(re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0], seen)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python with the standard library, torch and numpy only (this machine's, linked): what
    the GPU machine offers."""
    root = tmp_path_factory.mktemp("bare")
    wanted: set[str] = set()
    for name in ("torch", "numpy"):
        _requirements(name, wanted)
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
    report = json.loads((tmp_path / "report.json").read_text())
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
