"""Notebook 08 (08_memory, 08_memory_checkpointing) in the student's process: meters for
what a graph keeps, the test blocks and graphs the checks hand to student code, and the
procedures that run the student's checkpoint and saved-tensor hooks and report what happened.

- `SavedMemory` (saved-tensor hooks) lists every tensor saved for backward inside a
  `with` block: shape, dtype, bytes, and the memory block (storage) it keeps alive.
- `PeakMemory` (a dispatch mode) counts the bytes of the memory blocks that torch
  operations inside a `with` block create, while they are alive: now and at the peak,
  forward and backward alike.
- `BackwardSteps` (a dispatch mode and a pre-hook on every node of a graph) follows the
  blocks a recomputation makes through a backward, step by step: how much of them is
  alive past the last step that reads it.

The blocks and graphs are plain test functions, not answers to any exercise; they are
registered, so they cross to the student's process by name. What the procedures report
besides computed numbers (bytes, dtypes, whether a generator was left alone) is observed
in the student's process: best effort.
"""
from __future__ import annotations

import contextlib
import inspect
import itertools
import weakref
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import probe
from .saved import Watch, tensors_in


def nbytes(t: torch.Tensor) -> int:
    """Bytes of the elements of `t` (not of the whole memory block under a view)."""
    return t.numel() * t.element_size()


def human(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def _block(t: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of the memory block under `t`; a meta tensor has none: (0, its bytes)."""
    if t.device.type == "meta":
        return 0, nbytes(t)
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


# --- What a graph saves --------------------------------------------------------------------

@dataclass(frozen=True)
class SavedEntry:
    """One tensor saved for backward, and what the hooks kept of it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int  # its elements' bytes
    leaf: bool  # a leaf that requires grad (a parameter, or an input the caller differentiates)
    kept: tuple[tuple[int, int], ...]  # (address, bytes) of the memory blocks of what pack returned

    @property
    def kept_nbytes(self) -> int:
        return sum(n for _, n in self.kept)

    def __str__(self) -> str:
        kept = "" if self.kept_nbytes == self.nbytes else f", kept as {human(self.kept_nbytes)}"
        return (f"{'leaf ' if self.leaf else ''}{str(self.dtype).removeprefix('torch.')} {self.shape}: "
                f"{human(self.nbytes)}{kept}")


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors inside what a pack hook returned (tuples, lists, dicts, objects)."""
    return (t for _, t in tensors_in(value))


class SavedMemory(torch.autograd.graph.saved_tensors_hooks):
    """`with SavedMemory() as saved:` records every tensor saved for backward in the block.

    `saved.count`: how many tensors; `saved.nbytes`: the bytes of the distinct memory blocks
    that the graph keeps alive for them (a tensor saved twice, or an output that the next
    operation saves as its input, counts once). With `through=hooks` (another pair of
    saved-tensor hooks, such as `save_on_cpu()`), tensors are packed by those hooks, and
    `saved.nbytes` counts the memory blocks of what their pack hook returned.
    """

    def __init__(self, through: torch.autograd.graph.saved_tensors_hooks | None = None) -> None:
        self.entries: list[SavedEntry] = []
        inner_pack = through.pack_hook if through is not None else (lambda t: t)
        inner_unpack = through.unpack_hook if through is not None else (lambda t: t)

        def pack(t: torch.Tensor) -> Any:
            packed = inner_pack(t)
            kept = tuple(_block(p) for p in _tensors_in(packed))
            self.entries.append(SavedEntry(tuple(t.shape), t.dtype, nbytes(t), t.is_leaf and t.requires_grad, kept))
            return packed

        super().__init__(pack, inner_unpack)

    def __enter__(self) -> "SavedMemory":  # type: ignore[override]  # torch's gives None; this, the recorder
        super().__enter__()
        return self

    @property
    def count(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        blocks: dict[int, int] = {}
        meta = 0  # meta tensors have no address: each counts
        for entry in self.entries:
            for address, n in entry.kept:
                if address == 0:
                    meta += n
                else:
                    blocks[address] = n
        return sum(blocks.values()) + meta

    def __str__(self) -> str:
        lines = [f"{self.count} tensor{'s' * (self.count != 1)} saved, keeping {human(self.nbytes)} alive"]
        lines += [f"  {e}" for e in self.entries]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


# --- Live and peak memory ------------------------------------------------------------------

class PeakMemory(Watch):
    """`with PeakMemory() as mem:` counts the memory blocks torch operations create in the
    block (on any device but meta) while they are alive: `mem.now` and `mem.peak`, in bytes.

    Tensors created before the block, and views of them, are not counted; a block created
    in it is counted until it is freed, also after the `with` ends. CPU only needs no
    allocator statistics: each block is watched through a weak reference.
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.peak = 0

    def created(self, nbytes: int) -> None:
        self.now += nbytes
        self.peak = max(self.peak, self.now)

    def freed(self, nbytes: int) -> None:
        self.now -= nbytes


class BackwardSteps(TorchDispatchMode):
    """`with steps.watching(output):` around a backward from `output`: each step of it (a
    node of `output`'s graph, which autograd lets go of before the next) is numbered; the
    memory blocks torch operations make while `with steps.recomputing():` is on are
    followed (weak references) and, outside it, which step last read each. `held()` is
    then the most bytes of those blocks alive at the start of a step that no step from it
    on reads: what a recomputation kept past its use."""

    MAX_NODES = 10_000  # a graph larger than this is followed that far

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's is unannotated
        self.step = 0
        self._recomputing = False
        self._serials = itertools.count()
        self._made: dict[int, tuple[int, int, weakref.ref[Any]]] = {}  # address -> (serial, bytes, the block)
        self._read: dict[int, int] = {}  # serial -> the last step that read it
        self._starts: list[tuple[int, list[tuple[int, int]]]] = []  # (step, (serial, bytes) alive at its start)

    @contextlib.contextmanager
    def recomputing(self) -> Iterator[None]:
        self._recomputing = True
        try:
            yield
        finally:
            self._recomputing = False

    @contextlib.contextmanager
    def watching(self, output: Any) -> Iterator[None]:
        handles = [node.register_prehook(self._start) for node in _nodes(getattr(output, "grad_fn", None),
                                                                          self.MAX_NODES)]
        try:
            with self:
                yield
        finally:
            for handle in handles:
                handle.remove()

    def _start(self, grad_outputs: Any) -> None:
        self.step += 1
        self._starts.append((self.step, [(serial, n) for serial, n, _ in self._made.values()]))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        given = {_block(t)[0] for t in _flat((args, kwargs)) if t.device.type != "meta"}
        if self._recomputing:
            for t in _flat(out):
                address, n = _block(t)
                if t.device.type != "meta" and n and address not in given and address not in self._made:
                    self._follow(t.untyped_storage(), address, n)
        else:
            for address in given & self._made.keys():
                self._read[self._made[address][0]] = self.step
        return out

    def _follow(self, storage: Any, address: int, n: int) -> None:
        def gone(_: Any) -> None:
            self._made.pop(address, None)

        self._made[address] = (next(self._serials), n, weakref.ref(storage, gone))

    def held(self) -> tuple[int, int]:
        """(bytes, needed): at the start of the step where most bytes of recomputed blocks
        were alive that no step from it on read, those bytes, and the bytes of those the
        steps to come did read."""
        worst = (0, 0)
        for step, alive in self._starts:
            needless = sum(n for serial, n in alive if self._read.get(serial, 0) < step)
            worst = max(worst, (needless, sum(n for _, n in alive) - needless))
        return worst


def _flat(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _nodes(root: Any, limit: int) -> list[Any]:
    """The nodes of the graph under `root`, at most `limit` of them."""
    found: list[Any] = []
    todo, seen = [root], set()
    while todo and len(found) < limit:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        found.append(node)
        todo.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
    return found


# --- Blocks for the checkpoint exercise ----------------------------------------------------

def residual_tanh(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """x + tanh(x @ w1) @ w2: a residual block without randomness."""
    return x + torch.tanh(x @ w1) @ w2


def residual_dropout(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """x + dropout(tanh(x @ w1), p=0.5) @ w2: a residual block that draws random numbers."""
    return x + F.dropout(torch.tanh(x @ w1), p=0.5, training=True) @ w2


def scaled_sin(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """sin(x * s) * s: one that is not a residual block (another number of inputs)."""
    return torch.sin(x * s) * s


for _block_fn in (residual_tanh, residual_dropout, scaled_sin):
    probe.reference(f"{__name__}:{_block_fn.__name__}", _block_fn)


def _cuda_devices(args: Any) -> list[int]:
    return sorted({a.device.index or 0 for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor) and a.is_cuda})


def _generator_states(devices: list[int]) -> list[torch.Tensor]:
    return [torch.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in devices)]


@probe.procedure
def checkpoint_run(function: Any, block: Callable[..., torch.Tensor], args: tuple[Any, ...], grad_output: torch.Tensor,
                   seed: int) -> dict[str, Any]:
    """Seed the generators with `seed`, apply `function(block, *args)`, draw one random number
    (as another layer would between forward and backward), then backward with `grad_output`.

    Reports the output, the gradients of the arguments that require grad, whether backward
    left the generators as it found them, how often `block` ran, and what a run of it in
    backward kept past its use (`BackwardSteps.held`: "held", "needed"); the caller's
    generators are restored afterwards."""
    calls = [0]
    steps = BackwardSteps()

    def counted(*inputs: Any) -> torch.Tensor:
        calls[0] += 1
        with steps.recomputing() if calls[0] > 1 else contextlib.nullcontext():
            return block(*inputs)

    devices = _cuda_devices(args)
    report: dict[str, Any]
    stage, report = "forward", {"output": None, "grads": [], "generator_kept": True, "calls": 0, "held": 0, "needed": 0,
                                "error": None}
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        try:
            output = probe.as_callable(function)(counted, *args)
            report["output"] = output.detach() if isinstance(output, torch.Tensor) else None
            stage = "backward"
            for d in devices:
                torch.rand(1, device=f"cuda:{d}")
            torch.rand(1)
            before = _generator_states(devices)
            wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            with steps.watching(output):
                grads = torch.autograd.grad(output, wrt, grad_output, allow_unused=True)
            report["grads"] = [None if g is None else g.detach() for g in grads]
            report["held"], report["needed"] = steps.held()
            report["generator_kept"] = all(torch.equal(a, b) for a, b in zip(before, _generator_states(devices)))
        except Exception as exc:  # the student's code may raise anything
            report["error"] = asdict(probe.ProbeError.of(stage, exc))
    report["calls"] = calls[0]
    return report


# --- Graphs for the saved-tensor hooks exercise --------------------------------------------

def hooks_graph(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, index: torch.Tensor,
                keep: torch.Tensor) -> torch.Tensor:
    """A small network whose backward needs float activations, parameters, a bool mask
    (masked_fill) and int64 indices (gather)."""
    h = torch.tanh(x @ w1 + b1)
    h = h.masked_fill(~keep, 0.0)
    z = h @ w2
    return (z.gather(1, index) ** 2).sum()


HOOKS_GRAPH = probe.reference(f"{__name__}:hooks_graph", hooks_graph)


def _describe_packed(packed: Any) -> list[dict[str, Any]]:
    return [{"dtype": str(p.dtype).removeprefix("torch."), "nbytes": nbytes(p), "shape": list(p.shape)}
            for p in _tensors_in(packed)]


@probe.procedure
def hooks_run(hooks_class: Any, graph: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> dict[str, Any]:
    """`graph(*args)` under the pack and unpack hooks of `hooks_class()`, then backward.

    For every saved tensor: its dtype, shape, device and bytes, whether it is a parameter
    (a leaf that requires grad), what pack kept (tensors, and whether one of them is the
    saved tensor's own memory), and what unpack gave back (dtype, shape, device, and whether
    its values are the saved ones: exactly, or the largest relative difference). Then the
    gradients of the arguments that require grad."""
    report: dict[str, Any] = {"error": None, "saved": [], "grads": []}
    stage = "create"
    try:
        hooks = hooks_class()
        pack, unpack = hooks.pack_hook, hooks.unpack_hook
    except Exception as exc:  # the student's code may raise anything
        report["error"] = asdict(probe.ProbeError.of(stage, exc))
        return report
    saved: list[dict[str, Any]] = report["saved"]

    def wrapped_pack(t: torch.Tensor) -> Any:
        nonlocal stage
        stage = "pack"
        meta = t.device.type == "meta"
        record = {
            "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "device": t.device.type,
            "nbytes": nbytes(t), "parameter": bool(t.is_leaf and t.requires_grad),
        }
        packed = pack(t)
        inside = list(_tensors_in(packed))
        record["packed"] = _describe_packed(packed)
        # (a meta tensor has no memory to compare: only the tensor itself counts as its own memory)
        record["own_memory"] = any(p is t or (not meta and _block(p)[0] == _block(t)[0]) for p in inside)
        record["unpacked"] = None
        saved.append(record)
        return (len(saved) - 1, t, packed)

    def wrapped_unpack(stored: Any) -> Any:
        nonlocal stage
        stage = "unpack"
        i, t, packed = stored
        u = unpack(packed)
        record: dict[str, Any] = {"type": type(u).__name__}
        if isinstance(u, torch.Tensor):
            record.update(dtype=str(u.dtype).removeprefix("torch."), shape=list(u.shape), device=u.device.type)
            if t.device.type != "meta" and u.device == t.device and u.shape == t.shape:
                if t.is_floating_point() and u.is_floating_point():
                    scale = float(t.detach().abs().max()) if t.numel() else 0.0
                    diff = float((u.detach().to(t.dtype) - t.detach()).abs().max()) if t.numel() else 0.0
                    record["equal"] = diff == 0
                    record["difference"] = diff / scale if scale > 0 else diff
                else:
                    record["equal"] = bool(torch.equal(u.detach(), t.detach()))
        saved[i]["unpacked"] = record
        stage = "backward"
        return u

    try:
        with torch.autograd.graph.saved_tensors_hooks(wrapped_pack, wrapped_unpack):
            stage = "forward"
            loss = graph(*args)
        stage = "backward"
        wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        report["grads"] = [None if g is None else g.detach() for g in grads]
    except Exception as exc:  # the student's code may raise anything
        report["error"] = asdict(probe.ProbeError.of(stage, exc))
    return report


@probe.procedure
def with_block(function: Any, block: Callable[..., torch.Tensor], procedure: str, *args: Any) -> Any:
    """The probe procedure called `procedure` on `function.apply(block, *inputs)`, a function
    of the block's tensor inputs (with the block's parameter names)."""
    if procedure not in probe.PROCEDURES:
        raise ValueError(f"not a probe procedure: {procedure!r}")
    call = probe.as_callable(function)

    def checkpointed(*inputs: Any) -> Any:
        return call(block, *inputs)

    checkpointed.__signature__ = inspect.signature(block)  # type: ignore[attr-defined]
    return probe.PROCEDURES[procedure](checkpointed, *args)
