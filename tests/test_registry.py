"""The exercise registry (autograder/registry.py) finds every part of every exercise, and
`autograder exercise` prints them."""
from __future__ import annotations

from autograder import authoring, registry


def test_every_exercise_has_graded_cells_a_check_and_known_wrong_answers():
    exercises = registry.exercises()
    assert {e.slug for e in exercises} == set(authoring.assignments())
    assert len({(e.slug, e.grade_id) for e in exercises}) == len(exercises) > 50
    for exercise in exercises:
        grade_id = f"{exercise.slug}/{exercise.grade_id}"
        assert exercise.graded and any(c.hidden for c in exercise.graded), grade_id
        assert exercise.checks, f"{grade_id}: its graded cells call none of the course's checks"
        for check in exercise.checks:
            path, line = check.where.rsplit(":", 1)
            assert (authoring.ROOT / path).is_file() and int(line) > 0, check
        wrong, _ = registry.known_answers(exercise)
        assert wrong, f"{grade_id}: no known wrong answer in tests/answers"


def test_one_exercise_followed_through():
    (exercise,) = registry.named("conv2d")
    assert exercise.slug == "04_gradient_patterns" and "Conv2d" in exercise.heading
    assert [c.grade_id for c in exercise.graded] == ["check_conv2d", "check_conv2d_hidden"]
    (check,) = exercise.checks
    assert check.name == "autograder.exercises.gradient_patterns.check_conv2d" and check.specs == ("CONV2D",)
    assert check.where.startswith("autograder/exercises/gradient_patterns.py:")


def test_the_command_prints_it_and_names_a_missing_one_in_a_line():
    from typer.testing import CliRunner

    from autograder.cli import app

    def run(*args: str):
        return CliRunner().invoke(app, ["exercise", *args])

    shown = run("conv2d")
    assert shown.exit_code == 0 and "pytest -m conv2d" in shown.stdout and "check_conv2d_hidden" in shown.stdout
    both = run("hvp")
    assert both.stdout.count("[hvp]") == 2  # a grade_id is unique within its notebook only
    assert "02_higher_order_and_fusion" in both.stdout and "07_double_backward" in both.stdout
    missing = run("conv")
    assert missing.exit_code == 2 and missing.stderr.strip() == "error: no exercise 'conv' (did you mean conv2d?)"
