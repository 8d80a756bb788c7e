"""Syntax trees in the grader's process, one thread at a time.

CPython before 3.11.8 and 3.12.1 keeps one recursion counter for building syntax trees per
interpreter, and two threads building trees at once can corrupt it: "SystemError: AST
constructor recursion depth mismatch" (gh-106905). The grader scans cells in its main
thread while the pool's threads judge test cells, so every tree is built under one lock.
"""
from __future__ import annotations

import ast
import threading
from types import CodeType

_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    with _LOCK:
        return ast.parse(source)


def compiled(tree: ast.AST, filename: str, mode: str) -> CodeType:
    with _LOCK:
        return compile(tree, filename, mode)
