"""What a student's process answers is bounded before the grader computes with it: a reply
of an empty tensor of a huge shape, a gradient or a forward value of a shape that would
broadcast against the reference's, a message about either — each refused or rendered in
bounded time. (tests/test_fuzz.py throws generated replies of every kind at the checks.)"""
from __future__ import annotations

import pytest
import torch

from autograder.checks import explain, inputs
from autograder.checks.functions import FunctionSpec, check_function
from autograder.checks.remote import Remote, loopback
from autograder.student import probe, report, wire


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


SQUARE = FunctionSpec("Square", lambda x: x * x, lambda g: [(inputs.normal((6,), g),)])
ROWS = 4096  # of a reply that broadcasts against the reference's 6 entries


def _rewriting(procedure: str, rewrite):
    """The model Square, whose answers to `procedure` pass through `rewrite` first."""
    transport = loopback({"Square": Square})

    def answer(request):
        found = transport(request)
        return rewrite(found) if request["procedure"].endswith(procedure) else found

    return Remote("Square", answer)


def test_an_empty_tensor_is_charged_for_its_rows():
    """It has no data, yet its rows are what `.tolist()` or a loop walks: 8 million of them
    cost the grader 9.3 CPU-seconds and 1.3 GB to render (measured here)."""
    structure, buffers = wire.encode(torch.empty(1000, 0))
    assert wire.decode(structure, buffers).shape == (1000, 0)
    structure["shape"] = [2**31 - 1, 0]
    with pytest.raises(wire.WireError, match="larger than 64 MiB"):
        wire.decode(structure, buffers)


def test_a_message_renders_a_bounded_number_of_entries_whatever_the_shape():
    assert report.show(torch.empty(8_000_000, 0)) == "tensor([], size=(8000000, 0))"
    assert report.show(torch.arange(6.0).reshape(2, 3).T) == "tensor([[0, 3], [1, 4], [2, 5]])"
    assert report.show(torch.ones(()).expand(2**40)).startswith("tensor([1, 1, 1")
    assert report.show(list(range(10**6))).endswith("...]")
    bad = torch.zeros(10**6, dtype=torch.bool)
    bad[-3:] = True
    assert explain.first_index(bad) == (10**6 - 3,)


def test_a_gradient_not_of_its_inputs_shape_is_refused_before_any_arithmetic():
    """Autograd returns each gradient in its input's shape: one of shape (4096, 1) for an
    input of shape (6,) (which would broadcast to (4096, 6) against the reference's) comes
    from a process that did not compute it."""
    def broadcasting(found):
        found[0]["grads"][0] = [torch.zeros(ROWS, 1, dtype=torch.float64)]
        return found

    with pytest.raises(probe.Malformed, match=r"a gradient of shape \(4096, 1\).*autograd never returns"):
        check_function(_rewriting("_run_many", broadcasting), SQUARE)


def test_a_forward_of_another_shape_near_the_input_is_refused_before_finite_differences():
    def broadcasting(found):
        return [[torch.zeros(ROWS, 1, dtype=torch.float64)] for _ in found]

    with pytest.raises(report.CheckFailed, match=r"a tiny step away from the input.*\(4096, 1\)"):
        check_function(_rewriting("_forward_many", broadcasting), SQUARE)


def test_a_float32_run_compares_gradients_and_sees_a_float64_step():
    """The float32 run differentiates (its inputs require grad, as in float64), and a
    backward that computes in float64, whose gradient autograd's engine casts back to
    float32 without a word, is named (as the student's process reports it)."""
    class InFloat64(Square):
        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return 2 * x.double() * grad_output

    class Halved(Square):
        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return (2 if x.dtype == torch.float64 else 1) * x * grad_output

    for student, expected in ((InFloat64, r"computes in float64: an operation \(\w+\) made a float64 tensor of "
                                          r"shape \(6,\) in backward"),
                              (Halved, "given float32 inputs, the values or gradients differ")):
        for remote in (False, True):
            with pytest.raises(report.CheckFailed, match=expected):
                check_function(Remote(student.__name__, loopback({student.__name__: student})) if remote
                               else student, SQUARE)
