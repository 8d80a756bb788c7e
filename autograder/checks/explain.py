"""Turn what went wrong into words a student can act on."""
from __future__ import annotations

import re
from typing import Sequence

import torch

from ..student.report import hiding, show, unravel

NOT_IMPLEMENTED = "not implemented yet: replace `raise NotImplementedError()` with your code"


def error(
    stage: str, kind: str, message: str, arg_names: Sequence[str],
    arg_shapes: Sequence[tuple[int, ...] | None] | None = None,
) -> tuple[str, str | None]:
    """(what happened, likely cause) for an exception raised while running a Function;
    `arg_shapes` (None for a non-tensor) lets it tell gradients returned in the wrong order."""
    first_line = message.strip().splitlines()[0].rstrip(".!") if message.strip() else kind

    def name(i: int) -> str:
        return f"`{arg_names[i]}`" if i < len(arg_names) else f"argument {i}"

    if kind == "NotImplementedError":
        return f"{stage} raised NotImplementedError", NOT_IMPLEMENTED
    m = re.search(r"backward\(\) takes (\d+) positional arguments? but (\d+) were given", message)
    if m:
        return (
            f"backward takes {int(m[1]) - 1} gradient(s), but forward has {int(m[2]) - 1} output(s)",
            "backward receives one gradient per output of forward, non-differentiable outputs "
            "included: backward(ctx, grad_out1, grad_out2, ...).",
        )
    m = re.search(r"incorrect number of gradients \(expected (\d+), got (\d+)\)", message)
    if m:
        expected, got = int(m[1]), int(m[2])
        names = ", ".join(f"`{n}`" for n in arg_names) or f"{expected} inputs"
        return (
            f"backward returned {got} gradient(s), but forward takes {expected} input(s) ({names})",
            "backward must return exactly one gradient per forward input, in order, "
            "with None for inputs that are not tensors (or need no gradient).",
        )
    m = re.search(r"gradient different than None at position (\d+)", message)
    if m:
        i = int(m[1]) - 1
        return (
            f"backward returned a gradient for {name(i)}, which is not a tensor",
            f"no None returned for the non-tensor argument {name(i)}: "
            "its gradient must be None.",
        )
    m = re.search(r"invalid gradient at index (\d+) - got \[(.*?)\] but expected shape compatible with \[(.*?)\]",
                  message)
    if m:
        i, got, want = int(m[1]), _dims(m[2]), _dims(m[3])
        owners = [j for j, s in enumerate(arg_shapes or ()) if s is not None and tuple(s) == got and j != i]
        if owners:
            return (
                f"the gradient for {name(i)} has shape {got}, the shape of {name(owners[0])}",
                "backward returns the gradients in the wrong order: one per input of forward, "
                f"in the order of forward's arguments ({', '.join(name(j) for j in range(len(arg_shapes or ())))}).",
            )
        return (
            f"the gradient for {name(i)} has shape {got} but {name(i)} has shape {want}",
            shape_cause(got, want),
        )
    m = re.search(r"save_for_backward can only save variables, but argument (\d+) is of type (\w+)", message)
    if m:
        return (
            f"{stage} passed a {m[2]} to `ctx.save_for_backward` (its argument {m[1]})",
            "save_for_backward takes tensors (and None) only. Keep numbers, shapes and flags as "
            "attributes of ctx: `ctx.clip = clip`.",
        )
    if "more than one element of the written-to tensor refers to a single memory location" in message:
        return (
            f"{stage} modified an expanded tensor in place (most likely grad_output)",
            "grad_output belongs to autograd, and it may be expanded: one value in memory seen at every "
            "position (as `y.sum().backward()` passes it). Compute a new tensor (`grad_output * mask`), "
            "or clone grad_output before changing it.",
        )
    if "view size is not compatible with input tensor's size and stride" in message:
        return (
            f"{stage} called `.view` on a tensor that is not contiguous",
            "`.view` needs contiguous memory, and autograd may pass a grad_output that is not contiguous "
            "(after a transpose or a slice) or expanded. Use `.reshape(...)`, which copies only when it must.",
        )
    if "NoneType" in message and stage in ("backward", "double backward"):
        return (
            f"{stage} raised {kind}: {first_line}",
            "backward received None as a gradient: after `ctx.set_materialize_grads(False)`, the gradient of "
            "an output that was not used arrives as None. Skip the terms that need it "
            "(`if grad_y is not None: ...`) instead of computing with it.",
        )
    if "leaf Variable that requires grad" in message and stage in ("backward", "double backward"):
        return (
            f"{stage} modified in place a tensor it does not own (grad_output, or a saved input)",
            "compute a new tensor instead: grad_output and the saved inputs belong to autograd and to the caller.",
        )
    if "is not on the expected device" in message or "expected device" in message:
        return (
            f"{stage} mixes devices: {first_line}",
            "a tensor is created without `device=`: build new tensors with "
            "`torch.zeros_like(x)` / `x.new_zeros(...)` or pass `device=x.device`.",
        )
    if re.search(r"same dtype|expected scalar type|Found dtype \w+ but expected", message):
        return (
            f"{stage} mixes dtypes: {first_line}",
            "a step computes in another dtype than the inputs' (a `.double()`, a tensor or constant made without "
            "`dtype=`) and meets a tensor of the inputs' dtype: keep every step in the inputs' dtype "
            "(`torch.zeros_like(x)`, `dtype=x.dtype`); given float32, compute in float32.",
        )
    if "modified by an inplace operation" in message:
        return (
            f"{stage} failed: a tensor saved for backward was modified in place",
            "something changed a saved tensor after `save_for_backward`: clone before "
            "modifying it, or call `ctx.mark_dirty` for an input your forward modifies.",
        )
    if "leaf Variable that requires grad" in message:
        return (
            f"{stage} modifies a leaf tensor that requires grad in place",
            "in-place Functions cannot modify a leaf that requires grad; apply them to a non-leaf.",
        )
    if "does not require grad and does not have a grad_fn" in message and stage == "forward":
        return (
            "the output of forward is not connected to autograd",
            "did forward return a detached tensor or something computed outside torch?",
        )
    if "marked with @once_differentiable" in message:
        return (
            f"{stage} failed: the backward is marked @once_differentiable",
            "a backward marked @once_differentiable cannot be differentiated again; remove the "
            "decorator and compute the gradient with differentiable torch operations.",
        )
    if "Trying to backward through the graph a second time" in message:
        return (
            f"{stage} failed: the saved tensors were already freed",
            "backward reads saved tensors that autograd freed after the first backward; "
            "save them with `ctx.save_for_backward` (not on ctx) and do not call backward twice.",
        )
    return f"{stage} raised {kind}: {first_line}", None


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.replace(" ", "").split(",") if d)


def shape_cause(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """Why a gradient could have the wrong shape."""
    if _broadcasts(want, got):
        return (
            f"gradient of shape {got} for an input of shape {want}: the input was broadcast "
            "in forward, so sum the gradient over the broadcast dimensions."
        )
    if sorted(got) == sorted(want):
        return "the dimensions are swapped: check the transposes in your gradient formula."
    return "a gradient must have exactly the shape of its input."


def _broadcasts(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    if small == big or len(small) > len(big):
        return False
    padded = (1,) * (len(big) - len(small)) + small
    return all(s in (1, b) for s, b in zip(padded, big))


def mismatch(expected: torch.Tensor, actual: torch.Tensor, *, rtol: float, atol: float) -> str:
    """Where two tensors of the same shape first differ, and how many entries differ (the two
    values there: what a hidden check shows of them)."""
    bad = ~torch.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    count, total = int(bad.sum()), bad.numel()
    if not count:
        return f"no entry of {total} differs by more than rtol={rtol:g}, atol={atol:g}"
    index = first_index(bad)
    where = f" at index {index}" if index else ""
    want, got = expected[index].item(), actual[index].item()
    digits = 6 if f"{want:.6g}" != f"{got:.6g}" else 15  # close values need more digits to tell apart
    return (
        f"{count} of {total} entries differ; first{where}: "
        f"expected {want:.{digits}g}, got {got:.{digits}g} (difference {got - want:.3g})"
    )


def first_index(mask: torch.Tensor) -> tuple[int, ...]:
    """The index of the first True entry of `mask` (without listing them all, as nonzero would)."""
    return unravel(int(mask.reshape(-1).byte().argmax()), tuple(mask.shape))


def differ(expected: torch.Tensor, actual: torch.Tensor, *, rtol: float = 0.0, atol: float = 0.0) -> list[str]:
    """The lines that show how `actual` differs from `expected` (the same shape): both, and
    where they first differ; in a hidden check (`report.hidden`), their dtype and shape and
    the first difference only."""
    same_shape = expected.shape == actual.shape and expected.device.type != "meta" and actual.device.type != "meta"
    first = []
    if same_shape and expected.numel() and not (expected.is_complex() or actual.is_complex()):
        want, got = expected.detach().cpu(), actual.detach().cpu()
        if want.dtype != got.dtype or not want.is_floating_point():
            want, got = want.double(), got.double()
        first = [mismatch(want, got, rtol=rtol, atol=atol)]
    if hiding():
        return [f"expected {show(expected)}, actual {show(actual)}", *first]
    return [f"expected {show(expected)}", f"actual   {show(actual)}", *first]


def gradient_cause(
    expected: torch.Tensor,
    actual: torch.Tensor,
    expected_with_ones: torch.Tensor | None,
    *,
    rtol: float,
    atol: float,
) -> str | None:
    """Recognise the usual mistakes behind a wrong gradient (same shapes)."""

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return bool(torch.allclose(a, b, rtol=rtol, atol=atol))

    broken = ~torch.isfinite(actual) & torch.isfinite(expected)
    if bool(broken.any()):
        index = first_index(broken)
        value = actual[index].item()
        return (
            f"your gradient is {value} at index {index}, where the right one is finite: a formula that divides by "
            "zero or overflows at that input (look at the inputs there: a 0, or a large value). Write it so that "
            "it stays finite wherever the function is differentiable."
        )
    if expected_with_ones is not None and close(actual, expected_with_ones):
        return (
            "backward ignores grad_output: the chain rule multiplies your local derivative "
            "by the incoming gradient (`grad_output * ...`)."
        )
    if not bool(actual.any()) and bool(expected.any()):
        return "the gradient is all zeros: is backward returning a placeholder?"
    if expected.numel() == 1:  # one number is always a multiple of another: no pattern to see
        return None
    if close(actual, -expected):
        return "the gradient has the wrong sign."
    norm = float((expected * expected).sum())
    if norm > 0:
        factor = float((actual * expected).sum()) / norm
        if abs(factor - 1) > 1e-3 and close(actual, factor * expected):
            return f"the gradient is {factor:.4g} times the right one everywhere: a constant factor is off."
    if actual.dim() == 2 and actual.shape[0] == actual.shape[1] and close(actual, expected.T):
        return "the gradient is the transpose of the right one."
    return None



def gradcheck_cause(message: str, label: str = "gradcheck", compared: bool = True) -> str:
    """The likely cause of a failed gradcheck or gradgradcheck, from its message (`compared`:
    the values were compared with a reference first)."""
    if "not multiplied by grad_output" in message:
        return "backward must be linear in grad_output: multiply the local derivative by grad_output, add nothing."
    if "not reentrant" in message:
        return ("backward gives different results for the same input and grad_output: it must not depend on "
                "randomness or on state kept between calls.")
    if "all input grads to be undefined or zero" in message:
        return ("when no gradient flows in (every grad_output None, with `ctx.set_materialize_grads(False)`), "
                "backward must return None (or zeros) for every input.")
    if label == "gradgradcheck":
        return ("the first derivative agrees, the second does not: backward must be differentiable, "
                "built with torch operations from grad_output and the saved inputs or outputs.")
    if not compared:
        return ("backward disagrees with finite differences of your own forward: backward must be the derivative of "
                "forward (a deliberate surrogate, such as a straight-through estimator, is not: pass "
                "surrogate_gradient=True).")
    return ("backward disagrees with finite differences of your own forward, although both agreed with the "
            "reference along the checked directions: backward must be linear in grad_output and the same "
            "every time it runs.")
