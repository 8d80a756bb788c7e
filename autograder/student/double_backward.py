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
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * 3 * x**2


# The functions hvp is tested on, as f(x, *params): they cross to the student's process by
# name (the params, fixed random matrices, as tensors), where f(x) = f(x, *params) is built.
SIN_X = probe.reference(f"{__name__}:sin_x", lambda x: (x.sin() * x).sum())
QUADRATIC = probe.reference(f"{__name__}:quadratic", lambda x, a: x.flatten() @ a @ x.flatten() / 2 + (x**4).sum())
LOGSUMEXP = probe.reference(f"{__name__}:logsumexp", lambda x, w: torch.logsumexp(w @ x.flatten(), 0))
CUBE_SIN = probe.reference(f"{__name__}:cube_sin", lambda x: Cube.apply(x).sin().sum())


@probe.procedure
def call_hvp(hvp: Any, f: Callable, params: list, x: torch.Tensor, v: torch.Tensor) -> dict:
    """hvp(f(·, *params), x, v), and what it did to x and with f: whether every f(x) it
    computed had a graph, whether the caller's x changed, and how many backward passes
    reached the tensors it gave f (two for an HVP, one per entry more for a Hessian)."""
    values, hooks = [], []  # what f returned to the student's code; hooks counting passes
    passes = [0]

    def count(grad: torch.Tensor) -> None:
        passes[0] += 1

    def traced(x):
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
