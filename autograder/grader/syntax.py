"""Syntax trees in the grader's process, one thread at a time.

CPython before 3.11.8 and 3.12.1 keeps one recursion counter for building syntax trees per
interpreter, and two threads building trees at once can corrupt it: "SystemError: AST
constructor recursion depth mismatch" (gh-106905), raised in whichever thread checks the
counter next. The grader's threads build trees all the time — judging test cells, scanning
cells, and formatting any traceback (Python 3.11's traceback parses each line it points
at) — so on those Pythons `guard()` makes every `ast.parse` of the process take one lock:
the one change this package makes to the standard library, for as long as a Python the
project supports (>= 3.11) has the bug (`tests/test_verdicts.py` fails when it is guarded
where it needs not be, or the other way round).
"""
from __future__ import annotations

import ast
import sys
import threading
from types import CodeType
from typing import Any

_LOCK = threading.RLock()
NEEDED = sys.version_info[:3] < (3, 11, 8) or sys.version_info[:3] == (3, 12, 0)  # gh-106905


def guard() -> None:
    """Route `ast.parse` through the lock, for every caller in this process (once), on a
    Python with gh-106905."""
    if not NEEDED or getattr(ast.parse, "guarded", False):
        return
    unguarded = ast.parse

    def parse(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return unguarded(*args, **kwargs)

    parse.guarded = True  # type: ignore[attr-defined]
    ast.parse = parse


def parse(source: str) -> ast.Module:
    with _LOCK:
        return ast.parse(source)


def compiled(tree: ast.Module | ast.Expression, filename: str, mode: str) -> CodeType:
    with _LOCK:
        return compile(tree, filename, mode)
