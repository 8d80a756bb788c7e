"""Answers students could submit, per notebook: wrong ones that must lose points and
unusual correct ones that must keep them all (graded end to end by test_grading.py).

Each module is named after a notebook without its number (`function_basics` for
`03_function_basics`, `memory_checkpointing` for 08's part 2, `08_memory_checkpointing`) and
defines MUTANTS and VARIANTS, lists of `Answer`; the device bugs of every notebook are in
`devices` (for_notebook adds them to the notebook's own).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import SimpleNamespace

# Where a device bug is caught (Answer.device): "cpu" (it fails on the CPU already), "meta" (the
# checks' run on the meta device catches it on any machine), "cuda" (only a run on a GPU does).
CAUGHT_ON = ("cpu", "meta", "cuda")


@dataclass(frozen=True)
class Answer:
    exercise: str  # grade_id of the answer cell
    label: str  # the student's mistake, or what is unusual about a correct answer
    edits: tuple[tuple[str, str], ...] = ()  # (old, new) replacements in the model solution
    source: str | None = None  # or the whole cell
    flag: str | None = None  # why `autograder grade` flags it for a person (honest, yet worth a look)
    device: str | None = None  # a device bug: the run that catches it (CAUGHT_ON)

    def __post_init__(self) -> None:
        if self.device not in (None, *CAUGHT_ON):
            raise ValueError(f"{self.exercise} / {self.label}: device must be one of {CAUGHT_ON}")

    def apply(self, solution: str) -> str:
        if self.source is not None:
            return self.source
        for old, new in self.edits:
            if solution.count(old) != 1:
                raise ValueError(f"{self.exercise} / {self.label}: {old!r} must occur exactly once")
            solution = solution.replace(old, new)
        return solution


def wrong(exercise: str, label: str, *edits: tuple[str, str], source: str | None = None, flag: str | None = None,
          device: str | None = None) -> Answer:
    return Answer(exercise, label, tuple(edits), source, flag, device)


right = wrong


def for_notebook(slug: str) -> SimpleNamespace:
    """MUTANTS and VARIANTS of notebook `slug` (e.g. 03_function_basics): its module's, and its device bugs."""
    from . import devices

    module = importlib.import_module(f"{__name__}.{slug.split('_', 1)[1]}")
    return SimpleNamespace(MUTANTS=[*module.MUTANTS, *devices.MUTANTS.get(slug, [])],
                           VARIANTS=[*module.VARIANTS, *devices.VARIANTS.get(slug, [])])


def in_parts(*names: str) -> SimpleNamespace:
    """MUTANTS and VARIANTS of the modules `names` (a notebook in parts, e.g. "memory" and
    "memory_checkpointing"), without device bugs: what the unit tests of one checks module use."""
    modules = [importlib.import_module(f"{__name__}.{name}") for name in names]
    return SimpleNamespace(MUTANTS=[a for m in modules for a in m.MUTANTS],
                           VARIANTS=[a for m in modules for a in m.VARIANTS])
