"""Checks for notebook 06_save_for_backward."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from ..checks import explain, inputs
from ..student import devices, probe, save_for_backward
from ..checks.functions import FunctionSpec, check_function
from ..student.report import fail, passed, quiet, show
from ..checks.saved import SaveRule, check_saved
from ..student.saved import KINDS, Names, Recording, non_leaf, record

Cases = Callable[[torch.Generator], list[tuple]]


def _normal_cases(shapes: Sequence[Sequence[int]]) -> Cases:
    return lambda generator: [(inputs.normal(s, generator),) for s in shapes]


def _saves_exactly(student: Any, rule: SaveRule, cases: Cases, seed: int | None, copy: bool = False) -> Recording:
    """check_saved on every case and device; `copy` applies the Function to a non-leaf
    copy of each argument (in-place Functions cannot modify a leaf that requires grad)."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    for device in devices.available():
        for args in cases(generator):
            recording = check_saved(student, rule, devices.prepare(args, device), copy=copy)
    return recording


def _bytes(recording: Recording) -> str:
    x = recording.args[0]
    return f"{recording.nbytes} bytes for x of shape {tuple(x.shape)}"


# --- Exercise: saved_by ------------------------------------------------------------------
# Small Functions, each saving something different, on which saved_by is compared with
# the course's recorder.

@dataclass(frozen=True)
class _Example:
    call: str  # how messages show the call
    fn: type[torch.autograd.Function]
    args: Callable[[torch.Tensor, torch.Tensor], tuple]  # from two random float64 leaves
    copy: bool = False  # fn works in place: it gets non-leaf copies of the arguments


SAVED_BY_EXAMPLES = (
    _Example("Square.apply(x)  # saves its input", save_for_backward.Square, lambda x, b: (x,)),
    _Example("Exp.apply(x)  # saves its output", save_for_backward.Exp, lambda x, b: (x,)),
    _Example("SinhIntermediates.apply(x)  # saves exp(x) and exp(-x)", save_for_backward.SinhIntermediates, lambda x, b: (x,)),
    _Example("SquareTail.apply(x)  # saves x[1:], a view of x", save_for_backward.SquareTail, lambda x, b: (x,)),
    _Example("ReLUMask.apply(x)  # saves the bool mask x > 0", save_for_backward.ReLUMask, lambda x, b: (x,)),
    _Example("Mul.apply(x, b)  # b does not require grad", save_for_backward.Mul, lambda x, b: (x, b.detach())),
    _Example("TopTwo.apply(x)  # saves the int64 indices of the two largest, output 1", save_for_backward.TopTwo,
             lambda x, b: (x,)),
    _Example("ExpInPlace.apply(x * 1)  # in place: its output is its input", save_for_backward.ExpInPlace, lambda x, b: (x,), copy=True),
    _Example("ExpOnCtx.apply(x)  # stashes its output on ctx", save_for_backward.ExpOnCtx, lambda x, b: (x,)),
    _Example("Exp.apply(x.detach())  # no input requires grad", save_for_backward.Exp, lambda x, b: (x.detach(),)),
)


def check_saved_by(saved_by: Callable[..., Any], *, shape: Sequence[int] = (4,), seed: int | None = 0) -> None:
    """saved_by(fn, *args) -> [(kind, shape, nbytes)] for each tensor fn saved, in order."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    for example in SAVED_BY_EXAMPLES:
        x, b = (inputs.normal(shape, generator).requires_grad_() for _ in range(2))
        args = example.args(x, b)
        recording = record(example.fn, *(non_leaf(args) if example.copy else args))
        expected = [(s.kind, s.shape, s.nbytes) for s in recording.saved]
        with quiet():
            result = probe.invoke(save_for_backward.saved_by_result, saved_by, example.fn, args, example.copy)
        error = probe.ProbeError.from_data(result.get("error") if isinstance(result, dict) else None)
        if error is not None:
            what, cause = explain.error("saved_by", error.type, error.message, [])
            fail(f"saved_by on `{example.call}`: {what}.", f"x has shape {tuple(shape)}", cause=cause)
        if not isinstance(result, dict) or "value" not in result:
            raise probe.Malformed("malformed saved_by result")
        got = _entries(result["value"], example.call)
        if got != expected:
            fail(
                f"saved_by on `{example.call}` is wrong.",
                f"x has shape {tuple(shape)}, float64",
                f"expected {expected}",
                f"actual   {got}",
                cause=_saved_by_cause(expected, got),
            )
    passed(
        f"saved_by: right on {len(SAVED_BY_EXAMPLES)} Functions (inputs, outputs, a view, intermediates, "
        "a bool mask, an int64 output, an in-place Function, a tensor stashed on ctx, a call without grad)."
    )


def _entries(result: Any, call: str) -> list[tuple]:
    __tracebackhide__ = True
    form = "saved_by must return a list of (kind, shape, nbytes) tuples"
    if not isinstance(result, (list, tuple)):
        fail(f"{form}; on `{call}` it returned {type(result).__name__}.")
    entries = []
    for entry in result:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            fail(f"{form}; on `{call}` one entry is {entry!r}.")
        kind, shape, nbytes = entry
        if kind not in KINDS:
            fail(f"{form}; kind must be 'input', 'output' or 'intermediate', got {kind!r} on `{call}`.")
        entries.append((kind, tuple(shape), int(nbytes)))
    return entries


def _saved_by_cause(expected: list[tuple], got: list[tuple]) -> str:
    if expected and not got:
        return (
            "nothing was recorded. The hooks must be active while fn runs (pack fires when "
            "forward returns), not around backward; call fn with the arguments as given."
        )
    if not expected:
        return (
            "nothing is saved here: a tensor stashed on ctx never reaches the hooks, and a "
            "call where no input requires grad builds no graph and saves nothing. Record "
            "only what the pack hook receives, and call fn with the arguments as given."
        )
    if len(got) != len(expected):
        return "one entry per tensor the pack hook receives, in the order it receives them."
    for (kind, shape, nbytes), (kind_got, shape_got, nbytes_got) in zip(expected, got):
        if kind != kind_got and kind_got == "intermediate":
            return (
                f"a tensor saved from the {kind} counts as the {kind} when it shares its memory. "
                "A saved tensor need not be the same Python object, and a view such as x[1:] "
                "starts later in memory, so t.data_ptr() differs: compare "
                "t.untyped_storage().data_ptr() with the inputs' and outputs' (after the call)."
            )
        if kind != kind_got:
            return (
                f"this tensor is {'an ' if kind[0] in 'aeiou' else 'a '}{kind}: only a tensor that shares the memory "
                "of an output (checked first) or of an input counts as one."
            )
        if shape != shape_got:
            return "the shape is tuple(t.shape)."
        if nbytes != nbytes_got:
            return "bytes are t.numel() * t.element_size(): 8 per element for float64 and int64, 1 for bool."
    return "compare your list with the expected one entry by entry."


# --- Exercise: Sigmoid saves its output ----------------------------------------------------

SIGMOID = FunctionSpec(
    name="Sigmoid", reference=torch.sigmoid, cases=_normal_cases([(5,), (2, 3)]), double_backward=True
)

SIGMOID_SAVES = SaveRule(
    name="Sigmoid",
    expected=("output 0",),
    fix="save only the output: σ'(x) = y·(1 − y) needs nothing else",
    names=Names(known={
        "exp(-x)": lambda x: torch.exp(-x),
        "1 + exp(-x)": lambda x: 1 + torch.exp(-x),
        "exp(x)": torch.exp,
        "sigmoid'(x)": lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x)),
        "sigmoid(x), but not the tensor forward returns,": torch.sigmoid,
    }),
    reasons={
        "input": "backward then recomputes sigmoid(x), which forward already computed; "
        "the derivative is a function of the output alone.",
    },
)


def check_sigmoid(student: Any, *, shapes: Sequence[Sequence[int]] = ((5,), (2, 3)), seed: int | None = 0) -> None:
    """Sigmoid(x) = 1 / (1 + exp(-x)), saving exactly its output."""
    __tracebackhide__ = True
    cases = _normal_cases(shapes)
    recording = _saves_exactly(student, SIGMOID_SAVES, cases, seed)
    passed(f"Sigmoid saves exactly its output ({_bytes(recording)}), nothing on ctx.")
    check_function(student, replace(SIGMOID, cases=cases), seed=seed)


# --- Exercise: Tanh_ in place -------------------------------------------------------------

def _tanh_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    return "after x.tanh_() the saved tensor holds y = tanh(x), not x, and tanh'(x) = 1 − y²."


TANH = FunctionSpec(
    name="Tanh_", reference=torch.tanh, cases=_normal_cases([(5,), (2, 3)]), double_backward=True, hint=_tanh_hint
)

TANH_SAVES = SaveRule(
    name="Tanh_",
    expected=("output 0",),
    fix="save x after x.tanh_(): its memory now holds the output y, and tanh'(x) = 1 − y²",
    names=Names(known={"x.clone()": lambda x: x, "tanh(x), but not x itself,": torch.tanh}),
    reasons={
        "intermediate": "an in-place Function exists to save memory, and a second tensor undoes "
        "that; the derivative 1 − y² needs only the output, which the input's memory now holds.",
    },
)


def check_tanh_(student: type[torch.autograd.Function], *, shapes: Sequence[Sequence[int]] = ((5,), (2, 3)),
                seed: int | None = 0) -> None:
    """Tanh_(x): tanh computed in place in x's memory, declared with ctx.mark_dirty."""
    __tracebackhide__ = True
    cases = _normal_cases(shapes)
    for device in devices.available():
        for (x,) in cases(inputs.generator(seed)):
            _check_in_place(student, devices.prepare((x,), device)[0])
    passed("Tanh_ modifies its input in place, returns it, and declares it with ctx.mark_dirty.")
    recording = _saves_exactly(student, TANH_SAVES, cases, seed, copy=True)
    passed(f"Tanh_ saves exactly its output, the input's own memory ({_bytes(recording)}).")
    check_function(_OnAClone(student), replace(TANH, cases=cases), seed=seed)


def _check_in_place(student: type[torch.autograd.Function], leaf: torch.Tensor) -> None:
    __tracebackhide__ = True
    shown = f"x = {show(leaf.detach())}"
    with quiet():
        found = probe.invoke(save_for_backward.apply_in_place, student, leaf)
    try:
        error, modified, returned = probe.ProbeError.from_data(found["error"]), found["modified"], found["returned"]
    except (KeyError, TypeError) as bad:
        raise probe.Malformed(f"malformed in-place report: {bad}") from None
    if error is not None:
        what, cause = explain.error("forward", error.type, error.message, ["x"])
        if "marked as dirty" in error.message:
            cause = "a tensor passed to ctx.mark_dirty must be returned: return x itself, not a new tensor."
        fail(f"Tanh_: {what}.", shown, cause=cause)
    if not modified:
        fail(
            "Tanh_ did not modify its input: x still holds its old values.", shown,
            cause="compute tanh in x's own memory (`x.tanh_()`) and return x; that saves the "
            "memory of a new output, which is the point of an in-place Function.",
        )
    if returned != "x":
        view = returned == "a view of x"
        fail(
            f"Tanh_ returned {'a view of x' if view else 'a new tensor'}, not x itself.", shown,
            cause="without ctx.mark_dirty(x) autograd does not know that forward changed x: "
            "the caller's x keeps its old place in the graph, so every gradient that flows "
            "through x afterwards is silently wrong. Call ctx.mark_dirty(x) and return x."
            if view else "return x itself after modifying it, and declare it with ctx.mark_dirty(x).",
        )


class _OnAClone(probe.StudentProxy):
    """The student's in-place Function applied to a clone of its argument, so that
    gradients reach the checks' leaf: every probe of it runs through `on_a_clone`, where
    the Function is."""

    def __init__(self, function: Any) -> None:
        self.function = function

    def invoke(self, procedure: str, *args: Any) -> Any:
        return probe.invoke(save_for_backward.on_a_clone, self.function, procedure, *args)


# --- Exercise: Sort with non-differentiable indices -----------------------------------------

def _sort_cases(shapes: Sequence[Sequence[int]], dims: Sequence[int]) -> Cases:
    return lambda generator: [(inputs.normal(s, generator), d) for s, d in zip(shapes, dims)]


def _sort_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    return (
        "each entry of grad_values goes back to the position its value came from: "
        "`torch.zeros_like(grad_values).scatter(dim, indices, grad_values)`; "
        "`gather` reads at the indices instead, which applies the permutation a second time."
    )


SORT = FunctionSpec(
    name="Sort", reference=torch.sort, cases=_sort_cases([(6,), (3, 4)], [0, 1]), double_backward=True, hint=_sort_hint
)

SORT_SAVES = SaveRule(
    name="Sort",
    expected=("output 1",),
    fix="save the indices: backward only sends each gradient back to where its value came from",
    names=Names(
        args=("x", "dim"),
        outputs=("values", "indices"),
        known={"indices.clone()": lambda x, dim: torch.sort(x, dim).indices},
    ),
    reasons={
        "input": "backward would sort x again, although forward already found the permutation: the indices.",
        "output": "the values are not needed: the gradient of a permutation is the inverse permutation.",
    },
)


def check_sort(student: type[torch.autograd.Function], *, shapes: Sequence[Sequence[int]] = ((6,), (3, 4)),
               dims: Sequence[int] = (0, 1), seed: int | None = 0) -> None:
    """Sort(x, dim) -> (values, indices) like torch.sort; the indices are not differentiable."""
    __tracebackhide__ = True
    cases = _sort_cases(shapes, dims)
    for args in cases(inputs.generator(seed)):
        _check_sort_outputs(student, devices.prepare(args, "cpu"))
    passed("Sort returns float values with a grad_fn and int64 indices without one.")
    recording = _saves_exactly(student, SORT_SAVES, cases, seed)
    passed(f"Sort saves exactly the indices ({_bytes(recording)}), nothing on ctx.")
    check_function(student, replace(SORT, cases=cases), seed=seed)


def _check_sort_outputs(student: type[torch.autograd.Function], args: tuple) -> None:
    __tracebackhide__ = True
    x, dim = args
    shown = f"x of shape {tuple(x.shape)}, dim = {dim}"
    with quiet():
        found = probe.invoke(save_for_backward.sort_outputs, student, args)
    try:
        error, returned, outputs = probe.ProbeError.from_data(found["error"]), found["type"], found["outputs"]
        pair = [(str(dtype), bool(graph)) for dtype, graph in outputs] if outputs is not None else None
    except (KeyError, TypeError, ValueError) as bad:
        raise probe.Malformed(f"malformed Sort outputs: {bad}") from None
    if error is not None:
        what, cause = explain.error("forward", error.type, error.message, ["x", "dim"])
        fail(f"Sort: {what}.", shown, cause=cause)
    if pair is None or len(pair) != 2:
        fail("Sort must return two tensors, (values, indices).", shown, f"got {returned}")
    (_, values_graph), (indices_dtype, _) = pair
    if indices_dtype != str(torch.int64):
        fail(
            f"Sort: the indices have dtype {indices_dtype}, expected torch.int64.", shown,
            cause="return the indices torch.sort gives: integer positions, which autograd never differentiates.",
        )
    if not values_graph:
        fail(
            "Sort: the values are not connected to autograd (no grad_fn).", shown,
            cause="only the indices are non-differentiable: pass them, not the values, to ctx.mark_non_differentiable.",
        )


# --- Exercise: error, silently wrong, or correct? -----------------------------------------

WHAT_HAPPENS_CHOICES = ("error", "silently wrong", "correct")
