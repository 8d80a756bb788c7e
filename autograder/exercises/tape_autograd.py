"""Checks for notebooks 01_tape_autograd and 02_higher_order_and_fusion.

The notebooks define the tape themselves (`Variable`, `TapeEntry`, `gradient_tape`,
`record`, and one `operator_<op>` function per operation). Each check has two halves:

- *transcripts*, probe procedures that run in the student's process
  (:mod:`autograder.student.tape`): they run the student's code on values chosen by the
  check, and report what it computed, as plain tensors;
- *judges*, in the check's own process (the grader's, when grading): they compute the same
  values with torch.autograd and explain every difference.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..checks import inputs
from ..student import probe, tape
from ..student.report import fail, passed, quiet, shape, show

RTOL, ATOL = 1e-7, 1e-10


def random_program(ops: Sequence[str], length: int, rng: random.Random) -> tape.Program:
    """Three inputs of one shape; (3,) for elementwise operations, (3, 3) with matmul or
    t. "sum" is followed by "expand" back to that shape, and its scalar is not reused."""
    size = (3, 3) if ("matmul" in ops or "t" in ops) else (3,)
    steps: list[tuple[str, tuple[int, ...]]] = []
    usable = [0, 1, 2]
    choices = [o for o in ops if o != "expand"]
    while len(steps) < length:
        op = rng.choice(choices)
        steps.append((op, tuple(rng.choice(usable) for _ in range(tape.TORCH_OPS[op][0]))))
        index = 3 + len(steps) - 1
        if op == "sum":
            steps.append(("expand", (index,)))
            index += 1
        usable.append(index)
    return tape.Program(3, tuple(steps), size)


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


def _fail_error(label: str, error: Any, context: Sequence[str] = ()) -> None:
    """Explain an exception the student's code raised (reported by a transcript)."""
    __tracebackhide__ = True
    found = probe.ProbeError.from_data(error)
    if found.stage == "setup":
        fail(f"{label}: {found.message}")
    if found.type == "NotImplementedError":
        fail(f"{label} is not implemented yet.", cause="replace `raise NotImplementedError()` with your code.")
    cause = NONE_CAUSE if "NoneType" in found.message else None
    if "cannot be multiplied" in found.message:
        cause = "let the shapes guide you: each gradient has the shape of its input, and only one order of the factors fits."
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


def _values(records: Any, count: int, what: str, label: str, context: Sequence[str]) -> list:
    __tracebackhide__ = True
    if not isinstance(records, list) or len(records) != count:
        got = records.get("type", "?") if isinstance(records, dict) else f"{len(records)} values"
        fail(f"{label}: {what} must be a list with one entry per input ({count}), got {got}.", *context)
    return records


def _same(label: str, what: str, got: torch.Tensor | None, want: torch.Tensor, context: Sequence[str],
          cause: str | None = None) -> None:
    __tracebackhide__ = True
    if got is None:
        if not bool(want.any()):
            return
        fail(f"{label}: {what} is None, but it is not zero.", *context, f"expected {show(want)}",
             cause=cause or "None means 'known to be zero'; this gradient has non-zero entries.")
    if tuple(got.shape) != tuple(want.shape):
        fail(f"{label}: {what} has shape {shape(got)}, expected {shape(want)}.", *context,
             cause="a gradient has the shape of the value it is the gradient of"
             + (" (the backward of sum is expand, and of expand is sum)." if got.dim() != want.dim() else "."))
    if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
        fail(f"{label}: {what} is wrong.", *context, f"expected {show(want)}", f"actual   {show(got)}", cause=cause)


def _generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(inputs.seed_of(seed))
    return generator


def _names(ops: Sequence[Any]) -> list[str]:
    return [fn.__name__.removeprefix("operator_") for fn in ops]


# --- one operation: check_ops -----------------------------------------------------------------

@dataclass
class OpCase:
    op: str
    inputs: list[torch.Tensor]
    extra: tuple = ()

    def torch(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return tape.TORCH_OPS[self.op][1](*xs, *self.extra)


def _op_cases(op: str, generator: torch.Generator) -> list[OpCase]:
    def r(*s):
        return torch.randn(s, generator=generator, dtype=torch.float64)

    if op == "expand":
        return [OpCase(op, [r()], ((4,),)), OpCase(op, [r()], ((2, 3),))]
    if op == "sum":
        return [OpCase(op, [r(4)]), OpCase(op, [r(2, 3)])]
    if op == "matmul":
        return [OpCase(op, [r(2, 3), r(3, 4)]), OpCase(op, [r(3, 3), r(3, 3)])]
    if op == "t":
        return [OpCase(op, [r(2, 3)])]
    arity = tape.TORCH_OPS[op][0]
    return [OpCase(op, [r(4) for _ in range(arity)]), OpCase(op, [r(2, 3) for _ in range(arity)])]


def check_ops(*ops: Callable[..., Any], seed: int | None = 0) -> None:
    """The propagate rules of the given `operator_<name>` functions, to second order."""
    __tracebackhide__ = True
    generator = _generator(seed)
    names = _names(ops)
    with quiet():
        runs = []
        for fn, name in zip(ops, names):
            for case in _op_cases(name, generator):
                dL_dr = torch.randn(case.torch(case.inputs).shape, generator=generator, dtype=torch.float64)
                us = [torch.randn(x.shape, generator=generator, dtype=torch.float64) for x in case.inputs]
                transcript = probe.invoke(tape.op_transcript, fn, names, case.inputs, case.extra, dL_dr, us)
                runs.append((fn.__name__, case, dL_dr, us, transcript))
        # First order for every operation before any second order: the second order of one
        # operation runs the propagate of others (sum's uses expand's).
        for second_order in (False, True):
            for run in runs:
                _judge_op(*run, second_order=second_order)
    passed(f"{', '.join(names)}: forward values, gradients and gradients of gradients agree with torch.autograd.")


def _judge_op(label: str, case: OpCase, dL_dr: torch.Tensor, us: list, transcript: dict, *, second_order: bool) -> None:
    __tracebackhide__ = True
    names = ["self", "rhs"][: len(case.inputs)]
    context = [f"{n} = {show(x)}" for n, x in zip(names, case.inputs)] + [f"extra arguments {case.extra}"] * bool(case.extra)
    error = transcript["error"]
    if error and error["stage"] in ("setup", "forward"):
        _fail_error(label, error, context)
    xs = [x.clone().requires_grad_() for x in case.inputs]
    want = case.torch(xs)
    _same(label, "the forward value", _value(transcript["value"], "the result", label), want.detach(), context)
    if not transcript["recorded"]:
        fail(f"{label}: the forward pass must record exactly one tape entry, whose output is the result.", *context)
    context = [*context, f"dL_dr = {show(dL_dr)}"]
    if error and error["stage"] == "propagate":
        _fail_error(f"{label}: propagate", error, context)
    grads = _values(transcript["grads"], len(xs), "propagate's result", label, context)
    t_dL_dr = dL_dr.clone().requires_grad_()
    wants = torch.autograd.grad(want, xs, t_dL_dr, create_graph=True)
    got_values = [_value(g, f"the gradient for `{n}`", label) for n, g in zip(names, grads)]
    for i, (n, got, w) in enumerate(zip(names, got_values, wants)):
        _same(label, f"the gradient for `{n}`", got, w.detach(), context, cause=_first_order_cause(got, w, case, i))
    if not second_order:
        return
    if error:
        _fail_error(f"{label}: propagate", error, context)
    torch_S = sum((w * u).sum() for w, u in zip(wants, us))
    torch_second = torch.autograd.grad(torch_S, [*xs, t_dL_dr], allow_unused=True)
    second = transcript["second"] or [None] * len(torch_second)
    for n, got, w, like in zip([*names, "dL_dr"], second, torch_second, [*xs, t_dL_dr]):
        w = torch.zeros_like(like) if w is None else w
        _same(label, f"the gradient of your gradient (second order) with respect to `{n}`", got, w.detach(), context,
              cause=NOT_RECORDED_CAUSE)


def _first_order_cause(got: torch.Tensor | None, want: torch.Tensor, case: OpCase, index: int) -> str | None:
    if got is None or got.shape != want.shape:
        return None
    xs = [x.clone().requires_grad_() for x in case.inputs]
    out = case.torch(xs)
    with_ones = torch.autograd.grad(out, xs, torch.ones_like(out))[index]
    if torch.allclose(got, with_ones, rtol=RTOL, atol=ATOL):
        return "propagate ignores dL_dr: the chain rule multiplies the local derivative by the incoming gradient."
    if torch.allclose(got, -want.detach(), rtol=RTOL, atol=ATOL):
        return "the gradient has the wrong sign."
    return "the chain rule: dL/dinput = dL/dr times the local derivative dr/dinput (in the right order for matrices)."


# --- whole programs -------------------------------------------------------------------------

def program_transcript(student: Callable[..., Any], keep: Sequence[str], student_grad: bool, program: tape.Program,
                       xs: list[torch.Tensor]) -> dict:
    return probe.invoke(tape.program_transcript, student, list(keep), student_grad, program.data, xs)


def judge_program(
    transcript: dict, program: tape.Program, xs: list[torch.Tensor], *, label: str, description: str | None = None,
    first_cause: str | None = None, second_cause: str | None = None, second_order: bool = True,
) -> None:
    """The program's gradients, and (with `second_order`) those of their squared norm, as torch's."""
    __tracebackhide__ = True
    context = [description or f"program: {program.listing()}", *(f"v{i} = {show(x)}" for i, x in enumerate(xs))]
    if transcript["skipped_entry_called"]:
        fail(f"{label}: it called propagate for an entry none of whose outputs has a gradient.", *context,
             cause="when every dL_doutput of an entry is None (known to be zero), skip the entry: "
             "its input gradients are zero too, and computing them is wasted work.")
    error = transcript["error"]
    if error and error["stage"] != "second backward":
        _fail_error(label, error, context)
    leaves = [x.clone().requires_grad_() for x in xs]
    table = {op: fn for op, (_, fn) in tape.TORCH_OPS.items()}
    L0 = tape.loss_of(program, tape.run_program(program, leaves, table), torch.sum)
    wants = [torch.zeros_like(x) if w is None else w
             for x, w in zip(leaves, torch.autograd.grad(L0, leaves, create_graph=True, allow_unused=True))]
    grads = _values(transcript["grads"], len(xs), "the result of grad", label, context)
    got = [_value(g, f"dL/dv{i}", label) for i, g in enumerate(grads)]
    for i, (g, w) in enumerate(zip(got, wants)):
        _same(label, f"dL/dv{i}", g, w.detach(), context, cause=first_cause)
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


def _inputs(program: tape.Program, rng: random.Random) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    return [torch.rand(program.size, generator=generator, dtype=torch.float64) - 0.5 for _ in range(program.leaves)]


def differential_test(student: Callable[..., Any], keep: Sequence[str], student_grad: bool, ops: Sequence[str], *,
                      programs: int, length: int, seed: int | None, second_cause: str | None = None) -> None:
    """Random programs over `ops`: gradients and second-order gradients as torch's."""
    __tracebackhide__ = True
    rng = random.Random(inputs.seed_of(seed))
    for _ in range(programs):
        program = random_program(ops, length, rng)
        xs = _inputs(program, rng)
        transcript = program_transcript(student, keep, student_grad, program, xs)
        judge_program(transcript, program, xs, label="random program", second_cause=second_cause)


def check_ops_on_programs(*ops: Callable[..., Any], programs: int = 20, length: int = 6, seed: int | None = 0) -> None:
    """Random programs built from the given operations (and reference ones) against torch."""
    __tracebackhide__ = True
    names = _names(ops)
    pool = sorted(set(names) | {"add", "mul"} - ({"sum", "expand"} if "matmul" in names else set()))
    with quiet():
        differential_test(ops[0], names, False, pool, programs=programs, length=length, seed=seed)
    passed(f"{programs} random programs using {', '.join(names)}: gradients and second-order gradients agree with torch.autograd.")


def check_whole_tape(grad: Callable[..., list], *ops: Callable[..., Any], programs: int = 10, seed: int | None = 0) -> None:
    """Everything of the student's together (their grad and operations) on random programs."""
    __tracebackhide__ = True
    names = _names(ops)
    with quiet():
        differential_test(grad, names, True, [n for n in names if n not in ("matmul", "t")],
                          programs=programs, length=8, seed=seed)
        differential_test(grad, names, True, [n for n in names if n not in ("sum", "expand")],
                          programs=programs, length=6, seed=seed)
    passed(f"your whole tape: {2 * programs} random programs agree with torch.autograd, to second order.")


# --- the tape walk: grad ---------------------------------------------------------------------

# (program, description): the cases every grad must get right. Leaves: x, w, unused.
GRAD_CASES = [
    (tape.Program(3, (("mul", (0, 1)), ("sum", (3,)), ("sentinel", (0,))), (3,), loss=4),
     "an entry recorded after L (its output has no gradient, so it must be skipped)"),
    (tape.Program(3, (("first", (0, 1)), ("mul", (3, 3)), ("mul", (1, 0)), ("add", (4, 5))), (3,)),
     "first(x, w) = x, whose propagate returns [dL_dr, None]; L = sum(first * first + w * x)"),
    (tape.Program(3, (("exp", (0,)), ("mul", (3, 1)), ("sin", (3,)), ("add", (4, 5))), (3,)),
     "y = exp(x) is used twice: L = sum(y * w + sin(y))"),
    (tape.Program(3, (("mul", (0, 0)), ("mul", (3, 1))), (3,)),
     "x is both inputs of one multiplication: L = sum(x * x * w)"),
    (tape.Program(2, (("add", (0, 1)), ("mul", (2, 1))), (3,)),
     "L0 = sum((a + b) * b); then the gradients of L1 = sum(dL0/da ** 2 + dL0/db ** 2)"),
]
ACCUMULATE_CAUSE = (
    "every use of a value contributes a gradient: add the contributions (`+`), do not overwrite "
    "them (`=`). A value that does not affect L gets None."
)
RECORDED_ADD_CAUSE = (
    "accumulate with Variable addition (`dL_d[name] + g`), which the tape records; arithmetic on "
    "`.value` is invisible to the next call of grad."
)


def check_grad(grad: Callable[..., list], *, programs: int = 0, seed: int | None = 0) -> None:
    """`grad(L, wrt)`: every use accumulates, None stays None and is skipped, and the
    accumulation is recorded so that gradients of gradients work."""
    __tracebackhide__ = True
    rng = random.Random(inputs.seed_of(seed))
    with quiet():
        runs = []
        for program, description in GRAD_CASES:
            xs = [x + 1.0 for x in _inputs(program, rng)]
            runs.append((program_transcript(grad, (), True, program, xs), program, xs, description))
        # All first-order gradients before any second-order one: a wrong accumulation shows
        # up at first order, with its own explanation.
        for second_order in (False, True):
            for transcript, program, xs, description in runs:
                judge_program(transcript, program, xs, label="grad", description=description,
                              first_cause=ACCUMULATE_CAUSE, second_cause=RECORDED_ADD_CAUSE, second_order=second_order)
        if programs:
            differential_test(grad, (), True, ["add", "mul", "neg", "exp", "sin", "sum"], programs=programs,
                              length=6, seed=seed, second_cause=RECORDED_ADD_CAUSE)
    more = f"; {programs} random programs agree with torch.autograd" if programs else ""
    passed("grad: shared values, unused inputs, None gradients and gradients of gradients are right" + more + ".")


# --- the graph: topological order ---------------------------------------------------------

DEEP = 10_000
DEEP_CHAIN = tape.Program(1, tuple(("neg", (k,)) for k in range(DEEP)) + (("sum", (DEEP,)),), (3,))
ORDER_CASES = [
    (tape.Program(2, (("exp", (0,)), ("mul", (2, 1)), ("sin", (3,)), ("mul", (4, 2)), ("add", (5, 2)), ("sum", (6,))), (3,)),
     "y = exp(x); L = sum(sin(y * w) * y + y)"),
]


def _step(program: tape.Program, k: int) -> str:
    op, args = program.steps[k]
    return f"`v{program.leaves + k} = {op}({', '.join(f'v{a}' for a in args)})`"


def _judge_order(topological_order: Callable[..., Any], program: tape.Program, description: str) -> None:
    __tracebackhide__ = True
    xs = [torch.rand(program.size, dtype=torch.float64) for _ in range(program.leaves)]
    transcript = probe.invoke(tape.order_transcript, topological_order, program.data, xs)
    error = transcript["error"]
    if error and error["type"] == "RecursionError":
        fail(f"topological_order: RecursionError on {description}.",
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
        what = f"misses {_step(program, missing[0])}" if missing else "lists entries that are not reachable from the root"
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


def check_topological_order(
    topological_order: Callable[[Any], list], *, seed: int | None = 0, programs: int = 0, deep: bool = True
) -> None:
    """Every reachable entry once, each after all entries that consume its outputs, and
    (with `deep`) on a 10,000-deep chain."""
    __tracebackhide__ = True
    rng = random.Random(inputs.seed_of(seed))
    with quiet():
        for program, description in ORDER_CASES:
            _judge_order(topological_order, program, description)
        for _ in range(programs):
            program = random_program(["add", "mul", "neg", "exp", "sin"], 12, rng)
            _judge_order(topological_order, tape.Program(3, program.steps + (("sum", (2 + len(program.steps),)),), (3,)),
                         "a random program")
        if deep:
            _judge_order(topological_order, DEEP_CHAIN, f"a chain of {DEEP:,} negations")
    extra = f", {programs} random programs" if programs else ""
    chain = f" and a {DEEP:,}-deep chain" if deep else ""
    passed(f"topological_order: valid on shared values{extra}{chain}.")


# --- notebook 02: gradients of gradients and fused operations -------------------------------

def check_hvp(hvp: Callable[..., Any], *, functions: Sequence[str] = tuple(tape.HVP_FUNCTIONS), seed: int | None = 0) -> None:
    """`hvp(f, x, v)`: the Hessian of the scalar f at x times v, using grad twice."""
    __tracebackhide__ = True
    generator = _generator(seed)
    with quiet():
        for name in functions:
            f = tape.HVP_FUNCTIONS[name]
            size = (3, 3) if "@" in name else (4,)
            x_t, v_t = (torch.randn(size, generator=generator, dtype=torch.float64) for _ in range(2))
            context = [f"f(x) = {name}", f"x = {show(x_t)}", f"v = {show(v_t)}"]
            transcript = probe.invoke(tape.hvp_transcript, hvp, f, x_t, v_t)
            if transcript["error"]:
                _fail_error("hvp", transcript["error"], context)
            got = _value(transcript["result"], "H v", "hvp")
            want = torch.autograd.functional.hvp(f, x_t, v_t)[1]
            first = torch.autograd.functional.vjp(f, x_t)[1]  # not torch.func: it loads torch._dynamo (~1 s)
            cause = (
                "that is the gradient of f, not the Hessian times v: differentiate again, the sum of "
                "(gradient * v)." if got is not None and got.shape == first.shape
                and torch.allclose(got, first, rtol=RTOL, atol=ATOL) else
                "Hv = d/dx sum(grad(f)(x) * v): the first gradient must stay a Variable on the tape "
                "(no `.value`), then be multiplied by v, summed, and differentiated with grad."
            )
            _same("hvp", "H v", got, want, context, cause=cause)
    passed(f"hvp: Hessian-vector products of {len(functions)} functions agree with torch.autograd.functional.hvp.")


ESCAPE_CAUSE = (
    "the intermediate exp(a) escapes: propagate uses it, but the tape does not know it depends "
    "on a. Declare it as a second output of the entry (and add its incoming gradient, which may "
    "be None), or recompute it inside propagate from a."
)


def check_exp_mul(operator_exp_mul: Callable[..., Any], *, programs: int = 0, seed: int | None = 0) -> None:
    """`exp_mul(a, b) = exp(a) * b` as one entry: right to first and second order."""
    __tracebackhide__ = True
    rng = random.Random(inputs.seed_of(seed))
    alone = tape.Program(2, (("exp_mul", (0, 1)),), (3,))
    with quiet():
        for _ in range(2):
            xs = _inputs(alone, rng)
            judge_program(program_transcript(operator_exp_mul, ["exp_mul"], False, alone, xs), alone, xs,
                          label="exp_mul", second_cause=ESCAPE_CAUSE,
                          description="L0 = sum(exp_mul(a, b)); then the gradients of L1 = sum(da ** 2 + db ** 2)")
        if programs:
            differential_test(operator_exp_mul, ["exp_mul"], False, ["add", "mul", "exp_mul", "sin"],
                              programs=programs, length=6, seed=seed, second_cause=ESCAPE_CAUSE)
    extra = f"; {programs} random programs agree with torch.autograd" if programs else ""
    passed("exp_mul: values, gradients and gradients of gradients are right" + extra + ".")
