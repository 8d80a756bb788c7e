"""What a Function saved for backward: how many tensors, their shapes and bytes, and whose
memory each one is.

`record` calls a Function under saved-tensor hooks. The pack hook fires once for every
tensor given to `ctx.save_for_backward`, when forward returns (and only if some input
requires grad: without a graph nothing is saved). Each saved tensor is classified by its
memory: an input or an output of the call (the same storage, offset, shape and strides),
a view of one of them (the same storage, another layout), or an intermediate that exists
only for backward. Tensors stashed as attributes of ctx (`ctx.y = y`) never reach the
hooks; they are found on the graph node, which is the ctx object itself.

`observe` records a student's Function where it lives (in the student's process when given
a proxy, see .probe) and runs backward once there; `check_saved` compares what it saw with
what an exercise expects and explains a mismatch, in the grader: the saved tensors come
back as copies taken before backward, with the facts the check needs about them.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from . import explain, probe
from .report import fail, quiet

KINDS = ("input", "output", "intermediate")  # whose memory a saved tensor is

STASHED = (
    "autograd cannot see a tensor stored as an attribute of ctx: it cannot check its version "
    "(an in-place change then gives a silently wrong gradient), it cannot free it after "
    "backward, and saved-tensor hooks (save_on_cpu, memory measurements) miss it{cycle}. "
    "Save it with `ctx.save_for_backward(...)` and read it back from `ctx.saved_tensors`."
)
CYCLE = "; an output stored on ctx also makes a reference cycle (output → grad_fn → ctx → output)"

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


@dataclass(frozen=True)
class Saved:
    """One tensor held for backward, and whose memory it is."""

    tensor: torch.Tensor
    kind: str  # "input", "output" or "intermediate"
    index: int | None = None  # position of that input among the arguments, or of that output
    view: bool = False  # shares that input's or output's memory with another layout
    graph: bool = False  # has a grad_fn: part of the graph

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    @property
    def role(self) -> str:
        """"input 0", "output 1", "view of input 0" or "intermediate"."""
        if self.kind == "intermediate":
            return "intermediate"
        return f"{'view of ' if self.view else ''}{self.kind} {self.index}"


@dataclass
class Recording:
    """What one call of a Function returned, saved, and stashed on ctx."""

    args: tuple  # the arguments of the call (an in-place Function has changed some)
    before: tuple  # their values before the call, detached
    outputs: list[torch.Tensor]
    saved: list[Saved] = field(default_factory=list)  # in the order they were saved
    stashed: dict[str, Saved] = field(default_factory=dict)  # "y" for ctx.y, "cache[0]", ...

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.saved)


def record(fn: Any, *args: Any) -> Recording:
    """Call `fn(*args)` (`fn.apply` for a Function class) and record what it saved.

    Floating-point arguments must already require grad where a gradient is wanted:
    a call that builds no graph saves nothing. `fn` runs in this process: checks of a
    student's Function use `observe`.
    """
    packed: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append(t)
        return t

    before = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = probe.as_callable(fn)(*args)
    outputs = probe.outputs_of(result)
    node = next((o.grad_fn for o in outputs if o.grad_fn is not None), None)
    return Recording(
        args=tuple(args),
        before=before,
        outputs=outputs,
        saved=[classify(t, args, outputs) for t in packed],
        stashed={path: classify(t, args, outputs) for path, t in _stashed(node)},
    )


def classify(t: torch.Tensor, args: Sequence[Any], outputs: Sequence[torch.Tensor]) -> Saved:
    """Whose memory `t` is: an output first (an in-place Function's output is also its
    input), then an input, then a view of either, else an intermediate."""
    owners = [("output", i, o) for i, o in enumerate(outputs)]
    owners += [("input", i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    graph = t.grad_fn is not None
    for kind, i, other in owners:
        if t is other or (_storage(t) and _layout(t) == _layout(other)):
            return Saved(t, kind, i, graph=graph)
    for kind, i, other in owners:
        if _storage(t) and _storage(t) == _storage(other):
            return Saved(t, kind, i, view=True, graph=graph)
    return Saved(t, "intermediate", graph=graph)


def _storage(t: torch.Tensor) -> int:
    """Address of the memory under `t`; 0 when there is none to compare (meta, empty)."""
    return 0 if t.device.type == "meta" else t.untyped_storage().data_ptr()


def _layout(t: torch.Tensor) -> tuple:
    return (_storage(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _stashed(node: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors kept as attributes of a custom Function's ctx, also inside lists and dicts."""

    def walk(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
        if isinstance(value, torch.Tensor):
            yield path, value
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                yield from walk(v, f"{path}[{i}]")
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from walk(v, f"{path}[{k!r}]")

    for name, value in getattr(node, "__dict__", {}).items():
        yield from walk(value, name)


# --- Words ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Names:
    """How messages name the arguments, outputs and known intermediates of one Function."""

    args: Sequence[str] = ()  # argument names of forward, without ctx
    outputs: Sequence[str] = ()  # e.g. ("values", "indices"); empty: "the output" / "output k"
    # Intermediates recognised by value: {"exp(-x)": lambda x: (-x).exp()}, called with the
    # arguments of the call.
    known: Mapping[str, Callable[..., torch.Tensor]] = field(default_factory=dict)

    def of(self, s: Saved, recording: Recording) -> str:
        """"the output", "a view of the input `x`", "the intermediate exp(-x)", ..."""
        if s.kind == "intermediate":
            what = self._known(s.tensor, recording.before)
            return f"the intermediate {what}" if what else "an intermediate"
        owner = self.role(s.kind, s.index, len(recording.outputs))
        return f"a view of {owner}" if s.view else owner

    def role(self, kind: str, index: int, n_outputs: int = 1) -> str:
        if kind == "input":
            return f"the input `{self.args[index]}`" if index < len(self.args) else f"input {index}"
        if index < len(self.outputs):
            return f"the output `{self.outputs[index]}`"
        return "the output" if n_outputs == 1 else f"output {index}"

    def _known(self, t: torch.Tensor, args: tuple) -> str | None:
        for name, compute in self.known.items():
            value = compute(*args)
            if value.shape == t.shape and value.dtype == t.dtype and torch.allclose(value, t.detach()):
                return name
        return None


def describe(s: Saved, recording: Recording, names: Names) -> str:
    """"the output of shape (3,), 24 bytes"."""
    return f"{names.of(s, recording)} of shape {s.shape}, {s.nbytes} bytes"


def summary(recording: Recording, names: Names = Names()) -> str:
    """A few lines: each saved tensor, then anything stashed on ctx."""
    n = len(recording.saved)
    extra = sum(s.nbytes for s in recording.saved if s.kind == "intermediate")
    share = "all" if extra == recording.nbytes else f"{extra} of them"
    lines = [
        f"saved {n} tensor{'s' * (n != 1)}, {recording.nbytes} bytes"
        + (f" ({share} in intermediates, kept alive only for backward)" if extra else "")
    ]
    lines += [
        f"  {describe(s, recording, names)}, {str(s.tensor.dtype).removeprefix('torch.')}" for s in recording.saved
    ]
    lines += [
        f"  stashed on ctx, invisible to autograd: ctx.{path} = {describe(s, recording, names)}"
        for path, s in recording.stashed.items()
    ]
    return "\n".join(lines)


def show_saved(fn: Any, *args: Any) -> None:
    """Print what `fn(*args)` saves for backward (for notebooks)."""
    names = Names(args=probe.argument_names(fn))
    with quiet():
        recording = record(fn, *args)
    print(f"{getattr(fn, '__name__', 'fn')}: {summary(recording, names)}")


# --- The check -----------------------------------------------------------------------------

@dataclass(frozen=True)
class SaveRule:
    """What a Function must save: exactly the tensors in `expected` (roles such as
    "output 0" or "input 1", in any order), and nothing on ctx."""

    name: str
    expected: tuple[str, ...]
    fix: str  # what to do instead, e.g. "save the output instead: σ'(x) = y·(1 − y)"
    names: Names = Names()
    reasons: Mapping[str, str] = field(default_factory=dict)  # kind -> why it is wrong here


def non_leaf(args: Sequence[Any]) -> tuple:
    """Copies of the tensor arguments that are not leaves (an in-place Function cannot
    modify a leaf that requires grad)."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


@dataclass
class Backward:
    """One backward after a recorded call: its error, or what it changed in place."""

    error: probe.ProbeError | None = None
    modified: list[int] = field(default_factory=list)  # positions in Recording.saved
    modified_grad_output: bool = False


def observe(fn: Any, args: Sequence[Any], *, copy: bool = False) -> tuple[Recording, Backward]:
    """`record(fn, *args)` in the process where `fn` is (on non-leaf copies of the tensor
    arguments with `copy`), then one backward there with seeded gradients. The recording
    holds copies of the saved tensors taken before backward. Raises probe.StudentError if
    forward raised.

    When `fn` is a proxy, all of it is reported by the student's process: best effort.
    """
    data = probe.invoke(_observe, fn, tuple(args), copy)
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
        )
        backward = data["backward"]
        modified = [i for i in backward["modified"] if isinstance(i, int) and 0 <= i < len(recording.saved)]
        return recording, Backward(
            probe.ProbeError.from_data(backward["error"]), modified, bool(backward["modified_grad_output"])
        )
    except (AttributeError, KeyError, TypeError) as bad:
        raise probe.Malformed(f"malformed recording: {bad}") from None


def _tensor_list(values: Any) -> list[torch.Tensor]:
    if not isinstance(values, list) or not all(isinstance(v, torch.Tensor) for v in values):
        raise probe.Malformed("expected a list of tensors")
    return values


def _saved(data: Any) -> Saved:
    s = Saved(data["tensor"], data["kind"], data["index"], bool(data["view"]), bool(data["graph"]))
    if not isinstance(s.tensor, torch.Tensor) or s.kind not in KINDS or not isinstance(s.index, (int, type(None))):
        raise probe.Malformed("malformed saved tensor")
    return s


@probe.procedure
def _observe(fn: Any, args: tuple, copy: bool) -> dict:
    """Record `fn(*args)`, then run backward once; plain data, reported by the process
    that ran `fn` (best effort)."""
    if copy:
        args = non_leaf(args)
    try:
        recording = record(fn, *args)
    except Exception as exc:  # the student's code may raise anything
        return {"error": asdict(probe.ProbeError("forward", type(exc).__name__, str(exc)))}

    def snapshot(s: Saved) -> dict:  # taken before backward can change it
        return {"tensor": s.tensor.detach().clone(), "kind": s.kind, "index": s.index, "view": s.view, "graph": s.graph}

    found = {
        "args": [a.detach() if isinstance(a, torch.Tensor) else a for a in recording.args],
        "before": list(recording.before),
        "outputs": [o.detach() for o in recording.outputs],
        "saved": [snapshot(s) for s in recording.saved],
        "stashed": {path: snapshot(s) for path, s in recording.stashed.items()},
    }
    return {"error": None, "recording": found, "backward": _backward(recording)}


def _backward(recording: Recording) -> dict:
    """Run backward once: its error, or which saved tensors and whether grad_output it
    changed in place."""
    outputs = [o for o in recording.outputs if o.requires_grad]
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(o.shape, generator=generator, dtype=o.dtype).to(o.device) for o in outputs]
    grads_before = [g.clone() for g in grads]
    saved_before = [s.tensor.detach().clone() for s in recording.saved]
    try:
        torch.autograd.backward(outputs, grads)
    except Exception as exc:  # the student's code may raise anything
        error = asdict(probe.ProbeError("backward", type(exc).__name__, str(exc)))
        return {"error": error, "modified": [], "modified_grad_output": False}
    saved_after = [s.tensor.detach() for s in recording.saved]
    return {
        "error": None,
        "modified": [i for i, (a, b) in enumerate(zip(saved_after, saved_before)) if not torch.equal(a, b)],
        "modified_grad_output": any(not torch.equal(g, b) for g, b in zip(grads, grads_before)),
    }


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
    got = Counter(s.role for s in recording.saved)
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
    _check_backward_left_alone(rule.name, recording, backward, names)
    return recording


def _check_backward_left_alone(name: str, recording: Recording, backward: Backward, names: Names) -> None:
    """The backward run after the call changed neither a saved tensor nor grad_output."""
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
