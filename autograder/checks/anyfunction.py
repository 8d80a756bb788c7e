"""The course's checks for anyone's own Function: `check_function(MyFn, inputs, reference=None)`.

The course judges its exercises against references written by us. This judges a
`torch.autograd.Function` (or a `torch.library.custom_op`) that anyone wrote, from example
inputs alone or with a reference, for the same classes of bugs and with the same messages:

- without a reference, everything that needs none: forward and backward run on the CPU, on
  CUDA where there is one, and on the meta device (a tensor tied to the CPU); gradcheck and,
  where double backward is promised, gradgradcheck; called again, the same values, and the
  same gradients whatever the memory layout of grad_output; the inputs and grad_output left
  unchanged; with only some inputs requiring grad (`ctx.needs_input_grad`), None for the
  others and the same gradients for those; gradients of their inputs' shapes; float32 kept;
  no NaN at zeros and large magnitudes where finite differences of the Function's own
  forward are finite; nothing stashed on ctx or kept elsewhere (what it saves, reported, and
  judged against a budget if given); backward does not ask autograd for the gradient; vmap,
  forward-mode AD and a custom op's fake kernel where the Function claims them, and
  torch.compile on request, each against the Function itself run plainly;
- with a reference (a function of the same arguments, of torch operations), also the
  values, gradients and second-order gradients against the reference's in float64
  (:func:`autograder.checks.functions.check_function`), finiteness wherever the reference is
  finite, and the transforms against the reference.

It runs in the caller's own process: there is no grader here. What it observes there besides
computed numbers (what was saved or kept, what backward returned, whether it asks autograd)
is best effort, as in the course: the Function shares the process.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import torch

from ..exercises import modern_api as transforms
from ..student import devices, introspect, probe
from ..student.report import fail, note, passed, quiet, show
from ..student.saved import Names, summary
from . import explain, functions
from . import inputs as seeded
from . import saved as saved_checks

SPECIAL = (0.0, 1e3, -1e3)  # put into every differentiable input: where 0 / 0 and overflows show
EPS = 1e-6  # the step of finite differences
SUBSETS = 4  # up to this many differentiable inputs, every combination of them requiring grad

NONDETERMINISTIC = (
    "the Function computes from something besides its inputs: state kept between calls (a counter, a cache, a "
    "buffer filled in place) or random numbers. gradcheck, checkpointing and every retry call it again and expect "
    "the same numbers: keep no state, and draw from a generator seeded inside the call."
)
LAYOUT = (
    "backward reads grad_output's memory as if it were contiguous (`.view` of its storage, `.data_ptr()`, NumPy "
    "or a C extension given the raw buffer): use operations that follow strides, or `grad_output.contiguous()` "
    "first."
)
ASKS_AUTOGRAD = (
    "backward should compute the gradient from the saved tensors and grad_output with torch operations. Asking "
    "autograd (torch.autograd.grad, .backward(), torch.func, forward-mode AD) from inside it runs a second "
    "backward on every call and breaks under torch.compile and vmap. If recomputing is the point (checkpointing), "
    "pass autograd_in_backward=True."
)
LINEAR = (
    "the chain rule multiplies the local derivative by grad_output (`grad_output * ...`): backward is linear in "
    "it, surrogate gradients included. Add nothing to it, ignore none of it, clip nothing."
)
VMAP = (
    "vmap runs the Function once, on batched tensors (a generated rule runs forward, setup_context and backward "
    "on them): reading values into Python (`.item()`, `.tolist()`, `if x.max() > ...`), NumPy, and writing into a "
    "tensor that is not batched cannot run there. Write it with torch operations only (torch.where for a branch), "
    "or write a `vmap` staticmethod."
)
SPECIAL_NAN = (
    "a formula that computes 0 / 0, inf / inf or inf - inf there (y / x at x = 0, exp(x) / (1 + exp(x)) at large "
    "x), though the function is finite around that point: write it so that it stays finite (a mask instead of "
    "y / x, torch.sigmoid instead of exp(x) / (1 + exp(x)), torch.where with a safe value in the branch not "
    "taken)."
)


def check_function(
    fn: Any,
    inputs: Any,
    reference: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    double_backward: bool = True,
    surrogate_gradient: bool = False,
    needs_input_grad: bool = True,
    keeps_dtype: bool = True,
    autograd_in_backward: bool = False,
    vmap: bool | None = None,
    compile: bool | str = False,
    max_saved_bytes: int | Callable[..., int] | None = None,
    seed: int = 0,
) -> None:
    """Check a `torch.autograd.Function` subclass (or a `torch.library.custom_op`, or a
    function that calls one) for the bug classes of the course's exercises; print a ✔ line
    for each group of checks that passed, and raise CheckFailed with the course's message
    (the input, the expected and actual values, the likely cause) on the first failure.

    `inputs`: the arguments of one call (a tuple; a lone tensor for one argument), a list of
    such tuples, or a function of a `torch.Generator` returning either (drawn from `seed`).
    Every floating-point tensor argument is differentiated, in float64 (the Function also
    runs in float32); other arguments are passed as they are.
    `reference`: a function of the same arguments, made of torch operations, whose values
    and autograd gradients are the right ones (a surrogate gradient is written with
    `.detach()`: `x + (x.round() - x).detach()` rounds, and its gradient is 1).

    What the Function promises, where it differs from the defaults:
    `double_backward=False`: its gradient need not be differentiable (no gradgradcheck).
    `surrogate_gradient=True`: backward deliberately is not the derivative of forward (a
    straight-through estimator, gradient reversal): no gradcheck.
    `needs_input_grad=False`: backward may compute gradients nobody asked for.
    `keeps_dtype=False`: float32 inputs may give other outputs than float32.
    `autograd_in_backward=True`: backward may ask autograd (recomputation, checkpointing).
    `vmap`: None checks torch.func.vmap where the Function declares a rule
    (`generate_vmap_rule` or a `vmap` staticmethod), True insists, False skips.
    `compile=True` checks torch.compile(backend="aot_eager") on the first input,
    "fullgraph" in one graph (either resets torch.compile's caches).
    `max_saved_bytes`: what one call may save for backward, a number or a function of the
    call's arguments (whose requires_grad say which gradients are needed).
    """
    __tracebackhide__ = True
    generator = seeded.generator(seed)
    cases = _cases(inputs, generator)
    spec = functions.FunctionSpec(
        name=name or _name(fn), reference=reference, cases=lambda _: cases, double_backward=double_backward,
        autograd_in_backward=autograd_in_backward, keeps_dtype=keeps_dtype, surrogate_gradient=surrogate_gradient,
    )
    names = probe.argument_names(fn)
    facts = transforms.describe(fn)
    with quiet():
        _runs(fn, spec, cases, names, generator)
        if reference is None:
            _float32(fn, spec, cases[0], names, generator)
            meta = functions.on_meta(fn, cases, names)
    _passed_runs(spec, cases, meta if reference is None else None)
    if reference is not None:
        functions.check_function(fn, spec, seed=seed)
    with quiet():
        _needs_input_grad(fn, spec, cases, names, generator, facts.get("kind") == "Function" and needs_input_grad)
        _memory(fn, spec, cases, names, max_saved_bytes)
        _special_points(fn, spec, cases, names, generator)
    _transforms(fn, spec, cases, names, generator, facts, vmap, compile)


def _name(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def _cases(given: Any, generator: torch.Generator) -> list[tuple]:
    """The argument tuples `given` stands for (see check_function), floating-point tensors
    in float64 on the CPU."""
    if callable(given) and not isinstance(given, torch.Tensor):
        given = given(generator)
    if isinstance(given, (tuple, torch.Tensor)):
        given = [given]
    if not isinstance(given, list) or not given:
        raise TypeError("inputs: give the arguments of a call (a tuple, or a tensor for one argument), a list of "
                        "them, or a function of a torch.Generator that returns either")
    return [tuple(_plain(a) for a in (case if isinstance(case, tuple) else (case,))) for case in given]


def _plain(a: Any) -> Any:
    if not isinstance(a, torch.Tensor):
        return a
    a = a.detach().cpu()
    if a.is_floating_point():
        return a.to(torch.float64)
    return a.to(torch.complex128) if a.is_complex() else a


def _like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device)


def _slots(args: Sequence[Any]) -> list[int]:
    return [i for i, a in enumerate(args) if probe.differentiable(a)]


# --- Forward and backward, called again and again -------------------------------------------

def _runs(fn: Any, spec: functions.FunctionSpec, cases: list[tuple], names: list[str],
          generator: torch.Generator) -> None:
    """On each device: forward and backward run (with random and constant grad_outputs, the
    one not contiguous, the other expanded; double backward where promised), watched for
    asking autograd, and leave the inputs and grad_output unchanged; called again once every
    case ran, they give the same values, with grad_output contiguous too; and backward is
    linear in grad_output. Without a reference, gradcheck (and gradgradcheck) judge the
    gradients."""
    __tracebackhide__ = True
    for device in devices.available():
        prepared = [devices.prepare(args, device) for args in cases]
        grad_outputs = [_grad_outputs(spec, args, names, outs, generator)
                        for args, outs in zip(prepared, _forwards(fn, spec, prepared, names))]
        grad_grads = [[_like(args[i], generator) for i in _slots(args)] if spec.double_backward else None
                      for args in prepared]
        plain = ["plain", "plain"]
        runs = [probe.Run(args, vs, ws, functions.LAYOUTS, watch=not spec.autograd_in_backward)
                for args, vs, ws in zip(prepared, grad_outputs, grad_grads)]
        # Then calls on the same values shuffled, whose results count for nothing but what state they leave.
        runs += [probe.Run(_shuffled(args, generator), [], None) for args in prepared]
        runs += [probe.Run(args, vs, None, functions.LAYOUTS) for args, vs in zip(prepared, grad_outputs)]
        runs += [probe.Run(args, vs, None, plain) for args, vs in zip(prepared, grad_outputs)]
        runs += [probe.Run(args, [[2 * v for v in vs[0]], [v + w for v, w in zip(*vs)]], None, plain)
                 for args, vs in zip(prepared, grad_outputs)]
        found = probe.run_many(fn, runs)
        n = len(prepared)
        for k, args in enumerate(prepared):
            first, _, *others = found[k::n]
            _judge(spec, args, names, grad_outputs[k], first, *others)
            if spec.reference is None:
                functions._gradcheck(fn, spec, args, names, rounded=_rounded(args, found[k].outputs))
                if spec.double_backward and not spec.surrogate_gradient:
                    _connected(fn, spec, args, names, first, grad_grads[k])


def _connected(fn, spec, args: tuple, names: list[str], first: probe.Observed, ws: list[torch.Tensor]) -> None:
    """The derivative of <gradients, w> with respect to grad_output is the Jacobian of forward
    applied to w: central differences of forward along w must give it. (gradgradcheck skips a
    gradient that autograd cannot differentiate at all, one computed outside torch.)"""
    __tracebackhide__ = True
    slots = _slots(args)
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    moved = [tuple(a + sign * EPS * ws[slots.index(i)] if i in slots else a for i, a in enumerate(plain))
             for sign in (1, -1)]
    plus, minus = probe.forward_many(fn, moved)
    if isinstance(plus, probe.ProbeError) or isinstance(minus, probe.ProbeError) or first.grads2 is None:
        return  # (raised a step away: gradcheck has said so)
    floating = [(p, m) for p, m in zip(plus, minus) if probe.differentiable(p)]
    for k, ((p, m), got) in enumerate(zip(floating, first.grads2[len(slots):])):
        numeric = ((p - m) / (2 * EPS)).cpu()
        got = torch.zeros_like(numeric) if got is None else got.cpu()
        if got.shape == numeric.shape and not torch.allclose(got, numeric, rtol=1e-3, atol=1e-5):
            fail(f"{spec.name}: double backward is wrong: the gradient of your gradient with respect to "
                 f"grad_output{'' if len(floating) == 1 else f' {k}'} differs from finite differences of your own "
                 "forward.", *functions._describe(args, names), *_difference(numeric, got),
                 cause="backward is linear in grad_output, so its derivative with respect to grad_output along w is "
                 "forward's derivative along w. Part of your gradient is a constant to autograd: a step of backward "
                 "leaves torch (NumPy, `.detach()`, `.item()`, a helper Function marked @once_differentiable or "
                 "whose backward does).")


def _shuffled(args: tuple, generator: torch.Generator) -> tuple:
    """`args` with the entries of each tensor shuffled: the same values (so the same domain), in
    other places."""
    return tuple(a.detach().reshape(-1)[torch.randperm(a.numel(), generator=generator)].reshape(a.shape)
                 .requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args)


def _forwards(fn: Any, spec: functions.FunctionSpec, prepared: list[tuple], names: list[str]) -> list[list]:
    """The outputs of each case (their shapes size the grad_outputs), or the check fails."""
    __tracebackhide__ = True
    found = probe.forward_many(fn, prepared)
    for args, outs in zip(prepared, found):
        if isinstance(outs, probe.ProbeError):
            functions._fail_error(spec, outs, names, functions._describe(args, names), args)
    return found


def _grad_outputs(spec, args: tuple, names: list[str], outs: list, generator) -> list[list[torch.Tensor]]:
    """Random grad_outputs for the floating-point outputs, and ones."""
    __tracebackhide__ = True
    floating = [o for o in outs if probe.differentiable(o)]
    if not floating:
        fail(f"{spec.name}: forward returned no floating-point tensor, so there is nothing to differentiate.",
             *functions._describe(args, names))
    return [[_like(o, generator) for o in floating], [torch.ones_like(o) for o in floating]]


def _judge(spec, args: tuple, names: list[str], grad_outputs: list[list[torch.Tensor]], first: probe.Observed,
           again: probe.Observed, plain: probe.Observed, scaled: probe.Observed) -> None:
    """`first` (the layouts of functions.LAYOUTS, double backward, watched), `again` (the
    same, once every case ran), `plain` (contiguous grad_outputs) and `scaled` (given
    2 × grad_output, and the sum of both grad_outputs) agree as they must."""
    __tracebackhide__ = True
    shown = functions._describe(args, names)
    labels = functions._labels(names, len(args))
    error = first.error
    if error and error.stage == "forward":
        functions._fail_error(spec, error, names, shown, args)
    if first.modified:
        fail(f"{spec.name}: forward modified its input `{labels[first.modified[0]]}` in place.", *shown,
             "(the values above are those before the call)",
             cause="the caller's tensor must stay unchanged: compute a new tensor (`x.clamp(...)`, not "
             "`x.clamp_(...)`); an in-place Function (ctx.mark_dirty) is not one this check can run.")
    functions._check_grad_outputs_left_alone(spec, first, shown)
    if error and error.stage == "backward":
        functions._fail_error(spec, error, names, shown, args, layout=functions._failed_layout(first))
    if first.asked_autograd:
        fail(f"{spec.name}: backward asks autograd for the gradient: autograd's engine ran "
             f"{', '.join(first.asked_autograd[:5])} inside it (observed in this process: best effort).", *shown,
             cause=ASKS_AUTOGRAD)
    if error:  # in double backward
        what, cause = explain.error(error.stage, error.type, error.message, labels)
        fail(f"{spec.name}: {what}.", *shown, cause=(cause + " " if cause else "") + "If nothing differentiates your "
             "gradient (no gradient penalty, no Hessian), pass double_backward=False.")
    for other in (again, plain, scaled):
        if other.error:
            functions._fail_error(spec, other.error, names, shown, args)
    for k, (was, now) in enumerate(zip(first.outputs, again.outputs)):
        if not _same(was, now):
            fail(f"{spec.name}: called again with the same inputs, forward returns other values"
                 f"{'' if len(first.outputs) == 1 else f' (output {k})'}.", *shown, *_difference(was, now),
                 cause=NONDETERMINISTIC)
    wrt = [labels[i] for i in _slots(args)]
    given = [functions._given(vs)[0] for vs in grad_outputs]
    for k, layout in enumerate(functions.LAYOUTS):
        for label, was, now, contiguous in zip(wrt, first.grads[k], again.grads[k], plain.grads[k]):
            if not _same(was, now):
                fail(f"{spec.name}: called again with the same inputs and grad_output, backward returns another "
                     f"gradient for `{label}`.", *shown, given[k], *_difference(was, now), cause=NONDETERMINISTIC)
            if not _same(was, contiguous):
                fail(f"{spec.name}: backward returns another gradient for `{label}` given "
                     f"{functions.LAYOUT_WORDS[layout]} than given the same values contiguous.", *shown, given[k],
                     *_difference(contiguous, was), cause=LAYOUT)
    one, ones = plain.grads
    for what, grads, want, words in (
            ("2 × grad_output", scaled.grads[0], [_times(2, g) for g in one], "twice the one given grad_output"),
            ("grad_output + 1", scaled.grads[1], [_plus(g, h) for g, h in zip(one, ones)],
             "the sum of those given grad_output and given ones")):
        for label, got, expected in zip(wrt, grads, want):
            if not _same(expected, got):
                fail(f"{spec.name}: backward is not linear in grad_output: given {what}, the gradient for "
                     f"`{label}` is not {words}.", *shown, given[0], *_difference(expected, got), cause=LINEAR)


def _times(c: float, g: torch.Tensor | None) -> torch.Tensor | None:
    return None if g is None else c * g


def _plus(g: torch.Tensor | None, h: torch.Tensor | None) -> torch.Tensor | None:
    return h if g is None else g if h is None else g + h


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """The same values, as the same computation gives them twice (None: a zero gradient)."""
    if a is None or b is None:
        return a is b or not bool((a if b is None else b).any())
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.allclose(
        a.cpu(), b.cpu(), rtol=1e-6, atol=1e-9, equal_nan=True) if a.is_floating_point() else torch.equal(a, b))


def _difference(was: torch.Tensor | None, now: torch.Tensor | None) -> list[str]:
    lines = [f"expected {'None' if was is None else show(was)}", f"actual   {'None' if now is None else show(now)}"]
    if isinstance(was, torch.Tensor) and isinstance(now, torch.Tensor) and was.shape == now.shape \
            and was.is_floating_point() and now.is_floating_point():
        lines.append(explain.mismatch(was.cpu().double(), now.cpu().double(), rtol=1e-6, atol=1e-9))
    return lines


def _rounded(args: tuple, outputs: list[torch.Tensor]) -> bool:
    """Every float64 output is a float32 number, though the inputs are not: forward computes
    in float32 (finite differences of it are rounding noise). Names a cause, never fails."""
    def exact(t: torch.Tensor) -> bool:
        return bool(torch.equal(t, t.float().double()))

    floating = [o.cpu() for o in outputs if o.dtype == torch.float64 and o.numel() and bool(torch.isfinite(o).all())]
    given = [a.detach().cpu() for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.float64]
    return bool(floating) and all(map(exact, floating)) and not all(map(exact, given))


def _float32(fn, spec, args: tuple, names: list[str], generator) -> None:
    """Given float32 inputs, the outputs are float32, and the values and gradients those of
    float64 inputs to float32's precision."""
    __tracebackhide__ = True
    if not spec.keeps_dtype:
        return
    double = devices.prepare(args, "cpu")
    single = devices.prepare(tuple(a.float() if probe.differentiable(a) and a.dtype == torch.float64 else a
                                   for a in args), "cpu")
    vs = [_like(o, generator) for o in probe.forward_many(fn, [double])[0] if probe.differentiable(o)]
    wide, narrow = probe.run_many(fn, [probe.Run(double, [vs]), probe.Run(single, [[v.float() for v in vs]])])
    shown = functions._describe(single, names)
    if narrow.error:
        functions._fail_error(spec, narrow.error, names, shown, single)
    for k, got in enumerate(narrow.outputs):
        if got.dtype == torch.float64:
            label = "forward" if len(narrow.outputs) == 1 else f"forward output {k}"
            fail(f"{spec.name}: given float32 inputs, {label} returned torch.float64.", *shown,
                 cause=functions.KEEP_DTYPE)
    for want, got in [*zip(wide.outputs, narrow.outputs), *zip(wide.grads[0], narrow.grads[0])]:
        if want is None or got is None or not want.is_floating_point() or got.shape != want.shape:
            continue
        scale = 1 + float(want.abs().amax()) if want.numel() else 1
        if not torch.allclose(got.double(), want, rtol=1e-3, atol=1e-4 * scale, equal_nan=True):
            fail(f"{spec.name}: given float32 inputs, the values or gradients differ from those of float64 inputs by "
                 "more than float32's rounding.", *shown, f"float64 {show(want)}", f"float32 {show(got)}",
                 cause="a step that loses float32's precision: a sum of large terms that cancel, an exp that "
                 "overflows in float32 (beyond 88.7), a constant rounded to float32 too early.")


def _passed_runs(spec, cases: list[tuple], meta: str | None) -> None:
    """What `_runs` (and without a reference `_float32` and the meta run) checked."""
    tools = [t for t, on in (("gradcheck", not spec.surrogate_gradient), ("gradgradcheck", spec.double_backward))
             if on and meta is not None]
    checked = f"; {' and '.join(tools)} pass{'es' if len(tools) == 1 else ''}" if tools else ""
    passed(f"{spec.name}: forward and backward run on {len(cases)} input(s){checked} (float64, "
           f"{', '.join(devices.available())}); called again, the same values; backward linear in grad_output; "
           "inputs and grad_output unchanged.")
    note("grad_output given not contiguous and expanded: the same gradients.")
    if not spec.autograd_in_backward:
        note("backward asks autograd for nothing (watched in this process: best effort).")
    if meta is None:
        return
    if spec.keeps_dtype:
        note("float32 inputs: outputs in float32, values and gradients as in float64 to float32's precision.")
    note(meta)
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


# --- ctx.needs_input_grad -------------------------------------------------------------------

def _needs_input_grad(fn, spec, cases: list[tuple], names: list[str], generator, judged: bool) -> None:
    """With only some inputs requiring grad: the same gradients for those (the reference's,
    compared by functions.check_function, or else the Function's own with every input
    requiring grad), and where `judged` (a Function), no gradient computed for the others;
    with one output used alone, the gradients of the others taken as zeros. A gradient that
    autograd's engine sums down to its input's shape is noted."""
    __tracebackhide__ = True
    labels = functions._labels(names, max(map(len, cases)))
    said, summed = [], None
    for args in cases:
        args = devices.prepare(args, "cpu")
        slots = _slots(args)
        subsets = _subsets(slots)
        for subset in subsets if judged else ():
            part = tuple(a.detach().requires_grad_(i in subset) if i in slots else a for i, a in enumerate(args))
            facts = introspect.record_backward(fn, part)
            wanted = f"when only {' and '.join(f'`{labels[i]}`' for i in subset)} " + (
                "requires" if len(subset) == 1 else "require")
            if facts.error is not None:
                functions._fail_error(spec, facts.error, names, functions._describe(part, names), part,
                                      when=f"{wanted} grad")
            shared = facts.shared + [False] * len(facts.returned)
            for i, grad in enumerate(facts.returned):
                if i in slots and i not in subset and grad is not None and not shared[i]:
                    fail(f"{spec.name}: {wanted} grad, backward still computes a gradient for `{labels[i]}`.",
                         *functions._describe(part, names),
                         cause=f"return None for `{labels[i]}` when `ctx.needs_input_grad[{i}]` is False, without "
                         "computing it: autograd throws that gradient away (a frozen layer's weight gradient is a "
                         "whole matrix product for nothing). If that is all right here, pass "
                         "needs_input_grad=False.")
            said = said or ["for each combination of inputs requiring grad, backward computes no gradient nobody "
                            "needs (it returns None, or a tensor it returns for another input anyway)"]
        if isinstance(fn, type) and issubclass(fn, torch.autograd.Function):
            summed = summed or _summed_by_the_engine(fn, spec, args, names)
        if spec.reference is None and _agree_in_part(fn, spec, args, names, generator, subsets):
            said = said[:1] + ["the gradients agree with those when every input requires grad and every output is "
                               "used"]
    if said:
        passed(f"{spec.name}: {'; '.join(said)}.")
    if summed:
        note(summed)


def _summed_by_the_engine(fn, spec, args: tuple, names: list[str]) -> str | None:
    """A note where backward returns a gradient broadcast-larger than its input, which
    autograd's engine sums down (right, but a shape bug hides the same way)."""
    facts = introspect.record_backward(fn, args)
    labels = functions._labels(names, len(args))
    for label, arg, grad in zip(labels, args, facts.returned):
        if probe.differentiable(arg) and isinstance(grad, list) and tuple(grad) != tuple(arg.shape):
            return (f"backward returns a gradient of shape {tuple(grad)} for `{label}`, of shape {tuple(arg.shape)}: "
                    "autograd's engine sums it down to that shape (right here; a wrong shape that broadcasts hides "
                    "the same way).")
    return None


def _subsets(slots: list[int]) -> list[tuple[int, ...]]:
    """The combinations of differentiable inputs that require grad, all of them excepted:
    every one for a few inputs, else each alone and each left out."""
    if len(slots) <= SUBSETS:
        return [s for r in range(1, len(slots)) for s in itertools.combinations(slots, r)]
    return [(i,) for i in slots] + [tuple(j for j in slots if j != i) for i in slots]


def _agree_in_part(fn, spec, args: tuple, names: list[str], generator, subsets: list[tuple[int, ...]]) -> bool:
    """Without a reference, the Function's gradients with every input requiring grad and
    every output used judge those with only some (returns whether there was any to try)."""
    __tracebackhide__ = True
    slots = _slots(args)
    labels = functions._labels(names, len(args))
    outs = [o for o in probe.forward_many(fn, [args])[0] if probe.differentiable(o)]
    vs = [_like(o, generator) for o in outs]
    plans: list[tuple[str, tuple, list, list]] = []  # (when, arguments, grad_outputs, the same with zeros)
    for subset in subsets:
        part = tuple(a.detach().requires_grad_(i in subset) if i in slots else a for i, a in enumerate(args))
        needing = " and ".join(f"`{labels[i]}`" for i in subset)
        plans.append((f"when only {needing} {'requires' if len(subset) == 1 else 'require'} grad", part, vs, vs))
    if len(vs) > 1:
        plans += [(f"when only output {k} is used (the other outputs get no gradient)", args,
                   [v if j == k else None for j, v in enumerate(vs)],
                   [v if j == k else torch.zeros_like(v) for j, v in enumerate(vs)]) for k in range(len(vs))]
    if not plans:
        return False
    found = probe.run_many(fn, [probe.Run(args, [whole]) for _, _, _, whole in plans]
                           + [probe.Run(part, [given]) for _, part, given, _ in plans])
    for (when, part, given, _), full, actual in zip(plans, found[:len(plans)], found[len(plans):]):
        shown = functions._describe(part, names) + functions._given(given) + [
            "expected: your Function's own gradient with every input requiring grad and unused outputs' "
            "gradients zero"]
        if actual.error:
            functions._fail_error(spec, actual.error, names, shown, part, when=when)
        wrt = [i for i in slots if part[i].requires_grad]
        want = [g for i, g in zip(slots, full.grads[0]) if i in wrt]
        functions._compare_grads(spec, part, [labels[i] for i in wrt], want, actual.grads[0], None, shown,
                                 when=when)
    return True


# --- What a call keeps ----------------------------------------------------------------------

def _memory(fn, spec, cases: list[tuple], names: list[str], budget: int | Callable[..., int] | None) -> None:
    """Nothing stashed on ctx nor kept alive elsewhere, after forward and after backward;
    backward leaves the saved tensors and grad_output unchanged; what is saved, reported,
    and where a budget is given, within it for every combination of inputs requiring grad
    (observed in this process: best effort)."""
    __tracebackhide__ = True
    named = Names(args=names)
    first = None
    for args in cases:
        args = devices.prepare(args, "cpu")
        slots = _slots(args)
        calls = [args] + ([tuple(a.detach().requires_grad_(i in subset) if i in slots else a
                                 for i, a in enumerate(args)) for subset in _subsets(slots)]
                          if budget is not None else [])
        for call in calls:
            try:
                recording, backward = saved_checks.observe(fn, call)
            except probe.StudentError:
                break  # (forward raised: the runs above said so)
            _kept(spec, recording, backward, named)
            allowed = budget(*call) if callable(budget) else budget
            if allowed is not None and recording.nbytes > allowed:
                needing = [names[i] if i < len(names) else f"input {i}" for i in slots if call[i].requires_grad]
                fail(f"{spec.name} saves {recording.nbytes} bytes for backward, more than the {allowed} allowed "
                     f"(when {', '.join(f'`{n}`' for n in needing)} require{'s' if len(needing) == 1 else ''} "
                     "grad).", *functions._describe(call, names), summary(recording, named),
                     cause="save only what the gradient formula reads: the output rather than the input it was "
                     "computed from (when the derivative is a function of the output), a boolean mask (1 byte an "
                     "element) rather than a float tensor, and nothing for a gradient ctx.needs_input_grad does not "
                     "ask for.")
            first = first or recording
    passed(f"{spec.name}: nothing stashed on ctx, nothing kept alive elsewhere after forward and after backward; "
           "backward leaves the saved tensors and grad_output unchanged" + (
               "; within the budget of bytes saved" if budget is not None else "") +
           " (observed in this process: best effort).")
    if first is not None:
        note(f"on the first input, {summary(first, named)}".replace("\n  ", "\n    "))


def _kept(spec, recording, backward, named: Names) -> None:
    __tracebackhide__ = True
    # (an integer state on ctx, the random generator's as torch.utils.checkpoint keeps it, is no tensor of the graph)
    stashed = [(path, s) for path, s in recording.stashed.items()
               if s.kind != "intermediate" or s.tensor.is_floating_point()]
    if stashed:
        path, s = stashed[0]
        cycle = saved_checks.CYCLE if s.kind == "output" and s.graph else ""
        fail(f"{spec.name}: tensor `ctx.{path}` ({saved_checks.describe(s, recording, named)}) is stashed on ctx.",
             cause=saved_checks.STASHED.format(cycle=cycle))
    saved_checks.check_nothing_kept(spec.name, recording, named)
    saved_checks.check_backward_left_alone(spec.name, recording, backward, named)


# --- Special points --------------------------------------------------------------------------

def _special(args: tuple, generator: torch.Generator) -> tuple:
    """`args` with SPECIAL in every differentiable tensor, at places drawn from `generator`."""
    return tuple(seeded.including(a, SPECIAL, generator) if probe.differentiable(a) and a.numel() else a
                 for a in args)


def _special_points(fn, spec, cases: list[tuple], names: list[str], generator) -> None:
    """At 0 and ±1000 in every differentiable input: with a reference, outputs and gradients
    finite wherever the reference's are; without one, no NaN where the Function's own forward
    is finite a step to either side (its finite differences there)."""
    __tracebackhide__ = True
    for args in cases:
        special = devices.prepare(_special(args, generator), "cpu")
        if spec.reference is not None:
            _finite_as_reference(fn, spec, special, names)
        else:
            _no_nan(fn, spec, special, names, generator)
    points = ", ".join(f"{v:g}" for v in SPECIAL)
    passed(f"{spec.name}: at {points} in every input, " + (
        "outputs and gradients are finite wherever the reference's are." if spec.reference is not None else
        "no nan in forward or backward where finite differences of your own forward are finite."))


def _finite_as_reference(fn, spec, args: tuple, names: list[str]) -> None:
    __tracebackhide__ = True
    expected = probe.run(spec.reference, functions._fresh(args),
                         [[torch.ones_like(o) for o in _floating_outputs(spec.reference, args)]])
    if expected.error:
        return  # outside the reference's domain
    actual = probe.run(fn, args, [[torch.ones_like(o) for o in expected.outputs if probe.differentiable(o)]])
    shown = functions._describe(args, names)
    if actual.error:
        functions._fail_error(spec, actual.error, names, shown, args)
    labels = functions._labels(names, len(args))
    pairs = [(f"output {k}" if len(expected.outputs) > 1 else "output", w, g)
             for k, (w, g) in enumerate(zip(expected.outputs, actual.outputs))]
    pairs += [(f"gradient for `{labels[i]}` (grad_output of ones)", w, g)
              for i, w, g in zip(_slots(args), expected.grads[0], actual.grads[0])]
    for what, want, got in pairs:
        if want is None or got is None or got.shape != want.shape or not got.is_floating_point():
            continue
        bad = torch.isfinite(want) & ~torch.isfinite(got)
        if bool(bad.any()):
            j = tuple(int(n) for n in bad.nonzero()[0])
            fail(f"{spec.name}: the {what} is {got[j].item()} at index {j}, where the reference's is "
                 f"{want[j].item():.6g}.", *shown, cause=SPECIAL_NAN)


def _floating_outputs(reference: Callable[..., Any], args: tuple) -> list[torch.Tensor]:
    with torch.no_grad():
        return [o for o in probe.outputs_of(reference(*functions._fresh(args))) if probe.differentiable(o)]


def _no_nan(fn, spec, args: tuple, names: list[str], generator) -> None:
    __tracebackhide__ = True
    outs = probe.forward_many(fn, [args])[0]
    if isinstance(outs, probe.ProbeError):
        return  # raised there: a domain the Function refuses, not judged without a reference
    vs = [_like(o, generator) for o in outs if probe.differentiable(o)]
    base = probe.run(fn, args, [vs])
    if base.error:
        return
    shown = functions._describe(args, names)
    labels = functions._labels(names, len(args))
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    # Forward: nan at a special entry, finite a step to either side of it.
    entries = [(i, j) for i in _slots(args)
               for j in torch.isin(plain[i].reshape(-1), torch.tensor(SPECIAL, dtype=plain[i].dtype)).nonzero()
               .reshape(-1)[:2 * len(SPECIAL)].tolist()]  # (the placed ones, and a few the caller gave)
    for (i, j), (plus, minus) in zip(entries, _moved(fn, plain, entries)):
        for k, (at, up, down) in enumerate(zip(base.outputs, plus, minus)):
            if at.is_floating_point() and bool((at.isnan() & up.isfinite() & down.isfinite()).any()):
                fail(f"{spec.name}: forward returns nan{'' if len(base.outputs) == 1 else f' (output {k})'} at "
                     f"`{labels[i]}`{_index(plain[i], j)} = {plain[i].reshape(-1)[j].item():g}, though it is finite "
                     f"a step of {EPS:g} to either side.", *shown, cause=SPECIAL_NAN)
    if not all(bool(o.isfinite().all()) for o in base.outputs if o.is_floating_point()):
        return
    # Backward: nan where finite differences of forward are finite (the first few of each input).
    for i, grad in zip(_slots(args), base.grads[0]):
        if grad is None:
            continue
        wrong = grad.isnan().reshape(-1).nonzero().reshape(-1)[:3].tolist()
        for j, (plus, minus) in zip(wrong, _moved(fn, plain, [(i, j) for j in wrong])):
            numeric = _slope(plus, minus, vs)
            if spec.surrogate_gradient or numeric == numeric and abs(numeric) < float("inf"):
                also = "" if spec.surrogate_gradient else f" (finite differences of your own forward give " \
                                                          f"{numeric:.6g})"
                at = plain[i].reshape(-1)[j].item()
                fail(f"{spec.name}: the gradient for `{labels[i]}` is nan at index {_index(grad, j)}, where "
                     f"`{labels[i]}` = {at:g}{also}.", *shown,
                     functions._given(vs)[0], cause=SPECIAL_NAN)


def _index(t: torch.Tensor, flat: int) -> tuple[int, ...]:
    """The position of entry `flat` (in memory order) of a contiguous `t`."""
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape))


def _moved(fn, plain: list, entries: list[tuple[int, int]]) -> list[tuple[list, list]]:
    """(outputs at x + EPS, outputs at x - EPS) for each (input, flat index) entry moved alone;
    an entry where forward raises is not followed."""
    moved = []
    for i, j in entries:
        for sign in (1, -1):
            x = plain[i].clone()
            x.view(-1)[j] += sign * EPS
            moved.append(tuple(x if k == i else a for k, a in enumerate(plain)))
    found = probe.forward_many(fn, moved) if moved else []
    pairs = [(p, m) for p, m in zip(found[::2], found[1::2])]
    return [(p, m) if not isinstance(p, probe.ProbeError) and not isinstance(m, probe.ProbeError) else ([], [])
            for p, m in pairs]


def _slope(plus: list, minus: list, vs: list) -> float:
    floating = [(p, m) for p, m in zip(plus, minus) if p.is_floating_point()]
    if not floating or not all(bool(p.isfinite().all() and m.isfinite().all()) for p, m in floating):
        return float("nan")
    return sum(float(((p - m) * v).sum()) for (p, m), v in zip(floating, vs)) / (2 * EPS)


# --- torch.func, forward-mode AD, custom ops, torch.compile ----------------------------------

def _transforms(fn, spec, cases: list[tuple], names: list[str], generator, facts: dict, vmap: bool | None,
                compile: bool | str) -> None:
    """What the Function claims, or the caller asks for, against the reference, or without
    one against the Function itself run plainly (sample by sample, eagerly)."""
    __tracebackhide__ = True
    judge = spec.reference or probe.as_callable(fn)
    against = "the reference" if spec.reference is not None else "your Function run sample by sample"
    if facts.get("kind") == "CustomOpDef":
        _custom_op(fn, spec, cases, names)
    claimed = bool(facts.get("vmap") or facts.get("generate_vmap_rule"))
    if vmap or (vmap is None and claimed):
        # (a custom op's autograd is a classic Function inside, which torch.func cannot differentiate under
        # vmap: its rule is checked without vmap's per-sample fallback, on outputs)
        op = facts.get("kind") == "CustomOpDef"
        transforms.check_vmap(fn, spec.name, judge, _vmap_cases(cases, generator), names, generator,
                              per_sample=not op, grad_of_vmap=not op, fallback=not op,
                              hint=lambda case, got, want: None if want is not None else VMAP)
        passed(f"{spec.name}: under torch.func.vmap, " + ("outputs agree (its vmap rule, no fallback)" if op else
                                                          "outputs, per-sample gradients and gradients through vmap "
                                                          "agree") + f" with {against}.")
    elif vmap is None and facts.get("kind") == "Function":
        note("vmap: not checked (no vmap rule declared: `generate_vmap_rule = True` or a `vmap` staticmethod).")
    if facts.get("jvp"):
        # (without a reference, finite differences of forward judge the tangents: jacfwd and hessian only
        # compare the Function with itself)
        compared = claimed and spec.reference is not None
        transforms.check_forward_ad(fn, spec.name, judge, cases, names, generator, jacfwd=compared,
                                    hessian=compared and spec.double_backward)
        passed(f"{spec.name}: forward-mode AD (jvp) agrees with {against if spec.reference is not None else 'backward'}"
               " and with finite differences of your forward (gradcheck(check_forward_ad=True)).")
    if compile:
        fullgraph = compile == "fullgraph"
        transforms.check_compile(fn, spec.name, judge, cases[:1], names, generator, fullgraph=fullgraph, facts=facts)
        eagerly = "the reference" if spec.reference is not None else "your Function run eagerly"
        passed(f"{spec.name}: torch.compile(backend='aot_eager'{', fullgraph=True' if fullgraph else ''}): outputs "
               f"and gradients agree with {eagerly}.")


def _vmap_cases(cases: list[tuple], generator: torch.Generator) -> list[transforms.VmapCase]:
    """Each case as a batch of three along dim 0 of every floating-point tensor: the case, and
    twice its entries each shrunk towards 0 by a random factor in [0.5, 1] (so signs, zeros,
    infinities and bounds around 0 stay: the same domain); other arguments (integer targets,
    say) shared by the samples."""
    def shrunk(t: torch.Tensor) -> torch.Tensor:
        return t * (1 - torch.rand(t.shape, generator=generator, dtype=t.dtype) / 2)

    return [transforms.VmapCase(
        tuple(torch.stack([a, shrunk(a), shrunk(a)]) if probe.differentiable(a) else a for a in args),
        (tuple(0 if probe.differentiable(a) else None for a in args),))
        for args in cases if _slots(args)]


def _custom_op(op, spec, cases: list[tuple], names: list[str]) -> None:
    """A custom op's fake kernel describes what the op returns, and torch.library.opcheck passes."""
    __tracebackhide__ = True
    real = [[(tuple(o.shape), o.dtype) for o in outs] for outs in probe.forward_many(op, cases)]
    expected = iter(real)  # check_custom_op asks once per case, in order
    qualname = str(transforms.describe(op).get("name", ""))
    transforms.check_custom_op(op, spec.name, cases, lambda _: next(expected), namespace=qualname.split("::")[0],
                               fake_cause="the fake kernel must describe the real output exactly: its shape, dtype "
                               "and device (`x.new_empty(shape)` keeps the dtype and device; torch.empty(shape) "
                               "would be float32 on the CPU).")
    passed(f"{qualname}: its fake kernel gives the shapes, dtypes and devices the op returns; "
           "torch.library.opcheck passes.")
