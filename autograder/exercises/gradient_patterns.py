"""Checks for notebook 04_gradient_patterns."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from ..checks import explain, inputs
from ..checks.functions import FunctionSpec, check_function, check_returned_shapes
from ..student import devices, gradient_patterns, probe
from ..student.report import fail, note, passed, quiet, show

Shape = Sequence[int]
Mistakes = Sequence[tuple[Callable[[], torch.Tensor], str]]


def _shown(names: Sequence[str], args: Sequence[Any]) -> list[str]:
    return [f"{n} = {show(a)}" for n, a in zip(names, args)]


def _known_mistake(actual: torch.Tensor, mistakes: Mistakes) -> str | None:
    """The cause of the first known mistake that computes exactly `actual`.

    Call it only once `actual` is known to be wrong: a mistake that happens to give the
    right answer for these inputs can then never match.
    """
    for compute, cause in mistakes:
        try:
            candidate = compute()
        except Exception:  # this mistake cannot even run on these shapes
            continue
        if candidate.shape == actual.shape and torch.allclose(candidate, actual.to(candidate.dtype)):
            return cause
    return None


# --- 4.1 GELU ----------------------------------------------------------------------------

def _gelu_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    return (
        "d/dx [x·Φ(x)] = Φ(x) + x·φ(x) (product rule), with the exact Φ(x) = (1 + erf(x/√2))/2 "
        "and φ(x) = exp(-x²/2)/√(2π): check both terms, and do not use the tanh approximation."
    )


# Points where a formula can break although GELU is smooth there: 0 (Φ(x) = y / x is 0/0)
# and large |x| (exp(x²/2) overflows; Φ(x) is exactly 0 or 1).
GELU_SPECIAL = (0.0, 40.0, -40.0, 8.0, -8.0)


def _gelu_cases(shapes: Sequence[Shape]):
    def cases(generator: torch.Generator) -> list[tuple]:
        found = [(inputs.uniform(s, generator, -4.0, 4.0),) for s in shapes]
        return [*found, (inputs.among(GELU_SPECIAL, generator),)]

    return cases


GELU = FunctionSpec(name="GELU", reference=F.gelu, cases=_gelu_cases([(7,), (2, 3)]), hint=_gelu_hint,
                    double_backward=True)


def check_gelu(student: Any, *, shapes: Sequence[Shape] = ((7,), (2, 3)), seed: int | None = 0) -> None:
    """GELU(x) = x·Φ(x), the exact (erf) GELU, differentiable twice; checked also at x = 0
    and at large |x|."""
    __tracebackhide__ = True
    check_function(student, replace(GELU, cases=_gelu_cases(shapes)), seed=seed)


# --- 4.2 Batched matrix product ----------------------------------------------------------

MatmulSizes = tuple[Shape, int, int, int]  # (batch dims, n, k, m)


def _matmul_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    a, b = args
    if i == 0:
        return (f"grad_a must have a's shape (..., n, k) = {tuple(a.shape)}: combine grad_output (..., n, m) "
                "with b (..., k, m).")
    return (f"grad_b must have b's shape (..., k, m) = {tuple(b.shape)}: combine a (..., n, k) with "
            "grad_output (..., n, m).")


def _matmul_cases(sizes: Sequence[MatmulSizes]):
    def cases(generator: torch.Generator) -> list[tuple]:
        return [
            (inputs.normal((*batch, n, k), generator), inputs.normal((*batch, k, m), generator))
            for batch, n, k, m in sizes
        ]

    return cases


MATMUL_SIZES: tuple[MatmulSizes, ...] = (((), 3, 4, 2), ((2,), 3, 4, 5), ((2, 1), 2, 3, 4), ((2, 3), 2, 1, 3))
# Every Function of this notebook is differentiated twice: 4.1 teaches why (a backward
# built from torch operations stays differentiable), and a step outside torch shows there.
BATCHED_MATMUL = FunctionSpec(
    name="BatchedMatmul", reference=torch.matmul, cases=_matmul_cases(MATMUL_SIZES), hint=_matmul_hint,
    double_backward=True,
)


def check_batched_matmul(student: Any, *, sizes: Sequence[MatmulSizes] = MATMUL_SIZES, seed: int | None = 0) -> None:
    """a @ b for a (..., n, k), b (..., k, m) with the same batch dims."""
    __tracebackhide__ = True
    check_function(student, replace(BATCHED_MATMUL, cases=_matmul_cases(sizes)), seed=seed)


# --- 4.3 unbroadcast ---------------------------------------------------------------------

def _summed(grad: torch.Tensor, dims: list[int], keepdim: bool = False) -> torch.Tensor:
    return grad.sum(dims, keepdim=keepdim) if dims else grad


def _unbroadcast_mistakes(grad: torch.Tensor, shape: tuple[int, ...]) -> Mistakes:
    prepended = list(range(grad.dim() - len(shape)))
    expanded = [len(prepended) + i for i, n in enumerate(shape) if n == 1]
    from_left = list(range(len(shape), grad.dim()))  # the trailing dims, as if shapes lined up on the left
    return (
        (lambda: grad.sum(), "`grad.sum(dim=())` sums over *every* dim, not over none: when no dim needs "
         "summing, skip the sum (return grad as it is)."),
        (lambda: _summed(grad, prepended),
         "only the prepended dims were summed: a dim of size 1 in `shape` that grad has expanded must be "
         "summed too, with keepdim=True."),
        (lambda: _summed(grad, expanded, keepdim=True),
         "the leading dims that broadcasting prepended are still there: sum them away."),
        (lambda: _summed(grad, prepended + expanded),
         "the dims of size 1 were summed without keepdim=True, so they disappeared instead of staying size 1."),
        (lambda: _summed(_summed(grad, from_left), [i for i, n in enumerate(shape) if n == 1], keepdim=True),
         "dims were matched from the left: broadcasting lines shapes up from the right, so the dims to "
         "remove are the *first* grad.dim() - len(shape) ones."),
        (lambda: grad.mean(prepended + expanded, keepdim=True).reshape(shape),
         "a broadcast value was used at every position it was copied to, so its gradient is the *sum* "
         "over those positions, not the mean."),
    )


UNBROADCAST_PAIRS: tuple[tuple[Shape, Shape], ...] = (
    ((3, 4), (4,)), ((3, 4), (3, 4)), ((3, 4), (3, 1)), ((2, 3, 4), (3, 1)),
    ((2, 3, 4), ()), ((2, 3, 4), (1, 3, 1)), ((1, 4), (4,)), ((), ()),
)
# Checked whatever pairs a check is given: an empty batch, whose sum is zeros (a mean is nan).
EMPTY = ((0, 3), (3,))


def check_unbroadcast(
    student: Callable[[torch.Tensor, Shape], torch.Tensor],
    *,
    pairs: Sequence[tuple[Shape, Shape]] = UNBROADCAST_PAIRS,
    seed: int | None = 0,
) -> None:
    """unbroadcast(grad, shape) sums grad down to `shape`; each pair is (grad.shape, shape)."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    pairs = (*pairs, EMPTY)
    with quiet():
        for k, (grad_shape, shape) in enumerate(pairs):
            grad = inputs.normal(grad_shape, generator)
            target = torch.Size(shape) if k % 2 else tuple(shape)  # a tuple, or x.shape as in a backward
            for device in devices.available():
                _check_unbroadcast_once(student, grad.to(device), target)
        meta = _unbroadcast_on_meta(student, pairs)
    passed(f"unbroadcast: right shape and values for {len(pairs)} (grad shape, shape) pairs "
           f"({', '.join(devices.available())}).")
    note(meta)
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


def _check_unbroadcast_once(student, grad: torch.Tensor, shape: Shape) -> None:
    __tracebackhide__ = True
    call = f"unbroadcast(grad, {shape!r})"
    given = [f"grad = {show(grad)}"]
    before = grad.clone()
    try:
        got, modified = _call_unbroadcast(student, grad, shape)
    except probe.StudentError as exc:
        what, cause = explain.error("unbroadcast", exc.type, exc.message, ["grad", "shape"])
        fail(f"{call}: {what}.", *given, cause=cause)
    want = gradient_patterns.sum_to_size(before, shape)
    if not isinstance(got, torch.Tensor):
        fail(f"{call} returned {got}, not a tensor.", *given)
    if modified:
        fail(f"{call} modified `grad` in place.", *given,
             cause="grad belongs to the caller (often autograd itself): compute a new tensor instead.")
    if got.dtype != want.dtype or got.device != want.device:
        fail(f"{call} returned a {got.dtype} tensor on {got.device}; expected {want.dtype} on {want.device}.", *given,
             cause="keep grad's dtype and device: derive new tensors from grad (no `torch.zeros(shape)`).")
    if got.shape != want.shape:
        fail(f"{call} has shape {tuple(got.shape)}, expected {tuple(want.shape)}.", *given,
             cause=_known_mistake(got, _unbroadcast_mistakes(before, tuple(shape))))
    if not torch.allclose(got, want):
        fail(f"{call} has wrong values.", *given, *explain.differ(want, got, rtol=1e-5, atol=1e-8),
             cause=_known_mistake(got, _unbroadcast_mistakes(before, tuple(shape))))


def _unbroadcast_on_meta(student, pairs: Sequence[tuple[Shape, Shape]]) -> str:
    """A tensor created on the CPU inside unbroadcast shows up on the meta device."""
    __tracebackhide__ = True
    for grad_shape, shape in pairs:
        try:
            _call_unbroadcast(student, torch.empty(tuple(grad_shape), dtype=torch.float64, device="meta"), tuple(shape))
        except probe.StudentError as exc:
            if "device" in exc.message:
                what, cause = explain.error("unbroadcast", exc.type, exc.message, ["grad", "shape"])
                fail(f"on another device (meta) {what}.", cause=cause)
            return f"meta device: not checked ({exc.type} from an operation meta tensors do not support)."
    return "meta device: no tensor is tied to the CPU."


def _call_unbroadcast(student: Any, grad: torch.Tensor, shape: Shape) -> tuple[torch.Tensor | str, bool]:
    """(what `student(grad, shape)` returned: a tensor, or the name of its type; whether it
    changed grad). Raises probe.StudentError if it raised."""
    data = probe.invoke(gradient_patterns.run_unbroadcast, student, grad, tuple(shape), isinstance(shape, torch.Size))
    try:
        error = probe.ProbeError.from_data(data["error"])
        returned, modified = data["returned"], data["modified"]
    except (KeyError, TypeError):
        raise probe.Malformed("malformed unbroadcast result") from None
    if error is not None:
        raise probe.StudentError(error.type, error.message)
    if not isinstance(returned, (torch.Tensor, str)) or not isinstance(modified, bool):
        raise probe.Malformed("malformed unbroadcast result")
    return returned, modified


# --- 4.4 Affine, a broadcasting Function --------------------------------------------------

AffineShapes = tuple[Shape, Shape, Shape]  # x, weight, bias

AFFINE_SHAPES: tuple[AffineShapes, ...] = (
    ((2, 3, 4), (3, 1), (4,)),
    ((3, 1), (4,), ()),
    ((4,), (2, 1, 4), (3, 1)),
)


def _affine_cases(shapes: Sequence[AffineShapes]):
    def cases(generator: torch.Generator) -> list[tuple]:
        return [tuple(inputs.normal(s, generator) for s in triple) for triple in shapes]

    return cases


def _affine_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    local = ("grad_output * weight", "grad_output * x", "grad_output")[i]
    name = ("x", "weight", "bias")[i]
    return f"at the output's shape the gradient for `{name}` is {local}; then unbroadcast it to {name}.shape."


AFFINE = FunctionSpec(
    name="Affine", reference=lambda x, weight, bias: x * weight + bias, cases=_affine_cases(AFFINE_SHAPES),
    hint=_affine_hint, double_backward=True,
)


def check_affine(student: type[torch.autograd.Function], *, shapes: Sequence[AffineShapes] = AFFINE_SHAPES,
                 seed: int | None = 0) -> None:
    """Affine(x, weight, bias) = x * weight + bias, all three broadcasting."""
    __tracebackhide__ = True
    spec = replace(AFFINE, cases=_affine_cases(shapes))
    with probe.substituted(student, {"unbroadcast": gradient_patterns.sum_to_size}) as substituted:
        check_function(student, spec, seed=seed)
        cases = spec.cases(inputs.generator(seed))
        check_returned_shapes(student, "Affine", cases)
        passed(f"Affine: backward returns every gradient with the shape of its input ({len(cases)} input(s)).")
    if substituted:
        note("checked with the course's unbroadcast in place of yours (exercise 4.3 grades yours).")


# --- 4.5 Mean over a dim -----------------------------------------------------------------

Reduction = tuple[Shape, int, bool]  # (x.shape, dim, keepdim)
# A square input first: forgetting to unsqueeze then gives wrong values (and a hint), not an error.

MEAN_CASES: tuple[Reduction, ...] = (
    ((3, 3), 1, False), ((3, 4), 1, False), ((2, 3, 4), -2, True), ((4,), 0, False),
    ((3, 1, 4), 1, False), ((1, 5), 0, False),  # a reduced dim of size 1, a batch of one
)


def _reduction_cases(specs: Sequence[Reduction], values: Callable[[Shape, torch.Generator], torch.Tensor]):
    def cases(generator: torch.Generator) -> list[tuple]:
        return [(values(shape, generator), dim, keepdim) for shape, dim, keepdim in specs]

    return cases


def _mean_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    x, dim, keepdim = args
    return (
        f"every entry of x along dim {dim} contributes 1/{x.shape[dim]} of its output entry, so its gradient is "
        f"grad_output / {x.shape[dim]}, copied along dim {dim}"
        + ("" if keepdim else f" (unsqueeze grad_output at dim {dim} first: with keepdim=False that dim is gone).")
    )


MEAN = FunctionSpec(name="Mean", reference=torch.mean, cases=_reduction_cases(MEAN_CASES, inputs.normal),
                    hint=_mean_hint, double_backward=True)


def check_mean(student: Any, *, specs: Sequence[Reduction] = MEAN_CASES, seed: int | None = 0) -> None:
    """Mean(x, dim, keepdim=False) = x.mean(dim, keepdim)."""
    __tracebackhide__ = True
    check_function(student, replace(MEAN, cases=_reduction_cases(specs, inputs.normal)), seed=seed)


# --- 4.6 Max over a dim, ties split equally ----------------------------------------------

MAX_CASES: tuple[Reduction, ...] = (
    ((3, 3), 1, False), ((3, 4), 1, False), ((2, 3, 4), -2, True), ((5,), 0, False),
    ((3, 1, 4), 1, False), ((1, 5), 1, False),  # a reduced dim of size 1, a batch of one
)

# Ties crafted to include two-way, three-way and all-equal ties, and ties below the maximum.
CRAFTED_TIES: tuple[tuple, ...] = (
    (torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, 1.0, 5.0, 1.0]], dtype=torch.float64), 1, False),
    (torch.tensor([[4.0, 1.0], [4.0, 1.0], [0.0, 1.0]], dtype=torch.float64), 0, True),
    (torch.tensor([4.0, 4.0, -1.0, 4.0], dtype=torch.float64), -1, False),
)


def _distinct(shape: Shape, generator: torch.Generator) -> torch.Tensor:
    """No ties, and no two values closer than 0.4: finite differences stay on one side of every kink."""
    count = int(torch.Size(shape).numel())
    order = torch.randperm(count, generator=generator).to(torch.float64)
    noise = 0.1 * torch.rand(count, generator=generator, dtype=torch.float64)
    return (0.5 * order + noise).reshape(tuple(shape))


def _with_ties(shape: Shape, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 3, tuple(shape), generator=generator).to(torch.float64)


def _max_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    x, dim, keepdim = args
    return (
        f"the gradient is grad_output at the maximum of each slice along dim {dim} and 0 elsewhere"
        + ("." if keepdim else f" (unsqueeze grad_output at dim {dim} first: with keepdim=False that dim is gone).")
    )


MAX = FunctionSpec(name="Max", reference=torch.amax, cases=_reduction_cases(MAX_CASES, _distinct), hint=_max_hint,
                   double_backward=True)


def check_max(student: Any, *, specs: Sequence[Reduction] = MAX_CASES, seed: int | None = 0) -> None:
    """Max(x, dim, keepdim=False) = x.amax(dim, keepdim); at a tie the gradient is split equally.

    gradcheck is meaningless at a tie (max is not differentiable there), so it runs on
    tie-free inputs only; inputs with ties are compared with torch.amax, which splits equally.
    """
    __tracebackhide__ = True
    with quiet():
        _check_dims_of_size_one(student, specs, inputs.generator(seed))
    check_function(student, replace(MAX, cases=_reduction_cases(specs, _distinct)), seed=seed)
    generator = inputs.generator(seed)
    ties = [*CRAFTED_TIES, *_reduction_cases(specs, _with_ties)(generator)]
    with quiet():
        for device in devices.available():
            for case in ties:
                _check_ties_once(student, devices.prepare(case, device), generator)
    passed(f"Max: at ties the gradient is split equally among the tied entries ({len(ties)} inputs with ties).")


def _run_against_amax(student, args: tuple, generator: torch.Generator):
    """(a random grad_output, the inputs shown in a message, torch.amax's run, the student's run)."""
    x, dim, keepdim = args
    grad_output = torch.randn(torch.amax(x, dim, keepdim).shape, generator=generator, dtype=x.dtype).to(x.device)
    shown = [f"x = {show(x)}", f"dim = {dim}, keepdim = {keepdim}", f"grad_output = {show(grad_output)}"]
    expected = probe.run(torch.amax, devices.prepare(args, x.device.type), [[grad_output]])
    return grad_output, shown, expected, probe.run(student, args, [[grad_output]])


def _check_dims_of_size_one(student, specs: Sequence[Reduction], generator: torch.Generator) -> None:
    """Name a mistake that only a dim of size 1 shows: the student's Max is wrong with it and
    right once that dim has size 2. Any other mistake is left to check_function's messages,
    which show it on the inputs without such dims first."""
    __tracebackhide__ = True
    for x_shape, dim, keepdim in specs:
        if 1 not in x_shape:
            continue
        twin = tuple(2 if n == 1 else n for n in x_shape)
        found = _disagreement(student, devices.prepare((_distinct(x_shape, generator), dim, keepdim), "cpu"), generator)
        if found is None or _disagreement(student, devices.prepare((_distinct(twin, generator), dim, keepdim), "cpu"),
                                          generator):
            continue
        what, details, squeezed = found
        fail(f"Max on x of shape {tuple(x_shape)} (dim = {dim}, keepdim = {keepdim}): {what}; "
             f"on x of shape {twin} it is right.", *details,
             cause=_size_one_cause(tuple(x_shape), dim, keepdim, squeezed))


def _disagreement(student, args: tuple, generator: torch.Generator) -> tuple[str, list[str], bool] | None:
    """How the student's Max disagrees with torch.amax on `args`: (what, the details to show,
    whether forward dropped every dim of size 1), or None if it agrees."""
    x, dim, keepdim = args
    _, shown, expected, actual = _run_against_amax(student, args, generator)
    want = expected.outputs[0]
    out = actual.outputs[0] if actual.outputs else None
    if out is not None and out.shape != want.shape:
        squeezed = out.shape == torch.amax(x, dim, keepdim=True).squeeze().shape
        return f"forward has shape {tuple(out.shape)}, expected {tuple(want.shape)}", shown[:2], squeezed
    if actual.error:
        what, _ = explain.error(actual.error.stage, actual.error.type, actual.error.message, ["x", "dim", "keepdim"],
                                arg_shapes=[tuple(x.shape), None, None])
        return what, shown, False
    if out is None or not torch.allclose(out.cpu().to(want.dtype), want.cpu()):
        compared = explain.differ(want, out, rtol=1e-5, atol=1e-8) if out is not None else ["no output"]
        return "forward has wrong values", [*shown[:2], *compared], False
    want_grad, got = expected.grads[0][0].cpu(), actual.grads[0][0]
    if got is None or got.shape != want_grad.shape or not torch.allclose(got.cpu().to(want_grad.dtype), want_grad):
        compared = explain.differ(want_grad, got, rtol=1e-5, atol=1e-8) if got is not None else [
            f"expected {show(want_grad)}", "actual   None"]
        return "wrong gradient for `x`", [*shown, *compared], False
    return None


def _size_one_cause(x_shape: tuple[int, ...], dim: int, keepdim: bool, squeezed: bool) -> str:
    others = [i for i, n in enumerate(x_shape) if n == 1 and i != dim % len(x_shape)]
    also = f", and here also dim {', '.join(map(str, others))} of x" if others else ""
    if squeezed:
        return (f"`squeeze()` without a dim removes every dim of size 1: the reduced one{also}. "
                "Remove only the reduced dim: `squeeze(dim)`.")
    if x_shape[dim] == 1:
        unsqueeze = (", but with keepdim=False that dim is gone from grad_output: put it back with "
                     "`grad_output.unsqueeze(dim)` for this size too") if not keepdim else ""
        return ("a reduced dim of size 1 is reduced like any other: each entry is the maximum of its slice and "
                f"gets the whole grad_output{unsqueeze}. A special case for size 1, or a `squeeze()` without a dim, "
                "gets this wrong.")
    return (f"dim {', '.join(map(str, others))} of x has size 1 and is not reduced (like a batch of one), yet your "
            "code treats it differently: most likely a `squeeze()` without a dim, which removes every dim of size 1, "
            "not only the reduced one. Name the dim: `squeeze(dim)`, `unsqueeze(dim)`.")


def _check_ties_once(student, args: tuple, generator: torch.Generator) -> None:
    __tracebackhide__ = True
    x, dim, keepdim = args
    grad_output, shown, expected, actual = _run_against_amax(student, args, generator)
    if actual.error:
        what, cause = explain.error(actual.error.stage, actual.error.type, actual.error.message,
                                    ["x", "dim", "keepdim"])
        fail(f"Max on an input with ties: {what}.", *shown, cause=cause)
    want, got = expected.grads[0][0].cpu(), actual.grads[0][0]
    got = torch.zeros_like(want) if got is None else got.cpu()
    if got.shape == want.shape and torch.allclose(got, want):
        return
    fail(
        "Max: wrong gradient for `x` at a tie.", *shown, *explain.differ(want, got, rtol=1e-5, atol=1e-8),
        cause=_known_mistake(got, _tie_mistakes(x.detach().cpu(), dim, keepdim, grad_output.cpu()))
        or "at a tie of k entries, each tied entry gets grad_output / k and the other entries get 0.",
    )


def _tie_mistakes(x: torch.Tensor, dim: int, keepdim: bool, grad_output: torch.Tensor) -> Mistakes:
    spread = grad_output if keepdim else grad_output.unsqueeze(dim)
    tied = x == x.amax(dim, keepdim=True)
    return (
        (lambda: spread * tied,
         "every tied entry got the whole grad_output, so the total gradient is k times too large at a "
         "k-way tie. Split it: divide by the number of tied entries in each slice."),
        (lambda: torch.zeros_like(x).scatter(dim, x.argmax(dim, keepdim=True), spread),
         "the whole gradient went to one of the tied entries, as torch.max(x, dim) does. This exercise "
         "fixes another choice: split it equally among the tied entries, as torch.amax does."),
    )


# --- 4.7 Conv2d ----------------------------------------------------------------------------

ConvSizes = tuple[Shape, Shape, bool, Any, Any]  # input shape, weight shape, with bias, stride, padding

CONV_SIZES: tuple[ConvSizes, ...] = (
    ((1, 2, 4, 4), (2, 2, 3, 3), True, 1, 0),
    ((1, 1, 6, 6), (2, 1, 3, 3), False, 2, 1),  # a 5x5 input gives the same output size
    ((2, 1, 3, 4), (2, 1, 2, 3), True, 1, 1),
)


def _pick(options: Sequence, generator: torch.Generator) -> Any:
    return options[int(torch.randint(len(options), (), generator=generator))]


def per_axis_sizes(generator: torch.Generator) -> ConvSizes:
    """A convolution whose two spatial axes differ in everything: input size, kernel size,
    stride, padding, and the rows or columns the stride leaves over (conv_transpose2d's
    output_padding). A value of one axis used for both axes cannot pass it."""
    (kh, kw), (sh, sw), (ph, pw) = (_pick(pairs, generator) for pairs in (KERNELS, STRIDES, PADDINGS))
    fits = [(h, w) for h in range(4, 10) for w in range(4, 10)
            if h != w and (h + 2 * ph - kh) % sh != (w + 2 * pw - kw) % sw]
    h, w = _pick(fits, generator)
    return (_pick((1, 2), generator), 2, h, w), (3, 2, kh, kw), True, (sh, sw), (ph, pw)


KERNELS = ((1, 2), (2, 1), (2, 3), (3, 2), (1, 3), (3, 1))
STRIDES = ((1, 2), (2, 1), (2, 3), (3, 2))
PADDINGS = ((0, 1), (1, 0), (1, 2), (2, 1))


def _conv_cases(sizes: Sequence[ConvSizes]):
    """The given sizes, and one drawn by `per_axis_sizes`: every draw has its two axes differ."""

    def cases(generator: torch.Generator) -> list[tuple]:
        return [
            (inputs.normal(x, generator), inputs.normal(w, generator),
             inputs.normal(w[:1], generator) if bias else None, stride, padding)
            for x, w, bias, stride, padding in (*sizes, per_axis_sizes(generator))
        ]

    return cases


def _conv_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    stride, padding = args[3], args[4]
    if i == 2:
        return "the bias is added at every (batch, row, column) position: sum grad_output over dims 0, 2 and 3."
    per_axis = (" Here the two axes differ: every parameter is a pair (height, width), and each axis needs its "
                "own value — one axis's stride, padding, kernel size or output_padding used for both is right "
                "only when they happen to agree." if isinstance(stride, tuple) or isinstance(padding, tuple) else "")
    return (
        f"pass the stride ({stride!r}) and padding ({padding!r}) of forward to "
        f"torch.nn.grad.conv2d_{'input' if i == 0 else 'weight'}, with the shape of the "
        f"{'input' if i == 0 else 'weight'}.{per_axis}"
    )


CONV2D = FunctionSpec(name="Conv2d", reference=F.conv2d, cases=_conv_cases(CONV_SIZES), hint=_conv_hint,
                      double_backward=True)


def check_conv2d(student: Any, *, sizes: Sequence[ConvSizes] = CONV_SIZES, seed: int | None = 0) -> None:
    """Conv2d(input, weight, bias=None, stride=1, padding=0) = F.conv2d(...)."""
    __tracebackhide__ = True
    check_function(student, replace(CONV2D, cases=_conv_cases(sizes)), seed=seed)
