"""Check a student's differentiable function against a reference.

For every case (seeded float64 inputs kept away from kinks) and every available device,
the student's code and the reference are probed with the same random grad_outputs; the
forward values, the gradients and, where the exercise promises it, the second-order
gradients must agree. Then torch's own `gradcheck` (and `gradgradcheck`) must pass, and
a run on the `meta` device must not hit a tensor hard-coded on the CPU.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.autograd.gradcheck import GradcheckError

from ..student import devices, introspect, probe
from ..student.report import fail, note, passed, quiet, shape, show
from . import evidence as evidence_module
from . import explain, inputs

Hint = Callable[[tuple, int, torch.Tensor], "str | None"]


@dataclass(frozen=True)
class FunctionSpec:
    """What a graded differentiable function must do.

    `cases(generator)` returns argument tuples (float64 tensors on the CPU, plus any
    non-tensor arguments); floating-point tensors are differentiated. `hint(args, i,
    wrong)` may name the misconception behind a wrong gradient for input `i`, given the
    boolean mask of wrong entries.
    """

    name: str
    reference: Callable[..., Any]
    cases: Callable[[torch.Generator], list[tuple]]
    double_backward: bool = False
    # Exercises ask for a gradient formula: a Function that lets autograd compute it fails
    # (watched in the student's process: best effort; introspect.AutogradWatch).
    autograd_in_backward: bool = False
    hint: Hint | None = None
    rtol: float = 1e-6
    atol: float = 1e-9
    # The Function keeps its input's dtype (as torch's own functions do): it is run in
    # float32 too, whose outputs must be float32 and close to the reference's.
    keeps_dtype: bool = True
    # Backward deliberately is not the derivative of forward (a straight-through estimator,
    # gradient reversal): gradcheck does not apply, the reference's gradients judge it.
    surrogate_gradient: bool = False


def check_function(student: Any, spec: FunctionSpec, *, seed: int | None = 0) -> None:
    """Raise CheckFailed on the first disagreement; print one line when all agree.

    `seed=None` draws fresh inputs (hidden tests), an int reproduces them.
    """
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    with quiet():
        names = probe.argument_names(student)
        cases = spec.cases(generator)
        partial: set[str] = set()
        for device in devices.available():
            plans = [_plan(spec, devices.prepare(args, device), names, generator) for args in cases]
            for args, plan, actual in zip(cases, plans, probe.run_many(student, [plan.run for plan in plans])):
                rounded = _agree(student, spec, plan, actual, names)
                partial |= _agree_in_part(student, spec, devices.prepare(args, device), names, generator)
                if isinstance(student, probe.StudentProxy):
                    if not spec.surrogate_gradient:
                        _finite_differences(student, spec, plan, actual, names, generator, rounded=rounded)
                    if spec.double_backward:
                        _second_finite_differences(student, spec, plan, actual, names, generator)
                else:
                    _gradcheck(student, spec, devices.prepare(args, device), names, rounded=rounded)
        if spec.keeps_dtype:
            _in_float32(student, spec, cases[0], names, generator)
        meta = on_meta(student, cases, names)
    checked = "forward, backward and double backward" if spec.double_backward else "forward and backward"
    # For a student's object in another process, the grader's own finite differences (of
    # the student's forward, and of the student's backward for double backward) stand in
    # for gradcheck and gradgradcheck: the same method, numbers computed where student code
    # never runs.
    tools = "gradcheck and gradgradcheck pass" if spec.double_backward else "gradcheck passes"
    if spec.surrogate_gradient:
        tools = "gradgradcheck passes" if spec.double_backward else "gradcheck not run (a surrogate gradient)"
    passed(
        f"{spec.name}: {checked} agree with the reference on {len(cases)} input(s); "
        f"{tools} (float64, {', '.join(devices.available())})."
    )
    tried = [what for what in ("each combination of inputs requiring grad",
                               "each output used alone") if what in partial]
    note(", ".join(["grad_output given not contiguous and expanded", *tried]) + ": the gradients agree too.")
    if spec.keeps_dtype:
        note("float32 inputs: outputs in float32, no float64 step in forward or backward (as your process reports "
             "it), values and gradients as the reference's.")
    note(meta)
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


def _like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device)


def _fresh(args: tuple) -> tuple:
    """Copies of the arguments for the reference (the student's code must not touch them)."""
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args)


def _labels(names: Sequence[str], n: int) -> list[str]:
    """A name for each of `n` arguments: the student's own names where known."""
    return [names[i] if i < len(names) else f"input {i}" for i in range(n)]


# How each layout of grad_output (probe.run) is described when backward fails on it.
LAYOUT_WORDS = {
    "strided": "a grad_output that is not contiguous (as autograd passes after a transpose or a slice)",
    "expanded": "an expanded grad_output (one value in memory seen at every position, as `y.sum().backward()` passes)",
}
LAYOUTS = ["strided", "expanded"]  # of the random grad_outputs, and of the ones


@dataclass
class _Plan:
    """One case of `_agree`: the student's run to make, and what the reference gave."""

    args: tuple
    shown: list[str]  # the arguments, described before the student's forward could change them
    grad_outputs: list[list[torch.Tensor]]
    expected: probe.Observed
    run: probe.Run


def _plan(spec: FunctionSpec, args: tuple, names: list[str], generator) -> _Plan:
    """The reference's forward, backward (random and constant grad_outputs) and double
    backward on `args`, and the same run to ask of the student's code."""
    ref_args = _fresh(args)
    outs = [o for o in probe.outputs_of(spec.reference(*ref_args)) if probe.differentiable(o)]
    grad_outputs = [[_like(o, generator) for o in outs], [torch.ones_like(o) for o in outs]]
    wrt = [a for a in args if probe.differentiable(a)]
    grad_grads = [_like(a, generator) for a in wrt] if spec.double_backward else None
    expected = probe.run(spec.reference, ref_args, grad_outputs, grad_grads)
    if expected.error:
        raise RuntimeError(f"reference of {spec.name}: {expected.error}")
    return _Plan(args, _describe(args, names), grad_outputs, expected,
                 probe.Run(args, grad_outputs, grad_grads, LAYOUTS, watch=not spec.autograd_in_backward))


def _agree(student: Any, spec: FunctionSpec, plan: _Plan, actual: probe.Observed, names: list[str]) -> bool:
    """Fail unless the student's run agrees with the reference's; return whether its
    forward values are float32 numbers (see `_compare_outputs`)."""
    __tracebackhide__ = True
    args, shown, grad_outputs, expected = plan.args, plan.shown, plan.grad_outputs, plan.expected
    outs = [o for o in expected.outputs if probe.differentiable(o)]
    labels = _labels(names, len(args))
    error = actual.error

    if error and error.stage == "forward":
        _fail_error(spec, error, names, shown, args)
    rounded = _compare_outputs(spec, expected.outputs, actual.outputs, shown)
    if actual.modified:
        fail(
            f"{spec.name}: forward modified its input `{labels[actual.modified[0]]}` in place.",
            *shown, "(the values above are those before the call)",
            cause="the caller's tensor must stay unchanged: compute a new tensor "
            "(e.g. `x.clamp(...)`, not `x.clamp_(...)`).",
        )
    _check_grad_outputs_left_alone(spec, actual, shown)
    if error and error.stage == "backward":
        _fail_error(spec, error, names, shown, args, layout=_failed_layout(actual))
    if actual.asked_autograd:
        _fail_asking_autograd(spec, actual.asked_autograd, shown)
    if actual.unwatched:  # best effort: no verdict without evidence, but a person may want to know why
        evidence_module.worth_a_look(f"{spec.name}: whether its Function asks autograd could not be watched "
                                     f"({actual.unwatched})")

    wrt_names = [n for n, a in zip(labels, args) if probe.differentiable(a)]
    _compare_grads(spec, args, wrt_names, expected.grads[0], actual.grads[0], expected.grads[1],
                   shown + _given(grad_outputs[0]))
    if len(actual.grads) > 1:  # the expanded grad_output of ones: the same gradient, laid out otherwise
        _compare_grads(spec, args, wrt_names, expected.grads[1], actual.grads[1], None,
                       shown + ["grad_output = ones, expanded (as `y.sum().backward()` passes it)"])
    if spec.double_backward:
        if error:  # double backward stage
            _fail_error(spec, error, names, shown, args)
        targets = [f"`{n}`" for n in wrt_names] + ["grad_output"] * len(outs)
        for target, want, got in zip(targets, expected.grads2, actual.grads2):
            _compare_second(student, spec, target, want, got, shown, args, names)
    return rounded


KEEP_DTYPE = ("keep the input's dtype: a float64 constant (`torch.tensor(..., dtype=torch.float64)`, `.double()`) or "
              "NumPy's float64 result pulls a float32 input up to float64. Make constants with `x.new_tensor(...)` or "
              "`torch.ones_like(x)`, and convert back with `.to(x.dtype)`.")


def _in_float32(student: Any, spec: FunctionSpec, args: tuple, names: list[str], generator) -> None:
    """Given float32 inputs (requiring grad, as in `_agree`), the outputs are float32, no step
    of forward or backward makes a float64 tensor (autograd's engine would cast a gradient
    computed so back to float32 without a word), and the values and gradients are those of
    the reference in float32 (to float32's precision)."""
    __tracebackhide__ = True
    single = devices.prepare(tuple(a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.float64 else a
                                   for a in args), "cpu")
    ref_args = _fresh(single)
    outs = [o for o in probe.outputs_of(spec.reference(*ref_args)) if probe.differentiable(o)]
    grad_outputs = [[_like(o, generator) for o in outs]]
    expected = probe.run(spec.reference, ref_args, grad_outputs)
    (actual,) = probe.run_many(student, [probe.Run(single, grad_outputs, dtypes=True)])
    shown = _describe(single, names)
    if actual.error:
        _fail_error(spec, actual.error, names, shown, single)
    if len(actual.outputs) != len(expected.outputs):
        fail(f"{spec.name}: given float32 inputs, forward returned {len(actual.outputs)} tensor(s), expected "
             f"{len(expected.outputs)}.", *shown)
    for k, (want, got) in enumerate(zip(expected.outputs, actual.outputs)):
        label = "forward" if len(expected.outputs) == 1 else f"forward output {k}"
        if got.dtype != want.dtype:
            fail(f"{spec.name}: given float32 inputs, {label} returned {got.dtype}, expected {want.dtype}.", *shown,
                 cause=KEEP_DTYPE)
    if actual.widened:
        fail(f"{spec.name}: given float32 inputs, your code computes in float64: {actual.widened} (as your "
             "process reports it).", *shown,
             cause=KEEP_DTYPE + " A gradient computed in float64 is cast back to float32 by autograd's engine without "
             "a word: its values look right, at twice the memory and, on a GPU, many times the time.")
    pairs = [*zip(expected.outputs, actual.outputs), *zip(expected.grads[0], actual.grads[0])]
    for want, got in pairs:
        if want is None or got is None:
            continue  # (the float64 run judged which gradients there are)
        scale = 1 + float(want.abs().amax()) if want.numel() else 1
        if want.is_floating_point() and got.shape == want.shape and not torch.allclose(
                got.cpu().double(), want.cpu().double(), rtol=1e-3, atol=1e-4 * scale):
            fail(f"{spec.name}: given float32 inputs, the values or gradients differ from the reference's in float32 "
                 "by more than float32's rounding.", *shown, *explain.differ(want, got, rtol=1e-3, atol=1e-4 * scale),
                 cause="a step that loses float32's precision (a sum of large terms that cancel, an exp that "
                 "overflows in float32), or a value computed from something other than the input.")


def _failed_layout(actual: probe.Observed) -> str | None:
    """The layout of the grad_output set whose backward raised (sets run in order)."""
    k = len(actual.grads)
    return LAYOUTS[k] if k < len(LAYOUTS) else None


def _check_grad_outputs_left_alone(spec: FunctionSpec, actual: probe.Observed, shown: list[str]) -> None:
    __tracebackhide__ = True
    if actual.modified_grad_outputs:
        fail(
            f"{spec.name}: backward modified grad_output in place.", *shown,
            cause="grad_output belongs to autograd: the same tensor may also be the gradient of another "
            "use of the output, or the caller's own tensor passed to `.backward(g)`, which then changes "
            "under their feet. Compute a new tensor (`grad_output * mask`, not `grad_output[~mask] = 0`), "
            "or clone grad_output first.",
        )


def _agree_in_part(student: Any, spec: FunctionSpec, args: tuple, names: list[str], generator) -> set[str]:
    """With only some inputs requiring grad (every combination, which `ctx.needs_input_grad`
    tells backward), and with each output used alone (the others then give backward zeros,
    or None with `ctx.set_materialize_grads(False)`), the gradients still agree. Returns
    what there was to try."""
    __tracebackhide__ = True
    slots = [i for i, a in enumerate(args) if probe.differentiable(a)]
    labels = _labels(names, len(args))
    n_outs = len([o for o in probe.outputs_of(spec.reference(*_fresh(args))) if probe.differentiable(o)])
    runs: list[tuple[tuple[int, ...], int | None]] = []
    if len(slots) > 1:
        runs += [(subset, None) for r in range(1, len(slots)) for subset in itertools.combinations(slots, r)]
    if n_outs > 1:
        runs += [(tuple(slots), k) for k in range(n_outs)]
    planned = []  # (subset, only, the arguments, grad_outputs, what the reference gives)
    for subset, only in runs:
        part = tuple(
            a.detach().clone().requires_grad_(i in subset) if i in slots else a for i, a in enumerate(args)
        )
        ref_args = _fresh(part)
        outs = [o for o in probe.outputs_of(spec.reference(*ref_args)) if probe.differentiable(o)]
        grad_outputs = [[_like(o, generator) if only is None or k == only else None for k, o in enumerate(outs)]]
        expected = probe.run(spec.reference, ref_args, grad_outputs)
        if expected.error:
            raise RuntimeError(f"reference of {spec.name}: {expected.error}")
        planned.append((subset, only, part, grad_outputs, expected))
    actuals = probe.run_many(student, [probe.Run(part, grad_outputs, None, LAYOUTS[:1])
                                       for _, _, part, grad_outputs, _ in planned])
    for (subset, only, part, grad_outputs, expected), actual in zip(planned, actuals):
        if only is None:
            needing = " and ".join(f"`{labels[i]}`" for i in subset)
            when = f"when only {needing} {'requires' if len(subset) == 1 else 'require'} grad"
        else:
            when = f"when only output {only} is used (the other outputs get no gradient)"
        shown = _describe(part, names)
        if actual.error:
            _fail_error(spec, actual.error, names, shown, part, layout=_failed_layout(actual), when=when)
        _check_grad_outputs_left_alone(spec, actual, shown)
        wrt_names = [labels[i] for i in subset]
        _compare_grads(spec, part, wrt_names, expected.grads[0], actual.grads[0], None,
                       shown + _given(grad_outputs[0]), when=when)
    return ({"each combination of inputs requiring grad"} if len(slots) > 1 else set()) | (
        {"each output used alone"} if n_outs > 1 else set())


def _given(grad_outputs: list) -> list[str]:
    """The grad_outputs of one backward, for a message (one per output; None: not used)."""
    if len(grad_outputs) == 1:
        return [f"grad_output = {show(grad_outputs[0])}"]
    return [f"grad_output {k} = {'None (output not used)' if v is None else show(v)}"
            for k, v in enumerate(grad_outputs)]


def _describe(args: tuple, names: list[str]) -> list[str]:
    return [f"{n} = {show(a)}" for n, a in zip(_labels(names, len(args)), args)]


def _shapes(args: tuple) -> list[tuple[int, ...] | None]:
    return [tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args]


def _fail_error(spec: FunctionSpec, error: probe.ProbeError, names: list[str], shown: list[str],
                args: tuple = (), layout: str | None = None, when: str = "") -> None:
    __tracebackhide__ = True
    what, cause = explain.error(error.stage, error.type, error.message, _labels(names, len(args)) if args else names,
                                arg_shapes=_shapes(args))
    about_layout = any(w in error.message for w in ("view size", "contiguous", "stride", "memory location"))
    given = f" (given {LAYOUT_WORDS[layout]})" if layout in LAYOUT_WORDS and about_layout else ""
    fail(f"{spec.name}: {what}{given}{' ' + when if when else ''}.", *shown, cause=cause)


def _float32_rounded(want: torch.Tensor, got: torch.Tensor) -> bool:
    """Every value of `got` is a float32 number close to `want`, whose values are not all
    float32 numbers: `got` was computed in float32 (and cast back to float64, by the
    student or by autograd's engine). Used to name a failure's cause, never to fail."""
    if got.dtype != torch.float64 or want.dtype != torch.float64 or got.shape != want.shape or not got.numel():
        return False
    got, want = got.cpu(), want.cpu()
    if not torch.isfinite(want).all() or not torch.isfinite(got).all():
        return False
    scale = float(want.abs().max())
    near = bool(torch.allclose(got, want, rtol=1e-4, atol=1e-5 * scale))  # within float32's rounding errors
    return near and bool(torch.equal(got, got.float().double())) and not bool(torch.equal(want, want.float().double()))


def _float32_close(want: torch.Tensor, got: torch.Tensor) -> bool:
    """Every value of `got` (float64) is within float32's rounding of `want`, and some not within
    float64's: part of it was computed in float32 (or nudged by an epsilon). Used to name a
    failure's cause, never to fail."""
    if got.dtype != torch.float64 or want.dtype != torch.float64 or got.shape != want.shape or not got.numel():
        return False
    got, want = got.cpu(), want.cpu()
    if not torch.isfinite(want).all() or not torch.isfinite(got).all():
        return False
    return bool(torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max())))  # as _float32_rounded


FLOAT32 = (
    "a tensor created with the default dtype (`torch.tensor(...)`, `torch.ones(n)`, a mask turned into a "
    "number with `.float()`) pulls the computation down to float32. Keep the input's dtype: "
    "`torch.ones_like(x)`, `x.new_tensor(...)`, `.to(x.dtype)`."
)


ROUNDED = (
    "your forward computes in float32: its values agree with the reference only to float32's 7 digits, "
    "and finite differences of them (steps of 1e-6) are rounding noise. " + FLOAT32
)


def _compare_outputs(spec, expected: list, actual: list, shown: list[str]) -> bool:
    """Fail unless the outputs agree; return whether they agree only as float32 numbers do
    (close, but every value rounded to float32: finite differences of them are noise)."""
    __tracebackhide__ = True
    if len(actual) != len(expected):
        fail(f"{spec.name}: forward returned {len(actual)} tensor(s), expected {len(expected)}.", *shown)
    for k, (want, got) in enumerate(zip(expected, actual)):
        label = "forward" if len(expected) == 1 else f"forward output {k}"
        if got.shape != want.shape:
            fail(f"{spec.name}: {label} has shape {shape(got)}, expected {shape(want)}.", *shown)
        if got.dtype != want.dtype:
            fail(
                f"{spec.name}: {label} has dtype {got.dtype}, expected {want.dtype}.", *shown,
                cause="keep the dtype of the input (avoid hard-coded dtypes and `.float()`).",
            )
        want, got = want.cpu(), got.cpu()
        same = torch.equal(got, want) if not want.is_floating_point() else torch.allclose(
            got, want, rtol=spec.rtol, atol=spec.atol, equal_nan=True
        )
        if not same:
            fail(
                f"{spec.name}: {label} has wrong values.", *shown,
                *explain.differ(want, got, rtol=spec.rtol, atol=spec.atol),
                cause=f"every value is rounded to float32: {FLOAT32}" if _float32_rounded(want, got) else None,
            )
    return any(_float32_rounded(want.cpu(), got.cpu()) for want, got in zip(expected, actual))


def _is_zero(t: torch.Tensor | None) -> bool:
    return t is None or not bool(t.any())


def _compare_grads(spec, args, wrt_names, want, got, want_ones, shown, when: str = "") -> None:
    __tracebackhide__ = True
    for i, (w, g) in enumerate(zip(want, got)):
        others = [(n, o) for j, (n, o) in enumerate(zip(wrt_names, want)) if j != i and o is not None]
        _compare_grad(spec, args, i, wrt_names[i], w, g, None if want_ones is None else want_ones[i], shown,
                      others=others, when=when)


def _compare_grad(spec, args, i, name, want, got, want_ones, shown, *, others=(), when: str = "") -> None:
    __tracebackhide__ = True
    label = f"{spec.name}: wrong gradient for `{name}`{' ' + when if when else ''}"
    if got is None:
        if _is_zero(want):
            return
        fail(f"{label}: backward returned None, but `{name}` needs a gradient.", *shown,
             f"expected {show(want)}",
             cause="None tells autograd the gradient is known to be zero. Return a gradient for every input "
             "whose `ctx.needs_input_grad[i]` is True (check the index you test), and None only for the others.")
    if want is None:
        want = torch.zeros_like(got)
    want, got, want_ones = want.cpu(), got.cpu(), None if want_ones is None else want_ones.cpu()
    if got.shape != want.shape:
        fail(f"{label}: shape {shape(got)}, expected {shape(want)}.", *shown,
             cause=explain.shape_cause(tuple(got.shape), tuple(want.shape)))
    if torch.allclose(got, want, rtol=spec.rtol, atol=spec.atol):
        return
    wrong = ~torch.isclose(got, want, rtol=spec.rtol, atol=spec.atol)
    swapped = _swapped(got, name, others, spec)
    causes = [swapped or explain.gradient_cause(want, got, want_ones, rtol=spec.rtol, atol=spec.atol)]
    if _float32_rounded(want, got):
        causes = [f"every value is rounded to float32 (autograd's engine casts a float32 gradient back to "
                  f"float64 without a word): {FLOAT32}"]
    elif _float32_close(want, got):
        causes = [f"every value agrees with the reference to float32's precision (about 7 digits of each input), "
                  f"and no more: part of backward computes in float32, and autograd's engine casts the result back "
                  f"to float64 without a word ({FLOAT32}); or it adds a small constant, an epsilon, that the formula "
                  f"does not have."]
    elif spec.hint is not None:
        causes.append(spec.hint(tuple(a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args), i, wrong))
    cause = " ".join(c for c in causes if c) or None
    fail(
        f"{label}.", *shown, *explain.differ(want, got, rtol=spec.rtol, atol=spec.atol), cause=cause,
    )


def _swapped(got: torch.Tensor, name: str, others, spec) -> str | None:
    """The gradient returned for `name` is the one another input needs: the order is off."""
    for other, want in others:
        want = want.cpu()
        if want.shape == got.shape and torch.allclose(got, want, rtol=spec.rtol, atol=spec.atol) and bool(want.any()):
            return (f"this is the gradient for `{other}`: backward returns the gradients in the order of "
                    f"forward's inputs, one per input.")
    return None


def _compare_second(student, spec, target: str, want, got, shown, args, names) -> None:
    __tracebackhide__ = True
    if _is_zero(want) and _is_zero(got):
        return
    if want is None:
        want = torch.zeros_like(got)
    if got is not None and got.shape != want.shape:
        fail(f"{spec.name}: double backward is wrong: the gradient of your gradient with respect to {target} has "
             f"shape {shape(got)}, expected {shape(want)}.", *shown)
    if got is not None and torch.allclose(got.cpu(), want.cpu(), rtol=spec.rtol, atol=spec.atol):
        return
    if _is_zero(got) and target == "grad_output":
        cause = (
            "the gradient of your gradient with respect to grad_output is missing. Backward is "
            "linear in grad_output, so this derivative is the backward formula itself: if your "
            "backward is a Function of its own (like CubeBackward), its backward must return it."
        )
    elif _is_zero(got):
        cause = _not_differentiable(student, args, names)
    else:
        cause = "the derivative of your backward formula is wrong (check the backward of your backward)."
    fail(
        f"{spec.name}: double backward is wrong: the gradient of your gradient with respect "
        f"to {target} differs from the reference.",
        *shown,
        *(explain.differ(want, got, rtol=spec.rtol, atol=spec.atol) if got is not None else
          [f"expected {show(want)}", "actual   zero (not connected to the graph)"]),
        cause=cause,
    )


def _not_differentiable(student: Any, args: tuple, names: list[str]) -> str:
    """Why autograd could not differentiate a backward: an intermediate that forward saved
    (found by recording the call; best effort), or values it cannot follow."""
    from . import saved  # (saved's checks build on this module's neighbours, not on it)

    try:
        recording, _ = saved.observe(student, _fresh(args))
    except Exception:  # the student's code may raise anything; the caller has a message anyway
        recording = None
    if recording is not None and recording.function:
        kept = [(None, s) for s in recording.saved] + list(recording.stashed.items())
        found = [(path, s) for path, s in kept if s.kind == "intermediate"]
        if found:
            path, s = found[0]
            where = f"stashed as `ctx.{path}`" if path else "given to save_for_backward"
            return (
                f"your backward uses an intermediate saved in forward (of shape {s.shape}, {where}). Forward runs "
                "without recording a graph, so to autograd an intermediate is a constant, and a gradient computed "
                "from it cannot be differentiated again, however it was kept. Keep inputs or outputs only, and "
                "recompute the rest in backward with torch operations."
            )
    return (
        "your backward computes with values autograd cannot follow: `.detach()`, `.data`, `torch.no_grad()`, "
        "NumPy or `@once_differentiable`. Compute the gradient with torch operations from grad_output and the "
        "saved inputs and outputs."
    )


def _gradcheck(student: Any, spec: FunctionSpec, args: tuple, names: list[str], *, rounded: bool = False) -> None:
    __tracebackhide__ = True
    call = probe.as_callable(student)
    slots = [i for i, a in enumerate(args) if probe.differentiable(a)]

    def fn(*tensors):
        full = list(args)
        for i, t in zip(slots, tensors):
            full[i] = t
        return call(*full)

    tensors = tuple(args[i] for i in slots)
    checks = [] if spec.surrogate_gradient else [("gradcheck", torch.autograd.gradcheck)]
    if spec.double_backward:
        checks.append(("gradgradcheck", torch.autograd.gradgradcheck))
    for label, check in checks:
        # Along random directions first (a fraction of the cost); entry by entry only to report.
        try:
            error = _gradcheck_error(check, fn, tensors, fast_mode=True) and _gradcheck_error(check, fn, tensors)
        except Exception as exc:  # the student's code may raise anything inside gradcheck
            what, cause = explain.error("backward", type(exc).__name__, str(exc), _labels(names, len(args)),
                                        arg_shapes=_shapes(args))
            fail(f"{spec.name}: in torch.autograd.{label}, {what}.", *_describe(args, names), cause=cause)
        if error is not None:
            lines = str(error).strip().splitlines()
            fail(
                f"{spec.name}: torch.autograd.{label} failed"
                + (" although the values agree with the reference." if spec.reference is not None else "."),
                *(lines[:12] + (["..."] if len(lines) > 12 else [])),
                cause=ROUNDED if rounded else explain.gradcheck_cause(str(error), label, spec.reference is not None),
            )


def _gradcheck_error(check: Callable, fn: Callable, tensors: tuple, fast_mode: bool = False) -> GradcheckError | None:
    try:
        check(fn, tensors, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=fast_mode)
    except GradcheckError as error:
        return error
    return None


DIRECTIONS = 2  # random directions per input: a wrong entry escapes both with probability 0


def _finite_differences(student: probe.StudentProxy, spec: FunctionSpec, plan: _Plan, actual: probe.Observed,
                        names: list[str], generator: torch.Generator, eps: float = 1e-6, *,
                        rounded: bool = False) -> None:
    """gradcheck for code that runs elsewhere: central differences of the student's own
    forward values, computed here, against the student's vector-Jacobian products (those of
    `_agree`'s run, for its random grad_outputs).

    As gradcheck's fast_mode: along random directions u of each input, the difference
    quotient of <f, v> must equal <vjp(v), u>, which takes 2 forwards per direction
    instead of 2 per entry. Only when one disagrees are the entries of that input
    differenced one by one, to name the wrong one."""
    __tracebackhide__ = True
    args = plan.args
    slots = [i for i, a in enumerate(args) if probe.differentiable(a)]
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    moves = [(i, _direction(plain[i], generator)) for i in slots for _ in range(DIRECTIONS)]
    vs = plan.grad_outputs[0]
    forwards = _forwards(student, spec, plain, [(i, u * eps) for i, u in moves], names, args, vs)
    if not forwards:
        return
    grads = {i: torch.zeros_like(plain[i]) if g is None else g for i, g in zip(slots, actual.grads[0])}
    for (i, u), (plus, minus) in zip(moves, forwards):
        numeric = _slope(plus, minus, vs, eps)
        if not _close(numeric, float((grads[i].cpu() * u.cpu()).sum())):
            _locate(student, spec, plain, i, grads[i].cpu(), vs, names, args, eps, rounded)


def _direction(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random direction of `x`'s shape, dtype and device (drawn on the CPU's generator)."""
    return torch.randn(x.shape, generator=generator, dtype=x.dtype).to(x.device)


def _second_finite_differences(student: probe.StudentProxy, spec: FunctionSpec, plan: _Plan, actual: probe.Observed,
                               names: list[str], generator: torch.Generator, eps: float = 1e-6) -> None:
    """gradgradcheck for code that runs elsewhere: along a random direction u of each input,
    central differences of the student's own vector-Jacobian product <vjp(x; v), w> must
    equal <d/dx, u> of the student's double backward (`_agree`'s run, for its v and w); and
    since a vjp is linear in v, its derivative along a direction dv of grad_output is
    <vjp(x; dv), w>."""
    __tracebackhide__ = True
    args, base = plan.args, actual
    if base.error or base.grads2 is None:
        return  # the comparison with the reference has said what is wrong
    slots = [i for i, a in enumerate(args) if probe.differentiable(a)]
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    labels = _labels(names, len(args))
    vs, ws = plan.grad_outputs[0], list(plan.run.grad_grads or [])

    def with_grad(values: list) -> tuple:
        return tuple(v.detach().clone().requires_grad_() if i in slots else v for i, v in enumerate(values))

    us = [_direction(plain[i], generator) for i in slots]
    dvs = [_direction(v, generator) for v in vs]
    # All in one request: x ± eps·u along each input, and the point itself with dv.
    points = []
    for i, u in zip(slots, us):
        points += [probe.Run(with_grad([p + sign * eps * u if k == i else p for k, p in enumerate(plain)]), [vs])
                   for sign in (1, -1)]
    points.append(probe.Run(with_grad(plain), [dvs]))
    *sides, along = probe.run_many(student, points)
    if any(side.error for side in sides) or along.error:
        return

    def pairing(grads: list) -> float:
        return sum(float((g.cpu() * w.cpu()).sum()) for g, w in zip(grads, ws) if g is not None)

    def disagree(target: str) -> None:
        __tracebackhide__ = True
        fail(
            f"{spec.name}: double backward disagrees with finite differences of your own backward "
            f"(with respect to {target}, along a random direction).",
            *_describe(args, names),
            cause="the backward's own derivative is off: double backward must be the derivative of backward.",
        )

    for n, (i, u) in enumerate(zip(slots, us)):
        plus, minus = sides[2 * n], sides[2 * n + 1]
        numeric = (pairing(plus.grads[0]) - pairing(minus.grads[0])) / (2 * eps)
        second = base.grads2[n]
        analytical = 0.0 if second is None else float((second.cpu() * u.cpu()).sum())
        if not _close(numeric, analytical):
            disagree(f"`{labels[i]}`")
    numeric = pairing(along.grads[0])
    analytical = sum(0.0 if g is None else float((g.cpu() * dv.cpu()).sum())
                     for g, dv in zip(base.grads2[len(slots):], dvs))
    if not _close(numeric, analytical):
        disagree("grad_output")


def _forwards(student, spec, plain: list, steps: list[tuple[int, torch.Tensor]], names,
              args, like: list[torch.Tensor]) -> list[tuple[list, list]]:
    """(outputs at x + step, outputs at x - step) for each (input, step): floating outputs only,
    each of the shape of its counterpart in `like` (the forward's at x itself), or the check
    fails before it computes with them."""
    __tracebackhide__ = True
    moved = [tuple(plain[k] + sign * step if k == i else a for k, a in enumerate(plain))
             for i, step in steps for sign in (1, -1)]
    results = probe.forward_many(student, moved)
    for result in results:
        if isinstance(result, probe.ProbeError):
            _fail_error(spec, result, names, _describe(args, names))
    floating = [[o for o in r if o.is_floating_point()] for r in results]
    wanted = [tuple(v.shape) for v in like]
    for outs in floating:
        if [tuple(o.shape) for o in outs] != wanted:
            fail(f"{spec.name}: at a point a tiny step away from the input (finite differences), forward "
                 f"returned shapes {[tuple(o.shape) for o in outs][:4]}, where at the input itself it returned "
                 f"{wanted[:4]}.", *_describe(args, names),
                 cause="forward's output must have the same shape for every value of its input.")
    return list(zip(floating[::2], floating[1::2]))


def _slope(plus: list, minus: list, vs: list, eps: float) -> float:
    return sum(float(((p - m) * v).sum()) for p, m, v in zip(plus, minus, vs)) / (2 * eps)


def _close(numeric: float, analytical: float) -> bool:
    return abs(numeric - analytical) <= 1e-5 + 1e-3 * abs(numeric)


def _locate(student, spec: FunctionSpec, plain: list, i: int, grad: torch.Tensor, vs: list, names: list[str],
            args: tuple, eps: float, rounded: bool = False) -> None:
    """Fail naming the first entry of input `i` whose gradient disagrees."""
    __tracebackhide__ = True
    steps = []
    for j in range(plain[i].numel()):
        step = torch.zeros_like(plain[i])
        step.view(-1)[j] = eps
        steps.append((i, step))
    name = _labels(names, len(plain))[i]
    for j, (plus, minus) in enumerate(_forwards(student, spec, plain, steps, names, args, vs)):
        numeric, analytical = _slope(plus, minus, vs, eps), float(grad.view(-1)[j])
        if not _close(numeric, analytical):
            where, values = f"entry {j}", [f"numerical {numeric:.6g}", f"analytical {analytical:.6g}"]
            break
    else:  # every entry agrees alone: only a combination of them does not (backward is not linear)
        where, values = "along a random direction", []
    fail(
        f"{spec.name}: backward disagrees with finite differences of your own forward "
        f"(gradient for `{name}`, {where}).",
        *_describe(args, names), *values,
        cause=ROUNDED if rounded else "backward must be the derivative of forward, linear in grad_output.",
    )


def _fail_asking_autograd(spec: FunctionSpec, evidence: list[str], shown: list[str]) -> None:
    __tracebackhide__ = True
    seen = "; ".join(evidence[:5])  # what the watch saw, each in words (introspect.AutogradWatch)
    evidence_module.worth_a_look(f"{spec.name}: its Function asks autograd for its gradient ({seen}; observed in "
                                 "the student's process: best effort)")
    fail(
        f"{spec.name}: your Function asks autograd for its gradient: {seen}.", *shown,
        cause="the exercise asks for the gradient formula itself: compute it from the saved tensors and "
        "grad_output with torch operations, without torch.autograd.grad, .backward(), torch.func or "
        "forward-mode AD (in this thread or another).",
    )


def on_meta(student: Any, cases: Sequence[tuple], names: list[str]) -> str:
    """Run every case on the meta device: a tensor hard-coded on the CPU, or an output or a
    gradient left there, shows up without a GPU; returns the note to print. (A 0-d CPU
    tensor mixes with tensors of any device, so one case is not enough.)"""
    __tracebackhide__ = True
    cases = _meta_cases(cases)
    arg_sets = [devices.prepare(args, "meta") for args in cases]
    for args, meta_args, run in zip(cases, arg_sets, probe.meta(student, arg_sets)):
        moved = [f"output {k}" for k, device in enumerate(run.outputs) if device != "meta"]
        moved += [f"the gradient for input {k}" for k, device in enumerate(run.grads) if device != "meta"]
        if moved:
            fail(f"on another device (meta here, CUDA on a GPU) {' and '.join(moved)} came back on the CPU.",
                 *_describe(meta_args, names), cause=DEVICE)
        error = run.error
        if error is None:
            continue
        if "expected device" in error.message or "is not on the expected device" in error.message:
            what, cause = explain.error(error.stage, error.type, error.message, _labels(names, len(args)))
            fail(f"on another device (meta) {what}.", *_describe(meta_args, names), cause=cause)
        return f"meta device: not checked ({error.type} from an operation meta tensors do not support)."
    return "meta device: forward and backward create no tensor tied to the CPU and leave nothing there."


def _meta_cases(cases: Sequence[tuple]) -> list[tuple]:
    """The cases worth a meta run (each costs tens of milliseconds there): the first, and the
    first whose tensors all have dimensions (a 0-d tensor made on the CPU mixes with any)."""
    shaped = next((c for c in cases if all(a.dim() for a in c if isinstance(a, torch.Tensor))), None)
    return [cases[0]] + ([shaped] if shaped is not None and shaped is not cases[0] else [])


DEVICE = ("a tensor your Function returns must be on its inputs' device: `.cpu()`, `.numpy()` without moving back, "
          "or a new tensor made without `device=` (`torch.tensor(...)`, `torch.zeros(n)`) leaves it on the CPU. "
          "Make new tensors with `x.new_zeros(...)`, `torch.zeros_like(x)` or `device=x.device`, and move back "
          "with `.to(x.device)`.")


# --- What a backward returns -------------------------------------------------------------

ENGINE_SUMS = (
    "Autograd's engine sums a gradient that is broadcast-larger than its input down to the "
    "input's shape, which is why `.grad` and gradcheck looked right. Backward itself must return "
    "one gradient of the input's shape: the engine's sum also hides real bugs"
)


def check_returned_shapes(student: Any, name: str, cases: Sequence[tuple], *, fix: str = "") -> None:
    """Every gradient backward returns has the shape of its input, before autograd's engine
    sees it (the shapes are reported by the student's process: best effort). `fix`: how, in
    this exercise's words."""
    __tracebackhide__ = True
    names = probe.argument_names(student)
    with quiet():
        for case in cases:
            args = devices.prepare(case, "cpu")
            shown = _describe(args, names)
            facts = introspect.record_backward(student, args)
            if facts.error is not None:
                what, cause = explain.error(facts.error.stage, facts.error.type, facts.error.message, names)
                fail(f"{name}: {what}.", *shown, cause=cause)
            for arg_name, arg, grad in zip(_labels(names, len(args)), args, facts.returned):
                if probe.differentiable(arg) and isinstance(grad, list) and tuple(grad) != tuple(arg.shape):
                    got, want = tuple(grad), tuple(arg.shape)
                    fail(f"{name}: backward returned a gradient of shape {got} for `{arg_name}`, which "
                         f"has shape {want}.",
                         *shown, cause=f"{explain.shape_cause(got, want)} ({ENGINE_SUMS}{fix}.)")
