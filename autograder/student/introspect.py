"""Look inside a student's backward: which torch functions it calls, what it returns, and
whether it asks autograd for the gradient (`AutogradWatch`)."""
from __future__ import annotations

import bisect
import contextlib
import inspect
import os
import secrets
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode

from . import probe

EVALUATE = "autograd::engine::evaluate_function: "  # the profiler's name of a node the engine runs
FORWARD_AD = ("aten::_make_dual", "aten::_unpack_dual")  # what forward-mode AD cannot do without
OWN_NODES = ("torch::autograd::AccumulateGrad", "torch::autograd::GraphRoot")
RUN = "autograder: watched run"  # the span that marks each run of one profiler session


class AutogradWatch:
    """Whether a Function asks autograd for its gradient, in any thread and by any route
    (`torch.autograd.grad`, `.backward()`, `torch.func`, the engine's own entry point,
    with torch-function handling disabled, forward-mode AD): while it is applied, and
    while autograd runs its backward, the engine must run no node but the Function's own.

    PyTorch's profiler sees every node the engine runs and every operation, in every
    thread; what it saw is the evidence. It watches the runs whose numbers are judged,
    so a backward that behaves otherwise when it is watched is judged as it behaves then.
    One profiler session (`watching`) watches every run of a request (`run`, each marked
    by a span of its own: starting the profiler costs more than a run). Best effort:
    observed in the student's process.
    """

    def __init__(self, function: Any) -> None:
        self.own = f"{EVALUATE}{function.__name__}Backward"
        self.evidence: list[list[str]] = []  # per run, in the order they ran
        self.unwatched: str | None = None  # why the watch could not run: no verdict, a look
        self._runs = 0
        # The runs' spans are named with a token of this session, so that spans the student's
        # code makes itself cannot stand in for them (and hide what ran inside the Function).
        self._mark = f"{RUN} {secrets.token_hex(8)} "

    @contextlib.contextmanager
    def watching(self) -> Iterator["AutogradWatch"]:
        from torch._C._profiler import _ExperimentalConfig

        try:
            with _quiet_stderr():  # the profiler announces its start and stop on fd 2
                profile = torch.autograd.profiler.profile(
                    use_kineto=True, experimental_config=_ExperimentalConfig(profile_all_threads=True))
                profile.__enter__()
        except (RuntimeError, TypeError) as error:  # a profiler of the notebook's own runs, no threads left
            self.unwatched = probe.first_line(error, 200)
            yield self
            self.evidence = [[] for _ in range(self._runs)]
            return
        try:
            yield self
        finally:
            with _quiet_stderr():
                profile.__exit__(None, None, None)
            assert profile.kineto_results is not None  # __exit__ has collected them
            # (name, start, end) of every event, by start: each run's are a slice
            events = sorted(((e.name(), e.start_ns(), e.start_ns() + e.duration_ns())
                             for e in profile.kineto_results.events()), key=lambda e: e[1])
            starts = [start for _, start, _ in events]
            runs: dict[str, tuple[int, int]] = {}
            for name, start, end in events:
                if name.startswith(self._mark):
                    runs.setdefault(name, (start, end))
            self.evidence = [self._found(events[bisect.bisect_left(starts, window[0]):
                                                bisect.bisect_right(starts, window[1])])
                             if window is not None else []
                             for window in (runs.get(f"{self._mark}{k}") for k in range(self._runs))]

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        """One watched run, inside `watching`: its evidence is `evidence[k]`, k counting from 0."""
        self._runs += 1
        with torch.autograd.profiler.record_function(f"{self._mark}{self._runs - 1}"):
            yield

    def _found(self, events: list[tuple[str, int, int]]) -> list[str]:
        """The nodes and forward-AD operations among one run's `events` ((name, start, end)
        each) that ran while the Function was applied (before the engine first ran its node)
        or inside its node."""
        spans = sorted((start, end) for name, start, end in events if name == self.own)
        if not spans:
            return []
        first = spans[0][0]
        found: dict[str, None] = {}
        for name, start, _ in events:
            asking = name.startswith(EVALUATE) and name != self.own and name[len(EVALUATE):] not in OWN_NODES
            if (asking or name in FORWARD_AD) and (start < first or any(a < start < b for a, b in spans)):
                found[name.removeprefix(EVALUATE)] = None
        return list(found)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)

# Calls that multiply matrices: what a gradient nobody needs must not cost.
MATMULS = frozenset(
    {"matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "linear", "mv", "addmv", "dot", "inner", "tensordot"}
)


class _Recorder(TorchFunctionMode):
    def __init__(self, counts: Counter[str]) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
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

    def recorded(ctx: Any, *grads: Any) -> Any:
        record.received.append([g is None for g in grads])
        with _Recorder(record.calls):
            result = backward(ctx, *grads)
        record.returned.append(result)
        return result

    function.backward = staticmethod(recorded)  # type: ignore[method-assign]  # wrapped while recording
    try:
        yield record
    finally:
        if own:
            function.backward = original  # type: ignore[method-assign]
        else:
            del function.backward


@dataclass
class BackwardFacts:
    """One backward of a student's Function, as seen from inside."""

    calls: Counter[str]  # torch functions called, by name
    returned: list[list[int] | str | None]  # per returned value: its shape, None, or its type's name
    error: probe.ProbeError | None = None
    received_none: list[bool] = field(default_factory=list)  # per gradient it received: was it None
    # per returned value: the very tensor also returned for another input (it cost nothing more)
    shared: list[bool] = field(default_factory=list)

    @property
    def matmuls(self) -> int:
        return sum(n for name, n in self.calls.items() if name in MATMULS)


def record_backward(function: type[torch.autograd.Function], args: tuple[Any, ...],
                    used: list[int] | None = None) -> BackwardFacts:
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
        shared = [bool(r) for r in data.get("shared", [])]
        return BackwardFacts(calls, returned, probe.ProbeError.from_data(data["error"]), received, shared)
    except (AttributeError, KeyError, TypeError, ValueError) as bad:
        raise probe.Malformed(f"malformed backward facts: {bad}") from None


@probe.procedure
def _record_backward(function: type[torch.autograd.Function], args: tuple[Any, ...],
                     used: list[Any] | None = None) -> dict[str, Any]:
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
    returned = [None if g is None else list(g.shape) if isinstance(g,
                                                                   torch.Tensor) else type(g).__name__ for g in first]
    received = record.received[0] if record.received else []
    shared = [g is not None and any(g is h for j, h in enumerate(first) if j != k) for k, g in enumerate(first)]
    return {"calls": dict(record.calls), "returned": returned, "error": None, "received_none": received,
            "shared": shared}
