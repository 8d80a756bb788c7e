"""Answers students could submit, per notebook: wrong ones that must lose points and
unusual correct ones that must keep them all (graded end to end by test_grading.py).

Each module is named after a notebook without its number (`function_basics` for
`03_function_basics`) and defines MUTANTS and VARIANTS, lists of `Answer`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    exercise: str  # grade_id of the answer cell
    label: str  # the student's mistake, or what is unusual about a correct answer
    edits: tuple[tuple[str, str], ...] = ()  # (old, new) replacements in the model solution
    source: str | None = None  # or the whole cell
    flag: str | None = None  # why `autograder grade` flags it for a person (honest, yet worth a look)

    def apply(self, solution: str) -> str:
        if self.source is not None:
            return self.source
        for old, new in self.edits:
            if solution.count(old) != 1:
                raise ValueError(f"{self.exercise} / {self.label}: {old!r} must occur exactly once")
            solution = solution.replace(old, new)
        return solution


def wrong(exercise: str, label: str, *edits: tuple[str, str], source: str | None = None, flag: str | None = None) -> Answer:
    return Answer(exercise, label, tuple(edits), source, flag)


right = wrong


def for_notebook(slug: str):
    """The answers module of notebook `slug` (e.g. 03_function_basics)."""
    return importlib.import_module(f"answers.{slug.split('_', 1)[1]}")
