"""Notebook 05_gradcheck in the student's process: the functions the checks hand to the
student's code (registered, so they cross processes by name), running that code, and
the cases exercise 5.3 shows gradcheck's messages for.

Among the functions are Functions with deliberately wrong backwards, for the student's
gradcheck to catch; none is an answer to an exercise.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import torch

from . import probe

# torch.autograd.gradcheck is also the name of the function, which hides the module.
_torch_gradcheck = sys.modules["torch.autograd.gradcheck"]


def _handed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register `fn`, a function the checks hand to student code: it crosses processes by name."""
    return probe.reference(f"{__name__}:{name}", fn)


def _torch_numerical_jacobian(f: Callable[..., Any], inputs: Sequence[torch.Tensor],
                              eps: float = 1e-6) -> list[list[torch.Tensor]]:
    """numerical_jacobian's layout (J[i][j]: output i, input j) from torch's own central
    differences, which stand in for the notebook's while mini_gradcheck is graded."""
    leaves = tuple(x.detach().clone().requires_grad_() for x in inputs)
    by_input = _torch_gradcheck._get_numerical_jacobian(f, leaves, eps=eps)
    return [list(row) for row in zip(*by_input)]


torch_numerical_jacobian = _handed("torch_numerical_jacobian", _torch_numerical_jacobian)

class _OneWrongEntry(torch.autograd.Function):
    """(2 x, x @ w), whose backward is wrong in one entry of d(x @ w)/dw, J[1][1][row, col],
    by `error` (0.5 or -0.5: too large or too small)."""

    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, row: Any, col: Any, error: Any) -> Any:
        ctx.save_for_backward(x, w)
        ctx.row, ctx.col, ctx.error = row, col, error
        return 2 * x, x @ w

    @staticmethod
    def backward(ctx: Any, grad_double: Any, grad_product: Any) -> Any:
        x, w = ctx.saved_tensors
        grad_w = x.T @ grad_product
        grad_w.view(-1)[ctx.row] += ctx.error * grad_product.reshape(-1)[ctx.col]
        return 2 * grad_double + grad_product @ w.T, grad_w, None, None, None


def _elementwise(name: str, forward: Callable[..., Any], derivative: Callable[..., Any], *,
                 chain_rule: bool = True) -> type[torch.autograd.Function]:
    """An elementwise Function: forward(x), and a backward that returns
    grad_output * derivative(x) (or, without the chain rule, derivative(x) alone)."""

    class Elementwise(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            ctx.save_for_backward(x)
            return forward(x)

        @staticmethod
        def backward(ctx: Any, grad_output: Any) -> Any:
            (x,) = ctx.saved_tensors
            return grad_output * derivative(x) if chain_rule else derivative(x)

    Elementwise.__name__ = Elementwise.__qualname__ = name
    return Elementwise


def _tanh_derivative(x: torch.Tensor) -> torch.Tensor:
    return 1 - x.tanh() ** 2


_WRONG_BACKWARD = _elementwise("ExpWithWrongBackward", torch.exp, lambda x: x.exp() + 0.5)


# numerical_jacobian's functions
EXP_WITH_WRONG_BACKWARD = _handed("exp_with_wrong_backward", _WRONG_BACKWARD.apply)
EXP_1_5X = _handed("exp_1_5x", lambda x: (1.5 * x).exp())
MATMUL = _handed("matmul", lambda x, w: x @ w)
SIN_CUMSUM = _handed("sin_cumsum", lambda x: x.sin().cumsum(0))
PRODUCT_AND_DISTANCE = _handed("product_and_distance", lambda x, y: (x * y, (x - y).pow(2).sum()))
SCALED_CUMSUM = _handed("scaled_cumsum", lambda x, s: s * x.cumsum(0))
# mini_gradcheck's functions; one OneWrongEntry per wrong entry (row, col), drawn at random
TANH = _handed("tanh", lambda x: torch.tanh(x))
SIN_AND_PRODUCT = _handed("sin_and_product", lambda x, y: (x.sin(), x * y))
# mini_gradcheck's wrong Functions come with errors of both signs: a test that looks at one
# side of the error (analytical above numerical, say) misses half of them.
ONE_WRONG_ENTRY = {
    (row, col, error): _handed(f"one_wrong_entry_{row}_{col}_{error:+g}",
                               lambda x, w, row=row, col=col, error=error:
                               _OneWrongEntry.apply(x, w, row, col, error))  # type: ignore[no-untyped-call]
    for row in range(6) for col in range(4) for error in (0.5, -0.5)
}
TANH_IGNORES_GRAD_OUTPUT = _handed(
    "tanh_ignores_grad_output",
    _elementwise("TanhIgnoresGradOutput", torch.tanh, _tanh_derivative, chain_rule=False).apply,
)
TANH_OFF_BY = {
    k: _handed(f"tanh_off_by_{k:g}",
               _elementwise(f"TanhOffBy{k:g}", torch.tanh, lambda x, k=k: _tanh_derivative(x) * (1 + k)).apply)
    for k in (5e-4, 5e-3, -5e-3)
}
EXP_2X = _handed("exp_2x", lambda x: (2 * x).exp())
# Elementwise Functions whose backward is the derivative plus a known error.
APPROX_EXP = _handed("approx_exp", _elementwise(
    "ApproxExp", torch.exp, lambda x: x.exp() - 1e-4 / (1 + x * x)).apply)
APPROX_SIN2 = _handed("approx_sin2", _elementwise(
    "ApproxSin2", lambda x: (2 * x).sin(), lambda x: 2 * (2 * x).cos() + 3e-4 * x * (5 * x).sin()).apply)
APPROX_SOFTPLUS = _handed("approx_softplus", _elementwise(
    "ApproxSoftplus", torch.nn.functional.softplus, lambda x: torch.sigmoid(x) + 2e-5 * x * x).apply)


# --- Running the student's code -------------------------------------------------------

REPORT_FIELDS = ("output", "input", "row", "col", "numerical", "analytical")  # of a JacobianMismatch


def transposed_view(x: torch.Tensor) -> torch.Tensor:
    """`x`'s values, as a leaf laid out in memory like a transposed view (not contiguous)."""
    return x.detach().mT.contiguous().mT.requires_grad_(x.requires_grad)


@probe.procedure
def attempted(student: Callable[..., Any], f: Callable[..., Any], inputs: Any, rest: tuple[Any, ...],
              options: dict[str, Any], strided: tuple[Any, ...] = ()) -> dict[str, Any]:
    """Run `student(f, inputs, *rest, **options)`: its value or what it raised, and
    `inputs` afterwards; the inputs at the positions in `strided` (2-d) are handed over
    laid out as transposed views, which no wire format keeps. Best effort: the exception's
    type, message and JacobianMismatch fields are as the student's code made them."""
    if strided:
        inputs = type(inputs)(transposed_view(x) if j in strided else x for j, x in enumerate(inputs))
    value, raised = None, None
    try:
        value = student(f, inputs, *rest, **options)
    except Exception as exc:  # the student's code may raise anything
        raised = _described(exc)
    return {"value": value, "raised": raised, "inputs": inputs}


def _described(exc: Exception) -> dict[str, Any]:
    mismatch = all(hasattr(exc, name) for name in REPORT_FIELDS)
    report = {name: _plain(getattr(exc, name)) for name in REPORT_FIELDS} if mismatch else None
    return {"type": type(exc).__name__, "message": str(exc), "type_error": isinstance(exc, TypeError),
            "not_implemented": isinstance(exc, NotImplementedError), "report": report}


def _plain(value: Any) -> Any:
    """A field of a JacobianMismatch as plain data: numbers and tensors as they are, else its repr."""
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    return repr(value)


# --- Exercise 5.3's cases: gradcheck failures to diagnose from their messages -------------

class _Normalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        s = x.sum()
        ctx.save_for_backward(s)
        return x / s

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        (s,) = ctx.saved_tensors
        return grad_output / s


class _Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        (x,) = ctx.saved_tensors
        return 3 * x**2


_A = torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 3.0], [4.0, 0.0, 1.0]], dtype=torch.float64)


class _MatVec(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return _A @ x

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        return _A @ grad_output


def diagnosis_cases() -> dict[str, tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]]:
    """{question: (what is checked, function, inputs, gradcheck options)}; the code stays
    hidden so that the message is all there is to read."""

    def x(*values: float, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor]:
        return (torch.tensor(values, dtype=dtype, requires_grad=True),)

    return {
        "a": ("a Function for x / x.sum()", _Normalize.apply, x(0.5, 1.0, 1.5), {}),
        "b": ("torch.tanh", torch.tanh, x(0.3, -1.2, 0.8, dtype=torch.float32), {}),
        "c": ("a Function for x ** 3", _Cube.apply, x(0.5, -1.0, 2.0), {}),
        "d": ("lambda x: x.amax()", lambda t: t.amax(), x(2.0, 2.0, 2.0), {}),
        "e": ("a Function for A @ x, A a fixed 3 x 3 matrix", _MatVec.apply, x(0.3, -0.5, 1.2), {}),
        "f": ("torch.exp", torch.exp, x(0.3, -0.5, 1.2), {"eps": 1e-14}),
        "g": ("lambda x: x.clamp(-1, 1)", lambda t: t.clamp(-1, 1), x(0.3, 1.0, -0.4), {}),
    }
