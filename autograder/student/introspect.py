"""Look inside a student's backward: which torch functions it calls, what it returns."""
from __future__ import annotations

import contextlib
import inspect
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode

from . import probe

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
    received: list[list[bool]] = field(default_factory=list)  # per call: which gradients were None

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
        record.received.append([g is None for g in grads])
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


@dataclass
class BackwardFacts:
    """One backward of a student's Function, as seen from inside."""

    calls: Counter[str]  # torch functions called, by name
    returned: list[list[int] | str | None]  # per returned value: its shape, None, or its type's name
    error: probe.ProbeError | None = None
    received_none: list[bool] = field(default_factory=list)  # per gradient it received: was it None

    @property
    def matmuls(self) -> int:
        return sum(n for name, n in self.calls.items() if name in MATMULS)


def record_backward(function: type[torch.autograd.Function], args: tuple, used: list[int] | None = None) -> BackwardFacts:
    """Apply `function` to `args` (tensors keep their requires_grad), run backward with
    gradients of ones for its outputs (for the outputs numbered in `used` only, if given:
    the others are left unused), and report what its backward did.

    Gathered in the student's process: a grader can only take it as best effort.
    """
    data = probe.invoke(_record_backward, function, tuple(args), used)
    try:
        calls = Counter({str(k): int(v) for k, v in data["calls"].items()})
        returned = [r if r is None or isinstance(r, str) else [int(n) for n in r] for r in data["returned"]]
        received = [bool(r) for r in data.get("received_none", [])]
        return BackwardFacts(calls, returned, probe.ProbeError.from_data(data["error"]), received)
    except (AttributeError, KeyError, TypeError, ValueError) as bad:
        raise probe.Malformed(f"malformed backward facts: {bad}") from None


@probe.procedure
def _record_backward(function: type[torch.autograd.Function], args: tuple, used: list | None = None) -> dict:
    if not (isinstance(function, type) and issubclass(function, torch.autograd.Function)):
        error = probe.ProbeError("forward", "TypeError", f"{function!r} is not a torch.autograd.Function")
        return {"calls": {}, "returned": [], "error": asdict(error)}
    stage, record = "forward", BackwardRecord()
    try:
        with backward_calls(function) as record:
            outs = [o for o in probe.outputs_of(function.apply(*args)) if probe.differentiable(o) and o.requires_grad]
            if used is not None:
                outs = [o for k, o in enumerate(outs) if k in used]
            stage = "backward"
            wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            torch.autograd.grad(outs, wrt, [torch.ones_like(o) for o in outs], allow_unused=True)
    except Exception as exc:  # the student's code may raise anything
        error = asdict(probe.ProbeError.of(stage, exc))
        return {"calls": dict(record.calls), "returned": [], "error": error}
    first = record.returned[0] if record.returned else ()
    first = first if isinstance(first, tuple) else (first,)
    returned = [None if g is None else list(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__ for g in first]
    received = record.received[0] if record.received else []
    return {"calls": dict(record.calls), "returned": returned, "error": None, "received_none": received}
