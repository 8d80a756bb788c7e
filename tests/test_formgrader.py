"""Grading in formgrader and with stock nbgrader, in this course. Formgrader's ⚡ Autograde
button runs `autograder grade` (autograder/grader/formgrader.py; clicked in a real browser in
tests/test_browser_lab.py): here, what it answers when the engine refuses. Stock `nbgrader
autograde` runs a student's code beside the hidden tests: it refuses in one line that names
`autograder grade`, before it reads or writes anything, and runs only on purpose
(NBGRADER_STOCK_AUTOGRADE=1: the comparisons with stock nbgrader, tests/test_engine_scores.py
and `make bench`)."""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.authoring import ROOT
from autograder.grader.formgrader import autograde

pytestmark = pytest.mark.slow  # stock nbgrader and the grader start in seconds
NBGRADER = Path(sys.executable).with_name("nbgrader")


def test_the_button_answers_the_engines_refusal_as_formgraders_error(tmp_path):
    """Ids are ids, never options (`--help` would print the help and succeed)."""
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path)
    result = asyncio.run(autograde(tmp_path, "--help", "--help"))
    assert result["success"] is False and "Usage" not in result["log"], result
    assert result["log"].startswith("$ autograder grade --help --student --help --force\n"), result
    assert result["error"].startswith("error: there are no submissions yet"), result  # the engine's one line


def _stock(root: Path, command: list[str], **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "NBGRADER_STOCK_AUTOGRADE"}
    return subprocess.run([*command, "autograde", "03_function_basics", "--force"], cwd=root, capture_output=True,
                          text=True, timeout=300, env={**environment, **env})


@pytest.mark.parametrize("command", [[str(NBGRADER)], [sys.executable, "-m", "nbgrader"]], ids=["nbgrader", "-m"])
def test_stock_autograde_refuses_in_one_line_naming_the_engine(tmp_path, command):
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path)
    done = _stock(tmp_path, command)
    assert done.returncode == 1
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert "autograder grade" in done.stderr and "NBGRADER_STOCK_AUTOGRADE=1" in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nbgrader_config.py"]  # nothing made (no gradebook)


def test_stock_autograde_runs_on_purpose(tmp_path):
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path)
    done = _stock(tmp_path, [str(NBGRADER)], NBGRADER_STOCK_AUTOGRADE="1")
    assert "autograder grade" not in done.stderr
    assert "No notebooks were matched" in done.stderr, done.stderr  # nbgrader's own run, on an empty course
