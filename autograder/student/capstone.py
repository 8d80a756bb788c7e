"""Notebook 11_capstone in the student's process: the student's fused cross-entropy seen as a
function of the logits and the targets only.

The checks differentiate every floating-point tensor argument they are given. The class
weights of a cross-entropy are not differentiated (as in `F.cross_entropy`), so the checks
hand them over inside a plain `options` dict, with the reduction and the ignored index:
`as_loss(fn)(logits, target, options)` calls
`fn(logits, target, weight, reduction, ignore_index)`, with the weight on the logits'
device and in their dtype, as a caller would pass it. `with_options` runs any probe
procedure on that function, where the student's code is. Nothing here computes a loss.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from . import probe

OPTIONS = ("weight", "reduction", "ignore_index")


def as_loss(fn: Any) -> Callable[..., Any]:
    """`loss(logits, target, options)` = `fn(logits, target, weight, reduction,
    ignore_index)`, the three last taken from the dict `options` (a weight of None stays
    None; a weight tensor goes to the logits' device and dtype)."""
    call = probe.as_callable(fn)

    def loss(logits: torch.Tensor, target: torch.Tensor, options: dict) -> Any:
        weight = options.get("weight")
        if isinstance(weight, torch.Tensor):
            weight = weight.to(device=logits.device, dtype=logits.dtype)
        return call(logits, target, weight, options.get("reduction", "mean"), options.get("ignore_index", -100))

    loss.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("logits", "target", "options")]
    )
    return loss


@probe.procedure
def with_options(fn: Any, procedure: str, *args: Any) -> Any:
    """The probe procedure called `procedure` on `as_loss(fn)`."""
    if procedure not in probe.PROCEDURES:
        raise ValueError(f"not a probe procedure: {procedure!r}")
    return probe.PROCEDURES[procedure](as_loss(fn), *args)


@probe.procedure
def per_sample_grads(fn: Any, args: tuple, dims: list, weights: list) -> dict:
    """Per-sample gradients, vmap(grad(<fn(*sample), w_b>)): every argument is vmapped at its
    entry of `dims` (None: shared by all samples; integer tensors such as targets too), the
    weights along 0; the gradient is taken with respect to each floating-point tensor
    argument. Returns {"grads": [...], "error": None} or the error."""
    call = probe.as_callable(fn)
    args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    slots = [i for i, a in enumerate(args) if probe.differentiable(a)]

    def one_sample(*values: Any) -> tuple:
        sample, ws = list(values[: len(args)]), values[len(args):]

        def scalar(*tensors: torch.Tensor) -> torch.Tensor:
            for i, t in zip(slots, tensors):
                sample[i] = t
            outs = [o for o in probe.outputs_of(call(*sample)) if probe.differentiable(o)]
            if len(outs) != len(ws):
                raise TypeError(f"returned {len(outs)} floating-point tensor(s), expected {len(ws)}")
            return sum((o * w).sum() for o, w in zip(outs, ws))

        return torch.func.grad(scalar, argnums=tuple(range(len(slots))))(*[sample[i] for i in slots])

    try:
        grads = torch.func.vmap(one_sample, in_dims=tuple(dims) + (0,) * len(weights))(*args, *weights)
        return {"grads": [g.detach() for g in grads], "error": None}
    except Exception as exc:  # the student's code may raise anything
        return {"grads": None, "error": asdict(probe.ProbeError.of("vmap(grad(...))", exc))}
