"""Checks for notebook 08 (08_memory, then 08_memory_checkpointing): Functions graded on the
bytes they save for backward (a budget per exercise, measured with saved-tensor hooks) as
well as on their values and gradients; checkpoints written by hand, with a Function and with
saved-tensor hooks; saved-tensor hooks that compress to bfloat16."""
from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from ..checks import explain, inputs
from ..checks.functions import FunctionSpec, check_function
from ..checks.saved import KEPT, STASHED, check_backward_left_alone, check_nothing_kept, observe
from ..checks.shared_state import process_wide
from ..student import devices, introspect, memory, probe
from ..student.report import fail, folded, note, passed, quiet, show, value
from ..student.saved import Names, Recording, Saved, describe

Needs = tuple[bool, ...]  # per argument of the call: a tensor that requires grad


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _prepare(args: Sequence[Any], device: str, needs: Sequence[bool]) -> tuple:
    """Fresh copies of the arguments on `device`; a floating-point tensor requires grad
    where `needs` says so."""
    out = []
    for a, need in zip(args, needs):
        if isinstance(a, torch.Tensor):
            a = a.detach().to(device).clone()
            a.requires_grad_(bool(need) and a.is_floating_point())
        out.append(a)
    return tuple(out)


# --- Bytes saved for backward, against a budget --------------------------------------------

@dataclass(frozen=True)
class Budget:
    """What a Function may keep for backward.

    `needed(recording, needs)` says in words what backward needs, `limit(recording, needs)`
    how many bytes that is, and `unneeded(saved, recording, needs)` why a saved tensor is
    not needed (None when it is). `on_ctx(saved)` allows a tensor as an attribute of ctx
    (a random generator's state is not part of the graph)."""

    name: str
    needed: Callable[[Recording, Needs], str]
    limit: Callable[[Recording, Needs], int]
    unneeded: Callable[[Saved, Recording, Needs], "str | None"]
    names: Names = Names()
    on_ctx: Callable[[Saved], bool] = lambda s: False
    backward_cause: Callable[[probe.ProbeError], "str | None"] = lambda error: None  # for an error in backward
    kept_cause: str = KEPT  # why memory alive after forward, outside the graph, is wrong


ON_CTX = " Stashing saves no memory: ctx keeps the tensor alive just the same, only hidden."


def _requires(names: Sequence[str], args: tuple) -> str:
    shown = [f"{n} requires grad: {a.requires_grad}" for n, a in zip(names, args) if isinstance(a, torch.Tensor)]
    return ", ".join(shown)


def _what(s: Saved, recording: Recording, names: Names) -> str:
    return f"{names.of(s, recording)}, {_dtype(s.tensor)} of shape {s.shape}, {s.nbytes} bytes"


def judge_budget(student: Any, budget: Budget, args: tuple, *, strided: bool = False) -> Recording:
    """Call the student's Function once on `args` (their requires_grad as given; in memory
    that is not contiguous with `strided`) and run backward; fail if it stashed a tensor on
    ctx, kept memory alive anywhere else, saved a tensor backward does not need, saved more
    bytes than the budget, or changed a saved tensor or grad_output."""
    __tracebackhide__ = True
    names = budget.names if budget.names.args else replace(budget.names, args=probe.argument_names(student))
    needs = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    shapes = ", ".join(f"{n} of shape {tuple(a.shape)}" for n, a in zip(names.args, args)
                       if isinstance(a, torch.Tensor))
    context = [f"inputs: {shapes}{' (not contiguous in memory)' if strided else ''}; {_requires(names.args, args)}"]
    with quiet():
        try:
            recording, backward = observe(student, args, strided=strided)
        except probe.StudentError as exc:
            what, cause = explain.error("forward", exc.type, exc.message, list(names.args))
            fail(f"{budget.name}: {what}.", *context, cause=_layout_cause(exc.message, strided) or cause)
    listing = "saved for backward: " + (", ".join(describe(s, recording, names) for s in recording.saved) or "nothing")
    for path, s in recording.stashed.items():
        if not budget.on_ctx(s):
            fail(
                f"{budget.name}: tensor `ctx.{path}` ({describe(s, recording, names)}) is stashed on ctx.", *context,
                cause=STASHED.format(cycle="") + ON_CTX,
            )
    check_nothing_kept(budget.name, recording, names, cause=budget.kept_cause)
    needed = budget.needed(recording, needs)
    for s in recording.saved:
        reason = budget.unneeded(s, recording, needs)
        if reason:
            fail(f"{budget.name} saved {_what(s, recording, names)}; {needed} is all backward needs.",
                 *context, listing, cause=reason)
    limit = budget.limit(recording, needs)
    if recording.nbytes > limit:
        fail(f"{budget.name} saves {recording.nbytes} bytes, more than its budget of {limit}; "
             f"{needed} is all backward needs.", *context, listing,
             cause="each tensor backward reads once, and nothing else: no copies, no second mask.")
    if backward.error is not None and (budget.backward_cause(backward.error)
                                       or _layout_cause(backward.error.message, strided)):
        what, _ = explain.error("backward", backward.error.type, backward.error.message, list(names.args))
        fail(f"{budget.name}: {what}.", *context,
             cause=budget.backward_cause(backward.error) or _layout_cause(backward.error.message, strided))
    check_backward_left_alone(budget.name, recording, backward, names)
    return recording


def _layout_cause(message: str, strided: bool) -> str | None:
    if strided and "view size is not compatible" in message:
        return ("`.view` needs memory laid out to match, and a tensor's memory need not be contiguous (a transpose, "
                "a slice, a batch taken with a step): use `.reshape`, or work on the tensor's own shape.")
    return None


def _check_at_special_points(student: Any, name: str, reference: Callable[..., torch.Tensor], args: tuple,
                             arg_names: Sequence[str], special: str, *, gradient: bool) -> None:
    """Forward (and with `gradient`, the gradient of the sum where the reference's has a value:
    not at a kink) at special points the random inputs never hit: exact zeros, kinks, large
    magnitudes. Forward only where a kink is in every entry's way (a matmul mixes them)."""
    __tracebackhide__ = True
    call = tuple(a.detach().clone().requires_grad_(gradient and a.is_floating_point())
                 if isinstance(a, torch.Tensor) else a for a in args)
    want_out = reference(*call)
    want = torch.autograd.grad(want_out.sum(), call[0])[0] if gradient else None
    with quiet():
        if gradient:
            found = probe.run(student, call, [[torch.ones_like(want_out)]])
            error, outputs = found.error, found.outputs
        else:
            result = probe.forward_many(student, [call])[0]
            error, outputs = (result, []) if isinstance(result, probe.ProbeError) else (None, result)
    shown = [f"{n} = {show(a)}" for n, a in zip(arg_names, args)] + [special]
    if error is not None:
        what, cause = explain.error(error.stage, error.type, error.message, list(arg_names))
        fail(f"{name}: {what}.", *shown, cause=cause)
    got = outputs[0] if outputs else None
    if got is None or got.shape != want_out.shape or not torch.allclose(got.cpu(), want_out.detach(), rtol=1e-6,
                                                                        atol=1e-9):
        fail(f"{name}: wrong output at the special points.", *shown,
             *(explain.differ(want_out.detach(), got.cpu(), rtol=1e-6, atol=1e-9) if got is not None and
               got.shape == want_out.shape else [f"expected {show(want_out)}", f"actual   {show(got)}"]),
             cause="the formula must hold exactly at 0 and for any magnitude: pick between the two linear pieces "
             "(torch.where, a mask), rather than blend them with a function that rounds, overflows or flips sign.")
    if gradient:
        x = call[0].detach()
        grad = found.grads[0][0] if found.grads and found.grads[0] else None
        defined = x != 0  # at the kink itself the derivative has no value to compare
        if grad is None or grad.shape != want.shape or not torch.allclose(grad.cpu()[defined], want[defined],
                                                                           rtol=1e-6, atol=1e-9):
            fail(f"{name}: wrong gradient at the special points (x = 0 excepted, a kink).", *shown,
                 *(explain.differ(want.where(defined, 0), grad.cpu().where(defined, 0), rtol=1e-6, atol=1e-9)
                   if grad is not None and grad.shape == want.shape else
                   [f"expected {show(want)}", f"actual   {show(grad)}"]),
                 cause="the derivative is 1 where x > 0 and negative_slope where x < 0, whatever |x|.")
    passed(f"{name}: {special}: {'output and gradient' if gradient else 'output'} as expected.")


def _one_byte(s: Saved) -> bool:
    return s.tensor.element_size() == 1 and not s.tensor.is_floating_point()


# --- Exercise: a leaky ReLU saving a bool mask -------------------------------------------

def _leaky_unneeded(s: Saved, recording: Recording, needs: Needs) -> str | None:
    x = recording.args[0]
    if s.kind == "input":
        return (
            f"the derivative is 1 where x > 0 and negative_slope elsewhere, so backward needs to know where "
            f"x > 0, not the values of x ({x.element_size()} bytes each; F.leaky_relu saves them, which is what "
            "this exercise improves on). A torch.bool mask takes 1 byte per element."
        )
    if s.kind == "output":
        return (
            "the output is positive exactly where x is: a torch.bool mask says the same in 1 byte per element "
            f"instead of {x.element_size()}. (Saving the output costs nothing only while something else keeps "
            "it alive anyway, and here nothing does.)"
        )
    if not _one_byte(s):
        return (
            f"a mask stored as {_dtype(s.tensor)} takes {s.tensor.element_size()} bytes per element: keep it "
            "as the torch.bool tensor x > 0 (1 byte per element), and keep the slope, a number, on ctx."
        )
    return None


LEAKY_BUDGET = Budget(
    name="LeakyReLU",
    needed=lambda r, needs: f"a bool mask of x > 0 ({r.args[0].numel()} bytes)",
    limit=lambda r, needs: r.args[0].numel(),
    unneeded=_leaky_unneeded,
    names=Names(known={
        "(x > 0) as a float": lambda x, s: (x > 0).to(x.dtype),
        "the derivative (1 or negative_slope)": lambda x, s: torch.where(x > 0, 1.0, s).to(x.dtype),
        "leaky_relu(x) (a copy, not the tensor forward returns)": F.leaky_relu,
        "x.clone()": lambda x, s: x,
    }),
)


def _leaky_cases(shapes: Sequence[Sequence[int]], slopes: Sequence[float]) -> Callable[[torch.Generator], list[tuple]]:
    return lambda generator: [(inputs.uniform(shape, generator, kinks=(0.0,)), float(slope))
                              for shape, slope in zip(shapes, slopes)]


LEAKY_RELU = FunctionSpec(name="LeakyReLU", reference=F.leaky_relu, cases=_leaky_cases([(2, 3), (5,)], [0.1, 0.2]))
LEAKY_SPECIAL = (0.0, -0.0, 1e-8, -1e-8, 1e300, -1e300)  # the kink exactly, beside it, and far from it


def check_leaky_relu(student: Any, *, shapes: Sequence[Sequence[int]] = ((2, 3), (5,)),
                     slopes: Sequence[float] = (0.1, 0.2), seed: int | None = 0) -> None:
    """LeakyReLU(x, negative_slope), saving at most one byte per element of x: a bool mask."""
    __tracebackhide__ = True
    cases = _leaky_cases(shapes, slopes)
    generator = inputs.generator(seed)
    for device in devices.available():
        for i, args in enumerate(cases(generator)):
            recording = judge_budget(student, LEAKY_BUDGET, _prepare(args, device, [True, False]), strided=i == 0)
    x = recording.args[0]
    passed(f"LeakyReLU saves {recording.nbytes} bytes for x of shape {tuple(x.shape)} ({_dtype(x)}: "
           f"{memory.nbytes(x)} bytes), within its budget of one byte per element; nothing on ctx nor anywhere else "
           f"after forward or backward (also for an x that is not contiguous in memory).")
    special = inputs.including(inputs.uniform((2, 4), generator), LEAKY_SPECIAL, generator)
    _check_at_special_points(student, "LeakyReLU", F.leaky_relu, (special, float(slopes[0])), ("x", "negative_slope"),
                             "x holds 0 and -0 exactly, ±1e-8 and ±1e300", gradient=True)
    check_function(student, replace(LEAKY_RELU, cases=cases), seed=seed)


# --- Exercise: a fused Linear + ReLU -------------------------------------------------------

LINEAR_NAMES = ("x", "weight", "bias")


def _linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ weight.T + bias)


def _linear_relu_cases(shapes: Sequence[Sequence[int]]) -> Callable[[torch.Generator], list[tuple]]:
    """(x, weight, bias) for each (batch, in, out), drawn again until no pre-activation is
    within 0.01 of ReLU's kink (finite differences there would fail a right backward)."""

    def cases(generator: torch.Generator) -> list[tuple]:
        found = []
        for batch, n_in, n_out in shapes:
            for _ in range(1000):
                args = (inputs.normal((batch, n_in), generator), inputs.normal((n_out, n_in), generator),
                        inputs.normal((n_out,), generator))
                if bool(((args[0] @ args[1].T + args[2]).abs() > 0.01).all()):
                    break
            found.append(args)
        return found

    return cases


def _mask_bytes(r: Recording) -> int:
    x, weight = r.args[0], r.args[1]
    return x.shape[0] * weight.shape[0]


def _linear_parts(r: Recording, needs: Needs) -> list[tuple[str, int]]:
    x, weight = r.args[0], r.args[1]
    parts = []
    if needs[1]:
        parts.append(("x (for grad_weight)", memory.nbytes(x)))
    if needs[0]:
        parts.append(("weight (for grad_x)", memory.nbytes(weight)))
    parts.append((f"a bool mask of z > 0 ({_mask_bytes(r)} bytes)", _mask_bytes(r)))
    return parts


def _linear_needed(r: Recording, needs: Needs) -> str:
    parts = [p for p, _ in _linear_parts(r, needs)]
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"{text}, {sum(n for _, n in _linear_parts(r, needs))} bytes in all" if len(parts) > 1 else text


def _linear_unneeded(s: Saved, recording: Recording, needs: Needs) -> str | None:
    element = recording.args[0].element_size()
    if s.kind == "input" and s.index == 0 and not needs[1]:
        return (
            "only grad_weight = (grad_output * mask)ᵀ @ x reads x, and weight needs no gradient in this call "
            "(ctx.needs_input_grad[1] is False, as for a frozen layer): save x only when weight needs a gradient. "
            "PyTorch's own matmul does the same."
        )
    if s.kind == "input" and s.index == 1 and not needs[0]:
        return (
            "only grad_x = (grad_output * mask) @ weight reads weight, and x needs no gradient in this call "
            "(ctx.needs_input_grad[0] is False, as for a network's input): save weight only when x needs a gradient."
        )
    if s.kind == "input" and s.index == 2:
        return "backward never reads the bias: grad_bias is (grad_output * mask) summed over the batch."
    if s.kind == "output":
        return (
            f"relu(z) is positive exactly where z is: a torch.bool mask says the same in 1 byte per element "
            f"instead of {element}. (Saving the output costs nothing only while something else keeps it alive; "
            "here the output goes to a residual sum, which saves nothing.)"
        )
    if s.kind == "intermediate" and not _one_byte(s):
        return (
            f"backward needs only where z = x @ weight.T + bias is positive: keep that as the torch.bool mask "
            f"z > 0, 1 byte per element, not {s.tensor.element_size()}-byte {_dtype(s.tensor)} values."
        )
    return None


LINEAR_RELU_BUDGET = Budget(
    name="LinearReLU",
    needed=_linear_needed,
    limit=lambda r, needs: sum(n for _, n in _linear_parts(r, needs)),
    unneeded=_linear_unneeded,
    names=Names(args=LINEAR_NAMES, known={
        "z = x @ weight.T + bias": lambda x, w, b: x @ w.T + b,
        "(z > 0) as a float": lambda x, w, b: (x @ w.T + b > 0).to(x.dtype),
        "relu(z) (a copy, not the tensor forward returns)": _linear_relu,
        "x @ weight.T": lambda x, w, b: x @ w.T,
    }),
)

# (x, weight, bias) requires grad: a hidden layer, a network's first layer, a frozen layer.
LINEAR_NEEDS = ((True, True, True), (False, True, True), (True, False, False))

LINEAR_RELU = FunctionSpec(
    name="LinearReLU", reference=_linear_relu, cases=_linear_relu_cases([(4, 3, 5), (1, 2, 3)])
)


def check_linear_relu(student: Any, *, shapes: Sequence[Sequence[int]] = ((4, 3, 5), (1, 2, 3)),
                      seed: int | None = 0) -> None:
    """LinearReLU(x, weight, bias) = relu(x @ weight.T + bias), saving only what the
    gradients that are needed read, and a bool mask; no matmul recomputed in backward."""
    __tracebackhide__ = True
    cases = _linear_relu_cases(shapes)
    generator = inputs.generator(seed)
    for device in devices.available():
        for i, args in enumerate(cases(generator)):
            for needs in LINEAR_NEEDS:
                call = _prepare(args, device, needs)
                recording = judge_budget(student, LINEAR_RELU_BUDGET, call, strided=i == 0 and all(needs))
                _check_linear_grads(student, call, needs)
                _check_no_recompute(student, call, needs)
    x, weight = recording.args[0], recording.args[1]
    passed(
        f"LinearReLU saves only what each needed gradient reads, plus a 1-byte mask, for a hidden layer, a "
        f"first layer and a frozen layer (x {tuple(x.shape)}, weight {tuple(weight.shape)}: {recording.nbytes} "
        "bytes when only x needs a gradient); nothing on ctx nor anywhere else after forward or backward (also "
        "for inputs that are not contiguous in memory); no matmul recomputed in backward."
    )
    _check_at_special_points(student, "LinearReLU", _linear_relu, _linear_special(generator), LINEAR_NAMES,
                             "z = x @ weight.T + bias is exactly 0 in one entry, and about ±1e150 in one row",
                             gradient=False)
    check_function(student, replace(LINEAR_RELU, cases=cases), seed=seed)


def _linear_special(generator: torch.Generator) -> tuple:
    """(x, weight, bias) where z is exactly 0 in one entry (a row of x and an entry of bias are 0:
    ReLU's kink) and huge in another row (rows drawn at random)."""
    x, weight, bias = inputs.normal((3, 4), generator), inputs.normal((2, 4), generator), inputs.normal((2,), generator)
    zero, huge = torch.randperm(3, generator=generator)[:2].tolist()
    x[zero] = 0.0
    x[huge] *= 1e150
    return x, weight, inputs.including(bias, [0.0], generator)


def _check_linear_grads(student: Any, call: tuple, needs: Needs) -> None:
    """The gradients of the inputs that require grad, in this combination."""
    __tracebackhide__ = True
    ref_args = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in call)
    g = torch.randn(call[0].shape[0], call[1].shape[0], dtype=call[0].dtype).to(call[0].device)
    expected = probe.run(_linear_relu, ref_args, [[g]])
    with quiet():
        actual = probe.run(student, call, [[g]])
    shown = [f"{n} = {show(a)}" for n, a in zip(LINEAR_NAMES, call)] + [_requires(LINEAR_NAMES, call)]
    if actual.error is not None:
        what, cause = explain.error(actual.error.stage, actual.error.type, actual.error.message, list(LINEAR_NAMES))
        if actual.error.stage == "backward" and "NoneType" in actual.error.message:
            cause = ("backward reads a tensor it did not save in this call: compute only the gradients "
                     "ctx.needs_input_grad asks for, from the tensors you saved for them.")
        fail(f"LinearReLU: {what}.", *shown, cause=cause)
    wanted = [n for n, need in zip(LINEAR_NAMES, needs) if need]
    for name, want, got in zip(wanted, expected.grads[0], actual.grads[0]):
        if got is None or got.shape != want.shape or not torch.allclose(got.cpu(), want.cpu(), rtol=1e-6, atol=1e-9):
            fail(
                f"LinearReLU: wrong gradient for `{name}` when only {', '.join(wanted)} require grad.", *shown,
                *(explain.differ(want.cpu(), got.cpu(), rtol=1e-6, atol=1e-9) if got is not None and
                  got.shape == want.shape else [f"expected {show(want)}", f"actual   {show(got)}"]),
                cause="with fewer tensors saved, each gradient must still come from the right ones: "
                "grad_x = gm @ weight, grad_weight = gmᵀ @ x, grad_bias = gm.sum(0), where gm = grad_output * mask.",
            )


def _check_no_recompute(student: Any, call: tuple, needs: Needs) -> None:
    """At most one matrix product per needed gradient of x or weight (best effort)."""
    __tracebackhide__ = True
    if not (isinstance(student, probe.StudentProxy) or (isinstance(student, type)
                                                         and issubclass(student, torch.autograd.Function))):
        return
    with quiet():
        facts = introspect.record_backward(student, call)
    allowed = int(needs[0]) + int(needs[1])
    if facts.error is None and facts.matmuls > allowed:
        fail(
            f"LinearReLU: backward multiplies matrices {facts.matmuls} times where {allowed} "
            f"product(s) give the needed gradients ({_requires(LINEAR_NAMES, call)}).",
            cause="backward recomputes x @ weight.T (or computes a gradient nobody needs). Keep the bool mask "
            "from forward instead of recomputing z, and skip the gradients ctx.needs_input_grad does not ask for.",
        )


# --- Exercises: checkpoints, by hand and with saved-tensor hooks ---------------------------

def _state_numel() -> set[int]:
    return {torch.get_rng_state().numel(), *(torch.cuda.get_rng_state(d).numel() for d in range(
        torch.cuda.device_count()))}


def _generator_state(s: Saved) -> bool:
    return s.tensor.dtype == torch.uint8 and s.tensor.dim() == 1 and s.tensor.numel() in _state_numel()


def _inputs_bytes(r: Recording) -> int:
    return sum(memory.nbytes(a) for a in r.args if isinstance(a, torch.Tensor))


@dataclass(frozen=True)
class Checkpointing:
    """One of the two checkpoint exercises: what it is called, and the words of its checks."""

    name: str
    needed: str  # what the graph may keep, besides the inputs
    intermediate: str  # why keeping an intermediate of run is wrong here
    kept: str  # why memory alive after forward is wrong here
    missing: str  # why backward found no recomputed tensor (an error in backward)
    recomputes: str  # why run ran more than once in backward
    keeps: str  # what the graph keeps, for the passing message
    # why a recomputed tensor alive after backward's last read of it is wrong; None where nothing is
    # promised about it (8.3's backward is one step, which no other step follows)
    lets_go: str | None = None

    def budget(self, names: Sequence[str]) -> Budget:
        def unneeded(s: Saved, recording: Recording, needs: Needs) -> str | None:
            if s.kind == "input" or _generator_state(s):
                return None
            if s.kind == "output":
                return ("backward recomputes run's output from the inputs: keeping it is keeping what "
                        "checkpointing drops. Keep the tensor inputs only.")
            return self.intermediate

        return Budget(
            name=self.name, needed=lambda r, needs: f"the tensor inputs ({_inputs_bytes(r)} bytes){self.needed}",
            limit=lambda r, needs: _inputs_bytes(r) + sum(s.nbytes for s in r.saved if _generator_state(s)),
            unneeded=unneeded, names=Names(args=tuple(names)), on_ctx=_generator_state,
            backward_cause=self.backward_cause, kept_cause=self.kept,
        )

    def backward_cause(self, error: probe.ProbeError) -> str | None:
        message = error.message
        if "does not require grad and does not have a grad_fn" in message:
            return ("the recomputed output has no graph: recompute inside `with torch.enable_grad():` (backward "
                    "runs with recording off), from detached copies of the inputs that require grad where the "
                    "originals do.")
        if "One of the differentiated Tensors does not require grad" in message or "cannot be empty" in message:
            return ("the recomputed inputs must require grad where the originals do: make them with "
                    "`t.detach().requires_grad_(needed)`, needed = ctx.needs_input_grad for that input, and "
                    "differentiate with respect to those that require grad.")
        if error.type in ("KeyError", "IndexError"):
            return self.missing
        return None


CHECKPOINT = Checkpointing(
    name="Checkpoint",
    needed=", plus the state of the random generator, on ctx or saved,",
    intermediate=(
        "an intermediate of run is what checkpointing recomputes instead of keeping. Forward records nothing by "
        "itself, so run(*inputs) saves nothing unless you turn recording on: run it in forward as it is (no "
        "torch.enable_grad()), keep the inputs, and recompute in backward."
    ),
    kept=KEPT,
    missing="backward looked up something forward did not keep.",
    recomputes="once each is enough.",
    keeps="keeps the tensor inputs of run and a generator state, nothing else on ctx nor anywhere else, and "
          "after backward nothing",
)

HOOKED = Checkpointing(
    name="checkpoint_with_hooks",
    needed=", which the caller holds anyway: no tensor that run saves",
    intermediate=(
        "run saved this tensor past your hooks, so the graph keeps it: run forward inside "
        "`with torch.autograd.graph.saved_tensors_hooks(pack, unpack):`, so that every tensor run saves "
        "goes through pack."
    ),
    kept=(
        "whatever pack returns, the graph keeps until backward unpacks it: that is the memory a checkpoint must "
        "not keep. Return a handle (a number that says which saved tensor it was), never the tensor nor anything "
        "holding it, and let unpack recompute the tensor. A reference kept anywhere else (a global, a dict of "
        "the enclosing function) keeps it alive just the same."
    ),
    missing=(
        "unpack found no recomputed tensor under its handle: the recomputation saved fewer tensors than forward, "
        "or numbered them otherwise. Recompute with recording on (`torch.enable_grad()`: backward runs with it "
        "off), from the same inputs (which require grad as in forward: detached copies that do not, save less), "
        "under hooks whose pack numbers each saved tensor in the order it comes, as forward's pack did."
    ),
    recomputes=(
        "unpack recomputes run each time it is called. Recompute once, at the first unpack of a backward, and "
        "keep everything that recomputation saves for the unpacks that follow."
    ),
    keeps="keeps none of the tensors run saves after forward, only run's inputs (which the caller holds "
          "anyway), and after backward nothing",
    lets_go=(
        "unpack must let go of the recomputed tensor it returns (`recomputed.pop(handle)`): backward reads each "
        "saved tensor once, and a tensor your hooks still hold after that stays alive beside everything backward "
        "computes next, until the block's whole backward is over (torch's checkpoint frees each one as soon as it "
        "is read). Keep each recomputed tensor in one place only, and drop it when you hand it out."
    ),
)

BLOCKS = {
    "residual_tanh": (memory.residual_tanh, "x + tanh(x @ w1) @ w2"),
    "residual_dropout": (memory.residual_dropout, "x + dropout(tanh(x @ w1), p=0.5) @ w2"),
    "scaled_sin": (memory.scaled_sin, "sin(x * s) * s"),
}


class _WithBlock(probe.StudentProxy):
    """The student's checkpoint as a function of the block's tensor inputs: every probe of
    it runs through `memory.with_block`, where the student's code is."""

    def __init__(self, function: Any, block: Callable[..., torch.Tensor]) -> None:
        self.function, self.block = function, block

    def invoke(self, procedure: str, *args: Any) -> Any:
        return probe.invoke(memory.with_block, self.function, self.block, procedure, *args)


def _block_args(block: str, batch: int, width: int, generator: torch.Generator) -> tuple:
    if block == "scaled_sin":
        return (inputs.normal((batch, width), generator), inputs.normal((width,), generator))
    return (inputs.normal((batch, width), generator), inputs.normal((width, 2 * width), generator) / width ** 0.5,
            inputs.normal((2 * width, width), generator) / width ** 0.5)


def _block_names(block: str) -> tuple[str, ...]:
    return tuple(inspect.signature(BLOCKS[block][0]).parameters)


# Which tensor inputs of a residual block require grad: all; a network's input (x does not);
# a frozen block fed by a trainable one (only x does).
CHECKPOINT_NEEDS = ((True, True, True), (False, True, True), (True, False, False))


def check_checkpoint(student: Any, *, shapes: Sequence[Sequence[int]] = ((3, 4),), seed: int | None = 0) -> None:
    """Checkpoint.apply(run, *inputs) = run(*inputs), keeping only the inputs and recomputing
    in backward, with the same random numbers as forward and the caller's generator left alone."""
    __tracebackhide__ = True
    _check_checkpointing(CHECKPOINT, student, shapes, seed)


def check_checkpoint_with_hooks(student: Any, *, shapes: Sequence[Sequence[int]] = ((3, 4),),
                                seed: int | None = 0) -> None:
    """checkpoint_with_hooks(run, *inputs) = run(*inputs), recorded as usual, its saved
    tensors replaced by handles and recomputed at the first unpack of a backward, each let
    go of once backward has read it, with the same random numbers as forward and the
    caller's generator left alone."""
    __tracebackhide__ = True
    _check_checkpointing(HOOKED, student, shapes, seed)


def _check_checkpointing(kind: Checkpointing, student: Any, shapes: Sequence[Sequence[int]], seed: int | None) -> None:
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    for batch, width in shapes:
        for device in devices.available():
            for block in ("residual_tanh", "scaled_sin"):
                args = _block_args(block, batch, width, generator)
                call = _prepare(args, device, [True] * len(args))
                judge_budget(_WithBlock(student, BLOCKS[block][0]), kind.budget(_block_names(block)), call,
                             strided=block == "residual_tanh")
    passed(f"{kind.name} {kind.keeps}: for run = {BLOCKS['residual_tanh'][1]} and run = {BLOCKS['scaled_sin'][1]}.")
    for batch, width in shapes:  # after the line above, which a wrong recomputation must not claim
        for device in devices.available():
            args = _block_args("residual_dropout", batch, width, generator)
            for needs in CHECKPOINT_NEEDS:
                _check_random(kind, student, _prepare(args, device, needs),
                              int(torch.randint(2**31, (1,), generator=generator)))
    passed(f"{kind.name} with dropout inside: the same output and gradients as the block itself, from the same "
           "random numbers, for every combination of inputs that require grad; run recomputed once in backward"
           + ("; each recomputed tensor let go of once backward has read it" if kind.lets_go else "")
           + "; backward leaves the caller's random generator alone.")
    for block in ("residual_tanh", "scaled_sin"):
        fn, formula = BLOCKS[block]
        spec = FunctionSpec(
            name=f"{kind.name} with run = {formula}", reference=fn, autograd_in_backward=True,
            cases=lambda g, block=block: [_block_args(block, b, w, g) for b, w in shapes],
        )
        # A checkpoint's mistakes do not depend on the block it wraps: every known one fails on
        # the first block, so the second's lines are folded into a note.
        with folded(f"run = {formula}") if block != "residual_tanh" else contextlib.nullcontext():
            check_function(_WithBlock(student, fn), spec, seed=seed)


def _check_random(kind: Checkpointing, student: Any, args: tuple, seed: int) -> None:
    """The dropout block through the student's checkpoint against the block itself, from the
    same seed."""
    __tracebackhide__ = True
    block, formula = BLOCKS["residual_dropout"]
    names = _block_names("residual_dropout")
    grad_output = torch.randn(args[0].shape, dtype=args[0].dtype, generator=torch.Generator().manual_seed(seed))
    grad_output = grad_output.to(args[0].device)
    ref_args = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
    devices_ = sorted({a.device.index or 0 for a in args if a.is_cuda})
    with process_wide, torch.random.fork_rng(devices=devices_):
        torch.manual_seed(seed)
        want_out = block(*ref_args)
        wrt = [a for a in ref_args if a.requires_grad]
        want = torch.autograd.grad(want_out, wrt, grad_output)
    with quiet():
        found = probe.invoke(memory.checkpoint_run, student, block, args, grad_output, seed)
    try:
        error = probe.ProbeError.from_data(found["error"])
        output, grads, kept, calls = found["output"], found["grads"], bool(found["generator_kept"]), int(found["calls"])
        held, needed = int(found["held"]), int(found["needed"])
    except (KeyError, TypeError, ValueError) as bad:
        raise probe.Malformed(f"malformed checkpoint report: {bad}") from None
    shapes = ", ".join(f"{n} of shape {tuple(a.shape)}" for n, a in zip(names, args))
    shown = [f"run = {formula}", f"{shapes}; {_requires(names, args)}"]
    name = kind.name
    if error is not None:
        what, cause = explain.error(error.stage, error.type, error.message, ["run", *names])
        fail(f"{name}: {what}.", *shown, cause=kind.backward_cause(error) or cause)
    if not isinstance(output, torch.Tensor) or output.shape != want_out.shape or not torch.allclose(
            output.cpu(), want_out.detach().cpu(), rtol=1e-6, atol=1e-9):
        fail(f"{name}: the output differs from run(*inputs) with the same random numbers.", *shown,
             f"expected {show(want_out)}", f"actual   {show(output)}",
             cause="forward returns run(*inputs), computed once, from the generator as the caller left it.")
    if calls < 2:
        fail(f"{name}: run ran {calls} time(s) for a forward and a backward.", *shown,
             cause="backward must recompute run from the inputs (that is the checkpoint).")
    if calls > 2:
        fail(f"{name}: run ran {calls} times for one forward and one backward.", *shown, cause=kind.recomputes)
    if len(grads) != len(want):
        raise probe.Malformed("malformed checkpoint gradients")
    wanted = [n for n, a in zip(names, args) if a.requires_grad]
    for arg_name, w, g in zip(wanted, want, grads):
        if g is None or g.shape != w.shape or not torch.allclose(g.cpu(), w.cpu(), rtol=1e-6, atol=1e-9):
            fail(
                f"{name}: the gradient for `{arg_name}` differs from the block's own, with dropout in the block.",
                *shown, f"expected {show(w)}", f"actual   {show(g)}",
                cause="None for an input that requires grad: backward must return a gradient for every tensor "
                "input, parameters included." if g is None else
                "the recomputation in backward drew other random numbers than forward, so dropout dropped other "
                "entries. Keep torch.get_rng_state() in forward and restore it before recomputing (this is "
                "checkpoint's preserve_rng_state=True).",
            )
    if not kept:
        fail(
            f"{name}: backward moved the caller's random generator: after backward it is where your forward "
            "left it, not where the caller had it, so the caller's next random numbers repeat earlier ones.",
            *shown,
            cause="restore the generator state only inside `with torch.random.fork_rng():`, which puts the "
            "caller's state back when the block ends.",
        )
    if kind.lets_go and held > 0:
        fail(f"{name}: during backward, {held} bytes of recomputed tensors were still alive after the last step of "
             f"backward that read them (at the start of a later step, where the steps to come needed {needed} "
             "bytes of them).", *shown, cause=kind.lets_go)


# --- Exercise: saved-tensor hooks that compress to bfloat16 --------------------------------

HOOKS_FACTOR = 4  # a gradient may be off by this many times the error of rounding every activation to bfloat16
VALUE_BOUND = 2.0 ** -7  # largest difference of an unpacked tensor, relative to its largest entry

def _hooks_args(shape: Sequence[int], dtype: torch.dtype, scale: float, generator: torch.Generator) -> tuple:
    batch, n_in, hidden, classes = shape
    x = inputs.normal((batch, n_in), generator).to(dtype)
    w1 = inputs.normal((n_in, hidden), generator).to(dtype).requires_grad_()
    b1 = inputs.normal((hidden,), generator).to(dtype).requires_grad_()
    w2 = (inputs.normal((hidden, classes), generator) * scale).to(dtype).requires_grad_()
    index = torch.randint(classes, (batch, 3), generator=generator)
    index[0, 0] = classes - 1  # the largest index occurs
    keep = torch.rand((batch, hidden), generator=generator) > 0.3
    return x, w1, b1, w2, index, keep


SAVED_BY = {  # what the hooks graph saves, in order, named for messages
    "float": "an activation", "int64": "the int64 indices gather saves", "bool": "the bool mask masked_fill saves",
}


def _saved_name(r: dict) -> str:
    if r["parameter"]:
        return f"the parameter of shape {tuple(r['shape'])}"
    what = SAVED_BY["int64" if r["dtype"] == "int64" else "bool" if r["dtype"] == "bool" else "float"]
    return f"{what}, {r['dtype']} of shape {tuple(r['shape'])} ({r['nbytes']} bytes)"


def _packed_bytes(r: dict) -> int:
    return sum(int(p["nbytes"]) for p in r["packed"])


def check_save_as_bf16(hooks: Any, *, shapes: Sequence[Sequence[int]] = ((6, 5, 16, 5),),
                       dtype: str = "float32", scale: float = 1.0, seed: int | None = 0) -> None:
    """save_as_bf16: saved-tensor hooks that keep floating-point activations in bfloat16 and
    give them back in their own dtype and device; parameters, masks and indices unchanged.
    `dtype` is "float32" or "float64" (a name: a test cell may not know torch)."""
    __tracebackhide__ = True
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', not {dtype!r}")
    dtype = getattr(torch, dtype)
    generator = inputs.generator(seed)
    totals = [0, 0]
    for shape in shapes:
        args = _hooks_args(shape, dtype, scale, generator)
        for device in devices.available():
            on_device = tuple(a.detach().to(device).requires_grad_(a.requires_grad) for a in args)
            totals = _check_hooks_once(hooks, on_device, scale, totals)
        meta = tuple(torch.empty_like(a, device="meta").requires_grad_(a.requires_grad) for a in args)
        _check_hooks_once(hooks, meta, scale, totals)
    passed(
        f"save_as_bf16 keeps the activations in {totals[1]} bytes instead of {totals[0]}; parameters, the bool "
        f"mask and the int64 indices as they are; unpacked tensors in their own dtype and device "
        f"({str(dtype).removeprefix('torch.')}, {', '.join([*devices.available(), 'meta'])}); gradients as close as "
        "bfloat16 rounding allows."
    )
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


def _check_hooks_once(hooks: Any, args: tuple, scale: float, totals: list[int]) -> list[int]:
    __tracebackhide__ = True
    meta = args[0].device.type == "meta"
    with quiet():
        found = probe.invoke(memory.hooks_run, hooks, memory.HOOKS_GRAPH, args)
    error, saved, grads = _hooks_report(found)
    x, index = args[0], args[4]
    shown = [
        "the graph: h = tanh(x @ w1 + b1).masked_fill(~keep, 0); loss = ((h @ w2).gather(1, index) ** 2).sum()",
        f"x: {_dtype(x)} {tuple(x.shape)} (no grad); w1, b1, w2: parameters; index: int64 {tuple(index.shape)}"
        + ("" if meta else f" (largest {value(index.max().item(), 'd')})") + f"; on {x.device.type}"
        + (f"; w2 scaled by {scale:g}" if scale != 1 else ""),
    ]
    if error is not None and error.stage == "create":
        fail(f"save_as_bf16() raised {error.type}: "
             f"{error.message.strip().splitlines()[0] if error.message.strip() else ''}",
             cause=explain.NOT_IMPLEMENTED if error.type == "NotImplementedError" else
             "save_as_bf16() must create its pack and unpack functions and pass them to "
             "super().__init__(pack, unpack).")
    for r in saved:
        _check_unpacked(r, shown)
    if error is not None and meta and error.stage in ("pack", "unpack"):
        first = error.message.strip().splitlines()[0] if error.message.strip() else error.type
        fail(f"save_as_bf16: {error.stage} fails on the meta device: {error.type}: {first}", *shown,
             cause="pack or unpack puts the tensor on a device of its own (such as the CPU), and a meta tensor has "
             "no data to copy there. Give every tensor back on the device it was saved on: never a fixed device.")
    if error is not None:
        what, cause = explain.error(error.stage, error.type, error.message, [])
        fail(f"save_as_bf16: {what}.", *shown, cause=cause)
    for r in saved:
        _check_packed(r, shown)
    if meta:
        return totals
    want, rounded = _hooks_reference(args)
    if len(grads) != len(want) or any(g is not None and not isinstance(g, torch.Tensor) for g in grads):
        raise probe.Malformed("malformed hooks gradients")
    for name, w, g in zip(("w1", "b1", "w2"), want, grads):
        if g is None or g.shape != w.shape:
            fail(f"save_as_bf16: the gradient of {name} is {'missing' if g is None else f'of shape {tuple(g.shape)}'}.",
                 *shown)
    grads = [g.cpu().to(w.dtype) for g, w in zip(grads, want)]
    scale = _norm(want)
    error_, error_rounded = _norm([g - w for g, w in zip(grads, want)]), _norm([r - w for r, w in zip(rounded, want)])
    if not error_ <= HOOKS_FACTOR * error_rounded + 2.0**-12 * scale:
        name, w, g = max(zip(("w1", "b1", "w2"), want, grads), key=lambda t: float((t[2] - t[1]).norm()))
        fail(
            f"save_as_bf16: the gradients differ from the exact ones by {error_ / scale if scale else error_:.3g} "
            f"(relative), more than {HOOKS_FACTOR} times as much as with every activation rounded to bfloat16 "
            f"({error_rounded / scale if scale else error_rounded:.3g}).", *shown,
            f"gradient of {name}: expected {show(w)}", f"actual   {show(g)}",
            cause="store floating-point activations as t.to(torch.bfloat16): 8 significant bits and float32's "
            "range; give them back with .to(dtype), and everything else unchanged.",
        )
    totals = [totals[0] + sum(r["nbytes"] for r in saved if _activation(r)),
              totals[1] + sum(_packed_bytes(r) for r in saved if _activation(r))]
    return totals


def _hooks_report(found: Any) -> tuple[probe.ProbeError | None, list[dict], list]:
    """(error, saved, gradients) of a hooks_run report, checked for form (it comes from the
    student's process)."""
    try:
        error = probe.ProbeError.from_data(found["error"])
        saved, grads = list(found["saved"]), list(found["grads"])
        for r in saved:
            unpacked = r["unpacked"]
            if not (
                isinstance(r["dtype"], str) and isinstance(r["device"], str) and isinstance(r["shape"], list)
                and isinstance(r["nbytes"], int) and isinstance(r["parameter"], bool)
                and isinstance(r["own_memory"], bool)
                and all(isinstance(p["dtype"], str) and isinstance(p["nbytes"], int) for p in r["packed"])
                and (unpacked is None or isinstance(unpacked["type"], str))
            ):
                raise ValueError("a saved tensor's record")
    except (AttributeError, KeyError, TypeError, ValueError) as bad:
        raise probe.Malformed(f"malformed hooks report: {bad}") from None
    return error, saved, grads


def _norm(tensors: Sequence[torch.Tensor]) -> float:
    return float(torch.cat([t.detach().flatten().double() for t in tensors]).norm())


def _hooks_reference(args: tuple) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The exact gradients of the hooks graph, and those with every float activation rounded
    to bfloat16 (the error a right answer may have, up to HOOKS_FACTOR times)."""

    def rounded(t: torch.Tensor) -> torch.Tensor:
        if t.dtype in (torch.float32, torch.float64) and not (t.is_leaf and t.requires_grad):
            return t.to(torch.bfloat16).to(t.dtype)
        return t

    results = []
    for hooks in (None, torch.autograd.graph.saved_tensors_hooks(rounded, lambda t: t)):
        leaves = tuple(a.detach().cpu().requires_grad_(a.requires_grad) for a in args)
        wrt = [a for a in leaves if a.requires_grad]
        if hooks is None:
            loss = memory.hooks_graph(*leaves)
        else:
            with hooks:
                loss = memory.hooks_graph(*leaves)
        results.append(torch.autograd.grad(loss, wrt))
    return results[0], results[1]


def _activation(r: dict) -> bool:
    return not r["parameter"] and r["dtype"] in ("float32", "float64")


def _check_unpacked(r: dict, shown: list[str]) -> None:
    """What unpack gave back: a tensor of the saved one's dtype, shape and device, whose
    values are the saved ones (exactly for integers and masks)."""
    __tracebackhide__ = True
    u = r.get("unpacked")
    if u is None:
        return  # never unpacked (backward failed before): the error says why
    what = _saved_name(r)
    if u.get("type") != "Tensor":
        fail(f"save_as_bf16: unpack returned a {u.get('type')} for {what}, not a tensor.", *shown,
             cause="unpack gets what pack returned and must give back a tensor.")
    if u["dtype"] != r["dtype"]:
        cause = ("give it back in the dtype it was saved in: remember t.dtype in pack (return it with the "
                 "compressed tensor) and convert back in unpack. Otherwise backward computes in bfloat16, or fails "
                 "where dtypes must match (a matmul: 'expected m1 and m2 to have the same dtype').")
        fail(f"save_as_bf16: unpack returned {u['dtype']} for {what}.", *shown, cause=cause)
    if u["device"] != r["device"]:
        fail(f"save_as_bf16: unpack returned a tensor on {u['device']} for {what} saved on {r['device']}.", *shown,
             cause="give it back on the device it was saved on: remember t.device in pack and move it back in "
             "unpack (`.to(device, dtype)`), instead of hard-coding a device.")
    if list(u["shape"]) != list(r["shape"]):
        fail(f"save_as_bf16: unpack returned shape {tuple(u['shape'])} for {what}.", *shown)
    if "equal" not in u:
        return
    if r["dtype"] not in ("float32", "float64", "float16", "bfloat16"):
        if not u["equal"]:
            fail(f"save_as_bf16: unpack gave back other values for {what}.", *shown,
                 cause="integers and masks must pass unchanged: bfloat16 has 8 significant bits, so an index "
                 "above 256 comes back rounded (257 becomes 256).")
        return
    difference = u.get("difference", 0.0)
    if not isinstance(difference, (int, float)) or not isinstance(u["equal"], bool):
        raise probe.Malformed("malformed unpacked record")
    difference = float(difference)
    if not difference <= VALUE_BOUND and not u["equal"]:
        cause = ("float16 overflows above 65504 (to inf): bfloat16 keeps float32's range with fewer digits."
                 if math.isnan(difference) or math.isinf(difference) else
                 "store floating-point activations as bfloat16 (8 significant bits): fewer bits lose more.")
        fail(
            f"save_as_bf16: unpack gave back {what} with values that differ from the saved ones by up to "
            f"{difference:.3g} of the largest entry, more than bfloat16's rounding (2^-8 ≈ 0.0039).", *shown,
            cause=cause,
        )


def _check_packed(r: dict, shown: list[str]) -> None:
    """What pack kept: parameters as they are, integers and masks as they are, float
    activations in 2 bytes per element."""
    __tracebackhide__ = True
    what = _saved_name(r)
    kept = _packed_bytes(r)
    dtypes = sorted({p["dtype"] for p in r["packed"]})
    if r["parameter"]:
        if not r.get("own_memory", True) or kept > r["nbytes"]:
            fail(
                f"save_as_bf16: pack made a {'/'.join(dtypes) or 'new'} copy of {what}.", *shown,
                cause="the model keeps its parameters in full precision anyway, so a copy adds memory instead of "
                "saving any, and adds error to the gradients. Return a parameter (a leaf that requires grad: "
                "t.is_leaf and t.requires_grad) as it is.",
            )
        return
    if r["dtype"] in ("int64", "bool") or r["dtype"].startswith(("int", "uint")):
        if dtypes != [r["dtype"]] or kept > r["nbytes"]:
            fail(
                f"save_as_bf16: pack stored {what} as {'/'.join(dtypes) or 'no tensor'}.", *shown,
                cause="integers and masks must pass unchanged: bfloat16 has 8 significant bits (an index above 256 "
                "comes back rounded), and a 1-byte mask would take 2 bytes.",
            )
        return
    if r["dtype"] in ("float32", "float64"):
        budget = 2 * r["nbytes"] // (4 if r["dtype"] == "float32" else 8)
        if kept > budget:
            how = "as it is" if r.get("own_memory") else f"in {kept} bytes ({'/'.join(dtypes)})"
            fail(
                f"save_as_bf16: pack kept {what} {how}; bfloat16 takes 2 bytes per element ({budget} bytes).",
                *shown,
                cause="pack must store every floating-point tensor that is not a parameter as bfloat16 "
                "(t.to(torch.bfloat16)), also float64 ones.",
            )


# --- Exercise: true or false? --------------------------------------------------------------

CLAIM_CHOICES = ("true", "false")
CLAIM_QUESTIONS = "abcdefghi"
