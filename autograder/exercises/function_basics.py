"""Checks for notebook 03_function_basics."""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..checks import inputs
from ..student import introspect
from ..checks.functions import FunctionSpec, check_function
from ..student.report import fail, passed, quiet


# --- ClippedReLU -------------------------------------------------------------------------

def _clipped_relu_hint(args: tuple, i: int, wrong: torch.Tensor) -> str | None:
    x, clip = args[0], float(args[1])
    above, below, inside = x > clip, x < 0, (x > 0) & (x < clip)
    if bool(wrong[above].all()) and not bool(wrong[~above].any()):
        return f"above clip={clip:g} the output is constant, so the gradient is 0 there too: your backward forgets the upper clip."
    if bool(wrong[below].all()) and not bool(wrong[~below].any()):
        return "below 0 the output is constant, so the gradient is 0 there: your backward forgets the lower bound."
    if bool(wrong[inside].any()):
        return "between 0 and clip the output is x itself, so the gradient there is exactly grad_output."
    return None


def _clipped_relu_cases(shapes: Sequence[Sequence[int]], clips: Sequence[float]):
    def cases(generator: torch.Generator) -> list[tuple]:
        result = []
        for shape, clip in zip(shapes, clips):
            x = inputs.uniform(shape, generator, -1.0, clip + 1.0, kinks=(0.0, clip), margin=min(0.05, clip / 4))
            flat = x.view(-1)
            flat[:3] = torch.tensor([-0.5, clip / 2, clip + 0.5], dtype=x.dtype)[: flat.numel()]  # every region
            result.append((x, clip))
        return result

    return cases


CLIPPED_RELU = FunctionSpec(
    name="ClippedReLU",
    reference=lambda x, clip: x.clamp(0, clip),
    cases=_clipped_relu_cases([(6,), (3, 4)], [1.5, 0.5]),
    hint=_clipped_relu_hint,
)


def check_clipped_relu(
    student: Any,
    *,
    shapes: Sequence[Sequence[int]] = ((6,), (3, 4)),
    clips: Sequence[float] = (1.5, 0.5),
    seed: int | None = 0,
) -> None:
    """ClippedReLU(x, clip) = min(max(x, 0), clip), with a plain-number `clip`."""
    __tracebackhide__ = True
    check_function(student, replace(CLIPPED_RELU, cases=_clipped_relu_cases(shapes, clips)), seed=seed)


# --- Linear ------------------------------------------------------------------------------

def _linear_cases(with_bias: bool, batch: int = 5, in_features: int = 3, out_features: int = 4):
    def cases(generator: torch.Generator) -> list[tuple]:
        x = inputs.normal((batch, in_features), generator)
        w = inputs.normal((out_features, in_features), generator)
        return [(x, w, inputs.normal((out_features,), generator) if with_bias else None)]

    return cases


LINEAR = FunctionSpec(name="Linear", reference=F.linear, cases=_linear_cases(True))

_NAMES = ("input", "weight", "bias")


def check_linear(
    student: type[torch.autograd.Function],
    *,
    batch: int = 5,
    in_features: int = 3,
    out_features: int = 4,
    seed: int | None = 0,
) -> None:
    """Linear(input, weight, bias=None) = input @ weight.T + bias, honouring needs_input_grad."""
    __tracebackhide__ = True
    sizes = (batch, in_features, out_features)
    for with_bias, name in ((True, "Linear"), (False, "Linear with bias=None")):
        spec = replace(LINEAR, name=name, cases=_linear_cases(with_bias, *sizes))
        check_function(student, spec, seed=seed)
    generator = inputs.generator(seed)
    x, w, b = _linear_cases(True, *sizes)(generator)[0]
    with quiet():
        for needed in _subsets(3):
            _check_needs_input_grad(student, (x, w, b), needed)
    passed("Linear: backward computes only the gradients autograd asks for (ctx.needs_input_grad).")


def _subsets(n: int) -> list[tuple[bool, ...]]:
    return [s for s in itertools.product((False, True), repeat=n) if any(s)]


def _check_needs_input_grad(student, args: tuple, needed: tuple[bool, ...]) -> None:
    __tracebackhide__ = True
    args = tuple(a.detach().clone().requires_grad_(n) for a, n in zip(args, needed))
    names = [f"`{n}`" for n, k in zip(_NAMES, needed) if k]
    wanted = f"{' and '.join(names)} " + ("requires" if len(names) == 1 else "require")
    facts = introspect.record_backward(student, args)
    if facts.error is not None:
        fail(f"Linear: when only {wanted} grad, {facts.error.stage} raised {facts.error.type}: {facts.error.message}")
    expected = int(needed[0]) + int(needed[1])
    if facts.matmuls > expected:
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


# --- When to write a Function ------------------------------------------------------------

WHEN_TO_WRITE_CHOICES = ("composite", "function", "derivatives.yaml")
