"""Notebook 07_engine_and_dispatcher in the student's process: the graphs, models and
memory cases the checks hand to student code (built from plain data, so the same graph is
built in the grader's process and in the student's), the engine's order as recorded with
hooks, and the procedures that run the student's answers and report what happened.

What the procedures report besides computed numbers (whether a prediction ran backward,
which parameters had changed when each node started) is observed in the student's process:
best effort.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from . import probe

Node = torch.autograd.graph.Node
LONGEST = 400  # steps of a program, entries of an answer: what a check ever needs


# --- Graphs built from plain data ----------------------------------------------------------

class Twice(torch.autograd.Function):
    """2x as a custom Function: its node, TwiceBackward, is a Python node among C++ ones."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return grad * 2


UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sin": torch.sin, "exp": torch.exp, "tanh": torch.tanh, "neg": torch.neg, "sum": torch.sum,
    "square": lambda x: x * x,  # one node whose two edges lead to the same node
    "twice": lambda x: Twice.apply(x),  # type: ignore[no-untyped-call]
}
BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add, "mul": torch.mul, "sub": torch.sub,
}


@dataclass
class Built:
    """A program's graph: the values of its steps, the root (the last value), and a label
    for every node reachable from the root ("SinBackward0 (step 3)", "AccumulateGrad (leaf 0)")."""

    values: list[torch.Tensor]
    labels: dict[Node, str] = field(default_factory=dict)

    @property
    def root(self) -> torch.Tensor:
        return self.values[-1]


def build(program: Sequence[Sequence[Any]], device: str = "cpu") -> Built:
    """Run a program: each step is ["leaf", requires_grad], [unary, i], [binary, i, j] or
    ["unbind", i] (two values), where i and j index the values made so far; leaves are
    vectors of two float64 numbers. Values of one program are the same in every process."""
    if not 0 < len(program) <= LONGEST:
        raise ValueError("a program has 1 to 400 steps")
    generator = torch.Generator().manual_seed(len(program))
    values: list[torch.Tensor] = []
    made: list[int] = []  # the step of each value
    for k, (op, *operands) in enumerate(program):
        if op == "leaf":
            x = torch.rand(2, generator=generator, dtype=torch.float64).add_(0.5).to(device)
            outputs = [x.requires_grad_(bool(operands[0]))]
        elif op in UNARY:
            outputs = [UNARY[op](values[operands[0]])]
        elif op in BINARY:
            outputs = [BINARY[op](values[operands[0]], values[operands[1]])]
        elif op == "unbind":
            outputs = list(values[operands[0]].unbind(0))
        else:
            raise ValueError(f"unknown step {op!r}")
        values += outputs
        made += [k] * len(outputs)
    built = Built(values)
    leaves = {id(v): made[i] for i, v in enumerate(values) if v.is_leaf}
    for node in reachable(built.root.grad_fn):
        variable = getattr(node, "variable", None)
        if variable is not None:
            built.labels[node] = f"AccumulateGrad (leaf {leaves.get(id(variable), '?')})"
    for i, v in enumerate(values):
        if v.grad_fn is not None and v.grad_fn not in built.labels and v.grad_fn in set(reachable(built.root.grad_fn)):
            built.labels[v.grad_fn] = f"{v.grad_fn.name()} (step {made[i]})"
    return built


def reachable(root: Node | None) -> list[Node]:
    """The nodes reachable from `root` through next_functions, in a fixed order (depth first,
    next functions in order): the same numbering in every process."""
    found: list[Node] = []
    seen: set[Node] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        found.append(node)
        stack.extend(reversed([n for n, _ in node.next_functions]))
    return found


def recorded_order(tensor: torch.Tensor, **backward: Any) -> list[Node]:
    """Run `tensor.backward(**backward)` and return the nodes in the order the engine ran
    them (a pre-hook on every node appends it when the node starts)."""
    ran: list[Node] = []
    handles = [node.register_prehook(lambda grads, node=node: ran.append(node)) for node in reachable(tensor.grad_fn)]
    try:
        tensor.backward(**backward)
    finally:
        for handle in handles:
            handle.remove()
    return ran


def names(nodes: Sequence[Any]) -> list[str]:
    """The names of nodes (`AccumulateGrad` for a leaf's)."""
    return [type(n).__name__ if isinstance(n, Node) else repr(n) for n in nodes]


def _described(item: Any, labels: dict[Node, str]) -> str:
    if isinstance(item, Node):
        return labels.get(item) or f"a node outside the graph ({type(item).__name__})"
    return f"not a node ({type(item).__name__})"


@probe.procedure
def predicted_order(predict: Any, program: list[Any]) -> dict[str, Any]:
    """`predict(root)` on the program's graph, its answer as labels; and whether any node of
    the graph ran while it predicted (best effort: pre-hooks on every node)."""
    built = build(program)
    ran: list[str] = []
    handles = [node.register_prehook(lambda grads, label=label: ran.append(label))
               for node, label in built.labels.items()]
    report: dict[str, Any] = {"order": [], "type": "", "error": None, "ran": False}
    try:
        answer = predict(built.root.grad_fn)
        report["type"] = type(answer).__name__
        if isinstance(answer, (list, tuple)):
            report["order"] = [_described(item, built.labels) for item in list(answer)[:LONGEST]]
    except Exception as exc:  # the student's code may raise anything
        report["error"] = asdict(probe.ProbeError.of("call", exc))
    finally:
        for handle in handles:
            handle.remove()
    report["ran"] = bool(ran)
    return report


# --- The model of the hook exercises --------------------------------------------------------

def model(x: torch.Tensor, w: torch.Tensor, c: torch.Tensor, v: torch.Tensor, dead: torch.Tensor) -> torch.Tensor:
    """A small network: w is used twice; x @ w + c hands one gradient tensor to both of its
    terms (an in-place change of c's gradient reaches x and w); dead gets a zero gradient."""
    h = torch.tanh(x @ w + c)
    return ((h @ w) * v).sum() + (dead * 0.0).sum()


MODEL = probe.reference(f"{__name__}:model", model)


@probe.procedure
def hooks_run(register: Any, net: Callable[..., torch.Tensor], params: list[torch.Tensor],
              grads: list[torch.Tensor | None], inputs: list[torch.Tensor], setting: float,
              device: str) -> dict[str, Any]:
    """`handles = register(params, setting)` on leaves holding `params` (with `.grad` set to
    `grads`), then one backward of `net(x, *params)` for each x of `inputs` (x requires grad),
    then the handles removed and one more backward (with inputs[0]).

    Reports the inputs' gradients, the parameters and their .grad after the backward
    passes and again after the one without hooks, and (best effort) which parameters had
    changed when each node of the first backward started, by node in `reachable` order."""
    leaves = [p.detach().to(device).clone().requires_grad_() for p in params]
    for p, g in zip(leaves, grads):
        p.grad = None if g is None else g.detach().to(device).clone()
    report: dict[str, Any] = {"error": None, "stage": "register", "input_grads": [],
                              "params": [], "grads": [], "params_after": [], "grads_after": [], "changed": []}

    def snapshot(key: str, grads_key: str) -> None:
        report[key] = [p.detach().cpu().clone() for p in leaves]
        report[grads_key] = [None if p.grad is None else p.grad.detach().cpu().clone() for p in leaves]

    try:
        handles = register(leaves, setting)
        for k, x in enumerate(inputs):
            report["stage"] = "backward"
            x = x.detach().to(device).clone().requires_grad_()
            loss = net(x, *leaves)
            hooks = [] if k else _watch_changes(loss, leaves, report["changed"])
            loss.backward()
            for hook in hooks:
                hook.remove()
            report["input_grads"].append(None if x.grad is None else x.grad.detach().cpu().clone())
        snapshot("params", "grads")
        report["stage"] = "remove"
        for handle in handles if isinstance(handles, (list, tuple)) else [handles]:
            handle.remove()
        report["stage"] = "backward after removing the hooks"
        net(inputs[0].detach().to(device).clone(), *leaves).backward()
        snapshot("params_after", "grads_after")
    except Exception as exc:  # the student's code may raise anything
        report["error"] = asdict(probe.ProbeError.of(report["stage"], exc))
    return report


def _watch_changes(loss: torch.Tensor, leaves: list[torch.Tensor], changed: list[Any]) -> list[Any]:
    """Pre-hooks on every node of loss's graph but the AccumulateGrads, each noting [the node's
    `reachable` index, which of `leaves` have changed since now]; their handles."""
    before = [p.detach().clone() for p in leaves]

    def seen(i: int) -> None:
        changed.append([i, [not torch.equal(p.detach(), b) for p, b in zip(leaves, before)]])

    return [n.register_prehook(lambda grads, i=i: seen(i)) for i, n in enumerate(reachable(loss.grad_fn))
            if getattr(n, "variable", None) is None]


# --- Memory cases -----------------------------------------------------------------------------

class NarrowGrad(torch.autograd.Function):
    """The identity, whose backward returns the first half of a block twice its size (a view:
    the whole block stays alive as long as the gradient does)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return x * 1

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return torch.cat([grad, grad])[: grad.shape[0]]


def _case(kind: str, n: int, generator: torch.Generator, device: str) -> torch.Tensor:
    """The loss of a memory case: the graph is built here, outside any meter."""

    def leaf(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(shape, generator=generator, dtype=dtype).to(device).requires_grad_()

    if kind == "mlp":
        x, w1, w2 = leaf(n, 2 * n, dtype=torch.float64), leaf(2 * n, 4 * n, dtype=torch.float64), leaf(4 * n, 3)
        return (torch.tanh(x @ w1) @ w2.double()).sum()
    if kind == "layer_norm":
        x, w = leaf(n, 3 * n), leaf(3 * n)
        return F.layer_norm(x, (3 * n,), w).exp().sum()
    if kind == "narrow":
        y: torch.Tensor = NarrowGrad.apply(leaf(4 * n))  # type: ignore[no-untyped-call]
        return y.sin().sum()
    if kind == "chain":
        y = leaf(2 * n, 4)
        for _ in range(4):
            y = torch.tanh(y) * 1.5
        return y.t().exp().sum()
    raise ValueError(f"unknown memory case {kind!r}")


MEMORY_CASES = ("mlp", "layer_norm", "narrow", "chain")


def memory_case(meter: Callable[[], Any], kind: str, n: int, seed: int, device: str) -> dict[str, Any]:
    """Build the graph of case `kind` (size `n`), run its backward inside `with meter() as m`,
    and report m.log (as [op name, bytes]), m.now (right after backward) and m.peak, and
    the course's own class the meter is or is built on, if any (`course_class`)."""
    if kind not in MEMORY_CASES or not 0 < n <= 64:
        raise ValueError("unknown memory case")
    loss = _case(kind, n, torch.Generator().manual_seed(seed), device)
    mode = meter()
    with mode as m:
        loss.backward()
    now, peak, log = getattr(m, "now", None), getattr(m, "peak", None), getattr(m, "log", None)
    entries = list(log)[: 10 * LONGEST] if isinstance(log, (list, tuple)) else None
    return {
        "course": course_class(mode) or course_class(m),
        "now": now if isinstance(now, int) else repr(now)[:100],
        "peak": peak if isinstance(peak, int) else repr(peak)[:100],
        "log": None if entries is None else [_entry(e) for e in entries],
        "log_type": type(log).__name__,
    }


def _entry(entry: Any) -> list[Any]:
    """A log entry (op, bytes) as [its name, bytes], or what it is instead."""
    if isinstance(entry, (tuple, list)) and len(entry) == 2:
        op, nbytes = entry
        plain = isinstance(nbytes, int) and not isinstance(nbytes, bool)
        return [str(op)[:200], nbytes if plain else repr(nbytes)[:100]]
    return [repr(entry)[:200], None]


def course_class(meter: Any) -> str | None:
    """The first of the course's own classes that `meter`'s class is or derives from (the
    course's memory meters are in this package, for the checks), as module.name; None for
    a class of the student's own."""
    top = __name__.split(".")[0]
    return next((f"{c.__module__}.{c.__qualname__}" for c in type(meter).__mro__
                 if str(getattr(c, "__module__", "")).split(".")[0] == top), None)


@probe.procedure
def memory_run(meter: Any, kind: str, n: int, seed: int, device: str) -> dict[str, Any]:
    """`memory_case` with the student's dispatch mode as the meter; an error as ProbeError."""
    try:
        return memory_case(meter, kind, n, seed, device)
    except Exception as exc:  # the student's code may raise anything
        return {"error": asdict(probe.ProbeError.of("backward", exc))}
