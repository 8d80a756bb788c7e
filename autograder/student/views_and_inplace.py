"""Notebook 06_views_and_inplace in the student's process: views of a base tensor built from
a recipe (plain data the checks send), and the procedures that run the student's in-place
Function on such views and the student's training step, and report what they did.

What these procedures report is observed in the student's process: best effort.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, Sequence

import torch

from . import probe

# --- Views from a recipe -------------------------------------------------------------------
# A recipe is a sequence of steps, each a list or tuple: ("slice", dim, start, stop, step),
# ("select", dim, index), ("transpose", dim0, dim1), ("permute", *dims), ("diagonal", offset,
# dim1, dim2) or ("expand", *sizes), applied in order to the base.

STEPS = ("slice", "select", "transpose", "permute", "diagonal", "expand")


def view_of(base: torch.Tensor, recipe: Sequence[Sequence[Any]]) -> torch.Tensor:
    """The view of `base` that `recipe` describes (`base` itself for an empty recipe)."""
    view = base
    for step in recipe:
        kind, *numbers = step
        if kind not in STEPS or not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
            raise ValueError(f"not a view step: {step!r}")
        if kind == "slice":
            dim, start, stop, stride = numbers
            view = view[(slice(None),) * dim + (slice(start, stop, stride),)]
        elif kind == "select":
            view = view.select(*numbers)
        elif kind == "transpose":
            view = view.transpose(*numbers)
        elif kind == "permute":
            view = view.permute(*numbers)
        elif kind == "diagonal":
            view = view.diagonal(*numbers)
        else:
            view = view.expand(*numbers)
    return view


def expression(recipe: Sequence[Sequence[Any]], base: str = "base") -> str:
    """The recipe as Python, for messages: `base[:, 1:5]`, `base.transpose(0, 1)`."""
    text = base
    for kind, *numbers in recipe:
        if kind == "slice":
            dim, start, stop, stride = numbers
            text += "[" + ":, " * dim + f"{start}:{stop}" + (f":{stride}" if stride != 1 else "") + "]"
        elif kind == "select":
            dim, index = numbers
            text += "[" + ":, " * dim + f"{index}]"
        else:
            text += f".{kind}({', '.join(map(str, numbers))})"
    return text


# --- Exercise: an in-place Function on views -----------------------------------------------

def _outcome(error: BaseException | None) -> str:
    if error is None:
        return "no error"
    if "modified by an inplace operation" in str(error):
        return "version error"
    return f"{type(error).__name__}: {probe.first_line(error, 300)}"


@probe.procedure
def in_place_report(function: type[torch.autograd.Function], values: torch.Tensor, recipe: list[Any],
                    leaf: bool) -> dict[str, Any]:
    """Apply `function` to the view `recipe` describes of a base holding `values`: with
    `leaf`, the base is a leaf that requires grad, else a non-leaf (`leaf * 1`) that a
    product saved for backward before the call. Reports the call's error, whether the base
    changed and its values after, how far its version counter moved, its grad_fn, what the
    call returned, and whether the earlier product's backward then fails the version check."""
    start = values.detach().clone().requires_grad_()
    base = start if leaf else start * 1
    earlier = None if leaf else (base * base).sum()  # saves base: the version check's witness
    before, version = base.detach().clone(), base._version
    try:
        view = view_of(base, recipe)
        result = function.apply(view)
    except Exception as exc:  # the student's code may raise anything
        return {"error": asdict(probe.ProbeError.of("forward", exc)), "changed": not torch.equal(base.detach(), before)}
    returned = ("the input" if result is view else
                "a view of the input" if isinstance(result, torch.Tensor)
                and result.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
                else "a new tensor" if isinstance(result, torch.Tensor) else type(result).__name__)
    witness = None
    if earlier is not None:
        try:
            torch.autograd.grad(earlier, start)
            witness = _outcome(None)
        except Exception as exc:  # what backward raises is what this reports
            witness = _outcome(exc)
    return {
        "error": None,
        "changed": not torch.equal(base.detach(), before),
        "after": base.detach().clone(),
        "version": base._version - version,
        "grad_fn": None if base.grad_fn is None else type(base.grad_fn).__name__,
        "returned": returned,
        "witness": witness,
    }


@probe.procedure
def on_a_view(function: type[torch.autograd.Function], recipe: list[Any], procedure: str, *args: Any) -> Any:
    """The probe procedure called `procedure` on `x -> the base after function.apply(view)`,
    where the base is a copy of x and the view is `recipe`'s: what a gradient check sees is
    the whole base, whose history the in-place call rewrote."""

    def in_a_view(x: torch.Tensor) -> torch.Tensor:
        base = x.clone()
        function.apply(view_of(base, recipe))
        return base

    return probe.PROCEDURES[procedure](in_a_view, *args)


# --- Exercise: a training step -------------------------------------------------------------

@probe.procedure
def training_report(train_step: Callable[..., Any], weights: list[torch.Tensor], x: torch.Tensor,
                    target: torch.Tensor, mask: torch.Tensor, lr: float, steps: int) -> dict[str, Any]:
    """`train_step(params, x, target, mask, lr)` `steps` times on leaves that require grad
    (copies of `weights`), as an optimizer holds them: what each call returned, and the
    values of those same tensor objects after it."""
    params = [w.detach().clone().requires_grad_() for w in weights]
    held = list(params)  # the step must update these tensors themselves
    losses: list[Any] = []
    after: list[list[torch.Tensor]] = []
    for step in range(steps):
        try:
            loss = train_step(params, x.clone(), target.clone(), mask.clone(), lr)
        except Exception as exc:  # the student's code may raise anything
            return {"losses": losses, "after": after, "error": asdict(probe.ProbeError.of(f"step {step + 1}", exc))}
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            loss = loss.item()
        losses.append(float(loss) if isinstance(loss, (int, float)) and not isinstance(loss, bool)
                      else type(loss).__name__)
        after.append([p.detach().clone() for p in held])
    return {"losses": losses, "after": after, "error": None}
