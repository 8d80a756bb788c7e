"""Checks for notebook 07_double_backward."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from ..checks import explain, inputs
from ..checks.functions import FunctionSpec, check_function
from ..checks.saved import SaveRule, check_saved
from ..student import devices, double_backward, probe
from ..student.report import fail, note, passed, quiet, show
from ..student.saved import Names
from .save_for_backward import check_finite, check_outputs


def _uniform_cases(shapes: Sequence[Sequence[int]], *special: torch.Tensor):
    """One uniform random x per shape, then the `special` points among random values."""

    def cases(generator: torch.Generator) -> list[tuple]:
        return [(inputs.uniform(shape, generator),) for shape in shapes] + [(inputs.among(x, generator),)
                                                                            for x in special]

    return cases


# --- Sinh with a backward autograd can differentiate ---------------------------------------

# Exactly 0 (where cosh written as sinh(x) / tanh(x) is 0 / 0) and large magnitudes (where
# sinh(x)² overflows float64 although sinh and cosh are finite, up to |x| = 710).
SINH_SPECIAL = torch.tensor([0.0, 400.0, -400.0, 20.0, -20.0], dtype=torch.float64)
SINH_OVERFLOW = (
    "a step of your formula leaves float64's range (about 1.8e308) or divides 0 by 0, although sinh and "
    "cosh themselves are finite there: sinh(x)² overflows once |x| > 355, and sinh(x) / tanh(x) is 0 / 0 "
    "at x = 0. Compute cosh from x itself (`x.cosh()`, or the two exponentials), or from the output with "
    "a formula that does not square it (`torch.hypot`)."
)

SINH = FunctionSpec(
    name="SinhFixed", reference=torch.sinh, cases=_uniform_cases([(5,), (2, 3)], SINH_SPECIAL), double_backward=True
)


def check_sinh(student: Any, *, shapes: Sequence[Sequence[int]] = ((5,), (2, 3)), seed: int | None = 0) -> None:
    """sinh(x) with one output, whose gradient autograd can differentiate again, to every
    order (the third derivative is checked too); right at x = 0 and at large |x| too."""
    __tracebackhide__ = True
    check_finite(student, "SinhFixed", torch.sinh, SINH_SPECIAL, SINH_OVERFLOW, inputs.generator(seed))
    spec = replace(SINH, cases=_uniform_cases(shapes, SINH_SPECIAL))
    check_function(student, spec, seed=seed)
    check_third_order(student, spec, seed=seed)


# --- Every order: a backward built from torch operations is differentiable as often as asked -----

THIRD_ORDER_CAUSE = (
    "your backward is differentiable once, but not its own backward: somewhere below it a step leaves "
    "torch — a helper Function whose backward uses NumPy, `.detach()` or `@once_differentiable`, or values "
    "kept from an earlier pass. Write every order with torch operations on the saved inputs and outputs."
)


def check_third_order(student: Any, spec: FunctionSpec, *, seed: int | None = 0, claim: bool = True) -> None:
    """The third derivative of the first output, along random directions, on every case of
    `spec`: a Function that autograd can differentiate through its backward can be
    differentiated again, as often as asked. Without `claim`, on no ✔ line of its own: where
    no known mistake passes gradgradcheck and fails here (a backward that reuses the very
    Function, as SinhWithIntermediates' does through its saved outputs)."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    with quiet():
        for (x,) in spec.cases(generator):
            directions = [inputs.normal(x.shape, generator) for _ in range(3)]
            want = double_backward.third_derivative(spec.reference, x, directions)["value"]
            _judge_third(spec.name, x, want, probe.invoke(double_backward.third_derivative, student, x, directions))
    if claim:
        passed(f"{spec.name}: the third derivative agrees with the reference's too, along random directions "
               f"({len(spec.cases(inputs.generator(seed)))} input(s)): differentiable to every order.")


def _judge_third(name: str, x: torch.Tensor, want: torch.Tensor, found: Any) -> None:
    __tracebackhide__ = True
    try:
        value, order, error = found["value"], found["order"], probe.ProbeError.from_data(found["error"])
    except (KeyError, TypeError):
        raise probe.Malformed("malformed third derivative") from None
    if not isinstance(order, int) or not (value is None or isinstance(value, torch.Tensor)):
        raise probe.Malformed("malformed third derivative")
    shown = [f"x = {show(x)}", "(directions v, w, u drawn at random: d/dx <d/dx <d/dx <out, v>, w>, u>)"]
    if error is not None:
        fail(f"{name}: taking derivative {order} raised {error.type}: {error.message.strip().splitlines()[0]}",
             *shown, cause=THIRD_ORDER_CAUSE)
    if value is None:
        fail(f"{name}: derivative {order} is not connected to x: autograd could not differentiate that far.",
             *shown, f"expected {show(want)}", cause=THIRD_ORDER_CAUSE)
    if value.shape != want.shape:
        fail(f"{name}: the third derivative has shape {tuple(value.shape)[:8]}, expected {tuple(want.shape)}.", *shown,
             cause=THIRD_ORDER_CAUSE)
    value = value.to(want.dtype).cpu()
    if not torch.allclose(value, want, rtol=1e-6, atol=1e-9):
        fail(f"{name}: the third derivative differs from the reference's.", *shown,
             *explain.differ(want, value, rtol=1e-6, atol=1e-9), cause=THIRD_ORDER_CAUSE)


# --- Sinh that returns its intermediates as extra outputs (the PyTorch tutorial's fix) -------

def _sinh_intermediates(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.sinh(x), torch.exp(x), torch.exp(-x)


def _sinh_intermediates_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    return (
        "backward receives one gradient per output, and x reaches all three: grad_x = grad_out * cosh(x) "
        "+ grad_expx * d exp(x)/dx + grad_expnegx * d exp(-x)/dx, where d exp(-x)/dx = -exp(-x). Without "
        "the last two terms backward is right only while nobody uses expx and expnegx (their gradients "
        "are then zeros); the double backward, and any caller who uses them, sends gradients through them."
    )


SINH_INTERMEDIATES_SPECIAL = torch.tensor([0.0, 1.0, -1.5], dtype=torch.float64)

SINH_INTERMEDIATES = FunctionSpec(
    name="SinhWithIntermediates",
    reference=_sinh_intermediates,
    cases=_uniform_cases([(5,), (2, 3)], SINH_INTERMEDIATES_SPECIAL),
    double_backward=True,
    hint=_sinh_intermediates_hint,
)

SINH_INTERMEDIATES_SAVES = SaveRule(
    name="SinhWithIntermediates",
    expected=("output 1", "output 2"),
    fix="save exactly the two exponentials you return, the very tensors forward returns as outputs 1 and 2",
    names=Names(
        args=("x",),
        outputs=("out", "expx", "expnegx"),
        known={"exp(x)": torch.exp, "exp(-x)": lambda x: torch.exp(-x), "cosh(x)": torch.cosh},
    ),
    reasons={
        "intermediate": "a tensor forward does not return is a constant to autograd, even with the values of "
        "an output: a copy (`expx.clone()`) or a second `torch.exp(x)` breaks the double backward again, "
        "and costs memory. Save the tensors you return.",
        "input": "the exponentials are returned so that backward can reuse them: saving x makes backward "
        "compute them again (exercise 7.1's way, not this one's).",
        "output": "backward needs only the two exponentials: cosh(x) = (exp(x) + exp(-x)) / 2.",
    },
)


def check_sinh_intermediates(
    student: Any, *, shapes: Sequence[Sequence[int]] = ((5,), (2, 3)), seed: int | None = 0
) -> None:
    """SinhWithIntermediates(x) -> (sinh(x), exp(x), exp(-x)), saving its two extra outputs,
    with a backward that takes all three gradients and can be differentiated again."""
    __tracebackhide__ = True
    cases = _uniform_cases(shapes, SINH_INTERMEDIATES_SPECIAL)
    for args in cases(inputs.generator(seed))[:1]:
        check_outputs(
            student, "SinhWithIntermediates", devices.prepare(args, "cpu"), ("out", "expx", "expnegx"),
            non_differentiable=(
                "expx and expnegx must stay differentiable: backward saves them, and a saved output marked "
                "non-differentiable comes back without a graph, so the double backward cannot go through it. "
                "Do not pass them to ctx.mark_non_differentiable."
            ),
        )
    passed("SinhWithIntermediates returns three tensors (out, expx, expnegx), each with a grad_fn.")
    for device in devices.available():
        for args in cases(inputs.generator(seed))[:2]:
            recording = check_saved(student, SINH_INTERMEDIATES_SAVES, devices.prepare(args, device))
    passed(f"SinhWithIntermediates saves exactly expx and expnegx, its outputs ({recording.nbytes} bytes for x "
           f"of shape {tuple(recording.args[0].shape)}), nothing on ctx.")
    spec = replace(SINH_INTERMEDIATES, cases=cases)
    check_function(student, spec, seed=seed)
    check_third_order(student, spec, seed=seed, claim=False)


# --- CubeBackward: the backward of a backward autograd cannot see ---------------------------

def _cube_backward_hint(args: tuple, i: int, wrong: torch.Tensor) -> str | None:
    if i == 0:
        return (
            "CubeBackward computes grad_out * 3x², so the gradient it returns for `grad_out` "
            "is the incoming gradient times 3x²."
        )
    return (
        "CubeBackward computes grad_out * 3x², so the gradient it returns for `x` is the "
        "incoming gradient times grad_out * 6x (the saved grad_out, not the incoming gradient)."
    )


def _cube_backward_cases(shapes: Sequence[Sequence[int]]):
    """grad_out and x of each shape; x = 0 in every draw (where 6x and 3x² vanish, and a formula
    that divides by x is 0/0)."""

    def cases(generator: torch.Generator) -> list[tuple]:
        return [(inputs.normal(shape, generator), inputs.including(inputs.uniform(shape, generator), [0.0], generator))
                for shape in shapes]

    return cases


CUBE_BACKWARD = FunctionSpec(
    name="CubeBackward",
    reference=lambda grad_out, x: grad_out * 3 * x**2,
    cases=_cube_backward_cases([(5,), (2, 3)]),
    hint=_cube_backward_hint,
    double_backward=True,  # Cube's third derivative: its backward's backward must stay in torch too
)


def check_cube_backward(
    student: type[torch.autograd.Function],
    *,
    shapes: Sequence[Sequence[int]] = ((5,), (2, 3)),
    seed: int | None = 0,
) -> None:
    """CubeBackward(grad_out, x) = grad_out * 3x², with both of its gradients, differentiable
    again.

    Cube's double backward is CubeBackward's backward, so CubeBackward's gradcheck is
    Cube's gradgradcheck, and CubeBackward's gradgradcheck is Cube's third derivative.
    """
    __tracebackhide__ = True
    check_function(student, replace(CUBE_BACKWARD, cases=_cube_backward_cases(shapes)), seed=seed)
    note("(CubeBackward's double backward is Cube's third derivative: it is right too, at x = 0 included.)")


# --- Hessian-vector products ---------------------------------------------------------------

Scalar = Callable[[torch.Tensor], torch.Tensor]

def _hvp_functions(n: int, generator: torch.Generator) -> list[tuple[str, Callable, list[torch.Tensor]]]:
    """(description, f, params) of scalar functions f(x, *params); A and W are fixed random matrices."""
    a = inputs.normal((n, n), generator)
    w = inputs.normal((3, n), generator)
    return [
        ("f(x) = (x.sin() * x).sum()", double_backward.SIN_X, []),
        ("f(x) = x·A·x / 2 + (x**4).sum(), A not symmetric", double_backward.QUADRATIC, [a]),
        ("f(x) = torch.logsumexp(W @ x, 0)", double_backward.LOGSUMEXP, [w]),
        ("f(x) = Cube.apply(x).sin().sum(), Cube a custom Function", double_backward.CUBE_SIN, []),
    ]


def _reference(f: Scalar, x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(H v, H·ones, gradient) from the full Hessian: a slow but independent oracle."""
    n = x.numel()
    h = torch.autograd.functional.hessian(f, x).reshape(n, n)
    x_ = x.detach().requires_grad_()
    (g,) = torch.autograd.grad(f(x_), x_)
    return (h @ v.flatten()).reshape(x.shape), h.sum(1).reshape(x.shape), g


@dataclass
class _HvpCall:
    """What hvp(f, x, v) did. Only `value` is checked by the grader; the other facts are
    gathered in the student's process, so they are best effort."""

    value: torch.Tensor | None  # what hvp returned, if a tensor
    type: str  # the type of what it returned
    error: probe.ProbeError | None  # what it raised
    f_had_graph: bool  # every f(x) it computed required grad
    x_changed: bool  # the caller's x lost or gained requires_grad, got a .grad, or changed values
    backward_passes: int  # how many backward passes reached the x that hvp gave f

    @staticmethod
    def from_data(data: Any) -> "_HvpCall":
        try:
            fields = dict(data)
            error = probe.ProbeError.from_data(fields.pop("error"))
            found = _HvpCall(**fields, error=error)
        except (KeyError, TypeError, ValueError) as bad:
            raise probe.Malformed(f"malformed hvp call: {bad}") from None
        if not (
            (found.value is None or isinstance(found.value, torch.Tensor)) and isinstance(found.type, str)
            and isinstance(found.f_had_graph, bool) and isinstance(found.x_changed, bool)
            and isinstance(found.backward_passes, int)
        ):
            raise probe.Malformed("malformed hvp call")
        return found


def _hvp_error(error: probe.ProbeError, f_had_graph: bool) -> tuple[str, str | None]:
    message = error.message
    first = message.strip().splitlines()[0] if message.strip() else error.type
    what = f"hvp raised {error.type}: {first}"
    if error.type == "NotImplementedError":
        return "hvp raised NotImplementedError", explain.NOT_IMPLEMENTED
    if "does not require grad and does not have a grad_fn" in message and not f_had_graph:
        return what, (
            "f(x) has no graph because `x` does not require grad: differentiate with respect "
            "to a copy that does, `x = x.detach().requires_grad_()`."
        )
    if "does not require grad and does not have a grad_fn" in message:
        return what, (
            "the gradient you differentiate the second time has no graph: compute it with "
            "`torch.autograd.grad(..., create_graph=True)` and do not detach it."
        )
    if "One of the differentiated Tensors does not require grad" in message:
        return what, (
            "`x` does not require grad: differentiate with respect to a copy that does, "
            "`x = x.detach().requires_grad_()`."
        )
    if any(m in message for m in ("cannot be multiplied", "1D tensors expected", "inconsistent tensor size",
                                     "size mismatch")):
        return what, (
            "`g @ v` (or torch.dot) is the dot product only when x is a vector. For x of any shape, give v "
            "as grad_outputs, `torch.autograd.grad(g, x, grad_outputs=v)`, or differentiate `(g * v).sum()`."
        )
    if "setup_context" in message:
        return what, (
            "f contains a classic autograd.Function, which torch.func cannot transform "
            "(notebook 10): use torch.autograd.grad twice."
        )
    return what, None


def _hvp_cause(actual, want, ones, grad, *, rtol: float, atol: float) -> str | None:
    def close(a, b):
        return bool(torch.allclose(a, b, rtol=rtol, atol=atol))

    if close(actual, ones):
        return (
            "this is H times a vector of ones: the second backward must use v as its "
            "grad_outputs, `torch.autograd.grad(g, x, grad_outputs=v)` (not `g.sum()`)."
        )
    if close(actual, grad):
        return "this is the gradient of f, not H v: differentiate the gradient once more, with v."
    if close(actual, grad + want):
        return (
            "this is the gradient plus H v: `.backward()` adds into `x.grad`, so both backward "
            "passes landed there. Use torch.autograd.grad, which returns the gradients instead."
        )
    return explain.gradient_cause(want, actual, None, rtol=rtol, atol=atol)


def _check_hvp_once(
    hvp: Any, label: str, f: Callable, params: list[torch.Tensor], x: torch.Tensor, v: torch.Tensor,
    rtol: float, atol: float,
) -> None:
    __tracebackhide__ = True
    want, ones, grad = _reference(lambda x: f(x, *params), x, v)
    shown = [label, f"x = {show(x)}", f"v = {show(v)}"]
    call = _HvpCall.from_data(probe.invoke(double_backward.call_hvp, hvp, f, params, x, v))
    if call.error is not None:
        what, cause = _hvp_error(call.error, call.f_had_graph)
        fail(f"{what}.", *shown, cause=cause)
    if call.x_changed:
        fail(
            "hvp changed the caller's x (its requires_grad, its .grad or its values).", *shown,
            cause="work on a copy: `x = x.detach().requires_grad_()` at the start of hvp.",
        )
    actual = call.value
    if actual is None or actual.shape != x.shape:
        got = call.type if actual is None else f"shape {tuple(actual.shape)}"
        fail(f"hvp must return a tensor of the shape of x, {tuple(x.shape)}; got {got}.", *shown)
    actual = actual.detach().to(want.device, want.dtype)
    if not torch.allclose(actual, want, rtol=rtol, atol=atol):
        fail(
            "hvp(f, x, v) differs from H v.", *shown, *explain.differ(want.cpu(), actual.cpu(), rtol=rtol, atol=atol),
            cause=_hvp_cause(actual, want, ones, grad, rtol=rtol, atol=atol),
        )
    if call.backward_passes > 2:
        fail(
            f"hvp ran {call.backward_passes} backward passes through f for an x of "
            f"{x.numel()} elements: it builds the whole Hessian, one backward pass per entry.",
            *shown,
            cause="an HVP needs two backward passes whatever the size of x: the gradient with "
            "create_graph=True, then one backward of that gradient with v as grad_outputs.",
        )


def check_hvp(
    hvp: Callable[[Scalar, torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    shapes: Sequence[Sequence[int]] = ((5,), (2, 3)),
    x_requires_grad: bool = False,
    seed: int | None = 0,
    rtol: float = 1e-6,
    atol: float = 1e-9,
) -> None:
    """hvp(f, x, v) = H(x) v for scalar functions f (some built from custom Functions)."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    count = 0
    with quiet():
        for shape in shapes:
            functions = _hvp_functions(math.prod(shape), generator)
            x = inputs.uniform(shape, generator, -1.5, 1.5)
            v = inputs.normal(shape, generator)
            for device in devices.available():
                for label, f, params in functions:
                    x_ = x.to(device).clone().requires_grad_(x_requires_grad)
                    params_ = [p.to(device) for p in params]
                    _check_hvp_once(hvp, label, f, params_, x_, v.to(device), rtol, atol)
                    count += 1
    passed(
        f"hvp: H v agrees with the full Hessian for {count} function(s), without building the "
        f"Hessian, and leaves x untouched (float64, {', '.join(devices.available())})."
    )
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


# --- Reading the graphs --------------------------------------------------------------------

GRAPH_QUESTIONS = "abcdefghij"
GRAPH_CHOICES = (
    "x", "out", "grad_x", "grad_out", "None",
    "AccumulateGrad", "MulBackward0", "TanhBackward", "CubeBackward", "CubeBackwardBackward",
    "0", "1", "2", "3", "4",
)
