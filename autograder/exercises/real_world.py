"""Checks for notebook 09_real_world."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from ..checks import explain, inputs
from ..checks.functions import FunctionSpec, check_function, check_returned_shapes, on_meta
from ..checks.saved import SaveRule, check_saved, observe
from ..student import devices, probe, real_world
from ..student.report import fail, note, passed, quiet, show, value
from ..student.saved import Names

Shape = Sequence[int]
Cases = Callable[[torch.Generator], list[tuple]]


def _shown(names: Sequence[str], args: Sequence[Any]) -> list[str]:
    labels = list(names) if len(names) == len(args) else [f"input {i}" for i in range(len(args))]
    return [f"{n} = {show(a)}" for n, a in zip(labels, args)]


def _saves(student: Any, rule: SaveRule, cases: list[tuple]) -> None:
    """check_saved on each case, on every device."""
    __tracebackhide__ = True
    for device in devices.available():
        for args in cases:
            check_saved(student, rule, devices.prepare(args, device))


def _runs_strided(student: Any, name: str, args: tuple, *, claim: bool = True) -> None:
    """Forward and backward run on inputs that are not contiguous in memory (a transpose's
    layout; a 1-d tensor's every other element), as a caller's tensors may be: a `.view` that
    merges dimensions fails there. (Given the case of most dimensions.) Without `claim`, on no
    ✔ line of its own: where no known mistake fails only here (Swish's per-channel `.view` does)."""
    __tracebackhide__ = True
    names = probe.argument_names(student)
    with quiet():
        try:
            _, backward = observe(student, devices.prepare(args, "cpu"), strided=True)
            error = backward.error
        except probe.StudentError as exc:
            error = probe.ProbeError("forward", exc.type, exc.message)
    if error is not None:
        what, cause = explain.error(error.stage, error.type, error.message, names)
        if "view size is not compatible" in error.message:
            cause = ("`.view` needs memory laid out to match, and a caller's tensor need not be contiguous "
                     "(a transpose, a slice): use `.reshape(...)`, which copies only when it must.")
        fail(f"{name}: {what}, given inputs that are not contiguous in memory.", *_shown(names, args),
             "(the same values, laid out as a transpose's are; a 1-d tensor's every other element)", cause=cause)
    if claim:
        passed(f"{name}: forward and backward also run on inputs that are not contiguous in memory.")


# --- 9.1 Swish with a learnable beta ---------------------------------------------------------
# Cases: (x's shape, beta's shape, kind). Every case has an exact 0 in x; "normal" betas of more than
# one entry hold an exact 0 and a negative entry; "large" puts beta * x at 0, near +1000 and near -1000
# (x = 0, 50, -50 first), where exp overflows.

SwishCase = tuple[Shape, Shape, str]

SWISH_CASES: tuple[SwishCase, ...] = (  # the first also runs on the meta device
    ((4, 3), (3,), "normal"),
    ((4, 3), (), "normal"),
    ((3, 4), (1,), "normal"),  # one number, but 1-d: its gradient too
    ((1, 5), (5,), "normal"),
    ((2, 3, 2, 2), (3, 1, 1), "normal"),
    ((2, 5), (5,), "large"),
)


def _swish(x: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(beta * x)


def _swish_cases(specs: Sequence[SwishCase]) -> Cases:
    def cases(generator: torch.Generator) -> list[tuple]:
        found = []
        for x_shape, beta_shape, kind in specs:
            if kind == "large":
                x = inputs.including(inputs.uniform(x_shape, generator, -50.0, 50.0), [0.0, 50.0, -50.0], generator)
                beta = inputs.uniform(beta_shape, generator, 15.0, 20.0)
            else:
                x = inputs.including(inputs.uniform(x_shape, generator, -3.0, 3.0), [0.0], generator)
                beta = inputs.uniform(beta_shape, generator, -2.0, 2.0, kinks=[0.0], margin=0.2)
                if beta.numel() > 1:  # Swish is x/2 at beta = 0, where a formula that divides by beta is nan
                    beta = inputs.including(beta, [0.0, -1.5], generator)
            found.append((x, beta))
        return found

    return cases


def _swish_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    x, beta = args
    z = (beta * x).expand(x.shape)
    if i == 0:
        where = wrong
        formula = "with s = σ(βx): dy/dx = s + βx·s(1 − s) (product rule, and the chain rule through βx)."
    else:
        where = torch.ones_like(z, dtype=torch.bool)  # each entry of beta gathers many entries of x
        formula = (
            "with s = σ(βx): dy/dβ = x²·s(1 − s) at each entry; beta was broadcast over x, so sum grad_output "
            "times that over the dims beta was broadcast along, down to beta's shape (`.sum_to_size`)."
        )
    if bool((z[where].abs() > 30).any()):
        formula += (f" Here |βx| reaches {value(float(z.abs().max()), '.0f')}: exp(±βx) overflows to inf there "
                    "(inf / inf = nan), so compute σ with torch.sigmoid and its derivative as s·(1 − s).")
    if bool((x.expand(x.shape)[where] == 0).any()):
        formula += " x is exactly 0 at some entries: a formula that divides by x gives nan there."
    if bool((beta.expand(x.shape)[where] == 0).any()):
        formula += " beta is exactly 0 at some entries: a formula that divides by beta gives nan there."
    return formula


SWISH = FunctionSpec(
    name="Swish", reference=_swish, cases=_swish_cases(SWISH_CASES), double_backward=True, hint=_swish_hint
)

SWISH_SAVES = SaveRule(
    name="Swish",
    expected=("input 0", "input 1"),
    fix="save only x and beta, and compute σ(βx) again in backward",
    names=Names(known={
        "σ(βx)": lambda x, beta: torch.sigmoid(beta * x),
        "βx": lambda x, beta: beta * x,
        "σ(βx)(1 − σ(βx))": lambda x, beta: torch.sigmoid(beta * x) * (1 - torch.sigmoid(beta * x)),
    }),
    reasons={
        "intermediate": "forward runs without recording, so a gradient computed from an intermediate is a "
        "constant to autograd: double backward (a gradient penalty, a Hessian-vector product) is silently "
        "wrong, and the intermediate is memory kept alive only for backward. (Calling save_for_backward "
        "twice does not add to the first call: the second replaces it.)",
        "output": "the derivative needs σ(βx), and getting it back from the output means dividing by x, which is "
        "0/0 at x = 0. Save x and beta and recompute σ(βx).",
    },
)


def check_swish(student: Any, *, cases: Sequence[SwishCase] = SWISH_CASES, seed: int | None = 0) -> None:
    """Swish(x, beta) = x·σ(beta·x), beta broadcasting against x (a scalar, per channel, ...)."""
    __tracebackhide__ = True
    spec = replace(SWISH, cases=_swish_cases(cases))
    drawn = spec.cases(inputs.generator(seed))
    _saves(student, SWISH_SAVES, drawn[:2])
    passed("Swish saves exactly x and beta, nothing on ctx.")
    _runs_strided(student, "Swish", max(drawn, key=lambda args: args[0].dim()))
    check_function(student, spec, seed=seed)
    check_returned_shapes(student, "Swish", drawn, fix=": `grad.sum_to_size(beta.shape)`")
    shapes = ", ".join(f"x {tuple(x.shape)} β {tuple(b.shape)}" for x, b in drawn)
    passed(f"Swish: beta's gradient has beta's shape ({shapes}).")


# --- 9.2 A stable LogSumExp ------------------------------------------------------------------
# Cases: (x's shape, dim, kind). "extreme" slices (along dim) are mixed (±1000 alternating),
# all near +1000, or all near -1000, in turn.

LseCase = tuple[Shape, int, str]

LOGSUMEXP_CASES: tuple[LseCase, ...] = (
    ((3, 4), 1, "extreme"),
    ((4, 3), 0, "normal"),
    ((5,), 0, "normal"),
    ((2, 3, 4), -2, "normal"),
    ((1, 4), 1, "extreme"),  # a batch of one: the output keeps its size-1 dim
    ((3, 1), -1, "normal"),  # a reduced dim of size 1
)


def _extreme(x: torch.Tensor, dim: int) -> torch.Tensor:
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1]).clone()
    for i in range(rows.shape[0]):
        if i % 3 == 0:
            signs = torch.tensor([1.0 if j % 2 == 0 else -1.0 for j in range(rows.shape[1])], dtype=x.dtype)
            rows[i] += 1000 * signs
        else:
            rows[i] += 1000.0 if i % 3 == 1 else -1000.0
    return rows.reshape(moved.shape).movedim(-1, dim).contiguous()


def _lse_cases(specs: Sequence[LseCase]) -> Cases:
    def cases(generator: torch.Generator) -> list[tuple]:
        found = []
        for shape, dim, kind in specs:
            x = 2 * inputs.normal(shape, generator)
            found.append((_extreme(x, dim) if kind == "extreme" else x, dim))
        return found

    return cases


def _lse_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    return (
        "∂out/∂x = exp(x − out), the softmax along dim; the output has lost that dim, so unsqueeze "
        "grad_output and out at dim before broadcasting them against x."
    )


LOGSUMEXP = FunctionSpec(
    name="LogSumExp", reference=torch.logsumexp, cases=_lse_cases(LOGSUMEXP_CASES), double_backward=True,
    hint=_lse_hint,
)

LOGSUMEXP_SAVES = SaveRule(
    name="LogSumExp",
    expected=("input 0", "output 0"),
    fix="save x and the output: the gradient exp(x − out) needs nothing else",
    names=Names(known={
        "softmax(x)": lambda x, dim: torch.softmax(x, dim),
        "exp(x − max)": lambda x, dim: torch.exp(x - x.amax(dim, keepdim=True)),
        "max(x) along dim": lambda x, dim: x.amax(dim, keepdim=True),
        "max(x) along dim (without keepdim)": lambda x, dim: x.amax(dim),
        "sum(exp(x − max))": lambda x, dim: torch.exp(x - x.amax(dim, keepdim=True)).sum(dim, keepdim=True),
    }),
    reasons={
        "intermediate": "it is memory kept alive only for backward (the softmax has x's full size), and "
        "forward runs without recording, so a gradient computed from it cannot be differentiated again. "
        "x is the caller's tensor and the output is returned anyway: saving them costs no new memory.",
    },
)


def _check_finite(student: Any, args: tuple, names: list[str]) -> None:
    """Forward and backward at x = ±1000 give finite numbers."""
    __tracebackhide__ = True
    x, dim = args
    want = torch.logsumexp(x.detach(), dim).shape
    result = probe.run(student, args, [[torch.ones(want, dtype=x.dtype, device=x.device)]])
    slices = x.numel() // x.shape[dim] if x.dim() else 1
    kinds = ", ".join(["mixed (±1000)", "all near +1000", "all near -1000"][:slices])
    shown = [f"x has slices along dim {dim} {kinds}: {show(x)}", f"dim = {dim}"]
    if result.error is not None and result.error.stage == "forward":
        what, cause = explain.error("forward", result.error.type, result.error.message, names)
        fail(f"LogSumExp: {what}.", *shown, cause=cause)
    got = [tuple(out.shape) for out in result.outputs]
    if got != [tuple(want)]:
        squeezed = got == [tuple(n for n in want if n != 1)]
        fail(f"LogSumExp: forward returned shape {', '.join(map(str, got))}, expected {tuple(want)}.", *shown,
             cause=f"remove only the reduced dimension, dim {dim}" + (
                 ": `.squeeze(dim)`. `.squeeze()` also removes every other dimension of size 1, a batch of one's "
                 "included." if squeezed else ", as torch.logsumexp(x, dim) does."))
    for out in result.outputs:
        if out.is_floating_point() and not bool(torch.isfinite(out).all()):
            fail(
                "LogSumExp: forward is not finite at large inputs.", *shown, f"forward gave {show(out)}",
                cause="exp(1000) overflows even in float64 (the largest float64 is about e^709.8), and exp(-1000) "
                "underflows to 0, whose log is -inf. Subtract the max along dim before exp, and add it back "
                "after the log: m + log(Σ exp(x − m)) (the max of each slice separately, not of the whole tensor).",
            )
    if result.error is not None:
        what, cause = explain.error(result.error.stage, result.error.type, result.error.message, names)
        fail(f"LogSumExp: {what}.", *shown, cause=cause)
    for grad in result.grads[0]:
        if grad is not None and not bool(torch.isfinite(grad).all()):
            fail(
                "LogSumExp: backward is not finite at large inputs.", *shown, f"gradient = {show(grad)}",
                cause="exp(x) / exp(out) or exp(x) / Σ exp(x) is inf / inf = nan at x = 1000. "
                "Compute exp(x − out) instead: every entry is at most 1.",
            )


def check_logsumexp(student: Any, *, cases: Sequence[LseCase] = LOGSUMEXP_CASES, seed: int | None = 0) -> None:
    """LogSumExp(x, dim) = log Σ exp(x) along dim (dim removed), stable at ±1000, saving its output."""
    __tracebackhide__ = True
    spec = replace(LOGSUMEXP, cases=_lse_cases(cases))
    drawn = spec.cases(inputs.generator(seed))
    names = probe.argument_names(student)
    extreme = [args for args, (_, _, kind) in zip(drawn, cases) if kind == "extreme"]
    with quiet():
        for device in devices.available():
            for args in extreme:
                _check_finite(student, devices.prepare(args, device), names)
    if extreme:
        passed("LogSumExp: forward and backward are finite at x = 1000, -1000 and mixed.")
    _saves(student, LOGSUMEXP_SAVES, drawn[:2])
    passed("LogSumExp saves exactly x and its output, nothing on ctx.")
    _runs_strided(student, "LogSumExp", max(drawn, key=lambda args: args[0].dim()), claim=False)
    check_function(student, spec, seed=seed)


# --- 9.3 Gradient reversal -------------------------------------------------------------------

ReverseCase = tuple[Shape, float]

GRAD_REVERSE_CASES: tuple[ReverseCase, ...] = (((5,), 0.5), ((2, 3), 1.0), ((), 2.0))

GRAD_REVERSE_SAVES = SaveRule(
    name="GradReverse",
    expected=(),
    fix="save nothing: the gradient −α·grad_output needs no tensor from forward, and α goes on ctx",
)


def check_grad_reverse(student: Any, *, cases: Sequence[ReverseCase] = GRAD_REVERSE_CASES,
                       seed: int | None = 0) -> None:
    """GradReverse(x, alpha): forward returns x's values; backward returns −alpha·grad_output."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    names = probe.argument_names(student)
    with quiet():
        check_saved(student, GRAD_REVERSE_SAVES, devices.prepare((inputs.normal((3,), generator), 0.5), "cpu"))
        _runs_strided(student, "GradReverse", (inputs.normal((2, 3), generator), 0.5))
        for shape, alpha in cases:
            x = inputs.normal(shape, generator)
            g, u = inputs.normal(shape, generator), inputs.normal(shape, generator)
            for device in devices.available():
                _reverse_once(student, devices.prepare((x, alpha), device), g.to(device), u.to(device), names)
        meta = on_meta(student, [(x, cases[0][1])], names)
    alphas = ", ".join(repr(a) for _, a in cases)
    passed(
        f"GradReverse: forward returns x unchanged, backward returns −α·grad_output (α = {alphas}) and "
        f"can itself be differentiated; nothing saved ({', '.join(devices.available())})."
    )
    note(meta)
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


def _reverse_once(student: Any, args: tuple, g: torch.Tensor, u: torch.Tensor, names: list[str]) -> None:
    __tracebackhide__ = True
    x, alpha = args
    shown = [f"x = {show(x)}", f"alpha = {alpha!r}", f"grad_output = {show(g)}"]
    result = probe.run(student, args, [[g]], [u])
    if result.error is not None and result.error.stage == "forward":
        what, cause = explain.error("forward", result.error.type, result.error.message, names)
        fail(f"GradReverse: {what}.", *shown[:2], cause=cause)
    outs = result.outputs
    if len(outs) != 1:
        fail(f"GradReverse: forward returned {len(outs)} tensors, expected 1.", *shown[:2])
    (out,) = outs
    if out.shape != x.shape or out.dtype != x.dtype or not torch.equal(out.cpu(), x.detach().cpu()):
        cause = ("the reversal acts on the gradient only: forward returns x's values unchanged (`x.view_as(x)` "
                 "or `x.clone()`).")
        if out.shape == x.shape and out.dtype == x.dtype and torch.allclose(out.cpu(), -alpha * x.detach().cpu()):
            cause = ("forward multiplies x by −α, but the reversal belongs in backward only: forward returns x's "
                     "values unchanged (`x.view_as(x)` or `x.clone()`).")
        fail("GradReverse: forward changed the values of x.", *shown[:2],
             *(explain.differ(x.detach().cpu(), out.cpu()) if out.shape == x.shape and out.dtype == x.dtype else
               [f"actual {show(out)}"]), cause=cause)
    if result.modified:
        fail("GradReverse: forward modified x in place.", *shown[:2],
             cause="return a new tensor (or a view, `x.view_as(x)`); never change the caller's x.")
    if result.error is not None and result.error.stage == "backward":
        what, cause = explain.error("backward", result.error.type, result.error.message, names)
        fail(f"GradReverse: {what}.", *shown, cause=cause)
    (grad,) = result.grads[0][:1] or [None]
    want = -alpha * g
    if grad is None:
        fail("GradReverse: backward returned None for x.", *shown, f"expected {show(want)}",
             cause="return −α·grad_output for x (and None for alpha, which is not a tensor).")
    grad = grad.to(want.device)
    if not (grad.shape == want.shape and torch.allclose(grad, want, rtol=1e-12, atol=1e-12)):
        fail("GradReverse: wrong gradient for x.", *shown,
             *(explain.differ(want, grad, rtol=1e-12, atol=1e-12) if grad.shape == want.shape else
               [f"expected {show(want)}", f"actual   {show(grad)}"]), cause=_reverse_cause(grad, g, alpha))
    if result.error is not None:
        what, cause = explain.error(result.error.stage, result.error.type, result.error.message, names)
        fail(f"GradReverse: {what}.", *shown,
             cause=cause or "backward must be a differentiable torch computation on grad_output.")
    second_x, second_g = (result.grads2 or [None, None])[:2]
    if (second_x is not None and bool(second_x.any())) or second_g is None or not torch.allclose(
        second_g.to(u.device), -alpha * u, rtol=1e-12, atol=1e-12
    ):
        fail(
            "GradReverse: double backward is wrong: the gradient of your gradient with respect to grad_output "
            "should be −α times the incoming vector.", *shown,
            f"expected {show(-alpha * u)}",
            f"actual   {'zero (not connected)' if second_g is None else show(second_g)}",
            cause="compute the gradient with torch operations on grad_output (−α times it), "
            "not with .detach(), NumPy or @once_differentiable.",
        )


def _reverse_cause(grad: torch.Tensor, g: torch.Tensor, alpha: float) -> str:
    def close(t: torch.Tensor) -> bool:
        return grad.shape == t.shape and bool(torch.allclose(grad, t, rtol=1e-12, atol=1e-12))

    if close(g):
        return "the gradient passes through unchanged: backward must multiply it by −α."
    if close(alpha * g) and alpha != 0:
        return "the sign is wrong: the reversal multiplies the gradient by −α, not α."
    if close(-g):
        return "α is ignored: the gradient is −grad_output, but it must be −α·grad_output."
    return "backward returns −α·grad_output for x, None for alpha."


# --- 9.4 Implicit differentiation of a fixed point --------------------------------------------
# Cases: (x's shape, n): W is n × n with spectral norm RHO, so z ↦ tanh(z Wᵀ + x) contracts.

FixedCase = tuple[Shape, int]

FIXED_POINT_CASES: tuple[FixedCase, ...] = (((3, 4), 4), ((4,), 4), ((1, 5), 5))
RHO = 0.5
# Iterations of the reference: its error shrinks by RHO per iteration, its derivatives' about as fast
# (n² RHOⁿ for the second): after 60, below float64's resolution (RHO⁶⁰ ≈ 1e-18; 60² RHO⁶⁰ ≈ 3e-15).
UNROLLED = 60


def _fixed_point_cases(specs: Sequence[FixedCase]) -> Cases:
    def cases(generator: torch.Generator) -> list[tuple]:
        found = []
        for shape, n in specs:
            w = inputs.normal((n, n), generator)
            w = RHO * w / torch.linalg.matrix_norm(w, 2)
            found.append((inputs.normal(shape, generator), w))
        return found

    return cases


def _unrolled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The fixed point by plain iteration, differentiated by autograd through every step."""
    z = torch.zeros_like(x)
    for _ in range(UNROLLED):
        z = torch.tanh(z @ w.T + x)
    return z


def _fixed_point_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    if i == 0:
        return (
            "with s = 1 − z², the gradient for x is the solution w of w = s ⊙ (grad_output + w W) "
            "(one row per sample): the adjoint system. s ⊙ grad_output alone is its first iterate only."
        )
    return ("the gradient for W is wᵀ z summed over the samples (shape (n, n)), with w the solution of "
            "the adjoint system.")


FIXED_POINT = FunctionSpec(
    name="TanhFixedPoint", reference=_unrolled, cases=_fixed_point_cases(FIXED_POINT_CASES), double_backward=True,
    hint=_fixed_point_hint, rtol=1e-6, atol=1e-9,
)

FIXED_POINT_SAVES = SaveRule(
    name="TanhFixedPoint",
    expected=("output 0", "input 1"),
    fix="save z (the output) and W: the adjoint system needs nothing else",
    names=Names(known={"1 − z²": lambda x, w: 1 - _unrolled(x, w) ** 2}),
    reasons={
        "input": "x enters only through the pre-activation, whose tanh is z: backward needs z and W.",
        "intermediate": "implicit differentiation needs only the fixed point itself: keeping anything from "
        "the iterations (or computed from z) is memory kept alive only for backward.",
    },
)


def _check_converged(student: Any, cases: list[tuple], names: list[str]) -> None:
    """The output is a fixed point of z ↦ tanh(z Wᵀ + x), to float64 precision."""
    __tracebackhide__ = True
    with quiet():
        results = probe.forward_many(student, [tuple(a.detach() for a in args) for args in cases])
    for (x, w), result in zip(cases, results):
        shown = [f"x = {show(x)}", f"W = {show(w)} (spectral norm {RHO})"]
        if isinstance(result, probe.ProbeError):
            what, cause = explain.error("forward", result.type, result.message, names)
            fail(f"TanhFixedPoint: {what}.", *shown, cause=cause)
        if len(result) != 1 or result[0].shape != x.shape or result[0].dtype != x.dtype:
            got = ", ".join(f"{tuple(r.shape)} {r.dtype}" for r in result)
            fail(f"TanhFixedPoint: forward returned {got}; expected one tensor of x's shape {tuple(x.shape)} "
                 "and dtype.",
                 *shown)
        z = result[0].cpu()
        residual = float((z - torch.tanh(z @ w.T + x)).abs().max())
        if not residual <= 1e-10:
            fail(
                f"TanhFixedPoint: forward stops before the fixed point: max |z − tanh(z Wᵀ + x)| = {residual:.2g}.",
                *shown,
                cause="iterate z ← tanh(z Wᵀ + x) until the largest change is below 1e-12 (at most 500 "
                "iterations): the implicit gradient is exact only at the fixed point, and finite differences "
                "of an unconverged forward are noise.",
            )


def check_fixed_point(student: Any, *, cases: Sequence[FixedCase] = FIXED_POINT_CASES,
                      seed: int | None = 0) -> None:
    """TanhFixedPoint(x, W) = z with z = tanh(z Wᵀ + x); backward solves the adjoint system."""
    __tracebackhide__ = True
    spec = replace(FIXED_POINT, cases=_fixed_point_cases(cases))
    drawn = spec.cases(inputs.generator(seed))
    _check_converged(student, drawn, probe.argument_names(student))
    passed(f"TanhFixedPoint: forward converges to the fixed point ({len(drawn)} inputs).")
    _saves(student, FIXED_POINT_SAVES, drawn[:2])
    passed("TanhFixedPoint saves exactly z and W, nothing on ctx.")
    _runs_strided(student, "TanhFixedPoint", max(drawn, key=lambda args: args[0].dim()), claim=False)
    check_function(student, spec, seed=seed)
    note(f"(the reference differentiates through {UNROLLED} unrolled iterations)")


# --- 9.5 A small model trained end to end ------------------------------------------------------

CLASSES, PER_CLASS, HIDDEN, STEPS, LR = 3, 50, 32, 100, 0.05
TARGET = 0.15  # cross-entropy after training: a correct model reaches ~0.01-0.05, a linear one ~1.0


def spirals(generator: torch.Generator, per_class: int = PER_CLASS, classes: int = CLASSES,
            turns: float = 5.0, noise: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleaved spirals in the plane, one per class: (x float32 (N, 2), y int64 (N,))."""
    xs, ys = [], []
    t = torch.linspace(0.0, 1.0, per_class, dtype=torch.float64)
    for c in range(classes):
        angle = 2 * math.pi * c / classes + turns * t + noise * torch.randn(per_class, generator=generator,
                                                                            dtype=torch.float64)
        radius = 0.2 + t
        xs.append(torch.stack([radius * angle.cos(), radius * angle.sin()], 1))
        ys.append(torch.full((per_class,), c, dtype=torch.int64))
    return torch.cat(xs).float(), torch.cat(ys)


def _valid(tensor: Any, shape: tuple | None = None) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel() <= 10**6 and (
        shape is None or tuple(tensor.shape) == tuple(shape))


def check_classifier(student: Any, *, seed: int | None = 0) -> None:
    """SwishClassifier(n_in, hidden, classes): trained by the check, it must reach TARGET."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    x, y = spirals(generator)
    init = int(torch.randint(0, 2**31 - 1, (), generator=generator))
    settings = {"hidden": HIDDEN, "classes": CLASSES, "steps": STEPS, "lr": LR, "seed": init}
    with quiet():
        result = probe.invoke(real_world.train_classifier, student, x, y, settings)
    if not isinstance(result, dict) or "error" not in result:
        raise probe.Malformed("malformed training report")
    error = probe.ProbeError.from_data(result["error"])
    setting = (f"{len(y)} points of {CLASSES} interleaved spirals, hidden = {HIDDEN}, Adam(lr={LR}), {STEPS} "
               "full-batch steps")
    if error is not None:
        what, cause = explain.error(error.stage, error.type, error.message, [])
        fail(f"SwishClassifier: {what}.", setting, cause=cause)
    try:
        replaced, swish_calls, betas = list(result["replaced"]), int(result["swish_calls"]), list(result["betas"])
        lse_calls, dims, changed = int(result["logsumexp_calls"]), list(result["dims"]), list(result["changed"])
        logits0, logits, loss0 = result["logits0"], result["logits"], float(result["loss0"])
        parameters = [(str(name), tuple(int(n) for n in shape)) for name, shape in result["parameters"]]
        facts = [(tuple(int(n) for n in b["shape"]), bool(b["parameter"]), bool(b["requires_grad"])) for b in betas]
    except (KeyError, TypeError, ValueError) as bad:
        raise probe.Malformed(f"malformed training report: {bad}") from None
    if not (_valid(logits0, (len(y), CLASSES)) and _valid(logits, (len(y), CLASSES))):
        raise probe.Malformed("malformed logits")
    _judge_structure(replaced, swish_calls, facts, lse_calls, dims, parameters, changed)
    expected0 = float(F.cross_entropy(logits0.double(), y))
    if not math.isclose(loss0, expected0, rel_tol=1e-4, abs_tol=1e-5):
        fail(
            "SwishClassifier: model.loss(x, y) is not the mean cross-entropy of the logits.",
            f"before training: model.loss(x, y) = {loss0:.6g}, but the mean over the batch of "
            f"LogSumExp(logits_i) − logits_i[y_i] is {expected0:.6g}",
            cause=_loss_cause(loss0, expected0, logits0, y),
        )
    passed(f"SwishClassifier: uses Swish with a learnable β of shape ({HIDDEN},) and LogSumExp; "
           f"model.loss is the mean cross-entropy ({expected0:.4f} before training).")
    final = float(F.cross_entropy(logits.double(), y))
    if not final <= TARGET:
        fail(
            f"SwishClassifier: after training, the cross-entropy is {final:.4f}; it must be at most {TARGET}.",
            setting,
            cause="a linear model stays near 1.0 on spirals. The path from x to the logits must be "
            "Linear → Swish → Linear, and the gradient of model.loss must be the cross-entropy's: a "
            "`.detach()` inside the loss keeps its value right but drops that term's gradient.",
        )
    passed(f"SwishClassifier: trained by the check ({setting}), the cross-entropy fell from "
           f"{expected0:.3f} to {final:.4f} (target ≤ {TARGET}).")
    if replaced:
        note(f"trained with the course's {' and '.join(replaced)} in place of yours "
             "(exercises 9.1 and 9.2 grade your own).")


def _judge_structure(replaced: list[str], swish_calls: int, betas: list[tuple], lse_calls: int, dims: list,
                     parameters: list[tuple[str, tuple]], changed: list[str]) -> None:
    __tracebackhide__ = True
    listing = "parameters: " + ", ".join(f"{name} {shape}" for name, shape in parameters)
    if swish_calls == 0:
        fail("SwishClassifier: model(x) never calls Swish.apply.", listing,
             cause="the hidden layer's activation is your Swish Function: `Swish.apply(h, self.beta)` "
             "(the check looks for the name `Swish` where your class is defined).")
    for shape, parameter, requires_grad in betas:
        if shape != (HIDDEN,):
            fail(f"SwishClassifier: Swish is called with a beta of shape {shape}; expected ({HIDDEN},), one "
                 "per hidden unit.",
                 listing, cause=f"β is learnable per hidden unit: a Parameter of shape (hidden,) = ({HIDDEN},), "
                 "all ones to start.")
        if not (parameter and requires_grad):
            fail("SwishClassifier: the beta passed to Swish is not one of the model's parameters.", listing,
                 cause="register β as `self.beta = torch.nn.Parameter(...)` and pass it as it is: "
                 "a plain tensor attribute, a copy or `.detach()` is not trained by the optimizer.")
    if lse_calls == 0:
        fail("SwishClassifier: model.loss never calls LogSumExp.apply.", listing,
             cause="write the cross-entropy with your Function: LogSumExp.apply(logits, 1) − the logit of the "
             "right class, averaged over the batch.")
    unchanged = [name for name, _ in parameters if name not in changed]
    if unchanged:
        fail(f"SwishClassifier: training did not change the parameter(s) {', '.join(unchanged)}.", listing,
             cause="every parameter must be in the path from x to the loss, without `.detach()`.")


def _loss_cause(loss0: float, expected: float, logits0: torch.Tensor, y: torch.Tensor) -> str:
    n = len(y)
    logits0 = logits0.double()
    candidates = {
        "the loss is summed over the batch: average it (`.mean()`).": expected * n,
        "the log-sum-exp runs over the batch (dim 0): it must run over the classes, dim 1.":
            float(torch.logsumexp(logits0, 0).mean() - logits0.gather(1, y[:, None]).mean()),
        "the sign is flipped: cross-entropy is LogSumExp(logits) − logits[y], not the reverse.": -expected,
        "the logit of the right class is missing: subtract each row's logit of its own class (`gather` along dim 1).":
            float(torch.logsumexp(logits0, 1).mean()),
    }
    for cause, candidate in candidates.items():
        if math.isclose(loss0, candidate, rel_tol=1e-4, abs_tol=1e-5):
            return cause
    return "loss(x, y) = mean over i of LogSumExp(logits_i over the classes) − logits_i[y_i], with logits = self(x)."
