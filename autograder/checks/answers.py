"""Checks for written answers: multiple choice and matching questions."""
from __future__ import annotations

from typing import Collection, Mapping

from ..student.report import fail, note, passed


def _normalise(value: object) -> str:
    return " ".join(str(value).strip().lower().split())


def check_answers(
    answers: object,
    choices: Collection[str],
    questions: Collection[str],
    *,
    key: Mapping[str, str] | None = None,
    points: float | None = None,
) -> float | None:
    """Check a dict of answers {question: choice}.

    Without `key` only the form is checked (every question answered with one of
    `choices`). With `key`, each answer is compared; with `points` too the share of
    correct answers is returned (nbgrader gives partial credit for a number as the last
    expression of a test cell), otherwise any wrong answer fails.
    """
    __tracebackhide__ = True
    allowed = {_normalise(c) for c in choices}
    if not isinstance(answers, Mapping):
        fail(f"answers must be a dict {{question: choice}}, got {type(answers).__name__}.")
    missing = [q for q in questions if q not in answers]
    extra = [q for q in answers if q not in questions]
    if missing or extra:
        fail(
            "answers must have exactly the questions " + ", ".join(map(repr, questions)) + ".",
            *(["missing: " + ", ".join(map(repr, missing))] if missing else []),
            *(["unexpected: " + ", ".join(map(repr, extra))] if extra else []),
        )
    invalid = {q: a for q, a in answers.items() if _normalise(a) not in allowed}
    if invalid:
        fail(
            "every answer must be one of " + ", ".join(map(repr, choices)) + ".",
            *(f"{q!r}: {a!r}" for q, a in invalid.items()),
        )
    if key is None:
        passed(f"{len(questions)} answers, each one of the allowed choices. They are graded when you submit.")
        return None
    wrong = [q for q in questions if _normalise(answers[q]) != _normalise(key[q])]
    if points is None:
        if wrong:
            fail(f"{len(wrong)} of {len(questions)} answers are wrong: " + ", ".join(map(repr, wrong)) + ".")
        passed(f"all {len(questions)} answers are right.")
        return None
    right = len(questions) - len(wrong)
    passed(f"{right} of {len(questions)} answers are right.")
    if wrong:
        note("wrong: " + ", ".join(map(repr, wrong)))
    return round(points * right / len(questions), 6)
