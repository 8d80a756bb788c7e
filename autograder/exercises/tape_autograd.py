"""Checks for notebooks 01_tape_autograd and 02_higher_order_and_fusion.

The notebooks define the tape themselves (`Variable`, `TapeEntry`, `gradient_tape`,
`record`, and one `operator_<op>` function per operation). A check finds that namespace
through the functions it is given (their `__globals__`) and compares what the student's
code computes with torch.autograd on the same values, to first and second order.

While a check runs, every operation it does not test is replaced by a reference
implementation, so a mistake in one exercise never costs points in another.
"""
from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from ..checks.report import fail, passed, quiet, shape, show

RTOL, ATOL = 1e-7, 1e-10

# name -> (arity, torch implementation); the notebook's function is `operator_<name>`.
TORCH_OPS: dict[str, tuple[int, Callable[..., torch.Tensor]]] = {
    "neg": (1, torch.neg),
    "add": (2, torch.add),
    "mul": (2, torch.mul),
    "sum": (1, torch.sum),
    "expand": (1, lambda a, sizes=(3,): a.expand(sizes)),
    "t": (1, lambda a: a.t()),
    "exp": (1, torch.exp),
    "sin": (1, torch.sin),
    "cos": (1, torch.cos),
    "matmul": (2, torch.matmul),
}


class Tape:
    """The tape of a student's notebook, found from one of its functions."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.ns: dict[str, Any] = fn.__globals__
        for name in ("Variable", "TapeEntry", "gradient_tape", "record"):
            if name not in self.ns:
                fail(f"`{name}` is not defined: run the cells above (the tape's definitions) first.")
        self.Variable = self.ns["Variable"]
        self.tape: list = self.ns["gradient_tape"]

    def var(self, value: torch.Tensor):
        return self.Variable(value.detach().clone())

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


# --- comparing with torch ----------------------------------------------------------------

NONE_CAUSE = (
    "a gradient was None where a Variable was expected. None means 'known to be zero': skip "
    "an entry whose output gradients are all None, and skip None input gradients when adding."
)


def _run(label: str, fn: Callable[..., Any], *args: Any, context: Sequence[str] = ()) -> Any:
    """Call student code; turn its exceptions into a message that says where."""
    __tracebackhide__ = True
    try:
        return fn(*args)
    except NotImplementedError:
        fail(f"{label} is not implemented yet.", cause="replace `raise NotImplementedError()` with your code.")
    except (ArithmeticError, AttributeError, LookupError, RuntimeError, TypeError, ValueError) as error:
        cause = NONE_CAUSE if "NoneType" in str(error) else None
        if "cannot be multiplied" in str(error):
            cause = "let the shapes guide you: each gradient has the shape of its input, and only one order of the factors fits."
        fail(f"{label} raised {type(error).__name__}: {error}", *context, cause=cause)



def _value(x: Any, what: str, label: str) -> torch.Tensor | None:
    __tracebackhide__ = True
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        fail(
            f"{label}: {what} is a plain tensor, not a Variable.",
            cause="propagate must compute with Variables (e.g. `dL_dr * rhs`, not `dL_dr.value * rhs.value`) "
            "so that the tape records it and gradients of gradients work.",
        )
    if not hasattr(x, "value"):
        fail(f"{label}: {what} is {type(x).__name__}, expected a Variable (or None).")
    return x.value


def _same(label: str, what: str, got: torch.Tensor | None, want: torch.Tensor, context: list[str], cause: str | None = None) -> None:
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


@dataclass
class OpCase:
    op: str
    inputs: list[torch.Tensor]
    extra: tuple = ()


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
    arity = TORCH_OPS[op][0]
    return [OpCase(op, [r(4) for _ in range(arity)]), OpCase(op, [r(2, 3) for _ in range(arity)])]


def _torch_call(case: OpCase, xs: list[torch.Tensor]) -> torch.Tensor:
    fn = TORCH_OPS[case.op][1]
    return fn(*xs, *case.extra)


def check_op(tape: Tape, fn: Callable[..., Any], case: OpCase, generator: torch.Generator, second_order: bool) -> None:
    """One operation: forward value, the gradients its propagate returns and, with
    `second_order`, the gradients of those gradients."""
    __tracebackhide__ = True
    label = fn.__name__
    xs = [x.clone().requires_grad_() for x in case.inputs]
    names = ["self", "rhs"][: len(xs)]
    context = [f"{n} = {show(x)}" for n, x in zip(names, case.inputs)] + [f"extra arguments {case.extra}"] * bool(case.extra)
    vs = [tape.var(x) for x in case.inputs]
    before = len(tape.tape)
    r = _run(label, fn, *vs, *case.extra, context=context)
    want = _torch_call(case, xs)
    _same(label, "the forward value", _value(r, "the result", label), want.detach(), context)
    if len(tape.tape) != before + 1 or tape.tape[-1].outputs != [r.name]:
        fail(f"{label}: the forward pass must record exactly one tape entry, whose output is the result.", *context)
    entry = tape.tape[-1]
    dL_dr = torch.randn(want.shape, generator=generator, dtype=torch.float64).requires_grad_()
    context.append(f"dL_dr = {show(dL_dr)}")
    g = tape.var(dL_dr)
    grads = _run(f"{label}: propagate", entry.propagate, [g], context=context)
    if not isinstance(grads, (list, tuple)) or len(grads) != len(vs):
        fail(f"{label}: propagate must return a list with one gradient per input ({len(vs)}), got {grads!r:.80}.",
             *context)
    wants = torch.autograd.grad(want, xs, dL_dr, create_graph=True)
    for i, (n, got, w) in enumerate(zip(names, grads, wants)):
        _same(label, f"the gradient for `{n}`", _value(got, f"the gradient for `{n}`", label), w.detach(), context,
              cause=_first_order_cause(got, w, case, i))
    if not second_order:
        return
    # Differentiate <grads, u> with the tape; torch does the same on its graph.
    us = [torch.randn(x.shape, generator=generator, dtype=torch.float64) for x in xs]
    ref = reference_ops(tape)
    terms = [ref["sum"](ref["mul"](gv, tape.var(u))) for gv, u in zip(grads, us) if gv is not None]
    if not terms:
        return
    S = terms[0]
    for t in terms[1:]:
        S = ref["add"](S, t)
    second = _run(f"{label}: propagate (second backward)", reference_grad, tape, S, [*vs, g], context=context)
    torch_S = sum((w * u).sum() for w, u in zip(wants, us))
    torch_second = torch.autograd.grad(torch_S, [*xs, dL_dr], allow_unused=True)
    for n, got, w in zip([*names, "dL_dr"], second, torch_second):
        w = torch.zeros_like(dL_dr if n == "dL_dr" else xs[names.index(n)]) if w is None else w
        _same(
            label, f"the gradient of your gradient (second order) with respect to `{n}`",
            None if got is None else got.value, w.detach(), context,
            cause="the gradient propagate returns must be computed with Variable operations that the tape "
            "records (no `.value` arithmetic, no new `Variable(...)` from raw tensors), so that it can be "
            "differentiated again.",
        )


def _first_order_cause(got, want: torch.Tensor, case: OpCase, index: int) -> str | None:
    if got is None or not hasattr(got, "value") or got.value.shape != want.shape:
        return None
    xs = [x.clone().requires_grad_() for x in case.inputs]
    out = _torch_call(case, xs)
    with_ones = torch.autograd.grad(out, xs, torch.ones_like(out))[index]
    if torch.allclose(got.value, with_ones, rtol=RTOL, atol=ATOL):
        return "propagate ignores dL_dr: the chain rule multiplies the local derivative by the incoming gradient."
    if torch.allclose(got.value, -want.detach(), rtol=RTOL, atol=ATOL):
        return "the gradient has the wrong sign."
    return "the chain rule: dL/dinput = dL/dr times the local derivative dr/dinput (in the right order for matrices)."


def check_ops(*ops: Callable[..., Any], seed: int | None = 0) -> None:
    """Check the propagate rules of the given `operator_<name>` functions."""
    __tracebackhide__ = True
    generator = torch.Generator()
    generator.manual_seed(torch.seed() if seed is None else seed)
    tape = Tape(ops[0])
    names = [fn.__name__.removeprefix("operator_") for fn in ops]
    with quiet(), tape.isolated(keep=names):
        # First order for every operation before any second order: the second order of one
        # operation runs the propagate of others (sum's uses expand's).
        for second_order in (False, True):
            for fn, name in zip(ops, names):
                for case in _op_cases(name, generator):
                    tape.tape.clear()
                    check_op(tape, fn, case, generator, second_order)
    passed(f"{', '.join(names)}: forward values, gradients and gradients of gradients agree with torch.autograd.")


# --- whole programs -------------------------------------------------------------------------

@dataclass
class Step:
    op: str
    args: tuple[int, ...]  # indices into the pool of values


def random_program(ops: Sequence[str], length: int, rng: random.Random, table: dict = TORCH_OPS) -> list[Step]:
    """A straight-line program over a pool that starts with 3 inputs of the same shape.

    Elementwise programs keep shape (3,); with "matmul" or "t" in `ops` they work on 3x3
    matrices. "sum" is always followed by "expand" back to the pool's shape, and its
    scalar result is not used otherwise.
    """
    steps: list[Step] = []
    usable = [0, 1, 2]
    elementwise = [o for o in ops if o not in ("sum", "expand")]
    while len(steps) < length:
        op = rng.choice(elementwise + (["sum"] if "sum" in ops else []))
        steps.append(Step(op, tuple(rng.choice(usable) for _ in range(table[op][0]))))
        index = 3 + len(steps) - 1
        if op == "sum":
            steps.append(Step("expand", (index,)))
            usable.append(index + 1)
        else:
            usable.append(index)
    return steps


def run_program(steps: Sequence[Step], leaves: list, call: Callable[[str, list, tuple], Any], size: tuple) -> list:
    pool = list(leaves)
    for step in steps:
        extra = (size,) if step.op == "expand" else ()
        pool.append(call(step.op, [pool[i] for i in step.args], extra))
    return pool


def differential_test(
    tape: Tape, ops: Sequence[str], grad_fn: Callable[..., list], *, programs: int, length: int, seed: int | None,
    table: dict = TORCH_OPS,
) -> None:
    """Random programs: gradients (and gradients of the gradients' squared norm) as torch's."""
    __tracebackhide__ = True
    rng = random.Random(torch.seed() if seed is None else seed)
    size = (3, 3) if ("matmul" in ops or "t" in ops) else (3,)
    for _ in range(programs):
        steps = random_program(ops, length, rng, table)
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        xs = [(torch.rand(size, generator=gen, dtype=torch.float64) - 0.5).requires_grad_() for _ in range(3)]
        tape.tape.clear()
        vs = [tape.var(x) for x in xs]
        out = run_program(steps, vs, lambda op, a, e: tape.ns[f"operator_{op}"](*a, *e), size)
        L0 = tape.ns["operator_sum"](out[-1])
        listing = "; ".join(f"v{3 + i} = {s.op}({', '.join(f'v{j}' for j in s.args)})" for i, s in enumerate(steps))
        context = [f"program: {listing}; L = sum(v{len(out) - 1})", *(f"v{i} = {show(x)}" for i, x in enumerate(xs))]
        grads = _run("random program: backward", grad_fn, L0, vs, context=context)
        t_out = run_program(steps, xs, lambda op, a, e: table[op][1](*a, *e), size)
        t_grads = torch.autograd.grad(t_out[-1].sum(), xs, create_graph=True, allow_unused=True)
        t_grads = [torch.zeros_like(x) if g is None else g for x, g in zip(xs, t_grads)]
        for i, (got, want) in enumerate(zip(grads, t_grads)):
            _same("random program", f"dL/dv{i}", _value(got, f"dL/dv{i}", "random program"), want.detach(), context)
        live = [(g, w) for g, w in zip(grads, t_grads) if g is not None]
        if not live:
            continue
        L1 = tape.ns["operator_sum"](_sum_of_squares(tape, [g for g, _ in live]))
        second = _run("random program: second backward", grad_fn, L1, vs, context=context)
        t_L1 = sum((w * w).sum() for _, w in live)
        t_second = torch.autograd.grad(t_L1, xs, allow_unused=True) if t_L1.requires_grad else [None] * len(xs)
        for i, (got, want) in enumerate(zip(second, t_second)):
            want = torch.zeros_like(xs[i]) if want is None else want
            _same("random program", f"d(sum of squared gradients)/dv{i}", None if got is None else got.value,
                  want.detach(), context)


def _sum_of_squares(tape: Tape, grads: list):
    total = None
    for g in grads:
        sq = g * g
        total = sq if total is None else total + sq
    return total


def check_ops_on_programs(*ops: Callable[..., Any], programs: int = 20, length: int = 6, seed: int | None = 0) -> None:
    """Random programs built from the given operations (and reference ones) against torch."""
    __tracebackhide__ = True
    tape = Tape(ops[0])
    names = [fn.__name__.removeprefix("operator_") for fn in ops]
    pool = sorted(set(names) | {"add", "mul"} - ({"sum", "expand"} if "matmul" in names else set()))
    with quiet(), tape.isolated(keep=names):
        differential_test(tape, pool, lambda L, wrt: reference_grad(tape, L, wrt),
                          programs=programs, length=length, seed=seed)
    passed(f"{programs} random programs using {', '.join(names)}: gradients and second-order gradients agree with torch.autograd.")


# --- the tape walk: grad -----------------------------------------------------------------

def check_grad(grad: Callable[..., list], *, programs: int = 0, seed: int | None = 0) -> None:
    """`grad(L, wrt)`: every use accumulates, None stays None and is skipped, and the
    accumulation is recorded so that gradients of gradients work."""
    __tracebackhide__ = True
    tape = Tape(grad)
    generator = torch.Generator()
    generator.manual_seed(torch.seed() if seed is None else seed)
    with quiet(), tape.isolated():
        for build in (_diamond, _same_input_twice, _none_gradients, _skipped_entry):
            tape.tape.clear()
            _check_grad_case(tape, grad, build, generator)
        tape.tape.clear()
        _check_second_order(tape, grad, generator)
        if programs:
            differential_test(tape, ["add", "mul", "neg", "exp", "sin", "sum"], grad,
                              programs=programs, length=6, seed=seed)
    more = f"; {programs} random programs agree with torch.autograd" if programs else ""
    passed("grad: shared values, unused inputs, None gradients and gradients of gradients are right" + more + ".")


def _diamond(tape: Tape, xs: list):
    """x feeds two branches that meet again: y = exp(x); L = sum(y * w + sin(y))."""
    x, w = xs[:2]
    y = x.exp()
    return (y * w + y.sin()).sum(), "y = exp(x) is used twice: L = sum(y * w + sin(y))"


def _same_input_twice(tape: Tape, xs: list):
    x, w = xs[:2]
    return (x * x * w).sum(), "x is both inputs of one multiplication: L = sum(x * x * w)"


def _none_gradients(tape: Tape, xs: list):
    """An entry whose propagate returns None for one input (a known-zero gradient)."""
    x, w = xs[:2]
    first = tape.Variable(x.value.clone())
    tape.ns["record"]("first", [x, w], [first], lambda g: [g[0], None])
    return (first * first + w * x).sum(), "first(x, w) = x, whose propagate returns [dL_dr, None]; L = sum(first * first + w * x)"


class SkippedEntryCalled(Exception):
    """Raised by an entry that grad must skip."""


def _skipped_entry(tape: Tape, xs: list):
    """Work that does not lead to L must not be propagated (its gradients are None)."""
    x, w = xs[:2]
    L = (x * w).sum()

    def must_not_run(g):
        raise SkippedEntryCalled

    tape.ns["record"]("unused", [x], [tape.Variable(x.value * 2)], must_not_run)
    return L, "an entry recorded after L (its output has no gradient, so it must be skipped)"


def _check_grad_case(tape: Tape, grad, build, generator) -> None:
    __tracebackhide__ = True
    xs_t = [torch.rand(3, generator=generator, dtype=torch.float64) + 0.5 for _ in range(3)]
    xs = [tape.var(x) for x in xs_t]
    L, description = build(tape, xs)
    forward = list(tape.tape)
    context = [description] + [f"{n} = {show(t)}" for n, t in zip(("x", "w", "unused"), xs_t)]
    try:
        got = _run("grad", grad, L, xs, context=context)
    except SkippedEntryCalled:
        fail("grad: it called propagate for an entry none of whose outputs has a gradient.", *context,
             cause="when every dL_doutput of an entry is None (known to be zero), skip the entry: "
             "its input gradients are zero too, and computing them is wasted work.")
    if not isinstance(got, (list, tuple)) or len(got) != len(xs):
        fail(f"grad must return a list with one entry per requested Variable ({len(xs)}).", *context)
    want = _torch_grads(forward, L, xs, xs_t)
    for name, g, w in zip(("x", "w", "unused"), got, want):
        _same("grad", f"dL/d{name}", _value(g, f"dL/d{name}", "grad"), w, context,
              cause="every use of a value contributes a gradient: add the contributions "
              "(`+`), do not overwrite them (`=`). A value that does not affect L gets None.")


def _torch_grads(entries: list, L, xs: list, xs_t: list[torch.Tensor]) -> list[torch.Tensor]:
    """Replay the forward entries with torch operations to get the true gradients."""
    leaves = {v.name: t.clone().requires_grad_() for v, t in zip(xs, xs_t)}
    values = dict(leaves)
    replay = {"first": lambda a, b: a * 1, "unused": lambda a: a * 2}
    for entry in entries:
        fn = replay.get(entry.op) or TORCH_OPS[entry.op][1]
        values[entry.outputs[0]] = fn(*(values[n] for n in entry.inputs))
    grads = torch.autograd.grad(values[L.name], list(leaves.values()), allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(xs_t, grads)]


def _check_second_order(tape: Tape, grad, generator) -> None:
    """The norm of the gradient, differentiated again with the same grad (notebook 01's run_gradients)."""
    __tracebackhide__ = True
    a_t, b_t = (torch.rand(3, generator=generator, dtype=torch.float64) + 0.5 for _ in range(2))
    a, b = tape.var(a_t), tape.var(b_t)
    L0 = ((a + b) * b).sum()
    context = ["L0 = sum((a + b) * b); L1 = sum(dL0/da ** 2 + dL0/db ** 2); gradients of L1",
               f"a = {show(a_t)}", f"b = {show(b_t)}"]
    da, db = _run("grad", grad, L0, [a, b], context=context)
    L1 = (da * da + db * db).sum()
    got = _run("grad", grad, L1, [a, b], context=context)
    at, bt = a_t.clone().requires_grad_(), b_t.clone().requires_grad_()
    tda, tdb = torch.autograd.grad(((at + bt) * bt).sum(), [at, bt], create_graph=True)
    want = torch.autograd.grad((tda * tda + tdb * tdb).sum(), [at, bt])
    for name, g, w in zip("ab", got, want):
        _same("grad", f"dL1/d{name}", _value(g, f"dL1/d{name}", "grad"), w, context,
              cause="accumulate with Variable addition (`dL_d[name] + g`), which the tape records; "
              "arithmetic on `.value` is invisible to the next call of grad.")


# --- the graph: topological order ---------------------------------------------------------

DEEP = 10_000


def _describe(entry) -> str:
    return f"`{', '.join(entry.outputs)} = {entry.op}({', '.join(entry.inputs)})`"


def _reachable(root) -> list:
    seen, stack, found = {id(root)}, [root], []
    while stack:
        entry = stack.pop()
        found.append(entry)
        for nxt in entry.next_entries:
            if nxt is not None and id(nxt) not in seen:
                seen.add(id(nxt))
                stack.append(nxt)
    return found


def _check_order(topological_order, root, description: str) -> None:
    __tracebackhide__ = True
    try:
        order = topological_order(root)
    except RecursionError:
        fail(f"topological_order: RecursionError on {description}.",
             cause="Python allows about 1,000 nested calls, and real graphs are deeper: replace the "
             "recursion with an explicit stack (or count each entry's consumers, as PyTorch's engine does).")
    except NotImplementedError:
        fail("topological_order is not implemented yet.", cause="replace `raise NotImplementedError()` with your code.")
    order = list(order)
    reachable = _reachable(root)
    ids = [id(e) for e in order]
    if len(set(ids)) != len(ids):
        twice = next(e for e in order if ids.count(id(e)) > 1)
        fail(f"topological_order: {_describe(twice)} appears more than once ({description}).",
             cause="an entry reached along two paths must be listed once, or its propagate would run twice.")
    missing = [e for e in reachable if id(e) not in set(ids)]
    if missing or len(order) != len(reachable):
        what = f"misses {_describe(missing[0])}" if missing else "lists entries that are not reachable from the root"
        fail(f"topological_order {what} ({description}).",
             cause="follow `next_entries` from the root to every entry that contributed to it (skip None: leaves).")
    if order[0] is not root:
        fail(f"topological_order must start with the root {_describe(root)} ({description}).")
    position = {id(e): i for i, e in enumerate(order)}
    for consumer in order:
        for producer in consumer.next_entries:
            if producer is not None and position[id(producer)] < position[id(consumer)]:
                fail(
                    f"topological_order puts {_describe(producer)} before {_describe(consumer)}, "
                    f"which uses its output ({description}).",
                    cause="an entry may only be propagated once every entry that consumes its outputs has "
                    "been: otherwise its output gradient is still incomplete. Depth-first order is not "
                    "enough; use reverse post-order, or count consumers (Kahn's algorithm).",
                )


def check_topological_order(topological_order: Callable[[Any], list], *, seed: int | None = 0, programs: int = 0) -> None:
    """Every reachable entry once, each after all entries that consume its outputs, even
    on a 10,000-deep chain."""
    __tracebackhide__ = True
    tape = Tape(topological_order)
    rng = random.Random(torch.seed() if seed is None else seed)
    with quiet(), tape.isolated():
        x, w = tape.var(torch.rand(3, dtype=torch.float64)), tape.var(torch.rand(3, dtype=torch.float64))
        # Unequal paths: the short path reaches `a` before the long one is done.
        a = x.exp()
        b = (a * w).sin()
        root = (b * a + a).sum().grad_fn
        _check_order(topological_order, root, "y = exp(x); L = sum(sin(y * w) * y + y)")
        for _ in range(programs):
            steps = random_program(["add", "mul", "neg", "exp", "sin"], 12, rng)
            leaves = [tape.var(torch.rand(3, dtype=torch.float64)) for _ in range(3)]
            out = run_program(steps, leaves, lambda op, args, e: tape.ns[f"operator_{op}"](*args), (3,))
            _check_order(topological_order, out[-1].sum().grad_fn, "a random program")
        tape.tape.clear()
        y = x
        for _ in range(DEEP):
            y = -y
        _check_order(topological_order, y.sum().grad_fn, f"a chain of {DEEP:,} negations")
    extra = f", {programs} random programs" if programs else ""
    passed(f"topological_order: valid on shared values{extra} and a {DEEP:,}-deep chain.")


def check_whole_tape(grad: Callable[..., list], *ops: Callable[..., Any], programs: int = 10, seed: int | None = 0) -> None:
    """Everything of the student's together (their grad and operations) on random programs."""
    __tracebackhide__ = True
    tape = Tape(grad)
    names = [fn.__name__.removeprefix("operator_") for fn in ops]
    elementwise = [n for n in names if n not in ("matmul", "t")]
    with quiet(), tape.isolated(keep=names):
        differential_test(tape, elementwise, grad, programs=programs, length=8, seed=seed)
        differential_test(tape, [n for n in names if n not in ("sum", "expand")], grad,
                          programs=programs, length=6, seed=seed)
    passed(f"your whole tape: {2 * programs} random programs agree with torch.autograd, to second order.")


# --- notebook 02: gradients of gradients and fused operations -------------------------------

# Functions of one Variable that work on torch tensors as well (same methods).
HVP_FUNCTIONS: dict[str, Callable[[Any], Any]] = {
    "sum(sin(x) * x)": lambda x: (x.sin() * x).sum(),
    "sum(exp(x) * exp(x))": lambda x: (x.exp() * x.exp()).sum(),
    "sum(x * x * x)": lambda x: (x * x * x).sum(),
    "sum(cos(x @ x))": lambda x: (x @ x).cos().sum(),
    "sum(x + x)": lambda x: (x + x).sum(),
}


def check_hvp(hvp: Callable[..., Any], *, functions: Sequence[str] = tuple(HVP_FUNCTIONS), seed: int | None = 0) -> None:
    """`hvp(f, x, v)`: the Hessian of the scalar f at x times v, using grad twice."""
    __tracebackhide__ = True
    tape = Tape(hvp)
    generator = torch.Generator()
    generator.manual_seed(torch.seed() if seed is None else seed)
    with quiet(), tape.isolated():
        for name in functions:
            f = HVP_FUNCTIONS[name]
            size = (3, 3) if "@" in name else (4,)
            x_t, v_t = (torch.randn(size, generator=generator, dtype=torch.float64) for _ in range(2))
            context = [f"f(x) = {name}", f"x = {show(x_t)}", f"v = {show(v_t)}"]
            tape.tape.clear()
            got = _run("hvp", hvp, f, tape.var(x_t), tape.var(v_t), context=context)
            want = torch.autograd.functional.hvp(f, x_t, v_t)[1]
            first = torch.func.grad(f)(x_t)
            cause = (
                "that is the gradient of f, not the Hessian times v: differentiate again, the sum of "
                "(gradient * v)." if got is not None and hasattr(got, "value") and got.value.shape == first.shape
                and torch.allclose(got.value, first, rtol=RTOL, atol=ATOL) else
                "Hv = d/dx sum(grad(f)(x) * v): the first gradient must stay a Variable on the tape "
                "(no `.value`), then be multiplied by v, summed, and differentiated with grad."
            )
            _same("hvp", "H v", _value(got, "H v", "hvp"), want, context, cause=cause)
    passed(f"hvp: Hessian-vector products of {len(functions)} functions agree with torch.autograd.functional.hvp.")


# Losses built from the first gradients (da, db) of sum(exp_mul(a, b)); Variables or tensors.
SECOND_LOSSES: dict[str, Callable[[Any, Any, Any], Any]] = {
    "sum(da * da + db * db)": lambda da, db, b: (da * da + db * db).sum(),
    "sum(da * b)": lambda da, db, b: (da * b).sum(),
}


def _exp_mul_cases(generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [tuple(torch.rand(3, generator=generator, dtype=torch.float64) - 0.5 for _ in range(2)) for _ in range(2)]


def check_exp_mul(operator_exp_mul: Callable[..., Any], *, programs: int = 0, seed: int | None = 0) -> None:
    """`exp_mul(a, b) = exp(a) * b` as one entry: right to first and second order."""
    __tracebackhide__ = True
    tape = Tape(operator_exp_mul)
    generator = torch.Generator()
    generator.manual_seed(torch.seed() if seed is None else seed)
    with quiet(), tape.isolated():
        for a_t, b_t in _exp_mul_cases(generator):
            for loss_name, second_loss in SECOND_LOSSES.items():
                tape.tape.clear()
                a, b = tape.var(a_t), tape.var(b_t)
                context = [f"a = {show(a_t)}", f"b = {show(b_t)}", f"L0 = sum(exp_mul(a, b)); L1 = {loss_name}"]
                r = _run("exp_mul", operator_exp_mul, a, b, context=context)
                _same("exp_mul", "the forward value", _value(r, "the result", "exp_mul"), a_t.exp() * b_t, context)
                da, db = _run("exp_mul: propagate", reference_grad, tape, tape.ns["operator_sum"](r), [a, b], context=context)
                at, bt = a_t.clone().requires_grad_(), b_t.clone().requires_grad_()
                tda, tdb = torch.autograd.grad((at.exp() * bt).sum(), [at, bt], create_graph=True)
                for n, g, w in (("a", da, tda), ("b", db, tdb)):
                    _same("exp_mul", f"dL0/d{n}", _value(g, f"dL0/d{n}", "exp_mul"), w.detach(), context)
                got = _run("exp_mul: propagate (second backward)", reference_grad, tape, second_loss(da, db, b), [a, b],
                           context=context)
                want = torch.autograd.grad(second_loss(tda, tdb, bt), [at, bt])
                for n, g, w in zip("ab", got, want):
                    _same("exp_mul", f"dL1/d{n} (a gradient of a gradient)", None if g is None else g.value, w, context,
                          cause="the intermediate exp(a) escapes: propagate uses it, but the tape does not know it "
                          "depends on a. Declare it as a second output of the entry (and add its incoming "
                          "gradient, which may be None), or recompute it inside propagate from a.")
        if programs:
            table = {**TORCH_OPS, "exp_mul": (2, lambda a, b: a.exp() * b)}
            differential_test(tape, ["add", "mul", "exp_mul", "sin"], lambda L, wrt: reference_grad(tape, L, wrt),
                              programs=programs, length=6, seed=seed, table=table)
    extra = f"; {programs} random programs agree with torch.autograd" if programs else ""
    passed("exp_mul: values, gradients and gradients of gradients are right" + extra + ".")
