"""Checks for notebook 10_modern_api, and the transform and compile checks that notebook 11
reuses.

Reusable checks (each runs the student's code only through the procedures of
:mod:`autograder.student.modern_api`, and computes its references here, with plain autograd
and loops over the batch):

- :func:`check_func_grad` — `torch.func.grad` and `torch.func.jacrev`;
- :func:`check_vmap` — `torch.func.vmap` at one or more levels, per-sample gradients
  (`vmap(grad(...))`) and gradients through vmap (`grad(vmap(...))`), against a loop;
- :func:`check_forward_ad` — dual tensors of `torch.autograd.forward_ad`, `jacfwd`,
  `hessian`, and forward-mode gradcheck (finite differences of the student's own forward);
- :func:`check_compile` — `torch.compile` with a backend that needs no C++ compiler;
- :func:`check_custom_op` — a `torch.library.custom_op`: its fake kernel and `opcheck`;
- :func:`check_what_is_kept` — what backward reads is saved: nothing on ctx, nothing elsewhere.

Every draw of the exercises' inputs holds their special points (0, the kinks, ±1000: see
`inputs.including`), so a formula that is NaN or infinite exactly there loses its points.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
from torch.autograd.gradcheck import GradcheckError

from ..checks import explain, inputs
from ..checks import saved as saved_checks
from ..checks.functions import KEEP_DTYPE, FunctionSpec, check_function
from ..checks.shared_state import process_wide
from ..student import devices, probe
from ..student import modern_api as student_side
from ..student.report import fail, passed, quiet, shape, show
from ..student.saved import Names
from ..student.saved import describe as describe_saved

Shape = Sequence[int]
Reference = Callable[..., Any]
RTOL, ATOL = 1e-6, 1e-9
NAMESPACE = "modern_api"  # the namespace of this notebook's custom ops


def _generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(inputs.seed_of(seed))
    return generator


def _like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device)


def _floating(result: Any) -> list[torch.Tensor]:
    return [o for o in probe.outputs_of(result) if probe.differentiable(o)]


def _names(names: Sequence[str], args: Sequence[Any]) -> list[str]:
    return list(names) if len(names) == len(args) else [f"input {i}" for i in range(len(args))]


def _shown(names: Sequence[str], args: Sequence[Any]) -> list[str]:
    return [f"{n} = {show(a)}" for n, a in zip(_names(names, args), args)]


def _close(actual: torch.Tensor | None, expected: torch.Tensor, rtol: float = RTOL, atol: float = ATOL) -> bool:
    return (
        isinstance(actual, torch.Tensor) and actual.shape == expected.shape
        # (NaN where the expected value is NaN too agrees: explain.mismatch counts it so)
        and bool(torch.allclose(actual.detach().cpu().to(expected.dtype), expected.detach().cpu(), rtol=rtol,
                                atol=atol, equal_nan=True))
    )


def _not_finite(expected: torch.Tensor, actual: torch.Tensor) -> str | None:
    """Why a value is NaN or infinite where the right one is finite (None if none is)."""
    broken = ~torch.isfinite(actual) & torch.isfinite(expected)
    if not bool(broken.any()):
        return None
    index = explain.first_index(broken)
    return (f"the value at index {index} is {actual[index].item()} where the right one is finite: a formula that "
            "divides by zero or overflows at that input (look at it: a 0, or a large value), though the function is "
            "smooth there. Write it so that it stays finite (e.g. with torch.sigmoid rather than exp(−z), and no "
            "division by x).")


def _compare(label: str, actual: torch.Tensor | None, expected: torch.Tensor, shown: list[str],
             cause: str | None = None, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Fail unless `actual` has `expected`'s shape and values."""
    __tracebackhide__ = True
    if not isinstance(actual, torch.Tensor):
        fail(f"{label}: got {type(actual).__name__}, expected a tensor of shape {shape(expected)}.", *shown,
             cause=cause)
    if actual.shape != expected.shape:
        fail(f"{label}: shape {shape(actual)}, expected {shape(expected)}.", *shown, cause=cause)
    if not _close(actual, expected, rtol, atol):
        a, e = actual.detach().cpu().to(expected.dtype), expected.detach().cpu()
        fail(f"{label}: wrong values.", *shown, *explain.differ(e, a, rtol=rtol, atol=atol), cause=cause)


# --- Reading the errors that transforms raise -------------------------------------------------

def transform_cause(message: str, kind: str, facts: dict | None = None) -> str | None:
    """The likely cause of an error raised while torch.func, forward AD or torch.compile ran
    a student's Function or op (None when nothing specific is recognised)."""
    facts = facts or {}
    if kind == "NotImplementedError" and "jvp function" in message:
        return ("the Function has no jvp staticmethod: forward-mode AD (forward_ad, jacfwd, hessian) needs "
                "`jvp(ctx, *tangents)`, returning the tangent of each output.")
    if kind == "NotImplementedError":
        return explain.NOT_IMPLEMENTED
    if "must override the setup_context staticmethod" in message:
        return ("this is a classic Function (forward(ctx, ...)), and torch.func cannot transform those: "
                "write forward without ctx, `forward(x, ...)`, and move what it did with ctx to "
                "`setup_context(ctx, inputs, output)`.")
    if "missing a required argument" in message and facts.get("setup_context"):
        return ("with a setup_context staticmethod, forward takes no ctx: `forward(x, ...)` receives the inputs "
                "only, and setup_context(ctx, inputs, output) saves what backward needs.")
    if "does not have vmap support" in message:
        return ("vmap needs a rule for the Function: `generate_vmap_rule = True` when forward, setup_context and "
                "backward are built from torch operations, or a hand-written `vmap` staticmethod.")
    if "hit the vmap fallback which is currently disabled" in message:
        return ("the custom op has no vmap rule. Without one, vmap falls back to calling its kernel once per "
                "sample, in a loop, with a warning (this check switches that fallback off). Register a rule with "
                "`@op.register_vmap`: `(info, in_dims, x)` in, `(output, out_dims)` out.")
    if "has both generate_vmap_rule=True and an overridden vmap staticmethod" in message:
        return ("choose one: a hand-written vmap staticmethod, or generate_vmap_rule = True (then delete "
                "the staticmethod).")
    if "Cannot access data pointer of Tensor that doesn't have storage" in message:
        return ("code that leaves torch (NumPy here) received a batched tensor: generate_vmap_rule runs forward on "
                "batched tensors, which NumPy cannot read. Write a vmap staticmethod that moves the batch dims to "
                "one place and calls the Function on the plain tensors it receives.")
    if "not enough values to unpack" in message and "got 0" in message:
        return ("ctx.saved_tensors is an empty tuple here: inside jvp it holds only what setup_context passed to "
                "`ctx.save_for_forward` (save_for_backward serves backward only). Call both in setup_context.")
    if "Expected both tensor and its forward grad to be floating point" in message:
        return "jvp returned None (or nothing) for an output: it must return the tangent of every output."
    if "There was no fake impl registered" in message:
        return ("the op has no fake kernel: register one with `@op.register_fake`, returning an empty tensor of "
                "the output's shape and dtype (torch.compile and opcheck run it instead of your NumPy code).")
    if "Autograd has not been implemented" in message or "autograd kernel was not registered" in message:
        return ("the op has no autograd formula: `op.register_autograd(backward, setup_context=setup_context)`.")
    if "expected np.ndarray (got numpy." in message:
        return ("NumPy returns a scalar, not an array, when a reduction leaves no dimension (a 1-d input): "
                "wrap the result with `np.asarray(...)` before `torch.from_numpy`.")
    if "expected device" in message or "is not on the expected device" in message:
        return ("a tensor is created without `device=`: build new tensors with `x.new_empty(...)`, "
                "`torch.empty_like(x)`, or pass `device=x.device`.")
    if "Unsupported custom jvp" in message:
        return ("torch.compile (torch 2.13) cannot trace a Function that defines a jvp: with fullgraph=True it "
                "refuses it, without it runs the Function eagerly between two graphs. Keep jvp out of Functions "
                "that must compile in one graph (or make the computation a custom op).")
    if "Unsupported" in kind or "graph break" in message.lower():
        return ("torch.compile could not trace the code into one graph (fullgraph=True). It traces most NumPy "
                "(through torch._numpy), but not a NumPy function it does not know, `.item()`/`.tolist()` on a "
                "value, or compiled code (a C library, a CUDA kernel): such code belongs in a "
                "torch.library.custom_op with a fake kernel.")
    return None


def _fail_error(what: str, error: probe.ProbeError, shown: list[str], facts: dict | None = None,
                hint: str | None = None) -> None:
    __tracebackhide__ = True
    first = error.message.strip().splitlines()[0] if error.message.strip() else ""
    said = f": {first[:300]}" if first and first != error.type else ""
    kind = error.type
    raised = re.search(r"raised exception (\w+)\(", error.message) if first == "Observed exception" else None
    if raised:  # torch.compile met an exception of the student's own code: name it, not the compiler's wrapper
        kind, said = raised.group(1), " inside the compiled code (it raises without torch.compile too)"
    cause = transform_cause(error.message, kind, facts) or hint
    fail(f"{what} raised {kind}{said}", *shown, cause=cause)


def _error_of(data: Any) -> probe.ProbeError | None:
    return probe.ProbeError.from_data(data)


def _tensor_list(values: Any, what: str) -> list:
    if values is None:
        return []
    if not isinstance(values, list) or not all(v is None or isinstance(v, torch.Tensor) for v in values):
        raise probe.Malformed(f"malformed {what}")
    return values


def describe(student: Any) -> dict:
    """What a student's Function or op declares (reported by the student's process)."""
    facts = probe.invoke(student_side.describe, student)
    if not isinstance(facts, dict):
        raise probe.Malformed("malformed description")
    return facts


# --- torch.func.grad and jacrev ---------------------------------------------------------------

def _reference_grads(reference: Reference, args: Sequence[Any], weights: list[torch.Tensor]) -> list[torch.Tensor]:
    slots = student_side.slots_of(args)
    tensors = [args[i].detach().clone().requires_grad_() for i in slots]
    with torch.enable_grad():
        outs = _floating(reference(*student_side.with_tensors(args, slots, tensors)))
        grads = torch.autograd.grad(outs, tensors, weights, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g.detach() for g, t in zip(grads, tensors)]


def _reference_jacobians(reference: Reference, args: Sequence[Any]) -> list[torch.Tensor]:
    slots = student_side.slots_of(args)
    tensors = tuple(args[i].detach() for i in slots)
    jac = torch.autograd.functional.jacobian(lambda *t: reference(*student_side.with_tensors(args, slots, t)), tensors)
    return list(jac) if isinstance(jac, tuple) else [jac]


def check_func_grad(student: Any, name: str, reference: Reference, cases: Sequence[tuple],
                    arg_names: Sequence[str], generator: torch.Generator, *, jacrev: bool = True) -> None:
    """torch.func.grad (and jacrev) of the student's Function equal the reference's gradients
    (and Jacobians), computed here with torch.autograd. One output."""
    __tracebackhide__ = True
    facts = describe(student)
    with quiet():
        for device in devices.available():
            for case in cases:
                args = tuple(a.detach().to(device) if isinstance(a, torch.Tensor) else a for a in case)
                outs = _floating(reference(*args))
                weights = [_like(o, generator) for o in outs]
                found = probe.invoke(student_side.func_grad, student, args, weights)
                shown = _shown(arg_names, args) + [f"weights = {show(weights[0])}"]
                error = _error_of(found["grad_error"])
                if error is not None:
                    _fail_error(f"torch.func.grad of ({name}.apply(...) * weights).sum()", error, shown, facts)
                grads = _tensor_list(found["grad"], "gradients")
                slots = student_side.slots_of(args)
                names = _names(arg_names, args)
                for k, (got, want) in enumerate(zip(grads, _reference_grads(reference, args, weights))):
                    _compare(f"{name}: torch.func.grad for `{names[slots[k]]}`", got, want, shown)
                if len(grads) != len(slots):
                    raise probe.Malformed("malformed gradients")
                if not jacrev:
                    continue
                error = _error_of(found["jacrev_error"])
                if error is not None:
                    _fail_error(f"torch.func.jacrev({name}.apply)", error, shown[:-1], facts)
                jacs = _tensor_list(found["jacrev"], "Jacobians")
                for k, (got, want) in enumerate(zip(jacs, _reference_jacobians(reference, args))):
                    _compare(f"{name}: torch.func.jacrev for `{names[slots[k]]}`", got, want, shown[:-1])


# --- torch.func.vmap --------------------------------------------------------------------------

@dataclass(frozen=True)
class VmapCase:
    """Arguments as vmap receives them (batch dims included), and the in_dims of each vmap
    level, outermost first (one entry per argument; None for non-tensors and unbatched)."""

    args: tuple
    levels: tuple[tuple, ...]


def batched(sample: torch.Tensor, dims: Sequence[int | None], sizes: Sequence[int],
            generator: torch.Generator) -> torch.Tensor:
    """A random tensor of `sample`'s dtype whose per-sample shape is `sample`'s, with a batch
    dim of size sizes[k] inserted at dims[k] for each level k (outermost first; None: this
    argument is not batched at that level)."""
    shape_ = list(sample.shape)
    for dim, size in reversed(list(zip(dims, sizes))):
        if dim is not None:
            shape_.insert(dim if dim >= 0 else len(shape_) + 1 + dim, size)
    return torch.randn(tuple(shape_), generator=generator, dtype=sample.dtype)


def vmap_case(samples: Sequence[Any], levels: Sequence[Sequence[int | None]], sizes: Sequence[int],
              generator: torch.Generator) -> VmapCase:
    """A VmapCase for a function of `samples` (one sample's arguments: tensors give the shape
    and dtype, anything else is passed as it is): `levels[k]` holds one in_dims entry per
    argument for vmap level k (outermost first, None for non-tensors and unbatched tensors),
    `sizes[k]` its batch size. The tensors are drawn from `generator`."""
    args = tuple(batched(a, [dims[i] for dims in levels], sizes, generator) if isinstance(a, torch.Tensor) else a
                 for i, a in enumerate(samples))
    return VmapCase(args, tuple(tuple(dims) for dims in levels))


def _batch_size(args: Sequence[Any], dims: Sequence[Any]) -> int:
    for a, d in zip(args, dims):
        if isinstance(d, dict):  # a dict argument, its in_dims a dict of the same keys (as vmap reads them)
            with contextlib.suppress(ValueError):
                return _batch_size([a[k] for k in d], list(d.values()))
        elif d is not None:
            return a.shape[d]
    raise ValueError("no batched argument")


def _select(a: Any, d: Any, b: int) -> Any:
    if isinstance(d, dict):
        return {k: _select(v, d.get(k), b) for k, v in a.items()}
    return a.select(d, b) if d is not None else a


def _sample(args: Sequence[Any], dims: Sequence[Any], b: int) -> list:
    return [_select(a, d, b) for a, d in zip(args, dims)]


def loop(reference: Reference, args: Sequence[Any], levels: Sequence[Sequence[Any]]) -> list[torch.Tensor]:
    """What vmap must compute (out_dims 0 at every level): the reference run on each sample,
    stacked."""
    if not levels:
        with torch.no_grad():
            return [o.detach() for o in probe.outputs_of(reference(*args))]
    dims = levels[0]
    per = [loop(reference, _sample(args, dims, b), levels[1:]) for b in range(_batch_size(args, dims))]
    return [torch.stack([p[k] for p in per]) for k in range(len(per[0]))]


def _describe_vmap(name: str, case: VmapCase, *, apply: bool = True) -> str:
    call = f"{name}.apply" if apply else name
    for dims in reversed(case.levels):
        call = f"vmap({call}, in_dims={tuple(dims)})"
    return call


def _vmap_cause(actual: torch.Tensor | None, expected: torch.Tensor, batch: int) -> str | None:
    if not isinstance(actual, torch.Tensor):
        return None
    if tuple(actual.shape) == (batch, *expected.shape):
        return ("the output got one batch dim too many: your rule returned out_dims None for an output that is "
                "batched, so vmap took it as one value shared by every sample and added a batch dim. Return the "
                "dim where the batch is in the output your rule computed (e.g. 0, whichever input was batched).")
    for k in range(1, expected.dim()):
        moved = expected.movedim(0, k)
        if actual.shape == moved.shape and torch.allclose(actual.cpu().to(moved.dtype), moved.cpu(), rtol=RTOL,
                                                          atol=ATOL):
            return (f"the batch is at dim {k} of the output your rule computed, but the out_dims it "
                    "returned say otherwise.")
    return None


def check_vmap(student: Any, name: str, reference: Reference, cases: Sequence[VmapCase], arg_names: Sequence[str],
               generator: torch.Generator, *, per_sample: bool = True, grad_of_vmap: bool = True,
               hint: Callable[[VmapCase, torch.Tensor | None, torch.Tensor | None], str | None] | None = None,
               fallback: bool = True) -> None:
    """vmap of the student's Function equals a loop over the batch with the reference; with
    `per_sample`, so do the per-sample gradients vmap(grad(...)); with `grad_of_vmap`, the
    gradient through the vmapped Function (single-level cases only). Without `fallback`, an
    operator with no batching rule (a custom op without `register_vmap`) fails instead of
    running once per sample."""
    __tracebackhide__ = True
    facts = describe(student)
    for case in cases:
        args = case.args
        call = _describe_vmap(name, case, apply=facts.get("kind") != "CustomOpDef")
        shown = _shown(arg_names, args)
        expected = loop(reference, args, case.levels)
        batch = _batch_size(args, case.levels[0])
        single = len(case.levels) == 1
        weights = [_like(e, generator) for e in expected if probe.differentiable(e)]
        with quiet():
            found = probe.invoke(student_side.vmapped, student, tuple(args), [list(d) for d in case.levels],
                                 weights if (per_sample and single) else None,
                                 weights if (grad_of_vmap and single) else None, fallback)
        error = _error_of(found["error"])
        if error is not None:
            _fail_error(call, error, shown, facts, hint=hint(case, None, None) if hint else None)
        outputs = _tensor_list(found["outputs"], "outputs")
        if len(outputs) != len(expected):
            fail(f"{call} returned {len(outputs)} tensor(s), expected {len(expected)}.", *shown)
        for got, want in zip(outputs, expected):
            cause = _vmap_cause(got, want, batch) or (hint(case, got, want) if hint else None)
            _compare(f"{call}: the output differs from a loop over the batch", got, want, shown, cause)
        if not single or not weights:
            continue
        slots = student_side.slots_of(args)
        names = _names(arg_names, args)
        dims = case.levels[0]
        per = [_reference_grads(reference, _sample(args, dims, b), [w[b] for w in weights]) for b in range(batch)]
        if per_sample:
            error = _error_of(found["per_sample_error"])
            if error is not None:
                _fail_error(f"per-sample gradients, vmap(grad(...)) over {call}", error, shown, facts)
            grads = _tensor_list(found["per_sample"], "per-sample gradients")
            for k, got in enumerate(grads):
                want = torch.stack([p[k] for p in per])
                _compare(f"{call}: per-sample gradients (vmap of grad) for `{names[slots[k]]}` differ from a loop",
                         got, want, shown, hint(case, got, want) if hint else None)
        if grad_of_vmap:
            error = _error_of(found["grad_of_vmap_error"])
            if error is not None:
                _fail_error(f"grad through {call}", error, shown, facts)
            grads = _tensor_list(found["grad_of_vmap"], "gradients")
            for k, got in enumerate(grads):
                d = dims[slots[k]]
                want = torch.stack([p[k] for p in per], d) if d is not None else sum(p[k] for p in per)
                _compare(f"{call}: the gradient through vmap (grad of vmap) for `{names[slots[k]]}` differs from "
                         "a loop",
                         got, want, shown, hint(case, got, want) if hint else None)


# --- Forward-mode AD --------------------------------------------------------------------------

def _reference_jvp(reference: Reference, args: Sequence[Any], tangents: Sequence[Any]) -> list[torch.Tensor]:
    """Output tangents of the reference (torch operations) with forward_ad; zero if None."""
    import torch.autograd.forward_ad as fwAD

    with process_wide, fwAD.dual_level():
        duals = [fwAD.make_dual(a.detach(), t) if isinstance(t, torch.Tensor) else
                 (a.detach() if isinstance(a, torch.Tensor) else a) for a, t in zip(args, tangents)]
        outs = probe.outputs_of(reference(*duals))
        found = []
        for o in outs:
            u = fwAD.unpack_dual(o)
            found.append(torch.zeros_like(u.primal) if u.tangent is None else u.tangent.detach().clone())
    return found


def _tangent_label(names: list[str], tangents: Sequence[Any]) -> str:
    with_t = [n for n, t in zip(names, tangents) if isinstance(t, torch.Tensor)]
    return "tangents for " + " and ".join(f"`{n}`" for n in with_t)


def check_forward_ad(student: Any, name: str, reference: Reference, cases: Sequence[tuple],
                     arg_names: Sequence[str], generator: torch.Generator, *, jacfwd: bool = True,
                     hessian: bool = True, hint: Callable[[int, tuple, list], str | None] | None = None) -> None:
    """Forward-mode AD of the student's Function against the reference: dual tensors with a
    tangent on each floating-point argument alone and on all of them; torch.func.jacfwd; the
    Hessian of <f, w> with respect to the first argument (jacfwd over jacrev); and a
    forward-mode gradcheck (torch's, or for a student's process elsewhere, central finite
    differences of its own forward computed here)."""
    __tracebackhide__ = True
    facts = describe(student)
    for device in devices.available():
        for case in cases:
            args = tuple(a.detach().to(device) if isinstance(a, torch.Tensor) else a for a in case)
            slots = student_side.slots_of(args)
            names = _names(arg_names, args)
            shown = _shown(arg_names, args)
            sets = []
            for i in slots + [None]:
                sets.append([_like(a, generator) if (k == i or (i is None and k in slots)) else None
                             for k, a in enumerate(args)])
            outs = _floating(reference(*args))
            weights = [_like(o, generator) for o in outs]
            with quiet():
                found = probe.invoke(student_side.forward_ad, student, args, sets, weights if hessian else None)
            runs = found["runs"]
            if not isinstance(runs, list) or len(runs) != len(sets):
                raise probe.Malformed("malformed forward-AD report")
            for tangents, run in zip(sets, runs):
                label = _tangent_label(names, tangents)
                seen = shown + [f"{names[k]} tangent = {show(t)}" for k, t in enumerate(tangents) if t is not None]
                error = _error_of(run["error"])
                if error is not None:
                    _fail_error(f"forward AD ({label}) of {name}", error, seen, facts)
                got = _tensor_list(run["tangents"], "tangents")
                want = _reference_jvp(reference, args, tangents)
                if len(got) != len(want):
                    fail(f"{name}: forward AD gave {len(got)} output tangent(s), expected {len(want)}.", *seen)
                given = [slots.index(k) for k, t in enumerate(tangents) if t is not None]
                cause = hint(given[0] if len(given) == 1 else None, args, tangents) if hint else None
                for g, w in zip(got, want):
                    if g is None:
                        fail(f"{name}: forward AD ({label}) gave no tangent for the output.", *seen,
                             f"expected {show(w)}", cause=cause)
                    broken = _not_finite(w.detach().cpu(), g.detach().cpu().to(w.dtype)) if g.shape == w.shape else None
                    _compare(f"{name}: forward AD ({label}) gives a wrong output tangent", g, w, seen, broken or cause)
            if jacfwd:
                error = _error_of(found["jacfwd_error"])
                if error is not None:
                    _fail_error(f"torch.func.jacfwd({name}.apply)", error, shown, facts)
                jacs = _tensor_list(found["jacfwd"], "Jacobians")
                for k, (got, want) in enumerate(zip(jacs, _reference_jacobians(reference, args))):
                    _compare(f"{name}: torch.func.jacfwd for `{names[slots[k]]}`", got, want, shown)
            if hessian:
                error = _error_of(found["hessian_error"])
                if error is not None:
                    _fail_error(f"torch.func.hessian of ({name}.apply(...) * weights).sum()", error, shown, facts)
                first = slots[0]
                want = _reference_hessian(reference, args, first, weights)
                _compare(f"{name}: torch.func.hessian with respect to `{names[first]}`", found["hessian"], want,
                         shown + [f"weights = {show(weights[0])}"])
            _forward_gradcheck(student, name, args, arg_names, generator, facts, outs)
    _forward_ad_in_float32(student, name, reference, cases[0], arg_names, generator, facts)


def _forward_ad_in_float32(student: Any, name: str, reference: Reference, case: tuple, arg_names: Sequence[str],
                           generator: torch.Generator, facts: dict) -> None:
    """Given float32 inputs and tangents, the output tangents are float32, no step of the jvp
    makes a float64 tensor (as the student's process reports it), and they are the
    reference's in float32 (to float32's precision)."""
    __tracebackhide__ = True
    args = tuple(a.detach().float() if probe.differentiable(a) else a for a in case)
    tangents = [_like(a, generator) if probe.differentiable(a) else None for a in args]
    shown = _shown(arg_names, args)
    with quiet():
        found = probe.invoke(student_side.forward_ad, student, args, [tangents], None, False, True)
    runs = found.get("runs") if isinstance(found, dict) else None
    if not isinstance(runs, list) or len(runs) != 1 or not isinstance(runs[0], dict):
        raise probe.Malformed("malformed forward-AD report")
    error = _error_of(runs[0].get("error"))
    if error is not None:
        _fail_error(f"forward AD of {name} on float32 inputs", error, shown, facts)
    got, want = _tensor_list(runs[0].get("tangents"), "tangents"), _reference_jvp(reference, args, tangents)
    for g, w in zip(got, want):
        if isinstance(g, torch.Tensor) and g.dtype != w.dtype:
            fail(f"{name}: given float32 inputs and tangents, jvp returned a {g.dtype} tangent, expected {w.dtype}.",
                 *shown, cause=KEEP_DTYPE)
    widened = runs[0].get("widened")
    if widened:
        fail(f"{name}: given float32 inputs and tangents, your jvp computes in float64: {str(widened)[:200]} (as your "
             "process reports it).", *shown, cause=KEEP_DTYPE)
    for g, w in zip(got, want):
        scale = 1 + float(w.abs().amax()) if w.numel() else 1
        _compare(f"{name}: forward AD on float32 inputs", g, w, shown, rtol=1e-3, atol=1e-4 * scale,
                 cause="a step that loses float32's precision, or a tangent computed from something else.")


def _reference_hessian(reference: Reference, args: Sequence[Any], first: int,
                       weights: list[torch.Tensor]) -> torch.Tensor:
    """The Hessian of <reference(*args), weights> with respect to args[first] (torch.autograd)."""
    def scalar(t: torch.Tensor) -> torch.Tensor:
        return sum((o * w).sum() for o, w in zip(_floating(reference(*student_side.with_tensors(args, [first], [t]))),
                                                 weights))

    return torch.autograd.functional.hessian(scalar, args[first].detach())


def _forward_gradcheck(student: Any, name: str, args: tuple, arg_names: Sequence[str], generator: torch.Generator,
                       facts: dict, like: list[torch.Tensor], eps: float = 1e-6) -> None:
    """gradcheck(check_forward_ad=True): the student's tangents against finite differences
    of the student's own forward. torch's gradcheck for a local object; for one in another
    process, central differences along random directions, computed here (of forward values
    of the shapes of the reference's outputs `like`, or the check fails before computing)."""
    __tracebackhide__ = True
    shown = _shown(arg_names, args)
    slots = student_side.slots_of(args)
    if not isinstance(student, probe.StudentProxy):
        call = probe.as_callable(student)
        tensors = tuple(args[i].detach().clone().requires_grad_() for i in slots)
        with quiet():
            try:
                torch.autograd.gradcheck(lambda *t: call(*student_side.with_tensors(args, slots, t)), tensors,
                                         check_forward_ad=True,
                                         check_backward_ad=False, check_undefined_grad=False, fast_mode=True)
                return
            except GradcheckError as error:
                lines = str(error).strip().splitlines()
            except Exception as exc:  # the student's code may raise anything
                _fail_error(f"gradcheck(check_forward_ad=True) of {name}",
                            probe.ProbeError("gradcheck", type(exc).__name__, str(exc)), shown, facts)
        fail(f"{name}: torch.autograd.gradcheck(check_forward_ad=True) failed.", *shown, *lines[:10],
             cause="jvp must be the derivative of forward, linear in the tangents.")
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    directions = [_like(plain[i], generator) if i in slots else None for i in range(len(plain))]
    moved = [tuple(a + sign * eps * d if d is not None else a for a, d in zip(plain, directions)) for sign in (1, -1)]
    with quiet():
        results = probe.forward_many(student, moved)
        found = probe.invoke(student_side.forward_ad, student, tuple(plain), [directions], None)
    for r in results:
        if isinstance(r, probe.ProbeError):
            _fail_error(f"{name} (forward)", r, shown, facts)
    run = found["runs"][0]
    error = _error_of(run["error"])
    if error is not None:
        _fail_error(f"forward AD of {name}", error, shown, facts)
    plus, minus = results
    want = [tuple(o.shape) for o in like]
    for p, m, t in zip(plus, minus, _tensor_list(run["tangents"], "tangents")):
        if tuple(p.shape) not in want or p.shape != m.shape:
            fail(f"{name}: at points a tiny step away from the input (finite differences), forward returned shapes "
                 f"{tuple(p.shape)[:8]} and {tuple(m.shape)[:8]}, where the reference returns {want[:4]}.", *shown,
                 cause="forward's output must have the same shape for every value of its input.")
        numeric = ((p - m) / (2 * eps)).cpu()
        if t is None or t.shape != numeric.shape or not torch.allclose(t.cpu().to(numeric.dtype), numeric, rtol=1e-3,
                                                                       atol=1e-5):
            compared = explain.differ(numeric, t.cpu().to(numeric.dtype), rtol=1e-3, atol=1e-5) if isinstance(
                t, torch.Tensor) and t.shape == numeric.shape else [f"forward AD gave {show(t)}"]
            fail(f"{name}: the output tangent of forward AD disagrees with finite differences of your own forward "
                 "(along a random direction; expected: the finite differences).", *shown, *compared,
                 cause="jvp must be the derivative of forward, linear in the tangents.")


# --- torch.compile ----------------------------------------------------------------------------

def check_compile(student: Any, name: str, reference: Reference, cases: Sequence[tuple], arg_names: Sequence[str],
                  generator: torch.Generator, *, backend: str = "aot_eager", fullgraph: bool = True,
                  in_graph: str | None = None, facts: dict | None = None) -> list[list[str]]:
    """The student's Function or op under torch.compile(backend=..., fullgraph=...): outputs
    and the gradients of <outputs, w> equal the reference's. Returns the operators of the
    compiled graphs (best effort); with `in_graph`, fails unless one of them contains it."""
    __tracebackhide__ = True
    facts = facts if facts is not None else describe(student)
    graphs: list[list[str]] = []
    compiled = f"torch.compile({name}, backend={backend!r}, fullgraph={fullgraph})"
    for device in devices.available():
        for case in cases:
            args = tuple(a.detach().to(device) if isinstance(a, torch.Tensor) else a for a in case)
            shown = _shown(arg_names, args)
            outs = _floating(reference(*args))
            weights = [_like(o, generator) for o in outs]
            with quiet():
                found = probe.invoke(student_side.compiled, student, args, weights, backend, fullgraph)
            error = _error_of(found["error"])
            if error is not None:
                _fail_error(f"{compiled}, {error.stage.split('(')[-1].rstrip(')')}", error, shown, facts)
            got = _tensor_list(found["outputs"], "outputs")
            with torch.no_grad():
                want = [o.detach() for o in probe.outputs_of(reference(*args))]
            if len(got) != len(want):
                fail(f"{compiled} returned {len(got)} tensor(s), expected {len(want)}.", *shown)
            for g, w in zip(got, want):
                _compare(f"{compiled}: forward", g, w, shown)
            names = _names(arg_names, args)
            for k, (g, w) in enumerate(zip(_tensor_list(found["grads"], "gradients"),
                                           _reference_grads(reference, args, weights))):
                _compare(f"{compiled}: gradient for `{names[student_side.slots_of(args)[k]]}`",
                         torch.zeros_like(w) if g is None else g, w, shown + [f"weights = {show(weights[0])}"])
            graphs += [[str(op) for op in g] for g in found.get("graphs") or [] if isinstance(g, list)]
    if in_graph is not None and not any(in_graph in op for g in graphs for op in g):
        fail(f"{compiled}: no compiled graph calls {in_graph}.",
             "operators in the graphs: " + ", ".join(sorted({op for g in graphs for op in g})[:12]),
             cause="the compiler traced through your code instead of calling the op: call the custom op itself.")
    return graphs


# --- torch.library custom ops -----------------------------------------------------------------

LSE_FAKE_CAUSE = ("the fake kernel must describe the real output exactly: its shape (the reduced dim removed), and "
                  "the input's dtype and device (`x.new_empty(shape)` keeps both; torch.empty(shape) would be float32 "
                  "on the CPU).")


def check_custom_op(op: Any, name: str, cases: Sequence[tuple], expected: Callable[[tuple], Sequence[tuple]],
                    *, namespace: str = NAMESPACE, fake_cause: str = LSE_FAKE_CAUSE) -> dict:
    """A torch.library.custom_op in `namespace`, with a fake kernel whose outputs have the
    shapes and dtypes `expected(args)` lists ([(shape, dtype), ...]) on every case, and that
    passes torch.library.opcheck on every case (opcheck's verdict is reported by the
    student's process: best effort; the other checks compute the numbers here)."""
    __tracebackhide__ = True
    facts = describe(op)
    if facts.get("kind") != "CustomOpDef":
        fail(f"{name} is a {facts.get('kind')}, not an op made with torch.library.custom_op.",
             cause=f'decorate the function with `@torch.library.custom_op("{namespace}::{name}", mutates_args=())`.')
    qualname = str(facts.get("name", ""))
    if not qualname.startswith(f"{namespace}::"):
        fail(f"{name} is registered as {qualname!r}, outside this notebook's namespace {namespace!r}.",
             cause=f'ops are registered globally by name; use "{namespace}::{name}" so that they do not collide '
             "with other notebooks' ops.")
    if not facts.get("fake"):
        fail(f"{qualname} has no fake kernel.",
             cause=f"register one with `@{name}.register_fake`: it returns an empty tensor of the output's shape "
             "and dtype, which torch.compile, opcheck and the meta device use instead of running your kernel.")
    if not facts.get("autograd"):
        fail(f"{qualname} has no autograd formula.",
             cause=f"`{name}.register_autograd(backward, setup_context=setup_context)`.")
    with quiet():
        for args in cases:
            shown = [f"x = {show(a)}" if isinstance(a, torch.Tensor) else repr(a) for a in args]
            fake = probe.invoke(student_side.fake_outputs, op, tuple(args))
            error = _error_of(fake["error"])
            if error is not None:
                _fail_error(f"{qualname} on fake tensors (its register_fake kernel)", error, shown, facts,
                            hint="the fake kernel may only look at shapes and dtypes (`x.shape`, `x.dtype`, "
                            "`x.new_empty(...)`), never at values (no NumPy, no `.item()`).")
            outs = fake["outputs"]
            want = list(expected(tuple(args)))
            if len(outs) != len(want):
                fail(f"{qualname}: the fake kernel returned {len(outs)} tensor(s), expected {len(want)}.", *shown)
            device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
            for out, (shape_, dtype) in zip(outs, want):
                got_shape, got_dtype, got_device = tuple(out["shape"]), out["dtype"], out["device"]
                want_dtype = str(dtype).removeprefix("torch.")
                if got_shape != tuple(shape_) or got_dtype != want_dtype or got_device != device:
                    fail(f"{qualname}: the fake kernel says shape {got_shape}, dtype {got_dtype} and device "
                         f"{got_device}; the op returns shape {tuple(shape_)}, dtype {want_dtype} and device {device}.",
                         *shown, cause=fake_cause)
        results = probe.invoke(student_side.opcheck, op, [tuple(a.detach() if isinstance(a, torch.Tensor) else a
                                                                for a in args) for args in cases])
    if not isinstance(results, list) or len(results) != len(cases):
        raise probe.Malformed("malformed opcheck report")
    for args, result in zip(cases, results):
        shown = [f"x = {show(a)}" if isinstance(a, torch.Tensor) else repr(a) for a in args]
        error = _error_of(result["error"])
        if error is not None:
            lines = [line for line in error.message.strip().splitlines() if line.strip()]
            fail(f"torch.library.opcheck({qualname}) failed.", *shown, *lines[:6],
                 cause=_opcheck_cause(error.message, error.type, facts))
        failed = {k: v for k, v in result["results"].items() if v != "SUCCESS"}
        if failed:
            fail(f"torch.library.opcheck({qualname}) did not pass: {failed}.", *shown)
    return facts


def _opcheck_cause(message: str, kind: str, facts: dict) -> str | None:
    if "test_faketensor" in message or "metadata mismatch" in message.lower():
        return ("the fake kernel and the real one disagree: the fake output must have exactly the shape, dtype "
                "and device the real kernel returns (did the NumPy result keep the input's dtype?).")
    if "test_autograd_registration" in message:
        return "register the backward with `op.register_autograd(backward, setup_context=setup_context)`."
    if "test_aot_dispatch" in message:
        return ("compiling the op (with symbolic shapes) failed: the fake kernel must use only shapes, and "
                "backward only torch operations on the saved tensors.")
    return transform_cause(message, kind, facts)


# --- What ctx keeps ----------------------------------------------------------------------------

JVP_READS = (" jvp reads back what `ctx.save_for_forward(...)` saved, from `ctx.saved_tensors` as well "
             "(call both save_for_backward and save_for_forward in setup_context).")


def check_what_is_kept(student: Any, name: str, args: tuple, *, jvp: bool = False) -> None:
    """Autograd holds what backward (and jvp) read: nothing is kept as an attribute of ctx
    (`ctx.x = x`), where autograd can neither check its version nor free it, nor anywhere
    else (a global, a class attribute) after forward and after backward; and backward
    changes no saved tensor (reported by the student's process: best effort)."""
    __tracebackhide__ = True
    with quiet():
        try:
            recording, backward = saved_checks.observe(student, devices.prepare(args, "cpu"))
        except probe.StudentError:
            return  # forward raises: the checks of values say why
    names = Names(args=probe.argument_names(student))
    if recording.stashed:
        path, s = next(iter(recording.stashed.items()))
        cycle = saved_checks.CYCLE if s.kind == "output" and s.graph else ""
        fail(f"{name}: `ctx.{path}` ({describe_saved(s, recording, names)}) is kept as an attribute of ctx instead of "
             "being saved.", cause=saved_checks.STASHED.format(cycle=cycle) + (JVP_READS if jvp else ""))
    saved_checks.check_nothing_kept(name, recording, names)
    saved_checks.check_backward_left_alone(name, recording, backward, names)


# === The exercises =============================================================================

# --- 10.1 ClippedReLU, ported: forward + setup_context, generate_vmap_rule --------------------

ClipCase = tuple[Shape, float]
CLIP_CASES: tuple[ClipCase, ...] = (((5,), 1.0), ((2, 3), 2))
FAR = (1e3, -1e3)  # far beyond both kinks, in every draw (the kinks themselves: _check_clip_kinks)


def _clipped_relu(x: torch.Tensor, clip: float) -> torch.Tensor:
    return x.clamp(0, clip)


def _clip_cases(specs: Sequence[ClipCase]):
    def cases(generator: torch.Generator) -> list[tuple]:
        return [(inputs.including(inputs.uniform(shape_, generator, -1.0, clip + 1.0, kinks=(0.0, clip)), FAR,
                                  generator), clip) for shape_, clip in specs]

    return cases


CLIPPED_RELU = FunctionSpec(name="ClippedReLU", reference=_clipped_relu, cases=_clip_cases(CLIP_CASES))


def _clip_vmap_cases(specs: Sequence[ClipCase], generator: torch.Generator) -> list[VmapCase]:
    found = []
    for k, (shape_, clip) in enumerate(specs):
        dim = (0, len(shape_), 1)[k % 3]  # the batch first, last, then second
        dim = dim if dim <= len(shape_) else 0
        xs = inputs.uniform(tuple(shape_[:dim]) + (3,) + tuple(shape_[dim:]), generator, -1.0, clip + 1.0,
                            kinks=(0.0, clip))  # away from the kinks, so not vmap_case's normal values
        found.append(VmapCase((xs, clip), ((dim, None),)))
    return found


def check_modern_style(student: Any, name: str) -> dict:
    """The Function has a setup_context staticmethod and a forward without ctx (as the
    student's process reports it: best effort, for a clear message before the numbers)."""
    __tracebackhide__ = True
    facts = describe(student)
    if facts.get("kind") != "Function":
        fail(f"{name} is a {facts.get('kind')}, not a torch.autograd.Function subclass.")
    params = facts.get("forward_params") or []
    if not facts.get("setup_context"):
        fail(f"{name} has no setup_context staticmethod: it is still a classic Function "
             f"(forward({', '.join(params)})), which torch.func cannot transform.",
             cause="write forward without ctx, and move what it did with ctx to "
             "`setup_context(ctx, inputs, output)`.")
    if params and params[0] == "ctx":
        fail(f"{name}.forward takes ctx (forward({', '.join(params)})), but the Function has a setup_context.",
             cause="with setup_context, forward receives the inputs only: `forward(x, clip)`. The ctx work "
             "belongs in setup_context(ctx, inputs, output).")
    return facts


KINK_CAUSE = ("at a kink the derivative jumps, and either side's slope (0 or 1 times grad_output, or a value "
              "between) is a fine answer; NaN, infinity or a slope outside [0, 1] is not. Does backward divide by x, "
              "or compute something undefined at exactly 0 or clip? A mask such as (x > 0) & (x < clip) is defined "
              "everywhere.")


def _check_clip_kinks(student: Any, specs: Sequence[ClipCase], generator: torch.Generator) -> None:
    """At exactly 0 and clip, forward equals x.clamp(0, clip), and backward gives a one-sided
    slope: grad_output times a finite number in [0, 1]. (gradcheck cannot judge a kink: its
    finite differences straddle it.)"""
    __tracebackhide__ = True
    for _, clip in specs:
        # Both kinks, at random places among values away from them (a slope in [0, 1] everywhere).
        x = inputs.including(inputs.uniform((5,), generator, -1.0, clip + 1.0, kinks=(0.0, clip)), [0.0, float(clip)],
                             generator).requires_grad_()
        g = 0.5 + torch.rand(5, generator=generator, dtype=torch.float64)  # positive: the slope is grad / g
        shown = [f"x = {show(x)} (0 and clip among them)", f"clip = {clip!r}", f"grad_output = {show(g)}"]
        with quiet():
            found = probe.run(student, (x, clip), [[g]])
        if found.error is not None:
            _fail_error(f"ClippedReLU at its kinks ({found.error.stage})", found.error, shown)
        _compare("ClippedReLU at its kinks: forward", found.outputs[0] if found.outputs else None,
                 _clipped_relu(x.detach(), clip), shown)
        grad = found.grads[0][0] if found.grads and found.grads[0] else None
        slope = None if grad is None else grad.detach().cpu() / g
        if slope is None:
            fail("ClippedReLU: backward at the kinks gives no gradient.", *shown, cause=KINK_CAUSE)
        bad = ~torch.isfinite(slope) | (slope < 0) | (slope > 1)
        if bool(bad.any()):
            (k,) = explain.first_index(bad)
            point = float(x.detach()[k])
            where = f"x = {point:g}" if point in (0.0, float(clip)) else f"entry {k} of x"
            fail(f"ClippedReLU: backward at the kinks gives {float(grad[k]):.6g} at {where}, grad_output times "
                 f"{float(slope[k]):.4g}.", *shown, f"gradient {show(grad)}", cause=KINK_CAUSE)


def check_clipped_relu(student: Any, *, cases: Sequence[ClipCase] = CLIP_CASES, seed: int | None = 0) -> None:
    """ClippedReLU(x, clip) with forward(x, clip) + setup_context and a generated vmap rule:
    values and gradients (±1000 in every draw; exactly at the kinks, the forward and a
    one-sided slope), nothing kept on ctx, then torch.func.grad, jacrev and vmap
    (per-sample gradients too)."""
    __tracebackhide__ = True
    check_modern_style(student, "ClippedReLU")
    spec = replace(CLIPPED_RELU, cases=_clip_cases(cases))
    check_function(student, spec, seed=seed)
    generator = _generator(seed)
    drawn = spec.cases(generator)
    _check_clip_kinks(student, cases, generator)
    check_what_is_kept(student, "ClippedReLU", drawn[0])
    passed("ClippedReLU at exactly 0 and clip: the forward is exact and backward gives a one-sided slope; "
           "what backward reads is saved, nothing kept on ctx or elsewhere.")
    check_func_grad(student, "ClippedReLU", _clipped_relu, drawn, ("x", "clip"), generator)
    passed(f"ClippedReLU under torch.func: grad and jacrev agree with autograd on {len(drawn)} input(s).")
    vmap_cases = _clip_vmap_cases(cases, generator)
    check_vmap(student, "ClippedReLU", _clipped_relu, vmap_cases, ("x", "clip"), generator)
    dims = ", ".join(str(c.levels[0]) for c in vmap_cases)
    passed(f"ClippedReLU under vmap (in_dims {dims}): outputs, per-sample gradients and gradients through vmap "
           "agree with a loop over the batch.")


# --- 10.2 A hand-written vmap rule -------------------------------------------------------------
# Cases: (per-sample shape of x and y, dim, in_dims of (x, y) per level outermost first, batch
# size per level).

VmapSpec = tuple[Shape, int, Sequence[tuple], Sequence[int]]

VMAP_RULE_CASES: tuple[VmapSpec, ...] = (
    ((4, 3), 1, [(0, None)], [5]),
    ((4, 3), 0, [(1, 0)], [3]),
    ((2, 3), -1, [(None, 2)], [4]),
)


def _squared_distance(x: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    return ((x - y) ** 2).sum(dim)


def _vmap_rule_cases(specs: Sequence[VmapSpec], generator: torch.Generator) -> list[VmapCase]:
    found = []
    for sample_shape, dim, levels, sizes in specs:
        sample = torch.empty(tuple(sample_shape), dtype=torch.float64)
        found.append(vmap_case((sample, sample, dim), [(d[0], d[1], None) for d in levels], sizes, generator))
    return found


def _vmap_rule_hint(case: VmapCase, actual: torch.Tensor | None, expected: torch.Tensor | None) -> str:
    dim = case.args[2]
    dims = case.levels[-1]
    causes = []
    if any(d not in (0, None) for d in dims[:2]):
        causes.append(f"in_dims {dims[:2]}: a batch dim is not always at 0 — move it there with "
                      "`x.movedim(in_dims[0], 0)` (and the same for y).")
    if None in dims[:2]:
        causes.append("an input with in_dims None has no batch dim at all: give it one, e.g. "
                      "`y.expand(info.batch_size, *y.shape)`.")
    if dim >= 0:
        causes.append(f"dim = {dim} counts the dims of one sample; with the batch dim in front it is dim + 1 "
                      "(a negative dim counts from the end and stays).")
    else:
        causes.append(f"dim = {dim} is negative: it counts from the end and stays the same with the batch in front.")
    return " Or: ".join(causes)


def check_vmap_rule(student: Any, *, cases: Sequence[VmapSpec] = VMAP_RULE_CASES, seed: int | None = 0) -> None:
    """SquaredDistance(x, y, dim), whose forward is NumPy, under vmap through its hand-written
    vmap staticmethod: outputs, per-sample gradients and gradients through vmap against a
    loop over the batch, for in_dims with None and non-zero dims (and nested vmap)."""
    __tracebackhide__ = True
    facts = describe(student)
    if facts.get("kind") == "Function" and not facts.get("vmap"):
        fail("SquaredDistance has no vmap staticmethod.",
             cause="write `def vmap(info, in_dims, x, y, dim)` as a @staticmethod returning (output, out_dims). "
             "generate_vmap_rule cannot help: it runs forward on batched tensors, and NumPy cannot read them.")
    generator = _generator(seed)
    drawn = _vmap_rule_cases(cases, generator)
    check_vmap(student, "SquaredDistance", _squared_distance, drawn, ("x", "y", "dim"), generator,
               hint=_vmap_rule_hint)
    described = "; ".join(
        f"in_dims {' then '.join(str(tuple(d[:2])) for d in c.levels)}, dim={c.args[2]}" for c in drawn)
    passed(f"SquaredDistance under vmap ({described}): outputs, per-sample gradients and gradients through vmap "
           "agree with a loop over the batch.")


# --- 10.3 jvp with save_for_forward ------------------------------------------------------------
# Cases: (x's shape, beta's shape).

SwishCase = tuple[Shape, Shape]
SWISH_CASES: tuple[SwishCase, ...] = (((4, 3), (3,)), ((5,), ()))
# In every draw: 0, and |βx| ≥ 2000 (β ≥ 0.2), where exp(-βx) overflows float64.
SWISH_SPECIAL = (0.0, 1e4, -1e4)


def _swish(x: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(beta * x)


def _swish_cases(specs: Sequence[SwishCase]):
    def cases(generator: torch.Generator) -> list[tuple]:
        return [(inputs.including(inputs.uniform(xs, generator, -3.0, 3.0), SWISH_SPECIAL, generator),
                 inputs.uniform(bs, generator, 0.2, 2.0)) for xs, bs in specs]

    return cases


SWISH = FunctionSpec(name="Swish", reference=_swish, cases=_swish_cases(SWISH_CASES))


def _swish_hint(which: int | None, args: tuple, tangents: list) -> str:
    if which == 0:
        return ("with s = σ(βx), the tangent is x_t · (s + βx·s(1 − s)) + β_t · x²·s(1 − s); here only x has a "
                "tangent: check the first term.")
    if which == 1:
        return ("with s = σ(βx), the tangent is x_t · (s + βx·s(1 − s)) + β_t · x²·s(1 − s); here only beta has a "
                "tangent: check the second term (β_t keeps beta's shape and broadcasts; it is not summed).")
    return "the tangent is the sum of both terms, x_t · ∂y/∂x + β_t · ∂y/∂β."


def check_swish_jvp(student: Any, *, cases: Sequence[SwishCase] = SWISH_CASES, seed: int | None = 0) -> None:
    """Swish(x, beta) with a jvp: dual tensors (a tangent on x, on beta, on both), jacfwd,
    hessian, and gradcheck(check_forward_ad=True); values and backward too; x holds 0 and
    ±10⁴ in every draw; nothing kept on ctx."""
    __tracebackhide__ = True
    spec = replace(SWISH, cases=_swish_cases(cases))
    check_function(student, spec, seed=seed)
    generator = _generator(seed)
    drawn = spec.cases(generator)
    check_what_is_kept(student, "Swish", drawn[0], jvp=True)
    check_forward_ad(student, "Swish", _swish, drawn, ("x", "beta"), generator, hint=_swish_hint)
    passed(f"Swish in forward mode: dual tensors (tangents for x, beta and both), jacfwd, hessian and "
           f"gradcheck(check_forward_ad=True) agree ({len(drawn)} inputs, float64, x = 0 and ±10⁴ among them); "
           "on float32 inputs the tangent is float32, with no float64 step (as your process reports it); "
           "what backward reads is saved, nothing kept on ctx or elsewhere.")


# --- 10.4 A custom op: register_fake, register_autograd, opcheck, torch.compile ----------------
# Cases: (x's shape, an offset added to every entry: ±1000 overflows a naive exp). Every draw
# also holds 0 and ±1000 themselves.
LARGE = (0.0, 1e3, -1e3)

OpCase = tuple[Shape, float]
OP_CASES: tuple[OpCase, ...] = (((3, 4), 0.0), ((2, 3, 5), 0.0))
OP_COMPILED: tuple[OpCase, ...] = (((3, 4), 0.0),)


def _lse(x: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(x, -1)


def _op_cases(specs: Sequence[OpCase]):
    def cases(generator: torch.Generator) -> list[tuple]:
        return [(inputs.including(2 * inputs.normal(s, generator) + offset, LARGE, generator),) for s, offset in specs]

    return cases


LOGSUMEXP_OP = FunctionSpec(name="logsumexp", reference=_lse, cases=_op_cases(OP_CASES), double_backward=True)
FLOAT32_CAUSE = "keep the input's dtype: convert the NumPy result with `.to(dtype=x.dtype)`."


def check_logsumexp_op(op: Any, *, cases: Sequence[OpCase] = OP_CASES, compiled: Sequence[OpCase] = OP_COMPILED,
                       seed: int | None = 0) -> None:
    """modern_api::logsumexp(x), log Σ exp over the last dim, as a torch.library.custom_op: its
    name, fake kernel and autograd formula; opcheck (the first case in float64, the last in
    float32); values, gradients and double backward (0 and ±1000 in every draw); nothing kept
    on ctx; float32; and torch.compile(backend="aot_eager", fullgraph=True)."""
    __tracebackhide__ = True
    generator = _generator(seed)
    drawn = _op_cases(cases)(generator)
    samples = [drawn[0], (drawn[-1][0].float(),)]
    facts = check_custom_op(op, "logsumexp", samples, lambda args: [(args[0].shape[:-1], args[0].dtype)])
    passed(f"{facts.get('name')}: a custom op with a fake kernel (right shapes and dtypes) and an autograd "
           f"formula; torch.library.opcheck passes ({len(samples)} samples, float64 and float32).")
    check_function(op, replace(LOGSUMEXP_OP, cases=_op_cases(cases)), seed=seed)
    check_what_is_kept(op, "logsumexp", drawn[0])
    x32 = drawn[0][0].float()
    with quiet():
        result = probe.forward_many(op, [(x32,)])[0]
    shown = [f"x = {show(x32)}"]
    if isinstance(result, probe.ProbeError):
        _fail_error("logsumexp on float32", result, shown, facts)
    got = result[0] if result else None
    if isinstance(got, torch.Tensor) and got.dtype != torch.float32:
        fail(f"logsumexp on a float32 input returns {got.dtype}.", *shown, cause=FLOAT32_CAUSE)
    _compare("logsumexp on a float32 input", got, _lse(x32), shown, cause=FLOAT32_CAUSE, rtol=1e-5, atol=1e-5)
    compile_cases = _op_cases(compiled)(generator)
    check_compile(op, "logsumexp", _lse, compile_cases, ("x",), generator, backend="aot_eager",
                  in_graph=f"{NAMESPACE}.logsumexp", facts=facts)
    passed(f"logsumexp under torch.compile(backend='aot_eager', fullgraph=True): forward and gradients agree "
           f"({', '.join(str(tuple(c[0].shape)) for c in compile_cases)}), and the graph calls the op.")


# --- 10.5 The modern pattern: a custom op with a vmap rule, called from a Function -------------
# Cases: x's shape (softmax over the last dim). Vmap cases: (one sample's shape, x's in_dims at
# each level outermost first, batch size per level); a batch at the last dim is the trap.

SoftmaxVmapSpec = tuple[Shape, Sequence[int], Sequence[int]]
SOFTMAX_CASES: tuple[Shape, ...] = ((3, 4), (2, 3, 5))
SOFTMAX_VMAP: tuple[SoftmaxVmapSpec, ...] = (((4,), [0], [3]), ((3, 3), [-1], [3]))
SOFTMAX_COMPILED: tuple[Shape, ...] = ((3, 4),)
SOFTMAX_FAKE_CAUSE = ("the fake kernel must describe the real output exactly: softmax keeps x's shape, and its output "
                      "has x's dtype and device (an empty tensor like x; torch.empty(shape) would be float32 on the "
                      "CPU).")


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def _softmax_cases(shapes: Sequence[Shape]):
    def cases(generator: torch.Generator) -> list[tuple]:
        return [(inputs.including(2 * inputs.normal(s, generator), LARGE, generator),) for s in shapes]

    return cases


SOFTMAX = FunctionSpec(name="Softmax", reference=_softmax, cases=_softmax_cases(SOFTMAX_CASES), double_backward=True)


def _softmax_vmap_cases(specs: Sequence[SoftmaxVmapSpec], generator: torch.Generator) -> list[VmapCase]:
    found = []
    for sample_shape, dims, sizes in specs:
        case = vmap_case((torch.empty(tuple(sample_shape), dtype=torch.float64),), [(d,) for d in dims], sizes,
                         generator)
        found.append(VmapCase((inputs.including(case.args[0], LARGE, generator),), case.levels))
    return found


def _softmax_vmap_hint(case: VmapCase, actual: torch.Tensor | None, expected: torch.Tensor | None) -> str:
    x, dim = case.args[0], case.levels[-1][0]
    if dim % x.dim() == x.dim() - 1:
        return (f"in_dims {dim}: the batch is at the last dim of what the rule receives, the dim softmax works "
                "along, so the op mixed the samples. Move the batch elsewhere first (`x.movedim(in_dims[0], 0)`) "
                "and return the out_dims where it is then.")
    return "the rule's out_dims must say where the batch is in the output it returns (0, if it moved it to the front)."


def check_softmax_pattern(op: Any, function: Any, *, cases: Sequence[Shape] = SOFTMAX_CASES,
                          vmap_cases: Sequence[SoftmaxVmapSpec] = SOFTMAX_VMAP,
                          compiled: Sequence[Shape] = SOFTMAX_COMPILED, seed: int | None = 0) -> None:
    """modern_api::softmax (softmax over the last dim, a NumPy kernel) as a custom op with a fake
    kernel, an autograd formula and a vmap rule, called from the Function `Softmax`: opcheck;
    values, gradients and double backward of the op and of the Function (0 and ±1000 in every
    draw); the op's vmap rule with vmap's per-sample fallback off; torch.func.grad, jacrev,
    vmap(grad(...)) and grad(vmap(...)) of the Function; a fullgraph torch.compile whose graph
    calls the op (the eager backend: opcheck has compiled the op with AOTAutograd already);
    nothing kept on ctx."""
    __tracebackhide__ = True
    generator = _generator(seed)
    drawn = _softmax_cases(cases)(generator)
    facts = check_custom_op(op, "softmax", drawn[:1], lambda args: [(args[0].shape, args[0].dtype)],
                            fake_cause=SOFTMAX_FAKE_CAUSE)
    check_function(op, replace(SOFTMAX, name="softmax", cases=_softmax_cases(cases)), seed=seed)
    check_what_is_kept(op, "softmax", drawn[0])
    rules = _softmax_vmap_cases(vmap_cases, generator)
    check_vmap(op, "softmax", _softmax, rules, ("x",), generator, per_sample=False, grad_of_vmap=False,
               hint=_softmax_vmap_hint, fallback=False)
    where = ", ".join(" then ".join(str(d[0]) for d in c.levels) for c in rules)
    passed(f"{facts.get('name')}: opcheck passes; values, gradients and double backward agree with torch.softmax; "
           f"its vmap rule agrees with a loop (x's in_dims {where}, vmap's fallback off).")
    check_modern_style(function, "Softmax")
    check_function(function, replace(SOFTMAX, cases=_softmax_cases(cases)), seed=seed)
    check_what_is_kept(function, "Softmax", drawn[0])
    check_func_grad(function, "Softmax", _softmax, drawn[:1], ("x",), generator)  # a Jacobian per entry: the smallest
    check_vmap(function, "Softmax", _softmax, _softmax_vmap_cases(vmap_cases, generator), ("x",), generator,
               hint=_softmax_vmap_hint, fallback=False)
    compile_cases = _softmax_cases(compiled)(generator)
    check_compile(function, "Softmax", _softmax, compile_cases, ("x",), generator, backend="eager",
                  in_graph=f"{NAMESPACE}.softmax")
    passed("Softmax (the Function): torch.func.grad and jacrev, vmap, per-sample gradients (vmap of grad) and "
           "grad of vmap agree with autograd and loops; torch.compile(backend='eager', fullgraph=True) gives the "
           "same values and gradients, and its graph calls the op; neither keeps a tensor on ctx.")
