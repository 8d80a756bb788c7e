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
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch.overrides import TorchFunctionMode

from . import attempts, probe

NODE = 1  # the profiler's scope of an event that is a node of autograd running (RecordScope.BACKWARD_FUNCTION)
FORWARD_AD = ("aten::_make_dual", "aten::_unpack_dual")  # what forward-mode AD cannot do without
# Nodes autograd runs of its own accord: accumulating, the root of a graph, and the guard that
# `once_differentiable` calls on a backward's results.
OWN_NODES = ("torch::autograd::AccumulateGrad", "torch::autograd::GraphRoot", "torch::autograd::DelayedError")
RUN = "autograder: watched run"  # the span that marks each run of one profiler session
ENDED = "ended"  # the span after it: the profiler still ran then
LOST = "the profiler that watched it was stopped while it ran"
# Bound when the course is imported, before any notebook code runs: replacing them in torch
# later changes nothing here (and integrity puts torch's back before each test cell).
_PROFILE = torch.autograd.profiler.profile
_RECORD = torch.autograd.profiler.record_function


def prepare() -> None:
    """Fill what the profiler's spans cache on their first use (whether a CUPTI monitor is
    there), so that the integrity snapshot, taken before the notebook runs, holds it: the
    watch's first run is not taken for the notebook changing torch."""
    with _RECORD("autograder: prepared"):
        pass


class _Event(NamedTuple):
    name: str
    start: int
    end: int
    node: bool  # a node autograd ran (any thread)
    sequence: int  # the node's number, in the thread that made it
    thread: int  # the profiler's id of a thread: the one that made the node (a node), or ran the event


class AutogradWatch:
    """Whether a Function asks autograd for its gradient, in any thread and by any route
    (`torch.autograd.grad`, `.backward()`, `torch.func`, the engine's own entry point, a
    node called directly, with torch-function handling disabled, forward-mode AD): while
    it is applied, and while autograd runs its backward, autograd must run no node but the
    Function's own — the node its outputs carry, known by identity (its class was made for
    this Function), not by name. Outputs that carry another node (`apply` replaced by
    plain operations) are evidence too.

    PyTorch's profiler sees every node autograd runs and every operation, in every thread;
    what it saw is the evidence. It watches the runs whose numbers are judged, so a
    backward that behaves otherwise when it is watched is judged as it behaves then, and
    a run it lost sight of (the profiler stopped, paused or restarted by the notebook's
    code, its spans missing, a Function's node run more often than it was seen, a process
    started meanwhile) is evidence in itself. One profiler session (`watching`) watches
    every run of a request (`run`, each marked by a span of its own: starting the profiler
    costs more than a run). Best effort: observed in the student's process.
    """

    def __init__(self, function: Any) -> None:
        self.function = function
        self.evidence: list[list[str]] = []  # per run, in the order they ran
        self.unwatched: str | None = None  # why the watch could not run: no verdict, a look
        self._runs: list[_Run] = []
        # The runs' spans are named with a token of this session, so that spans the student's
        # code makes itself cannot stand in for them (and hide what ran inside the Function).
        self._mark = f"{RUN} {secrets.token_hex(8)} "

    @contextlib.contextmanager
    def watching(self) -> Iterator["AutogradWatch"]:
        from torch._C._profiler import _ExperimentalConfig

        attempts.end_processes()  # a process left running could compute what the watch must see
        try:
            with _quiet_stderr():  # the profiler announces its start and stop on fd 2
                profile = _PROFILE(use_kineto=True, experimental_config=_ExperimentalConfig(profile_all_threads=True))
                profile.__enter__()
        except (RuntimeError, TypeError) as error:  # a profiler of the notebook's own runs, no threads left
            self.unwatched = probe.first_line(error, 200)
            yield self
            self.evidence = [[] for _ in self._runs]
            return
        try:
            yield self
        finally:
            events = _events(profile)
            self.evidence = [run.evidence(events, f"{self._mark}{k}") for k, run in enumerate(self._runs)]

    @contextlib.contextmanager
    def run(self) -> Iterator[Callable[[Any], None]]:
        """One watched run, inside `watching`: its evidence is `evidence[k]`, k counting from
        0. Yields what to call with the Function's result, as soon as it is applied."""
        run = _Run(self.function, attempts.started())
        self._runs.append(run)
        name = f"{self._mark}{len(self._runs) - 1}"
        try:
            with _RECORD(name):
                yield run.applied
        finally:
            run.processes = attempts.started() - run.processes + attempts.running()
            with _RECORD(f"{name} {ENDED}"):  # missing if the profiler was off by then
                pass


@dataclass
class _Run:
    """What one watched run made and did, besides what the profiler saw."""

    function: Any
    processes: int  # the notebook's processes: started so far (at the start), started or running (after)
    own: set[int] = field(default_factory=set)  # the sequence numbers of the Function's own nodes
    strangers: list[str] = field(default_factory=list)  # other nodes its outputs carry
    ran: int = 0  # how often autograd ran one of its own nodes (a hook on each counts)

    def applied(self, result: Any) -> None:
        for output in probe.outputs_of(result):
            if not (probe.differentiable(output) and output.requires_grad):
                continue
            node = output.grad_fn
            if node is None or getattr(type(node), "_forward_cls", None) is not self.function:
                self.strangers.append("nothing autograd records" if node is None else node.name())
            elif node._sequence_nr() not in self.own:
                self.own.add(node._sequence_nr())
                node.register_prehook(self._count)

    def _count(self, grad_outputs: Any) -> None:
        self.ran += 1

    def evidence(self, events: list[_Event] | None, mark: str) -> list[str]:
        """What asked autograd inside the Function in this run (the run's span is named
        `mark`), or shows the watch did not see all of it."""
        found = ["a process of the notebook ran beside it"] if self.processes else []
        if self.strangers:
            return [f"its output came from {', '.join(dict.fromkeys(self.strangers))}, not from the Function "
                    "itself", *found]
        span = next((e for e in events or () if e.name == mark), None)
        if span is None or not any(e.name == f"{mark} {ENDED}" for e in events or ()):
            return [LOST, *found]
        assert events is not None  # (the span is one of them)
        inside = events[bisect.bisect_left(events, span.start, key=_start):
                        bisect.bisect_right(events, span.end, key=_start)]
        # Its own nodes: made in the run's thread, with the numbers its outputs' nodes have.
        own = [(e.start, e.end) for e in inside if e.node and e.sequence in self.own and e.thread == span.thread]
        if len(own) < self.ran:  # autograd ran its node where the profiler did not see it
            return [LOST, *found]
        first = min((start for start, _ in own), default=span.end)  # before it: while it was applied
        asking = dict.fromkeys(e.name for e in inside if (
            (e.node and e.name not in OWN_NODES and not (e.sequence in self.own and e.thread == span.thread))
            or e.name in FORWARD_AD) and (e.start < first or any(a < e.start < b for a, b in own)))
        if asking:
            found.insert(0, f"autograd's engine ran {', '.join(asking)} inside it")
        return found


def _events(profile: Any) -> list[_Event] | None:
    """Every event the profile saw, by start; None if it could not be read (the notebook's
    code stopped the profiler or started another)."""
    try:
        with _quiet_stderr():
            profile.__exit__(None, None, None)
        results = profile.kineto_results
        found = [] if results is None else [_event(e) for e in results.events()]
    except Exception:  # the profiler's own errors, once the notebook's code meddled with it
        return None
    return sorted(found, key=_start)


def _start(event: _Event) -> int:
    return event.start


def _event(e: Any) -> _Event:
    name = e.name()
    node = not name.startswith("aten::") and e.scope() == NODE  # (most events are operations: cheaper)
    return _Event(name, e.start_ns(), e.end_ns(), node, e.sequence_nr() if node else -1,
                  e.fwd_thread_id() if node else e.start_thread_id())


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


MAX_DIMS = 16  # of a shape reported (as many as the wire accepts)


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
        returned = [r[:200] if isinstance(r, str) else None if r is None else [int(n) for n in r[:MAX_DIMS + 1]]
                    for r in data["returned"][:100]]
        if any(isinstance(r, list) and len(r) > MAX_DIMS for r in returned):
            raise ValueError(f"a shape of more than {MAX_DIMS} dimensions")
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
