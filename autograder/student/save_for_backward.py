"""Notebook 06_save_for_backward in the student's process: the small Functions the
student's saved_by and kept_alive are tried on (registered: handed to student code by
name), and the procedures that run the student's Functions and report what they did
(07_double_backward uses `outputs_report` too).

What these procedures report is observed in the student's process: best effort.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

import torch

from . import probe
from .saved import non_leaf

# --- saved_by's examples: each saves something different ----------------------------------

class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


class Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        (y,) = ctx.saved_tensors
        return grad_output * y


class SinhIntermediates(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        ex, enx = x.exp(), (-x).exp()
        ctx.save_for_backward(ex, enx)
        return (ex - enx) / 2

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        ex, enx = ctx.saved_tensors
        return grad_output * (ex + enx) / 2


class SquareTail(torch.autograd.Function):
    """x[1:] ** 2: saves x[1:], a view that starts one element into x's memory."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        tail = x[1:]
        ctx.save_for_backward(tail)
        return tail * tail

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        (tail,) = ctx.saved_tensors
        grad = tail.new_zeros((tail.shape[0] + 1, *tail.shape[1:]))
        grad[1:] = 2 * tail * grad_output
        return grad


class ReLUMask(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        mask = x > 0
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        (mask,) = ctx.saved_tensors
        return grad_output * mask


class Mul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: Any, b: Any) -> Any:
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        a, b = ctx.saved_tensors
        return grad_output * b, grad_output * a


class TopTwo(torch.autograd.Function):
    """The two largest entries along dim 0, and where they are."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        values, indices = x.topk(2, 0)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        ctx.shape = x.shape
        return values, indices

    @staticmethod
    def backward(ctx: Any, grad_values: Any, grad_indices: Any) -> Any:
        (indices,) = ctx.saved_tensors
        return grad_values.new_zeros(ctx.shape).scatter_add(0, indices, grad_values)


class ExpInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        x.exp_()
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)  # the output, in the input's memory
        return x

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        (y,) = ctx.saved_tensors
        return grad_output * y


class ExpOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        ctx.y = x.exp()
        return ctx.y

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        return grad_output * ctx.y


class RowOfOuter(torch.autograd.Function):
    """exp(x[0] + x), computed as row 0 of the n x n outer product exp(x) exp(x)ᵀ, which it
    saves: a view that keeps all n² numbers of the product alive."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        e = x.reshape(-1).exp()
        row = (e[:, None] * e[None, :])[0]
        ctx.save_for_backward(row)
        ctx.shape = x.shape
        return (row * 1).reshape(x.shape)

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        (row,) = ctx.saved_tensors
        grad = grad_output.reshape(-1) * row  # d row_k / d x_k = row_k
        first = torch.zeros_like(grad)
        first[0] = grad.sum()  # and every row_k depends on x[0]
        return (grad + first).reshape(ctx.shape)


class SavesTwice(torch.autograd.Function):
    """exp(x), saving e = exp(x) (a copy, so an intermediate) and its view e[1:]: two saved
    tensors, one block of memory."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        e = x.exp()
        ctx.save_for_backward(e, e[1:])
        return e * 1

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        e, _ = ctx.saved_tensors
        return grad_output * e


for _function in (Square, Exp, SinhIntermediates, SquareTail, ReLUMask, Mul, TopTwo, ExpInPlace, ExpOnCtx,
                  RowOfOuter, SavesTwice):  # handed to the student's saved_by and kept_alive
    probe.reference(f"{__name__}:{_function.__name__}", _function)


@probe.procedure
def saved_by_result(student: Callable[..., Any], fn: type[torch.autograd.Function], args: tuple[Any, ...],
                    copy: bool) -> dict[str, Any]:
    """student(fn, *args), the student's saved_by or kept_alive (on non-leaf copies of the
    arguments with `copy`): its result as it is, or its error."""
    try:
        return {"value": student(fn, *(non_leaf(args) if copy else args)), "error": None}
    except Exception as exc:  # the student's code may raise anything
        return {"value": None, "error": asdict(probe.ProbeError.of("call", exc))}


@probe.procedure
def apply_in_place(function: type[torch.autograd.Function], leaf: torch.Tensor) -> dict[str, Any]:
    """Apply `function` to x = leaf * 1 (a non-leaf): its error, whether x changed, and
    whether it returned "x" itself, "a view of x" or "something else" (best effort)."""
    x = leaf * 1  # in-place operations on a leaf that requires grad are refused
    before = x.detach().clone()
    try:
        y = function.apply(x)
    except Exception as exc:  # the student's code may raise anything
        error = asdict(probe.ProbeError.of("forward", exc))
        return {"error": error, "modified": False, "returned": None}
    same_memory = isinstance(y, torch.Tensor) and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    returned = "x" if y is x else "a view of x" if same_memory else "something else"
    return {"error": None, "modified": not torch.equal(x.detach(), before), "returned": returned}


@probe.procedure
def on_a_clone(function: type[torch.autograd.Function], procedure: str, *args: Any) -> Any:
    """The probe procedure called `procedure` on `x -> function.apply(x.clone())`."""

    def tanh_(x: torch.Tensor) -> Any:
        return function.apply(x.clone())

    return probe.PROCEDURES[procedure](tanh_, *args)


@probe.procedure
def outputs_report(function: type[torch.autograd.Function], args: tuple[Any, ...]) -> dict[str, Any]:
    """`function.apply(*args)`: its error, the name of its result's type and, for a tuple
    of tensors, (dtype, has a grad_fn) for each (best effort)."""
    try:
        result = function.apply(*args)
    except Exception as exc:  # the student's code may raise anything
        error = asdict(probe.ProbeError.of("forward", exc))
        return {"error": error, "type": None, "outputs": None}
    tensors = isinstance(result, tuple) and all(isinstance(t, torch.Tensor) for t in result)
    outputs = [(str(t.dtype), t.grad_fn is not None) for t in result] if tensors else None
    return {"error": None, "type": type(result).__name__, "outputs": outputs}
