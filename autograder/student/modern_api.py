"""Notebook 10_modern_api (and 11) in the student's process: run torch.func transforms,
forward-mode AD, `torch.library.opcheck`, fake tensors and `torch.compile` on a student's
Function or custom op, and report what came out.

Every procedure here only computes: the judging side (:mod:`autograder.exercises.modern_api`)
builds the inputs, and compares the numbers with references it computes itself, by loops
over the batch and finite differences. Facts other than computed numbers (which methods a
class overrides, what opcheck said, which operators a compiled graph held) are reported by
the student's process: best effort.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import sys
import tempfile
from dataclasses import asdict
from typing import Any, Callable, Iterator, Sequence

import torch

from . import probe

BACKENDS = ("eager", "aot_eager")  # torch.compile backends that need no C++ compiler


def _error(stage: str, exc: BaseException) -> dict[str, Any]:
    return asdict(probe.ProbeError(stage, type(exc).__name__, str(exc)))


def _detached(values: Sequence[Any]) -> list[Any]:
    return [v.detach() if isinstance(v, torch.Tensor) else v for v in values]


def slots_of(args: Sequence[Any]) -> list[int]:
    """Positions of the floating-point tensor arguments (the ones differentiated)."""
    return [i for i, a in enumerate(args) if probe.differentiable(a)]


def with_tensors(args: Sequence[Any], slots: Sequence[int], tensors: Sequence[Any]) -> list[Any]:
    full = list(args)
    for i, t in zip(slots, tensors):
        full[i] = t
    return full


def _outputs(result: Any) -> list[torch.Tensor]:
    return [o.detach() for o in probe.outputs_of(result)]


def _inner(fn: Any, weights: Sequence[torch.Tensor]) -> Callable[..., torch.Tensor | int]:
    """<fn(*args), weights>: the scalar whose gradient is the vector-Jacobian product."""
    call = probe.as_callable(fn)

    def scalar(*args: Any) -> torch.Tensor | int:
        outs = [o for o in probe.outputs_of(call(*args)) if probe.differentiable(o)]
        if len(outs) != len(weights):
            raise TypeError(f"returned {len(outs)} floating-point tensor(s), expected {len(weights)}")
        return sum((o * w).sum() for o, w in zip(outs, weights))

    return scalar


@contextlib.contextmanager
def stderr_captured() -> Iterator[list[str]]:
    """Capture what this process writes to its stderr inside the block, C++ included: torch's
    C++ warnings (vmap's fallback, for one) bypass Python's `sys.stderr` and `warnings`. The
    text is in the yielded list once the block has ended."""
    written: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as file:
        os.dup2(file.fileno(), 2)
        try:
            yield written
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            file.seek(0)
            written.append(file.read().decode(errors="replace"))


@contextlib.contextmanager
def vmap_fallback(enabled: bool) -> Iterator[None]:
    """vmap's fallback on or off: without it, an operator that has no batching rule (a custom
    op without `register_vmap`) raises instead of running once per sample."""
    functorch: Any = torch._C._functorch  # its vmap-fallback switches are private, not in torch's stubs
    before = functorch._is_vmap_fallback_enabled()
    functorch._set_vmap_fallback_enabled(enabled)
    try:
        yield
    finally:
        functorch._set_vmap_fallback_enabled(before)


# --- What a Function class declares (best effort, for messages) -------------------------------

@probe.procedure
def describe(fn: Any) -> dict[str, Any]:
    """Which style a Function is written in, and which of the modern methods it overrides.
    For a `torch.library.custom_op`: its name and whether fake and autograd kernels were
    registered."""
    facts: dict[str, Any] = {"kind": type(fn).__name__}
    if isinstance(fn, type) and issubclass(fn, torch.autograd.Function):
        own = {name for klass in fn.__mro__ if klass is not object and not klass.__module__.startswith("torch")
               for name in vars(klass)}
        try:
            params = list(inspect.signature(fn.forward).parameters)
        except (TypeError, ValueError):
            params = []
        facts.update({
            "kind": "Function",
            "forward_params": [str(p) for p in params],
            "setup_context": "setup_context" in own,
            "vmap": "vmap" in own,
            "generate_vmap_rule": bool(getattr(fn, "generate_vmap_rule", False)),
            "jvp": "jvp" in own,
        })
    elif type(fn).__name__ == "CustomOpDef":
        facts.update({
            "kind": "CustomOpDef",
            "name": str(getattr(fn, "_qualname", "")),
            "fake": getattr(fn, "_abstract_fn", None) is not None,
            "autograd": getattr(fn, "_backward_fn", None) is not None,
        })
    return facts


# --- torch.func: grad and jacrev ---------------------------------------------------------------

@probe.procedure
def func_grad(fn: Any, args: Sequence[Any], weights: list[Any]) -> dict[str, Any]:
    """torch.func.grad of <fn(*args), weights> with respect to every floating-point tensor
    argument, and torch.func.jacrev of fn with respect to them (one output only)."""
    args = _detached(args)
    slots = slots_of(args)
    scalar = _inner(fn, weights)
    found: dict[str, Any] = {"grad": None, "grad_error": None, "jacrev": None, "jacrev_error": None}
    try:
        grads = torch.func.grad(lambda *t: scalar(*with_tensors(args, slots, t)), argnums=tuple(range(len(slots))))(
            *[args[i] for i in slots])
        found["grad"] = [g.detach() for g in grads]
    except Exception as exc:  # the student's code may raise anything
        found["grad_error"] = _error("torch.func.grad", exc)
    call = probe.as_callable(fn)
    try:
        jac = torch.func.jacrev(lambda *t: call(*with_tensors(args, slots, t)), argnums=tuple(range(len(slots))))(
            *[args[i] for i in slots])
        if not isinstance(jac, tuple) or not all(isinstance(j, torch.Tensor) for j in jac):
            raise TypeError("jacrev returned one Jacobian per output: the Function must have one output here")
        found["jacrev"] = [j.detach() for j in jac]
    except Exception as exc:  # the student's code may raise anything
        found["jacrev_error"] = _error("torch.func.jacrev", exc)
    return found


# --- torch.func.vmap -------------------------------------------------------------------------

@probe.procedure
def vmapped(fn: Any, args: tuple[Any, ...], levels: list[Any], weights: list[Any] | None,
            grad_of_vmap: list[Any] | None, fallback: bool = True) -> dict[str, Any]:
    """fn under torch.func.vmap, one level per entry of `levels` (in_dims tuples, the outermost
    first; out_dims 0 at every level). Without `fallback`, an operator with no batching rule
    raises instead of running once per sample.

    With `weights` (one level only): per-sample gradients, vmap(grad(<fn, w_b>)) with the
    weights batched along 0 — the gradient of sample b with respect to every floating-point
    tensor argument, shared (in_dims None) ones included. With `grad_of_vmap`: the gradient of
    <vmap(fn)(*args), W> with respect to the (batched) floating-point tensor arguments."""
    with vmap_fallback(fallback):
        return _vmapped(fn, _detached(args), levels, weights, grad_of_vmap)


def _vmapped(fn: Any, args: list[Any], levels: list[Any], weights: list[Any] | None,
             grad_of_vmap: list[Any] | None) -> dict[str, Any]:
    call = probe.as_callable(fn)
    found: dict[str, Any] = {"outputs": None, "error": None, "per_sample": None, "per_sample_error": None,
                             "grad_of_vmap": None, "grad_of_vmap_error": None}
    try:
        f = call
        for dims in reversed(levels):
            f = torch.func.vmap(f, in_dims=tuple(dims))
        found["outputs"] = _outputs(f(*args))
    except Exception as exc:  # the student's code may raise anything
        found["error"] = _error("vmap", exc)
    slots = slots_of(args)
    if weights is not None and len(levels) == 1:
        dims = tuple(levels[0])

        def per_sample(*tensors_and_weights: Any) -> torch.Tensor | int:
            tensors, ws = tensors_and_weights[: len(slots)], tensors_and_weights[len(slots):]
            return _inner(fn, ws)(*with_tensors(args, slots, tensors))

        try:
            grads = torch.func.vmap(
                torch.func.grad(per_sample, argnums=tuple(range(len(slots)))),
                in_dims=tuple(dims[i] for i in slots) + (0,) * len(weights),
            )(*[args[i] for i in slots], *weights)
            found["per_sample"] = [g.detach() for g in grads]
        except Exception as exc:  # the student's code may raise anything
            found["per_sample_error"] = _error("vmap(grad(...))", exc)
    if grad_of_vmap is not None and len(levels) == 1:
        dims = tuple(levels[0])

        def batched_scalar(*tensors: Any) -> Any:
            out = torch.func.vmap(call, in_dims=dims)(*with_tensors(args, slots, tensors))
            outs = [o for o in probe.outputs_of(out) if probe.differentiable(o)]
            return sum((o * w).sum() for o, w in zip(outs, grad_of_vmap))

        try:
            grads = torch.func.grad(batched_scalar, argnums=tuple(range(len(slots))))(*[args[i] for i in slots])
            found["grad_of_vmap"] = [g.detach() for g in grads]
        except Exception as exc:  # the student's code may raise anything
            found["grad_of_vmap_error"] = _error("grad(vmap(...))", exc)
    return found


# --- Forward-mode AD ---------------------------------------------------------------------------

@probe.procedure
def forward_ad(fn: Any, args: Sequence[Any], tangent_sets: list[Any],
               hessian_weights: list[Any] | None, jacobian: bool = True, dtypes: bool = False) -> dict[str, Any]:
    """For each set of tangents (one per argument, None for none): the primal and tangent
    outputs of fn with torch.autograd.forward_ad dual tensors (a missing tangent is zero),
    and with `dtypes` the first float64 tensor made on the way (`probe.Widening`: for float32
    arguments; best effort). Then, with `jacobian`, torch.func.jacfwd with respect to every
    floating-point tensor argument (one output only) and, with `hessian_weights`,
    torch.func.hessian of <fn, weights> with respect to the first floating-point argument."""
    import torch.autograd.forward_ad as fwAD

    args = _detached(args)
    call = probe.as_callable(fn)
    runs: list[dict[str, Any]] = []
    for tangents in tangent_sets:
        widening = probe.Widening("forward AD") if dtypes else None
        try:
            with fwAD.dual_level(), widening or contextlib.nullcontext():
                duals = [fwAD.make_dual(a, t) if isinstance(t, torch.Tensor) else a for a, t in zip(args, tangents)]
                result = call(*duals)
                primals, outs = [], []
                for o in probe.outputs_of(result):
                    unpacked = fwAD.unpack_dual(o)
                    primals.append(unpacked.primal.detach())
                    outs.append(None if unpacked.tangent is None else unpacked.tangent.detach())
            runs.append({"primals": primals, "tangents": outs, "error": None,
                         "widened": None if widening is None else widening.first})
        except Exception as exc:  # the student's code may raise anything
            runs.append({"primals": [], "tangents": [], "error": _error("forward AD", exc), "widened": None})
    found: dict[str, Any] = {"runs": runs, "jacfwd": None, "jacfwd_error": None, "hessian": None, "hessian_error": None}
    if not jacobian:
        return found
    slots = slots_of(args)
    try:
        jac = torch.func.jacfwd(lambda *t: call(*with_tensors(args, slots, t)), argnums=tuple(range(len(slots))))(
            *[args[i] for i in slots])
        if not isinstance(jac, tuple) or not all(isinstance(j, torch.Tensor) for j in jac):
            raise TypeError("jacfwd returned one Jacobian per output: the Function must have one output here")
        found["jacfwd"] = [j.detach() for j in jac]
    except Exception as exc:  # the student's code may raise anything
        found["jacfwd_error"] = _error("torch.func.jacfwd", exc)
    if hessian_weights is not None:
        scalar = _inner(fn, hessian_weights)
        first = slots[0]
        try:
            found["hessian"] = torch.func.hessian(lambda t: scalar(*with_tensors(args, [first],
                                                                                 [t])))(args[first]).detach()
        except Exception as exc:  # the student's code may raise anything
            found["hessian_error"] = _error("torch.func.hessian", exc)
    return found


@probe.procedure
def forward_ad_gradcheck(fn: Any, args: Sequence[Any]) -> dict[str, Any] | None:
    """torch.autograd.gradcheck(check_forward_ad=True) of fn, as the student would run it
    (reported by the student's process: best effort; the judging side's own finite
    differences are what counts)."""
    from torch.autograd.gradcheck import GradcheckError

    args = _detached(args)
    slots = slots_of(args)
    call = probe.as_callable(fn)
    tensors = tuple(args[i].clone().requires_grad_() for i in slots)
    try:
        torch.autograd.gradcheck(lambda *t: call(*with_tensors(args, slots, t)), tensors, check_forward_ad=True,
                                 check_backward_ad=False, check_undefined_grad=False, fast_mode=True)
    except GradcheckError as error:
        return _error("gradcheck(check_forward_ad=True)", error)
    except Exception as exc:  # the student's code may raise anything
        return _error("gradcheck(check_forward_ad=True)", exc)
    return None


# --- torch.library custom ops -----------------------------------------------------------------

@probe.procedure
def opcheck(op: Any, samples: list[Any]) -> list[Any]:
    """torch.library.opcheck(op, args) for each argument tuple: {test: result} or the error
    (reported by the student's process: best effort)."""
    found = []
    for args in samples:
        try:
            result = torch.library.opcheck(op, tuple(args))
            found.append({"results": {str(k): str(v) for k, v in dict(result).items()}, "error": None})
        except Exception as exc:  # the student's code may raise anything
            found.append({"results": {}, "error": _error("opcheck", exc)})
    return found


@probe.procedure
def fake_outputs(op: Any, args: Sequence[Any]) -> dict[str, Any]:
    """Shapes, dtypes and devices of op's outputs on fake tensors (what torch.compile and
    opcheck see: the register_fake kernel)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = _detached(args)
    try:
        with FakeTensorMode() as mode:
            fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            result = probe.as_callable(op)(*fakes)
            outs = [{"shape": list(o.shape), "dtype": str(o.dtype).removeprefix("torch."), "device": o.device.type}
                    for o in probe.outputs_of(result)]
        return {"outputs": outs, "error": None, "type": type(result).__name__}
    except Exception as exc:  # the student's code may raise anything
        return {"outputs": [], "error": _error("fake tensors", exc), "type": ""}


# --- torch.compile -----------------------------------------------------------------------------

@probe.procedure
def compiled(fn: Any, args: Sequence[Any], weights: list[Any], backend: str, fullgraph: bool) -> dict[str, Any]:
    """fn(*args) under torch.compile(backend=backend, fullgraph=fullgraph): its outputs and the
    gradients of <outputs, weights> with respect to the floating-point tensor arguments, and
    the operators of the graphs the compiler received, their subgraphs included (a Function's
    forward and backward; best effort). Caches are reset first,
    so that the student's current definitions are the ones compiled."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    import torch._dynamo

    inner = torch._dynamo.lookup_backend(backend)
    graphs: list[list[str]] = []

    def recording(gm: Any, example_inputs: Any) -> Any:  # a Function's forward and backward are subgraphs of gm
        graphs.append(sorted({str(node.target) for module in gm.modules() if isinstance(module, torch.fx.GraphModule)
                              for node in module.graph.nodes if node.op == "call_function"}))
        return inner(gm, example_inputs)

    call = probe.as_callable(fn)
    args = [a.detach().clone().requires_grad_() if probe.differentiable(a) else a for a in args]
    found: dict[str, Any] = {"outputs": [], "grads": [], "graphs": graphs, "error": None}
    stage = "torch.compile (forward)"
    try:
        torch._dynamo.reset()
        result = torch.compile(lambda *a: call(*a), backend=recording, fullgraph=fullgraph)(*args)
        outs = [o for o in probe.outputs_of(result) if probe.differentiable(o)]
        found["outputs"] = [o.detach() for o in probe.outputs_of(result)]
        stage = "torch.compile (backward)"
        wrt = [a for a in args if probe.differentiable(a)]
        grads = torch.autograd.grad(outs, wrt, list(weights)[: len(outs)], allow_unused=True)
        found["grads"] = [None if g is None else g.detach() for g in grads]
    except Exception as exc:  # the student's code may raise anything
        found["error"] = _error(stage, exc)
    finally:
        torch._dynamo.reset()
    return found
