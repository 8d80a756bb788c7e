"""Undo what student code changed in the modules the checks rely on.

The grader's worker takes a `snapshot()` before any student code runs. Before the
grader's probes run in the student's process, `restore()` puts back every attribute the
student's code replaced, added or deleted in those modules — so a replaced
`torch.autograd.grad` or `torch.allclose` cannot feed the grader forged numbers — and
reports each change, which is evidence of tampering in itself.
"""
from __future__ import annotations

import builtins
import importlib
import sys
import types
from typing import Any

import torch

# Modules (and classes) whose attributes student code must leave alone.
WATCHED = [
    "builtins", "torch", "torch.autograd", "torch.autograd.function", "torch.autograd.gradcheck",
    "torch.nn.functional", "torch.func", "torch.testing", "torch.overrides", "torch.utils._python_dispatch",
]
CLASSES = [torch.Tensor, torch.autograd.Function]

# Changed by the interpreter itself: IPython keeps the last results in builtins._, __, ___.
IGNORED = {"_", "__", "___"}

_saved: dict[str, dict[str, Any]] = {}


def _watched() -> dict[str, Any]:
    found = {name: importlib.import_module(name) for name in WATCHED}
    found.update({name: module for name, module in sys.modules.items() if name.startswith("autograder.checks")
                  or name.startswith("autograder.exercises")})
    found.update({f"{c.__module__}.{c.__qualname__}": c for c in CLASSES})
    return found


def snapshot() -> None:
    """Remember the watched modules' attributes (call before student code runs)."""
    _saved.clear()
    for name, owner in _watched().items():
        _saved[name] = dict(vars(owner))


def restore() -> list[str]:
    """Put every watched attribute back as it was at `snapshot()`; say what had changed."""
    changes = []
    for name, owner in _watched().items():
        before = _saved.get(name)
        if before is None:
            continue
        now = vars(owner)
        for attr in sorted(set(before) | set(now)):
            if attr in before and attr in now and now[attr] is before[attr]:
                continue
            if attr in IGNORED or (attr.startswith("__") and attr.endswith("__") and owner is not builtins):
                continue  # bookkeeping (__warningregistry__, ...) that changes by itself
            if attr not in before and isinstance(now[attr], types.ModuleType):
                continue  # importing a submodule adds it to its package
            what = "replaced" if attr in before and attr in now else "added" if attr in now else "deleted"
            changes.append(f"{name}.{attr} was {what}")
            try:
                if attr in before:
                    setattr(owner, attr, before[attr])
                else:
                    delattr(owner, attr)
            except (AttributeError, TypeError):
                changes[-1] += " (and could not be put back)"
    return changes
