"""The exercise registry (autograder/registry.py) finds every part of every exercise, and
`autograder exercise` prints them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from autograder import authoring, registry


def test_every_exercise_has_graded_cells_a_check_and_known_wrong_answers():
    exercises = registry.exercises()
    assert {e.slug for e in exercises.values()} == set(authoring.assignments())
    for grade_id, exercise in exercises.items():
        assert exercise.graded and any(c.hidden for c in exercise.graded), grade_id
        assert exercise.checks, f"{grade_id}: its graded cells call none of the course's checks"
        for check in exercise.checks:
            path, line = check.where.rsplit(":", 1)
            assert (authoring.ROOT / path).is_file() and int(line) > 0, check
        wrong, _ = registry.known_answers(grade_id)
        assert wrong, f"{grade_id}: no known wrong answer in tests/answers"


def test_one_exercise_followed_through():
    exercise = registry.exercises()["conv2d"]
    assert exercise.slug == "04_gradient_patterns" and "Conv2d" in exercise.heading
    assert [c.grade_id for c in exercise.graded] == ["check_conv2d", "check_conv2d_hidden"]
    (check,) = exercise.checks
    assert check.name == "autograder.exercises.gradient_patterns.check_conv2d" and check.specs == ("CONV2D",)
    assert check.where.startswith("autograder/exercises/gradient_patterns.py:")


def test_the_command_prints_it_and_names_a_missing_one_in_a_line():
    autograder = str(Path(sys.executable).with_name("autograder"))
    shown = subprocess.run([autograder, "exercise", "conv2d"], capture_output=True, text=True)
    assert shown.returncode == 0 and "pytest -m conv2d" in shown.stdout and "check_conv2d_hidden" in shown.stdout
    missing = subprocess.run([autograder, "exercise", "conv"], capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.strip() == "error: no exercise 'conv' (did you mean conv2d?)"
