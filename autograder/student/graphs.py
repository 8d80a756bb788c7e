"""Draw autograd graphs inline in notebooks with torchviz, and read them in code.

`draw` wraps `torchviz.make_dot` so that a notebook can rely on it:

- nothing reaches stderr (torchviz 0.0.3 warns about `distutils` on every call);
- without Graphviz's `dot` program, torchviz or the `graphviz` Python package, it shows
  the graph as text and says which to install, instead of raising;
- after a backward has freed the saved tensors it says so (torchviz raises there);
- it writes on each custom Function node what that node saved (torchviz draws those
  tensors as unnamed boxes), keeps leaves light blue when they are also saved (torchviz
  draws the same node twice and the orange wins), and colours the nodes that only exist
  because a gradient was computed with `create_graph=True`.

The returned :class:`Graph` also lists the nodes, so questions about a graph can be
answered, and claims about it checked, in code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import torch

from .report import quiet

BACKWARD_PASS_COLOUR = "plum"  # ours; torchviz draws nodes grey
LEAF_COLOUR = "lightblue"  # torchviz's colour for leaves
INSTALL_DOT = (
    "Graphviz's `dot` program is not installed, so here is the graph as text. To draw it, install "
    "Graphviz (`apt-get install graphviz`; in Colab `!apt-get install -y graphviz`; `brew install "
    "graphviz`; `conda install -c conda-forge graphviz`; Windows: https://graphviz.org/download/) "
    "and restart the kernel."
)
INSTALL_TORCHVIZ = "torchviz is not installed, so the graph is shown as text: `pip install torchviz`."
INSTALL_GRAPHVIZ_PACKAGE = (
    "The `graphviz` Python package (which torchviz draws with) is not installed, so the graph is "
    "shown as text: `pip install graphviz`."
)
FREED = (
    "Cannot draw this graph: a backward pass has already freed its saved tensors. Draw the graph "
    "before calling `.backward()` or `torch.autograd.grad` (or pass `retain_graph=True` to them)."
)


@dataclass
class Node:
    """One node of an autograd graph, as the drawing shows it."""

    name: str  # e.g. "MulBackward0", "SquareBackward", "AccumulateGrad"
    saved: list[str]  # what it saved for backward: tensor names, or "unnamed (shape)"
    leaf: str | None  # for AccumulateGrad: the leaf whose .grad it fills
    backward_pass: bool  # recorded while computing a gradient with create_graph=True
    # The nodes backward goes on to (torch's next_functions); drawn as arrows into this node.
    next_functions: list[str] = field(default_factory=list)
    freed: bool = False  # its saved tensors were freed by a backward pass


@dataclass
class Graph:
    """A drawing of an autograd graph: SVG when Graphviz is available, else text."""

    nodes: list[Node]
    text: str  # the graph as text (always available)
    source: str | None = None  # the DOT source torchviz built (and we touched up)
    svg: str | None = None
    message: str | None = None  # why there is no SVG

    def count(self, name: str) -> int:
        """How many nodes are called `name` (e.g. "AccumulateGrad")."""
        return sum(n.name == name for n in self.nodes)

    def saved_by(self, name: str) -> list[str]:
        """What the node called `name` saved (the first one with that name)."""
        for node in self.nodes:
            if node.name == name:
                return node.saved
        raise KeyError(f"no node is called {name!r}; the nodes are {', '.join(n.name for n in self.nodes)}")

    def backward_pass(self) -> list[str]:
        """Names of the nodes recorded by a backward pass with create_graph=True."""
        return [n.name for n in self.nodes if n.backward_pass]

    def __str__(self) -> str:
        return self.text if self.message is None else f"{self.message}\n{self.text}"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        if self.svg is None:
            return {"text/plain": str(self)}
        return {"image/svg+xml": self.svg, "text/plain": self.text}


def draw(
    outputs: Mapping[str, torch.Tensor],
    grads: Mapping[str, torch.Tensor] | None = None,
    *,
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> Graph:
    """Draw the graph behind the forward `outputs` and the `grads` computed from them.

    `grads` are gradients computed with `create_graph=True`: the nodes reachable only
    from them were recorded by the backward pass and are drawn in plum. `inputs` names
    leaves and other tensors, so saved tensors can be named. Call it before any backward
    frees the saved tensors.
    """
    grads = dict(grads or {})
    names = {**dict(inputs or {}), **dict(outputs), **grads}
    forward_fns = _walk(outputs.values())
    fns = _walk([*outputs.values(), *grads.values()])  # holds them alive: torchviz ids by id()
    nodes = [_node(fn, names, backward_pass=fn not in forward_fns) for fn in fns]
    text = _text(outputs, grads, fns, nodes)
    graph = Graph(nodes, text)
    try:
        import torchviz
    except ImportError as error:  # torchviz itself, or what it imports (the graphviz package)
        graph.message = INSTALL_GRAPHVIZ_PACKAGE if error.name == "graphviz" else INSTALL_TORCHVIZ
        return graph
    if any(n.freed for n in nodes):
        graph.message = FREED
        return graph
    with quiet():  # torchviz's DeprecationWarning must not reach stderr
        dot = torchviz.make_dot((*outputs.values(), *grads.values()), params=names, show_saved=True)
    _touch_up(dot, fns, nodes)
    graph.source = dot.source
    graph.svg, graph.message = _render(dot)
    return graph


def _walk(roots: Iterable[torch.Tensor]) -> list[Any]:
    """The nodes reachable from the roots' grad_fns, depth first, each once."""
    order, seen = [], set()
    stack = [t.grad_fn for t in reversed(list(roots)) if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        order.append(fn)
        stack.extend(next_fn for next_fn, _ in reversed(fn.next_functions) if next_fn is not None)
    return order


def _saved_tensors(fn: Any) -> list[torch.Tensor]:
    """What `fn` saved for backward; raises RuntimeError once a backward freed it."""
    if isinstance(fn, torch.autograd.function.BackwardCFunction):  # a custom Function's node
        return [t for t in fn.saved_tensors if t is not None]
    found = []
    for attr in dir(fn):  # a built-in node: one `_saved_<name>` attribute per saved value
        if attr.startswith("_saved_"):
            value = getattr(fn, attr)
            found += [t for t in (value if isinstance(value, tuple) else (value,)) if isinstance(t, torch.Tensor)]
    return found


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same storage, offset, shape, stride and dtype: the same tensor, even unpacked anew."""
    def key(t: torch.Tensor) -> tuple[Any, ...]:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride(), t.dtype)
    return a is b or (a.device == b.device and a.device.type != "meta" and key(a) == key(b))


def _name_of(t: torch.Tensor, names: Mapping[str, torch.Tensor]) -> str:
    return next((k for k, v in names.items() if _same(t, v)), f"unnamed {tuple(t.shape)}")


def _node(fn: Any, names: Mapping[str, torch.Tensor], *, backward_pass: bool) -> Node:
    leaf = _name_of(fn.variable, names) if hasattr(fn, "variable") else None
    next_functions = [type(n).__name__ for n, _ in fn.next_functions if n is not None]
    try:
        saved = [_name_of(t, names) for t in _saved_tensors(fn)]
    except RuntimeError:  # freed by a backward pass
        return Node(type(fn).__name__, [], leaf, backward_pass, next_functions, freed=True)
    return Node(type(fn).__name__, saved, leaf, backward_pass, next_functions)


def _text(outputs: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor], fns: list[Any],
          nodes: list[Node]) -> str:
    """The graph as an indented tree: each root's grad_fn, then its next functions."""
    index = {fn: i for i, fn in enumerate(fns)}
    lines, shown = [], set()

    def describe(node: Node) -> str:
        parts = [node.name]
        if node.leaf is not None:
            parts.append(f"(fills {node.leaf}.grad)")
        if node.freed:
            parts.append("(saved tensors freed by a backward pass)")
        elif node.saved:
            parts.append("saved: " + ", ".join(node.saved))
        if node.backward_pass:
            parts.append("[recorded by the backward pass]")
        return "  ".join(parts)

    def visit(fn: Any, depth: int) -> None:
        i = index[fn]
        if i in shown:
            lines.append("  " * depth + f"{nodes[i].name} (shown above)")
            return
        shown.add(i)
        lines.append("  " * depth + describe(nodes[i]))
        for next_fn, _ in fn.next_functions:
            if next_fn is not None:
                visit(next_fn, depth + 1)

    for name, t in [*outputs.items(), *grads.items()]:
        if t.grad_fn is None:
            state = "a leaf" if t.requires_grad else "not connected to any graph (grad_fn is None)"
            lines.append(f"{name}: {state}")
            continue
        lines.append(f"{name} <- grad_fn:")
        visit(t.grad_fn, 1)
    return "\n".join(lines)


def _touch_up(dot: Any, fns: list[Any], nodes: list[Node]) -> None:
    """Re-declare nodes after torchviz's own statements: in DOT the later attributes win."""
    for fn, node in zip(fns, nodes):
        label = node.name
        if isinstance(fn, torch.autograd.function.BackwardCFunction):
            label += "\nsaved: " + (", ".join(node.saved) or "nothing")
        attrs = {"label": label}
        if node.backward_pass:
            attrs["fillcolor"] = BACKWARD_PASS_COLOUR
        dot.node(str(id(fn)), **attrs)
        if hasattr(fn, "variable"):  # a leaf that is also saved stays a leaf
            dot.node(str(id(fn.variable)), fillcolor=LEAF_COLOUR)


def _render(dot: Any) -> tuple[str | None, str | None]:
    """(SVG, None), or (None, what to install) when Graphviz's `dot` is missing."""
    import graphviz

    try:
        return dot.pipe(format="svg", encoding="utf-8"), None
    except graphviz.ExecutableNotFound:
        return None, INSTALL_DOT
