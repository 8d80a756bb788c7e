"""Notebook 04_gradient_patterns in the student's process: calling the student's
unbroadcast, and the course's stand-in for it while Affine is graded."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from . import probe

# Stands in for the notebook's unbroadcast while Affine is graded (exercise 4.3 grades
# the student's own): torch's sum_to_size.
sum_to_size = probe.reference(f"{__name__}:sum_to_size", lambda grad, shape: grad.sum_to_size(tuple(shape)))


@probe.procedure
def run_unbroadcast(student: Any, grad: torch.Tensor, shape: tuple[Any, ...], as_size: bool) -> dict[str, Any]:
    """Call the student's unbroadcast (with `shape` as a torch.Size if `as_size`, as in a
    backward). Whether it changed grad is reported by the student's process: best effort."""
    before = None if grad.device.type == "meta" else grad.clone()
    try:
        got = student(grad, torch.Size(shape) if as_size else shape)
    except Exception as exc:  # the student's code may raise anything
        error = probe.ProbeError.of("call", exc)
        return {"returned": None, "modified": False, "error": asdict(error)}
    returned = got if isinstance(got, torch.Tensor) else type(got).__name__
    return {"returned": returned, "modified": before is not None and not torch.equal(grad, before), "error": None}


# --- Pictures for the notebook (fixed examples: x (3, 4) + b (4,) + c (3, 1)) ---------------

PRELOAD = ("matplotlib.pyplot",)  # what the pictures import when drawn: a grading worker imports it once

_SUBSCRIPTS = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
_B, _C, _X, _G = "#f6c89f", "#a9d18e", "#d9d9d9", "#cfe2f3"


def _sub(text: str) -> str:
    return text.translate(_SUBSCRIPTS)


def _grid(ax: Any, x0: float, y0: float, labels: list[list[str]], title: str, color: str,
          copies: Any = lambda i, j: False, width: float = 1.0) -> None:
    """One box per entry of a 2-d shape, its top left corner at (x0, y0); dashed boxes are
    the same value seen again."""
    from matplotlib.patches import Rectangle

    for i, row in enumerate(labels):
        for j, label in enumerate(row):
            copy = copies(i, j)
            ax.add_patch(Rectangle((x0 + j * width, y0 - i - 1), width, 1, facecolor=color, alpha=0.3 if copy else 0.9,
                                   edgecolor="#555555", linestyle=(0, (3, 2)) if copy else "-", linewidth=1))
            ax.text(x0 + (j + 0.5) * width, y0 - i - 0.5, label, ha="center", va="center", fontsize=8.5,
                    color="#888888" if copy else "black")
    ax.text(x0 + len(labels[0]) * width / 2, y0 + 0.3, title, ha="center", va="bottom", fontsize=9.5)


def _arrow(ax: Any, start: tuple[Any, ...], end: tuple[Any, ...], text: str = "", below: bool = False) -> None:
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color="#333333"))
    y = (start[1] + end[1]) / 2 + (-0.35 if below else 0.25)
    ax.text((start[0] + end[0]) / 2, y, text, ha="center", va="top" if below else "bottom", fontsize=8.5)


def _figure(width: float, height: float) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    ax.axis("off")
    ax.set_aspect("equal")
    return fig, ax


def show_broadcasting() -> None:
    """Draw how x (3, 4) + b (4,) + c (3, 1) broadcasts b and c to (3, 4)."""
    import matplotlib.pyplot as plt

    fig, ax = _figure(12, 4.2)
    _grid(ax, 0, 5, [[_sub(f"b{j}") for j in range(4)]], "b: (4,)", _B)
    _arrow(ax, (4.3, 4.5), (7.2, 4.5), "prepend a dim")
    _grid(ax, 7.5, 5, [[_sub(f"b{j}") for j in range(4)]], "(1, 4)", _B)
    _arrow(ax, (11.8, 4.5), (14.7, 4.5), "expand dim 0")
    _grid(ax, 15, 5, [[_sub(f"b{j}") for j in range(4)] for _ in range(3)], "(3, 4)", _B, copies=lambda i, j: i > 0)
    _grid(ax, 0, -0.5, [[_sub(f"c{i}")] for i in range(3)], "c: (3, 1)", _C)
    _arrow(ax, (1.3, -2.0), (14.7, -2.0), "expand dim 1 (of size 1) to 4")
    _grid(ax, 15, -0.5, [[_sub(f"c{i}")] * 4 for i in range(3)], "(3, 4)", _C, copies=lambda i, j: j > 0)
    ax.text(17, -4.2, "dashed: the same value again, not a copy in memory", ha="center", fontsize=8.5, color="#444444")
    _arrow(ax, (19.3, 3.5), (21.8, 2.3))
    _arrow(ax, (19.3, -2.0), (21.8, -0.3))
    _grid(ax, 22, 2.4, [[_sub(f"x{i}{j}+b{j}+c{i}") for j in range(4)] for i in range(3)], "x + b + c, x: (3, 4)",
          _X, width=2.3)
    ax.set_xlim(-0.3, 31.5)
    ax.set_ylim(-4.8, 5.9)
    plt.show()


def show_unbroadcasting() -> None:
    """Draw how the gradient of x + b + c (shape (3, 4)) is summed back to b (4,) and c (3, 1)."""
    import matplotlib.pyplot as plt

    fig, ax = _figure(12, 4.2)
    _grid(ax, 0, 2.4, [[_sub(f"g{i}{j}") for j in range(4)] for i in range(3)], "grad_output g: (3, 4)", _G, width=1.2)
    _arrow(ax, (5.1, 1.5), (8.7, 4.0))
    _arrow(ax, (5.1, 0.0), (8.7, -1.8))
    ax.text(6.1, 3.5, "for b", fontsize=8.5, ha="center")
    ax.text(6.1, -1.7, "for c", fontsize=8.5, ha="center")
    _grid(ax, 9, 5, [[_sub(f"Σᵢgᵢ{j}") for j in range(4)]], "sum dim 0, keepdim: (1, 4)", _B, width=1.6)
    _arrow(ax, (16.0, 4.5), (19.2, 4.5), "drop the prepended dim", below=True)
    _grid(ax, 19.5, 5, [[_sub(f"Σᵢgᵢ{j}") for j in range(4)]], "b's gradient: (4,)", _B, width=1.6)
    _grid(ax, 9, -0.5, [[_sub(f"Σⱼg{i}ⱼ")] for i in range(3)], "sum dim 1, keepdim: (3, 1)", _C, width=1.6)
    ax.text(11.2, -2.0, "c's gradient: dim 1 stays, with size 1", fontsize=8.5, va="center")
    ax.text(13, -4.3, "each input gets the sum of the gradients at every position its values were seen",
            ha="center", fontsize=8.5, color="#444444")
    ax.set_xlim(-0.3, 26.5)
    ax.set_ylim(-4.8, 5.9)
    plt.show()
