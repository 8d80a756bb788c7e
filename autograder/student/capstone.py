"""The capstone (notebooks 11_capstone and 11_capstone_extension) in the student's process:
the student's losses seen as functions of their tensors only, and a meter of the memory they
use.

The checks differentiate every floating-point tensor argument they are given. The class
weights of a cross-entropy are not differentiated (as in `F.cross_entropy`), so the checks
hand them over inside a plain `options` dict, with the other settings:
`as_loss(fn)(logits, target, options)` calls `fn(logits, target, weight, reduction,
ignore_index)`, with the weight on the logits' device and in their dtype, as a caller
would pass it; `as_linear_loss(fn)(hidden, weight, target, options)` calls `fn(hidden,
weight, target, reduction, ignore_index, chunk_size)`. With `options["strided"]`, the
floating-point tensors reach the student's code laid out in memory as after a transpose
(not contiguous), with the same values. `with_options` runs any probe procedure on such a
function, where the student's code is. `memory_run` measures what a call allocates, keeps
and leaves behind. Nothing here computes a loss.
"""
from __future__ import annotations

import gc
import inspect
import weakref
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from . import probe
from .memory import PeakMemory


def _signature(*names: str) -> inspect.Signature:
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])


def _laid_out(t: Any, options: dict[str, Any]) -> Any:
    """`t` not contiguous (its values unchanged, its gradient flowing back) when the options say so."""
    if options.get("strided") and probe.differentiable(t):
        return probe.laid_out(t, "strided")
    return t


def as_loss(fn: Any) -> Callable[..., Any]:
    """`loss(logits, target, options)` = `fn(logits, target, weight, reduction,
    ignore_index)`, the three last taken from the dict `options` (a weight of None stays
    None; a weight tensor goes to the logits' device and dtype)."""
    call = probe.as_callable(fn)

    def loss(logits: torch.Tensor, target: torch.Tensor, options: dict[str, Any]) -> Any:
        weight = options.get("weight")
        if isinstance(weight, torch.Tensor):
            weight = weight.to(device=logits.device, dtype=logits.dtype)
        return call(_laid_out(logits, options), target, weight, options.get("reduction", "mean"),
                    options.get("ignore_index", -100))

    loss.__signature__ = _signature("logits", "target", "options")  # type: ignore[attr-defined]
    return loss


def as_linear_loss(fn: Any) -> Callable[..., Any]:
    """`loss(hidden, weight, target, options)` = `fn(hidden, weight, target, reduction,
    ignore_index, chunk_size)`, the three last taken from the dict `options`."""
    call = probe.as_callable(fn)

    def loss(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, options: dict[str, Any]) -> Any:
        return call(_laid_out(hidden, options), _laid_out(weight, options), target, options.get("reduction", "mean"),
                    options.get("ignore_index", -100), options["chunk_size"])

    loss.__signature__ = _signature("hidden", "weight", "target", "options")  # type: ignore[attr-defined]
    return loss


ADAPTERS = {"cross_entropy": as_loss, "linear_cross_entropy": as_linear_loss}


@probe.procedure
def with_options(fn: Any, adapter: str, procedure: str, *args: Any) -> Any:
    """The probe procedure called `procedure` on `ADAPTERS[adapter](fn)`."""
    if procedure not in probe.PROCEDURES:
        raise ValueError(f"not a probe procedure: {procedure!r}")
    if adapter not in ADAPTERS:
        raise ValueError(f"not an adapter: {adapter!r}")
    return probe.PROCEDURES[procedure](ADAPTERS[adapter](fn), *args)


@probe.procedure
def per_sample_grads(fn: Any, args: tuple[Any, ...], dims: list[Any], weights: list[Any]) -> dict[str, Any]:
    """Per-sample gradients, vmap(grad(<fn(*sample), w_b>)): every argument is vmapped at its
    entry of `dims` (None: shared by all samples; integer tensors such as targets too), the
    weights along 0; the gradient is taken with respect to each floating-point tensor
    argument. Returns {"grads": [...], "error": None} or the error."""
    call = probe.as_callable(fn)
    args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    slots = [i for i, a in enumerate(args) if probe.differentiable(a)]

    def one_sample(*values: Any) -> tuple[Any, ...]:
        sample, ws = list(values[: len(args)]), values[len(args):]

        def scalar(*tensors: torch.Tensor) -> torch.Tensor:
            for i, t in zip(slots, tensors):
                sample[i] = t
            outs = [o for o in probe.outputs_of(call(*sample)) if probe.differentiable(o)]
            if len(outs) != len(ws):
                raise TypeError(f"returned {len(outs)} floating-point tensor(s), expected {len(ws)}")
            total: torch.Tensor = sum((o * w).sum() for o, w in zip(outs, ws))
            return total

        grads: tuple[Any, ...] = torch.func.grad(scalar, argnums=tuple(range(len(slots))))(*[sample[i] for i in slots])
        return grads

    try:
        grads = torch.func.vmap(one_sample, in_dims=tuple(dims) + (0,) * len(weights))(*args, *weights)
        return {"grads": [g.detach() for g in grads], "error": None}
    except Exception as exc:  # the student's code may raise anything
        return {"grads": None, "error": asdict(probe.ProbeError.of("vmap(grad(...))", exc))}


@probe.procedure
def memory_run(fn: Any, args: tuple[Any, ...], grad_outputs: list[Any]) -> dict[str, Any]:
    """Memory of one call `fn(*args)` and its backward, counted by `PeakMemory` (the blocks
    torch operations create): forward's peak, what is still alive when forward returns (the
    output, and whatever the call keeps until backward, wherever it keeps it: saved for
    backward, on ctx, in a global, a class attribute or a closure), backward's peak (the
    gradients included), and, once the output and the gradients are dropped, the bytes
    still alive and which inputs are still referenced. The inputs are copies made here, so
    only the call can keep them. The tensors that require grad are differentiated;
    `grad_outputs` has one tensor per output that requires grad. Reported by the process that ran `fn`: best
    effort (memory outside torch operations, NumPy's, is not seen)."""
    call = probe.as_callable(fn)
    inputs = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
    watched = [weakref.ref(a.untyped_storage()) if isinstance(a, torch.Tensor) and a.device.type != "meta" else None
               for a in inputs]
    stage = "forward"
    try:
        with PeakMemory() as forward:
            result = call(*inputs)
        kept = forward.now
        outputs = [o for o in probe.outputs_of(result) if probe.differentiable(o) and o.requires_grad]
        wrt = [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]
        stage = "backward"
        with PeakMemory() as backward:
            grads = torch.autograd.grad(outputs, wrt, [g.to(o.device) for o, g in zip(outputs, grad_outputs)],
                                        allow_unused=True)
        del result, outputs, wrt, grads, inputs
    except Exception as exc:  # the student's code may raise anything
        return {"error": asdict(probe.ProbeError.of(stage, exc))}
    # A reference cycle (an output on its own ctx) is freed only by the collector: the young
    # generations, where this call's objects are, cost microseconds (a full collection, a second).
    gc.collect(1)
    return {
        "error": None,
        "forward_peak": forward.peak,
        "kept": kept,
        "backward_peak": backward.peak,
        "left": forward.now + backward.now,
        "inputs_alive": [i for i, w in enumerate(watched) if w is not None and w() is not None],
    }
