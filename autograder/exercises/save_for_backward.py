"""Checks for notebook 06_save_for_backward."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from ..checks import explain, inputs
from ..checks.functions import FunctionSpec, check_function
from ..checks.saved import SaveRule, check_saved
from ..student import devices, probe, save_for_backward
from ..student.report import fail, passed, quiet, show
from ..student.saved import KINDS, Names, Recording, non_leaf, record

Cases = Callable[[torch.Generator], list[tuple]]


def _normal_cases(shapes: Sequence[Sequence[int]], *special: torch.Tensor) -> Cases:
    """One standard-normal x per shape, then the `special` points among random values."""
    return lambda generator: [(inputs.normal(s, generator),) for s in shapes] + [(inputs.among(x, generator),)
                                                                                  for x in special]


def _saves_exactly(student: Any, rule: SaveRule, cases: Cases, seed: int | None, copy: bool = False) -> Recording:
    """check_saved on the first two cases, on every device; `copy` applies the Function to
    a non-leaf copy of each argument (in-place Functions cannot modify a leaf that requires
    grad). (What a Function saves does not depend on the shape; a backward that fails on
    another shape is check_function's to explain, with the gradients.)"""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    for device in devices.available():
        for args in cases(generator)[:2]:
            recording = check_saved(student, rule, devices.prepare(args, device), copy=copy)
    return recording


def _bytes(recording: Recording) -> str:
    x = recording.args[0]
    return f"{recording.nbytes} bytes for x of shape {tuple(x.shape)}"


# --- Shared by the checks of notebooks 06 and 07 --------------------------------------------

def check_finite(student: Any, name: str, reference: Callable, special: torch.Tensor, cause: str,
                 generator: torch.Generator) -> None:
    """At the `special` points (exactly 0, large magnitudes; among random values, at random
    places), the student's outputs and gradients (grad_output of ones) must be finite
    wherever the reference's are: a formula that overflows, or divides 0 by 0, is wrong there
    although it is right elsewhere. (The values themselves are then compared by
    check_function, which gets special points as a case.)"""
    __tracebackhide__ = True
    x = inputs.among(special, generator)
    (ref_x,) = devices.prepare((x,), "cpu")
    ones = [torch.ones_like(o) for o in probe.outputs_of(reference(ref_x.detach())) if o.is_floating_point()]
    expected = probe.run(reference, (ref_x,), [ones])
    with quiet():
        actual = probe.run(student, devices.prepare((x,), "cpu"), [ones])
    if actual.error is not None or len(actual.outputs) != len(expected.outputs):
        return  # check_function names the error
    pairs = [(f"output {k}" if len(expected.outputs) > 1 else "output", w, g)
             for k, (w, g) in enumerate(zip(expected.outputs, actual.outputs))]
    if actual.grads:
        pairs += [("gradient (grad_output of ones)", w, g) for w, g in zip(expected.grads[0], actual.grads[0])]
    points = [float(v) for v in special.tolist()]
    for what, want, got in pairs:
        if got is None or want is None or got.shape != want.shape or not got.is_floating_point():
            continue
        bad = torch.isfinite(want.cpu()) & ~torch.isfinite(got.detach().cpu())
        if bool(bad.any()):
            (k,) = explain.first_index(bad.reshape(-1))
            point, value, right = x.reshape(-1)[k].item(), got.reshape(-1)[k].item(), want.reshape(-1)[k].item()
            # A special point is the course's, the same in every draw; the values around it are the draw's.
            where = f"x = {point:g}" if point in points else f"entry {k} of x"
            fail(f"{name}: the {what} is {value} at {where}, where it is {right:.6g}.", f"x = {show(x)}",
                 cause=cause)
    passed(f"{name}: values and gradients are finite at x = {', '.join(f'{v:g}' for v in points)}, where the "
           "reference's are.")


def check_outputs(
    student: Any, name: str, args: tuple, labels: Sequence[str], *, arg_names: Sequence[str] = ("x",),
    integer: Sequence[str] = (), integer_cause: str = "", non_differentiable: str = "",
) -> None:
    """forward returns one tensor per label; those in `integer` are int64 (never
    differentiable), every other one has a grad_fn (best effort: reported by the process
    that ran forward)."""
    __tracebackhide__ = True
    shown = ", ".join(f"{n} of shape {tuple(a.shape)}" if isinstance(a, torch.Tensor) else f"{n} = {a!r}"
                      for n, a in zip(arg_names, args))
    with quiet():
        found = probe.invoke(save_for_backward.outputs_report, student, args)
    try:
        error, returned, outputs = probe.ProbeError.from_data(found["error"]), found["type"], found["outputs"]
        pairs = [(str(dtype), bool(graph)) for dtype, graph in outputs] if outputs is not None else None
    except (KeyError, TypeError, ValueError) as bad:
        raise probe.Malformed(f"malformed outputs: {bad}") from None
    if error is not None:
        what, cause = explain.error("forward", error.type, error.message, list(arg_names))
        fail(f"{name}: {what}.", shown, cause=cause)
    if pairs is None or len(pairs) != len(labels):
        got = f"{len(pairs)} tensors" if pairs is not None else returned
        fail(f"{name} must return {len(labels)} tensors, ({', '.join(labels)}).", shown, f"got {got}")
    for label, (dtype, graph) in zip(labels, pairs):
        if label in integer and dtype != str(torch.int64):
            fail(f"{name}: `{label}` has dtype {dtype}, expected torch.int64.", shown, cause=integer_cause)
        if label not in integer and not graph:
            fail(f"{name}: `{label}` is not connected to autograd (no grad_fn).", shown, cause=non_differentiable)


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
    _Example("SinhIntermediates.apply(x)  # saves exp(x) and exp(-x)", save_for_backward.SinhIntermediates,
             lambda x, b: (x,)),
    _Example("SquareTail.apply(x)  # saves x[1:], a view of x", save_for_backward.SquareTail, lambda x, b: (x,)),
    _Example("ReLUMask.apply(x)  # saves the bool mask x > 0", save_for_backward.ReLUMask, lambda x, b: (x,)),
    _Example("Mul.apply(x, b)  # b does not require grad", save_for_backward.Mul, lambda x, b: (x, b.detach())),
    _Example("TopTwo.apply(x)  # saves the int64 indices of the two largest, output 1", save_for_backward.TopTwo,
             lambda x, b: (x,)),
    _Example("ExpInPlace.apply(x * 1)  # in place: its output is its input", save_for_backward.ExpInPlace,
             lambda x, b: (x,), copy=True),
    _Example("ExpOnCtx.apply(x)  # stashes its output on ctx", save_for_backward.ExpOnCtx, lambda x, b: (x,)),
    _Example("Exp.apply(x.detach())  # no input requires grad", save_for_backward.Exp, lambda x, b: (x.detach(),)),
    _Example("RowOfOuter.apply(x)  # saves p[0], a row of the intermediate n x n matrix p",
             save_for_backward.RowOfOuter, lambda x, b: (x,)),
    _Example("SavesTwice.apply(x)  # saves e = exp(x) and e[1:], one block of memory", save_for_backward.SavesTwice,
             lambda x, b: (x,)),
)


def _kept_alive(recording: Recording) -> int:
    """Bytes of the distinct storages of the saved intermediates: the memory the call keeps
    alive only for backward (a view keeps its whole storage)."""
    blocks = {}
    for s in recording.saved:
        if s.kind == "intermediate":
            storage = s.tensor.untyped_storage()
            blocks[storage.data_ptr()] = storage.nbytes()
    return sum(blocks.values())


def _kept_alive_mistakes(recording: Recording) -> dict[str, int]:
    """What kept_alive returns for the usual mistakes, each with its cause."""
    intermediates = [s for s in recording.saved if s.kind == "intermediate"]
    storages = {s.tensor.untyped_storage().data_ptr(): (s.tensor.untyped_storage().nbytes(), s.tensor.element_size())
                for s in intermediates}
    return {
        "a view keeps its whole block of memory alive, not only the elements it shows: count "
        "`t.untyped_storage().nbytes()`, not `t.numel() * t.element_size()`.":
            sum(s.nbytes for s in intermediates),
        "two saved tensors in one block of memory keep it alive once: count each storage once "
        "(a dict or set keyed by `t.untyped_storage().data_ptr()`).":
            sum(s.tensor.untyped_storage().nbytes() for s in intermediates),
        "the memory of the inputs and outputs exists anyway: count only saved tensors that share "
        "no storage with an input or an output.":
            sum({s.tensor.untyped_storage().data_ptr(): s.tensor.untyped_storage().nbytes()
                 for s in recording.saved}.values()),
        "count bytes (`storage.nbytes()`), not elements.":
            sum(nbytes // size for nbytes, size in storages.values()),
    }


def check_saved_by(saved_by: Callable[..., Any], kept_alive: Callable[..., Any] | None = None, *,
                   shape: Sequence[int] = (4,), seed: int | None = 0) -> None:
    """saved_by(fn, *args) -> [(kind, shape, nbytes)] for each tensor fn saved, in order;
    kept_alive(fn, *args) -> the bytes of the storages that only the saved tensors keep alive."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    recorded = []
    for example in SAVED_BY_EXAMPLES:
        x, b = (inputs.normal(shape, generator).requires_grad_() for _ in range(2))
        args = example.args(x, b)
        recording = record(example.fn, *(non_leaf(args) if example.copy else args))
        recorded.append((example, args, recording))
        expected = [(s.kind, s.shape, s.nbytes) for s in recording.saved]
        got = _entries(_called("saved_by", saved_by, example, args, shape), example.call)
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
        "a bool mask, an int64 output, an in-place Function, a tensor stashed on ctx, a call without grad, "
        "views of intermediates)."
    )
    if kept_alive is not None:  # after the line above, which a wrong kept_alive must not claim
        for example, args, recording in recorded:
            _check_kept_alive(kept_alive, example, args, shape, recording)
        passed(
            f"kept_alive: right on the same {len(SAVED_BY_EXAMPLES)} Functions (a saved row keeps its whole "
            "matrix alive, a block saved twice counts once, inputs and outputs count nothing)."
        )


def _called(label: str, student: Callable[..., Any], example: _Example, args: tuple, shape: Sequence[int]) -> Any:
    """student(example.fn, *args) in the student's process: its result, or a failure naming its error."""
    __tracebackhide__ = True
    with quiet():
        result = probe.invoke(save_for_backward.saved_by_result, student, example.fn, args, example.copy)
    error = probe.ProbeError.from_data(result.get("error") if isinstance(result, dict) else None)
    if error is not None:
        what, cause = explain.error(label, error.type, error.message, [])
        fail(f"{label} on `{example.call}`: {what}.", f"x has shape {tuple(shape)}", cause=cause)
    if not isinstance(result, dict) or "value" not in result:
        raise probe.Malformed(f"malformed {label} result")
    return result["value"]


def _check_kept_alive(kept_alive: Callable[..., Any], example: _Example, args: tuple, shape: Sequence[int],
                      recording: Recording) -> None:
    __tracebackhide__ = True
    got = _called("kept_alive", kept_alive, example, args, shape)
    want = _kept_alive(recording)
    if isinstance(got, bool) or not isinstance(got, (int, float, torch.Tensor)) or (
        isinstance(got, torch.Tensor) and got.numel() != 1
    ):
        fail(f"kept_alive must return a number of bytes (an int); on `{example.call}` it returned {show(got)}.")
    got = float(got)
    if got != want:
        cause = next((c for c, v in _kept_alive_mistakes(recording).items() if v == got and v != want), None)
        fail(
            f"kept_alive on `{example.call}` is wrong: {got:g} bytes, expected {want}.",
            f"x has shape {tuple(shape)}, float64; saved: "
            + (", ".join(f"{s.kind} of shape {s.shape}" for s in recording.saved) or "nothing"),
            cause=cause or "count the bytes of each storage (`t.untyped_storage().nbytes()`) that a saved "
            "tensor does not share with an input or an output, each storage once.",
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


# Exactly 0 and large magnitudes: exp(800) overflows float64, and exp(x) / (1 + exp(x)) is then inf / inf.
SIGMOID_SPECIAL = torch.tensor([0.0, 800.0, -800.0, 40.0, -40.0], dtype=torch.float64)
SIGMOID_OVERFLOW = (
    "exp of a large number overflows float64 to inf (beyond 709.78), and a formula such as "
    "exp(x) / (1 + exp(x)) then computes inf / inf = nan, although σ(x) is 1 there. Use torch.sigmoid, or "
    "1 / (1 + exp(-x)), where an overflow only makes the denominator inf and the result 0."
)


def check_sigmoid(student: Any, *, shapes: Sequence[Sequence[int]] = ((5,), (2, 3)), seed: int | None = 0) -> None:
    """Sigmoid(x) = 1 / (1 + exp(-x)), saving exactly its output; finite at large |x|."""
    __tracebackhide__ = True
    recording = _saves_exactly(student, SIGMOID_SAVES, _normal_cases(shapes), seed)
    passed(f"Sigmoid saves exactly its output ({_bytes(recording)}), nothing on ctx.")
    check_finite(student, "Sigmoid", torch.sigmoid, SIGMOID_SPECIAL, SIGMOID_OVERFLOW, inputs.generator(seed))
    check_function(student, replace(SIGMOID, cases=_normal_cases(shapes, SIGMOID_SPECIAL)), seed=seed)


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


# Exactly 0 and large magnitudes: exp(2x) overflows float64 beyond x = 354.9.
TANH_SPECIAL = torch.tensor([0.0, 400.0, -400.0, 20.0, -20.0], dtype=torch.float64)
TANH_OVERFLOW = (
    "exp(2x) overflows float64 to inf once x > 354.9, and (exp(2x) - 1) / (exp(2x) + 1) is then "
    "inf / inf = nan, although tanh(x) is 1 there. Let torch compute it in place: `x.tanh_()`."
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
    check_finite(_OnAClone(student), "Tanh_", torch.tanh, TANH_SPECIAL, TANH_OVERFLOW, inputs.generator(seed))
    check_function(_OnAClone(student), replace(TANH, cases=_normal_cases(shapes, TANH_SPECIAL)), seed=seed)


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
    x, dim = args
    along = "" if x.dim() < 2 else (
        f" Here x has shape {tuple(x.shape)} and is sorted along dim {dim}: scatter along that same dim "
        "(ctx.dim), not a fixed one."
    )
    return (
        "each entry of grad_values goes back to the position its value came from (a scatter at the "
        "indices); reading at the indices (a gather) applies the permutation a second time." + along
    )


SORT = FunctionSpec(
    name="Sort", reference=torch.sort, cases=_sort_cases([(6,), (3, 4), (4, 3), (1, 5)], [0, 0, -1, -1]),
    double_backward=True, hint=_sort_hint,
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


def check_sort(student: type[torch.autograd.Function], *,
               shapes: Sequence[Sequence[int]] = ((6,), (3, 4), (4, 3), (1, 5)),
               dims: Sequence[int] = (0, 0, -1, -1), seed: int | None = 0) -> None:
    """Sort(x, dim) -> (values, indices) like torch.sort; the indices are not differentiable."""
    __tracebackhide__ = True
    cases = _sort_cases(shapes, dims)
    for args in cases(inputs.generator(seed)):
        check_outputs(
            student, "Sort", devices.prepare(args, "cpu"), ("values", "indices"), arg_names=("x", "dim"),
            integer=("indices",),
            integer_cause="return the indices torch.sort gives: integer positions, which autograd never "
            "differentiates.",
            non_differentiable="only the indices are non-differentiable: pass them, not the values, to "
            "ctx.mark_non_differentiable.",
        )
    passed("Sort returns float values with a grad_fn and int64 indices without one.")
    recording = _saves_exactly(student, SORT_SAVES, cases, seed)
    passed(f"Sort saves exactly the indices ({_bytes(recording)}), nothing on ctx.")
    check_function(student, replace(SORT, cases=cases), seed=seed)


# --- Exercise: error, silently wrong, or correct? -----------------------------------------

WHAT_HAPPENS_CHOICES = ("error", "silently wrong", "correct")
