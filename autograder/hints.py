"""The tiers of an exercise's hint, and which of them each edition gets.

A hint cell (markdown, after an answer cell) holds tiers, each
`<details><summary><b>Hint N: title</b></summary> ... </details>`, opened one at a time:

1. the idea, in words;
2. a pointer to the formula: where to find it, or what to derive (never the formula where
   deriving it is the exercise);
3. the steps, in words: what to compute in which order, never the expressions;
4. the formula worked out, for the self-study edition only: no class ever receives it.

A class receives the first `hint-tiers` tiers (`[tool.autograd-course]` in pyproject.toml, 0
to 3, default 2: the idea and the pointer): the release (`make release`, and nbgrader's own
generate_assignment, formgrader's *Generate* button included) removes the tiers above, with
`ClassHints`, a preprocessor that nbgrader_config.py adds to generate_assignment. The
self-study edition (`autograder publish --self-study`) puts every tier back from solutions/.
"""
from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor

TIER = re.compile(r"<details>\s*<summary>\s*<b>\s*Hint (\d+)\b.*?</details>[ \t]*\n?", re.S)
CLASS_MOST = 3  # tiers above this one are the self-study edition's alone
DEFAULT = 2  # the idea and a pointer to the formula
KEY = "hint-tiers"


class HintConfigError(ValueError):
    """`hint-tiers` in pyproject.toml is not a whole number from 0 to CLASS_MOST (one line)."""


def class_tiers(root: Path) -> int:
    """How many tiers of each hint a class receives: `[tool.autograd-course] hint-tiers` in
    root/pyproject.toml, DEFAULT where there is none."""
    path = Path(root) / "pyproject.toml"
    if not path.exists():
        return DEFAULT
    with open(path, "rb") as f:
        value = tomllib.load(f).get("tool", {}).get("autograd-course", {}).get(KEY, DEFAULT)
    if type(value) is not int or not 0 <= value <= CLASS_MOST:
        raise HintConfigError(f"{KEY} = {value!r} in {path}: give how many tiers of each hint a class receives, a "
                              f"whole number from 0 (none) to {CLASS_MOST} (the idea, a pointer to the formula, "
                              "the steps in words)")
    return value


def tiers(markdown: str) -> list[int]:
    """The numbers of the hint tiers in a markdown cell, in order."""
    return [int(m.group(1)) for m in TIER.finditer(markdown)]


def is_hint(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "markdown" and bool(tiers(cell.source))


def keep(markdown: str, most: int) -> str:
    """The cell without its tiers above `most` (the text around them stays)."""
    kept = TIER.sub(lambda m: m.group(0) if int(m.group(1)) <= most else "", markdown)
    return re.sub(r"\n{3,}", "\n\n", kept).strip("\n")


def for_class(nb: nbformat.NotebookNode, most: int) -> nbformat.NotebookNode:
    """`nb` with the hint tiers a class receives: each hint cell keeps its first `most` tiers,
    and a cell left with nothing goes."""
    cells = []
    for cell in nb.cells:
        if is_hint(cell):
            cell.source = keep(cell.source, most)
            if not cell.source.strip():
                continue
        cells.append(cell)
    nb.cells = cells
    return nb


def every_tier(released: nbformat.NotebookNode, solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A released notebook with every tier of every hint (the self-study edition's): each hint
    cell as solutions/ has it (the release leaves markdown as it is, and cell ids too), a cell
    the class edition left out put back in its place."""
    ours = {cell.id: cell for cell in released.cells}
    released.cells = [copy.deepcopy(cell) if is_hint(cell) else ours[cell.id]
                      for cell in solution.cells if is_hint(cell) or cell.id in ours]
    return released


class ClassHints(NbGraderPreprocessor):  # type: ignore[misc]  # (nbgrader is untyped)
    """generate_assignment's last step: the hint tiers a class receives (`class_tiers` of the
    course root)."""

    def preprocess(self, nb, resources):
        root = self.config.CourseDirectory.get("root") or "."
        return for_class(nb, class_tiers(Path(root))), resources
