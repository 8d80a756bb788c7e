"""Checks for notebook 01_tape_autograd, and the tape machinery that 02's checks
(`exercises/higher_order_and_fusion.py`) use too.

The notebooks define the tape themselves (`Variable`, `TapeEntry`, `gradient_tape`,
`record`, and one `operator_<op>` function per operation). Each check has two halves:

- *transcripts*, probe procedures that run in the student's process
  (:mod:`autograder.student.tape`): they run the student's code on values chosen by the
  check, with forward-only *stand-ins* for the operations not under test, and report what
  it computed (and recorded), as plain tensors;
- *judges*, in the check's own process (the grader's, when grading): they compute the same
  values with torch.autograd and explain every difference.

Two things need gradients that the student's process may not compute itself:

- the student's `grad` (or `hvp`) walks entries of stand-ins: their propagates *ask* this
  side (:class:`StandInAnswers`, answering only while the check runs, never about the
  operations under test, and validating every question as untrusted data);
- gradients of gradients of an operation under test: the transcript reports every entry
  recorded (op, inputs, outputs, values), and the judge rebuilds that computation with
  torch and differentiates it (:func:`_rebuild`).

So an operation under test is judged entry by entry: its forward value, what its
propagate returns (for every combination of output gradients, None included), and the
gradients of that; in random programs, at the values the programs compute. Only `grad`
(and `hvp`, which calls it) walk a tape, the student's own.
"""
from __future__ import annotations

import contextlib
import functools
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from ..checks import explain, inputs
from ..student import probe, tape
from ..student.report import fail, passed, quiet, shape, show

RTOL, ATOL = 1e-7, 1e-10
TORCH_OPS = tape.TORCH_OPS


def random_program(ops: Sequence[str], length: int, rng: random.Random) -> tape.TapeProgram:
    """Three inputs of one shape; (3,) for elementwise operations, (3, 3) with matmul or
    t. "sum" is followed by "expand" back to that shape, and its scalar is not reused."""
    size = (3, 3) if ("matmul" in ops or "t" in ops) else (3,)
    steps: list[tuple[str, tuple[int, ...]]] = []
    usable = [0, 1, 2]
    choices = [o for o in ops if o != "expand"]
    while len(steps) < length:
        op = rng.choice(choices)
        steps.append((op, tuple(rng.choice(usable) for _ in range(TORCH_OPS[op][0]))))
        index = 3 + len(steps) - 1
        if op == "sum":
            steps.append(("expand", (index,)))
            index += 1
        usable.append(index)
    return tape.TapeProgram(3, tuple(steps), size)


# --- answers to the stand-ins' questions ------------------------------------------------------

MAX_DEPTH = 2  # "the VJP of the VJP of" an operation: third-order gradients at most
MAX_NUMEL = 1024  # per tensor: the checks use a few numbers
MAX_DIMS = 4
MAX_QUESTIONS = 5000  # per check
QUESTION_KEYS = {"op", "sizes", "vjp", "inputs", "grads"}
# Values a student's code may hold (a seed `Variable(torch.tensor(1))` is an integer); all
# but float32 are computed with in float64.
QUESTION_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                   torch.int16, torch.int8, torch.uint8, torch.bool)


def _arity(op: str, depth: int) -> tuple[int, int]:
    """(inputs, outputs) of F_depth: F_0 is `op`; F_{d+1}(inputs, output gradients) is the
    VJP of F_d, whose outputs are the gradients of F_d's inputs."""
    n_in, n_out = TORCH_OPS[op][0], tape.OUTPUTS.get(op, 1)
    for _ in range(depth):
        n_in, n_out = n_in + n_out, n_in
    return n_in, n_out


def _apply(op: str, sizes: tuple | None, depth: int, args: list, create_graph: bool) -> list:
    """F_depth(args); None among arguments and results stands for a zero."""
    if depth == 0:
        out = TORCH_OPS[op][1](*args, *((sizes,) if op == "expand" else ()))
        return list(out) if isinstance(out, tuple) else [out]
    n = _arity(op, depth - 1)[0]
    xs, gs = args[:n], args[n:]
    outs = _apply(op, sizes, depth - 1, xs, True)
    pairs = [(o, g) for o, g in zip(outs, gs) if o is not None and g is not None]
    for o, g in pairs:
        if o.shape != g.shape:
            raise probe.Refused(f"a gradient of shape {shape(g)} was given for a value of shape {shape(o)}")
    live = [(o, g.to(o.dtype)) for o, g in pairs if o.requires_grad]
    wrt = [i for i, x in enumerate(xs) if x is not None and x.requires_grad]
    result: list = [None] * n
    if live and wrt:
        found = torch.autograd.grad([o for o, _ in live], [xs[i] for i in wrt], [g for _, g in live],
                                    create_graph=create_graph, allow_unused=True)
        for i, f in zip(wrt, found):
            result[i] = f
    return result


def _question_tensor(t: Any, what: str) -> torch.Tensor:
    if type(t) is not torch.Tensor:
        raise probe.Refused(f"{what} is not a tensor")
    if t.dtype not in QUESTION_DTYPES or t.device.type != "cpu" or t.layout != torch.strided:
        raise probe.Refused(f"{what} must be a real CPU tensor")
    if t.dim() > MAX_DIMS or t.numel() > MAX_NUMEL:
        raise probe.Refused(f"{what} is larger than any value of these checks")
    return t.detach() if t.dtype in (torch.float64, torch.float32) else t.detach().to(torch.float64)


def answer_question(question: Any, allowed: frozenset[str]) -> list:
    """The input gradients of one stand-in entry, from plain data alone (stateless)."""
    if not isinstance(question, dict) or set(question) != QUESTION_KEYS:
        raise probe.Refused("malformed question")
    op, sizes, depth = question["op"], question["sizes"], question["vjp"]
    if not isinstance(op, str) or op not in TORCH_OPS:
        raise probe.Refused("unknown operation")
    if op not in allowed:
        raise probe.Refused(f"no answers about `{op}` during this check")
    if type(depth) is not int or not 0 <= depth <= MAX_DEPTH:
        raise probe.Refused("unsupported order of differentiation")
    if op == "expand":
        if not isinstance(sizes, list) or not 0 < len(sizes) <= MAX_DIMS or not all(
            type(s) is int and 0 < s <= MAX_NUMEL for s in sizes
        ) or math.prod(sizes) > MAX_NUMEL:
            raise probe.Refused("malformed sizes")
        sizes = tuple(sizes)
    elif sizes is not None:
        raise probe.Refused("malformed sizes")
    n_in, n_out = _arity(op, depth)
    values, grads = question["inputs"], question["grads"]
    if not isinstance(values, list) or len(values) != n_in or not isinstance(grads, list) or len(grads) != n_out:
        raise probe.Refused("wrong number of values")
    first = TORCH_OPS[op][0]  # the operation's own inputs are never None
    values = [None if v is None and i >= first else _question_tensor(v, f"input {i}") for i, v in enumerate(values)]
    grads = [None if g is None else _question_tensor(g, f"gradient {i}") for i, g in enumerate(grads)]
    leaves = [None if v is None else v.clone().requires_grad_() for v in values]
    try:
        found = _apply(op, sizes, depth + 1, [*leaves, *grads], create_graph=False)
    except probe.Refused:
        raise
    except Exception as exc:  # shapes that do not fit the operation
        raise probe.Refused(f"cannot evaluate {op}: {exc}") from None
    return [None if f is None else f.detach() for f in found]


class StandInAnswers:
    """Answers the stand-ins' questions during one check, about the operations in
    `allowed` only (never those under test), and not once the check is over: a stand-in
    captured in one check gets nothing in another."""

    def __init__(self, allowed: Sequence[str]) -> None:
        self.allowed = frozenset(allowed)
        self.open = True
        self.asked = 0

    def __call__(self, question: Any) -> list:
        if not self.open:
            raise probe.Refused("the check that this question belongs to is over")
        self.asked += 1
        if self.asked > MAX_QUESTIONS:
            raise probe.Refused("too many questions")
        return answer_question(question, self.allowed)


@contextlib.contextmanager
def answering(allowed: Sequence[str] = ()) -> Iterator[StandInAnswers]:
    """While the block runs, the stand-ins' questions about `allowed` are answered."""
    answers = StandInAnswers(allowed)
    try:
        with probe.answering(answers):
            yield answers
    finally:
        answers.open = False


# --- the grader's side: judges -------------------------------------------------------------------

NONE_CAUSE = (
    "a gradient was None where a Variable was expected. None means 'known to be zero': skip "
    "an entry whose output gradients are all None, and skip None input gradients when adding."
)
NOT_RECORDED_CAUSE = (
    "the gradient propagate returns must be computed with Variable operations that the tape "
    "records (no `.value` arithmetic, no new `Variable(...)` from raw tensors), so that it can be "
    "differentiated again."
)


def _fail_error(label: str, error: Any, context: Iterable[str] = ()) -> None:
    """Explain an exception the student's code raised (reported by a transcript)."""
    __tracebackhide__ = True
    found = probe.ProbeError.from_data(error)
    if found.stage == "setup":
        fail(f"{label}: {found.message}")
    if found.type == "NotImplementedError":
        fail(f"{label} is not implemented yet.", cause="replace `raise NotImplementedError()` with your code.")
    cause = NONE_CAUSE if "NoneType" in found.message else None
    if "cannot be multiplied" in found.message:
        cause = ("let the shapes guide you: each gradient has the shape of its input, and only one order of "
                 "the factors fits.")
    where = "" if found.stage in ("forward", "backward") or found.stage in label else f" ({found.stage})"
    fail(f"{label}{where} raised {found.type}: {found.message}", *context, cause=cause)


def _value(record: Any, what: str, label: str) -> torch.Tensor | None:
    """The value of a Variable the student's code returned; fails on anything else."""
    __tracebackhide__ = True
    if record is None:
        return None
    if isinstance(record, dict) and isinstance(record.get("variable"), torch.Tensor):
        return record["variable"]
    kind = record.get("type") if isinstance(record, dict) else type(record).__name__
    if kind == "Tensor":
        fail(
            f"{label}: {what} is a plain tensor, not a Variable.",
            cause="propagate must compute with Variables (e.g. `dL_dr * rhs`, not `dL_dr.value * rhs.value`) "
            "so that the tape records it and gradients of gradients work.",
        )
    fail(f"{label}: {what} is {kind}, expected a Variable (or None).")


def _values(records: Any, count: int, what: str, label: str, context: Iterable[str]) -> list:
    __tracebackhide__ = True
    if not isinstance(records, list) or len(records) != count:
        got = records.get("type", "?") if isinstance(records, dict) else f"{len(records)} values"
        fail(f"{label}: {what} must be a list with one entry per input ({count}), got {got}.", *context)
    return records


def _same(label: str, what: str, got: torch.Tensor | None, want: torch.Tensor, context: Iterable[str],
          cause: str | Callable[[], str | None] | None = None) -> None:
    """`got` is `want` (None: zero); else fail, naming `what`, with the `context` lines and
    the likely `cause` (a function giving it: worked out only for a failure)."""
    __tracebackhide__ = True
    if got is None:
        if not bool(want.any()):
            return
        fail(f"{label}: {what} is None, but it is not zero.", *context, f"expected {show(want)}",
             cause=_cause(cause) or "None means 'known to be zero'; this gradient has non-zero entries.")
    if tuple(got.shape) != tuple(want.shape):
        fail(f"{label}: {what} has shape {shape(got)}, expected {shape(want)}.", *context,
             cause="a gradient has the shape of the value it is the gradient of"
             + (" (the backward of sum is expand, and of expand is sum)." if got.dim() != want.dim() else "."))
    if not torch.equal(got, want) and not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
        fail(f"{label}: {what} is wrong.", *context, *explain.differ(want, got, rtol=RTOL, atol=ATOL),
             cause=_cause(cause))


def _cause(cause: str | Callable[[], str | None] | None) -> str | None:
    return cause() if callable(cause) else cause


class _Lines:
    """The context lines of a failure message, rendered only when a check fails (checks
    judge dozens of cases for every student, nearly all of them passing)."""

    def __init__(self, make: Callable[[], list[str]]) -> None:
        self.make = make

    def __iter__(self) -> Iterator[str]:
        return iter(self.make())


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach(), b.detach()
    return a.shape == b.shape and (torch.equal(a, b)
                                   or bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True)))


def _names(ops: Sequence[Any]) -> list[str]:
    return [fn.__name__.removeprefix("operator_") for fn in ops]


# --- one operation's entry: check_ops, check_exp_mul ---------------------------------------------

def _candidates(op: str, xs: Sequence[torch.Tensor], extra: tuple) -> list[tuple[str, torch.Tensor]]:
    """What an entry of `op` may output: (name, value) of the result first, then the
    intermediates it may declare as further outputs."""
    result = TORCH_OPS[op][1](*xs, *extra)
    if op == "exp_mul":
        return [("r", result), ("t", xs[0].exp())]
    return [("r", result)]


def _params(op: str) -> list[str]:
    return ["a", "b"] if op == "exp_mul" else ["self", "rhs"][: TORCH_OPS[op][0]]


@dataclass
class OpCase:
    """One call of `operator_<op>`: on `inputs` (distinct values; `args` says which one each
    argument position takes), then its entry's propagate with `grads` (dL_dr, then the
    gradients for further outputs); second order is that of sum(gradient_i * us_i)."""

    op: str
    inputs: list[torch.Tensor]
    args: list[int]
    names: list[str]  # of the distinct inputs, for messages
    grads: list[torch.Tensor]
    us: list[torch.Tensor]
    extra: tuple = ()
    context: list[str] = field(default_factory=list)

    def data(self) -> dict:
        return {"op": self.op, "inputs": self.inputs, "args": self.args, "extra": self.extra, "grads": self.grads}

    def describe(self) -> list[str]:
        lines = list(self.context)
        for param, a in zip(_params(self.op), self.args):
            name = "" if self.names[a] == param else f"{self.names[a]} = "
            lines.append(f"{param} = {name}{show(self.inputs[a])}")
        return lines + [f"extra arguments {self.extra}"] * bool(self.extra)


def _draw(generator: torch.Generator, *size: int) -> torch.Tensor:
    return torch.randn(size, generator=generator, dtype=torch.float64)


def _op_cases(op: str, generator: torch.Generator) -> list[OpCase]:
    def r(*s):
        return _draw(generator, *s)

    if op == "expand":
        shapes, extras = [[()], [()]], [((4,),), ((2, 3),)]
    elif op == "sum":
        shapes, extras = [[(4,)], [(2, 3)]], [(), ()]
    elif op == "matmul":
        # every axis its own length, then a square product, then an outer product (inner size 1)
        shapes, extras = [[(2, 3), (3, 4)], [(3, 3), (3, 3)], [(3, 1), (1, 2)]], [(), (), ()]
    elif op == "t":
        shapes, extras = [[(2, 3)]], [()]
    else:
        arity = TORCH_OPS[op][0]
        shapes, extras = [[(4,)] * arity, [(2, 3)] * arity], [(), ()]
    cases = []
    for sizes, extra in zip(shapes, extras):
        xs = [r(*s) for s in sizes]
        out = _candidates(op, xs, extra)[0][1]
        grads = [r(*out.shape), *(r(*out.shape) for _ in range(2 * (op == "exp_mul")))]
        params = _params(op)
        cases.append(OpCase(op, xs, list(range(len(xs))), params, grads, [r(*x.shape) for x in xs], extra))
    return cases


class _Unfollowable(Exception):
    """A recorded entry the judge cannot rebuild."""


@dataclass
class Graph:
    """What a transcript reports the student's code recorded: entries (op, input keys,
    output keys) in order, and the name and value of every Variable by key."""

    entries: list[tuple[str, list[int], list[int]]]
    names: list[str]
    values: list[torch.Tensor]

    @staticmethod
    def from_data(data: Any) -> "Graph":
        """From the compact form of :meth:`autograder.student.tape.Recorder.data`."""
        try:
            names, ops = data["names"].split(tape.SEPARATOR), data["ops"].split(tape.SEPARATOR)
            structure, shapes, flat = (_int64s(data["structure"]), _int64s(data["shapes"]), data["values"])
            if type(flat) is not torch.Tensor or flat.dtype != torch.float64 or flat.dim() != 1:
                raise TypeError("values")
            values, at, used = [], 0, 0
            while at < len(shapes):
                dims = shapes[at]
                size = shapes[at + 1: at + 1 + dims]
                if dims > 8 or len(size) != dims or any(n < 0 for n in size):
                    raise ValueError("shapes")
                numel = math.prod(size)
                values.append(flat[used: used + numel].reshape(size))
                at, used = at + 1 + dims, used + numel
            if used != flat.numel() or len(names) != len(values) or len(values) == 0:
                raise ValueError("values")
            entries, at = [], 0
            for op in ops if data["ops"] else ():
                n_in, n_out = structure[at: at + 2]
                ins, outs = structure[at + 2: at + 2 + n_in], structure[at + 2 + n_in: at + 2 + n_in + n_out]
                if len(ins) != n_in or len(outs) != n_out or not all(0 <= k < len(values) for k in (*ins, *outs)):
                    raise ValueError("entries")
                entries.append((op, ins, outs))
                at += 2 + n_in + n_out
            if at != len(structure):
                raise ValueError("entries")
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as bad:
            raise probe.Malformed(f"malformed recording: {bad}") from None
        return Graph(entries, names, values)

    def entry(self, index: int) -> str:
        op, ins, outs = self.entries[index]
        return f"`{', '.join(self.names[k] for k in outs)} = {op}({', '.join(self.names[k] for k in ins)})`"


RECORDED = 1_000_000  # numbers of a recording's structure turned into a list, at most (36 MB of them)


def _int64s(t: Any) -> list[int]:
    if type(t) is not torch.Tensor or t.dtype != torch.int64 or t.dim() != 1:
        raise TypeError("structure")
    if t.numel() > RECORDED:
        raise ValueError(f"a structure of more than {RECORDED} numbers")
    return t.tolist()


def _follow(graph: Graph, index: int, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs of recorded entry `index` rebuilt with torch from `xs`, each checked
    against the value recorded."""
    op, ins, outs = graph.entries[index]
    if op not in TORCH_OPS or op in tape.TEST_OPS or len(ins) != TORCH_OPS[op][0] or not outs:
        raise _Unfollowable(f"the tape entry {graph.entry(index)} is not an operation of the notebook")
    got = [graph.values[k] for k in outs]
    try:
        candidates = _candidates(op, xs, (tuple(got[0].shape),) if op == "expand" else ())
    except Exception as exc:  # inputs that do not fit the operation
        raise _Unfollowable(f"the tape entry {graph.entry(index)} cannot be recomputed: {exc}") from None
    if len(outs) > len(candidates):
        raise _Unfollowable(f"the tape entry {graph.entry(index)} has more outputs than {op} computes")
    found = []
    for k, value in zip(outs, got):
        match = next((t for _, t in candidates if _close(t, value)), None)
        if match is None:
            raise _Unfollowable(
                f"the tape entry {graph.entry(index)} recorded {graph.names[k]} = {show(value)}, "
                f"but {op} of its inputs is {show(candidates[0][1])}"
            )
        found.append(match)
    return found


def _rebuild(graph: Graph, known: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Every Variable the recorded entries computed, as torch tensors of the `known` ones
    (the others: the values recorded, constants)."""
    for index, (_, ins, outs) in enumerate(graph.entries):
        if all(k in known for k in outs):
            continue
        ys = _follow(graph, index, [known.get(k, graph.values[k]) for k in ins])
        for k, y in zip(outs, ys):
            known.setdefault(k, y)
    return known


MULTI_CAUSE = (
    "propagate gets one gradient per output of the entry (here r = exp(a) * b and t = exp(a)), None "
    "for an output that has none: each input's gradient adds up what arrives through every output "
    "that depends on it."
)
MULTI_CHAIN_CAUSE = (
    "the chain rule, for every output of the entry (here r = exp(a) * b and t = exp(a)): dL/dinput "
    "adds up dL/doutput times doutput/dinput."
)
KNOWN_ZERO_CAUSE = (
    "None means 'known to be zero': with these output gradients, this input's gradient is known to be "
    "zero (no output that got a gradient depends on it), so propagate returns None for it — not a "
    "Variable of zeros, which every later step would add and multiply for nothing."
)
MATERIALISED_CAUSE = (
    "an incoming None was turned into a tensor of zeros. That gives the right values, but every "
    "backward then adds and multiplies a tensor of zeros: branch on None instead (`add_optional`, "
    "`None if dL_dr is None else ...`), as PyTorch's `set_materialize_grads(False)` lets a Function do."
)
UNFOLLOWABLE_CAUSE = (
    "every tape entry must record the operation that computed its outputs, with the notebook's "
    "operations: the tape is all that the next call of grad sees."
)


@dataclass
class _Judged:
    """What the first-order judge found out about one case, for its second order: torch's
    graph of the case (distinct inputs `xs`, one clone per argument position, the entry's
    outputs), and per call, the output gradients (leaves) and torch's input gradients."""

    case: OpCase
    report: dict
    graph: Graph
    outputs: list[int]  # keys of the forward entry's outputs
    described: list[int]  # the candidate each output is
    xs: list[torch.Tensor]
    candidates: list[tuple[str, torch.Tensor]]
    calls: list[tuple[list, list]] = field(default_factory=list)  # (gradient leaves or None, torch's gradients)


def _grad_name(name: str) -> str:
    return f"dL_d{name}"


def _grad_lines(context: Iterable[str], judged: "_Judged", gs: list) -> "_Lines":
    return _Lines(lambda: [*context, *(f"{_grad_name(judged.candidates[c][0])} = {'None' if g is None else show(g)}"
                                       for c, g in zip(judged.described, gs))])


def _judge_first(label: str, case: OpCase, report: Any) -> _Judged:
    __tracebackhide__ = True
    if not isinstance(report, dict):
        raise probe.Malformed("malformed transcript")
    context = _Lines(case.describe)
    error = report.get("error")
    found = probe.ProbeError.from_data(error)
    if found and found.stage in ("setup", "forward"):
        _fail_error(label, error, context)
    params = _params(case.op)
    xs = [x.clone().requires_grad_() for x in case.inputs]
    pos = [xs[a].clone() for a in case.args]  # one node per argument position: their gradients apart
    candidates = _candidates(case.op, pos, case.extra)
    _same(label, "the forward value", _value(report.get("value"), "the result", label), candidates[0][1].detach(),
          context)
    multi = len(candidates) > 1
    if not report.get("recorded"):
        fail(f"{label}: the forward pass must record exactly one tape entry, "
             + ("with the result among its outputs." if multi else "whose output is the result."), *context)
    if found:
        _fail_error(label, error, context)
    graph = Graph.from_data(report.get("graph"))
    if not graph.entries:
        raise probe.Malformed("malformed transcript")
    outputs, at = graph.entries[0][2], report.get("result")
    if type(at) is not int or not 0 <= at < len(outputs):
        raise probe.Malformed("malformed transcript")
    if not multi and len(outputs) != 1:
        fail(f"{label}: the forward pass must record exactly one tape entry, whose output is the result.", *context)
    described = []
    for j, k in enumerate(outputs):
        c = 0 if j == at else next((i for i, (_, t) in enumerate(candidates) if i and _close(t, graph.values[k])), None)
        if c is None:
            fail(f"{label}: the entry's output {graph.names[k]} = {show(graph.values[k])} is none of "
                 f"{', '.join(n for n, _ in candidates)}.", *context,
                 cause="an entry's outputs are the values it computes: the result, and intermediates "
                       "that propagate uses.")
        described.append(c)
    judged = _Judged(case, report, graph, outputs, described, xs, candidates)
    calls = report.get("calls")
    if not isinstance(calls, list) or not calls:
        raise probe.Malformed("malformed transcript")
    for call in calls:
        gs = _pattern(call, case, len(outputs))
        lines = _grad_lines(context, judged, gs)
        if call.get("error"):
            _fail_error(f"{label}: propagate", call["error"], lines)
        grads = _values(call.get("grads"), len(pos), "propagate's result", label, lines)
        leaves = [None if g is None else g.clone().requires_grad_() for g in gs]
        live = [(candidates[c][1], g) for c, g in zip(described, leaves) if g is not None]
        wants = torch.autograd.grad([t for t, _ in live], pos, [g for _, g in live], allow_unused=True,
                                    create_graph=True)
        judged.calls.append((leaves, wants))
        if multi and any(g is None for g in gs):
            zero = _materialised_zero(graph, len(case.inputs), calls)
            if zero is not None:
                fail(f"{label}: propagate computes with {graph.names[zero]} = {show(graph.values[zero])}, a tensor of "
                     "zeros that no entry computed.", *lines, cause=MATERIALISED_CAUSE)
        for i, (n, record, w, x) in enumerate(zip(params, grads, wants, pos)):
            want = torch.zeros_like(x) if w is None else w.detach()
            got = _value(record, f"the gradient for `{n}`", label)
            if multi and w is None and got is not None:
                fail(f"{label}: the gradient for `{n}` is a Variable ({show(got)}), but with these output gradients "
                     "it is known to be zero: expected None.", *lines, cause=KNOWN_ZERO_CAUSE)
            if len(outputs) == 1:
                cause = functools.partial(_first_order_cause, got, want, case, i)
            else:
                cause = MULTI_CAUSE if got is None or not bool(got.any()) else MULTI_CHAIN_CAUSE
            _same(label, f"the gradient for `{n}`", got, want, lines, cause=cause)
    return judged


def _materialised_zero(graph: Graph, inputs: int, calls: list) -> int | None:
    """A Variable of zeros that some recorded entry reads, though no entry computed it and it
    is neither an input of the case nor an output gradient given (best effort: what the
    student's code recorded). The case's values are random, so such zeros were made."""
    given = {k for call in calls if isinstance(call, dict) for k in (call.get("keys_in") or []) if type(k) is int}
    produced = {k for _, _, outs in graph.entries for k in outs}
    for _, ins, _ in graph.entries:
        for k in ins:
            if k < inputs or k in given or k in produced:
                continue
            value = graph.values[k]
            if value.numel() and not bool(value.any()):
                return k
    return None


def _pattern(call: Any, case: OpCase, outputs: int) -> list:
    pattern = call.get("pattern") if isinstance(call, dict) else None
    if not isinstance(pattern, list) or len(pattern) != outputs or not all(
        i is None or (type(i) is int and 0 <= i < len(case.grads)) for i in pattern
    ) or all(i is None for i in pattern):
        raise probe.Malformed("malformed transcript")
    return [None if i is None else case.grads[i] for i in pattern]


def _keys(keys: Any, count: int, values: int) -> list:
    if not isinstance(keys, list) or len(keys) != count or not all(
        k is None or (type(k) is int and 0 <= k < values) for k in keys
    ):
        raise probe.Malformed("malformed transcript")
    return keys


def _judge_second(label: str, judged: _Judged, cause: str) -> None:
    """The gradients of sum(gradient_i * u_i) that propagate returned, rebuilt from what the
    student's code recorded, against torch's."""
    __tracebackhide__ = True
    case, graph = judged.case, judged.graph
    context = _Lines(case.describe)
    for call, (leaves, wants) in zip(judged.report["calls"], judged.calls):
        gs = _pattern(call, case, len(judged.outputs))
        keys_in = _keys(call.get("keys_in"), len(gs), len(graph.values))
        keys = _keys(call.get("keys"), len(case.args), len(graph.values))
        lines = _grad_lines(context, judged, gs)
        known = {a: x for a, x in enumerate(judged.xs)}  # the transcript numbers the inputs first
        known.update({k: judged.candidates[c][1] for k, c in zip(judged.outputs, judged.described)})
        known.update({k: g for k, g in zip(keys_in, leaves) if g is not None})
        try:
            rebuilt = _rebuild(graph, known)
        except _Unfollowable as why:
            fail(f"{label}: propagate's gradient cannot be differentiated again: {why}.", *lines,
                 cause=UNFOLLOWABLE_CAUSE)
        results = [None if k is None else rebuilt.get(k, graph.values[k]) for k in keys]
        S = sum((r * u).sum() for r, u in zip(results, case.us) if r is not None)
        torch_S = sum((w * u).sum() for w, u in zip(wants, case.us) if w is not None)
        wrt = [*judged.xs, *(g for g in leaves if g is not None)]
        # One backward pass when they agree (as nearly always): that of their difference.
        if all(bool((d.abs() <= ATOL).all()) for d in _gradients(S - torch_S, wrt)):
            continue
        names = [*case.names,
                 *(_grad_name(judged.candidates[c][0]) for c, g in zip(judged.described, leaves) if g is not None)]
        for n, got, w in zip(names, _gradients(S, wrt), _gradients(torch_S, wrt)):
            _same(label, f"the gradient of your gradient (second order) with respect to `{n}`", got, w, lines,
                  cause=cause)


def _gradients(S: Any, wrt: list[torch.Tensor]) -> list[torch.Tensor]:
    """dS/dwrt, zeros where S does not depend on it."""
    found = (torch.autograd.grad(S, wrt, allow_unused=True, retain_graph=True)
             if isinstance(S, torch.Tensor) and S.requires_grad else [None] * len(wrt))
    return [torch.zeros_like(x) if f is None else f.detach() for f, x in zip(found, wrt)]


# Local derivatives a student may write for an elementwise operation, and the right one.
LOCAL_DERIVATIVES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "cos(x)": torch.cos, "-cos(x)": lambda x: -torch.cos(x), "sin(x)": torch.sin, "-sin(x)": lambda x: -torch.sin(x),
    "exp(x)": torch.exp, "1": torch.ones_like, "x": lambda x: x,
}
RIGHT_DERIVATIVE = {"sin": "cos(x)", "cos": "-sin(x)", "exp": "exp(x)", "neg": "-1"}


def _close_to(a: torch.Tensor, b: torch.Tensor | None) -> bool:
    return b is not None and a.shape == b.shape and bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL))


def _first_order_cause(got: torch.Tensor | None, want: torch.Tensor, case: OpCase, index: int) -> str | None:
    """The likely misconception behind a wrong gradient of a one-output entry."""
    if got is None or got.shape != want.shape:
        return None
    pos = [case.inputs[a].clone().requires_grad_() for a in case.args]
    out = _candidates(case.op, pos, case.extra)[0][1]
    dL_dr = case.grads[0]
    with_ones = torch.autograd.grad(out, pos, torch.ones_like(out), allow_unused=True, retain_graph=True)[index]
    if _close_to(got, with_ones) and not _close_to(got, want):
        return "propagate ignores dL_dr: the chain rule multiplies the local derivative by the incoming gradient."
    params = _params(case.op)
    found = torch.autograd.grad(out, pos, dL_dr, allow_unused=True)
    for j, other in enumerate(found):
        if j != index and _close_to(got, other) and not _close_to(other, want):
            return (f"the gradients are swapped: you return for `{params[index]}` what `{params[j]}` should get. "
                    f"dL/d{params[index]} = dL_dr times dr/d{params[index]}, and for a product that is "
                    "the other factor.")
    right = RIGHT_DERIVATIVE.get(case.op)
    if right is not None and right in LOCAL_DERIVATIVES:
        x = pos[index].detach()
        for name, derivative in LOCAL_DERIVATIVES.items():
            if name != right and _close_to(got, dL_dr * derivative(x)):
                sign = " (the sign is wrong)" if name.lstrip("-") == right.lstrip("-") else ""
                return f"propagate multiplies dL_dr by {name}, but the derivative of {case.op} is {right}{sign}."
    if torch.allclose(got, -want.detach(), rtol=RTOL, atol=ATOL):
        return "the gradient has the wrong sign."
    return "the chain rule: dL/dinput = dL/dr times the local derivative dr/dinput (in the right order for matrices)."


def _entry_reports(anchor: Callable[..., Any], keep: Sequence[str], cases: list[OpCase]) -> list:
    reports = probe.invoke(tape.entry_transcript, anchor, list(keep), [c.data() for c in cases])
    if not isinstance(reports, list) or len(reports) != len(cases):
        raise probe.Malformed("malformed transcripts")
    return reports


def _judge_cases(cases: list[OpCase], reports: list, second_cause: str) -> None:
    """First order for every case before any second order: a wrong first-order gradient
    comes with its own explanation."""
    __tracebackhide__ = True
    judged = [_judge_first(f"operator_{c.op}", c, r) for c, r in zip(cases, reports)]
    for j in judged:
        _judge_second(f"operator_{j.case.op}", j, second_cause)


def check_ops(*ops: Callable[..., Any], seed: int | None = 0, programs: int = 0, length: int = 6) -> None:
    """The propagate rules of the given `operator_<name>` functions, to second order: on cases
    of their own and, with `programs`, at every step of random programs built from them (and
    add and mul), at the values the programs compute there."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    names = _names(ops)
    cases = [case for name in names for case in _op_cases(name, generator)]
    shapes = ", ".join(map(str, sorted({tuple(x.shape) for c in cases for x in c.inputs}, key=lambda s: (len(s), s))))
    own = len(cases)
    if programs:
        cases += _cases_in_programs(names, programs, length, seed)
    with quiet(), answering(()):
        _judge_cases(cases, _entry_reports(ops[0], names, cases), NOT_RECORDED_CAUSE)
    # One line for both: no known mistake in a propagate passes its own cases and fails only in
    # a program (tests/test_grading.py's claims test would say so).
    also = f", and at every step of {programs} random programs built from them" if programs else ""
    passed(f"{', '.join(names)}: forward values, gradients and gradients of gradients agree with torch.autograd "
           f"on {own} cases (inputs of shapes {shapes}){also}.")


def _cases_in_programs(names: list[str], programs: int, length: int, seed: int | None) -> list[OpCase]:
    pool = sorted(set(names) | {"add", "mul"} - ({"sum", "expand"} if "matmul" in names else set()))
    rng = random.Random(inputs.seed_of(seed))
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    cases: list[OpCase] = []
    for _ in range(programs):
        program = random_program(pool, length, rng)
        cases += _program_cases(program, _inputs(program, rng), names, generator)
    return cases


def _program_cases(program: tape.TapeProgram, xs: list[torch.Tensor], ops: Sequence[str],
                   generator: torch.Generator) -> list[OpCase]:
    """A case per operation of `ops` in `program` (one at its first step, one more where it
    takes one value twice), at the values the program computes there, with the gradient of
    its loss arriving at the step's output."""
    leaves = [x.clone().requires_grad_() for x in xs]
    pool = tape.run_program(program, leaves, {op: fn for op, (_, fn) in TORCH_OPS.items()})
    L = tape.loss_of(program, pool, torch.sum)
    arriving = torch.autograd.grad(L, pool[program.leaves:], allow_unused=True)
    listing = f"random program: {program.listing()}"
    cases = []
    seen = set()
    for k, (op, args) in enumerate(program.steps):
        distinct = list(dict.fromkeys(args))
        if op not in ops or (op, len(distinct)) in seen:
            continue
        seen.add((op, len(distinct)))
        out = pool[program.leaves + k]
        dL_dr = arriving[k] if arriving[k] is not None else _draw(generator, *out.shape)
        others = [_draw(generator, *out.shape) for _ in range(2 * (op == "exp_mul"))]
        cases.append(OpCase(
            op, [pool[a].detach() for a in distinct], [distinct.index(a) for a in args], [f"v{a}" for a in distinct],
            [dL_dr.detach(), *others], [_draw(generator, *pool[a].shape) for a in args],
            (program.size,) if op == "expand" else (), [listing, f"at step {_step(program, k)}"],
        ))
    return cases


def _inputs(program: tape.TapeProgram, rng: random.Random) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    return [torch.rand(program.size, generator=generator, dtype=torch.float64) - 0.5 for _ in range(program.leaves)]


# --- whole programs, walked by the student's grad ------------------------------------------

def program_transcript(grad: Callable[..., Any], keep: Sequence[str], program: tape.TapeProgram,
                       xs: list[torch.Tensor], walk: str = "tape") -> dict:
    return probe.invoke(tape.program_transcript, grad, list(keep), program.data, xs, walk)


UNUSED_CAUSE = (
    "None means 'known to be zero': an input that L does not depend on has no gradient in your dict, "
    "and grad must return None for it (`dL_d.get(x.name)`), not a Variable of zeros. Callers test "
    "`is None` to skip work, as PyTorch's `allow_unused=True` does."
)


def judge_program(
    transcript: dict, program: tape.TapeProgram, xs: list[torch.Tensor], *, label: str, description: str | None = None,
    first_cause: str | None = None, second_cause: str | None = None, second_order: bool = True,
) -> None:
    """The program's gradients, and (with `second_order`) those of their squared norm, as torch's."""
    __tracebackhide__ = True
    context = _Lines(lambda: [description or f"program: {program.listing()}",
                              *(f"v{i} = {show(x)}" for i, x in enumerate(xs))])
    if transcript["skipped_entry_called"]:
        fail(f"{label}: it called propagate for an entry none of whose outputs has a gradient.", *context,
             cause="when every dL_doutput of an entry is None (known to be zero), skip the entry: "
             "its input gradients are zero too, and computing them is wasted work.")
    error = transcript["error"]
    if probe.ProbeError.from_data(error) and error["stage"] != "second backward":
        _fail_error(label, error, context)
    leaves = [x.clone().requires_grad_() for x in xs]
    table = {op: fn for op, (_, fn) in TORCH_OPS.items()}
    L0 = tape.loss_of(program, tape.run_program(program, leaves, table), torch.sum)
    found = torch.autograd.grad(L0, leaves, create_graph=True, allow_unused=True)
    wants = [torch.zeros_like(x) if w is None else w for x, w in zip(leaves, found)]
    grads = _values(transcript["grads"], len(xs), "the result of grad", label, context)
    got = [_value(g, f"dL/dv{i}", label) for i, g in enumerate(grads)]
    for i, (g, w) in enumerate(zip(got, wants)):
        _same(label, f"dL/dv{i}", g, w.detach(), context, cause=first_cause)
    for i, (g, f) in enumerate(zip(got, found)):
        if f is None and g is not None:
            fail(f"{label}: dL/dv{i} is a Variable ({show(g)}), but L does not depend on v{i}: expected None.",
                 *context, cause=UNUSED_CAUSE)
    live = [w for g, w in zip(got, wants) if g is not None]
    if not live or not second_order:
        return
    if error:
        _fail_error(label, error, context)
    L1 = sum((w * w).sum() for w in live)
    seconds = torch.autograd.grad(L1, leaves, allow_unused=True) if L1.requires_grad else [None] * len(xs)
    records = _values(transcript["second"], len(xs), "the result of grad", label, context)
    for i, (record, w) in enumerate(zip(records, seconds)):
        w = torch.zeros_like(xs[i]) if w is None else w
        _same(label, f"d(sum of squared gradients)/dv{i}", _value(record, f"d(sum of squared gradients)/dv{i}", label),
              w.detach(), context, cause=second_cause)


def differential_test(grad: Callable[..., Any], keep: Sequence[str], ops: Sequence[str], *,
                      programs: int, length: int, seed: int | None, second_cause: str | None = None) -> None:
    """Random programs over `ops`, walked by the student's grad: gradients and second-order
    gradients as torch's."""
    __tracebackhide__ = True
    rng = random.Random(inputs.seed_of(seed))
    for _ in range(programs):
        program = random_program(ops, length, rng)
        xs = _inputs(program, rng)
        transcript = program_transcript(grad, keep, program, xs)
        judge_program(transcript, program, xs, label="random program", second_cause=second_cause)


def check_whole_tape(grad: Callable[..., list], *ops: Callable[..., Any], programs: int = 10,
                     seed: int | None = 0) -> None:
    """Everything of the student's together (their grad and operations) on random programs."""
    __tracebackhide__ = True
    names = _names(ops)
    with quiet(), answering(set(tape.NOTEBOOK_OPS) - set(names)):
        differential_test(grad, names, [n for n in names if n not in ("matmul", "t")],
                          programs=programs, length=8, seed=seed)
        differential_test(grad, names, [n for n in names if n not in ("sum", "expand")],
                          programs=programs, length=6, seed=seed)
    passed(f"your whole tape: {2 * programs} random programs agree with torch.autograd, to second order.")


# --- the tape walk: grad ---------------------------------------------------------------------

ACCUMULATE_CAUSE = (
    "every use of a value contributes a gradient: add the contributions (`+`), do not overwrite "
    "them (`=`). A value that does not affect L gets None."
)
SEVERAL_OUTPUTS_CAUSE = (
    "an entry with several outputs gets one gradient per output, None for those that have none. "
    "Skip the entry only when *all* of them are None (`all(g is None for g in dL_doutputs)`): "
    "if any one has a gradient, propagate must run."
)
ORDER_CAUSE = (
    "when `order` is given, walk those entries (`entries`, as the skeleton sets it), not the tape: "
    "Exercise 1.4 differentiates a graph that way, without a tape."
)


@dataclass(frozen=True)
class GradCase:
    """A program every grad must get right (leaves: x, w, unused), what it tests, and the
    likely cause of a wrong first-order gradient. walk="order": grad gets `order=` and an
    empty tape (first order only)."""

    program: tape.TapeProgram
    description: str
    cause: str = ACCUMULATE_CAUSE
    walk: str = "tape"


GRAD_CASES = [
    GradCase(tape.TapeProgram(3, (("mul", (0, 1)), ("sum", (3,)), ("sentinel", (0,))), (3,), loss=4),
             "an entry recorded after L (its output has no gradient, so it must be skipped)"),
    GradCase(tape.TapeProgram(3, (("sentinel", (0,)), ("mul", (0, 1))), (3,)),
             "a dead branch: u = sentinel(x) is recorded before L = sum(x * w) but does not lead to L "
             "(its output has no gradient, so it must be skipped)"),
    GradCase(tape.TapeProgram(3, (("first", (0, 1)), ("mul", (3, 3)), ("mul", (1, 0)), ("add", (4, 5))), (3,)),
             "first(x, w) = x, whose propagate returns [dL_dr, None]; L = sum(first * first + w * x)"),
    GradCase(tape.TapeProgram(3, (("exp", (0,)), ("mul", (3, 1)), ("sin", (3,)), ("add", (4, 5))), (3,)),
             "y = exp(x) is used twice: L = sum(y * w + sin(y))"),
    GradCase(tape.TapeProgram(3, (("mul", (0, 0)), ("mul", (3, 1))), (3,)),
             "x is both inputs of one multiplication: L = sum(x * x * w)"),
    GradCase(tape.TapeProgram(2, (("add", (0, 1)), ("mul", (2, 1))), (3,)),
             "L0 = sum((a + b) * b); then the gradients of L1 = sum(dL0/da ** 2 + dL0/db ** 2)"),
    GradCase(tape.TapeProgram(3, (("pair", (0, 1)), ("mul", (3, 0))), (3,)),
             "one entry with two outputs, p, s = pair(x, w) = (x * w, x + w); only p is used: L = sum(p * x), "
             "so the entry gets [dL_dp, None]", SEVERAL_OUTPUTS_CAUSE),
    GradCase(tape.TapeProgram(3, (("pair", (0, 1)), ("sin", (4,))), (3,)),
             "one entry with two outputs, p, s = pair(x, w) = (x * w, x + w); only s is used: L = sum(sin(s)), "
             "so the entry gets [None, dL_ds]", SEVERAL_OUTPUTS_CAUSE),
    GradCase(tape.TapeProgram(3, (("exp", (0,)), ("mul", (3, 1)), ("add", (4, 3))), (3,)),
             "grad(L, [x, w, unused], order=entries) with the entries of L = sum(exp(x) * w + exp(x)), newest "
             "first, and an empty tape", ORDER_CAUSE, walk="order"),
]
GRAD_RANDOM_OPS = ["add", "mul", "neg", "exp", "sin", "sum"]
# What the grad checks' programs and losses use, all stand-ins: the only operations whose
# gradients the judging side gives while grad is checked.
GRAD_STAND_INS = {op for case in GRAD_CASES for op, _ in case.program.steps} | set(GRAD_RANDOM_OPS) | {"expand"}
RECORDED_ADD_CAUSE = (
    "accumulate with Variable addition (`dL_d[name] + g`), which the tape records; arithmetic on "
    "`.value` is invisible to the next call of grad."
)


def check_grad(grad: Callable[..., list], *, programs: int = 0, seed: int | None = 0) -> None:
    """`grad(L, wrt)`: every use accumulates, None stays None and is skipped, and the
    accumulation is recorded so that gradients of gradients work."""
    __tracebackhide__ = True
    rng = random.Random(inputs.seed_of(seed))
    with quiet(), answering(GRAD_STAND_INS - {"sentinel"}):
        runs = []
        for case in GRAD_CASES:
            xs = [x + 1.0 for x in _inputs(case.program, rng)]
            runs.append((program_transcript(grad, (), case.program, xs, case.walk), case, xs))
        # All first-order gradients before any second-order one: a wrong accumulation shows
        # up at first order, with its own explanation.
        for second_order in (False, True):
            for transcript, case, xs in runs:
                judge_program(transcript, case.program, xs, label="grad", description=case.description,
                              first_cause=case.cause, second_cause=RECORDED_ADD_CAUSE,
                              second_order=second_order and case.walk == "tape")
        if programs:
            differential_test(grad, (), GRAD_RANDOM_OPS, programs=programs, length=6, seed=seed,
                              second_cause=RECORDED_ADD_CAUSE)
    more = f"; {programs} random programs agree with torch.autograd" if programs else ""
    passed("grad: shared values, entries with several outputs, dead entries skipped, None for unused inputs, "
           "a given `order`, and gradients of gradients are right" + more + ".")


# --- the graph: topological order ---------------------------------------------------------

DEEP = 10_000
DEEP_CHAIN = tape.TapeProgram(1, tuple(("neg", (k,)) for k in range(DEEP)) + (("sum", (DEEP,)),), (3,))


def deep_ladder(rng: random.Random) -> tape.TapeProgram:
    """2,000 to 2,500 entries deep (twice the recursion limit in force, twenty times the nesting
    allowed, `RecursionWatch.NESTED`),
    every value used twice: v' = sin(v), then v'' = v' * v."""
    rungs = 1000 + rng.randrange(250)
    steps = tuple(step for k in range(rungs) for step in (("sin", (2 * k,)), ("mul", (2 * k + 1, 2 * k))))
    return tape.TapeProgram(1, steps + (("sum", (2 * rungs,)),), (3,))
ORDER_CASES = [
    (tape.TapeProgram(2, (("exp", (0,)), ("mul", (2, 1)), ("sin", (3,)), ("mul", (4, 2)), ("add", (5, 2)),
                          ("sum", (6,))), (3,)),
     "y = exp(x); L = sum(sin(y * w) * y + y)"),
]


def _step(program: tape.TapeProgram, k: int) -> str:
    op, args = program.steps[k]
    return f"`v{program.leaves + k} = {op}({', '.join(f'v{a}' for a in args)})`"


def _judge_order(topological_order: Callable[..., Any], program: tape.TapeProgram, description: str) -> None:
    __tracebackhide__ = True
    xs = [torch.rand(program.size, dtype=torch.float64) for _ in range(program.leaves)]
    transcript = probe.invoke(tape.order_transcript, topological_order, program.data, xs)
    error = transcript["error"]
    _judge_nesting(transcript.get("recursion"), description)
    if probe.ProbeError.from_data(error) and error["type"] == "RecursionError":
        fail(f"topological_order: RecursionError on {description} (the check runs your code with Python's "
             "default recursion limit, whatever limit the notebook set).",
             cause="Python allows about 1,000 nested calls, and real graphs are deeper: replace the "
             "recursion with an explicit stack (or count each entry's consumers, as PyTorch's engine does).")
    if error:
        _fail_error("topological_order", error)
    try:
        order = [int(k) for k in transcript["order"].split()]
    except (AttributeError, ValueError):
        raise probe.Malformed("malformed order") from None
    root = len(program.steps) - 1
    reachable, stack = {root}, [root]
    while stack:
        for producer in program.producers[stack.pop()]:
            if producer not in reachable:
                reachable.add(producer)
                stack.append(producer)
    if -2 in order:
        fail(f"topological_order must return TapeEntry objects ({description}).")
    counts = Counter(order)
    twice = next((k for k in order if counts[k] > 1), None)
    if twice is not None:
        fail(f"topological_order: {_step(program, twice)} appears more than once ({description}).",
             cause="an entry reached along two paths must be listed once, or its propagate would run twice.")
    missing = sorted(reachable - set(order))
    if missing or len(order) != len(reachable):
        what = (f"misses {_step(program, missing[0])}" if missing
                else "lists entries that are not reachable from the root")
        fail(f"topological_order {what} ({description}).",
             cause="follow `next_entries` from the root to every entry that contributed to it (skip None: leaves).")
    if order[0] != root:
        fail(f"topological_order must start with the root {_step(program, root)} ({description}).")
    position = {k: i for i, k in enumerate(order)}
    for consumer in order:
        for producer in program.producers[consumer]:
            if position[producer] < position[consumer]:
                fail(
                    f"topological_order puts {_step(program, producer)} before {_step(program, consumer)}, "
                    f"which uses its output ({description}).",
                    cause="an entry may only be propagated once every entry that consumes its outputs has "
                    "been: otherwise its output gradient is still incomplete. Depth-first order is not "
                    "enough; use reverse post-order, or count consumers (Kahn's algorithm).",
                )


def _judge_nesting(recursion: Any, description: str) -> None:
    """Fail if a function of the student's was running many times at once: recursion, even
    when a raised recursion limit let it finish (observed in the student's process: best
    effort)."""
    __tracebackhide__ = True
    if not isinstance(recursion, dict):
        raise probe.Malformed("malformed recursion report")
    deepest, function = recursion.get("deepest"), recursion.get("function")
    if not isinstance(deepest, int) or not isinstance(function, str):
        raise probe.Malformed("malformed recursion report")
    if deepest > tape.RecursionWatch.NESTED:
        raised = (" It changed the recursion limit: `sys.setrecursionlimit` postpones the RecursionError, it "
                  "does not remove the recursion (and a deep enough graph crashes the process)."
                  if recursion.get("limit_changed") else "")
        fail(f"topological_order recursed on {description}: `{function}` was running more than "
             f"{tape.RecursionWatch.NESTED} times at once, one call per level of the graph, when the check "
             f"stopped it.{raised}",
             cause="the work of each pending entry must live in a data structure of yours, not in Python's call "
             "stack: an explicit stack of (entry, iterator) pairs, or Kahn's algorithm with consumer counts.")
    if recursion.get("untraced"):
        fail(f"topological_order switched off the tracer that watches for recursion ({description}).",
             cause="leave sys.settrace alone: the check runs your function under a tracer to see how deeply "
             "it nests.")


def check_topological_order(
    topological_order: Callable[[Any], list], *, seed: int | None = 0, programs: int = 0, deep: bool = True
) -> None:
    """Every reachable entry once, each after all entries that consume its outputs, and
    (with `deep`) on a deep graph without recursion: Python's default recursion limit is in
    force, and no function of the student's may nest more than `NESTED` deep (raising the
    limit does not help). The deep graph is the 10,000-deep chain, or with random programs
    (the hidden check) a random ladder of shared values, thousands of entries deep."""
    __tracebackhide__ = True
    rng = random.Random(inputs.seed_of(seed))
    with quiet(), answering(()):
        for program, description in ORDER_CASES:
            _judge_order(topological_order, program, description)
        for _ in range(programs):
            program = random_program(["add", "mul", "neg", "exp", "sin"], 12, rng)
            _judge_order(topological_order,
                         tape.TapeProgram(3, program.steps + (("sum", (2 + len(program.steps),)),), (3,)),
                         "a random program")
        if deep and not programs:
            _judge_order(topological_order, DEEP_CHAIN, f"a chain of {DEEP:,} negations")
        elif deep:
            ladder = deep_ladder(rng)
            _judge_order(topological_order, ladder,
                         f"a graph {len(ladder.steps):,} entries deep, every value used twice")
    extra = f", {programs} random programs" if programs else ""
    graph = "a 10,000-deep chain" if not programs else "a random graph thousands of entries deep"
    chain = f" and {graph}, without recursion (Python's default recursion limit; nesting watched)" if deep else ""
    passed(f"topological_order: valid on shared values{extra}{chain}.")


# --- notebook 02's checks live in higher_order_and_fusion (one module per notebook) ------

def __getattr__(name: str) -> Any:
    """`check_hvp` and `check_exp_mul` for notebooks released before they moved."""
    if name in ("check_hvp", "check_exp_mul"):
        from . import higher_order_and_fusion

        return getattr(higher_order_and_fusion, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
