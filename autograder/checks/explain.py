"""Turn what went wrong into words a student can act on."""
from __future__ import annotations

import re

import torch

NOT_IMPLEMENTED = "not implemented yet: replace `raise NotImplementedError()` with your code"


def error(stage: str, kind: str, message: str, arg_names: list[str]) -> tuple[str, str | None]:
    """(what happened, likely cause) for an exception raised while running a Function."""
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
    m = re.search(r"invalid gradient at index (\d+) - got \[(.*?)\] but expected shape compatible with \[(.*?)\]", message)
    if m:
        i, got, want = int(m[1]), _dims(m[2]), _dims(m[3])
        return (
            f"the gradient for {name(i)} has shape {got} but {name(i)} has shape {want}",
            shape_cause(got, want),
        )
    if "is not on the expected device" in message or "expected device" in message:
        return (
            f"{stage} mixes devices: {first_line}",
            "a tensor is created without `device=`: build new tensors with "
            "`torch.zeros_like(x)` / `x.new_zeros(...)` or pass `device=x.device`.",
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
    """Where two tensors of the same shape first differ, and how many entries differ."""
    bad = ~torch.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    count, total = int(bad.sum()), bad.numel()
    index = tuple(int(i) for i in bad.nonzero()[0]) if count else ()
    where = f" at index {index}" if index else ""
    want, got = expected[index].item(), actual[index].item()
    digits = 6 if f"{want:.6g}" != f"{got:.6g}" else 15  # close values need more digits to tell apart
    return (
        f"{count} of {total} entries differ; first{where}: "
        f"expected {want:.{digits}g}, got {got:.{digits}g} (difference {got - want:.3g})"
    )


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

