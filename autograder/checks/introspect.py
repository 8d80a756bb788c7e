"""Look inside a student's backward: which torch functions it calls."""
from __future__ import annotations

import contextlib
import inspect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode

# Calls that multiply matrices: what a gradient nobody needs must not cost.
MATMULS = frozenset(
    {"matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "linear", "mv", "addmv", "dot", "inner", "tensordot"}
)


class _Recorder(TorchFunctionMode):
    def __init__(self, counts: Counter[str]) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.counts[getattr(func, "__name__", str(func))] += 1
        return func(*args, **(kwargs or {}))


@dataclass
class BackwardRecord:
    calls: Counter[str] = field(default_factory=Counter)  # torch functions called, by name
    returned: list[Any] = field(default_factory=list)  # what each backward call returned

    @property
    def matmuls(self) -> int:
        return sum(n for name, n in self.calls.items() if name in MATMULS)


@contextlib.contextmanager
def backward_calls(function: type[torch.autograd.Function]) -> Iterator[BackwardRecord]:
    """Record the torch functions called inside `function.backward`, and its results.

    The backward is wrapped rather than watched from outside because autograd's engine
    runs it without the caller's torch-function modes.
    """
    record = BackwardRecord()
    own = "backward" in vars(function)
    original = inspect.getattr_static(function, "backward")
    backward = original.__func__ if isinstance(original, staticmethod) else original

    def recorded(ctx, *grads):
        with _Recorder(record.calls):
            result = backward(ctx, *grads)
        record.returned.append(result)
        return result

    function.backward = staticmethod(recorded)
    try:
        yield record
    finally:
        if own:
            function.backward = original
        else:
            del function.backward
