"""What a Function saved for backward: how many tensors, their shapes and bytes, and whose
memory each one is — recorded where the Function runs.

`record` calls a Function under saved-tensor hooks. The pack hook fires once for every
tensor given to `ctx.save_for_backward`, when forward returns (and only if some input
requires grad: without a graph nothing is saved). Each saved tensor is classified by its
memory: an input or an output of the call (the same storage, offset, shape and strides),
a view of one of them (the same storage, another layout), or an intermediate that exists
only for backward. Tensors stashed as attributes of ctx (`ctx.y = y`) never reach the
hooks; they are found on the graph node, which is the ctx object itself.

What neither sees, a reference kept anywhere else (a global, a class attribute, a closure,
a default argument), `Watch` finds: it follows every memory block the call creates, and its
inputs, through weak references, so whatever is still alive after forward (beyond the
outputs and what is saved or on ctx) and after backward (beyond nothing at all) is kept
by the answer.

`recorded`, a probe procedure, records a student's Function in the student's process and
runs backward once there; the checks (:mod:`autograder.checks.saved`) judge what it saw.
"""
from __future__ import annotations

import gc
import types
import weakref
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


@dataclass(frozen=True)
class Kept:
    """A block of memory that a call left alive where autograd does not keep it."""

    shape: tuple[int, ...]  # of the tensor that created it
    dtype: str
    nbytes: int  # of the whole block
    owner: str  # "input 0", "output 0", or the stage that created it: "forward", "backward"
    where: str | None = None  # what keeps it, e.g. "the global variable `cache`" (best effort)


@dataclass
class Recording:
    """What one call of a Function returned, saved, and stashed on ctx."""

    args: tuple[Any, ...]  # the arguments of the call (an in-place Function has changed some)
    before: tuple[Any, ...]  # their values before the call, detached
    outputs: list[torch.Tensor]
    saved: list[Saved] = field(default_factory=list)  # in the order they were saved
    stashed: dict[str, Saved] = field(default_factory=dict)  # "y" for ctx.y, "cache[0]", ...
    function: bool = False  # the outputs' grad_fn is a custom Function's node (its ctx)
    kept: list[Kept] = field(default_factory=list)  # alive after forward, kept by neither autograd nor ctx

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.saved)


def record(fn: Any, *args: Any, watch: "Watch | None" = None, thorough: bool = True) -> Recording:
    """Call `fn(*args)` (`fn.apply` for a Function class) and record what it saved, and
    what else it left alive (`watch` follows the memory the call creates, also afterwards;
    see `Watch.alive` for `thorough`).

    Floating-point arguments must already require grad where a gradient is wanted:
    a call that builds no graph saves nothing. `fn` runs in this process: checks of a
    student's Function use `observe`.
    """
    packed: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append(t)
        return t

    watch = watch or Watch()
    before = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            watch.add(a, f"input {i}")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), watch:
        result = probe.as_callable(fn)(*args)
    outputs = probe.outputs_of(result)
    node = next((o.grad_fn for o in outputs if o.grad_fn is not None), None)
    stashed = list(_stashed(node))
    for i, o in enumerate(outputs):
        watch.name(o, f"output {i}")
    return Recording(
        args=tuple(args),
        before=before,
        outputs=outputs,
        saved=[classify(t, args, outputs) for t in packed],
        stashed={path: classify(t, args, outputs) for path, t in stashed},
        function=isinstance(node, torch.autograd.function.BackwardCFunction),
        kept=watch.alive([*outputs, *packed, *(t for _, t in stashed)], inputs=False, thorough=thorough),
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


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in an operator's arguments or results (tuples, lists and dicts of them), in
    order; pytree's general flattening would cost most of a dispatch here."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(item.values()))
    return found


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    return (_storage(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _stashed(node: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors kept as attributes of a custom Function's ctx, also inside lists, dicts and
    objects."""
    for name, value in getattr(node, "__dict__", {}).items():
        yield from tensors_in(value, name)


def tensors_in(value: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor inside `value`: in tuples, lists, dicts, and the
    attributes of objects (`cache[0]`, `box.t`), up to a depth of 8."""
    if depth > 8:
        return
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from tensors_in(v, f"{path}[{i}]", depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from tensors_in(v, f"{path}[{k!r}]", depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, types.FunctionType)):
        for k, v in vars(value).items():
            yield from tensors_in(v, f"{path}.{k}", depth + 1)


# --- Memory kept alive anywhere ------------------------------------------------------------

class Watch(TorchDispatchMode):
    """`with Watch() as watch:` follows every memory block that torch operations create in the
    block (on any device but meta), and each tensor given to `add`, through weak references:
    `alive()` lists those not yet freed, also long after the block ended. Subclasses count
    with `created` and `freed`."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's is unannotated
        self.stage = "forward"  # names what the operations in the block create
        # address -> (the block, the tensor that made it, what it is): weak references
        self._blocks: dict[int, tuple[weakref.ref[Any], weakref.ref[Any], Kept]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {_storage(a) for a in _tensors((args, kwargs))}
        for t in _tensors(out):
            if _storage(t) not in inputs:  # not a view nor in place
                self.add(t, self.stage)
        return out

    def add(self, t: torch.Tensor, owner: str) -> None:
        """Follow the memory under `t` until it is freed (once; not meta, not empty)."""
        key = _storage(t)
        if key == 0 or key in self._blocks:
            return
        storage = t.untyped_storage()
        kept = Kept(tuple(t.shape), str(t.dtype).removeprefix("torch."), storage.nbytes(), owner)

        def gone(_: Any, key: int = key) -> None:
            entry = self._blocks.pop(key, None)
            if entry is not None:
                self.freed(entry[2].nbytes)

        self._blocks[key] = (weakref.ref(storage, gone), weakref.ref(t), kept)
        self.created(kept.nbytes)

    def name(self, t: torch.Tensor, owner: str) -> None:
        """Call the memory under `t`, if followed, `owner` from now on ("output 0")."""
        key = _storage(t)
        if key in self._blocks:
            block, tensor, kept = self._blocks[key]
            self._blocks[key] = (block, tensor, replace(kept, owner=owner))

    def created(self, nbytes: int) -> None:
        pass

    def freed(self, nbytes: int) -> None:
        pass

    def alive(self, beyond: Iterable[torch.Tensor] = (), *, inputs: bool = True, thorough: bool = True) -> list[Kept]:
        """The followed blocks still alive, but those of the tensors `beyond` (and of the
        inputs unless `inputs`). `thorough`, when something is found: what keeps the first few
        is looked for, and unless a reference that lives on is found, garbage (reference
        cycles) is collected and they are looked at again, so that only what a reference
        keeps counts (tenths of a second: the whole heap)."""
        allowed = {_storage(t) for t in beyond}

        def found() -> list[tuple[int, Kept]]:
            listed = [(key, kept) for key, (_, _, kept) in list(self._blocks.items())
                      if key not in allowed and (inputs or not kept.owner.startswith("input"))]
            return sorted(listed, key=lambda item: ORDER.index(item[1].owner.split()[0]))

        alive = found()
        if not thorough or not alive:
            return [kept for _, kept in alive]
        named = self._named(alive)
        if named is None:
            gc.collect()
            alive = found()
            named = self._named(alive, everywhere=True) or alive
        return [kept for _, kept in named]

    def _named(self, alive: list[tuple[int, Kept]], everywhere: bool = False) -> list[tuple[int, Kept]] | None:
        """`alive` with the first of its first few blocks whose keeper is found in front, named:
        looked for from the tensor that made each block, and `everywhere`, from any tensor over
        the first one."""
        for i, (key, kept) in enumerate(alive[:3]):
            entry = self._blocks.get(key)
            tensor = entry[1]() if entry is not None else None
            held_by = where(key, [tensor]) if tensor is not None else None
            if held_by:
                return [(key, replace(kept, where=held_by)), *alive[:i], *alive[i + 1:]]
        held_by = where(alive[0][0]) if everywhere and alive else None
        return [(alive[0][0], replace(alive[0][1], where=held_by)), *alive[1:]] if held_by else None


ORDER = ("output", "forward", "input", "backward")  # what a reference most likely holds (grads: by their inputs)


def where(key: int, tensors: list[torch.Tensor] | None = None) -> str | None:
    """Best effort: what keeps the memory block at address `key` alive — a global variable,
    a class attribute, a variable of an enclosing function, a default argument — found by
    following the garbage collector's referrers from `tensors` over that block (by default,
    every tensor over it)."""
    try:
        return _where(key, tensors)
    except Exception:  # the student's objects may do anything when looked at
        return None


def _where(key: int, tensors: list[torch.Tensor] | None) -> str | None:
    level = tensors or [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and _storage(o) == key]
    held: dict[int, Any] = {}  # id of an object -> the object it refers to, on the way up
    seen = {id(level), id(held), id(tensors)}
    for _ in range(4):  # a closure's variable is 4 references up: dict, cell, closure, function
        if not level:
            return None
        above: list[Any] = []
        seen.add(id(above))
        for ref in gc.get_referrers(*level):
            if id(ref) in seen or isinstance(ref, types.FrameType):
                continue
            seen.add(id(ref))
            child = next((c for c in level if _refers(ref, c)), None)
            if child is None:
                continue
            held[id(ref)] = child
            found = _root(ref, child, held)
            if found:
                return found
            above.append(ref)
        level = above
    return None


def _refers(ref: Any, child: Any) -> bool:
    return any(r is child for r in gc.get_referents(ref))


def _root(ref: Any, child: Any, held: dict[int, Any]) -> str | None:
    """How `ref`, which holds `child`, names a reference that lives on, or None."""
    if isinstance(ref, dict) and "__builtins__" in ref:  # the globals of a module, a notebook, exec
        return f"the global variable `{_key(ref, child)}`"
    if isinstance(ref, type) and isinstance(child, dict):
        return f"the class attribute `{ref.__qualname__}.{_key(child, held.get(id(child)))}`"
    if isinstance(ref, types.FunctionType):
        if child is ref.__defaults__ or child is ref.__kwdefaults__:
            return f"a default argument of `{ref.__qualname__}`"
        if child is ref.__closure__:
            cell = held.get(id(child))
            names = [n for n, c in zip(ref.__code__.co_freevars, ref.__closure__) if c is cell]
            outer = ref.__qualname__.rsplit(".<locals>.", 1)[0] if ".<locals>." in ref.__qualname__ else None
            return (f"the variable `{names[0] if names else '?'}` of "
                    + (f"`{outer}`, which the functions it defines keep (a closure)" if outer
                       else "an enclosing function"))
    return None


def _key(mapping: dict[str, Any], value: Any) -> str:
    return next((str(k) for k, v in mapping.items() if v is value), "?")


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
        assert s.index is not None  # an input's or output's position
        owner = self.role(s.kind, s.index, len(recording.outputs))
        return f"a view of {owner}" if s.view else owner

    def role(self, kind: str, index: int, n_outputs: int = 1) -> str:
        if kind == "input":
            return f"the input `{self.args[index]}`" if index < len(self.args) else f"input {index}"
        if index < len(self.outputs):
            return f"the output `{self.outputs[index]}`"
        return "the output" if n_outputs == 1 else f"output {index}"

    def _known(self, t: torch.Tensor, args: tuple[Any, ...]) -> str | None:
        for name, compute in self.known.items():
            value = compute(*args)
            if value.shape == t.shape and value.dtype == t.dtype and torch.allclose(value, t.detach()):
                return name
        return None


def describe(s: Saved, recording: Recording, names: Names) -> str:
    """"the output of shape (3,), 24 bytes"."""
    return f"{names.of(s, recording)} of shape {s.shape}, {s.nbytes} bytes"


def summary(recording: Recording, names: Names = Names()) -> str:
    """A few lines: each saved tensor, then anything stashed on ctx or kept elsewhere."""
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
    lines += [
        f"  kept alive elsewhere, invisible to autograd: {k.dtype} of shape {k.shape}, {k.nbytes} bytes"
        + (f", by {k.where}" if k.where else "")
        for k in recording.kept
    ]
    return "\n".join(lines)


def show_saved(fn: Any, *args: Any) -> None:
    """Print what `fn(*args)` saves for backward (for notebooks)."""
    names = Names(args=probe.argument_names(fn))
    with quiet():
        recording = record(fn, *args)
    print(f"{getattr(fn, '__name__', 'fn')}: {summary(recording, names)}")


def non_leaf(args: Sequence[Any]) -> tuple[Any, ...]:
    """Copies of the tensor arguments that are not leaves (an in-place Function cannot
    modify a leaf that requires grad)."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def not_contiguous(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` (which must not require grad) in memory that is not contiguous: the
    layout of a transpose (two dimensions or more), or every other element of a buffer twice
    the size (one dimension)."""
    if t.dim() >= 2:
        return t.mT.clone(memory_format=torch.contiguous_format).mT
    if t.dim() == 1 and t.device.type != "meta":
        strided = t.new_empty(2 * t.numel())[::2]
        return strided.copy_(t)
    return t.clone()  # a copy all the same: one number has no layout


@probe.procedure
def recorded(fn: Any, args: tuple[Any, ...], copy: bool, strided: bool = False) -> dict[str, Any]:
    """Record `fn(*args)` on copies of the arguments (non-leaf ones with `copy`; not
    contiguous with `strided`), then run backward once, and list what the call still keeps
    alive after forward and after backward; plain data, reported by the process that ran
    `fn` (best effort).

    A call found keeping memory at a quick look is made once more, and the second call is
    reported, looked at thoroughly (`Watch.alive`): a cache filled once is not a leak, a
    reference every call leaves behind is."""
    report = _recorded_once(fn, args, copy, strided, thorough=False)
    if report["error"] is None and (report["recording"]["kept"] or report["backward"]["kept"]):
        report = _recorded_once(fn, args, copy, strided, thorough=True)
    return report


def _recorded_once(fn: Any, args: tuple[Any, ...], copy: bool, strided: bool, thorough: bool) -> dict[str, Any]:
    # Copies nobody else holds: what outlives the call is kept by the call.
    layout = not_contiguous if strided else torch.Tensor.clone
    args = tuple(layout(a.detach()).requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                 for a in args)
    if copy:
        args = non_leaf(args)
    watch = Watch()
    try:
        recording = record(fn, *args, watch=watch, thorough=thorough)
    except Exception as exc:  # the student's code may raise anything
        return {"error": asdict(probe.ProbeError.of("forward", exc))}

    def copied(t: torch.Tensor) -> torch.Tensor:  # taken before backward can change it
        return t.detach().clone()

    def snapshot(s: Saved) -> dict[str, Any]:
        return {"tensor": copied(s.tensor), "kind": s.kind, "index": s.index, "view": s.view, "graph": s.graph}

    found = {
        "args": [copied(a) if isinstance(a, torch.Tensor) else a for a in recording.args],
        "before": list(recording.before),
        "outputs": [copied(o) for o in recording.outputs],
        "saved": [snapshot(s) for s in recording.saved],
        "stashed": {path: snapshot(s) for path, s in recording.stashed.items()},
        "function": recording.function,
        "kept": [asdict(k) for k in recording.kept],
    }
    backward = _backward(recording, watch)
    forward_kept = bool(recording.kept)  # then the checks stop there: no need to look hard again
    del recording, args
    after = watch.alive(thorough=thorough and not forward_kept) if backward["error"] is None else []
    backward["kept"] = [asdict(k) for k in after]
    return {"error": None, "recording": found, "backward": backward}


def _backward(recording: Recording, watch: Watch) -> dict[str, Any]:
    """Run backward once (watched): its error, or which saved tensors and whether
    grad_output it changed in place."""
    outputs = [o for o in recording.outputs if o.requires_grad]
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(o.shape, generator=generator, dtype=o.dtype).to(o.device) for o in outputs]
    grads_before = [g.clone() for g in grads]
    saved_before = [s.tensor.detach().clone() for s in recording.saved]
    watch.stage = "backward"
    try:
        with watch:
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
