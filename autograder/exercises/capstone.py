"""Checks for notebook 11_capstone: a fused softmax-cross-entropy, built end to end.

The student's answer is a function `fused_cross_entropy(logits, target, weight=None,
reduction="mean", ignore_index=-100)` with `F.cross_entropy`'s meaning, the classes on the
last dim of `logits` (shape (..., C), target (...)). How it is built is the student's choice;
the checks grade what it does, one property per check:

- :func:`check_fused_values` — values and gradients against `F.cross_entropy` (every
  reduction, class weights, ignored rows, logits of ±1000, -inf logits, a target scored
  800 below the rest), gradcheck, float32, the meta device, CPU and CUDA;
- :func:`check_fused_double_backward` — second-order gradients and gradgradcheck;
- :func:`check_fused_memory` — what it saves for backward (saved-tensor hooks), against a
  budget: the inputs themselves, and O(rows) numbers;
- :func:`check_fused_vmap` — `torch.func.vmap`, per-sample gradients `vmap(grad(...))` and
  gradients through vmap, against loops;
- :func:`check_fused_compile` — `torch.compile(backend="aot_eager", fullgraph=True)`.

The class weights are not differentiated (nor are they by `F.cross_entropy`): apart from the
memory check, the student's function is probed as `loss(logits, target, options)`, the
weight, reduction and ignore_index inside the plain dict `options`
(:func:`autograder.student.capstone.as_loss`). The transform and compile checks are those of
notebook 10 (:mod:`autograder.exercises.modern_api`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..checks import inputs
from ..checks.functions import FunctionSpec, check_function
from ..student import capstone as student_side
from ..student import devices, probe
from ..student.report import CheckFailed, fail, note, passed, quiet, show
from ..student.saved import Names, Recording, Saved
from .memory import Budget, judge_budget
from .modern_api import (
    VmapCase,
    _batch_size,
    _compare,
    _describe_vmap,
    _error_of,
    _fail_error,
    _like,
    _reference_grads,
    _sample,
    _tensor_list,
    batched,
    check_compile,
    check_vmap,
    loop,
)

NAME = "fused_cross_entropy"
ARG_NAMES = ("logits", "target", "options")
REDUCTIONS = ("mean", "sum", "none")
KINDS = ("normal", "large", "far", "masked")
FAR = 800.0  # a target scored this much below the others: softmax underflows to 0 (e^-800)
LARGE = 1000.0  # rows shifted by ±1000: e^1000 overflows


# --- The reference ----------------------------------------------------------------------------

def reference(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
              reduction: str = "mean", ignore_index: int = -100) -> torch.Tensor:
    """F.cross_entropy with the classes on the last dim of logits (shape (..., C))."""
    classes = logits.shape[-1]
    out = F.cross_entropy(logits.reshape(-1, classes), target.reshape(-1), weight=weight, reduction=reduction,
                          ignore_index=ignore_index)
    return out.reshape(target.shape) if reduction == "none" else out


def _reference(logits: torch.Tensor, target: torch.Tensor, options: dict) -> torch.Tensor:
    """The reference as the checks probe the student: options = {weight, reduction, ignore_index}."""
    weight = options.get("weight")
    if isinstance(weight, torch.Tensor):
        weight = weight.to(device=logits.device, dtype=logits.dtype)
    return reference(logits, target, weight, options["reduction"], options["ignore_index"])


class _WithOptions(probe.StudentProxy):
    """A student's function in another process, probed as loss(logits, target, options)."""

    def __init__(self, student: Any) -> None:
        self.student = student

    def invoke(self, procedure: str, *args: Any) -> Any:
        return probe.invoke(student_side.with_options, self.student, procedure, *args)


def _loss_of(student: Any) -> Any:
    """The student's function as loss(logits, target, options): built here when it is a local
    object (the student's kernel: torch's own gradcheck then runs on it), reached through
    the student's process otherwise."""
    if isinstance(student, probe.StudentProxy):
        return _WithOptions(student)
    return student_side.as_loss(student)


# --- Inputs -----------------------------------------------------------------------------------
# A case: (shape of logits (..., C), reduction, weighted, ignore_index or None, kind of logits).
# ignore_index None: no row is ignored (the default -100 is passed). Otherwise rows are
# ignored (about a third, never the first), and ignore_index may be a real class. Kinds:
# "normal" 2·N(0, 1); "large" the same shifted by +1000 and -1000 on alternate rows;
# "far" the target of some rows (the first among them) scored 800 below the others;
# "masked" about a third of each row's other classes at -inf.

Case = tuple[Sequence[int], str, bool, "int | None", str]


def _targets(shape: Sequence[int], classes: int, ignore: int | None, generator: torch.Generator) -> torch.Tensor:
    target = torch.randint(classes, tuple(shape), generator=generator)
    if ignore is None:
        return target
    flat = target.view(-1)
    if 0 <= ignore < classes and int(flat[0]) == ignore:  # the first row is never ignored
        flat[0] = (ignore + 1) % classes
    if flat.numel() >= 2:
        drop = torch.rand(flat.numel(), generator=generator) < 1 / 3
        drop[0], drop[-1] = False, True
        flat[drop] = ignore
    return target


def _logits(shape: Sequence[int], target: torch.Tensor, kind: str, ignore: int | None,
            generator: torch.Generator) -> torch.Tensor:
    logits = 2 * inputs.normal(shape, generator)
    classes = shape[-1]
    rows = logits.view(-1, classes)
    picked = target.reshape(-1).clamp(0, classes - 1)
    if kind == "large":
        rows += LARGE * (1 - 2 * (torch.arange(rows.shape[0], dtype=torch.float64) % 2)).unsqueeze(-1)
    elif kind == "far":
        chosen = torch.rand(rows.shape[0], generator=generator) < 0.5
        chosen[0] = True
        index = torch.arange(rows.shape[0])[chosen]
        rows[index, picked[chosen]] -= FAR
    elif kind == "masked" and classes >= 2:
        # Valid rows keep their target finite; an ignored row has -inf where an index of 0 or
        # its raw target would read it (neither is its class), and keeps another class finite.
        every = torch.arange(rows.shape[0])
        ignored = target.reshape(-1) == ignore if ignore is not None else torch.zeros(rows.shape[0], dtype=torch.bool)
        keep = torch.where(ignored, classes - 1 if ignore != classes - 1 else classes - 2, picked)
        hide = torch.rand(rows.shape, generator=generator) < 1 / 3
        hide[every, (keep + 1) % classes] = True
        if classes >= 3:  # a second finite class: a row's loss is not 0 whatever it divides by
            hide[every, (keep + 2) % classes] = False
        hide[every[ignored], 0] = True
        if ignore is not None and 0 <= ignore < classes:
            hide[every[ignored], ignore] = True
        hide[every, keep] = False
        rows[hide] = -float("inf")
    elif kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    return logits


def _options(classes: int, reduction: str, weighted: bool, ignore: int | None,
             generator: torch.Generator) -> dict:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, not {reduction!r}")
    weight = 0.2 + 1.8 * torch.rand(classes, generator=generator, dtype=torch.float64) if weighted else None
    return {"weight": weight, "reduction": reduction, "ignore_index": -100 if ignore is None else int(ignore)}


def _draw(case: Case, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, dict]:
    shape, reduction, weighted, ignore, kind = case
    shape = tuple(shape)
    if not shape or (ignore is not None and shape[-1] == 1 and ignore == 0):
        raise ValueError(f"bad case {case!r}: logits need a class dim, and a row that is not ignored")
    target = _targets(shape[:-1], shape[-1], ignore, generator)
    logits = _logits(shape, target, kind, ignore, generator)
    return logits, target, _options(shape[-1], reduction, weighted, ignore, generator)


def _cases(specs: Sequence[Case]):
    def cases(generator: torch.Generator) -> list[tuple]:
        return [_draw(case, generator) for case in specs]

    return cases


def _describe_case(case: Case) -> str:
    shape, reduction, weighted, ignore, kind = case
    parts = [f"logits {tuple(shape)}", repr(reduction)]
    if weighted:
        parts.append("weighted")
    if ignore is not None:
        parts.append(f"ignore_index={ignore}")
    if kind != "normal":
        parts.append({"large": "rows at ±1000", "far": "a target 800 below the rest", "masked": "-inf logits"}[kind])
    return ", ".join(parts)


def _hint(args: tuple, i: int, wrong: torch.Tensor) -> str | None:
    """Why the gradient for the logits is wrong where it is (args: logits, target, options)."""
    logits, target, options = args
    ignored = (target == options["ignore_index"]).unsqueeze(-1).expand(logits.shape)
    if bool(ignored.any()) and bool(wrong[ignored].any()) and not bool(wrong[~ignored].any()):
        return (f"only rows whose target is ignore_index ({options['ignore_index']}) are wrong: they add nothing to "
                "the loss, so their gradient is 0 (and they do not count in the 'mean').")
    if torch.isinf(logits).any() and bool(wrong[torch.isinf(logits)].any()):
        return ("the gradient is wrong where a logit is -inf: its probability is 0, so is its gradient. "
                "0 · (-inf) is nan: never multiply a log-probability by a one-hot mask.")
    causes = []
    if options.get("weight") is not None:
        causes.append("each row's gradient is scaled by weight[target]")
    if options["reduction"] == "mean":
        causes.append("'mean' divides by the sum of weight[target] over the rows that are not ignored (their number "
                      "when there is no weight), not by the number of rows")
    elif options["reduction"] == "none":
        causes.append("with 'none', grad_output has one entry per row: row i's gradient is grad_output[i] · "
                      "(softmax(logits[i]) − onehot(target[i]))")
    return ("; ".join(causes) + ".") if causes else None


# --- Values and gradients --------------------------------------------------------------------

VALUE_CASES: tuple[Case, ...] = (
    ((4, 5), "mean", True, -100, "normal"),
    ((3, 4), "sum", False, None, "large"),
    ((2, 3, 4), "none", True, 1, "masked"),
    ((5, 3), "mean", False, -100, "far"),
)

FLOAT32_RTOL, FLOAT32_ATOL = 1e-4, 1e-5


def check_fused_values(student: Any, *, cases: Sequence[Case] = VALUE_CASES, seed: int | None = 0) -> None:
    """Values and gradients of fused_cross_entropy against F.cross_entropy (classes last) on
    every case, on the CPU and CUDA; gradcheck; the meta device; then float32 (the output
    stays float32, values and gradients close)."""
    __tracebackhide__ = True
    spec = FunctionSpec(name=NAME, reference=_reference, cases=_cases(cases), hint=_hint)
    loss = _loss_of(student)
    check_function(loss, spec, seed=seed)
    _check_float32(loss, cases, seed)
    note("cases: " + "; ".join(_describe_case(c) for c in cases) + ".")


def _check_float32(loss: Any, cases: Sequence[Case], seed: int | None) -> None:
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    normal = [c for c in cases if c[4] == "normal"] or [(tuple(cases[0][0]), *cases[0][1:4], "normal")]
    logits, target, options = _draw(normal[0], generator)
    weights = torch.randn(reference(logits, target, None, options["reduction"]).shape, generator=generator,
                          dtype=torch.float64)
    for device in devices.available():
        x = logits.float().to(device).requires_grad_()
        args = (x, target.to(device), options)
        shown = [f"logits = {show(x)} (float32)", f"target = {show(target)}",
                 f"options = {_show_options(options)}"]
        with quiet():
            found = probe.run(loss, args, [[weights.float().to(device)]])
        if found.error is not None:
            fail(f"{NAME} on float32 logits raised {found.error.type} in {found.error.stage}: "
                 f"{found.error.message.strip().splitlines()[0] if found.error.message.strip() else ''}", *shown)
        out = found.outputs[0] if found.outputs else None
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
            fail(f"{NAME} on float32 logits returns {getattr(out, 'dtype', type(out).__name__)}, not float32.",
                 *shown,
                 cause="keep the logits' dtype: no `.double()`, no tensor created with a fixed dtype "
                 "(`torch.ones(n)` is float32, `torch.tensor(0.0, dtype=torch.float64)` float64); build them from the "
                 "inputs (`torch.ones_like(...)`, `x.new_zeros(...)`, `.to(logits.dtype)`).")
        x64 = x.detach().cpu().double().requires_grad_()
        want = _reference(x64, target, options)
        (want_grad,) = torch.autograd.grad(want, x64, weights)
        grad = found.grads[0][0] if found.grads and found.grads[0] else None
        for label, got, expected in (("the loss", out, want), ("the gradient for `logits`", grad, want_grad)):
            ok = isinstance(got, torch.Tensor) and got.shape == expected.shape and bool(torch.allclose(
                got.detach().cpu().double(), expected.detach(), rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL))
            if not ok:
                fail(f"{NAME} on float32 logits: {label} differs from F.cross_entropy in float64 by more than float32 "
                     f"rounding (rtol {FLOAT32_RTOL:g}).", *shown, f"expected {show(expected)}",
                     f"actual   {show(got)}",
                     cause="compute in the logits' dtype with stable formulas (log-sum-exp with the row max taken "
                     "out).")
    passed(f"{NAME} on float32 logits: a float32 loss and gradient, within float32 rounding of the float64 reference.")


def _show_options(options: dict) -> str:
    weight = options.get("weight")
    shown = "None" if weight is None else show(weight)
    return f"weight={shown}, reduction={options['reduction']!r}, ignore_index={options['ignore_index']}"


# --- Double backward -------------------------------------------------------------------------

DOUBLE_CASES: tuple[Case, ...] = (
    ((4, 5), "mean", True, -100, "normal"),
    ((2, 3, 4), "none", False, None, "normal"),
)

SECOND_ORDER_CAUSE = (
    "In a cross-entropy this usually means a row statistic kept from forward (the log-sum-exp, the max, the "
    "probabilities) that autograd sees as a constant: exp(logits − lse) with a saved lse has only part of the "
    "softmax's derivative (p·u, without − p·(p·u)). Recompute softmax from the saved logits with torch.softmax, "
    "or return lse as an output of the Function, or make backward a Function of its own with a backward of its own."
)


@contextlib.contextmanager
def _more_cause(when: str, extra: str) -> Iterator[None]:
    """Re-raise a CheckFailed whose message contains `when` with `extra` appended."""
    try:
        yield
    except CheckFailed as failed:
        message = str(failed)
        if when not in message:
            raise
        raise CheckFailed(f"{message}\n  {extra}") from None


def check_fused_double_backward(student: Any, *, cases: Sequence[Case] = DOUBLE_CASES, seed: int | None = 0) -> None:
    """Second-order gradients of fused_cross_entropy (with respect to the logits and to
    grad_output) against F.cross_entropy's, and gradgradcheck (float64)."""
    __tracebackhide__ = True
    spec = FunctionSpec(name=NAME, reference=_reference, cases=_cases(cases), hint=_hint, double_backward=True)
    with _more_cause("double backward is wrong", SECOND_ORDER_CAUSE):
        check_function(_loss_of(student), spec, seed=seed)
    note("cases: " + "; ".join(_describe_case(c) for c in cases) + ".")


# --- Bytes saved for backward ----------------------------------------------------------------
# What may be kept: the inputs themselves (logits, target, weight: saving an input allocates
# nothing, it keeps the caller's tensor), views of them, the output, and intermediates of at
# most 4 numbers per row plus 4, 8 bytes each (the log-sum-exp, the row max, a mask, the
# total weight...). Not an intermediate the size of the logits (probabilities, exp(x - max),
# log-probabilities, a one-hot matrix, a copy of the logits): the composite's N × C.

MEMORY_CASES: tuple[Case, ...] = (
    ((6, 10), "mean", True, -100, "normal"),
    ((3, 4, 10), "none", False, None, "normal"),
)
PER_ROW, SCALARS, BYTES_PER_NUMBER = 4, 4, 8
MEMORY_NAMES = ("logits", "target", "weight", "reduction", "ignore_index")


def _rows(r: Recording) -> int:
    return max(1, r.args[1].numel())


def allowance(rows: int) -> int:
    """Bytes of intermediates the op may keep for backward: 4 numbers per row and 4 more, 8
    bytes each."""
    return (PER_ROW * rows + SCALARS) * BYTES_PER_NUMBER


def _memory_needed(r: Recording, needs: tuple) -> str:
    return (f"the inputs themselves (logits, target, weight) and, if you like, a few numbers per row "
            f"(at most {allowance(_rows(r))} bytes of new tensors for {_rows(r)} rows)")


def _memory_limit(r: Recording, needs: tuple) -> int:
    free = sum(s.nbytes for s in r.saved if s.kind != "intermediate")
    return free + allowance(_rows(r))


def _memory_unneeded(s: Saved, r: Recording, needs: tuple) -> str | None:
    if s.kind != "intermediate":
        return None
    logits = r.args[0]
    classes = logits.shape[-1] if logits.dim() else 1
    if s.tensor.numel() >= logits.numel() and classes > PER_ROW:
        return (f"a new tensor as large as the logits ({logits.numel()} numbers) lives until backward: that is the "
                "N × C matrix the composite keeps, and what this op is built to avoid. Backward can recompute it "
                "from the logits, which you may save for free (saving an input allocates nothing), with one more "
                "pass over them.")
    return None


MEMORY_BUDGET = Budget(
    name=NAME,
    needed=_memory_needed,
    limit=_memory_limit,
    unneeded=_memory_unneeded,
    names=Names(args=MEMORY_NAMES, known={
        "softmax(logits)": lambda x, *rest: torch.softmax(x, -1),
        "log_softmax(logits)": lambda x, *rest: torch.log_softmax(x, -1),
        "exp(logits - max)": lambda x, *rest: torch.exp(x - x.amax(-1, keepdim=True)),
        "logits - max": lambda x, *rest: x - x.amax(-1, keepdim=True),
        "a copy of logits": lambda x, *rest: x.clone(),
        "the log-sum-exp of each row": lambda x, *rest: torch.logsumexp(x, -1),
        "the max of each row": lambda x, *rest: x.amax(-1),
    }),
)


def check_fused_memory(student: Any, *, cases: Sequence[Case] = MEMORY_CASES, seed: int | None = 0) -> None:
    """What fused_cross_entropy keeps for backward, measured with saved-tensor hooks: the
    inputs (free), the output, and new tensors of at most 4 numbers per row plus 4 (8 bytes
    each); nothing stashed on ctx; backward leaves saved tensors and grad_output alone."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    kept = []
    for case in cases:
        logits, target, options = _draw(case, generator)
        for device in devices.available():
            weight = options["weight"]
            args = (logits.to(device).requires_grad_(), target.to(device),
                    None if weight is None else weight.to(device), options["reduction"], options["ignore_index"])
            recording = judge_budget(student, MEMORY_BUDGET, args)
        new = sum(s.nbytes for s in recording.saved if s.kind == "intermediate")
        kept.append(f"logits {tuple(logits.shape)}: {new} new bytes (allowed {allowance(target.numel() or 1)}; "
                    f"the logits are {logits.numel() * logits.element_size()})")
    passed(f"{NAME} keeps for backward only its inputs and O(rows) new numbers: " + "; ".join(kept) +
           ". Nothing on ctx.")
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


# --- vmap: per-sample gradients ----------------------------------------------------------------
# A case: (shape of one sample's logits, reduction, weighted, ignore_index or None, in_dims of
# (logits, target) per vmap level (outermost first), batch size per level).

VmapSpec = tuple[Sequence[int], str, bool, "int | None", Sequence[Sequence["int | None"]], Sequence[int]]

VMAP_CASES: tuple[VmapSpec, ...] = (
    ((4, 5), "mean", False, None, [(0, 0)], [3]),
    ((3, 4), "sum", True, -100, [(1, 1)], [2]),
    ((4, 5), "mean", True, None, [(None, 0)], [3]),
)


def _vmap_case(spec: VmapSpec, generator: torch.Generator) -> VmapCase:
    shape, reduction, weighted, ignore, levels, sizes = spec
    shape = tuple(shape)
    levels = [tuple(dims) for dims in levels]
    options = _options(shape[-1], reduction, weighted, ignore, generator)
    for _ in range(100):  # every sample keeps a row that is not ignored (a 'mean' of nothing is nan)
        logits = 2 * batched(torch.empty(shape, dtype=torch.float64), [d[0] for d in levels], sizes, generator)
        sample_target = torch.empty(shape[:-1], dtype=torch.float64)
        target = batched(sample_target, [d[1] for d in levels], sizes, generator)
        target = torch.randint(shape[-1], target.shape, generator=generator)
        if ignore is not None:
            drop = torch.rand(target.shape, generator=generator) < 1 / 3
            drop.view(-1)[-1] = True  # some row is ignored in every draw
            target[drop] = ignore
        case = VmapCase((logits, target, options), tuple((d[0], d[1], None) for d in levels))
        if not any(bool(torch.isnan(o).any()) for o in loop(_reference, case.args, case.levels)):
            return case
    raise ValueError(f"could not draw targets for {spec!r}")


def _vmap_hint(case: VmapCase, actual: torch.Tensor | None, expected: torch.Tensor | None) -> str | None:
    """Why vmap's numbers differ from the loop (None for an error: _with_causes names those)."""
    if actual is None and expected is None:
        return None
    options = case.args[2]
    dims = [tuple(d[:2]) for d in case.levels]
    causes = []
    if options["reduction"] == "mean":
        causes.append("each sample is a call of its own: its 'mean' divides by the weight of its own rows, not of "
                      "the whole batch")
    if any(d != (0, 0) for d in dims):
        causes.append(f"with in_dims {' then '.join(map(str, dims))} the batch is not at dim 0 of both inputs, or "
                      "one input has none: a hand-written vmap rule must move each batch dim to one place "
                      "(`movedim`), expand an unbatched input, and return the right out_dims "
                      "(generate_vmap_rule = True does all that)")
    return ("; ".join(causes) + ".") if causes else None


VALUE_READ = (
    "vmap and torch.compile cannot run code that reads a tensor's value in Python: `.item()`, `float(t)`, `if t:`, "
    "or a function that does so inside, such as F.one_hot (it checks its targets against the number of classes). "
    "Keep values in tensors: `torch.where` instead of `if`, and a one-hot from `scatter` or a comparison with "
    "`torch.arange`."
)
JVP_CAUSE = "a Function that defines jvp does not compile into one graph in torch 2.13 (notebook 10): delete jvp."
ERROR_CAUSES = (  # (words of an error message, lower case) -> likely cause
    (("calling .item()", "data-dependent", "data dependent", "unbacked"), VALUE_READ),
    (("unsupported custom jvp",), JVP_CAUSE),
)


@contextlib.contextmanager
def _with_causes() -> Iterator[None]:
    """Re-raise a CheckFailed that names no likely cause with one, when its error is known."""
    try:
        yield
    except CheckFailed as failed:
        message = str(failed)
        lowered = message.lower()
        cause = next((c for words, c in ERROR_CAUSES if any(w in lowered for w in words)), None)
        if cause is None or "\nLikely cause:" in message:
            raise
        raise CheckFailed(f"{message}\nLikely cause: {cause}") from None


def check_fused_vmap(student: Any, *, cases: Sequence[VmapSpec] = VMAP_CASES, seed: int | None = 0) -> None:
    """fused_cross_entropy under torch.func.vmap (in_dims with None and non-zero dims, nested
    levels): outputs, per-sample gradients vmap(grad(...)) and gradients through vmap,
    against loops over the batch with F.cross_entropy."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    drawn = [_vmap_case(spec, generator) for spec in cases]
    loss = _loss_of(student)
    with _with_causes():
        check_vmap(loss, NAME, _reference, drawn, ARG_NAMES, generator, per_sample=False, hint=_vmap_hint)
        for case in drawn:
            if len(case.levels) == 1:
                _check_per_sample(loss, case, generator)
    described = "; ".join(
        f"{spec[1]!r}{', weighted' if spec[2] else ''}, in_dims {' then '.join(str(tuple(d)) for d in spec[4])}"
        for spec in cases)
    passed(f"{NAME} under vmap ({described}): outputs, per-sample gradients and gradients through vmap agree "
           "with a loop over the batch.")


def _check_per_sample(loss: Any, case: VmapCase, generator: torch.Generator) -> None:
    """Per-sample gradients vmap(grad(...)) for the logits, the targets vmapped with them
    (modern_api's own per-sample probe vmaps only floating-point arguments)."""
    __tracebackhide__ = True
    args, dims = case.args, case.levels[0]
    call = _describe_vmap(NAME, case)
    shown = [f"{n} = {show(a)}" for n, a in zip(ARG_NAMES, args)]
    weights = [_like(e, generator) for e in loop(_reference, args, case.levels)]
    with quiet():
        found = probe.invoke(student_side.per_sample_grads, loss, tuple(args), list(dims), weights)
    if not isinstance(found, dict):
        raise probe.Malformed("malformed per-sample gradients")
    error = _error_of(found.get("error"))
    if error is not None:
        _fail_error(f"per-sample gradients, vmap(grad(...)) over {call}", error, shown, {},
                    hint=_vmap_hint(case, None, None))
    grads = _tensor_list(found.get("grads"), "per-sample gradients")
    batch = _batch_size(args, dims)
    per = [_reference_grads(_reference, _sample(args, dims, b), [w[b] for w in weights]) for b in range(batch)]
    if len(grads) != 1:
        raise probe.Malformed("malformed per-sample gradients")
    want = torch.stack([p[0] for p in per])
    _compare(f"{call}: per-sample gradients (vmap of grad) for `logits` differ from a loop", grads[0], want, shown,
             _vmap_hint(case, grads[0], want))


# --- torch.compile -----------------------------------------------------------------------------

COMPILE_CASES: tuple[Case, ...] = (((4, 5), "mean", True, -100, "normal"),)

def check_fused_compile(student: Any, *, cases: Sequence[Case] = COMPILE_CASES, seed: int | None = 0) -> None:
    """fused_cross_entropy under torch.compile(backend="aot_eager", fullgraph=True): the loss
    and the gradient for the logits equal F.cross_entropy's."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    drawn = _cases(cases)(generator)
    with _with_causes():
        check_compile(_loss_of(student), NAME, _reference, drawn, ARG_NAMES, generator, backend="aot_eager",
                      fullgraph=True, facts={})
    passed(f"{NAME} under torch.compile(backend='aot_eager', fullgraph=True): one graph; the loss and the gradient "
           f"agree with F.cross_entropy ({'; '.join(_describe_case(c) for c in cases)}).")


# --- Exercise 11.2: true or false? ----------------------------------------------------------------

CLAIM_CHOICES = ("true", "false")
CLAIM_QUESTIONS = "abcdef"
