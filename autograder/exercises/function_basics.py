"""Checks for notebook 03_function_basics."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from ..checks import explain, inputs
from ..checks.functions import FunctionSpec, check_function
from ..checks.saved import SaveRule, check_saved
from ..student import devices, introspect, probe
from ..student.report import fail, passed, quiet, show
from ..student.saved import Names


def _habits(student: Any, name: str, args: tuple, names: Sequence[str]) -> None:
    """The two habits this notebook teaches against: no tensor stashed on ctx, and backward
    leaves grad_output and the saved tensors unchanged (whatever it saves, it saves with
    save_for_backward). Reported by the student's process: best effort."""
    __tracebackhide__ = True
    rule = SaveRule(name=name, expected=None, fix="", names=Names(args=tuple(names)))
    with quiet():
        for device in devices.available():
            check_saved(student, rule, devices.prepare(args, device))


# --- 3.1 ClippedReLU -----------------------------------------------------------------------

def _clipped_relu_hint(args: tuple, i: int, wrong: torch.Tensor) -> str | None:
    """Where the gradient is wrong, said by region (what the output does there)."""
    x, clip = args[0], float(args[1])
    regions = [
        (x < 0, "below 0, where the output is the constant 0 (gradient 0)"),
        ((x > 0) & (x < clip), f"between 0 and clip={clip:g}, where the output is x itself (gradient = grad_output)"),
        (x > clip, f"above clip={clip:g}, where the output is the constant clip (gradient 0)"),
    ]
    bad = [words for where, words in regions if bool((wrong & where).any())]
    if not bad:
        return None
    return "your gradient is wrong " + "; and ".join(bad) + "."


def _clipped_relu_cases(shapes: Sequence[Sequence[int]], clips: Sequence[float]):
    def cases(generator: torch.Generator) -> list[tuple]:
        result = []
        for shape, clip in zip(shapes, clips):
            x = inputs.uniform(shape, generator, -1.0, clip + 1.0, kinks=(0.0, clip), margin=min(0.05, clip / 4))
            result.append((inputs.including(x, [-0.5, clip / 2, clip + 0.5], generator), clip))  # every region
        return result

    return cases


CLIPPED_RELU = FunctionSpec(
    name="ClippedReLU",
    reference=lambda x, clip: x.clamp(0, clip),
    cases=_clipped_relu_cases([(6,), (3, 4)], [1.5, 0.5]),
    hint=_clipped_relu_hint,
    double_backward=True,  # the notebook teaches it: a backward that leaves torch shows here
)


def check_clipped_relu(
    student: Any,
    *,
    shapes: Sequence[Sequence[int]] = ((6,), (3, 4)),
    clips: Sequence[float] = (1.5, 0.5),
    seed: int | None = 0,
) -> None:
    """ClippedReLU(x, clip) = min(max(x, 0), clip), with a plain-number `clip`: values and
    gradients (away from the kinks, and at them and at large |x|), tensors saved the
    right way and grad_output left alone."""
    __tracebackhide__ = True
    spec = replace(CLIPPED_RELU, cases=_clipped_relu_cases(shapes, clips))
    generator = inputs.generator(seed)
    with quiet():  # first: a nan at a kink also breaks what check_function differentiates, less plainly
        far_out = [_check_special_points(student, clip, generator) for clip in clips]
    passed("ClippedReLU: at the kinks x = 0 and x = clip the gradient is between 0 and grad_output; "
           "at x = ±1e6 and ±1e300 the values are exact.")
    check_function(student, spec, seed=seed)
    for check in far_out:  # last, on no line of its own: every known mistake wrong far out is wrong at
        check()  # ordinary points too, where check_function's message says more
    x = spec.cases(generator)[0][0]
    _habits(student, "ClippedReLU", (x, clips[0]), probe.argument_names(student))
    passed("ClippedReLU: nothing stashed on ctx; backward leaves grad_output and the saved tensors unchanged.")


def _check_special_points(student: Any, clip: float, generator: torch.Generator) -> Callable[[], None]:
    """At a kink any subgradient is right: a value between 0 and grad_output (torch.clamp
    gives grad_output). Far out, a formula that overflows shows: the returned check, which
    judges the gradient there, runs after the ordinary points were judged."""
    __tracebackhide__ = True
    # In an order of their own in every draw: an answer cannot tell these points by their places.
    order = torch.randperm(7, generator=generator)
    x = torch.tensor([0.0, clip, -1e6, 1e6, -1e300, 1e300, clip / 2], dtype=torch.float64)[order]
    g = 0.5 + torch.rand(x.shape, generator=generator, dtype=torch.float64)  # positive: [0, g] is the range
    args = devices.prepare((x, clip), "cpu")
    shown = [f"x = {show(x)}", f"clip = {clip!r}", f"grad_output = {show(g)}"]
    actual = probe.run(student, args, [[g]])
    if actual.error:
        what, cause = explain.error(actual.error.stage, actual.error.type, actual.error.message, ["x", "clip"])
        fail(f"ClippedReLU at special points: {what}.", *shown, cause=cause)
    want = x.clamp(0, clip)
    got = actual.outputs[0].cpu() if actual.outputs else None
    if got is None or got.shape != want.shape or not torch.equal(got, want):
        fail("ClippedReLU at special points: wrong forward values.", *shown,
             *(explain.differ(want, got) if got is not None else [f"expected {show(want)}", "actual   no output"]),
             cause="clamp into [0, clip] with operations that stay exact far out (`x.clamp(0, clip)`, `torch.where`); "
             "a formula such as `x * mask + clip * (1 - mask)` gives inf·0 = nan or loses the value.")
    grad = actual.grads[0][0]
    grad = torch.zeros_like(x) if grad is None else grad.cpu()
    kinks = torch.tensor([True, True, False, False, False, False, False])[order]
    exact = torch.where(kinks, grad, torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], dtype=torch.float64)[order] * g)
    inside = torch.isfinite(grad) & (grad >= 0) & (grad <= g)
    if not bool((inside | ~kinks).all()):
        (k,) = explain.first_index(~inside & kinks)
        fail(f"ClippedReLU: at the kink x = {x[k].item():g} your gradient is {grad[k].item():g}, "
             "outside [0, grad_output] there.", *shown, f"actual gradient {show(grad)}",
             cause="the derivative is undefined at a kink, and any value between 0 and grad_output is a valid "
             "choice there (torch.clamp passes grad_output on); nan, inf or a value outside is not. A mask "
             "computed by a division, such as `y / x`, is 0/0 = nan at x = 0.")

    def far_from_the_kinks() -> None:
        __tracebackhide__ = True
        if not torch.equal(grad, exact):
            fail("ClippedReLU at special points: wrong gradient far from the kinks (at the kinks, yours are fine).",
                 *shown, *explain.differ(exact, grad),
                 cause="the gradient is 0 where the output is constant (x < 0 or x > clip, however far) and "
                 "grad_output in between; check for a formula that overflows at large |x|.")

    return far_from_the_kinks


# --- 3.2 Linear ----------------------------------------------------------------------------

LinearSizes = tuple[int, int, int]  # (batch, in_features, out_features)
LINEAR_SIZES: tuple[LinearSizes, ...] = ((5, 3, 4), (1, 2, 1))  # a batch of one, one output feature


def _linear_cases(with_bias: bool, sizes: Sequence[LinearSizes]):
    def cases(generator: torch.Generator) -> list[tuple]:
        found = []
        for batch, in_features, out_features in sizes:
            x = inputs.normal((batch, in_features), generator)
            w = inputs.normal((out_features, in_features), generator)
            found.append((x, w, inputs.normal((out_features,), generator) if with_bias else None))
        return found

    return cases


LINEAR = FunctionSpec(name="Linear", reference=F.linear, cases=_linear_cases(True, LINEAR_SIZES), double_backward=True)

_NAMES = ("input", "weight", "bias")


def check_linear(
    student: type[torch.autograd.Function],
    *,
    sizes: Sequence[LinearSizes] = LINEAR_SIZES,
    seed: int | None = 0,
) -> None:
    """Linear(input, weight, bias=None) = input @ weight.T + bias, honouring
    needs_input_grad; `sizes` are (batch, in_features, out_features)."""
    __tracebackhide__ = True
    for with_bias, name in ((True, "Linear"), (False, "Linear with bias=None")):
        spec = replace(LINEAR, name=name, cases=_linear_cases(with_bias, sizes))
        check_function(student, spec, seed=seed)
    generator = inputs.generator(seed)
    x, w, b = _linear_cases(True, sizes[:1])(generator)[0]
    with quiet():
        for needed in _subsets(3):
            _check_needs_input_grad(student, (x, w, b), needed)
    passed("Linear: for each combination of inputs requiring grad, backward runs only the matrix products "
           "needed and returns None for the inputs that need no gradient.")


def _subsets(n: int) -> list[tuple[bool, ...]]:
    return [s for s in itertools.product((False, True), repeat=n) if any(s)]


def _check_needs_input_grad(student, args: tuple, needed: tuple[bool, ...]) -> None:
    __tracebackhide__ = True
    args = tuple(a.detach().clone().requires_grad_(n) for a, n in zip(args, needed))
    names = [f"`{n}`" for n, k in zip(_NAMES, needed) if k]
    wanted = f"{' and '.join(names)} " + ("requires" if len(names) == 1 else "require")
    facts = introspect.record_backward(student, args)
    if facts.error is not None:
        what, cause = explain.error(facts.error.stage, facts.error.type, facts.error.message, list(_NAMES),
                                    arg_shapes=[tuple(a.shape) for a in args])
        fail(f"Linear: when only {wanted} grad, {what}.", cause=cause)
    expected = int(needed[0]) + int(needed[1])
    allowed = expected + int(needed[2])  # the bias gradient may be a product with ones
    if facts.matmuls > allowed:
        fail(
            f"Linear: when only {wanted} grad, backward ran {facts.matmuls} "
            f"matrix multiplication(s); {expected} are needed.",
            cause="check `ctx.needs_input_grad[i]` before computing the gradient of input i, "
            "and return None for the inputs that need none.",
        )
    for name, need, grad in zip(_NAMES, needed, facts.returned):
        if not need and grad is not None:
            fail(
                f"Linear: when only {wanted} grad, backward still returned a gradient for `{name}`.",
                cause=f"return None for `{name}` when `ctx.needs_input_grad` says it needs no gradient.",
            )


# --- 3.3 PolarToCartesian: two outputs, gradients that are None ---------------------------

def _polar(r: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return r * torch.cos(theta), r * torch.sin(theta)


def _polar_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    if i == 0:
        return "∂L/∂r = grad_x·cos θ + grad_y·sin θ (each output's gradient times that output's derivative in r)."
    return "∂L/∂θ = −grad_x·r·sin θ + grad_y·r·cos θ (mind the sign: d/dθ cos θ = −sin θ)."


PolarShapes = Sequence[int]
POLAR_SHAPES: tuple[PolarShapes, ...] = ((5,), (2, 3))


def _polar_cases(shapes: Sequence[PolarShapes]):
    def cases(generator: torch.Generator) -> list[tuple]:
        found = []
        for shape in shapes:
            # The origin: dividing by r gives nan.
            r = inputs.including(inputs.normal(shape, generator), [0.0], generator)
            found.append((r, inputs.uniform(shape, generator, -math.pi, math.pi)))
        return found

    return cases


POLAR = FunctionSpec(name="PolarToCartesian", reference=_polar, cases=_polar_cases(POLAR_SHAPES), hint=_polar_hint,
                     double_backward=True)


def check_polar_to_cartesian(student: Any, *, shapes: Sequence[PolarShapes] = POLAR_SHAPES,
                             seed: int | None = 0) -> None:
    """PolarToCartesian(r, theta) = (r cos θ, r sin θ), with set_materialize_grads(False):
    right gradients whichever outputs are used and inputs require grad; None received for
    an unused output, and less work done then; None returned for an input that needs no
    gradient."""
    __tracebackhide__ = True
    spec = replace(POLAR, cases=_polar_cases(shapes))
    check_function(student, spec, seed=seed)
    generator = inputs.generator(seed)
    r, theta = spec.cases(generator)[-1]
    args = devices.prepare((r, theta), "cpu")
    with quiet():
        both = introspect.record_backward(student, args)
        if both.error is not None:
            _fail_facts(both.error, "when both outputs are used")
        for used, unused in ((0, "y"), (1, "x")):
            alone = introspect.record_backward(student, args, [used])
            when = f"when only `{'xy'[used]}` is used"
            if alone.error is not None:
                _fail_facts(alone.error, when)
            if len(alone.received_none) > 1 - used and not alone.received_none[1 - used]:
                fail(f"PolarToCartesian: {when}, backward received zeros as grad_{unused}, not None.",
                     cause="call `ctx.set_materialize_grads(False)` in forward: then the gradient of an output "
                     "nobody used arrives as None, and backward can skip the work it would do with it.")
            ops, all_ops = sum(alone.calls.values()), sum(both.calls.values())
            if ops >= all_ops:
                fail(f"PolarToCartesian: {when}, backward runs {ops} torch operations; with both outputs "
                     f"used it runs {all_ops}. With grad_{unused} None it should run fewer.",
                     cause=f"skip every term that needs grad_{unused} when it is None (add what there is with "
                     "`add_optional`), instead of building zeros in its place and computing with them.")
        for needed, name in (((True, False), "r"), ((False, True), "theta")):
            part = tuple(a.detach().clone().requires_grad_(n) for a, n in zip(args, needed))
            facts = introspect.record_backward(student, part)
            other = "theta" if name == "r" else "r"
            if facts.error is not None:
                _fail_facts(facts.error, f"when only `{name}` requires grad")
            k = 1 if name == "r" else 0
            if len(facts.returned) > k and facts.returned[k] is not None:
                fail(f"PolarToCartesian: when only `{name}` requires grad, backward still returned a gradient "
                     f"for `{other}`.",
                     cause=f"return None for `{other}` when `ctx.needs_input_grad` says it needs no gradient.")
    passed("PolarToCartesian: an unused output's gradient arrives as None and backward then does less; "
           "it returns None for an input that needs no gradient.")
    _habits(student, "PolarToCartesian", (r, theta), probe.argument_names(student))
    passed("PolarToCartesian: nothing stashed on ctx; backward leaves grad_output and the saved tensors unchanged.")


def _fail_facts(error: probe.ProbeError, when: str) -> None:
    __tracebackhide__ = True
    what, cause = explain.error(error.stage, error.type, error.message, ["r", "theta"])
    fail(f"PolarToCartesian: {when}, {what}.", cause=cause)


# --- 3.4 When to write a Function ----------------------------------------------------------

WHEN_TO_WRITE_CHOICES = ("composite", "function", "derivatives.yaml")
