"""Grading is reproducible and equal: every check draws from a seed derived from the
course's secret and the cell, the same for every student; a regrade repeats every score,
output and message; a verdict can be replayed; rotating the secret is one command."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autograder.checks import inputs
from engine_course import grade, notebook, solutions
from grading import Course

SLUG = "03_function_basics"
# Two students with the same bug, wrong on part of the input space only (negative inputs).
HALF_WRONG = ("return x.clamp(0, clip)", "return x.clamp(max=clip).abs()")


def _draw(seed) -> torch.Tensor:
    return inputs.uniform((4,), inputs.generator(seed))


def test_a_cell_draws_the_same_inputs_every_time_and_other_cells_others():
    with inputs.seeded(inputs.cell_seed(b"k", "a", "nb", "cell")):
        first = [_draw(0), _draw(None), _draw(0)]
    with inputs.seeded(inputs.cell_seed(b"k", "a", "nb", "cell")):
        again = [_draw(0), _draw(None), _draw(0)]
    with inputs.seeded(inputs.cell_seed(b"k", "a", "nb", "other")):
        other = _draw(0)
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not torch.equal(first[0], first[2])  # the second check of a cell draws anew
    assert not torch.equal(first[0], other) and not torch.equal(first[0], _draw(0))  # nor a visible check's inputs
    assert inputs.cell_seed(b"k", "a") != inputs.cell_seed(b"other secret", "a")


def _autograder(course: Course, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("autograder")), *args], cwd=course.root,
                          capture_output=True, text=True, timeout=600)


def _judged(course: Course, student: str) -> dict:
    """Every test cell's outputs and score, as the autograded notebook and gradebook hold them."""
    nb = notebook(course, "autograded", student, SLUG)
    outputs = {c.metadata.nbgrader.grade_id: c.outputs for c in nb.cells
               if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("check")}
    return {"outputs": outputs, "scores": course.scores(SLUG, student), "seeds": nb.metadata["autograder"]["seeds"]}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = Course(tmp_path_factory.mktemp("reproducible"), [SLUG])
    model = solutions(SLUG)
    bug = {**model, "clipped_relu": model["clipped_relu"].replace(*HALF_WRONG)}
    assert bug["clipped_relu"] != model["clipped_relu"]
    for student, answers in (("model", model), ("bug_a", bug), ("bug_b", bug)):
        course.submit(student, SLUG, answers)
    first = grade(course, SLUG, "--jobs", "2")
    assert first.returncode == 0, first.stderr
    assert "Made the course's grading secret" in first.stderr
    return course


@pytest.mark.slow
def test_a_regrade_repeats_every_score_output_and_message_and_equal_answers_score_equally(course):
    before = {s: _judged(course, s) for s in ("model", "bug_a", "bug_b")}
    assert before["bug_a"] == before["bug_b"]
    assert sum(score for score, _ in before["bug_a"]["scores"].values()) < sum(
        score for score, _ in before["model"]["scores"].values())
    again = grade(course, SLUG, "--jobs", "2", "--force")
    assert again.returncode == 0, again.stderr
    assert {s: _judged(course, s) for s in before} == before


@pytest.mark.slow
def test_a_verdict_replays_and_survives_a_rotated_secret(course):
    cell = next(g for g in _judged(course, "bug_a")["scores"] if g.startswith("check_clipped_relu"))
    replayed = _autograder(course, "replay", SLUG, "bug_a", cell)
    assert replayed.returncode == 0 and "the same verdict" in replayed.stdout, replayed.stdout + replayed.stderr
    seeds = _judged(course, "bug_a")["seeds"]
    rotated = _autograder(course, "secret", "--rotate")
    assert rotated.returncode == 0 and "new grading secret" in rotated.stdout
    still = _autograder(course, "replay", SLUG, "bug_a", cell)  # from the seeds its notebook recorded
    assert still.returncode == 0 and "the same verdict" in still.stdout, still.stdout + still.stderr
    assert grade(course, SLUG, "--force", "-s", "model").returncode == 0
    assert _judged(course, "model")["seeds"] != seeds


@pytest.mark.slow
def test_a_hidden_cell_shows_the_student_no_input_and_the_instructor_every_one(course):
    """bug_a fails the hidden check: its feedback names shapes and the first entry that
    differs, no input; `autograder replay` repeats that verdict and then shows the same cell
    with its inputs."""
    cell = "check_clipped_relu_hidden"
    seen = "".join(o.get("text", "") + o.get("ename", "") + o.get("evalue", "")
                   for o in _judged(course, "bug_a")["outputs"][cell])
    assert "CheckFailed" in seen and "a float64 tensor of shape" in seen, seen
    assert "entries differ; first at index" in seen and "tensor([" not in seen, seen
    replayed = _autograder(course, "replay", SLUG, "bug_a", cell)
    assert replayed.returncode == 0 and "the same verdict" in replayed.stdout, replayed.stdout + replayed.stderr
    student, instructor = replayed.stdout.split("with every value shown")
    assert "tensor([" not in student and "x = tensor([" in instructor


def test_a_secret_is_made_whole_or_not_at_all_and_a_damaged_one_is_one_line(tmp_path, monkeypatch):
    """A full disk while the secret is made leaves no empty secret behind (which the next run
    would read as another secret); a damaged one stops grading with one line."""
    import errno
    import os

    from autograder.grader import secret

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", full)
        with pytest.raises(OSError):
            secret.load(tmp_path)
    assert not list((tmp_path / ".autograder").iterdir())
    (tmp_path / "nbgrader_config.py").write_text("")
    secret.path(tmp_path).write_text("12ab\n")
    told = subprocess.run([str(Path(sys.executable).with_name("autograder")), "secret", "--course", str(tmp_path)],
                          capture_output=True, text=True)
    assert told.returncode == 1 and told.stdout == "" and len(told.stderr.strip().splitlines()) == 1, told.stderr
    assert "does not hold a secret of 32 bytes" in told.stderr and "--rotate" in told.stderr


def test_a_release_reminds_to_rotate_a_secret_made_before_it(tmp_path, capsys):
    """A new term's class must not draw the inputs the last class drew: a release that finds
    a secret says when it was made and how to rotate it; without one it says nothing."""
    from autograder import cli
    from autograder.grader import secret

    cli._remind_to_rotate(tmp_path)
    assert capsys.readouterr().out == ""
    secret.load(tmp_path)
    cli._remind_to_rotate(tmp_path)
    said = capsys.readouterr().out
    assert "grading secret was made on" in said and "autograder secret --rotate" in said
