"""A one-call summary for the student: every visible check of a notebook, run now, with the
points each earns out of those it can earn (like Otter's `check_all`).

The last cell of a notebook calls `summary("SLUG")`. It needs nothing but the kernel (no
notebook file on disk, as in Colab): `visible_checks.json`, beside this module, lists
every notebook's visible check cells — written by `make release` from the notebooks
themselves (`authoring.write_visible_checks`; a test checks it is fresh) — and the summary
runs each one in the student's namespace, in order. A check that fails, a stub that raises
`NotImplementedError`, an answer cell not run yet: each is reported on its line with 0
points, and the summary goes on to the next.

It only runs in the student's own kernel (IPython: JupyterLab, Colab): while a notebook is
graded (nbgrader sets NBGRADER_EXECUTION; the grading sandbox has no check modules) it says
so and does nothing, since the grader runs every check itself; and a notebook executed
outside IPython (tests that run its cells) does not run every check again.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import sys
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .probe import first_line
from .report import CheckFailed, quiet, undefined

GRADING = "Summary: this notebook is being graded, and the grader runs every check itself."
NO_KERNEL = ("Summary: it runs in a notebook's kernel (JupyterLab, Colab); here, pass the names: "
             "summary(slug, namespace).")
NO_CHECKS = "Summary: the course's checks are not installed here (run the setup cell first)."

KEYS_MODULE = "autograder.checks.quiz_keys"  # every quiz's key: only in a self-study edition of the student package


@dataclass(frozen=True)
class VisibleCheck:
    """One visible check cell of a notebook, as the summary runs it."""

    exercise: str  # "1.1"; "" for a check of no single exercise
    grade_id: str  # of the check cell
    points: float  # what it scores (0: a check that scores nothing, e.g. a quiz's form)
    source: str  # the cell's source, exactly as in the notebook
    hidden_points: float = 0  # the exercise's hidden check, graded when the notebook is


@dataclass
class Row:
    check: VisibleCheck
    passed: bool
    earned: float
    message: str  # the first line of what went wrong ("" when it passed)


CHECK_MODULE = re.compile(r"^from (autograder\.exercises\.\w+) import", re.M)


def visible_checks(slug: str) -> list[VisibleCheck]:
    """The visible checks of notebook `slug`. ImportError where the course's checks are not
    installed (the grading sandbox masks them): the modules the check cells import are
    imported first."""
    checks = [VisibleCheck(**check) for check in _table()[slug]]
    for module in sorted({name for check in checks for name in CHECK_MODULE.findall(check.source)}):
        importlib.import_module(module)
    return checks


def _table() -> dict[str, list[dict[str, Any]]]:
    table: dict[str, list[dict[str, Any]]] = json.loads(
        resources.files(__package__).joinpath("visible_checks.json").read_text(encoding="utf-8"))
    return table


def is_check_cell(source: str) -> bool:
    """Whether `source` is one of the course's visible check cells (which a student runs)."""
    return source.strip() in {check["source"].strip() for checks in _table().values() for check in checks}


def run_check(check: VisibleCheck, namespace: dict[str, Any]) -> Row:
    """Run one visible check cell in `namespace`, its output captured."""
    with contextlib.redirect_stdout(io.StringIO()), quiet():
        try:
            exec(compile(check.source, f"<{check.grade_id}>", "exec"), namespace)
        except CheckFailed as failed:
            return Row(check, False, 0, first_line(failed))
        except NotImplementedError:
            return Row(check, False, 0, "not implemented yet.")
        except NameError as missing:
            name = getattr(missing, "name", None) or first_line(missing)
            return Row(check, False, 0, undefined(name))
        except Exception as error:  # anything the student's code raised
            return Row(check, False, 0, f"{type(error).__name__}: {first_line(error)}")
    return Row(check, True, check.points, "")


def run_all(slug: str, namespace: dict[str, Any]) -> list[Row]:
    """Every visible check of `slug`, in order, in `namespace` (one that fails does not
    stop the others)."""
    return [run_check(check, namespace) for check in visible_checks(slug)]


def _points(x: float) -> str:
    return f"{x:g}"


def report(slug: str, rows: list[Row]) -> str:
    """The summary as text: a line per check, then the total."""
    width = max((len(r.check.grade_id) for r in rows), default=0)
    lines = [f"Summary of {slug}: every visible check, run now on your code."]
    for row in rows:
        mark = "✔" if row.passed else "✘"
        score = f"{_points(row.earned)} / {_points(row.check.points)}" if row.check.points else "not scored"
        what = f"  {row.message}" if row.message else ""
        lines.append(f"  {mark} {row.check.exercise or '':4} {row.check.grade_id:{width}}  {score:>10}{what}")
    earned = sum(r.earned for r in rows)
    possible = sum(r.check.points for r in rows)
    hidden = sum(r.check.hidden_points for r in rows)
    lines.append(f"Visible checks: {_points(earned)} of {_points(possible)} points.")
    if hidden and _self_study():
        lines.append(f"A graded class also runs hidden checks on other inputs ({_points(hidden)} more points); this "
                     "edition has none, so a passing check is a good sign, not a proof.")
    elif hidden:
        lines.append(f"The hidden checks ({_points(hidden)} more points) run when your notebook is graded, on other "
                     "inputs: passing the visible ones does not guarantee them.")
    failed = sum(not r.passed for r in rows)
    if failed:
        lines.append(f"{failed} check(s) did not pass: run the cell of each for its full message.")
    return "\n".join(lines)


def _self_study() -> bool:
    """The self-study edition of the student package: it holds every quiz's key, no one grades."""
    return importlib.util.find_spec(KEYS_MODULE) is not None


def _in_a_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


def summary(slug: str, namespace: dict[str, Any] | None = None) -> None:
    """Run every visible check of notebook `slug` on the student's code (by default, the
    names of the calling notebook, in an IPython kernel) and print the points earned out
    of those possible."""
    if os.environ.get("NBGRADER_EXECUTION"):
        print(GRADING)
        return
    if namespace is None:
        if not _in_a_kernel():
            print(NO_KERNEL)
            return
        namespace = sys._getframe(1).f_globals  # the notebook's own names
    try:
        checks = visible_checks(slug)
    except ImportError:
        print(NO_CHECKS)
        return
    print(report(slug, [run_check(check, namespace) for check in checks]))
