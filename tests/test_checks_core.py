"""The generic check library: every kind of mistake is caught, and explained."""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

from autograder.checks import inputs
from autograder.checks.answers import check_answers
from autograder.checks.functions import FunctionSpec, check_function
from autograder.student.report import CheckFailed
from autograder.exercises.function_basics import check_clipped_relu, check_linear


def clipped(backward):
    """A ClippedReLU whose backward is `backward(ctx, grad_output, x, clip)`."""

    class ClippedReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, clip):
            ctx.save_for_backward(x)
            ctx.clip = clip
            return x.clamp(0, clip)

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return backward(ctx, grad_output, x, ctx.clip)

    return ClippedReLU


def mask(x, clip):
    return (x > 0) & (x < clip)


def test_a_correct_function_passes_and_says_what_was_checked(capsys):
    check_clipped_relu(clipped(lambda ctx, g, x, c: (g * mask(x, c), None)))
    out = capsys.readouterr()
    assert "✔ ClippedReLU" in out.out and "gradcheck passes" in out.out
    assert "skipped: no CUDA device" in out.out or torch.cuda.is_available()
    assert out.err == ""


@pytest.mark.parametrize(
    "backward, expected",
    [
        (lambda ctx, g, x, c: (g * (x > 0), None), "forgets the upper clip"),
        (lambda ctx, g, x, c: (g * (x < c), None), "forgets the lower bound"),
        (lambda ctx, g, x, c: (mask(x, c).double(), None), "ignores grad_output"),
        (lambda ctx, g, x, c: g * mask(x, c), "return exactly one gradient per forward input"),
        (lambda ctx, g, x, c: (g * mask(x, c), torch.zeros(())), "no None returned for the non-tensor argument `clip`"),
        (lambda ctx, g, x, c: (2 * g * mask(x, c), None), "2 times the right one"),
        (lambda ctx, g, x, c: (-g * mask(x, c), None), "wrong sign"),
        (lambda ctx, g, x, c: (g * mask(x, c) * torch.ones(x.shape, dtype=x.dtype), None), "`device=x.device`"),
        (lambda ctx, g, x, c: (g * mask(x, c).float(), None), None),  # float32 mask: promoted, right
    ],
)
def test_wrong_backwards_fail_with_the_likely_cause(backward, expected):
    if expected is None:
        check_clipped_relu(clipped(backward))
        return
    with pytest.raises(CheckFailed) as failure:
        check_clipped_relu(clipped(backward))
    message = str(failure.value)
    assert expected in message
    assert "x = " in message and "clip = " in message  # names the input


def test_a_wrong_gradient_names_expected_and_actual_values():
    with pytest.raises(CheckFailed) as failure:
        check_clipped_relu(clipped(lambda ctx, g, x, c: (g * (x > 0), None)))
    lines = str(failure.value).splitlines()
    assert any(line.strip().startswith("expected tensor(") for line in lines)
    assert any(line.strip().startswith("actual   tensor(") for line in lines)
    assert any("first at index" in line for line in lines)


def test_backward_must_not_ask_autograd_for_the_gradient():
    def backward(ctx, g, x, c):
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            return torch.autograd.grad(x.clamp(0, c), x, g)[0], None

    with pytest.raises(CheckFailed, match="backward calls torch.autograd.grad to compute its gradient"):
        check_clipped_relu(clipped(backward))


def test_forward_must_not_modify_its_input():
    class Clamps(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, clip):
            ctx.save_for_backward(x.clone())
            ctx.clip = clip
            return x.clamp_(0, clip)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * mask(x, ctx.clip), None

    with pytest.raises(CheckFailed, match="modified its input `x` in place"):
        check_clipped_relu(Clamps)


def test_a_harmless_warning_never_reaches_stderr(capsys):
    def backward(ctx, g, x, c):
        warnings.warn("a harmless warning from the student's code")
        print("a debug print to stderr", file=sys.stderr)
        return g * mask(x, c), None

    check_clipped_relu(clipped(backward))
    assert capsys.readouterr().err == ""


def test_a_failure_is_raised_even_without_asserts():
    """Checks raise; stripping `assert` statements (python -O) does not disable them."""
    code = (
        "import torch\n"
        "from autograder.exercises.function_basics import check_clipped_relu\n"
        "class C(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x, clip): return x.clamp(0, clip)\n"
        "    @staticmethod\n"
        "    def backward(ctx, g): return g, None\n"
        "check_clipped_relu(C)\n"
    )
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "CheckFailed" in done.stderr


def sinh_spec() -> FunctionSpec:
    return FunctionSpec("Sinh", torch.sinh, lambda g: [(inputs.uniform((4,), g),)], double_backward=True)


def test_double_backward_catches_an_untracked_backward():
    class SinhOnCtx(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.cosh = torch.cosh(x)
            return torch.sinh(x)

        @staticmethod
        def backward(ctx, g):
            return g * ctx.cosh

    with pytest.raises(CheckFailed) as failure:
        check_function(SinhOnCtx, sinh_spec())
    assert "double backward is wrong" in str(failure.value)
    assert "not differentiable by autograd" in str(failure.value)


def test_double_backward_catches_a_missing_grad_output_term():
    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return CubeBackward.apply(g, x)

    class CubeBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, g, x):
            ctx.save_for_backward(g, x)
            return g * 3 * x**2

        @staticmethod
        def backward(ctx, gg):
            g, x = ctx.saved_tensors
            return None, gg * g * 6 * x  # the gradient for grad_output is missing

    spec = FunctionSpec("Cube", lambda x: x**3, lambda g: [(inputs.uniform((4,), g),)], double_backward=True)
    with pytest.raises(CheckFailed, match="with respect to grad_output"):
        check_function(Cube, spec)


def test_linear_must_honour_needs_input_grad():
    def linear(compute_all: bool):
        class Linear(torch.autograd.Function):
            @staticmethod
            def forward(ctx, input, weight, bias=None):
                ctx.save_for_backward(input, weight)
                out = input @ weight.T
                return out if bias is None else out + bias

            @staticmethod
            def backward(ctx, g):
                input, weight = ctx.saved_tensors
                need = (True, True, True) if compute_all else ctx.needs_input_grad
                return (g @ weight if need[0] else None, g.T @ input if need[1] else None,
                        g.sum(0) if need[2] and ctx.needs_input_grad[2] else None)

        return Linear

    check_linear(linear(compute_all=False))
    with pytest.raises(CheckFailed, match=r"backward ran 2 matrix multiplication\(s\); 0 are needed"):
        check_linear(linear(compute_all=True))


def test_answers_check_the_form_then_the_key():
    choices, questions = ("composite", "function"), "ab"
    check_answers({"a": "Composite", "b": " function"}, choices, questions)
    with pytest.raises(CheckFailed, match="missing: 'b'"):
        check_answers({"a": "composite"}, choices, questions)
    with pytest.raises(CheckFailed, match="must be one of"):
        check_answers({"a": "composite", "b": "yaml"}, choices, questions)
    key = {"a": "composite", "b": "function"}
    assert check_answers({"a": "composite", "b": "composite"}, choices, questions, key=key, points=3) == 1.5
    with pytest.raises(CheckFailed, match="1 of 2 answers are wrong"):
        check_answers({"a": "composite", "b": "composite"}, choices, questions, key=key)


def _remote_finite_differences(fn, args, names):
    """The grader's own finite differences of a Function answering through the wire."""
    from autograder.checks.functions import _finite_differences
    from autograder.checks.remote import Remote, loopback

    spec = FunctionSpec(name="Scale", reference=lambda x, w: x * w, cases=lambda g: [args])
    _finite_differences(Remote("fn", loopback({"fn": fn})), spec, args, names, torch.Generator().manual_seed(0))


def _scale(backward):
    """Mul (x * w) with another backward."""
    from autograder.student.save_for_backward import Mul

    class Scale(Mul):
        @staticmethod
        def backward(ctx, grad_output):
            return backward(grad_output, *ctx.saved_tensors)

    return Scale


SCALE_ARGS = (torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True),
              torch.tensor([1.5, 0.25, -3.0], dtype=torch.float64, requires_grad=True))


def test_the_graders_finite_differences_accept_a_right_backward():
    _remote_finite_differences(_scale(lambda g, x, w: (g * w, g * x)), SCALE_ARGS, ["x", "w"])


def test_the_graders_finite_differences_name_the_wrong_entry():
    def one_entry_wrong(g, x, w):
        gw = g * x
        gw[2] = 0
        return g * w, gw

    with pytest.raises(CheckFailed) as failed:
        _remote_finite_differences(_scale(one_entry_wrong), SCALE_ARGS, ["x", "w"])
    message = str(failed.value)
    assert "gradient for `w`, entry 2" in message and "numerical" in message and "analytical" in message


def test_the_graders_finite_differences_catch_a_backward_not_linear_in_grad_output():
    with pytest.raises(CheckFailed, match="gradient for `x`"):
        _remote_finite_differences(_scale(lambda g, x, w: (g.abs() * w, g * x)), SCALE_ARGS, ["x", "w"])
