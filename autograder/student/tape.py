"""Notebooks 01_tape_autograd and 02_higher_order_and_fusion in the student's process:
*transcripts*, probe procedures that find the tape through a student function (its
`__globals__`), run the student's code on values chosen by the check, and report what it
computed, as plain tensors. The checks (:mod:`autograder.exercises.tape_autograd`) judge
them against torch.autograd.

While a transcript runs, every operation it does not test is replaced by a reference
implementation, so a mistake in one exercise never costs points in another.
"""
from __future__ import annotations

import contextlib
import functools
import gc
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from . import probe

# name -> (arity, torch implementation); the notebook's function is `operator_<name>`.
TORCH_OPS: dict[str, tuple[int, Callable[..., torch.Tensor]]] = {
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
    # Entries of the grad checks: first(x, w) = x, whose propagate returns [g, None]; and an
    # entry recorded after the loss, whose propagate must never run.
    "first": (2, lambda a, b: a * 1),
    "sentinel": (1, lambda a: a * 2),
}


# --- programs: what a check asks the student's code to compute -----------------------------

@dataclass(frozen=True)
class Program:
    """Straight-line code over a pool of values: `leaves` inputs, then one value per step.

    A step (op, args) applies an operation to pool indices. The loss is `loss` if given,
    else the sum of the last value.
    """

    leaves: int
    steps: tuple[tuple[str, tuple[int, ...]], ...]
    size: tuple[int, ...]  # shape of the leaves, and of every `expand`
    loss: int | None = None

    @functools.cached_property
    def data(self) -> tuple:
        """Plain data to send; the steps as one string ("neg 0;mul 1 2"), which crosses
        processes far faster than 10,000 small lists."""
        steps = ";".join(" ".join([op, *map(str, args)]) for op, args in self.steps)
        return (self.leaves, steps, list(self.size), self.loss)

    @staticmethod
    def from_data(data: Any) -> "Program":
        leaves, steps, size, loss = data
        parsed = (step.split(" ") for step in steps.split(";")) if steps else ()
        return Program(int(leaves), tuple((op, tuple(map(int, args))) for op, *args in parsed),
                       tuple(map(int, size)), None if loss is None else int(loss))

    def listing(self) -> str:
        lines = [f"v{self.leaves + k} = {op}({', '.join(f'v{a}' for a in args)})" for k, (op, args) in enumerate(self.steps)]
        loss = f"L = v{self.loss}" if self.loss is not None else f"L = sum(v{self.leaves + len(self.steps) - 1})"
        return "; ".join(lines + [loss])

    @functools.cached_property
    def producers(self) -> list[list[int]]:
        """For each step, the steps whose values it reads (the graph's edges)."""
        return [[a - self.leaves for a in args if a >= self.leaves] for _, args in self.steps]


def run_program(program: Program, leaves: list, ops: dict[str, Callable[..., Any]]) -> list:
    pool = list(leaves)
    for op, args in program.steps:
        extra = (program.size,) if op == "expand" else ()
        pool.append(ops[op](*[pool[i] for i in args], *extra))
    return pool


def loss_of(program: Program, pool: list, total: Callable[[Any], Any]) -> Any:
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
        self.tape: list = self.ns["gradient_tape"]

    def var(self, value: torch.Tensor):
        return self.Variable(value.detach().clone())

    def ops(self) -> dict[str, Callable[..., Any]]:
        """The notebook's operations (student's or reference), plus those of the grad checks."""
        found = {name: self.ns[f"operator_{name}"] for name in TORCH_OPS if f"operator_{name}" in self.ns}
        return {**found, **self._grad_check_ops()}

    def _grad_check_ops(self) -> dict[str, Callable[..., Any]]:
        record = self.ns["record"]

        def first(a, b):
            r = self.Variable(a.value.clone())
            record("first", [a, b], [r], lambda g: [g[0], None])
            return r

        def sentinel(a):
            def must_not_run(g):
                raise SkippedEntryCalled

            r = self.Variable(a.value * 2)
            record("sentinel", [a], [r], must_not_run)
            return r

        return {"first": first, "sentinel": sentinel}

    @contextlib.contextmanager
    def isolated(self, keep: Sequence[str] = ()) -> Iterator["Tape"]:
        """An empty tape and reference operations (except `keep`); restored afterwards."""
        saved_tape, saved_name = list(self.tape), self.ns.get("_name")
        patched = {f"operator_{op}": impl for op, impl in reference_ops(self).items() if op not in keep}
        saved_ops = {k: self.ns[k] for k in patched if k in self.ns}
        self.tape.clear()
        self.ns.update(patched)
        try:
            yield self
        finally:
            self.tape[:] = saved_tape
            for k in patched:
                self.ns.pop(k, None)
            self.ns.update(saved_ops)
            if saved_name is not None:
                self.ns["_name"] = saved_name


def reference_ops(tape: Tape) -> dict[str, Callable[..., Any]]:
    """Correct operations recording on the student's tape, for everything not under test."""
    V, record = tape.Variable, tape.ns["record"]

    def op(name, inputs, value, propagate):
        r = V(value)
        record(name, list(inputs), [r], propagate)
        return r

    return {
        "neg": lambda a: op("neg", [a], -a.value, lambda g: [-g[0]]),
        "add": lambda a, b: op("add", [a, b], a.value + b.value, lambda g: [g[0], g[0]]),
        "mul": lambda a, b: op("mul", [a, b], a.value * b.value, lambda g: [g[0] * b, g[0] * a]),
        "sum": lambda a: op("sum", [a], a.value.sum(), lambda g: [g[0].expand(tuple(a.value.shape))]),
        "expand": lambda a, sizes: op("expand", [a], a.value.expand(sizes), lambda g: [g[0].sum()]),
        "t": lambda a: op("t", [a], a.value.t(), lambda g: [g[0].t()]),
        "exp": lambda a: _exp(op, a),
        "sin": lambda a: op("sin", [a], a.value.sin(), lambda g: [g[0] * a.cos()]),
        "cos": lambda a: op("cos", [a], a.value.cos(), lambda g: [-(g[0] * a.sin())]),
        "matmul": lambda a, b: op("matmul", [a, b], a.value @ b.value, lambda g: [g[0] @ b.t(), a.t() @ g[0]]),
    }


def _exp(op, a):
    box: list = []
    r = op("exp", [a], a.value.exp(), lambda g: [g[0] * box[0]])
    box.append(r)  # exp saves its output
    return r


def reference_grad(tape: Tape, L, wrt: Sequence[Any]) -> list:
    """The tape walk of notebook 01, accumulating with recorded additions."""
    grads = {L.name: tape.Variable(torch.ones_like(L.value))}
    for entry in reversed(list(tape.tape)):
        outs = [grads.get(n) for n in entry.outputs]
        if all(g is None for g in outs):
            continue
        for name, g in zip(entry.inputs, entry.propagate(outs)):
            if g is not None:
                grads[name] = grads[name] + g if name in grads else g
    return [grads.get(v.name) for v in wrt]


def _error(stage: str, exc: BaseException) -> dict:
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


@probe.procedure
def op_transcript(fn: Callable[..., Any], keep: list, inputs: list, extra: tuple, dL_dr: torch.Tensor,
                   us: list) -> dict:
    """One operation: its value, what its propagate returns for dL_dr, and the gradients of
    sum(<propagate's results, us>) by a reference walk of the tape."""
    out: dict = {"error": None, "value": None, "recorded": False, "grads": None, "second": None}
    try:
        tape = Tape(fn)
    except TapeMissing as missing:
        out["error"] = _error("setup", missing)
        return out
    with tape.isolated(keep):
        vs = [tape.var(x) for x in inputs]
        before = len(tape.tape)
        stage = "forward"
        try:
            r = fn(*vs, *extra)
            out["value"] = _as_record(r)
            out["recorded"] = len(tape.tape) == before + 1 and tape.tape[-1].outputs == [getattr(r, "name", None)]
            if not out["recorded"]:
                return out
            stage = "propagate"
            g = tape.var(dL_dr)
            grads = tape.tape[-1].propagate([g])
            out["grads"] = _as_records(grads)
            if not isinstance(grads, (list, tuple)):
                return out
            stage = "second backward"
            ref = reference_ops(tape)
            terms = [ref["sum"](ref["mul"](gv, tape.var(u))) for gv, u in zip(grads, us) if _is_variable(gv)]
            if terms:
                S = terms[0]
                for t in terms[1:]:
                    S = ref["add"](S, t)
                out["second"] = [None if s is None else s.value.detach() for s in reference_grad(tape, S, [*vs, g])]
        except Exception as exc:  # the student's code may raise anything
            out["error"] = _error(stage, exc)
    return out


@probe.procedure
def program_transcript(student: Callable[..., Any], keep: list, student_grad: bool, program: tuple,
                        xs: list) -> dict:
    """A program on the student's tape: the gradients of its loss and, when all went well,
    of the squared norm of those gradients. `student_grad`: walk with the student's grad
    (given as `student`), else with the reference walk."""
    out: dict = {"error": None, "skipped_entry_called": False, "grads": None, "second": None}
    try:
        tape = Tape(student)
    except TapeMissing as missing:
        out["error"] = _error("setup", missing)
        return out
    prog = Program.from_data(program)
    with tape.isolated(keep):
        grad = student if student_grad else (lambda L, wrt: reference_grad(tape, L, wrt))
        ops = tape.ops()
        stage = "forward"
        try:
            vs = [tape.var(x) for x in xs]
            L0 = loss_of(prog, run_program(prog, vs, ops), ops["sum"])
            stage = "backward"
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
def order_transcript(topological_order: Callable[..., Any], program: tuple, xs: list) -> dict:
    """The student's topological order of a program's graph, as step indices (-1: an entry
    of no step, -2: not an entry)."""
    try:
        tape = Tape(topological_order)
    except TapeMissing as missing:
        return {"error": _error("setup", missing), "order": None}
    prog = Program.from_data(program)
    with tape.isolated():
        ops = tape.ops()
        with _collector_paused():  # 10,000 entries, each in a reference cycle with its output
            pool = run_program(prog, [tape.var(x) for x in xs], ops)
        step_of = {id(entry): k for k, entry in enumerate(tape.tape)}
        try:
            order = list(topological_order(pool[-1].grad_fn))
        except Exception as exc:  # the student's code may raise anything
            return {"error": _error("topological_order", exc), "order": None}
        entry_type = tape.ns["TapeEntry"]
        steps = (step_of.get(id(e), -1) if isinstance(e, entry_type) else -2 for e in order)
        return {"error": None, "order": " ".join(map(str, steps))}  # one string: 10,000 numbers cross fast


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
def hvp_transcript(hvp: Callable[..., Any], f: Callable[[Any], Any], x: torch.Tensor, v: torch.Tensor) -> dict:
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
