"""Check a student's differentiable function against a reference.

For every case (seeded float64 inputs kept away from kinks) and every available device,
the student's code and the reference are probed with the same random grad_outputs; the
forward values, the gradients and, where the exercise promises it, the second-order
gradients must agree. Then torch's own `gradcheck` (and `gradgradcheck`) must pass, and
a run on the `meta` device must not hit a tensor hard-coded on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.autograd.gradcheck import GradcheckError

from ..student import devices, introspect, probe
from . import explain, inputs
from ..student.report import fail, note, passed, quiet, shape, show

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
    # Exercises ask for a gradient formula: a backward that lets autograd compute it fails
    # (found in the student's process: best effort).
    autograd_in_backward: bool = False
    hint: Hint | None = None
    rtol: float = 1e-6
    atol: float = 1e-9


def check_function(student: Any, spec: FunctionSpec, *, seed: int | None = 0) -> None:
    """Raise CheckFailed on the first disagreement; print one line when all agree.

    `seed=None` draws fresh inputs (hidden tests), an int reproduces them.
    """
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    with quiet():
        names = probe.argument_names(student)
        cases = spec.cases(generator)
        for device in devices.available():
            for args in cases:
                _agree(student, spec, devices.prepare(args, device), names, generator)
                if isinstance(student, probe.StudentProxy):
                    _finite_differences(student, spec, devices.prepare(args, device), names, generator)
                else:
                    _gradcheck(student, spec, devices.prepare(args, device))
        if not spec.autograd_in_backward:
            _no_autograd_in_backward(student, spec, devices.prepare(cases[0], "cpu"), names)
        meta = _meta(student, cases[0], names)
    checked = "forward, backward and double backward" if spec.double_backward else "forward and backward"
    # (For a student's object in another process, the grader's own finite differences
    # stand in for gradcheck: same method, numbers computed where student code never runs.)
    tools = "gradcheck and gradgradcheck pass" if spec.double_backward else "gradcheck passes"
    passed(
        f"{spec.name}: {checked} agree with the reference on {len(cases)} input(s); "
        f"{tools} (float64, {', '.join(devices.available())})."
    )
    note(meta)
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


def _like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device)


def _agree(student: Any, spec: FunctionSpec, args: tuple, names: list[str], generator) -> None:
    __tracebackhide__ = True
    ref_args = tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args)
    outs = [o for o in probe.outputs_of(spec.reference(*ref_args)) if probe.differentiable(o)]
    grad_outputs = [[_like(o, generator) for o in outs], [torch.ones_like(o) for o in outs]]
    wrt = [a for a in args if probe.differentiable(a)]
    grad_grads = [_like(a, generator) for a in wrt] if spec.double_backward else None
    expected = probe.run(spec.reference, ref_args, grad_outputs, grad_grads)
    if expected.error:
        raise RuntimeError(f"reference of {spec.name} failed: {expected.error}")
    actual = probe.run(student, args, grad_outputs, grad_grads)
    shown = _describe(args, names)
    error = actual.error

    if error and error.stage == "forward":
        _fail_error(spec, error, names, shown)
    _compare_outputs(spec, expected.outputs, actual.outputs, shown)
    if actual.modified:
        name = names[actual.modified[0]] if actual.modified[0] < len(names) else f"input {actual.modified[0]}"
        fail(
            f"{spec.name}: forward modified its input `{name}` in place.", *shown,
            cause="the caller's tensor must stay unchanged: compute a new tensor "
            "(e.g. `x.clamp(...)`, not `x.clamp_(...)`).",
        )
    if error and error.stage == "backward":
        _fail_error(spec, error, names, shown)

    wrt_names = [n for n, a in zip(names or [f"input {i}" for i in range(len(args))], args) if probe.differentiable(a)]
    for i, (want, got) in enumerate(zip(expected.grads[0], actual.grads[0])):
        _compare_grad(
            spec, args, i, wrt_names[i], want, got, expected.grads[1][i],
            shown + [f"grad_output = {show(grad_outputs[0][0])}"],
        )
    if spec.double_backward:
        if error:  # double backward stage
            _fail_error(spec, error, names, shown)
        targets = [f"`{n}`" for n in wrt_names] + ["grad_output"] * len(outs)
        for target, want, got in zip(targets, expected.grads2, actual.grads2):
            _compare_second(spec, target, want, got, shown)


def _describe(args: tuple, names: list[str]) -> list[str]:
    labels = names if len(names) == len(args) else [f"input {i}" for i in range(len(args))]
    return [f"{n} = {show(a)}" for n, a in zip(labels, args)]


def _fail_error(spec: FunctionSpec, error: probe.ProbeError, names: list[str], shown: list[str]) -> None:
    __tracebackhide__ = True
    what, cause = explain.error(error.stage, error.type, error.message, names)
    fail(f"{spec.name}: {what}.", *shown, cause=cause)


def _compare_outputs(spec, expected: list, actual: list, shown: list[str]) -> None:
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
                f"expected {show(want)}", f"actual   {show(got)}",
                explain.mismatch(want.double(), got.double(), rtol=spec.rtol, atol=spec.atol),
            )


def _is_zero(t: torch.Tensor | None) -> bool:
    return t is None or not bool(t.any())


def _compare_grad(spec, args, i, name, want, got, want_ones, shown) -> None:
    __tracebackhide__ = True
    label = f"{spec.name}: wrong gradient for `{name}`"
    if got is None:
        if _is_zero(want):
            return
        fail(f"{label}: backward returned None, but `{name}` needs a gradient.", *shown,
             f"expected {show(want)}")
    if want is None:
        want = torch.zeros_like(got)
    want, got, want_ones = want.cpu(), got.cpu(), None if want_ones is None else want_ones.cpu()
    if got.shape != want.shape:
        fail(f"{label}: shape {shape(got)}, expected {shape(want)}.", *shown,
             cause=explain.shape_cause(tuple(got.shape), tuple(want.shape)))
    if torch.allclose(got, want, rtol=spec.rtol, atol=spec.atol):
        return
    wrong = ~torch.isclose(got, want, rtol=spec.rtol, atol=spec.atol)
    causes = [explain.gradient_cause(want, got, want_ones, rtol=spec.rtol, atol=spec.atol)]
    if spec.hint is not None:
        causes.append(spec.hint(tuple(a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args), i, wrong))
    cause = " ".join(c for c in causes if c) or None
    fail(
        f"{label}.", *shown, f"expected {show(want)}", f"actual   {show(got)}",
        explain.mismatch(want, got, rtol=spec.rtol, atol=spec.atol), cause=cause,
    )


def _compare_second(spec, target: str, want, got, shown) -> None:
    __tracebackhide__ = True
    if _is_zero(want) and _is_zero(got):
        return
    if got is not None and want is not None and torch.allclose(
        got.cpu(), want.cpu(), rtol=spec.rtol, atol=spec.atol
    ):
        return
    if _is_zero(got) and target == "grad_output":
        cause = (
            "the gradient of your gradient with respect to grad_output is missing. Backward is "
            "linear in grad_output, so this derivative is the backward formula itself: if your "
            "backward is a Function of its own (like CubeBackward), its backward must return it."
        )
    elif _is_zero(got):
        cause = (
            "your backward is not differentiable by autograd: it uses values autograd cannot "
            "track (an intermediate saved in forward, a tensor stored on ctx, `.detach()`, "
            "numpy or `@once_differentiable`). Compute the gradient with differentiable torch "
            "operations from saved inputs or outputs."
        )
    else:
        cause = "the derivative of your backward formula is wrong (check the backward of your backward)."
    fail(
        f"{spec.name}: double backward is wrong: the gradient of your gradient with respect "
        f"to {target} differs from the reference.",
        *shown,
        f"expected {show(want)}",
        f"actual   {show(got) if got is not None else 'zero (not connected to the graph)'}",
        cause=cause,
    )


def _gradcheck(student: Any, spec: FunctionSpec, args: tuple) -> None:
    __tracebackhide__ = True
    call = probe.as_callable(student)
    slots = [i for i, a in enumerate(args) if probe.differentiable(a)]

    def fn(*tensors):
        full = list(args)
        for i, t in zip(slots, tensors):
            full[i] = t
        return call(*full)

    tensors = tuple(args[i] for i in slots)
    checks = [("gradcheck", torch.autograd.gradcheck)]
    if spec.double_backward:
        checks.append(("gradgradcheck", torch.autograd.gradgradcheck))
    for label, check in checks:
        # Along random directions first (a fraction of the cost); entry by entry only to report.
        error = _gradcheck_error(check, fn, tensors, fast_mode=True) and _gradcheck_error(check, fn, tensors)
        if error is not None:
            lines = str(error).strip().splitlines()
            fail(
                f"{spec.name}: torch.autograd.{label} failed although the values agree with the reference.",
                *(lines[:12] + (["..."] if len(lines) > 12 else [])),
                cause="backward must be linear in grad_output and give the same result every time.",
            )


def _gradcheck_error(check: Callable, fn: Callable, tensors: tuple, fast_mode: bool = False) -> GradcheckError | None:
    try:
        check(fn, tensors, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=fast_mode)
    except GradcheckError as error:
        return error
    return None


DIRECTIONS = 2  # random directions per input: a wrong entry escapes both with probability 0


def _finite_differences(student: probe.StudentProxy, spec: FunctionSpec, args: tuple, names: list[str],
                        generator: torch.Generator, eps: float = 1e-6) -> None:
    """gradcheck for code that runs elsewhere: central differences of the student's own
    forward values, computed here, against the student's vector-Jacobian products.

    As gradcheck's fast_mode: along random directions u of each input, the difference
    quotient of <f, v> must equal <vjp(v), u>, which takes 2 forwards per direction
    instead of 2 per entry. Only when one disagrees are the entries of that input
    differenced one by one, to name the wrong one."""
    __tracebackhide__ = True
    slots = [i for i, a in enumerate(args) if probe.differentiable(a)]
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    moves = [(i, torch.randn(plain[i].shape, generator=generator, dtype=plain[i].dtype))
             for i in slots for _ in range(DIRECTIONS)]
    forwards = _forwards(student, spec, plain, [(i, u * eps) for i, u in moves], names, args)
    if not forwards:
        return
    vs = [torch.randn(o.shape, generator=generator, dtype=o.dtype) for o in forwards[0][0]]
    analytical = probe.run(student, args, [vs]).grads[0]
    grads = {i: torch.zeros_like(plain[i]) if g is None else g.cpu() for i, g in zip(slots, analytical)}
    for (i, u), (plus, minus) in zip(moves, forwards):
        numeric = _slope(plus, minus, vs, eps)
        if not _close(numeric, float((grads[i] * u).sum())):
            _locate(student, spec, plain, i, grads[i], vs, names, args, eps)


def _forwards(student, spec, plain: list, steps: list[tuple[int, torch.Tensor]], names, args) -> list[tuple[list, list]]:
    """(outputs at x + step, outputs at x - step) for each (input, step): floating outputs only."""
    __tracebackhide__ = True
    moved = [tuple(plain[k] + sign * step if k == i else a for k, a in enumerate(plain))
             for i, step in steps for sign in (1, -1)]
    results = probe.forward_many(student, moved)
    for result in results:
        if isinstance(result, probe.ProbeError):
            _fail_error(spec, result, names, _describe(args, names))
    floating = [[o for o in r if o.is_floating_point()] for r in results]
    return list(zip(floating[::2], floating[1::2]))


def _slope(plus: list, minus: list, vs: list, eps: float) -> float:
    return sum(float(((p - m) * v).sum()) for p, m, v in zip(plus, minus, vs)) / (2 * eps)


def _close(numeric: float, analytical: float) -> bool:
    return abs(numeric - analytical) <= 1e-5 + 1e-3 * abs(numeric)


def _locate(student, spec: FunctionSpec, plain: list, i: int, grad: torch.Tensor, vs: list, names: list[str],
            args: tuple, eps: float) -> None:
    """Fail naming the first entry of input `i` whose gradient disagrees."""
    __tracebackhide__ = True
    steps = []
    for j in range(plain[i].numel()):
        step = torch.zeros_like(plain[i])
        step.view(-1)[j] = eps
        steps.append((i, step))
    name = names[i] if i < len(names) else f"input {i}"
    for j, (plus, minus) in enumerate(_forwards(student, spec, plain, steps, names, args)):
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
        cause="backward must be the derivative of forward, linear in grad_output.",
    )


AUTOGRAD_CALLS = {"grad": "torch.autograd.grad", "backward": "Tensor.backward"}


def _no_autograd_in_backward(student: Any, spec: FunctionSpec, args: tuple, names: list[str]) -> None:
    __tracebackhide__ = True
    if not (isinstance(student, probe.StudentProxy) or (isinstance(student, type) and issubclass(student, torch.autograd.Function))):
        return  # a wrapper around several Functions: nothing single to look into
    facts = introspect.record_backward(student, args)
    called = [AUTOGRAD_CALLS[name] for name in AUTOGRAD_CALLS if facts.calls.get(name)]
    if facts.error is not None and not called:
        return  # not a single Function, or it fails: the other checks say why
    if called:
        fail(
            f"{spec.name}: backward calls {' and '.join(called)} to compute its gradient.",
            *_describe(args, names),
            cause="the exercise asks for the gradient formula itself: compute it from the saved tensors "
            "and grad_output with torch operations, without asking autograd for it.",
        )


def _meta(student: Any, args: tuple, names: list[str]) -> str:
    """Run on the meta device: a tensor hard-coded on the CPU shows up without a GPU."""
    __tracebackhide__ = True
    meta_args = devices.prepare(args, "meta")
    error = probe.meta(student, meta_args)
    if error is None:
        return "meta device: no tensor is tied to the CPU."
    if "expected device" in error.message or "is not on the expected device" in error.message:
        what, cause = explain.error(error.stage, error.type, error.message, names)
        fail(f"on another device (meta) {what}.", *_describe(meta_args, names), cause=cause)
    return f"meta device: not checked ({error.type} from an operation meta tensors do not support)."
