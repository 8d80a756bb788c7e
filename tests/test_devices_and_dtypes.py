"""The meta-device run catches, without a GPU, what a GPU run would: a tensor made on the
CPU inside a Function, and an output or gradient left on the CPU (a copy to the CPU there
gives zeros instead of failing, so a Function that wraps NumPy and moves back passes).
And a Function that keeps its input's dtype is run in float32 too."""
from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import pytest
import torch

from autograder.checks.functions import check_function
from autograder.checks.remote import Remote, loopback
from autograder.exercises.function_basics import CLIPPED_RELU
from autograder.student.report import CheckFailed

SPEC = replace(CLIPPED_RELU, double_backward=False)


def clipped(forward_tail, backward_tail):
    class ClippedReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, clip):
            ctx.save_for_backward(x)
            ctx.clip = clip
            return forward_tail(x.clamp(0, clip), x)

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return backward_tail(grad_output * ((x > 0) & (x < ctx.clip)), x), None

    return ClippedReLU


KEEP = lambda y, x: y  # noqa: E731
WRONG = {
    "output moved to the CPU": (lambda y, x: y.cpu(), KEEP, "output 0 came back on the CPU"),
    "gradient moved to the CPU": (KEEP, lambda g, x: g.cpu(), "expected device meta but got cpu"),
    "a mask made on the CPU": (lambda y, x: y * torch.ones(x.shape, dtype=x.dtype), KEEP, "mixes devices"),
}
RIGHT = {
    "as it should": (KEEP, KEEP),
    "through NumPy and back": (lambda y, x: torch.from_numpy(y.detach().cpu().numpy()).to(x.device), KEEP),
}


def _checked(student, remote: bool) -> str:
    target = Remote("ClippedReLU", loopback({"ClippedReLU": student})) if remote else student
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        check_function(target, SPEC, seed=0)
    return printed.getvalue()


@pytest.mark.parametrize("remote", [False, True], ids=["kernel", "grader"])
@pytest.mark.parametrize("bug", list(WRONG))
def test_a_device_bug_fails_on_the_meta_device(bug, remote):
    forward, backward, says = WRONG[bug]
    with pytest.raises(CheckFailed, match="on another device") as failure:
        _checked(clipped(forward, backward), remote)
    assert says in str(failure.value)


@pytest.mark.parametrize("remote", [False, True], ids=["kernel", "grader"])
@pytest.mark.parametrize("answer", list(RIGHT))
def test_device_generic_code_passes(answer, remote):
    assert "meta device: forward and backward create no tensor tied to the CPU" in _checked(clipped(*RIGHT[answer]),
                                                                                            remote)


FLOAT32 = {
    "a float64 mask": (lambda y, x: y * torch.ones(x.shape, dtype=torch.float64), "returned torch.float64"),
    "through NumPy, not converted back": (lambda y, x: torch.from_numpy(y.detach().double().numpy()),
                                          "returned torch.float64"),
}


@pytest.mark.parametrize("remote", [False, True], ids=["kernel", "grader"])
@pytest.mark.parametrize("bug", list(FLOAT32))
def test_a_float32_input_must_give_a_float32_output(bug, remote):
    forward, says = FLOAT32[bug]
    with pytest.raises(CheckFailed, match="given float32 inputs") as failure:
        _checked(clipped(forward, KEEP), remote)
    assert says in str(failure.value) and "keep the input's dtype" in str(failure.value)
