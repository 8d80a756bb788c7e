"""Notebook 07_double_backward in the student's process: the scalar functions the
student's hvp is tried on (registered: they cross processes by name), and the procedure
that calls hvp and reports what it did (best effort)."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

import torch

from . import probe


class Cube(torch.autograd.Function):
    """x³ as a custom Function; its backward is built from torch operations, so autograd
    can differentiate it again."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx: Any, grad_out: Any) -> Any:
        (x,) = ctx.saved_tensors
        return grad_out * 3 * x**2


# The functions hvp is tested on, as f(x, *params): they cross to the student's process by
# name (the params, fixed random matrices, as tensors), where f(x) = f(x, *params) is built.
SIN_X = probe.reference(f"{__name__}:sin_x", lambda x: (x.sin() * x).sum())
QUADRATIC = probe.reference(f"{__name__}:quadratic", lambda x, a: x.flatten() @ a @ x.flatten() / 2 + (x**4).sum())
LOGSUMEXP = probe.reference(f"{__name__}:logsumexp", lambda x, w: torch.logsumexp(w @ x.flatten(), 0))
CUBE_SIN = probe.reference(f"{__name__}:cube_sin",
                           lambda x: Cube.apply(x).sin().sum())  # type: ignore[no-untyped-call]


@probe.procedure
def call_hvp(hvp: Any, f: Callable[..., Any], params: list[Any], x: torch.Tensor, v: torch.Tensor) -> dict[str, Any]:
    """hvp(f(·, *params), x, v), and what it did to x and with f: whether every f(x) it
    computed had a graph, whether the caller's x changed, and how many backward passes
    reached the tensors it gave f (two for an HVP, one per entry more for a Hessian)."""
    values, hooks = [], []  # what f returned to the student's code; hooks counting passes
    passes = [0]

    def count(grad: torch.Tensor) -> None:
        passes[0] += 1

    def traced(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            hooks.append(x.register_hook(count))
        values.append(f(x, *params))
        return values[-1]

    before, requires_grad = x.detach().clone(), x.requires_grad
    value, error = None, None
    try:
        value = hvp(traced, x, v)
    except Exception as exc:  # the student's code may raise anything
        error = asdict(probe.ProbeError.of("call", exc))
    finally:
        for hook in hooks:
            hook.remove()
    return {
        "value": value if isinstance(value, torch.Tensor) else None,
        "type": type(value).__name__,
        "error": error,
        "f_had_graph": all(isinstance(y, torch.Tensor) and y.requires_grad for y in values),
        "x_changed": x.requires_grad != requires_grad or x.grad is not None or not torch.equal(x.detach(), before),
        "backward_passes": passes[0],
    }


@probe.procedure
def third_derivative(fn: Any, x: torch.Tensor, directions: list[Any]) -> dict[str, Any]:
    """The third derivative of `fn`'s first output along the directions (v, w, u):
    d/dx <d/dx <d/dx <fn(x), v>, w>, u>, autograd differentiating the student's backward,
    and the backward of that backward. {"value": a tensor, or None with "order": the
    derivative that could not be taken (2 or 3), and "error": why}."""
    v, w, u = directions
    x = x.detach().clone().requires_grad_()
    found, order = None, 1
    try:
        out = probe.as_callable(fn)(x)
        found = out[0] if isinstance(out, (tuple, list)) else out
        for order, direction in ((1, v), (2, w), (3, u)):
            if not (isinstance(found, torch.Tensor) and found.requires_grad):
                return {"value": None, "order": order, "error": None}  # no graph to differentiate
            (found,) = torch.autograd.grad(found, x, direction, create_graph=order < 3, allow_unused=True)
            if found is None:
                return {"value": None, "order": order, "error": None}  # not connected to x
    except Exception as exc:  # the student's code may raise anything
        return {"value": None, "order": order, "error": asdict(probe.ProbeError.of("backward", exc))}
    return {"value": found.detach(), "order": 3, "error": None}
