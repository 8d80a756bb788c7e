"""Read a submitted notebook, say what is wrong with it, and repair it as nbgrader does.

Repairs are nbgrader's own sanitizing preprocessors (outputs cleared, kernelspec, locked
and test cells restored from the gradebook), after what they fail on is repaired here:
metadata of an unexpected shape, cells that claim one grade_id, a released role changed,
a deleted test cell. What they repair silently is reported here first: deleted, retyped,
renamed or duplicated graded cells flag the notebook for a human to look at, and so does
code the student wrote that looks like an attempt to change how it is graded
(:mod:`autograder.scan`).
"""
from __future__ import annotations

import copy
import logging
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import nbformat
from nbformat import NotebookNode
from nbformat.warnings import DuplicateCellId, MissingIDFieldWarning
from nbgrader import utils
from nbgrader.api import Gradebook
from nbgrader.converters import Autograde
from nbgrader.nbgraderformat import MetadataValidator
from nbgrader.nbgraderformat import ValidationError as MetadataError
from nbgrader.nbgraderformat.common import SchemaMismatchError
from nbgrader.preprocessors import OverwriteCells, overwritecells, overwritekernelspec
from traitlets.config import Config

from .gradebook import Released, lent
from .scan import imported, scan

_GRADE_ID = re.compile(r"[a-zA-Z0-9_\-]+")
QUIET = logging.getLogger("autograder.engine.nbgrader")  # nbgrader's warnings repeat ours less clearly
QUIET.setLevel(logging.ERROR)
SILENT = logging.getLogger("autograder.engine.nbgrader.repairs")  # what they say, Rejected says in one line
SILENT.disabled = True
LENT_MODULES = (overwritecells, overwritekernelspec)  # nbgrader's sanitizers that open a Gradebook
_VALIDATOR = MetadataValidator()
_VALIDATOR.log = SILENT


class Rejected(Exception):
    """The notebook cannot be graded automatically; the message says why."""


@dataclass
class Prepared:
    """A notebook ready to run: nbgrader's sanitized form, and why a human should look at it."""

    name: str
    nb: NotebookNode
    flags: list[str] = field(default_factory=list)

    def code_cells(self) -> list[tuple[int, str, str]]:
        """(index, label, source) of every code cell, in order."""
        return [
            (i, _label(i, cell), cell.source) for i, cell in enumerate(self.nb.cells) if cell.cell_type == "code"
        ]


def _label(index: int, cell: NotebookNode) -> str:
    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
    return f"cell {index + 1}" + (f" ({grade_id})" if grade_id else "")


def read(data: bytes) -> NotebookNode:
    invalid: dict[str, Any] = {}  # nbformat validates as it reads (once): what it found
    try:
        nb: NotebookNode = nbformat.reads(data.decode("utf-8"), as_version=4, capture_validation_error=invalid)
    except UnicodeDecodeError:
        raise Rejected("the file is not UTF-8 text") from None
    except Exception as error:  # nbformat raises many kinds: not JSON, unknown version, missing keys
        raise Rejected(f"not a readable notebook: {type(error).__name__}: {error}") from None
    if "ValidationError" in invalid:
        raise Rejected(f"not a valid notebook: {invalid['ValidationError'].message}")
    _steady_ids(nb, set(_CELL_ID.findall(data.decode("utf-8"))))
    return nb


# What nbformat warns of as it repairs ids, `_steady_ids` repairs again, for good: not the instructor's concern.
warnings.filterwarnings("ignore", category=DuplicateCellId)
warnings.filterwarnings("ignore", category=MissingIDFieldWarning)
_CELL_ID = re.compile(r'"id"\s*:\s*"([^"\\]*)"')


def _steady_ids(nb: NotebookNode, written: set[str]) -> None:
    """Cell ids the notebook's file does not hold (nbformat makes up a random one for a
    duplicated or missing id, and for every cell of an older nbformat) named by their place
    instead: grading the same file twice writes the same autograded notebook."""
    taken = {cell.get("id") for cell in nb.cells}
    for index, cell in enumerate(nb.cells):
        if "id" in cell and cell.id not in written:
            name, k = f"cell-{index + 1}", 1
            while name in taken:
                name, k = f"cell-{index + 1}-{k}", k + 1
            taken.add(name)
            cell.id = name


# nbgrader's cell metadata (schema 3): each field's type. Other fields are dropped, as
# nbgrader's own upgrade does.
FIELDS: dict[str, type[Any] | tuple[type[Any], ...]] = {
    "grade": bool, "solution": bool, "locked": bool, "task": bool, "grade_id": str, "points": (int, float),
    "schema_version": int, "checksum": str, "cell_type": str}


def _invalid(cell: NotebookNode, released_type: str | None) -> str | None:
    """What is wrong with a cell's nbgrader metadata, if anything. A cell the instructor
    made is judged as the type it was released as (nbgrader's repair gives it that type
    back; `tampering` names the change)."""
    meta = cell.metadata["nbgrader"]
    if not isinstance(meta, dict):
        return f"it is {type(meta).__name__ if meta is not None else 'null'}, not an object"
    for key, kind in FIELDS.items():
        value = meta.get(key)
        if key in meta and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
            return f"its {key} is {type(value).__name__ if value is not None else 'null'}"
    points = meta.get("points", 0)
    if not (0 <= points < 1e6):  # (NaN fails this too)
        return f"its points are {points!r}"
    if not _GRADE_ID.fullmatch(meta.get("grade_id", "x")):
        return "its grade_id is not a name of letters, digits, '_' and '-'"
    try:  # and nbgrader's own rules (required fields, points on a graded cell, ...)
        _VALIDATOR.validate_cell(nbformat.from_dict({**cell, "cell_type": released_type or cell.cell_type,
                                                     "metadata": {"nbgrader": _VALIDATOR.upgrade_cell_metadata(
            nbformat.from_dict({"metadata": {"nbgrader": dict(meta)}})).metadata.get("nbgrader", {})}}))
    except (MetadataError, jsonschema.ValidationError, SchemaMismatchError, KeyError, TypeError, ValueError) as error:
        return f"nbgrader's rules: {str(error).strip().splitlines()[0][:120]}"
    return None


def sanitize_metadata(nb: NotebookNode, released: list[Any]) -> list[str]:
    """Drop nbgrader metadata of an unexpected shape (nbformat's schema allows any), so it
    reaches no code that trusts it: the cell becomes the student's own, and a test cell
    whose metadata was dropped is put back like a deleted one. Returns what was dropped."""
    types = {_grade_id(cell): cell.get("cell_type") for cell in released if _grade_id(cell)}
    flags = []
    for index, cell in enumerate(nb.cells):
        if "nbgrader" not in cell.metadata:
            continue
        meta = cell.metadata["nbgrader"]
        grade_id = meta.get("grade_id") if isinstance(meta, dict) and isinstance(meta.get("grade_id"), str) else None
        problem = _invalid(cell, types.get(grade_id))
        if problem is None:
            cell.metadata["nbgrader"] = {k: v for k, v in cell.metadata["nbgrader"].items() if k in FIELDS}
        else:
            del cell.metadata["nbgrader"]
            flags.append(f"tampering suspected: the nbgrader metadata of cell {index + 1} is not valid ({problem}); "
                         "it was ignored")
    return flags


def deduplicate(nb: NotebookNode, released: list[Any], known: set[str]) -> list[str]:
    """One cell per grade_id of the release (nbgrader's own repair leaves a cell it cannot
    read): of the cells that claim one, the released cell wins — the one of the released
    type, unedited where the release locked it, with the released cell id (a pasted cell
    gets a new one), else the first. The others lose the claim: an unedited copy of a
    locked cell holds nothing of the student's and is dropped; any other copy (an answer's
    above all) stays where it is as the student's own cell, so it runs as in the student's
    own top-to-bottom run. Returns what was done, the copies named."""
    given = {_grade_id(cell): cell for cell in released if _grade_id(cell)}
    claims: dict[str, list[int]] = {}
    for index, cell in enumerate(nb.cells):
        if _grade_id(cell) in known:
            claims.setdefault(str(_grade_id(cell)), []).append(index)
    flags, dropped = [], []
    for grade_id, places in claims.items():
        if len(places) == 1:
            continue
        original = given.get(grade_id)
        keep = min(places, key=lambda i: _likeness(nb.cells[i], original))  # (min is stable: the first of equals)
        copies = [i for i in places if i != keep]
        unedited = [i for i in copies if original is not None and original.metadata.nbgrader.get("locked")
                    and nb.cells[i].source.strip() == original.source.strip()]
        kept = [i for i in copies if i not in unedited]
        for i in kept:
            del nb.cells[i].metadata["nbgrader"]
        dropped += unedited
        said = [f"cell {keep + 1} is taken as the released cell"]
        said += [f"dropped as unedited copies of a locked cell: {_cells(unedited)}"] if unedited else []
        said += [f"kept as your own cells where they stand (they run in order: a check sees the last definition "
                 f"above it): {_cells(kept)}"] if kept else []
        flags.append(f"grade_id '{grade_id}' appears {len(places)} times (a copied cell?): {'; '.join(said)}")
    for index in sorted(dropped, reverse=True):
        del nb.cells[index]
    return flags


def restore(nb: NotebookNode, released: list[Any], known: set[str]) -> None:
    """Every graded cell of the release, there once (see `deduplicate`) with its released
    role: graded, answer, locked, points (nbgrader puts back the type, lock, points and
    source but not the first two, and fails on a test cell whose checksum they change). A
    graded cell no cell claims (deleted, or its metadata dropped) is put back after the
    released cell before it that is there (nbgrader's own repair fails where that one is
    not graded). A cell whose grade_id the release does not know (a renamed one) becomes
    the student's own: it runs, ungraded."""
    given = {_grade_id(cell): cell for cell in released if _grade_id(cell)}
    for cell in nb.cells:
        grade_id = _grade_id(cell)
        if grade_id not in known:
            cell.metadata.pop("nbgrader", None)
        elif grade_id in given:
            meta, role = cell.metadata.nbgrader, given[grade_id].metadata.nbgrader
            for key in ROLE:
                if key in role:
                    meta[key] = role[key]
                else:
                    meta.pop(key, None)
    ids = {cell.get("id") for cell in nb.cells}
    places = {_grade_id(cell): k for k, cell in enumerate(nb.cells)}
    at = 0  # where the next released cell goes
    for grade_id, original in given.items():
        if grade_id in places:
            at = places[grade_id] + 1
        elif grade_id in known and original.metadata.nbgrader.get("grade"):
            cell = copy.deepcopy(original)
            if cell.get("id") in ids:  # (a cell of the student's has its id)
                del cell["id"]
            nb.cells.insert(at, cell)
            places = {_grade_id(cell): k for k, cell in enumerate(nb.cells)}
            at += 1


ROLE = ("grade", "solution", "locked", "task", "points")


def _likeness(cell: NotebookNode, original: Any) -> tuple[bool, ...]:
    """How far a cell claiming a released grade_id is from the released cell (False is near)."""
    if original is None:
        return ()
    locked = bool(original.metadata.nbgrader.get("locked"))
    return (cell.cell_type != original.cell_type, locked and cell.source.strip() != original.source.strip(),
            cell.get("id") != original.get("id"))


def _cells(indices: list[int]) -> str:
    """Cells named by number, at most ten of them."""
    named = ", ".join(str(i + 1) for i in indices[:10])
    more = f" and {len(indices) - 10} more" if len(indices) > 10 else ""
    return f"cell{'s' if len(indices) > 1 else ''} {named}{more}"


def reorder(nb: NotebookNode, released: list[Any]) -> list[str]:
    """Put the cells the instructor made (known by grade_id) back in the released order,
    each taking one of their places (the student's own cells stay where they are), so a
    test cell moved above what it tests runs after it again. Returns what had moved."""
    rank = {_grade_id(cell): k for k, cell in enumerate(released) if _grade_id(cell)}
    places = [i for i, cell in enumerate(nb.cells) if _grade_id(cell) in rank]
    found = [nb.cells[i] for i in places]
    ordered = sorted(found, key=lambda cell: rank[_grade_id(cell)])
    moved = [_grade_id(cell) for cell, was in zip(ordered, found) if cell is not was]
    for i, cell in zip(places, ordered):
        nb.cells[i] = cell
    return [f"the cells {', '.join(repr(m) for m in moved[:10])} were out of the released order; they were graded "
            "in that order"] if moved else []


def _grade_id(cell: dict[str, Any]) -> str | None:
    """(Cells nbgrader puts back hold plain dicts, not NotebookNodes.)"""
    grade_id: str | None = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    return grade_id


def tampering(nb: NotebookNode, gradebook: Gradebook, notebook: str, assignment: str) -> list[str]:
    """What was done to the graded cells that nbgrader would repair without a word."""
    stored = gradebook.find_notebook(notebook, assignment)
    source = {cell.name: cell for cell in stored.source_cells}
    graded = [cell.name for cell in stored.grade_cells]
    ids = [
        cell.metadata.nbgrader.get("grade_id")
        for cell in nb.cells
        if "nbgrader" in cell.metadata and (utils.is_grade(cell) or utils.is_solution(cell) or utils.is_locked(cell))
    ]
    flags = [f"unknown grade_id '{i}' (a renamed cell?)" for i in dict.fromkeys(ids) if i and i not in source]
    flags += [f"the graded cell '{name}' was deleted or lost its metadata; it was put back"
              for name in graded if name not in ids]
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in source and cell.cell_type != source[grade_id].cell_type:
            flags.append(f"the cell '{grade_id}' was changed from {source[grade_id].cell_type} to {cell.cell_type}")
    return flags


def edited(nb: NotebookNode, released: list[Any]) -> list[str]:
    """What was done to the locked and graded cells that nbgrader puts back without a word:
    edited locked cells, changed nbgrader metadata (points above all), outputs in a hidden
    test cell (whose released source is only a comment, so it cannot have printed anything)."""
    given = {c.metadata.nbgrader.grade_id: c for c in released if c.get("metadata",
                                                                        {}).get("nbgrader", {}).get("grade_id")}
    flags = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        original = given.get(meta.get("grade_id"))
        if original is None:
            continue
        name, was = meta["grade_id"], original.metadata.nbgrader
        if was.get("locked") and cell.source.strip() != original.source.strip():
            flags.append(f"tampering suspected: the locked cell '{name}' was edited; the released cell was graded")
        changed = [f"{key} {was.get(key)!r} -> {meta.get(key)!r}" for key in ("grade", "solution", "locked", "points")
                   if meta.get(key) != was.get(key)]
        if changed:
            flags.append(f"tampering suspected: the nbgrader metadata of the cell '{name}' was changed "
                         f"({', '.join(changed)}); the released metadata was used")
        if was.get("grade") and not was.get("solution") and cell.get("outputs") and _only_comments(original.source):
            flags.append(f"tampering suspected: the hidden test cell '{name}' came with outputs, which its released "
                         "source cannot print; they were discarded")
    return flags


def _only_comments(source: str) -> bool:
    return all(not line.strip() or line.lstrip().startswith("#") for line in source.splitlines())


def compiles(cells: list[Any]) -> bool:
    """Whether a code cell among `cells` calls torch.compile."""
    return any(cell.get("cell_type") == "code" and "torch.compile(" in cell.source for cell in cells)


class Preparer:
    """Reads, checks and sanitizes the submitted notebooks of one course (close it when done)."""

    def __init__(self, db_url: str, course_id: str, config: Config, released: Path) -> None:
        """`released`: the folder of released assignments (what students were given)."""
        self.db_url, self.released = db_url, released
        self.gradebook = Released(Gradebook(db_url, course_id))
        self.given: dict[tuple[str, str], list[Any]] = {}
        # A deleted test cell is always put back (by `restore`; by nbgrader where the release is
        # gone): graded as missing, it would keep a stale score.
        self.sanitizers = [
            cls(config=config, log=SILENT, **({"add_missing_cells": True} if cls is OverwriteCells else {}))
            for cls in Autograde(config=config).sanitize_preprocessors
        ]

    def prepare(self, name: str, data: bytes, student: str, assignment: str) -> Prepared:
        """Raises Rejected when the notebook cannot be graded automatically."""
        nb, released = read(data), self._given(assignment, name)
        known = {cell.name for cell in self.gradebook.find_notebook(name, assignment).source_cells}
        flags = sanitize_metadata(nb, released)
        flags += deduplicate(nb, released, known)
        flags += tampering(nb, self.gradebook, name, assignment) + edited(nb, released)
        restore(nb, released, known)
        resources = {"nbgrader": {"notebook": name, "assignment": assignment, "student": student,
                                  "db_url": self.db_url}}
        try:
            with lent(self.gradebook, LENT_MODULES):
                for sanitize in self.sanitizers:
                    nb, resources = sanitize(nb, resources)
        except (MetadataError, RuntimeError, ValueError, KeyError) as error:  # as stock nbgrader fails on it
            reason = f"nbgrader cannot repair its cell metadata ({type(error).__name__}: {error})"
            raise Rejected("; ".join([*flags, reason])) from None
        flags += reorder(nb, released)
        theirs = [c for c in nb.cells if utils.is_solution(c) or not (utils.is_locked(c) or utils.is_grade(c))]
        flags += [f"worth a look: {finding}" for finding in scan(theirs, released)]
        return Prepared(name, nb, flags)

    def imports(self, notebooks: dict[str, set[str]]) -> list[str]:
        """The modules the released notebooks import, for {assignment: notebook names}."""
        found: dict[str, None] = {}
        for assignment, names in sorted(notebooks.items()):
            for name in sorted(names):
                for cell in self._given(assignment, name):
                    if cell.get("cell_type") == "code":
                        found.update(dict.fromkeys(imported(cell.source)))
        return list(found)

    def compiles(self, notebooks: dict[str, set[str]]) -> bool:
        """Whether the released notebooks, {assignment: notebook names}, call torch.compile."""
        return any(compiles(self._given(assignment, name)) for assignment, names in notebooks.items() for name in names)

    def close(self) -> None:
        self.gradebook.close()

    def _given(self, assignment: str, name: str) -> list[Any]:
        """The released notebook's cells (without it, every line counts as the student's);
        read once per run."""
        if (assignment, name) not in self.given:
            try:
                self.given[assignment, name] = read((self.released / assignment / f"{name}.ipynb").read_bytes()).cells
            except (OSError, Rejected):
                self.given[assignment, name] = []
        return self.given[assignment, name]
