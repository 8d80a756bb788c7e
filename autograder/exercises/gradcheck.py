"""Checks for notebook 05_gradcheck.

Jacobians are in gradcheck's layout: `J[i][j]` is the Jacobian of output i with respect
to input j, a 2-D tensor with one row per entry of input j and one column per entry of
output i (both flattened), so `J[i][j][r, c]` = d output_i[c] / d input_j[r].

The checks can judge in the grader's process: student code runs only in the probe
procedure `_attempted` (and in `check_function`'s probes), and the functions the checks
hand to student code (the `f` of `numerical_jacobian(f, inputs, eps)`) are registered
references, which cross processes by name.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
from torch.autograd.gradcheck import GradcheckError

from ..checks import explain, inputs
from ..checks.functions import FunctionSpec, check_function
from ..student import devices, gradcheck, probe
from ..student.report import fail, note, passed, quiet, show

Jacobians = list[list[torch.Tensor]]


# --- Reference Jacobians: torch's own (this module ships to students: no answers in it) ---

def outputs_of(result: Any) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _empty_jacobians(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> Jacobians:
    return [[x.new_zeros(x.numel(), o.numel()) for x in inputs] for o in outputs]


def numerical_jacobian(f: Callable, inputs: Sequence[torch.Tensor], eps: float = 1e-6) -> Jacobians:
    """Central differences, by torch's gradcheck itself (its numerical Jacobian)."""
    with torch.no_grad():
        return gradcheck._torch_numerical_jacobian(f, inputs, eps)


def analytical_jacobian(f: Callable, inputs: Sequence[torch.Tensor]) -> Jacobians:
    """From backward, by torch.autograd.functional.jacobian (one vjp per output entry),
    in gradcheck's layout: J[i][j][r, c] = d output_i[c] / d input_j[r]."""
    leaves = tuple(x.detach() for x in inputs)
    by_output = torch.autograd.functional.jacobian(lambda *a: outputs_of(f(*a)), leaves)
    return [[block.reshape(-1, x.numel()).T.contiguous() for block, x in zip(row, leaves)] for row in by_output]


def _forward_differences(f: Callable, inputs: Sequence[torch.Tensor], eps: float) -> Jacobians:
    """A known mistake of exercise 5.1: (f(x + eps e_r) - f(x)) / eps, row by row."""
    inputs = [x.detach() for x in inputs]
    with torch.no_grad():
        base = outputs_of(f(*inputs))
        J = _empty_jacobians(inputs, base)
        for j, t in enumerate(inputs):
            for r, step in enumerate(torch.eye(t.numel(), dtype=t.dtype, device=t.device).mul_(eps)):
                moved = [y + step.view_as(y) if k == j else y for k, y in enumerate(inputs)]
                for i, (p, b) in enumerate(zip(outputs_of(f(*moved)), base)):
                    J[i][j][r] = ((p - b) / eps).reshape(-1)
    return J


# --- Functions the checks differentiate ----------------------------------------------------

@dataclass(frozen=True)
class Case:
    """A function of float64 tensors the checks differentiate, described for messages."""

    name: str
    f: Callable  # registered in autograder.student.gradcheck: it is handed to student code
    inputs: tuple[torch.Tensor, ...]
    options: dict = field(default_factory=dict)  # eps, atol, rtol for mini_gradcheck
    cause: str | None = None  # the likely mistake when a verdict differs from torch's
    strided: tuple[int, ...] = ()  # inputs the student's code gets not contiguous (transposed views)

    def on(self, device: str) -> "Case":
        moved = tuple(x.to(device).requires_grad_() for x in self.inputs)
        return Case(self.name, self.f, moved, self.options, self.cause, self.strided)

    def describe(self) -> list[str]:
        return [f"{self.name}, inputs: " + ", ".join(show(x) for x in self.inputs)]


def _uniform(generator: torch.Generator, *shape: int, low: float = -1.0, high: float = 1.0) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float64)


def _jacobian_cases(generator: torch.Generator) -> list[Case]:
    """A Function whose backward is wrong (finite differences must not use it; first, so
    that a Jacobian taken from backward is recognised), elementwise, matmul, a triangular
    (square, not symmetric) Jacobian, two outputs, a 0-d input, and an input that is not
    contiguous (a transposed view: a flat view of it needs a contiguous copy)."""
    g = generator
    return [
        Case("ExpWithWrongBackward (a Function whose backward is wrong)", gradcheck.EXP_WITH_WRONG_BACKWARD,
             (_uniform(g, 3),)),
        Case("exp(1.5 * x)", gradcheck.EXP_1_5X, (_uniform(g, 2, 3),)),
        Case("x @ w", gradcheck.MATMUL, (_uniform(g, 2, 3), _uniform(g, 3, 2))),
        Case("sin(x).cumsum(0)", gradcheck.SIN_CUMSUM, (_uniform(g, 4),)),
        Case("(x * y, (x - y).pow(2).sum())", gradcheck.PRODUCT_AND_DISTANCE, (_uniform(g, 3), _uniform(g, 3))),
        Case("s * x.cumsum(0), s a 0-d tensor", gradcheck.SCALED_CUMSUM, (_uniform(g, 3), _uniform(g))),
        Case("x @ w, x a transposed view (not contiguous)", gradcheck.MATMUL, (_uniform(g, 2, 3), _uniform(g, 3, 2)),
             strided=(0,)),
    ]


# --- Running the student's code --------------------------------------------------------
#
# Every exercise of this notebook is a function student(f, inputs, ...). It runs where the
# student's code is (the procedure `_attempted`); only plain data comes back to be judged.

@dataclass
class Raised:
    """What a student's function raised, as plain data."""

    type: str
    message: str
    type_error: bool  # isinstance(exception, TypeError)
    not_implemented: bool  # isinstance(exception, NotImplementedError)
    report: dict | None  # the fields of a JacobianMismatch (gradcheck.REPORT_FIELDS), when it has them all

    @staticmethod
    def from_data(data: Any) -> "Raised | None":
        if data is None:
            return None
        try:
            raised = Raised(**data)
        except TypeError:
            raise probe.Malformed("malformed exception report") from None
        if not (isinstance(raised.type, str) and isinstance(raised.message, str)
                and isinstance(raised.type_error, bool) and isinstance(raised.not_implemented, bool)
                and (raised.report is None
                     or isinstance(raised.report, dict) and set(raised.report) == set(gradcheck.REPORT_FIELDS))):
            raise probe.Malformed("malformed exception report")
        return raised


@dataclass
class Attempt:
    value: Any  # what the student's function returned (None if it raised)
    raised: Raised | None
    inputs: Any  # the inputs it was given, afterwards: did it change the caller's tensors?


def _attempt(
    student: Any, f: Callable, inputs: Any, *rest: Any,
    options: dict | None = None, torch_numerical_jacobian: bool = False, strided: tuple[int, ...] = (),
) -> Attempt:
    """`student(f, inputs, *rest, **options)`, quietly; with `torch_numerical_jacobian`,
    torch's own finite differences replace the notebook's numerical_jacobian while it runs
    (so that exercise 5.2 is graded independently of exercise 5.1); the inputs at the
    positions in `strided` reach the student's code as transposed views."""
    replacements = {"numerical_jacobian": gradcheck.torch_numerical_jacobian} if torch_numerical_jacobian else {}
    with quiet(), probe.substituted(student, replacements):
        data = probe.invoke(gradcheck.attempted, student, f, inputs, rest, dict(options or {}), tuple(strided))
    if not isinstance(data, dict) or set(data) != {"value", "raised", "inputs"}:
        raise probe.Malformed("malformed outcome")
    if not _same_form(data["inputs"], inputs):
        raise probe.Malformed("malformed inputs")
    return Attempt(data["value"], Raised.from_data(data["raised"]), data["inputs"])


def _same_form(after: Any, before: Any) -> bool:
    """A tensor for a tensor, a sequence of as many tensors for a sequence of tensors."""
    if isinstance(before, torch.Tensor):
        return isinstance(after, torch.Tensor)
    return (isinstance(after, (list, tuple)) and len(after) == len(before)
            and all(isinstance(a, torch.Tensor) for a in after))


def _call(label: str, student: Callable, f: Callable, inputs: Any, *rest: Any) -> Any:
    """Call student code quietly; turn an unexpected exception into a readable failure."""
    __tracebackhide__ = True
    outcome = _attempt(student, f, inputs, *rest)
    _fail_if_raised(label, outcome.raised)
    return outcome.value


NOT_CONTIGUOUS = (
    "input {j} is not contiguous (a transposed view), and a flat view needs contiguous memory: `x.view(-1)` "
    "refuses it, and `x.reshape(-1)` or `x.flatten()` quietly returns a copy, so writing into it never "
    "reaches the tensor f sees. Copy each input into contiguous memory first: "
    "`x.detach().clone(memory_format=torch.contiguous_format)`."
)


def _fail_if_raised(label: str, raised: Raised | None, case: Case | None = None) -> None:
    __tracebackhide__ = True
    if raised is None:
        return
    what, cause = explain.error("it", raised.type, raised.message, [])
    if "does not require grad" in raised.message or "appears to not have been used" in raised.message:
        cause = ("an output that does not depend on an input gives no gradient: pass "
                 "`allow_unused=True` to torch.autograd.grad and treat None as zeros.")
    if "view size is not compatible" in raised.message and case is not None and case.strided:
        cause = NOT_CONTIGUOUS.format(j=case.strided[0])
    fail(f"{label}: {what}.", *(case.describe() if case is not None else []), cause=cause)


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=rtol, atol=atol))


def _compare_jacobians(
    label: str,
    actual: Any,
    expected: Jacobians,
    case: Case,
    candidates: dict[str, Callable[[], Jacobians]],
    *,
    rtol: float,
    atol: float,
) -> None:
    """Fail on the first J[i][j] that differs; name the known mistake whose result it matches."""
    __tracebackhide__ = True
    n_out, n_in = len(expected), len(expected[0])
    shown = case.describe()
    if not isinstance(actual, (list, tuple)) or len(actual) != n_out or any(
        not isinstance(row, (list, tuple)) or len(row) != n_in for row in actual
    ):
        fail(f"{label} must return J with J[i][j] for {n_out} output(s) i and {n_in} input(s) j "
             f"(a list of lists), got {show(actual)}.", *shown)
    for i, j in ((i, j) for i in range(n_out) for j in range(n_in)):
        got, want = actual[i][j], expected[i][j].cpu()
        where = f"J[{i}][{j}] (output {i} with respect to input {j})"
        if not isinstance(got, torch.Tensor):
            fail(f"{label}: {where} is {type(got).__name__}, not a tensor.", *shown)
        if got.shape != want.shape:
            transposed = tuple(got.shape) == tuple(want.shape)[::-1]
            fail(
                f"{label}: {where} has shape {tuple(got.shape)}, expected {tuple(want.shape)}: one row "
                f"per entry of input {j}, one column per entry of output {i}.", *shown,
                cause="the Jacobian is transposed: gradcheck's layout has inputs along the rows "
                "(the transpose of torch.autograd.functional.jacobian)." if transposed else None,
            )
        if got.dtype != torch.float64:
            fail(f"{label}: {where} has dtype {got.dtype}, expected torch.float64.", *shown,
                 cause="keep Jacobians in float64 (create them with dtype=torch.float64): float32 rounds "
                 "every entry to about 7 digits, and float32 finite differences are off by about 10% at eps=1e-6.")
        got = got.detach().cpu()
        if not _close(got, want, rtol, atol):
            cause = _known_mistake(actual, candidates, rtol=rtol, atol=atol)
            if cause is None and not bool(got.any()) and j in case.strided:
                cause = NOT_CONTIGUOUS.format(j=j)
            first = len(case.inputs[j]) if case.inputs[j].dim() else 0  # entries a loop over len(x) reaches
            if cause is None and 0 < first < got.shape[0] and _close(got[:first], want[:first], rtol, atol) \
                    and not bool(got[first:].any()):
                cause = (f"only the first {first} rows are filled: input {j} has {got.shape[0]} entries, and "
                         "`len(x)` counts only its first dimension (and fails on a 0-d tensor). Loop over "
                         "`x.numel()` entries of a flat view.")
            if cause is None and _close(got, want, 1e-3, 1e-6):
                cause = ("the values are close to the right ones but not equal: put each perturbed entry back "
                         "before perturbing the next (only one entry may differ from the input at a time), "
                         "and step by exactly +eps and -eps.")
            fail(f"{label}: {where} is wrong.", *shown, f"expected {show(want)}", f"actual   {show(got)}",
                 _first_difference(want, got, rtol=rtol, atol=atol), cause=cause)


def _first_difference(want: torch.Tensor, got: torch.Tensor, *, rtol: float, atol: float) -> str:
    """Where two Jacobians first differ, with enough digits to see a small difference."""
    bad = ~torch.isclose(got, want, rtol=rtol, atol=atol)
    row, col = explain.first_index(bad)
    w, g = want[row, col].item(), got[row, col].item()
    return (f"{int(bad.sum())} of {bad.numel()} entries differ; first at row {row}, column {col}: "
            f"expected {w:.12g}, got {g:.12g} (difference {g - w:.2g})")


def _known_mistake(actual: Any, candidates: dict[str, Callable[[], Any]], *, rtol: float, atol: float) -> str | None:
    """The first known mistake whose result all of `actual` matches."""
    for cause, compute in candidates.items():
        if _same_values(actual, compute(), rtol=rtol, atol=atol):
            return cause
    return None


def _same_values(actual: Any, candidate: Any, *, rtol: float, atol: float) -> bool:
    if isinstance(candidate, torch.Tensor):
        return isinstance(actual, torch.Tensor) and _close(actual.detach().cpu().double(), candidate.cpu(), rtol, atol)
    if isinstance(candidate, (list, tuple)):
        return (isinstance(actual, (list, tuple)) and len(actual) == len(candidate)
                and all(_same_values(a, c, rtol=rtol, atol=atol) for a, c in zip(actual, candidate)))
    return isinstance(actual, (int, float)) and abs(actual - candidate) <= atol + rtol * abs(candidate)


def _devices_note() -> None:
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


# --- Exercise 5.1: numerical_jacobian -------------------------------------------------------

# Central differences of float64 values agree with torch's to rounding (~1e-10 of |J|);
# a forward difference at eps=1e-3, float32 values or a wrong eps are far outside.
_NUMERICAL_RTOL, _NUMERICAL_ATOL = 1e-8, 1e-9


def _numerical_mistakes(case: Case, eps: float) -> dict[str, Callable[[], Jacobians]]:
    f, xs = case.f, case.inputs

    def scaled(k: float) -> Jacobians:
        return [[k * t for t in row] for row in numerical_jacobian(f, xs, eps)]

    return {
        "this is the forward difference (f(x + eps) - f(x)) / eps, whose error is O(eps); the central "
        "difference (f(x + eps) - f(x - eps)) / (2 * eps) has error O(eps**2).":
            lambda: _forward_differences(f, xs, eps),
        "the values are twice the central difference: the two points are 2 * eps apart, so divide by 2 * eps.":
            lambda: scaled(2.0),
        "the values are half the central difference: divide by 2 * eps, not 4 * eps (or perturb by eps, not eps / 2).":
            lambda: scaled(0.5),
        "the values are the central difference at eps=1e-6, not at the `eps` you were given.":
            lambda: numerical_jacobian(f, xs, 1e-6),
        "the values come from backward (autograd), not from finite differences: a numerical Jacobian "
        "must only call f, so that it can check a wrong backward.":
            lambda: analytical_jacobian(f, xs),
        "f was evaluated in float32: its rounding error, divided by eps, swamps the derivative.":
            lambda: [[t.double() for t in row] for row in numerical_jacobian(f, [x.float() for x in xs], eps)],
    }


def check_numerical_jacobian(
    student: Callable, *, eps: Sequence[float] = (1e-6, 1e-3), seed: int | None = 0,
) -> None:
    """numerical_jacobian(f, inputs, eps) must equal torch's central differences, in gradcheck's layout."""
    __tracebackhide__ = True
    cases = _jacobian_cases(inputs.generator(seed))
    for device in devices.available():
        for case in (c.on(device) for c in cases):
            for e in eps:
                label = f"numerical_jacobian(f, inputs, eps={e:g}) for f = {case.name}"
                before = [x.detach().clone() for x in case.inputs]
                outcome = _attempt(student, case.f, case.inputs, e, strided=case.strided)
                _fail_if_raised(label, outcome.raised, case)
                _check_unchanged(label, outcome.inputs, before)
                _compare_jacobians(
                    label, outcome.value, numerical_jacobian(case.f, case.inputs, e), case,
                    _numerical_mistakes(case, e), rtol=_NUMERICAL_RTOL, atol=_NUMERICAL_ATOL,
                )
    passed(
        f"numerical_jacobian agrees with torch's central differences on {len(cases)} functions "
        f"(a wrong backward, elementwise, matmul, triangular, two outputs, a 0-d input, an input that is not "
        f"contiguous) at eps = "
        f"{', '.join(f'{e:g}' for e in eps)} (float64, {', '.join(devices.available())})."
    )
    _devices_note()


def _check_unchanged(label: str, after: Sequence[torch.Tensor], before: list[torch.Tensor]) -> None:
    __tracebackhide__ = True
    for j, (x, b) in enumerate(zip(after, before)):
        if not torch.equal(x.detach(), b):
            change = (x.detach() - b).abs().max().item()
            fail(f"{label} changed input {j} of the caller (by up to {change:.2g}).", f"before {show(b)}",
                 cause="perturb a copy (`x.detach().clone()`), or put every entry back after perturbing it.")


# --- Exercise 5.2: analytical_jacobian and mini_gradcheck ------------------------------

_ANALYTICAL_RTOL, _ANALYTICAL_ATOL = 1e-9, 1e-12


def _analytical_mistakes(case: Case) -> dict[str, Callable[[], Jacobians]]:
    f, xs = case.f, case.inputs

    def summed() -> Jacobians:  # every column is backward with grad_output = ones
        J = analytical_jacobian(lambda *a: tuple(o.sum() for o in outputs_of(f(*a))), xs)
        expected = analytical_jacobian(f, xs)
        return [[t.expand_as(e) for t, e in zip(row, erow)] for row, erow in zip(J, expected)]

    return {
        "the values are the finite differences, not backward's: build the analytical Jacobian from "
        "torch.autograd.grad, so that a wrong backward shows.": lambda: numerical_jacobian(f, xs),
        "every column is the same: use a one-hot grad_output per output entry (column c: a 1 at entry c), "
        "not torch.ones_like(output).": summed,
    }


def _mini_gradcheck_cases(generator: torch.Generator) -> list[Case]:
    g = generator
    x, w = _uniform(g, 2, 3), _uniform(g, 3, 2)
    row, col = int(torch.randint(6, (), generator=g)), int(torch.randint(4, (), generator=g))
    tolerance = ("an entry passes when |analytical - numerical| <= atol + rtol * |numerical| "
                 "(torch.allclose(analytical, numerical, rtol=rtol, atol=atol)).")
    other = (row + 1 + int(torch.randint(5, (), generator=g))) % 6, col  # another entry, in another row
    either_sign = ("an error counts whatever its sign: compare |analytical - numerical| with the tolerance, "
                   "so that an analytical value too small fails as one too large does.")
    return [
        Case("tanh(x)", gradcheck.TANH, (_uniform(g, 2, 3),)),
        Case("x @ w", gradcheck.MATMUL, (x, w)),
        Case("(sin(x), x * y) (output 0 does not depend on y)", gradcheck.SIN_AND_PRODUCT,
             (_uniform(g, 3), _uniform(g, 3)),
             cause="where an output does not depend on an input, its Jacobian block is zero."),
        Case(f"OneWrongEntry: (2 x, x @ w) whose backward is 0.5 too large at J[1][1][{row}, {col}]",
             gradcheck.ONE_WRONG_ENTRY[row, col, 0.5], (x.clone(), w.clone()),
             cause="compare every entry of every (output, input) pair."),
        Case(f"OneWrongEntry: (2 x, x @ w) whose backward is 0.5 too small at J[1][1][{other[0]}, {other[1]}]",
             gradcheck.ONE_WRONG_ENTRY[(*other, -0.5)], (x.clone(), w.clone()),
             cause=f"compare every entry of every (output, input) pair; {either_sign}"),
        Case("tanh(x) whose backward ignores grad_output", gradcheck.TANH_IGNORES_GRAD_OUTPUT, (_uniform(g, 3),),
             cause="compare every entry of every (output, input) pair, off-diagonal ones too."),
        Case("tanh(x) whose backward is 0.05% too large (inside rtol)", gradcheck.TANH_OFF_BY[5e-4],
             (_uniform(g, 4),), cause=tolerance),
        Case("tanh(x) whose backward is 0.5% too large (outside rtol)", gradcheck.TANH_OFF_BY[5e-3],
             (_uniform(g, 4),), cause=tolerance),
        Case("tanh(x) whose backward is 0.5% too small (outside rtol)", gradcheck.TANH_OFF_BY[-5e-3],
             (_uniform(g, 4),), cause=f"{tolerance} {either_sign}"),
        Case("tanh(x) whose backward is 0.5% too large, checked with rtol=0.01", gradcheck.TANH_OFF_BY[5e-3],
             (_uniform(g, 4),), {"rtol": 1e-2}, cause="use the atol and rtol you are given."),
        Case("exp(2 x) at eps=0.1 (truncation error fails it)", gradcheck.EXP_2X, (_uniform(g, 3),),
             {"eps": 0.1}, cause="pass `eps` on to numerical_jacobian."),
    ]


def _torch_verdict(case: Case) -> str | None:
    """None when torch's gradcheck passes, else the first line of its message."""
    options = {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3, **case.options}
    with quiet():
        try:
            torch.autograd.gradcheck(case.f, case.inputs, **options)
        except GradcheckError as exc:
            return str(exc).strip().splitlines()[0].rstrip(",")
    return None


def check_mini_gradcheck(mini_gradcheck: Callable, analytical: Callable, *, seed: int | None = 0) -> None:
    """analytical_jacobian must equal backward's Jacobian; mini_gradcheck must agree with
    torch.autograd.gradcheck and, on a mismatch, raise an exception naming the entry."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    cases = _mini_gradcheck_cases(generator)
    for device in devices.available():
        for case in (c.on(device) for c in cases):
            label = f"analytical_jacobian(f, inputs) for f = {case.name}"
            actual = _call(label, analytical, case.f, case.inputs)
            _compare_jacobians(label, actual, analytical_jacobian(case.f, case.inputs), case,
                               _analytical_mistakes(case), rtol=_ANALYTICAL_RTOL, atol=_ANALYTICAL_ATOL)
    meta = _analytical_on_meta(analytical, cases[1])
    passed(f"analytical_jacobian agrees with backward on {len(cases)} functions (float64, "
           f"{', '.join(devices.available())}).")
    note(meta)
    for device in devices.available():  # after the line above, which a wrong verdict must not claim
        for case in (c.on(device) for c in cases):
            _check_verdict(mini_gradcheck, case)
        _check_refuses_float32(mini_gradcheck, cases[0])
    passed(
        f"mini_gradcheck agrees with torch.autograd.gradcheck on {len(cases)} functions, names the "
        "offending entry, and refuses float32 inputs."
    )
    note("(checked with the reference numerical_jacobian, so this exercise is graded on its own)")
    _devices_note()


def _analytical_on_meta(analytical: Callable, case: Case) -> str:
    """analytical_jacobian on `meta` inputs, standing in for a GPU: a tensor it creates
    on the CPU (a one-hot grad_output without `device=`) meets the meta outputs in
    backward. Tensors copied into a CPU Jacobian are not a mistake (on a GPU they copy)."""
    __tracebackhide__ = True
    leaves = tuple(torch.empty(x.shape, dtype=x.dtype, device="meta").requires_grad_() for x in case.inputs)
    outcome = _attempt(analytical, case.f, leaves)
    raised = outcome.raised
    if raised is None:
        return "meta device: analytical_jacobian creates no tensor tied to the CPU."
    if "expected device" in raised.message or "is not on the expected device" in raised.message:
        fail(
            f"analytical_jacobian(f, inputs) for f = {case.name}, with inputs on another device (meta, which "
            f"stands in for a GPU), raised {raised.type}: {raised.message.strip().splitlines()[0]}",
            cause="a tensor you create without `device=` lives on the CPU, and backward refuses a grad_output "
            "on another device than its output: on a GPU this function would fail. Create the one-hot on the "
            "output's device: `torch.zeros(out.numel(), dtype=out.dtype, device=out.device)`, or "
            "`torch.zeros_like(out)`.",
        )
    return f"meta device: not checked ({raised.type} from an operation meta tensors do not support)."


def _options_text(options: dict) -> str:
    return "".join(f", {k}={v:g}" for k, v in options.items())


def _check_verdict(mini_gradcheck: Callable, case: Case) -> None:
    __tracebackhide__ = True
    label = f"mini_gradcheck(f, inputs{_options_text(case.options)}) for f = {case.name}"
    expected = _torch_verdict(case)
    outcome = _attempt(mini_gradcheck, case.f, case.inputs, options=case.options, torch_numerical_jacobian=True)
    result, raised = outcome.value, outcome.raised
    if raised is not None:
        if raised.report is None:
            if raised.not_implemented:
                fail(f"{label}: {explain.NOT_IMPLEMENTED}.")
            fail(
                f"{label} raised {raised.type}: {raised.message.strip()[:300]}", *case.describe(),
                f"torch's gradcheck: {expected or 'passes'}",
                cause="on a mismatch, raise JacobianMismatch(output, input, row, col, numerical, analytical) "
                "so that the message names the entry; otherwise return True.",
            )
        if expected is None:
            _fail_false_alarm(label, case, raised)
        _check_report(label, case, raised, expected)
        return
    if expected is not None:
        fail(f"{label} returned {result!r}, but torch's gradcheck fails:", expected, *case.describe(),
             cause=f"{case.cause or ''} On a mismatch, raise JacobianMismatch naming the entry.".strip())
    if result is not True:
        fail(f"{label} returned {result!r}; it must return True when every entry agrees (as gradcheck does).",
             *case.describe())


def _reference_jacobians(case: Case) -> tuple[Jacobians, Jacobians]:
    return (numerical_jacobian(case.f, case.inputs, case.options.get("eps", 1e-6)),
            analytical_jacobian(case.f, case.inputs))


def _offending(case: Case, n: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Mask of entries outside torch's tolerance: |a - n| > atol + rtol * |n|."""
    atol, rtol = case.options.get("atol", 1e-5), case.options.get("rtol", 1e-3)
    return (a - n).abs() > atol + rtol * n.abs()


def _fail_false_alarm(label: str, case: Case, raised: Raised) -> None:
    __tracebackhide__ = True
    details, cause, report = [raised.message.strip(), *case.describe()], case.cause, raised.report
    if report is not None:
        with contextlib.suppress(Exception):  # the report may name an entry that does not exist
            numerical, analytical = _reference_jacobians(case)
            i, j, row, col = (report[name] for name in gradcheck.REPORT_FIELDS[:4])
            n = numerical[i][j][row, col].item()
            a = analytical[i][j][row, col].item()
            allowed = case.options.get("atol", 1e-5) + case.options.get("rtol", 1e-3) * abs(n)
            details.append(f"torch's values there: numerical {n:.6g}, analytical {a:.6g}; "
                           f"|analytical - numerical| = {abs(a - n):.2g} <= atol + rtol * |numerical| = {allowed:.2g}")
            if abs(float(report["numerical"]) - n) > 1e-6 * (1 + abs(n)):
                cause = ("your numerical value differs from torch's central difference: compute it in float64, "
                         "with the eps you are given.")
    fail(f"{label} reports a mismatch, but torch's gradcheck passes:", *details,
         cause=cause or "an entry passes when |analytical - numerical| <= atol + rtol * |numerical|.")


def _check_report(label: str, case: Case, raised: Raised, expected: str) -> None:
    """The reported entry must exist, be outside the tolerance, and carry the right values."""
    __tracebackhide__ = True
    numerical, analytical = _reference_jacobians(case)
    report = raised.report
    i, j, row, col = (report[name] for name in gradcheck.REPORT_FIELDS[:4])
    context = [f"your report: {raised.message.strip()}", f"torch's gradcheck: {expected}", *case.describe()]
    valid = (isinstance(i, int) and isinstance(j, int) and 0 <= i < len(numerical) and 0 <= j < len(numerical[0]))
    if not valid:
        fail(f"{label}: the report names output {i!r} and input {j!r}, which do not exist.", *context,
             cause=f"output is the index of the output (0 to {len(numerical) - 1}), input the index "
             f"of the input (0 to {len(numerical[0]) - 1}).")
    n, a = numerical[i][j].cpu(), analytical[i][j].cpu()
    bad = _offending(case, n, a)
    rows, cols = bad.shape
    if not (isinstance(row, int) and isinstance(col, int) and 0 <= row < rows and 0 <= col < cols and bad[row, col]):
        fail(f"{label}: entry ({row}, {col}) of output {i} with respect to input {j} is not an offending entry.",
             *context, cause=_wrong_entry_cause(case, i, j, row, col, numerical, analytical))
    for name, reference in (("numerical", n), ("analytical", a)):
        value = report[name]
        want = reference[row, col].item()
        if not (isinstance(value, (int, float, torch.Tensor)) and abs(float(value) - want) <= 1e-6 * (1 + abs(want))):
            fail(f"{label}: the report gives {name} = {value!r} at entry ({row}, {col}); it is {want:.6g}.",
                 *context, cause=f"report the {name} Jacobian's value at that entry.")


def _wrong_entry_cause(case: Case, i: Any, j: Any, row: Any, col: Any, numerical: Jacobians,
                       analytical: Jacobians) -> str:
    def offending(ii: Any, jj: Any, r: Any, c: Any) -> bool:
        if not all(isinstance(k, int) for k in (ii, jj, r, c)):
            return False
        if not (0 <= ii < len(numerical) and 0 <= jj < len(numerical[0])):
            return False
        bad = _offending(case, numerical[ii][jj].cpu(), analytical[ii][jj].cpu())
        return 0 <= r < bad.shape[0] and 0 <= c < bad.shape[1] and bool(bad[r, c])

    if offending(i, j, col, row):
        return "row and column are swapped: rows index the input's entries, columns the output's."
    if offending(j, i, row, col):
        return "output and input are swapped: J[i][j] is output i with respect to input j."
    return ("name an entry where |analytical - numerical| > atol + rtol * |numerical|, "
            "by its row (flat index into the input) and column (flat index into the output).")


def _check_refuses_float32(mini_gradcheck: Callable, case: Case) -> None:
    __tracebackhide__ = True
    inputs32 = tuple(x.detach().float().requires_grad_() for x in case.inputs)
    label = f"mini_gradcheck(f, inputs) with float32 inputs, f = {case.name}"
    outcome = _attempt(mini_gradcheck, case.f, inputs32, torch_numerical_jacobian=True)
    raised = outcome.raised
    if raised is not None and raised.type_error:
        return
    if raised is not None:
        fail(f"{label} raised {raised.type}, expected TypeError.",
             cause="tanh is correct: in float32 the finite differences themselves are wrong. Check the dtype "
             "of every input first, and `raise TypeError(...)` unless it is torch.float64."
             if raised.report is not None else
             "check the dtype of every input first: `raise TypeError(...)` unless it is torch.float64.")
    fail(f"{label} returned {outcome.value!r}; it must raise TypeError.",
         cause="a float32 check fails correct code (rounding error ~1e-7 / eps) or passes only with "
         "tolerances loose enough to hide bugs: refuse anything but float64.")


# --- Exercise 5.3: reading gradcheck failures ---------------------------------------------

DIAGNOSIS_CHOICES = (
    "float32", "eps too small", "non-differentiable input", "ignores grad_output", "transposed", "missing term",
)


# --- Exercise 5.4: fixing Functions from their gradcheck messages ------------------------

def _normal_cases(shapes: Sequence[Sequence[int]], count: int) -> Callable[[torch.Generator], list[tuple]]:
    """One case per shape: `count` standard-normal float64 tensors of that shape."""

    def cases(generator: torch.Generator) -> list[tuple]:
        return [tuple(torch.randn(tuple(s), generator=generator, dtype=torch.float64) for _ in range(count))
                for s in shapes]

    return cases


def _softmax_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    return ("every output of a row depends on every input of that row, through the normalising sum: "
            "the gradient needs a term summed over the row (the last dimension), not only grad_output * y.")


def _sincos_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    return ("x feeds both outputs, so its gradient adds both paths: grad_sin * d sin(x)/dx + "
            "grad_cos * d cos(x)/dx, where d cos(x)/dx = -sin(x).")


def _lerp_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    formulas = ("1 - weight", "weight", "end - start")
    names = ("start", "end", "weight")
    return (f"lerp = start + weight * (end - start), so d lerp / d {names[i]} = {formulas[i]}; "
            "each gradient is grad_output times its own derivative, returned in the order of forward's inputs.")


def _fixed_checker(spec: FunctionSpec, count: int, shapes: Sequence[Sequence[int]] = ((5,), (3, 4))) -> Callable:
    default = shapes

    def check(student: Any, *, shapes: Sequence[Sequence[int]] = default, seed: int | None = 0) -> None:
        __tracebackhide__ = True
        check_function(student, replace(spec, cases=_normal_cases(shapes, count)), seed=seed)

    check.__name__ = f"check_{spec.name.lower()}"
    check.__doc__ = f"The fixed {spec.name} must match {spec.name}'s reference, gradcheck included."
    return check


check_softmax = _fixed_checker(
    FunctionSpec("Softmax", lambda x: torch.softmax(x, -1), _normal_cases([(5,)], 1), hint=_softmax_hint), 1,
    shapes=((5,), (3, 4), (1, 5)))
check_sincos = _fixed_checker(
    FunctionSpec("SinCos", lambda x: (x.sin(), x.cos()), _normal_cases([(5,)], 1), hint=_sincos_hint), 1)
check_lerp = _fixed_checker(FunctionSpec("Lerp", torch.lerp, _normal_cases([(5,)], 3), hint=_lerp_hint), 3)


# --- Exercise 5.5: the error of an approximate gradient ------------------------------------

def _errors(f: Callable, x: torch.Tensor, eps: float) -> torch.Tensor:
    """|backward - central difference| at each entry of x (flattened), f elementwise."""
    return (_grads(f, x)[0].reshape(-1) - _central(f, x, eps)).abs()


def _central(f: Callable, x: torch.Tensor, eps: float) -> torch.Tensor:
    """The central differences of an elementwise f, flattened: the diagonal of torch's numerical
    Jacobian, entry for entry (each output sees only its own input moved), in two calls of f
    instead of two per entry."""
    x = x.detach()
    with torch.no_grad():
        return ((f(x + eps) - f(x - eps)) / (2 * eps)).reshape(-1)


def _grads(f: Callable, x: torch.Tensor) -> tuple[torch.Tensor]:
    x = x.detach().requires_grad_()
    out = f(x)
    return torch.autograd.grad(out, x, torch.ones_like(out))


@dataclass(frozen=True)
class Approximation:
    name: str
    f: Callable  # an elementwise Function's apply (registered: handed to student code)
    x: torch.Tensor
    eps: float


def _approximations(generator: torch.Generator) -> list[Approximation]:
    g = generator
    return [
        Approximation("exp(x), backward off by -1e-4 / (1 + x^2)", gradcheck.APPROX_EXP,
                      _uniform(g, 400, low=-3.0, high=2.0), 1e-6),
        Approximation("sin(2x), backward off by 3e-4 * x * sin(5x), x of shape (20, 25)", gradcheck.APPROX_SIN2,
                      _uniform(g, 20, 25, low=-2.0, high=2.0), 1e-6),
        Approximation("softplus(x), backward off by 2e-5 * x^2, at eps=1e-4", gradcheck.APPROX_SOFTPLUS,
                      _uniform(g, 300, low=-4.0, high=4.0), 1e-4),
    ]


def _error_mistakes(case: Approximation) -> dict[str, Callable[[], float]]:
    f, x, eps = case.f, case.x.detach(), case.eps
    (analytical,) = _grads(f, x)

    def worst(numerical: torch.Tensor, combine: Callable = lambda a, n: (a - n).abs()) -> float:
        return combine(analytical, numerical).max().item()

    central = _central(f, x, eps).view_as(x)
    return {
        "this is the error against the forward difference (f(x + eps) - f(x)) / eps, which is itself off "
        "by about eps * |f''| / 2: use the central difference.": lambda: worst((f(x + eps) - f(x)) / eps),
        "the central difference divides by 2 * eps: the two points are 2 * eps apart.":
            lambda: worst((f(x + eps) - f(x - eps)) / eps),
        "this is the mean error; state the largest one (a bound).":
            lambda: (analytical - central).abs().mean().item(),
        "this is the largest signed difference: take the absolute value first (the error may be negative).":
            lambda: worst(central, lambda a, n: a - n),
        "this is the relative error; the question asks for the absolute one, |backward - numerical|.":
            lambda: worst(central, lambda a, n: (a - n).abs() / n.abs()),
        "f was evaluated in float32: its rounding error, divided by eps, swamps the approximation error.":
            lambda: worst(((f(x.float() + eps) - f(x.float() - eps)) / (2 * eps)).double()),
    }


def check_max_gradient_error(student: Callable, *, seed: int | None = 0) -> None:
    """max_gradient_error(f, x, eps) must return (largest |backward - central difference|, x there)."""
    __tracebackhide__ = True
    cases = _approximations(inputs.generator(seed))
    for device in devices.available():
        for case in cases:
            x = case.x.to(device)
            label = f"max_gradient_error(f, x, eps={case.eps:g}) for f = {case.name}"
            result = _call(label, student, case.f, x, case.eps)
            if not (isinstance(result, tuple) and len(result) == 2):
                fail(f"{label} must return a tuple (error, where), got {show(result)}.")
            error, where = (float(v) for v in result)
            errors = _errors(case.f, x, case.eps)
            want = errors.max().item()
            if abs(error - want) > 1e-8 + 1e-6 * want:
                fail(f"{label}: the error is {error:.6g}, expected {want:.6g}.",
                     cause=_known_mistake(error, _error_mistakes(case), rtol=1e-6, atol=1e-8))
            _check_where(label, case, where, errors.cpu())
    passed(f"max_gradient_error finds the largest gradient error, and where it is, for {len(cases)} "
           f"approximate Functions (float64, {', '.join(devices.available())}).")
    _devices_note()


def _check_where(label: str, case: Approximation, where: float, error: torch.Tensor) -> None:
    """`where` must be a value of x at which `error` (per entry, flattened) is largest."""
    __tracebackhide__ = True
    x, worst = case.x.detach().cpu(), error.max().item()
    at = x.reshape(-1) == where
    if not bool(at.any()):
        index_like = float(where).is_integer() and 0 <= where < x.numel()
        fail(f"{label}: where = {where!r} is not a value of x.",
             cause="return the value of x at the worst entry (x.flatten()[k].item()), not its index k."
             if index_like else "return the value of x at the worst entry.")
    if error[at].max().item() < worst - 1e-8:
        fail(f"{label}: at x = {where:.6g} the error is {error[at].max().item():.6g}, "
             f"but the largest is {worst:.6g}.", cause="return the x of the entry with the largest error.")
