"""Every exercise of the course in one place, read from solutions/ (nothing to keep in step):
its grade_id → notebook, heading and answer cell → graded cells (points, visible or hidden)
→ the checks those cells call, where they are written, and the specs (cases, reference)
they judge with → in this repository, its known answers (tests/answers) and its tests
(`pytest -m GRADE_ID`). The tests mark themselves from it; `autograder exercise GRADE_ID`
prints it.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from . import authoring


@dataclass(frozen=True)
class GradedCell:
    grade_id: str
    index: int  # in the solution notebook
    points: float
    hidden: bool


@dataclass(frozen=True)
class Check:
    name: str  # qualified: autograder.exercises.gradient_patterns.check_conv2d
    where: str  # path:line in the repository
    specs: tuple[str, ...]  # the module's FunctionSpecs (cases, reference, hint) it judges with


@dataclass(frozen=True)
class Exercise:
    grade_id: str  # of the answer cell
    slug: str
    heading: str  # "Exercise 4.6 · Conv2d ..." (the last "## " heading above it)
    index: int  # the answer cell's index in the solution notebook
    graded: tuple[GradedCell, ...]
    check_names: tuple[str, ...]  # qualified names of the checks its graded cells call

    @property
    def checks(self) -> tuple[Check, ...]:
        """Its checks, found in their modules (which import torch: read only when asked)."""
        return tuple(_check(name) for name in self.check_names)


def exercises(root: Path = authoring.ROOT) -> tuple[Exercise, ...]:
    """Every exercise of every notebook in solutions/, in course order. (A grade_id is unique
    within its notebook only: 02 and 07 both have an `hvp`.)"""
    return _exercises(root)


@functools.cache  # (keyed by the root alone, however it was passed)
def _exercises(root: Path) -> tuple[Exercise, ...]:
    found: dict[tuple[str, str], Exercise] = {}
    for slug in authoring.assignments(root):
        nb = nbformat.read(authoring.solution_path(slug, root), as_version=4)
        imported = _imported_names(nb)
        heading, current = "", None
        for index, cell in enumerate(nb.cells):
            meta = cell.metadata.get("nbgrader", {})
            if cell.cell_type == "markdown" and cell.source.startswith("## "):
                heading = cell.source.splitlines()[0].removeprefix("## ").strip()
            elif meta.get("solution") and cell.cell_type == "code":
                current = Exercise(meta["grade_id"], slug, heading, index, (), ())
                found[slug, current.grade_id] = current
            elif meta.get("grade") and current is not None:
                hidden = "### BEGIN HIDDEN TESTS" in cell.source
                checks = tuple(c for c in _checks(cell.source, imported) if c not in current.check_names)
                current = found[slug, current.grade_id] = Exercise(
                    current.grade_id, slug, current.heading, current.index,
                    (*current.graded, GradedCell(meta["grade_id"], index, meta.get("points", 0), hidden)),
                    (*current.check_names, *checks))
    return tuple(found.values())


def named(grade_id: str, root: Path = authoring.ROOT) -> list[Exercise]:
    """The exercises whose answer cell has this grade_id (one, or one per notebook)."""
    return [e for e in exercises(root) if e.grade_id == grade_id]


def _imported_names(nb: nbformat.NotebookNode) -> dict[str, str]:
    """{name: qualified name} of what the notebook's cells import from the course's package."""
    names: dict[str, str] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # IPython magics
            continue
        for node in tree.body:  # a notebook imports at the top level of its cells
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autograder."):
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _checks(source: str, imported: dict[str, str]) -> list[str]:
    """Qualified names of the course's functions a cell calls."""
    called = [node.func.id for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported]
    return [imported[name] for name in dict.fromkeys(called)]


@functools.cache
def _check(qualified: str) -> Check:
    module_name, _, name = qualified.rpartition(".")
    module = importlib.import_module(module_name)
    function = inspect.unwrap(getattr(module, name))
    try:
        path = Path(inspect.getsourcefile(function) or "").resolve().relative_to(authoring.ROOT)
        where = f"{path}:{inspect.getsourcelines(function)[1]}"
    except (TypeError, ValueError, OSError):
        where = module_name
    from .checks.functions import FunctionSpec

    code = getattr(function, "__code__", None)
    specs = tuple(n for n in (code.co_names if code else ()) if isinstance(getattr(module, n, None), FunctionSpec))
    return Check(qualified, where, specs)


def known_answers(exercise: Exercise, root: Path = authoring.ROOT) -> tuple[list[Any], list[Any]] | None:
    """(wrong, right) known answers of an exercise from tests/answers, or None where this
    checkout has no tests (a published edition)."""
    if not (root / "tests" / "answers").is_dir():
        return None
    if str(root / "tests") not in sys.path:
        sys.path.insert(0, str(root / "tests"))
    from answers import for_notebook  # type: ignore[import-not-found]  # the repository's tests/

    module = for_notebook(exercise.slug)
    return ([a for a in module.MUTANTS if a.exercise == exercise.grade_id],
            [a for a in module.VARIANTS if a.exercise == exercise.grade_id])


def describe(grade_id: str, root: Path = authoring.ROOT) -> str:
    """What `autograder exercise GRADE_ID` prints (for each notebook with such an exercise)."""
    return "\n\n".join(_described(exercise, root) for exercise in named(grade_id, root))


def _described(exercise: Exercise, root: Path) -> str:
    grade_id = exercise.grade_id
    lines = [f"{exercise.heading}  [{grade_id}]",
             f"notebook   solutions/{exercise.slug}/{exercise.slug}.ipynb, answer cell {exercise.index}"]
    for cell in exercise.graded:
        lines.append(f"graded     cell {cell.index} {cell.grade_id}: {cell.points:g} point(s), "
                     f"{'hidden' if cell.hidden else 'visible'}")
    for check in exercise.checks:
        specs = f" (specs: {', '.join(check.specs)})" if check.specs else ""
        lines.append(f"check      {check.name}  {check.where}{specs}")
    answers = known_answers(exercise, root)
    if answers is not None:
        wrong, right = answers
        module = exercise.slug.split("_", 1)[1]
        lines.append(f"answers    tests/answers/{module}.py (and devices.py): {len(wrong)} wrong, "
                     f"{len(right)} unusual right")
        lines += [f"  wrong    {a.label}" for a in wrong] + [f"  right    {a.label}" for a in right]
        lines.append(f"tests      .venv/bin/python -m pytest -m {grade_id}"
                     + (f" -k {exercise.slug}" if len(named(grade_id, root)) > 1 else ""))
    return "\n".join(lines)
