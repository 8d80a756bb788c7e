"""What a Function saved for backward: how many tensors, their shapes and bytes, and whose
memory each one is — recorded where the Function runs.

`record` calls a Function under saved-tensor hooks. The pack hook fires once for every
tensor given to `ctx.save_for_backward`, when forward returns (and only if some input
requires grad: without a graph nothing is saved). Each saved tensor is classified by its
memory: an input or an output of the call (the same storage, offset, shape and strides),
a view of one of them (the same storage, another layout), or an intermediate that exists
only for backward. Tensors stashed as attributes of ctx (`ctx.y = y`) never reach the
hooks; they are found on the graph node, which is the ctx object itself.

`recorded`, a probe procedure, records a student's Function in the student's process and
runs backward once there; the checks (:mod:`autograder.checks.saved`) judge what it saw.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from . import probe
from .report import quiet

KINDS = ("input", "output", "intermediate")  # whose memory a saved tensor is


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
    function: bool = False  # the outputs' grad_fn is a custom Function's node (its ctx)

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
        function=isinstance(node, torch.autograd.function.BackwardCFunction),
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


def non_leaf(args: Sequence[Any]) -> tuple:
    """Copies of the tensor arguments that are not leaves (an in-place Function cannot
    modify a leaf that requires grad)."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


@probe.procedure
def recorded(fn: Any, args: tuple, copy: bool) -> dict:
    """Record `fn(*args)`, then run backward once; plain data, reported by the process
    that ran `fn` (best effort)."""
    if copy:
        args = non_leaf(args)
    try:
        recording = record(fn, *args)
    except Exception as exc:  # the student's code may raise anything
        return {"error": asdict(probe.ProbeError.of("forward", exc))}

    def snapshot(s: Saved) -> dict:  # taken before backward can change it
        return {"tensor": s.tensor.detach().clone(), "kind": s.kind, "index": s.index, "view": s.view, "graph": s.graph}

    found = {
        "args": [a.detach() if isinstance(a, torch.Tensor) else a for a in recording.args],
        "before": list(recording.before),
        "outputs": [o.detach() for o in recording.outputs],
        "saved": [snapshot(s) for s in recording.saved],
        "stashed": {path: snapshot(s) for path, s in recording.stashed.items()},
        "function": recording.function,
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
        error = asdict(probe.ProbeError.of("backward", exc))
        return {"error": error, "modified": [], "modified_grad_output": False}
    saved_after = [s.tensor.detach() for s in recording.saved]
    return {
        "error": None,
        "modified": [i for i, (a, b) in enumerate(zip(saved_after, saved_before)) if not torch.equal(a, b)],
        "modified_grad_output": any(not torch.equal(g, b) for g, b in zip(grads, grads_before)),
    }
