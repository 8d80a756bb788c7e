"""Draw the tape of notebooks 01 and 02 as a graph, with values and gradients (in the manner
of micrograd's `draw_dot`).

`draw_tape(gradient_tape, variables, grads)` draws a box per Variable (its name, its value
and, when given, its gradient) and an oval per tape entry (its operation), with arrows from
the inputs of each entry to it and from it to its outputs. Entries a backward pass recorded
(`backward_from=`) are shaded plum; Variables that no entry computed are the inputs (light
blue) — or, when named in `highlight`, values that escaped the tape (red).

It renders as SVG wherever Jupyter shows rich output (JupyterLab, Colab, the notebooks the
grader writes) when Graphviz's `dot` program and the `graphviz` package are there, and as
text otherwise (saying what to install). It only reads the entries' `op`, `inputs` and
`outputs` and the Variables' `name` and `value`: any tape of that form will do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch

from .graphs import BACKWARD_PASS_COLOUR, INSTALL_DOT, LEAF_COLOUR

INSTALL_GRAPHVIZ_PACKAGE = (
    "The `graphviz` Python package is not installed, so here is the tape as text: `pip install graphviz`."
)
ESCAPED_COLOUR = "#f4a6a6"
OP_COLOUR = "white"


@dataclass
class TapeDrawing:
    """A drawing of a tape: SVG when Graphviz is available, and always as text."""

    text: str
    source: str  # the DOT source
    svg: str | None = None
    message: str | None = None  # why there is no SVG

    def __str__(self) -> str:
        return self.text if self.message is None else f"{self.message}\n{self.text}"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        if self.svg is None:
            return {"text/plain": str(self)}
        return {"image/svg+xml": self.svg, "text/plain": self.text}


def _number(x: float) -> str:
    return f"{x:.3g}"


def brief(value: Any, limit: int = 4) -> str:
    """A tensor in a few characters: 0.36, [0.36 0.99 0.88 0.54], [[1 2] [3 4]], or its shape."""
    if value is None:
        return "None"
    value = getattr(value, "value", value)  # a Variable's tensor
    if not isinstance(value, torch.Tensor):
        return str(value)
    t = value.detach().cpu()
    if t.is_complex() or t.device.type == "meta":
        return f"shape {tuple(t.shape)}"
    t = t.to(torch.float64)
    if t.dim() == 0:
        return _number(t.item())
    if t.dim() == 1 and t.numel() <= limit:
        return "[" + " ".join(map(_number, t.tolist())) + "]"
    if t.dim() == 2 and t.shape[0] <= 3 and t.shape[1] <= 3:
        return "[" + " ".join("[" + " ".join(map(_number, row)) + "]" for row in t.tolist()) + "]"
    return f"shape {tuple(t.shape)}"


def _name(v: Any) -> str:
    return str(getattr(v, "name", v))


def _grads(variables: Sequence[Any], grads: Any) -> dict[str, Any]:
    """{name: gradient} from a mapping (keys: Variables or names) or a list aligned with
    `variables` (as `grad(L, variables)` returns it)."""
    if grads is None:
        return {}
    if isinstance(grads, Mapping):
        return {_name(k): g for k, g in grads.items()}
    grads = list(grads)
    if len(grads) != len(variables):
        raise ValueError("grads: give a dict {variable: gradient}, or one gradient per variable")
    return {_name(v): g for v, g in zip(variables, grads)}


def _field(text: str) -> str:
    """Text for a field of a record node (its special characters escaped)."""
    for c in "\\{}|<>\"":
        text = text.replace(c, "\\" + c)
    return text


def draw_tape(
    entries: Iterable[Any],
    variables: Iterable[Any] = (),
    grads: Mapping[Any, Any] | Sequence[Any] | None = None,
    *,
    backward_from: int | None = None,
    highlight: Iterable[str] = (),
    order: Sequence[Any] | None = None,
    title: str | None = None,
) -> TapeDrawing:
    """Draw `entries` (e.g. `gradient_tape`) with the values of `variables` and their `grads`.

    `grads`: {variable or name: gradient}, or one gradient per variable. `backward_from`:
    the index of the first entry a backward pass recorded (`len(gradient_tape)` before
    calling grad). `highlight`: names of Variables to mark as escaped (no entry computed
    them, yet they are no input). `order`: entries numbered by their position in it (a
    topological order).
    """
    entries = list(entries)
    variables = list(variables)
    values = {_name(v): v for v in variables}
    gradients = _grads(variables, grads)
    for g in gradients.values():  # a gradient that is a Variable is a value of the backward pass
        if hasattr(g, "name") and hasattr(g, "value"):
            values.setdefault(_name(g), g)
    marked = set(highlight)
    position = {id(e): k for k, e in enumerate(order)} if order is not None else {}
    produced = {name for e in entries for name in e.outputs}
    names: list[str] = []  # every Variable, in order of appearance
    for e in entries:
        for name in (*e.inputs, *e.outputs):
            if name not in names:
                names.append(name)
    for name in values:
        if name not in names:
            names.append(name)
    backward = {id(e) for k, e in enumerate(entries) if backward_from is not None and k >= backward_from}
    made_by_backward = {name for e in entries if id(e) in backward for name in e.outputs}

    def fields(name: str) -> list[str]:
        found = [name]
        if name in values:
            found.append(f"value {brief(values[name])}")
        if name in gradients:
            found.append(f"grad {brief(gradients[name])}")
        if name in marked:
            found.append("escaped: no entry computed it")
        return found

    # DOT source
    lines = ["digraph tape {", '  graph [rankdir=LR, fontname="Helvetica", fontsize=12];',
             '  node [fontname="Helvetica", fontsize=11];', '  edge [color="#555555"];']
    if title:
        lines.append(f'  labelloc=t; label="{_field(title)}";')
    ids = {name: f"v{i}" for i, name in enumerate(names)}
    for name in names:
        colour = "white"
        if name in marked:
            colour = ESCAPED_COLOUR
        elif name in made_by_backward:
            colour = BACKWARD_PASS_COLOUR
        elif name not in produced:
            colour = LEAF_COLOUR
        label = "{ " + " | ".join(_field(f) for f in fields(name)) + " }"
        lines.append(f'  {ids[name]} [shape=record, style=filled, fillcolor="{colour}", label="{label}"];')
    for k, e in enumerate(entries):
        op = str(e.op)
        label = f"#{position[id(e)]} {op}" if id(e) in position else op
        colour = BACKWARD_PASS_COLOUR if id(e) in backward else OP_COLOUR
        lines.append(f'  e{k} [shape=ellipse, style=filled, fillcolor="{colour}", label="{_field(label)}"];')
        for name in e.inputs:
            lines.append(f"  {ids[name]} -> e{k};")
        for name in e.outputs:
            lines.append(f"  e{k} -> {ids[name]};")
    lines.append("}")
    source = "\n".join(lines)

    # text
    text_lines = [title] if title else []
    for e in entries:
        tag = "  [backward]" if id(e) in backward else ""
        number = f"#{position[id(e)]} " if id(e) in position else ""
        text_lines.append(f"{number}{', '.join(e.outputs)} = {e.op}({', '.join(e.inputs)}){tag}")
    described = [n for n in names if n in values or n in gradients or n in marked]
    if described:
        text_lines.append("values:")
        for name in described:
            text_lines.append("  " + ", ".join(fields(name)))
    drawing = TapeDrawing("\n".join(text_lines), source)
    drawing.svg, drawing.message = _render(source)
    return drawing


def _render(source: str) -> tuple[str | None, str | None]:
    """(SVG, None), or (None, what to install)."""
    try:
        import graphviz
    except ImportError:
        return None, INSTALL_GRAPHVIZ_PACKAGE
    try:
        return graphviz.Source(source).pipe(format="svg", encoding="utf-8"), None
    except graphviz.ExecutableNotFound:
        return None, INSTALL_DOT
