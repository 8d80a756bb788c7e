"""`autograder grade` as an instructor meets it: help, and clear errors before anything runs."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

AUTOGRADER = str(Path(sys.executable).with_name("autograder"))


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([AUTOGRADER, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_help_explains_every_option():
    result = run("grade", "--help")
    assert result.returncode == 0
    for words in ("--student", "--force", "--jobs", "--timeout", "--memory", "--no-sandbox", "--db", "--course",
                  "--feedback", "submitted/STUDENT/ASSIGNMENT", "generate_feedback", "flagged"):
        assert words in result.stdout, words
    assert "release" in run("--help").stdout and "grade" in run("--help").stdout


def test_no_submissions_is_a_clear_error(tmp_path):
    result = run("grade", cwd=tmp_path)
    assert result.returncode == 2 and "no submissions found" in result.stderr and "zip_collect" in result.stderr


def test_an_unreleased_assignment_is_a_clear_error(tmp_path):
    (tmp_path / "submitted" / "alice" / "ps1").mkdir(parents=True)
    result = run("grade", cwd=tmp_path)
    assert result.returncode == 2 and "'ps1' is not in the gradebook" in result.stderr
