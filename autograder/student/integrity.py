"""Undo what student code changed in the modules the checks rely on.

The grader's worker takes a `snapshot()` before any student code runs. Before the
grader's probes run in the student's process, `restore()` puts back every attribute the
student's code replaced, added or deleted in those modules and classes — so a replaced
`torch.autograd.grad` or `torch.allclose` cannot feed the grader forged numbers, nor a
silenced profiler span or a replaced method of the course's own classes blind the autograd
watch — and reports each change, which is evidence of tampering in itself.
"""
from __future__ import annotations

import builtins
import importlib
import itertools
import operator
import os
import sys
import types
from typing import Any

import torch

from . import introspect, probe

# Modules and classes whose attributes student code must leave alone, besides the course's own
# modules and every class they define (the autograd watch's among them); the profiler's are
# the watch's instruments.
WATCHED = [
    "builtins", "torch", "torch.autograd", "torch.autograd.function", "torch.autograd.gradcheck",
    "torch.nn.functional", "torch.func", "torch.testing", "torch.overrides", "torch.utils._python_dispatch",
    "torch.autograd.profiler", "torch.profiler", "torch._C._autograd", "torch._C._profiler",
]
CLASSES = [torch.Tensor, torch.autograd.Function, torch.autograd.function.FunctionCtx,
           torch.autograd.function.BackwardCFunction, torch.autograd.profiler.profile,
           torch.autograd.profiler.record_function]

# Changed by the interpreter itself: IPython keeps the last results in builtins._, __, ___.
IGNORED = {"_", "__", "___"}
# Globals torch.compile adds to the module of the code it compiles (torch/_dynamo's
# install_global, unique_id and import aliases): a course module that compiles gets them.
DYNAMO_GLOBALS = ("__builtins_dict__", "__compiled_fn", "__resume_at", "__import_", "__comprehension_",
                  "___context_manager_", "__gen_rand_values", "__warnings_warn_wrapper")

_saved: dict[str, tuple[Any, dict[str, Any]]] = {}  # name -> (owner, its attributes at snapshot)
_MISSING = object()


def _watched() -> dict[str, Any]:
    found: dict[str, Any] = {name: importlib.import_module(name) for name in WATCHED}
    top = __package__.split(".")[0]  # the course's own modules in this process: student/, runner/, isolation/
    # but the earlier answers a notebook imports: the student's own code, whose state it changes as it runs
    # (the tape's name counter), and nothing a probe relies on
    earlier = f"{__package__}.earlier"
    course = {name: module for name, module in sys.modules.items()
              if f"{name}.".startswith(f"{top}.") and not f"{name}.".startswith(f"{earlier}.")}
    found.update(course)
    classes = [*CLASSES, *(c for name, module in course.items() for c in vars(module).values()
                           if isinstance(c, type) and c.__module__ == name)]
    found.update({f"{c.__module__}.{c.__qualname__}": c for c in classes})
    found[f"{probe.__name__}.PROCEDURES"] = probe.PROCEDURES  # what the grader's probes run
    return found


def _contents(owner: Any) -> dict[str, Any]:
    return owner if isinstance(owner, dict) else vars(owner)


def _is_module(owner: Any) -> bool:
    return isinstance(owner, types.ModuleType) and owner is not builtins


def _torch_wrapped(now: Any, before: Any) -> bool:
    """A wrapper of `before` whose code is torch's own (not a student's code that copied its name)."""
    code = getattr(now, "__code__", None)
    return getattr(now, "__wrapped__", None) is before and code is not None and os.path.realpath(
        code.co_filename).startswith(os.path.dirname(os.path.realpath(torch.__file__)) + os.sep)


def snapshot() -> None:
    """Remember the watched modules' attributes (call before student code runs)."""
    introspect.prepare()
    _saved.clear()
    for name, owner in _watched().items():
        _saved[name] = owner, dict(_contents(owner))


def _unchanged(before: dict[str, Any], now: dict[str, Any]) -> bool:
    """Same names bound to the same objects, compared by identity in C (torch has
    thousands of attributes, and this runs before every judged cell)."""
    return len(before) == len(now) and all(
        map(operator.is_, before.values(), map(now.get, before, itertools.repeat(_MISSING))))


def _harmless(owner: Any, attr: str, before: dict[str, Any], now: dict[str, Any]) -> bool:
    if attr in IGNORED or (attr.startswith("__") and attr.endswith("__") and _is_module(owner)):
        return True  # bookkeeping (__warningregistry__, ...) that changes by itself
    if attr == "__slotnames__" and isinstance(owner, type):
        return True  # copyreg's cache, set on a class when an instance is first pickled or copied
    if attr not in before and isinstance(now[attr], types.ModuleType) and _is_module(owner):
        return True  # importing a submodule adds it to its package
    if attr not in before and attr.startswith(DYNAMO_GLOBALS) and _is_module(owner):
        return True
    # torch._dynamo, once loaded, wraps torch.manual_seed
    return attr in before and attr in now and _torch_wrapped(now[attr], before[attr])


def restore() -> list[str]:
    """Put every watched attribute back as it was at `snapshot()`; say what had changed."""
    changes = []
    for name, (owner, before) in _saved.items():
        now = _contents(owner)
        if _unchanged(before, now):
            continue
        for attr in sorted(set(before) | set(now)):
            if attr in before and attr in now and now[attr] is before[attr]:
                continue
            if _harmless(owner, attr, before, now):  # the new baseline, so the next check is fast
                if attr in now:
                    before[attr] = now[attr]
                else:
                    del before[attr]
                continue
            what = "replaced" if attr in before and attr in now else "added" if attr in now else "deleted"
            changes.append(f"{name}.{attr} was {what}")
            try:
                if isinstance(owner, dict) and attr in before:
                    owner[attr] = before[attr]
                elif isinstance(owner, dict):
                    del owner[attr]
                elif attr in before:
                    setattr(owner, attr, before[attr])
                else:
                    delattr(owner, attr)
            except (AttributeError, TypeError):
                changes[-1] += " (and could not be put back)"
    return changes
