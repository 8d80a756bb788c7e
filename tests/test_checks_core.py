"""The generic check library: every kind of mistake is caught, and explained."""
from __future__ import annotations

import subprocess
import sys
import warnings
from dataclasses import replace

import pytest
import torch

from autograder.checks import inputs
from autograder.checks.answers import check_answers
from autograder.checks.functions import FunctionSpec, check_function
from autograder.exercises.function_basics import (
    CLIPPED_RELU,
    check_clipped_relu,
    check_linear,
    check_polar_to_cartesian,
)
from autograder.student.report import CheckFailed

# ClippedReLU checked to first order only, as a vehicle for what the library checks there.
FIRST_ORDER = replace(CLIPPED_RELU, double_backward=False)


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
    assert "✔ ClippedReLU" in out.out and "gradcheck and gradgradcheck pass" in out.out
    assert "skipped: no CUDA device" in out.out or torch.cuda.is_available()
    assert out.err == ""


@pytest.mark.parametrize(
    "backward, expected",
    [
        (lambda ctx, g, x, c: (g * (x > 0), None), "wrong above clip=1.5, where the output is the constant clip"),
        (lambda ctx, g, x, c: (g * (x < c), None), "wrong below 0, where the output is the constant 0"),
        (lambda ctx, g, x, c: (g * ((x >= 0) & (x <= c)), None), None),  # the kinks included: right
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

    with pytest.raises(CheckFailed, match="asks autograd for its gradient: autograd's engine ran ClampBackward1"):
        check_function(clipped(backward), FIRST_ORDER)
    with pytest.raises(CheckFailed, match="autograd"):  # and so does ClippedReLU's own check
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
        warnings.warn("a harmless warning from the student's code")  # noqa: B028  (student code warns as it likes)
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
    # about 12 CPU-s: a loaded machine took 120 s
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=600)
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
    assert "an intermediate saved in forward (of shape (4,), stashed as `ctx.cosh`)" in str(failure.value)


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
    from autograder.checks.functions import _finite_differences, _plan
    from autograder.checks.remote import Remote, loopback
    from autograder.student import probe

    spec = FunctionSpec(name="Scale", reference=lambda x, w: x * w, cases=lambda g: [args])
    student, generator = Remote("fn", loopback({"fn": fn})), torch.Generator().manual_seed(0)
    plan = _plan(spec, args, names, generator)
    (actual,) = probe.run_many(student, [plan.run])  # the student's run the check's other parts judge
    _finite_differences(student, spec, plan, actual, names, generator)


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


# --- Classes of bugs the generic check catches, each named in its message -----------------

def _fn(forward, backward, name="Student"):
    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def _failure(student, spec) -> str:
    with pytest.raises(CheckFailed) as info:
        check_function(student, spec)
    return str(info.value)


def _saves_inputs(ctx, x, w):
    ctx.save_for_backward(x, w)
    return x * w


MUL = FunctionSpec("Mul", lambda x, w: x * w, lambda g: [(inputs.normal((3, 2), g), inputs.normal((3, 2), g))])
MUL_BROADCAST = FunctionSpec("Mul", lambda x, w: x * w, lambda g: [(inputs.normal((3, 2), g), inputs.normal((2,), g))])


def test_a_backward_that_zeroes_grad_output_in_place_fails():
    def backward(ctx, g, x, c):
        g[~mask(x, c)] = 0  # autograd's tensor, and the caller's
        return g, None

    message = str(pytest.raises(CheckFailed, check_function, clipped(backward), FIRST_ORDER).value)
    assert "backward modified grad_output in place" in message and "clone grad_output first" in message
    message = str(pytest.raises(CheckFailed, check_clipped_relu, clipped(backward)).value)
    assert "backward modified in place a tensor it does not own (grad_output" in message


def test_a_backward_that_views_grad_output_fails_on_a_non_contiguous_one():
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return (g.view(-1) * w.reshape(-1)).view(x.shape), (g.view(-1) * x.reshape(-1)).view(w.shape)

    message = _failure(_fn(_saves_inputs, backward), MUL)
    assert "called `.view` on a tensor that is not contiguous" in message
    assert "given a grad_output that is not contiguous" in message and "`.reshape(...)`" in message


def test_a_backward_that_changes_an_expanded_grad_output_fails_with_its_own_message():
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g.mul_(w) if not g.is_contiguous() else g * w, g * x  # changes only what it cannot

    spec = FunctionSpec("Mul", lambda x, w: x * w, lambda g: [(inputs.normal((4,), g), inputs.normal((4,), g))])
    message = _failure(_fn(_saves_inputs, backward), spec)
    assert "backward modified" in message and "grad_output" in message


def test_every_combination_of_needs_input_grad_is_tried():
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g * w if ctx.needs_input_grad[0] else None
        gw = g * x if ctx.needs_input_grad[0] else None  # the index of x, copied
        return gx, gw

    message = _failure(_fn(_saves_inputs, backward), MUL)
    assert "wrong gradient for `w` when only `w` requires grad" in message
    assert "backward returned None, but `w` needs a gradient" in message and "ctx.needs_input_grad" in message


def test_gradients_returned_in_the_wrong_order_are_named_as_such():
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * x, g * w

    assert "this is the gradient for `w`: backward returns the gradients in the order" in _failure(_fn(_saves_inputs,
                                                                                                       backward), MUL)

    def backward_broadcast(ctx, g):
        x, w = ctx.saved_tensors
        return (g * x).sum(0), g * w

    message = _failure(_fn(_saves_inputs, backward_broadcast), MUL_BROADCAST)
    assert "the gradient for `x` has shape (2,), the shape of `w`" in message and "wrong order" in message


def test_a_non_tensor_given_to_save_for_backward_is_named():
    class SavesClip(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, clip):
            ctx.save_for_backward(x, clip)
            return x.clamp(0, clip)

        @staticmethod
        def backward(ctx, g):
            x, clip = ctx.saved_tensors
            return g * mask(x, clip), None

    message = str(pytest.raises(CheckFailed, check_clipped_relu, SavesClip).value)
    assert "forward passed a float to `ctx.save_for_backward`" in message and "ctx.clip = clip" in message


def test_a_float32_forward_is_named_as_such():
    class SinInFloat32(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.float().sin().double()  # 7 digits: close enough for the values, noise for gradcheck

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.cos()

    spec = FunctionSpec("Sin", torch.sin, lambda g: [(inputs.uniform((5,), g),)], rtol=1e-6)
    message = _failure(SinInFloat32, spec)
    assert "your forward computes in float32" in message and "backward must be linear" not in message


def test_an_input_changed_in_place_is_shown_as_it_was_before_the_call():
    class Clamps(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, clip):
            ctx.clip = clip
            y = x.clamp_(0, clip)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * mask(y, ctx.clip), None

    message = str(pytest.raises(CheckFailed, check_clipped_relu, Clamps).value)
    assert "x = tensor([-0.5," in message and "before the call" in message


def test_the_meta_device_runs_every_case_not_only_a_0d_first_one():
    def backward(ctx, g, x, c):
        return g * mask(x, c) * torch.ones(x.shape, dtype=x.dtype), None  # a CPU tensor

    message = str(pytest.raises(CheckFailed, check_clipped_relu, clipped(backward), shapes=[(), (3,)],
                                clips=[1.0, 1.0]).value)
    assert "on another device (meta)" in message


def test_argument_names_shorter_than_the_arguments_are_no_error():
    class Runs(torch.autograd.Function):
        @staticmethod
        def forward(ctx, scale, *inputs):
            ctx.scale = scale
            return tuple(t * scale for t in inputs)

        @staticmethod
        def backward(ctx, *grads):
            return (None, *(g * ctx.scale for g in grads))

    spec = FunctionSpec("Runs", lambda s, a, b: (a * s, b * s),
                        lambda g: [(2.0, inputs.normal((3,), g), inputs.normal((2,), g))])
    check_function(Runs, spec)

    class Wrong(Runs):
        @staticmethod
        def backward(ctx, *grads):
            return (None, *(g for g in grads))

    message = _failure(Wrong, spec)
    assert "wrong gradient for `input 1`" in message


def _polar_forward(ctx, r, theta):
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(r, theta)
    return r * theta.cos(), r * theta.sin()


POLAR = FunctionSpec(
    "Polar", lambda r, t: (r * t.cos(), r * t.sin()),
    lambda g: [(inputs.normal((3,), g), inputs.normal((3,), g))],
)


def test_a_backward_that_cannot_take_a_none_gradient_fails_with_a_check_message():
    def backward(ctx, gx, gy):
        r, theta = ctx.saved_tensors
        return gx * theta.cos() + gy * theta.sin(), r * (gy * theta.cos() - gx * theta.sin())

    message = _failure(_fn(_polar_forward, backward), POLAR)
    assert "backward received None as a gradient" in message and "when only output" in message


def test_gradcheck_errors_other_than_gradcheck_errors_become_messages():
    from autograder.checks.functions import _gradcheck

    def backward(ctx, gx, gy):
        raise TypeError("unsupported operand type(s) for *: 'NoneType' and 'Tensor'")

    args = (torch.ones(2, dtype=torch.float64, requires_grad=True),
            torch.ones(2, dtype=torch.float64, requires_grad=True))
    with pytest.raises(CheckFailed, match="in torch.autograd.gradcheck, backward raised TypeError"):
        _gradcheck(_fn(_polar_forward, backward), POLAR, args, ["r", "theta"])


def test_a_backward_that_handles_none_passes_and_says_what_else_was_tried(capsys):
    def backward(ctx, gx, gy):
        r, theta = ctx.saved_tensors
        gr = gt = None
        if gx is not None:
            gr, gt = gx * theta.cos(), -gx * r * theta.sin()
        if gy is not None:
            gr = gy * theta.sin() if gr is None else gr + gy * theta.sin()
            gt = gy * r * theta.cos() if gt is None else gt + gy * r * theta.cos()
        return gr, gt

    check_function(_fn(_polar_forward, backward), POLAR)
    out = capsys.readouterr().out
    assert "each combination of inputs requiring grad, each output used alone" in out


def test_double_backward_names_an_intermediate_given_to_save_for_backward_and_a_detach():
    class SinhSaved(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(torch.cosh(x))
            return torch.sinh(x)

        @staticmethod
        def backward(ctx, g):
            (c,) = ctx.saved_tensors
            return g * c

    assert "(of shape (4,), given to save_for_backward)" in _failure(SinhSaved, sinh_spec())

    class SinhDetached(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.sinh(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * torch.cosh(x.detach())

    assert "values autograd cannot follow: `.detach()`" in _failure(SinhDetached, sinh_spec())


def test_double_backward_is_checked_by_finite_differences_in_the_grader_too(capsys):
    from autograder.checks.remote import Remote, loopback

    class Sinh(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.sinh(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * torch.cosh(x)

    check_function(Remote("Sinh", loopback({"Sinh": Sinh})), sinh_spec())
    assert "gradcheck and gradgradcheck pass" in capsys.readouterr().out


def test_argument_names_of_a_custom_op_a_module_and_star_args():
    from autograder.student import probe

    @torch.library.custom_op("course_tests::scaled", mutates_args=())
    def scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
        return x * scale

    class Layer(torch.nn.Module):
        def forward(self, input, mask=None):
            return input

    def star(run, *inputs, **options):
        return run

    assert probe.argument_names(scaled) == ["x", "scale"]
    assert probe.argument_names(Layer()) == ["input", "mask"]
    assert probe.argument_names(star) == ["run"]


COURSE_NAME = "the notebook's own"


def test_names_are_substituted_for_a_module_class_too():
    from autograder.student import probe

    class Layer(torch.nn.Module):
        def forward(self, x):
            return COURSE_NAME

    replacement = probe.reference("tests:replacement", lambda: None)
    with probe.substituted(Layer, {"COURSE_NAME": replacement}) as replaced:
        assert replaced == ["COURSE_NAME"] and Layer()(0) is replacement
    assert Layer()(0) == "the notebook's own"


# --- Notebook 03's own checks: the habits it teaches, special points, None handling -------

def test_clipped_relu_rejects_a_stash_on_ctx():
    class Stashes(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, clip):
            ctx.x, ctx.clip = x, clip
            return x.clamp(0, clip)

        @staticmethod
        def backward(ctx, g):
            return g * mask(ctx.x, ctx.clip), None

    message = str(pytest.raises(CheckFailed, check_clipped_relu, Stashes).value)
    assert "tensor `ctx.x` (the input `x`" in message and "is stashed on ctx" in message


def test_clipped_relu_accepts_any_subgradient_at_the_kinks_but_not_nan():
    check_clipped_relu(clipped(lambda ctx, g, x, c: (g * ((x >= 0) & (x <= c)), None)))
    check_clipped_relu(clipped(lambda ctx, g, x, c: (g * ((x > 0) & (x < c)) + 0.5 * g * ((x == 0) | (x == c)), None)))

    def divides(ctx, g, x, c):
        y = x.clamp(0, c)
        return g * (y / x) * (y < c), None

    message = str(pytest.raises(CheckFailed, check_clipped_relu, clipped(divides)).value)
    assert "at the kink x = 0 your gradient is nan" in message and "0/0 = nan" in message


def test_clipped_relu_checks_large_inputs():
    class Blends(torch.autograd.Function):  # inf * 0 far out
        @staticmethod
        def forward(ctx, x, clip):
            ctx.save_for_backward(x)
            ctx.clip = clip
            above = (x > clip).to(x.dtype)
            return (torch.relu(x) * (1 - above)
                    + torch.exp(torch.log(torch.tensor(clip, dtype=x.dtype)) + 0 * x) * above + 0 * x.exp())

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * mask(x, ctx.clip), None

    message = str(pytest.raises(CheckFailed, check_clipped_relu, Blends).value)
    assert "at special points: wrong forward values" in message


def _polar_class(backward, materialize=False):
    class PolarToCartesian(torch.autograd.Function):
        @staticmethod
        def forward(ctx, r, theta):
            ctx.set_materialize_grads(materialize)
            ctx.save_for_backward(r, theta)
            return r * torch.cos(theta), r * torch.sin(theta)

    PolarToCartesian.backward = staticmethod(backward)
    return PolarToCartesian


def _add(a, b):
    return b if a is None else a if b is None else a + b


def _polar_right(ctx, gx, gy):
    r, theta = ctx.saved_tensors
    gr = gt = None
    if gx is not None:
        gr = gx * theta.cos() if ctx.needs_input_grad[0] else None
        gt = -gx * r * theta.sin() if ctx.needs_input_grad[1] else None
    if gy is not None:
        gr = _add(gr, gy * theta.sin()) if ctx.needs_input_grad[0] else None
        gt = _add(gt, gy * r * theta.cos()) if ctx.needs_input_grad[1] else None
    return gr, gt


def test_polar_right(capsys):
    check_polar_to_cartesian(_polar_class(_polar_right))
    check_polar_to_cartesian(_polar_class(_polar_right), shapes=[(), (2, 1, 3)], seed=None)
    assert "arrives as None and backward then does less" in capsys.readouterr().out


@pytest.mark.parametrize("student, expected", [
    (_polar_class(_polar_right, materialize=True), "received zeros as grad_y, not None"),
    (_polar_class(lambda ctx, gx, gy: _polar_right(ctx,
                                                   gx if gx is not None else torch.zeros_like(ctx.saved_tensors[0]),
                                                   gy if gy is not None else torch.zeros_like(ctx.saved_tensors[0]))),
     "With grad_y None it should run fewer"),
    (_polar_class(lambda ctx, gx, gy: (gx * ctx.saved_tensors[1].cos() + gy * ctx.saved_tensors[1].sin(),
                                       ctx.saved_tensors[0] * (gy * ctx.saved_tensors[1].cos()
                                                               - gx * ctx.saved_tensors[1].sin()))),
     "backward received None as a gradient"),
])
def test_polar_names_each_mistake_with_none(student, expected):
    message = str(pytest.raises(CheckFailed, check_polar_to_cartesian, student).value)
    assert expected in message


def test_polar_names_a_gradient_nobody_needs():
    def always(ctx, gx, gy):
        r, theta = ctx.saved_tensors
        gr = gt = None
        if gx is not None:
            gr, gt = gx * theta.cos(), -gx * r * theta.sin()
        if gy is not None:
            gr, gt = _add(gr, gy * theta.sin()), _add(gt, gy * r * theta.cos())
        return gr, gt

    message = str(pytest.raises(CheckFailed, check_polar_to_cartesian, _polar_class(always)).value)
    assert "when only `r` requires grad, backward still returned a gradient for `theta`" in message


def test_polar_verdicts_are_the_same_in_the_grader():
    from autograder.checks.remote import Remote, loopback

    def verdict(student):
        try:
            check_polar_to_cartesian(student)
        except CheckFailed as failure:
            return str(failure)
        return None

    for student in (_polar_class(_polar_right), _polar_class(_polar_right, materialize=True)):
        assert verdict(Remote("PolarToCartesian", loopback({"PolarToCartesian": student}))) == verdict(student)


def test_linear_with_a_batch_of_one_and_one_output_feature():
    def linear(squeeze: bool):
        class Linear(torch.autograd.Function):
            @staticmethod
            def forward(ctx, input, weight, bias=None):
                ctx.save_for_backward(input, weight)
                out = input @ weight.T
                return out if bias is None else out + bias

            @staticmethod
            def backward(ctx, g):
                input, weight = ctx.saved_tensors
                need = ctx.needs_input_grad
                gb = g.sum(0).squeeze() if squeeze else g.sum(0)
                return g @ weight if need[0] else None, g.T @ input if need[1] else None, gb if need[2] else None

        return Linear

    check_linear(linear(squeeze=False))
    message = str(pytest.raises(CheckFailed, check_linear, linear(squeeze=True)).value)
    assert "the gradient for `bias` has shape () but `bias` has shape (1,)" in message
