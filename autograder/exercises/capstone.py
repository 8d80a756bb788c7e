"""Checks for the capstone: a fused softmax-cross-entropy, built end to end (part A, notebook
11_capstone), and a chunked Linear + cross-entropy that never holds the whole logits (part B,
notebook 11_capstone_extension).

Part A's answer is a function `fused_cross_entropy(logits, target, weight=None,
reduction="mean", ignore_index=-100)` with `F.cross_entropy`'s meaning, the classes on the
last dim of `logits` (shape (..., C), target (...)). How it is built is the student's choice;
the checks grade what it does, one property per check:

- :func:`check_fused_values` — values and gradients against `F.cross_entropy` (every
  reduction, class weights, ignored rows, -inf logits, a target scored 800 below the rest),
  gradcheck, the meta device, CPU and CUDA, then float32;
- :func:`check_fused_double_backward` — second-order gradients and gradgradcheck;
- :func:`check_fused_memory` — what it saves for backward (saved-tensor hooks) and what
  stays alive after forward and after backward (wherever it is kept), against a budget;
- :func:`check_fused_vmap` — `torch.func.vmap`, per-sample gradients `vmap(grad(...))` and
  gradients through vmap, against loops;
- :func:`check_fused_compile` — `torch.compile(backend="aot_eager", fullgraph=True)`.

Part B's answer is `fused_linear_cross_entropy(hidden, weight, target, reduction="mean",
ignore_index=-100, chunk_size=...)`, equal to `F.cross_entropy(hidden @ weight.T, target,
...)` for hidden (N, D), weight (V, D), target (N,), holding at most `chunk_size` rows of
logits at a time:

- :func:`check_linear_values` — values and gradients for hidden and weight (partial and
  whole chunks, a chunk of ignored rows, one row, no rows), gradcheck, meta, float32;
- :func:`check_linear_memory` — what it saves, keeps and leaves behind, and its peak memory
  in forward and in backward, against a budget that the whole logits exceed.

Every draw holds special inputs: logits at ±1000 (rows shifted, or a hidden entry of
1000), and every other case reaches the student's code not contiguous. The class weights
are not differentiated (nor are they by `F.cross_entropy`): the student's function is
probed as `loss(logits, target, options)` (part A) or `loss(hidden, weight, target,
options)` (part B), the settings inside the plain dict `options`
(:mod:`autograder.student.capstone`). The transform and compile checks are those of
notebook 10 (:mod:`autograder.exercises.modern_api`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..checks import explain, inputs
from ..checks.functions import FunctionSpec, check_function
from ..student import capstone as student_side
from ..student import devices, probe
from ..student.report import CheckFailed, fail, note, passed, quiet, show, value
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
LARGE = 1000.0  # rows shifted by ±1000: e^1000 overflows, e^-1000 underflows


# --- The references ---------------------------------------------------------------------------

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


def linear_reference(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, reduction: str = "mean",
                     ignore_index: int = -100) -> torch.Tensor:
    """F.cross_entropy of the whole logits hidden @ weight.T: what part B computes in chunks."""
    return F.cross_entropy(hidden @ weight.T, target, reduction=reduction, ignore_index=ignore_index)


def _linear_reference(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, options: dict) -> torch.Tensor:
    return linear_reference(hidden, weight, target, options["reduction"], options["ignore_index"])


class _WithOptions(probe.StudentProxy):
    """A student's function in another process, probed through one of the adapters of
    :mod:`autograder.student.capstone`."""

    def __init__(self, student: Any, adapter: str) -> None:
        self.student, self.adapter = student, adapter

    def invoke(self, procedure: str, *args: Any) -> Any:
        return probe.invoke(student_side.with_options, self.student, self.adapter, procedure, *args)


def _probed(student: Any, adapter: str) -> Any:
    """The student's function as the adapter sees it: built here when it is a local object
    (the student's kernel: torch's own gradcheck then runs on it), reached through the
    student's process otherwise."""
    if isinstance(student, probe.StudentProxy):
        return _WithOptions(student, adapter)
    return student_side.ADAPTERS[adapter](student)


def _loss_of(student: Any) -> Any:
    return _probed(student, "cross_entropy")


# --- Inputs -----------------------------------------------------------------------------------
# A case: (shape of logits (..., C), reduction, weighted, ignore_index or None, kind of logits).
# ignore_index None: no row is ignored (the default -100 is passed). Otherwise rows are
# ignored (about a third, never the first, always the last), and ignore_index may be a real
# class. Kinds: "normal" 2·N(0, 1); "large" the same shifted by +1000 and -1000 on alternate
# rows; "far" the target of some rows (the first among them) scored 800 below the others;
# "masked" about a third of each row's other classes at -inf. Whatever the kind, the first
# row is shifted by +1000 and the second by -1000: large logits are in every draw. Every
# other case of a check reaches the student's code not contiguous.

Case = tuple[Sequence[int], str, bool, "int | None", str]


def _targets(shape: Sequence[int], classes: int, ignore: int | None, generator: torch.Generator) -> torch.Tensor:
    target = torch.randint(classes, tuple(shape), generator=generator)
    if ignore is None:
        return target
    flat = target.view(-1)
    if flat.numel() and 0 <= ignore < classes and int(flat[0]) == ignore:  # the first row is never ignored
        flat[0] = (ignore + 1) % classes
    if flat.numel() >= 2:
        drop = torch.rand(flat.numel(), generator=generator) < 1 / 3
        drop[0], drop[-1] = False, True
        flat[drop] = ignore
    return target


def _shift_rows(rows: torch.Tensor, every: bool) -> None:
    """Rows at +1000 and -1000 alternately: all of them (`every`), or the first two."""
    n = rows.shape[0] if every else min(2, rows.shape[0])
    rows[:n] += LARGE * (1 - 2 * (torch.arange(n, dtype=rows.dtype) % 2)).unsqueeze(-1)


def _logits(shape: Sequence[int], target: torch.Tensor, kind: str, ignore: int | None,
            generator: torch.Generator) -> torch.Tensor:
    logits = 2 * inputs.normal(shape, generator)
    classes = shape[-1]
    rows = logits.view(-1, classes)
    picked = target.reshape(-1).clamp(0, classes - 1)
    if kind == "far" and rows.shape[0]:
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
    _shift_rows(rows, every=kind == "large")
    return logits


def _options(classes: int, reduction: str, weighted: bool, ignore: int | None,
             generator: torch.Generator) -> dict:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, not {reduction!r}")
    weight = 0.2 + 1.8 * torch.rand(classes, generator=generator, dtype=torch.float64) if weighted else None
    return {"weight": weight, "reduction": reduction, "ignore_index": -100 if ignore is None else int(ignore)}


def _draw(case: Case, generator: torch.Generator, strided: bool = False) -> tuple[torch.Tensor, torch.Tensor, dict]:
    shape, reduction, weighted, ignore, kind = case
    shape = tuple(shape)
    if not shape or (ignore is not None and shape[-1] == 1 and ignore == 0):
        raise ValueError(f"bad case {case!r}: logits need a class dim, and a row that is not ignored")
    target = _targets(shape[:-1], shape[-1], ignore, generator)
    logits = _logits(shape, target, kind, ignore, generator)
    return logits, target, {**_options(shape[-1], reduction, weighted, ignore, generator), "strided": strided}


def _strided(i: int, numel: int) -> bool:
    """Every other case is laid out not contiguous (a single number always is contiguous)."""
    return i % 2 == 1 and numel > 1


def _cases(specs: Sequence[Case]) -> Callable[[torch.Generator], list[tuple]]:
    def cases(generator: torch.Generator) -> list[tuple]:
        return [_draw(case, generator, _strided(i, _numel(case[0]))) for i, case in enumerate(specs)]

    return cases


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _describe_case(case: Case, i: int = 0) -> str:
    shape, reduction, weighted, ignore, kind = case
    parts = [f"logits {tuple(shape)}", repr(reduction)]
    if weighted:
        parts.append("weighted")
    if ignore is not None:
        parts.append(f"ignore_index={ignore}")
    if kind != "normal":
        parts.append({"large": "every row at ±1000", "far": "a target 800 below the rest",
                      "masked": "-inf logits"}[kind])
    if _strided(i, _numel(shape)):
        parts.append("not contiguous")
    return ", ".join(parts)


def _described(cases: Sequence[Case]) -> str:
    return "; ".join(_describe_case(c, i) for i, c in enumerate(cases))


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


# --- float32: the output keeps the input's dtype ------------------------------------------------

FLOAT32_RTOL = 1e-4
FLOAT32_ROUNDING = 1e-5  # float32 rounds a logit of size M by about 6e-8·M: this much, relative, per unit of M


def _magnitude(tensors: Sequence[torch.Tensor]) -> float:
    """The largest finite value among `tensors` (the logits' scale sets float32's rounding)."""
    finite = [t[torch.isfinite(t)].abs() for t in tensors if t.numel()]
    return max((float(f.max()) for f in finite if f.numel()), default=0.0)


def _close32(got: Any, want: torch.Tensor, scale: float) -> bool:
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return False
    atol = FLOAT32_ROUNDING * (1 + scale) * max(_magnitude([want]), 1e-3)
    return bool(torch.allclose(got.detach().cpu().double(), want.detach(), rtol=FLOAT32_RTOL, atol=atol,
                               equal_nan=True))


def _check_float32(loss: Any, name: str, reference: Callable[..., Any], drawn: Sequence[tuple],
                   arg_names: Sequence[str], scale: Callable[[tuple], float]) -> None:
    """Every drawn case again with float32 tensors, on every device: the output is float32,
    and the output and the gradients are within float32 rounding of the reference computed
    in float64 on the same (float32) values. `scale(args)`: the size of the logits."""
    __tracebackhide__ = True
    generator = inputs.generator(0)
    for args in drawn:
        rounded = tuple(a.float().double() if probe.differentiable(a) else a for a in args)
        exact = tuple(a.clone().requires_grad_() if probe.differentiable(a) else a for a in rounded)
        want = reference(*exact)
        weights = torch.randn(want.shape, generator=generator, dtype=torch.float64)
        slots = [i for i, a in enumerate(exact) if probe.differentiable(a)]
        want_grads = torch.autograd.grad(want, [exact[i] for i in slots], weights, allow_unused=True)
        for device in devices.available():
            args32 = tuple(a.float() if probe.differentiable(a) else a for a in rounded)
            args32 = tuple(a.to(device).requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
                           for a in args32)
            shown = [f"{n} = {show(a)}" for n, a in zip(arg_names, args32)]
            with quiet():
                (found,) = probe.run_many(loss, [probe.Run(args32, [[weights.float().to(device)]], dtypes=True)])
            if found.error is not None:
                message = found.error.message.strip()
                fail(f"{name} on float32 inputs raised {found.error.type} in {found.error.stage}: "
                     f"{message.splitlines()[0] if message else ''}", *shown)
            out = found.outputs[0] if found.outputs else None
            if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
                fail(f"{name} on float32 inputs returns {getattr(out, 'dtype', type(out).__name__)}, not float32.",
                     *shown,
                     cause="keep the inputs' dtype: no `.double()`, no tensor created with a fixed dtype "
                     "(`torch.ones(n)` is float32, `torch.tensor(0.0, dtype=torch.float64)` float64); build them from "
                     "the inputs (`torch.ones_like(...)`, `x.new_zeros(...)`, `.to(logits.dtype)`).")
            if found.widened:
                fail(f"{name} on float32 inputs computes in float64: {found.widened} (as your process reports it).",
                     *shown, cause="keep the inputs' dtype in every step, forward and backward: a float64 tensor in "
                     "between doubles the memory the capstone bounds, and autograd's engine casts a gradient computed "
                     "in float64 back to float32 without a word. No `.double()`, no constant made in float64.")
            grads = found.grads[0] if found.grads else []
            size = scale(rounded)
            for label, got, expected in [("the loss", out, want.detach()), *(
                    (f"the gradient for `{arg_names[i]}`", g, torch.zeros_like(exact[i]) if w is None else w)
                    for i, g, w in zip(slots, grads, want_grads))]:
                if not _close32(torch.zeros_like(expected) if got is None else got, expected, size):
                    fail(f"{name} on float32 inputs: {label} differs from the float64 reference by more than float32 "
                         f"rounding (rtol {FLOAT32_RTOL:g}, logits up to {value(size)}).", *shown,
                         *(explain.differ(expected.detach(), got.detach().cpu().double())
                           if isinstance(got, torch.Tensor) and got.shape == expected.shape
                           else [f"expected {show(expected)}", f"actual   {show(got)}"]),
                         cause="compute in the inputs' dtype with stable formulas (log-sum-exp with the row max taken "
                         "out); in float32, e^x overflows already at x = 89.")
    passed(f"{name} on float32 inputs ({len(drawn)} case(s)): a float32 output, no float64 step (as your process "
           "reports it), and values and gradients within float32 rounding of the float64 reference.")


def _logits_scale(args: tuple) -> float:
    return _magnitude([args[0]])


# --- Part A · values and gradients ------------------------------------------------------------

VALUE_CASES: tuple[Case, ...] = (  # every other one not contiguous: the 3-d logits among them
    ((4, 5), "mean", True, -100, "normal"),
    ((2, 3, 4), "none", True, 1, "masked"),
    ((3, 4), "sum", False, None, "large"),
    ((5, 3), "mean", False, -100, "far"),
    ((0, 4), "sum", True, None, "normal"),
    ((1, 6), "none", True, None, "normal"),
)


def check_fused_values(student: Any, *, cases: Sequence[Case] = VALUE_CASES, seed: int | None = 0) -> None:
    """Values and gradients of fused_cross_entropy against F.cross_entropy (classes last) on
    every case, on the CPU and CUDA; gradcheck; the meta device; then every case again in
    float32 (the output stays float32, values and gradients close)."""
    __tracebackhide__ = True
    # float32 on every case (check_function's own float32 run takes the first only).
    spec = FunctionSpec(name=NAME, reference=_reference, cases=_cases(cases), hint=_hint, keeps_dtype=False)
    loss = _loss_of(student)
    check_function(loss, spec, seed=seed)
    _check_float32(loss, NAME, _reference, _cases(cases)(inputs.generator(seed)), ARG_NAMES, _logits_scale)
    note(f"cases: {_described(cases)}.")


# --- Part A · double backward -----------------------------------------------------------------

DOUBLE_CASES: tuple[Case, ...] = (
    ((4, 5), "mean", True, -100, "normal"),
    ((2, 3, 4), "none", False, None, "normal"),
    ((1, 3), "sum", True, None, "far"),
)

SECOND_ORDER_CAUSE = (
    "In a cross-entropy this usually means a row statistic kept from forward (the log-sum-exp, the max, the "
    "probabilities) that autograd sees as a constant: exp(logits − lse) with a saved lse has only part of the "
    "softmax's derivative (p·u, without − p·(p·u)). Recompute softmax from the saved logits with torch operations, "
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
    note(f"cases: {_described(cases)}.")


# --- Memory: what is saved, kept and left behind ------------------------------------------------
# Saving an input allocates nothing: it keeps the caller's tensor. New tensors are what a
# budget counts: those saved for backward (saved-tensor hooks: judge_budget), and every new
# memory block still alive when forward returns, wherever the answer keeps it (on ctx, in
# a global, a class attribute, a closure: student_side.memory_run). Once backward has run
# and the caller drops the loss and the gradients, nothing the call made may stay alive,
# and no input may still be referenced.

PER_ROW, SCALARS, BYTES_PER_NUMBER = 4, 4, 8


def allowance(rows: int) -> int:
    """Bytes of new tensors an op may keep for backward: 4 numbers per row and 4 more, 8
    bytes each."""
    return (PER_ROW * rows + SCALARS) * BYTES_PER_NUMBER


def _memory_run(student: Any, name: str, args: tuple, expected: torch.Tensor, generator: torch.Generator) -> dict:
    """student_side.memory_run on `args`, with a random grad_output shaped like `expected`
    (the reference's output); fails on an error, returns the plain-data report."""
    __tracebackhide__ = True
    with quiet():
        found = probe.invoke(student_side.memory_run, student, args, [_like(expected, generator)])
    if not isinstance(found, dict):
        raise probe.Malformed("malformed memory report")
    error = _error_of(found.get("error"))
    if error is not None:
        fail(f"{name} raised {error.type} in {error.stage} while its memory was measured: "
             f"{error.message.strip().splitlines()[0] if error.message.strip() else ''}")
    if not all(isinstance(found.get(k), int) for k in ("forward_peak", "kept", "backward_peak", "left")) or \
            not isinstance(found.get("inputs_alive"), list):
        raise probe.Malformed("malformed memory report")
    return found


def _judge_kept(name: str, found: dict, limit: int, shown: list[str], arg_names: Sequence[str],
                what: str) -> None:
    """Fail if more new memory than `limit` is alive after forward, anything the call made is
    alive after backward, or an input is still referenced."""
    __tracebackhide__ = True
    if found["kept"] > limit:
        fail(f"{name}: {found['kept']} bytes of new tensors are alive after forward (until backward), more than its "
             f"budget of {limit}: {what}.", *shown,
             cause="something as large as the logits (or a chunk's worth of them, kept for every chunk) outlives "
             "forward. Tensors hidden from save_for_backward count too: on ctx, in a global or class attribute, in "
             "a closure. Keep inputs and a few numbers per row, and recompute the rest in backward.")
    if found["left"] > 0:
        fail(f"{name}: {found['left']} bytes of tensors it made are still alive after backward, once the caller has "
             "dropped the loss and the gradients.", *shown,
             cause="a global, a class attribute or a closure still holds a tensor of the last call: memory that is "
             "never given back, and a value a later call may read by mistake. Keep what backward needs on ctx "
             "(save_for_backward), nowhere else.")
    alive = [arg_names[i] if i < len(arg_names) else f"argument {i}" for i in found["inputs_alive"]
             if isinstance(i, int)]
    if alive:
        fail(f"{name}: the input `{alive[0]}` is still referenced after backward, once the caller has dropped the "
             "loss and the gradients.", *shown,
             cause="a global, a class attribute or a closure keeps a reference to an input: its memory is never "
             "given back (saving an input is free only while autograd holds it, until backward). Keep what backward "
             "needs with save_for_backward, nowhere else.")


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


def _rows(r: Recording) -> int:
    return max(1, r.args[1].numel())


MEMORY_BUDGET = Budget(
    name=NAME,
    needed=lambda r, needs: (f"the inputs themselves (logits, target, weight) and, if you like, a few numbers per row "
                             f"(at most {allowance(_rows(r))} bytes of new tensors for {_rows(r)} rows)"),
    limit=lambda r, needs: sum(s.nbytes for s in r.saved if s.kind != "intermediate") + allowance(_rows(r)),
    unneeded=_memory_unneeded,
    names=Names(args=("logits", "target", "weight", "reduction", "ignore_index"), known={
        "softmax(logits)": lambda x, *rest: torch.softmax(x, -1),
        "log_softmax(logits)": lambda x, *rest: torch.log_softmax(x, -1),
        "exp(logits - max)": lambda x, *rest: torch.exp(x - x.amax(-1, keepdim=True)),
        "logits - max": lambda x, *rest: x - x.amax(-1, keepdim=True),
        "a copy of logits": lambda x, *rest: x.clone(),
        "the log-sum-exp of each row": lambda x, *rest: torch.logsumexp(x, -1),
        "the max of each row": lambda x, *rest: x.amax(-1),
    }),
)

MEMORY_CASES: tuple[Case, ...] = (
    ((6, 10), "mean", True, -100, "normal"),
    ((3, 4, 10), "none", False, None, "normal"),
)


def check_fused_memory(student: Any, *, cases: Sequence[Case] = MEMORY_CASES, seed: int | None = 0) -> None:
    """What fused_cross_entropy keeps: saved for backward (saved-tensor hooks), the inputs
    (free), the output, and new tensors of at most 4 numbers per row plus 4 (8 bytes each);
    nothing stashed on ctx; backward leaves saved tensors and grad_output alone. Then, by
    the memory blocks alive: no more new memory than that after forward wherever it is
    kept, none after backward, no input still referenced."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    kept = []
    for case in cases:
        logits, target, options = _draw(case, generator)
        rows = max(1, target.numel())
        for device in devices.available():
            weight = options["weight"]
            args = (logits.to(device).requires_grad_(), target.to(device),
                    None if weight is None else weight.to(device), options["reduction"], options["ignore_index"])
            recording = judge_budget(student, MEMORY_BUDGET, args)
            found = _memory_run(student, NAME, args, reference(*args).detach(), generator)
            output = recording.outputs[0].numel() * recording.outputs[0].element_size() if recording.outputs else 0
            shown = [f"logits of shape {tuple(logits.shape)} ({logits.numel() * logits.element_size()} bytes), "
                     f"{_describe_case(case)}"]
            _judge_kept(NAME, found, output + allowance(rows), shown, MEMORY_BUDGET.names.args,
                        f"the output ({output} bytes) and a few numbers per row ({allowance(rows)} bytes)")
        new = sum(s.nbytes for s in recording.saved if s.kind == "intermediate")
        kept.append(f"logits {tuple(logits.shape)}: {new} new bytes saved, {found['kept']} alive after forward with "
                    f"the output (allowed {output + allowance(rows)}; the logits are "
                    f"{logits.numel() * logits.element_size()})")
    passed(f"{NAME} keeps for backward only its inputs and O(rows) new numbers: " + "; ".join(kept) +
           ". Nothing on ctx, nothing left after backward.")
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


# --- Part A · vmap: per-sample gradients --------------------------------------------------------
# A case: (shape of one sample's logits, reduction, weighted, ignore_index or None, in_dims of
# (logits, target) per vmap level (outermost first), batch size per level). The first row of
# the first sample is at +1000.

VmapSpec = tuple[Sequence[int], str, bool, "int | None", Sequence[Sequence["int | None"]], Sequence[int]]

VMAP_CASES: tuple[VmapSpec, ...] = (
    ((4, 5), "mean", False, None, [(0, 0)], [3]),
    ((3, 4), "sum", True, -100, [(1, 1)], [2]),
    ((4, 5), "mean", True, None, [(None, 0)], [3]),
    ((2, 3), "none", False, None, [(0, 0)], [1]),
)


def _vmap_case(spec: VmapSpec, generator: torch.Generator) -> VmapCase:
    shape, reduction, weighted, ignore, levels, sizes = spec
    shape = tuple(shape)
    levels = [tuple(dims) for dims in levels]
    options = _options(shape[-1], reduction, weighted, ignore, generator)
    for _ in range(100):  # every sample keeps a row that is not ignored (a 'mean' of nothing is nan)
        logits = 2 * batched(torch.empty(shape, dtype=torch.float64), [d[0] for d in levels], sizes, generator)
        logits.view(-1)[: shape[-1]] += LARGE  # large logits in every draw
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
    "Keep values in tensors: `torch.where` instead of `if`."
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
    levels, a batch of one): outputs, per-sample gradients vmap(grad(...)) and gradients
    through vmap, against loops over the batch with F.cross_entropy."""
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
        f"{spec[1]!r}{', weighted' if spec[2] else ''}, in_dims {' then '.join(str(tuple(d)) for d in spec[4])}, "
        f"batch {' × '.join(map(str, spec[5]))}" for spec in cases)
    passed(f"{NAME} under vmap ({described}; a row at +1000 in each): outputs, per-sample gradients and gradients "
           "through vmap agree with a loop over the batch.")


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


# --- Part A · torch.compile -----------------------------------------------------------------------

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
           f"agree with F.cross_entropy ({_described(cases)}).")


# --- Part B · a chunked Linear + cross-entropy ----------------------------------------------------
# A case: (rows N, features D, classes V, reduction, ignore_index or None, chunk_size).
# hidden (N, D) is 2·N(0, 1) with hidden[0, 0] = 1000 in every draw (the first row's logits
# reach ±1000s); weight (V, D) is N(0, 1). With ignore_index, about a third of the rows are
# ignored (never the first, always the last), and, when there are two chunks or more, every
# row of the second chunk. Every other case reaches the student's code not contiguous.

LINEAR_NAME = "fused_linear_cross_entropy"
LINEAR_ARG_NAMES = ("hidden", "weight", "target", "options")
LINEAR_MEMORY_NAMES = ("hidden", "weight", "target", "reduction", "ignore_index", "chunk_size")

LinearCase = tuple[int, int, int, str, "int | None", int]


def _draw_linear(case: LinearCase, generator: torch.Generator, strided: bool = False) -> tuple:
    rows, features, classes, reduction, ignore, chunk = case
    if reduction not in REDUCTIONS or chunk < 1 or classes < 2 or (ignore is not None and 0 <= ignore < classes
                                                                    and classes < 2):
        raise ValueError(f"bad case {case!r}")
    target = _targets((rows,), classes, ignore, generator)
    if ignore is not None and rows >= 2 * chunk:
        target[chunk: 2 * chunk] = ignore  # a chunk of ignored rows: nothing counts in it
    hidden = inputs.including(2 * inputs.normal((rows, features), generator), [LARGE], generator)
    weight = inputs.normal((classes, features), generator)
    options = {"reduction": reduction, "ignore_index": -100 if ignore is None else int(ignore), "chunk_size": chunk,
               "strided": strided}
    return hidden, weight, target, options


def _linear_cases(specs: Sequence[LinearCase]) -> Callable[[torch.Generator], list[tuple]]:
    def cases(generator: torch.Generator) -> list[tuple]:
        return [_draw_linear(case, generator, _strided(i, 2)) for i, case in enumerate(specs)]

    return cases


def _describe_linear(case: LinearCase, i: int = 0) -> str:
    rows, features, classes, reduction, ignore, chunk = case
    parts = [f"hidden ({rows}, {features}), weight ({classes}, {features})", repr(reduction), f"chunk_size {chunk}"]
    if ignore is not None:
        parts.append(f"ignore_index={ignore}" + (" (a whole chunk ignored)" if rows >= 2 * chunk else ""))
    if _strided(i, 2):
        parts.append("not contiguous")
    return ", ".join(parts)


def _linear_hint(args: tuple, i: int, wrong: torch.Tensor) -> str | None:
    """Why a gradient of part B is wrong (args: hidden, weight, target, options)."""
    hidden, weight, target, options = args
    ignored = target == options["ignore_index"]
    if i == 0 and bool(ignored.any()) and bool(wrong[ignored].any()) and not bool(wrong[~ignored].any()):
        return (f"only rows whose target is ignore_index ({options['ignore_index']}) are wrong: they add nothing to "
                "the loss, so their gradient is 0.")
    causes = []
    if options["reduction"] == "mean":
        causes.append("'mean' divides the whole batch's sum by the number of rows that count in the whole batch: "
                      "not chunk by chunk (a mean of the chunks' means weighs a short or half-ignored chunk wrongly)")
    elif options["reduction"] == "none":
        causes.append("with 'none', grad_output has one entry per row, to be split into chunks with the rows")
    causes.append("with G = softmax(logits) − onehot(target) scaled per row, the gradient for hidden is G @ weight "
                  "and for weight the sum over the chunks of G.T @ hidden (each chunk adds its part)")
    return "; ".join(causes) + "."


LINEAR_VALUE_CASES: tuple[LinearCase, ...] = (
    (10, 3, 7, "mean", -100, 4),
    (9, 4, 6, "none", 2, 4),
    (6, 3, 5, "sum", None, 8),
    (1, 3, 5, "mean", None, 4),
    (0, 3, 5, "sum", None, 2),
)


def check_linear_values(student: Any, *, cases: Sequence[LinearCase] = LINEAR_VALUE_CASES,
                        seed: int | None = 0) -> None:
    """Values of fused_linear_cross_entropy and its gradients for hidden and weight against
    F.cross_entropy(hidden @ weight.T, ...) on every case, on the CPU and CUDA; gradcheck;
    the meta device; then every case again in float32."""
    __tracebackhide__ = True
    spec = FunctionSpec(name=LINEAR_NAME, reference=_linear_reference, cases=_linear_cases(cases), hint=_linear_hint,
                        autograd_in_backward=True, keeps_dtype=False)  # float32 below, on every case
    loss = _probed(student, "linear_cross_entropy")
    check_function(loss, spec, seed=seed)
    _check_float32(loss, LINEAR_NAME, _linear_reference, _linear_cases(cases)(inputs.generator(seed)),
                   LINEAR_ARG_NAMES, _linear_scale)
    note("cases: " + "; ".join(_describe_linear(c, i) for i, c in enumerate(cases)) + ".")


def _linear_scale(args: tuple) -> float:
    hidden, weight = args[0], args[1]
    return float((hidden.abs() @ weight.abs().T).max()) if hidden.numel() else 0.0


# --- Part B · memory ------------------------------------------------------------------------------
# Numbers count 8 bytes. Kept until backward (saved, or alive after forward): the inputs
# (free), the output, one buffer the size of each differentiable input (gradients computed
# in forward), and 4 numbers per row plus 4. At any moment of forward or of backward: the
# work of CHUNK_WORK chunks of logits (chunk_size × V numbers each), three buffers the size
# of each differentiable input (a gradient, its next value and a chunk's share, when it is
# summed out of place), and 4 numbers per row plus 4. The memory cases make the whole
# logits (N × V numbers) larger than that.

CHUNK_WORK = 4


def _sizes(args: tuple) -> tuple[int, int, int, int]:
    """(rows, features, classes, chunk_size) of a call's arguments (hidden, weight, target, ..., chunk_size)."""
    hidden, weight = args[0], args[1]
    return hidden.shape[0], hidden.shape[1], weight.shape[0], args[5]


def linear_kept(args: tuple) -> int:
    """Bytes of new tensors part B may keep until backward, the output aside."""
    rows, features, classes, _ = _sizes(args)
    return (rows * features + classes * features + PER_ROW * rows + SCALARS) * BYTES_PER_NUMBER


def linear_work(args: tuple) -> int:
    """Bytes of new tensors part B may hold at once, in forward or in backward."""
    rows, features, classes, chunk = _sizes(args)
    return (CHUNK_WORK * min(chunk, max(rows, 1)) * classes + 3 * (rows + classes) * features
            + PER_ROW * rows + SCALARS) * BYTES_PER_NUMBER


def _linear_unneeded(s: Saved, r: Recording, needs: tuple) -> str | None:
    if s.kind != "intermediate":
        return None
    rows, features, classes, chunk = _sizes(r.args)
    if s.tensor.numel() > max(rows * features, classes * features, PER_ROW * rows + SCALARS):
        return (f"a new tensor of {s.tensor.numel()} numbers is kept until backward, larger than any input "
                f"(logits, a chunk's or all of them: a chunk is {min(chunk, rows)} × {classes}). Whatever a chunk "
                "needs in backward, recompute it there from the inputs, chunk by chunk; keep a few numbers per row "
                "at most.")
    return None


LINEAR_BUDGET = Budget(
    name=LINEAR_NAME,
    needed=lambda r, needs: (f"the inputs themselves, and at most {linear_kept(r.args)} bytes of new tensors (a "
                             "buffer the size of each input, a few numbers per row)"),
    limit=lambda r, needs: sum(s.nbytes for s in r.saved if s.kind != "intermediate") + linear_kept(r.args),
    unneeded=_linear_unneeded,
    names=Names(args=LINEAR_MEMORY_NAMES, known={
        "the logits hidden @ weight.T": lambda h, w, *rest: h @ w.T,
        "softmax(hidden @ weight.T)": lambda h, w, *rest: torch.softmax(h @ w.T, -1),
        "log_softmax(hidden @ weight.T)": lambda h, w, *rest: torch.log_softmax(h @ w.T, -1),
    }),
)

LINEAR_MEMORY_CASES: tuple[LinearCase, ...] = (
    (96, 4, 128, "mean", -100, 4),
    (64, 3, 160, "none", None, 8),
)


def check_linear_memory(student: Any, *, cases: Sequence[LinearCase] = LINEAR_MEMORY_CASES,
                        seed: int | None = 0) -> None:
    """fused_linear_cross_entropy's memory, float64: what it saves for backward (saved-tensor
    hooks) and what is alive after forward (every memory block, wherever it is kept) within
    `linear_kept`; the peak of new memory in forward and in backward within `linear_work`;
    nothing left after backward, no input still referenced."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    lines = []
    for case in cases:
        hidden, weight, target, options = _draw_linear(case, generator)
        for device in devices.available():
            args = (hidden.to(device).requires_grad_(), weight.to(device).requires_grad_(), target.to(device),
                    options["reduction"], options["ignore_index"], options["chunk_size"])
            recording = judge_budget(student, LINEAR_BUDGET, args)
            found = _memory_run(student, LINEAR_NAME, args, linear_reference(*args[:5]).detach(), generator)
            rows, features, classes, chunk = _sizes(args)
            output = recording.outputs[0].numel() * BYTES_PER_NUMBER if recording.outputs else 0
            logits = rows * classes * BYTES_PER_NUMBER
            shown = [f"{_describe_linear(case)}: the whole logits are {logits} bytes, one chunk "
                     f"{chunk * classes * BYTES_PER_NUMBER}"]
            _judge_kept(LINEAR_NAME, found, output + linear_kept(args), shown, LINEAR_MEMORY_NAMES,
                        f"the output ({output} bytes), a buffer the size of each input and a few numbers per row")
            work = linear_work(args)
            for stage in ("forward", "backward"):
                if found[f"{stage}_peak"] > work:
                    fail(f"{LINEAR_NAME}: {stage} holds {found[f'{stage}_peak']} bytes of new tensors at once, more "
                         f"than its budget of {work}.", *shown,
                         f"budget: {CHUNK_WORK} chunks of logits ({CHUNK_WORK} × {chunk} × {classes} numbers), three "
                         f"buffers the size of hidden and of weight, 4 numbers per row and 4 (8 bytes each)",
                         cause=_PEAK_CAUSE[stage])
        lines.append(f"{_describe_linear(case)}: peaks {found['forward_peak']} and {found['backward_peak']} bytes "
                     f"(budget {work}; the whole logits {logits}), {found['kept']} kept after forward")
    passed(f"{LINEAR_NAME} never holds the whole logits: " + "; ".join(lines) + ". Nothing left after backward.")
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


_PEAK_CAUSE = {
    "forward": "forward makes the whole logits (hidden @ weight.T), or keeps every chunk's logits alive: a chunk's "
               "logits must be gone before the next chunk's are made. Reduce each chunk to a few numbers per row "
               "(its losses, its log-sum-exp) and let the chunk go.",
    "backward": "backward makes the whole logits or softmax at once, or keeps every chunk's: recompute one chunk of "
                "logits at a time, turn it into that chunk's part of both gradients, and let it go before the next.",
}


# --- Exercise 11.2: true or false? ----------------------------------------------------------------

CLAIM_CHOICES = ("true", "false")
CLAIM_QUESTIONS = "abcdefgh"
