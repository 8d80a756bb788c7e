"""Notebooks 01_tape_autograd and 02_higher_order_and_fusion in the student's process:
*transcripts*, probe procedures that find the tape through a student function (its
`__globals__`), run the student's code on values chosen by the check, and report what it
computed, as plain tensors. The checks (:mod:`autograder.exercises.tape_autograd`) judge
them against torch.autograd.

While a transcript runs, every operation of the notebook it does not test is replaced by a
*stand-in*: it computes its forward value with torch and records a tape entry, nothing
more. So a mistake in one exercise never costs points in another, and no gradient formula
lives here. When the student's code (its `grad`, its `hvp`) calls the propagate of a
stand-in's entry, the propagate asks the judging side for the input gradients
(`probe.ask`: which function, at which values, with which output gradients) and records
the answer as the outputs of a new entry, whose own propagate asks again, one level of
"the VJP of" deeper: gradients of gradients work. The judging side answers only while a
check runs, and never about the operations under test.

Everything a transcript reports besides computed values (which entries were recorded, with
which inputs and outputs) is best effort: the student's process can forge it.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from types import FrameType
from typing import Any, Callable, Iterator, Sequence

import torch

from . import probe

# name -> (arity, torch implementation of the forward value); the notebook's function is
# `operator_<name>`.
TORCH_OPS: dict[str, tuple[int, Callable[..., Any]]] = {
    "neg": (1, torch.neg),
    "add": (2, torch.add),
    "mul": (2, torch.mul),
    "sum": (1, torch.sum),
    "expand": (1, lambda a, sizes: a.expand(sizes)),
    "t": (1, lambda a: a.t()),
    "exp": (1, torch.exp),
    "sin": (1, torch.sin),
    "cos": (1, torch.cos),
    "matmul": (2, torch.matmul),
    "exp_mul": (2, lambda a, b: a.exp() * b),
    # Entries of the grad checks: first(x, w) = x, whose w gets no gradient (None); an
    # entry whose outputs lead nowhere, whose propagate must never run; and pair(x, w) =
    # (x * w, x + w), one entry with two outputs.
    "first": (2, lambda a, b: a * 1),
    "sentinel": (1, lambda a: a * 2),
    "pair": (2, lambda a, b: (a * b, a + b)),
}
# Operations with more than one output (their forward returns a tuple).
OUTPUTS: dict[str, int] = {"pair": 2}
# Entries of the grad checks' programs that are no operation of the notebooks.
TEST_OPS = ("first", "sentinel", "pair")
# The operations the notebooks define as `operator_<name>` (and a transcript replaces).
NOTEBOOK_OPS = ("neg", "add", "mul", "sum", "expand", "t", "exp", "sin", "cos", "matmul")
# Where a notebook's tape comes from when it imports it (autograder/student/earlier/).
EARLIER = "autograder.student.earlier."


# --- programs: what a check asks the student's code to compute -----------------------------

@dataclass(frozen=True)
class TapeProgram:
    """Straight-line code over a pool of values: `leaves` inputs, then one value per step.

    A step (op, args) applies an operation to pool indices. The loss is `loss` if given,
    else the sum of the last value.
    """

    leaves: int
    steps: tuple[tuple[str, tuple[int, ...]], ...]
    size: tuple[int, ...]  # shape of the leaves, and of every `expand`
    loss: int | None = None

    @functools.cached_property
    def data(self) -> tuple[Any, ...]:
        """Plain data to send; the steps as one string ("neg 0;mul 1 2"), which crosses
        processes far faster than 10,000 small lists."""
        steps = ";".join(" ".join([op, *map(str, args)]) for op, args in self.steps)
        return (self.leaves, steps, list(self.size), self.loss)

    @staticmethod
    def from_data(data: Any) -> "TapeProgram":
        leaves, steps, size, loss = data
        parsed = (step.split(" ") for step in steps.split(";")) if steps else ()
        return TapeProgram(int(leaves), tuple((op, tuple(map(int, args))) for op, *args in parsed),
                       tuple(map(int, size)), None if loss is None else int(loss))

    def listing(self) -> str:
        lines = [f"v{self.leaves + k} = {op}({', '.join(f'v{a}' for a in args)})"
                 for k, (op, args) in enumerate(self.steps)]
        loss = f"L = v{self.loss}" if self.loss is not None else f"L = sum(v{self.leaves + len(self.steps) - 1})"
        return "; ".join(lines + [loss])

    @functools.cached_property
    def producers(self) -> list[list[int]]:
        """For each step, the steps whose values it reads (the graph's edges)."""
        return [[a - self.leaves for a in args if a >= self.leaves] for _, args in self.steps]


def run_program(program: TapeProgram, leaves: list[Any], ops: dict[str, Callable[..., Any]]) -> list[Any]:
    """The pool of values: the leaves, then each step's outputs (one, or all of a tuple)."""
    pool = list(leaves)
    for op, args in program.steps:
        extra = (program.size,) if op == "expand" else ()
        result = ops[op](*[pool[i] for i in args], *extra)
        if isinstance(result, tuple):
            pool.extend(result)
        else:
            pool.append(result)
    return pool


def loss_of(program: TapeProgram, pool: list[Any], total: Callable[[Any], Any]) -> Any:
    return pool[program.loss] if program.loss is not None else total(pool[-1])


class TapeMissing(Exception):
    """The notebook's tape definitions have not been run."""


class SkippedEntryCalled(Exception):
    """Raised by an entry that grad must skip."""


class Tape:
    """The tape of a student's notebook, found from one of its functions."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.ns: dict[str, Any] = getattr(fn, "__globals__", {})
        for name in ("Variable", "TapeEntry", "gradient_tape", "record"):
            if name not in self.ns:
                raise TapeMissing(f"`{name}` is not defined: run the cells above (the tape's definitions) first.")
        self.Variable = self.ns["Variable"]
        self.tape: list[Any] = self.ns["gradient_tape"]
        # A notebook that imports its tape (02 imports 01's model answers): the tape's operations
        # look each other up in their own module, so stand-ins and watchers go there as well.
        home = getattr(self.Variable, "__module__", "")
        self.spaces: list[dict[str, Any]] = [self.ns]
        if home.startswith(EARLIER) and home in sys.modules:
            self.spaces.append(vars(sys.modules[home]))

    def var(self, value: torch.Tensor) -> Any:
        return self.Variable(value.detach().clone())

    def record(self, op: str, inputs: list[Any], outputs: list[Any], propagate: Callable[..., Any]) -> None:
        self.ns["record"](op, inputs, outputs, propagate)  # looked up now: a transcript may watch it

    def ops(self) -> dict[str, Callable[..., Any]]:
        """The notebook's operations (the student's or stand-ins), plus those of the grad checks."""
        found = {name: self.ns[f"operator_{name}"] for name in (*NOTEBOOK_OPS, "exp_mul")
                 if f"operator_{name}" in self.ns}
        return {**found, "first": stand_in(self, "first"), "sentinel": self._sentinel, "pair": self._pair}

    def _sentinel(self, a: Any) -> Any:
        def must_not_run(dL_doutputs: Any) -> None:
            raise SkippedEntryCalled

        r = self.Variable(TORCH_OPS["sentinel"][1](a.value))
        self.record("sentinel", [a], [r], must_not_run)
        return r

    def _pair(self, a: Any, b: Any) -> tuple[Any, ...]:
        """One entry with two outputs; its propagate gets one gradient per output (None for
        an output without one) and asks the judging side, like a stand-in's."""
        outputs = [self.Variable(v) for v in TORCH_OPS["pair"][1](a.value, b.value)]

        def propagate(dL_doutputs: Any) -> Any:
            return _ask(self, "pair", None, 0, [a, b], (True, True), dL_doutputs)

        self.record("pair", [a, b], outputs, propagate)
        return tuple(outputs)

    @contextlib.contextmanager
    def isolated(self, keep: Sequence[str] = (), recorder: "Recorder | None" = None) -> Iterator["Tape"]:
        """An empty tape and stand-ins for the notebook's operations (except `keep`); with
        a `recorder`, every entry recorded meanwhile is logged. Restored afterwards."""
        saved_tape = list(self.tape)
        patched = {f"operator_{op}": stand_in(self, op) for op in NOTEBOOK_OPS if op not in keep}
        if recorder is not None:
            patched["record"] = recorder.watching(self.ns["record"])
        saved = [(space, {k: space[k] for k in (*patched, "_name") if k in space}) for space in self.spaces]
        self.tape.clear()
        for space in self.spaces:
            space.update(patched)
        try:
            yield self
        finally:
            self.tape[:] = saved_tape
            for space, before in saved:
                for k in patched:
                    space.pop(k, None)
                space.update(before)


# --- stand-ins: forward values here, gradients from the judging side ------------------------

def stand_in(tape: Tape, op: str) -> Callable[..., Any]:
    """`operator_<op>` computing the forward value with torch; its entry's propagate asks.

    Written for speed (the deep chain makes 10,000 of them): few objects per call, and no
    reference from the entry back to its output (no reference cycle)."""
    arity, forward = TORCH_OPS[op]
    ns, Variable = tape.ns, tape.Variable

    spec = (tape, op, arity)

    def operation(*args: Any) -> Any:
        if len(args) != arity + (op == "expand"):
            raise TypeError(f"operator_{op} takes {arity + (op == 'expand')} arguments, got {len(args)}")
        if arity == 1:
            a, b = args[0], ([int(s) for s in args[1]] if op == "expand" else None)
            r = Variable(forward(a.value, *args[1:]))
            ns["record"](op, [a], [r], _StandInPropagate(spec, a, b))
        else:
            a, b = args
            r = Variable(forward(a.value, b.value))
            ns["record"](op, [a, b], [r], _StandInPropagate(spec, a, b))
        return r

    operation.__name__ = operation.__qualname__ = f"operator_{op}"
    return operation


_ONE_OUTPUT = (True,)


class _StandInPropagate:
    """The propagate of a stand-in's entry: it keeps the operation's arguments, nothing
    more (one small object per entry: the deep chain makes 10,000)."""

    __slots__ = ("a", "b", "spec")  # (tape, op, arity); the inputs, or the input and expand's sizes

    def __init__(self, spec: tuple[Any, ...], a: Any, b: Any) -> None:
        self.spec, self.a, self.b = spec, a, b

    def __call__(self, dL_doutputs: Any) -> list[Any]:
        tape, op, arity = self.spec
        inputs = [self.a, self.b] if arity == 2 else [self.a]
        return _ask(tape, op, self.b if op == "expand" else None, 0, inputs, _ONE_OUTPUT, dL_doutputs)


def _label(op: str, depth: int) -> str:
    return "d(" * depth + op + ")" * depth


def _ask(tape: Tape, op: str, sizes: list[Any] | None, depth: int, inputs: list[Any], present: Sequence[bool],
         dL_doutputs: Any) -> list[Any]:
    """The propagate of an entry `outputs = F(inputs)`, F being `op` differentiated `depth`
    times (the VJP of the VJP ...); None among F's inputs and outputs stands for a zero and
    is no input or output of the entry (`present`: which outputs are). It asks the judging
    side, and records the answer as the outputs of an entry of F's VJP."""
    arriving = iter(dL_doutputs)
    grads = [next(arriving, None) if p else None for p in present]
    if all(g is None for g in grads):  # nothing arrives: nothing to ask
        return [None] * sum(v is not None for v in inputs)
    answer = probe.ask({
        "op": op, "sizes": sizes, "vjp": depth,
        "inputs": [None if v is None else v.value.detach() for v in inputs],
        "grads": [None if g is None else g.value.detach() for g in grads],
    })
    if not isinstance(answer, list) or len(answer) != len(inputs) or not all(
        a is None or isinstance(a, torch.Tensor) for a in answer
    ):
        raise probe.Malformed("malformed answer from the judging side")
    results = [None if a is None or v is None else tape.Variable(a) for a, v in zip(answer, inputs)]
    if any(r is not None for r in results):
        deeper, found = [*inputs, *grads], [r is not None for r in results]

        def propagate(dL_doutputs: Any) -> Any:
            return _ask(tape, op, sizes, depth + 1, deeper, found, dL_doutputs)

        tape.record(_label(op, depth + 1), [v for v in deeper if v is not None], [r for r in results if r is not None],
                    propagate)
    return [r for r, v in zip(results, inputs) if v is not None]


# --- what the student's code recorded ----------------------------------------------------------

class Recorder:
    """Numbers every Variable the transcript creates or an entry records, keeps its name and
    value, and logs each entry recorded through the notebook's `record` as (op, input
    numbers, output numbers): the judge rebuilds that computation with torch."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.number: dict[int, int] = {}
        self.kept: list[Any] = []  # keeps the Variables alive, so their ids stay theirs
        self.names: list[str] = []
        self.values: list[torch.Tensor] = []
        self.entries: list[list[Any]] = []

    def key(self, v: Any) -> int:
        k = self.number.get(id(v))
        if k is None:
            k = self.number[id(v)] = len(self.kept)
            self.kept.append(v)
            self.names.append(str(getattr(v, "name", "?")))
            value = getattr(v, "value", None)
            self.values.append(value.detach() if isinstance(value, torch.Tensor) else torch.zeros(0))
        return k

    def watching(self, record: Callable[..., Any]) -> Callable[..., Any]:
        def watched(op: Any, inputs: list[Any], outputs: list[Any], propagate: Callable[..., Any]) -> None:
            record(op, inputs, outputs, propagate)
            self.entries.append([str(op), [self.key(v) for v in inputs], [self.key(v) for v in outputs]])

        return watched

    def data(self) -> dict[str, Any]:
        """As a few strings and tensors, which cross processes far faster than many small
        ones: names and ops joined by NUL; each entry as (inputs, outputs, input keys...,
        output keys...) and each value's shape as (dims, sizes...) in int64 tensors; the
        values flattened, in float64, into one."""
        values = [_as_float64(v) for v in self.values]
        return {
            "names": SEPARATOR.join(n.replace(SEPARATOR, "") for n in self.names),
            "ops": SEPARATOR.join(op.replace(SEPARATOR, "") for op, _, _ in self.entries),
            "structure": torch.tensor([x for _, ins, outs in self.entries for x in (len(ins), len(outs), *ins, *outs)],
                                      dtype=torch.int64),
            "shapes": torch.tensor([x for v in values for x in (v.dim(), *v.shape)], dtype=torch.int64),
            "values": torch.cat([v.reshape(-1) for v in values]) if values else torch.zeros(0, dtype=torch.float64),
        }


SEPARATOR = "\x00"


def _as_float64(value: torch.Tensor) -> torch.Tensor:
    if value.is_complex() or value.device.type != "cpu":
        return torch.zeros(value.shape, dtype=torch.float64)
    return value.detach().to(torch.float64)


def _error(stage: str, exc: BaseException) -> dict[str, Any]:
    return {"stage": stage, "type": type(exc).__name__, "message": str(exc)}


def _as_record(x: Any) -> Any:
    """What the student's code returned, as data: None, {"variable": value}, or its type."""
    if x is None:
        return None
    value = getattr(x, "value", None)
    if isinstance(value, torch.Tensor) and not isinstance(x, torch.Tensor):
        return {"variable": value.detach()}
    return {"type": type(x).__name__}


def _is_variable(x: Any) -> bool:
    return isinstance(_as_record(x), dict) and "variable" in _as_record(x)


def _as_records(xs: Any) -> Any:
    if not isinstance(xs, (list, tuple)):
        return {"type": type(xs).__name__}
    return [_as_record(x) for x in xs]


# --- probe procedures ------------------------------------------------------------------------

@probe.procedure
def entry_transcript(anchor: Callable[..., Any], keep: list[Any], cases: list[Any]) -> list[Any]:
    """For each case, the student's `operator_<op>` on fresh Variables: its result, whether
    it recorded one entry with the result among its outputs, what that entry's propagate
    returns for each pattern of output gradients, and everything recorded meanwhile.

    A case: {"op", "inputs": distinct values, "args": the input of each argument position,
    "extra": further arguments, "grads": [dL_dr, gradients for other outputs...]}. With
    one output, propagate gets [dL_dr]; with several, first dL_dr alone (None for the
    others), then each other output's gradient alone, then all of them.
    """
    try:
        tape = Tape(anchor)
    except TapeMissing as missing:
        return [{"error": _error("setup", missing)} for _ in cases]
    recorder = Recorder()
    with tape.isolated(keep, recorder):
        return [_entry_case(tape, recorder, case) for case in cases]


def _entry_case(tape: Tape, recorder: "Recorder", case: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"error": None, "value": None, "recorded": False, "result": None, "calls": [], "graph": None}
    recorder.clear()
    tape.tape.clear()
    fn = tape.ns.get(f"operator_{case['op']}")
    if fn is None:
        out["error"] = _error("setup", TapeMissing(f"`operator_{case['op']}` is not defined."))
        return out
    vs = [tape.var(x) for x in case["inputs"]]
    for v in vs:
        recorder.key(v)
    stage = "forward"
    try:
        r = fn(*[vs[i] for i in case["args"]], *case["extra"])
        out["value"] = _as_record(r)
        entry = tape.tape[0] if len(tape.tape) == 1 else None
        if entry is None or len(recorder.entries) != 1 or getattr(r, "name", None) not in entry.outputs:
            return out
        out["recorded"] = True
        outputs = recorder.entries[0][2]
        at = next((j for j, k in enumerate(outputs) if recorder.kept[k] is r), entry.outputs.index(r.name))
        out["result"] = at
        others = iter(range(1, len(case["grads"])))
        given = [0 if j == at else next(others, None) for j in range(len(outputs))]
        alone = ([i if j == k else None for j, i in enumerate(given)]
                 for k in [at, *(j for j in range(len(given)) if j != at)])
        patterns = [given] if len(given) == 1 else [p for p in [*alone, given] if any(i is not None for i in p)]
        stage = "propagate"
        for pattern in patterns:
            gs = [None if i is None else tape.var(case["grads"][i]) for i in pattern]
            call: dict[str, Any] = {"pattern": pattern, "keys_in": [None if g is None else recorder.key(g) for g in gs],
                          "error": None, "grads": None, "keys": None}
            out["calls"].append(call)
            try:
                grads = entry.propagate(gs)
                call["grads"] = _as_records(grads)
                if isinstance(grads, (list, tuple)):
                    call["keys"] = [recorder.key(g) if _is_variable(g) else None for g in grads]
            except Exception as exc:  # the student's code may raise anything
                call["error"] = _error("propagate", exc)
    except Exception as exc:  # the student's code may raise anything
        out["error"] = _error(stage, exc)
    finally:
        out["graph"] = recorder.data()
    return out


@probe.procedure
def program_transcript(grad: Callable[..., Any], keep: list[Any], program: tuple[Any, ...], xs: list[Any],
                       walk: str = "tape") -> dict[str, Any]:
    """A program on the student's tape, walked by the student's `grad`: the gradients of its
    loss and, when all went well, of the squared norm of those gradients.

    With walk="order", grad is given the entries to walk (`order=`, the tape's entries
    newest first) and an empty tape: first order only."""
    out: dict[str, Any] = {"error": None, "skipped_entry_called": False, "grads": None, "second": None}
    try:
        tape = Tape(grad)
    except TapeMissing as missing:
        out["error"] = _error("setup", missing)
        return out
    prog = TapeProgram.from_data(program)
    with tape.isolated(keep):
        ops = tape.ops()
        stage = "forward"
        try:
            vs = [tape.var(x) for x in xs]
            L0 = loss_of(prog, run_program(prog, vs, ops), ops["sum"])
            stage = "backward"
            if walk == "order":
                order = list(reversed(tape.tape))
                tape.tape.clear()
                out["grads"] = _as_records(grad(L0, vs, order=order))
                return out
            grads = grad(L0, vs)
            out["grads"] = _as_records(grads)
            live = [g for g in grads if _is_variable(g)]
            if not live:
                return out
            stage = "second backward"
            total = None
            for g in live:
                square = ops["mul"](g, g)
                total = square if total is None else ops["add"](total, square)
            out["second"] = _as_records(grad(ops["sum"](total), vs))
        except SkippedEntryCalled:
            out["skipped_entry_called"] = True
        except Exception as exc:  # the student's code may raise anything
            out["error"] = _error(stage, exc)
    return out


@probe.procedure
def order_transcript(topological_order: Callable[..., Any], program: tuple[Any, ...], xs: list[Any]) -> dict[str, Any]:
    """The student's topological order of a program's graph, as step indices (-1: an entry
    of no step, -2: not an entry)."""
    try:
        tape = Tape(topological_order)
    except TapeMissing as missing:
        return {"error": _error("setup", missing), "order": None}
    prog = TapeProgram.from_data(program)
    with tape.isolated():
        ops = tape.ops()
        with _collector_paused():  # 10,000 entries, each in a reference cycle with its output
            pool = run_program(prog, [tape.var(x) for x in xs], ops)
        step_of = {id(entry): k for k, entry in enumerate(tape.tape)}
        watch = RecursionWatch()
        try:
            with watch:
                order = list(topological_order(pool[-1].grad_fn))
        except Exception as exc:  # the student's code may raise anything
            return {"error": _error("topological_order", exc), "order": None, "recursion": watch.data()}
        entry_type = tape.ns["TapeEntry"]
        steps = (step_of.get(id(e), -1) if isinstance(e, entry_type) else -2 for e in order)
        # one string: 10,000 numbers cross fast
        return {"error": None, "order": " ".join(map(str, steps)), "recursion": watch.data()}


class RecursionWatch:
    """Runs code with Python's default recursion limit (above the frames already running),
    whatever limit the notebook set, and notes how deeply any one function was nested
    meanwhile (`sys.settrace`, call and return events only) and whether the code changed
    the limit. A function nested deeper than `NESTED` is stopped there with a
    RecursionError, before a deep recursion under a raised limit exhausts the C stack.
    Best effort: it runs in the student's process, whose code can switch the tracer off."""

    _limit: int  # the limit, tracer and thread tracer to put back, set on entering
    _tracer: Callable[..., Any] | None
    _thread_tracer: Callable[..., Any] | None
    _pinned: int

    LIMIT = 1000  # Python's default
    NESTED = 100  # deeper than any solution without recursion nests; far shallower than the graphs

    def __init__(self) -> None:
        self.active: Counter[str] = Counter()
        self.deepest, self.function = 0, ""
        self.limit_changed, self.untraced = False, False

    def _return(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "return":
            self.active[frame.f_code] -= 1
        return self._return

    def _call(self, frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        self.active[code] += 1
        if self.active[code] > self.deepest:
            self.deepest, self.function = self.active[code], code.co_name
        if self.deepest > self.NESTED:  # (raised here, it stops the call and switches tracing off)
            raise RecursionError(f"`{code.co_name}` nested more than {self.NESTED} deep: stopped by the check")
        frame.f_trace_lines = False
        return self._return

    def __enter__(self) -> "RecursionWatch":
        frame: FrameType | None
        depth, frame = 0, sys._getframe()
        while frame is not None:
            depth, frame = depth + 1, frame.f_back
        self._limit, self._tracer, self._thread_tracer = sys.getrecursionlimit(), sys.gettrace(), threading.gettrace()
        self._pinned = depth + self.LIMIT
        sys.setrecursionlimit(self._pinned)
        sys.settrace(self._call)
        threading.settrace(self._call)  # threads the code starts
        return self

    def __exit__(self, *exc: Any) -> None:
        self.untraced = sys.gettrace() != self._call  # (a bound method: equal, never identical)
        sys.settrace(self._tracer)
        threading.settrace(self._thread_tracer)
        self.limit_changed = sys.getrecursionlimit() != self._pinned
        sys.setrecursionlimit(self._limit)

    def data(self) -> dict[str, Any]:
        return {"deepest": self.deepest, "function": self.function, "limit_changed": self.limit_changed,
                "untraced": self.untraced}


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a long program is built: its passes over the
    growing graph cost a quarter of building it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@probe.procedure
def hvp_transcript(hvp: Callable[..., Any], f: Callable[[Any], Any], x: torch.Tensor,
                   v: torch.Tensor) -> dict[str, Any]:
    try:
        tape = Tape(hvp)
    except TapeMissing as missing:
        return {"error": _error("setup", missing), "result": None}
    with tape.isolated():
        try:
            return {"error": None, "result": _as_record(hvp(f, tape.var(x), tape.var(v)))}
        except Exception as exc:  # the student's code may raise anything
            return {"error": _error("hvp", exc), "result": None}


# Functions of one Variable that work on torch tensors as well (same methods); handed to
# the student's hvp, so registered to cross processes by name.
HVP_FUNCTIONS: dict[str, Callable[[Any], Any]] = {
    name: probe.reference(f"{__name__}:hvp {name}", fn)
    for name, fn in {
        "sum(sin(x) * x)": lambda x: (x.sin() * x).sum(),
        "sum(exp(x) * exp(x))": lambda x: (x.exp() * x.exp()).sum(),
        "sum(x * x * x)": lambda x: (x * x * x).sum(),
        "sum(cos(x @ x))": lambda x: (x @ x).cos().sum(),
        "sum(x + x)": lambda x: (x + x).sum(),
    }.items()
}
