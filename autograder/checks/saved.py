"""Whether a Function saved what an exercise expects, and why not.

`observe` records a student's Function where it lives (in the student's process when given
a proxy, see :mod:`autograder.student.probe`) and runs backward once there;
`check_saved` compares what it saw with what an exercise expects and explains a mismatch,
in the grader: the saved tensors come back as copies taken before backward, with the facts
the check needs about them (:mod:`autograder.student.saved` records them). Every check of
what a Function keeps also fails on memory the call leaves alive anywhere else
(`check_nothing_kept`: a global, a class attribute, a closure, a default argument).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import torch

from ..student import probe
from ..student.report import fail, quiet
from ..student.saved import KINDS, Kept, Names, Recording, Saved, describe, recorded
from . import explain

STASHED = (
    "autograd cannot see a tensor stored as an attribute of ctx: it cannot check its version "
    "(an in-place change then gives a silently wrong gradient), it cannot free it after "
    "backward, and saved-tensor hooks (save_on_cpu, memory measurements) miss it{cycle}. "
    "Save it with `ctx.save_for_backward(...)` and read it back from `ctx.saved_tensors`."
)
CYCLE = "; an output stored on ctx also makes a reference cycle (output → grad_fn → ctx → output)"
KEPT = (
    "a reference kept outside ctx (a global, a class attribute, a variable of an enclosing function, a "
    "default argument, a list any of them holds) keeps the memory alive where autograd cannot see it: it "
    "is not freed after backward, not checked for in-place changes, missed by saved-tensor hooks and "
    "memory measurements, and it lives on until the next call replaces it (or forever, in a list). "
    "Keep what backward needs with `ctx.save_for_backward(...)`, and no tensor anywhere else."
)

# Why saving each kind of tensor can be wrong; an exercise may say more.
REASONS = {
    "intermediate": (
        "forward runs without recording, so a gradient computed from an intermediate cannot be "
        "differentiated again (double backward), and the intermediate is memory kept alive only "
        "for backward. Save inputs or outputs and recompute the rest in backward."
    ),
    "input": "backward needs something else, or less: save only what the gradient formula reads.",
    "output": "backward needs something else, or less: save only what the gradient formula reads.",
}


# --- The check -----------------------------------------------------------------------------

@dataclass(frozen=True)
class SaveRule:
    """What a Function must save: exactly the tensors in `expected` (roles such as
    "output 0" or "input 1", in any order; None: whatever it likes), and nothing on ctx."""

    name: str
    expected: tuple[str, ...] | None
    fix: str  # what to do instead, e.g. "save the output instead: σ'(x) = y·(1 − y)"
    names: Names = Names()
    reasons: Mapping[str, str] = field(default_factory=dict)  # kind -> why it is wrong here


@dataclass
class Backward:
    """One backward after a recorded call: its error, or what it changed in place."""

    error: probe.ProbeError | None = None
    modified: list[int] = field(default_factory=list)  # positions in Recording.saved
    modified_grad_output: bool = False
    kept: list[Kept] = field(default_factory=list)  # alive after backward, once the caller let go of all


def observe(fn: Any, args: Sequence[Any], *, copy: bool = False, strided: bool = False) -> tuple[Recording, Backward]:
    """`record(fn, *args)` in the process where `fn` is (on non-leaf copies of the tensor
    arguments with `copy`, on copies that are not contiguous with `strided`), then one
    backward there with seeded gradients. The recording
    holds copies of the saved tensors taken before backward. Raises probe.StudentError if
    forward raised.

    When `fn` is a proxy, all of it is reported by the student's process: best effort.
    """
    data = probe.invoke(recorded, fn, tuple(args), copy, strided)
    try:
        error = probe.ProbeError.from_data(data["error"])
        if error is not None:
            raise probe.StudentError(error.type, error.message)
        found = data["recording"]
        recording = Recording(
            args=tuple(found["args"]),
            before=tuple(found["before"]),
            outputs=_tensor_list(found["outputs"]),
            saved=[_saved(s) for s in found["saved"]],
            stashed={str(path): _saved(s) for path, s in found["stashed"].items()},
            function=found.get("function") is True,
            kept=[_kept(k) for k in found["kept"]],
        )
        backward = data["backward"]
        modified = [i for i in backward["modified"] if isinstance(i, int) and 0 <= i < len(recording.saved)]
        return recording, Backward(
            probe.ProbeError.from_data(backward["error"]), modified, bool(backward["modified_grad_output"]),
            [_kept(k) for k in backward["kept"]],
        )
    except (AttributeError, KeyError, TypeError, ValueError) as bad:
        raise probe.Malformed(f"malformed recording: {bad}") from None


def _kept(data: Any) -> Kept:
    kept = Kept(tuple(int(n) for n in data["shape"]), str(data["dtype"]), int(data["nbytes"]), str(data["owner"]),
                None if data["where"] is None else str(data["where"]))
    if not re.fullmatch(r"(input|output) \d+|forward|backward", kept.owner):
        raise probe.Malformed("malformed kept memory")
    return kept


def _tensor_list(values: Any) -> list[torch.Tensor]:
    if not isinstance(values, list) or not all(isinstance(v, torch.Tensor) for v in values):
        raise probe.Malformed("expected a list of tensors")
    return values


def _saved(data: Any) -> Saved:
    s = Saved(data["tensor"], data["kind"], data["index"], bool(data["view"]), bool(data["graph"]))
    if not isinstance(s.tensor, torch.Tensor) or s.kind not in KINDS or not isinstance(s.index, (int, type(None))):
        raise probe.Malformed("malformed saved tensor")
    return s


def check_saved(student: Any, rule: SaveRule, args: tuple, *, copy: bool = False) -> Recording:
    """Call the student's Function once on `args` (on the CPU or CUDA; on non-leaf copies
    with `copy`) and run backward; fail unless it saved exactly what `rule` expects,
    nothing on ctx, and backward left the saved tensors and grad_output unchanged.
    Returns the recording."""
    __tracebackhide__ = True
    names = rule.names if rule.names.args else replace(rule.names, args=probe.argument_names(student))
    with quiet():
        try:
            recording, backward = observe(student, args, copy=copy)
        except probe.StudentError as exc:
            what, cause = explain.error("forward", exc.type, exc.message, list(names.args))
            fail(f"{rule.name}: {what}.", cause=cause)
    listing = "saved for backward: " + (
        ", ".join(describe(s, recording, names) for s in recording.saved) or "nothing"
    )
    if recording.stashed:
        path, s = next(iter(recording.stashed.items()))
        fail(
            f"{rule.name}: tensor `ctx.{path}` ({describe(s, recording, names)}) is stashed on ctx.",
            cause=STASHED.format(cycle=CYCLE if s.kind == "output" and s.graph else ""),
        )
    check_nothing_kept(rule.name, recording, names)
    got = Counter(s.role for s in recording.saved)
    if rule.expected is None:
        check_backward_left_alone(rule.name, recording, backward, names)
        return recording
    unexpected = got - Counter(rule.expected)
    for s in recording.saved:
        if s.role in unexpected:
            fail(
                f"{rule.name} saved {describe(s, recording, names)}: {rule.fix}.", listing,
                cause=rule.reasons.get(s.kind, REASONS[s.kind]),
            )
    missing = Counter(rule.expected) - got
    if missing:
        role = next(iter(missing))
        fail(f"{rule.name} does not save {_owner(role, names, len(recording.outputs))}: {rule.fix}.", listing)
    check_backward_left_alone(rule.name, recording, backward, names)
    return recording


def check_nothing_kept(name: str, recording: Recording, names: Names, *, cause: str = KEPT) -> None:
    """After forward, the call keeps no memory alive but its outputs, what it saved, and what
    it put on ctx (which the caller judges)."""
    __tracebackhide__ = True
    if recording.kept:
        fail(f"{name}: after forward, {_kept_words(recording.kept, recording, names)}, outside what "
             "it saved for backward.", cause=cause)


def _kept_words(kept: Sequence[Kept], recording: Recording, names: Names) -> str:
    """"a tensor forward created (bool of shape (3,), 3 bytes) is still alive, kept by the global variable `cache`"."""
    k = kept[0]
    if k.owner in ("forward", "backward"):
        what = f"a tensor {k.owner} created"
    else:
        kind, index = k.owner.split()
        what = names.role(kind, int(index), len(recording.outputs))
    words = f"{what} ({k.dtype} of shape {k.shape}, {k.nbytes} bytes) is still alive"
    words += f", kept by {k.where}" if k.where else ""
    others = len(kept) - 1
    return words + (f" (and {others} more block{'s' * (others != 1)} of memory)" if others else "")


def check_backward_left_alone(name: str, recording: Recording, backward: Backward, names: Names) -> None:
    """The backward run after the call changed neither a saved tensor nor grad_output, and
    once it was done and the caller let go of inputs and outputs, nothing stayed alive."""
    __tracebackhide__ = True
    if backward.error is not None:
        error = backward.error
        what, cause = explain.error("backward", error.type, error.message, list(names.args))
        fail(f"{name}: {what}.", cause=_signature_cause(error.message, len(recording.outputs)) or cause)
    if backward.modified:
        s = recording.saved[backward.modified[0]]
        fail(
            f"{name}: backward modified a saved tensor in place: {describe(s, recording, names)}.",
            cause="a saved input or output is the caller's tensor too, whose values then change "
            "under the caller's feet, and a second backward fails the version check. Compute into "
            "a new tensor (`1 - y * y`, not `y.pow_(2)`).",
        )
    if backward.modified_grad_output:
        fail(
            f"{name}: backward modified grad_output in place.",
            cause="grad_output belongs to autograd: the same tensor may also go to another branch of the "
            "graph, or be the caller's tensor passed to .backward(g). Compute a new tensor "
            "(`grad_output * d`, not `grad_output.mul_(d)`), or clone grad_output first.",
        )
    if backward.kept:
        fail(f"{name}: after backward, with the inputs, the outputs and the graph let go of, "
             f"{_kept_words(backward.kept, recording, names)}.", cause=KEPT)


def _signature_cause(message: str, n_outputs: int) -> str | None:
    """Why backward cannot take the gradients autograd passes it."""
    if not re.search(r"backward\(\) (takes|missing)", message):
        return None
    return (
        f"backward receives ctx and one gradient per output of forward ({n_outputs} here), "
        "non-differentiable outputs included: give it one parameter for each."
    )


def _owner(role: str, names: Names, n_outputs: int) -> str:
    if role == "intermediate":
        return "an intermediate"
    *view, kind, index = role.split()
    owner = names.role(kind, int(index), n_outputs)
    return f"a view of {owner}" if view else owner
