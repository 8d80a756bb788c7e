"""Unit tests of the checks of notebook 07_double_backward, messages included."""
from __future__ import annotations

import nbformat
import pytest
import torch
from torch.autograd.function import once_differentiable

from autograder import authoring
from autograder.checks.remote import Remote, loopback
from autograder.exercises import double_backward as ex
from autograder.student import graphs
from autograder.student.report import CheckFailed
from grading import check_fails as _fails
from grading import exercises

# --- Sinh --------------------------------------------------------------------------------

def _sinh(save: str, backward=None, decorate=lambda f: f, cosh_of_output=lambda y: torch.hypot(torch.ones_like(y), y)):
    """A sinh Function that saves "input", "output" or "intermediates" ("ctx": on ctx);
    from the output, cosh is `cosh_of_output(y)`."""

    class Sinh(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            expx, expnegx = x.exp(), (-x).exp()
            y = (expx - expnegx) / 2
            if save == "input":
                ctx.save_for_backward(x)
            elif save == "output":
                ctx.save_for_backward(y)
            elif save == "intermediates":
                ctx.save_for_backward(expx, expnegx)
            else:
                ctx.expx, ctx.expnegx = expx, expnegx
            return y

        @staticmethod
        @decorate
        def backward(ctx, grad_out):
            saved = ctx.saved_tensors
            if save == "input":
                cosh = saved[0].cosh()
            elif save == "output":
                cosh = cosh_of_output(saved[0])
            elif save == "intermediates":
                cosh = (saved[0] + saved[1]) / 2
            else:
                cosh = (ctx.expx + ctx.expnegx) / 2
            return (backward or (lambda g, c: g * c))(grad_out, cosh)

    return Sinh


@pytest.mark.parametrize("save", ["input", "output"])
def test_sinh_accepts_a_backward_built_from_an_input_or_an_output(save, capsys):
    ex.check_sinh(_sinh(save))
    ex.check_sinh(_sinh(save), shapes=[(), (3, 2)], seed=None)
    assert "gradcheck and gradgradcheck pass" in capsys.readouterr().out


@pytest.mark.parametrize("save", ["intermediates", "ctx"])
def test_sinh_rejects_intermediates_that_pass_gradcheck(save):
    student = _sinh(save)
    x = torch.rand(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(student.apply, (x,))  # the trap: first order is right
    _fails(ex.check_sinh, student, "double backward is wrong", "with respect to `x`",
           "zero (not connected to the graph)", "an intermediate saved in forward")


def test_sinh_rejects_cosh_from_the_output_squared_that_overflows():
    student = _sinh("output", cosh_of_output=lambda y: (1 + y**2).sqrt())
    x = torch.rand(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(student.apply, (x,))  # right on ordinary inputs
    message = _fails(ex.check_sinh, student, "SinhFixed: the gradient (grad_output of ones) is inf at x = 400",
                     "sinh(x)² overflows once |x| > 355", "`torch.hypot`")
    assert message.startswith("SinhFixed: the gradient")


def test_sinh_rejects_cosh_as_sinh_over_tanh_at_zero():
    class Sinh(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.sinh()
            ctx.save_for_backward(x, y)
            return y

        @staticmethod
        def backward(ctx, grad_out):
            x, y = ctx.saved_tensors
            return grad_out * y / x.tanh()

    _fails(ex.check_sinh, Sinh, "SinhFixed: the gradient (grad_output of ones) is nan at x = 0, where it is 1.",
           "0 / 0 at x = 0")


def test_sinh_rejects_no_grad_in_backward():
    def backward(g, c):
        with torch.no_grad():
            c = c * 1
        return g * c

    _fails(ex.check_sinh, _sinh("input", backward=backward), "double backward is wrong", "`torch.no_grad()`")


def test_sinh_rejects_once_differentiable():
    _fails(ex.check_sinh, _sinh("input", decorate=once_differentiable),
           "double backward is wrong", "`@once_differentiable`")


def _cosh_times(decorate=lambda f: f):
    """A helper Function grad_out * cosh(x) whose own backward is right, but leaves torch
    (`decorate`, or NumPy by default): right to second order only."""

    class CoshTimes(torch.autograd.Function):
        @staticmethod
        def forward(ctx, grad_out, x):
            ctx.save_for_backward(grad_out, x)
            return grad_out * x.cosh()

        @staticmethod
        @decorate
        def backward(ctx, grad):
            grad_out, x = ctx.saved_tensors
            return grad * x.cosh(), grad * grad_out * torch.as_tensor(x.detach().sinh().numpy())

    class SinhFixed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sinh()

        @staticmethod
        def backward(ctx, grad_out):
            (x,) = ctx.saved_tensors
            return CoshTimes.apply(grad_out, x)

    return SinhFixed


@pytest.mark.parametrize("decorate", [lambda f: f, once_differentiable], ids=["numpy", "once_differentiable"])
def test_sinh_right_to_second_order_only_fails_the_third_derivative(decorate):
    _fails(ex.check_sinh, _cosh_times(decorate), "SinhFixed: derivative 3 is not connected to x", "a helper Function")


def test_sinh_passes_the_third_derivative_and_says_so(capsys):
    ex.check_sinh(_sinh("input"))
    assert "✔ SinhFixed: the third derivative agrees with the reference's too" in capsys.readouterr().out


def test_sinh_rejects_a_backward_that_ignores_grad_output():
    _fails(ex.check_sinh, _sinh("input", backward=lambda g, c: c),
           "wrong gradient for `x`", "backward ignores grad_output")


def test_sinh_rejects_a_detached_backward():
    _fails(ex.check_sinh, _sinh("input", backward=lambda g, c: g * c.detach()),
           "double backward is wrong", "`.detach()`")


# --- SinhWithIntermediates ----------------------------------------------------------------

def _sinh_intermediates(save="outputs", returned=lambda e: e, extra=True, sign=-1, mark=False, materialize=True,
                        none_aware=False):
    """The tutorial's Sinh that returns exp(x) and exp(-x) too, or one of its mistakes."""

    class SinhWithIntermediates(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            expx, expnegx = x.exp(), (-x).exp()
            ctx.set_materialize_grads(materialize)
            if save == "outputs":
                ctx.save_for_backward(expx, expnegx)
            elif save == "copies":
                ctx.save_for_backward(expx.clone(), expnegx.clone())
            elif save == "input":
                ctx.save_for_backward(x)
            if mark:
                ctx.mark_non_differentiable(expx, expnegx)
            return (expx - expnegx) / 2, returned(expx), returned(expnegx)

        @staticmethod
        def backward(ctx, grad_out, grad_expx, grad_expnegx):
            if save == "input":
                (x,) = ctx.saved_tensors
                expx, expnegx = x.exp(), (-x).exp()
            else:
                expx, expnegx = ctx.saved_tensors
            terms = [(grad_out, (expx + expnegx) / 2)]
            if extra:
                terms += [(grad_expx, expx), (grad_expnegx, sign * expnegx)]
            found = [g * d for g, d in terms if not (none_aware and g is None)]
            return sum(found[1:], found[0]) if found else None

    return SinhWithIntermediates


def test_sinh_intermediates_accepts_the_tutorials_fix(capsys):
    ex.check_sinh_intermediates(_sinh_intermediates())
    ex.check_sinh_intermediates(_sinh_intermediates(materialize=False, none_aware=True), shapes=[(), (1, 4)], seed=None)
    out = capsys.readouterr().out
    assert out.count("✔ SinhWithIntermediates returns three tensors (out, expx, expnegx), each with a grad_fn.") == 2
    assert "✔ SinhWithIntermediates saves exactly expx and expnegx, its outputs" in out
    assert "SinhWithIntermediates: forward, backward and double backward agree" in out


def test_sinh_intermediates_without_the_extra_terms_passes_gradcheck_of_out_alone():
    student = _sinh_intermediates(extra=False)
    x = torch.rand(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: student.apply(t)[0], (x,))  # the trap
    _fails(ex.check_sinh_intermediates, student, "SinhWithIntermediates: wrong gradient for `x`.",
           "backward receives one gradient per output", "d exp(-x)/dx = -exp(-x)")


def test_sinh_intermediates_with_the_wrong_sign():
    _fails(ex.check_sinh_intermediates, _sinh_intermediates(sign=1), "wrong gradient for `x`", "-exp(-x)")


def test_sinh_intermediates_saving_copies():
    _fails(ex.check_sinh_intermediates, _sinh_intermediates(save="copies"),
           "SinhWithIntermediates saved the intermediate exp(x) of shape (5,)",
           "a copy (`expx.clone()`) or a second `torch.exp(x)` breaks the double backward again")


def test_sinh_intermediates_saving_the_input():
    _fails(ex.check_sinh_intermediates, _sinh_intermediates(save="input"),
           "SinhWithIntermediates saved the input `x`", "exercise 7.1's way")


def test_sinh_intermediates_returning_detached_outputs():
    _fails(ex.check_sinh_intermediates, _sinh_intermediates(returned=lambda e: e.detach()),
           "double backward is wrong", "with respect to `x`", "`.detach()`")


def test_sinh_intermediates_marking_the_extra_outputs():
    _fails(ex.check_sinh_intermediates, _sinh_intermediates(mark=True),
           "SinhWithIntermediates: `expx` is not connected to autograd (no grad_fn).",
           "Do not pass them to ctx.mark_non_differentiable")


def test_sinh_intermediates_without_materialized_grads_and_no_none_check():
    _fails(ex.check_sinh_intermediates, _sinh_intermediates(materialize=False),
           "TypeError", "after `ctx.set_materialize_grads(False)`")


# --- CubeBackward --------------------------------------------------------------------------

def _cube_backward(backward):
    class CubeBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, grad_out, x):
            ctx.save_for_backward(grad_out, x)
            return grad_out * 3 * x**2

        @staticmethod
        def backward(ctx, grad):
            grad_out, x = ctx.saved_tensors
            return backward(grad, grad_out, x)

    return CubeBackward


def _right(grad, grad_out, x):
    return grad * 3 * x**2, grad * grad_out * 6 * x


def test_cube_backward_accepts_the_right_backward(capsys):
    ex.check_cube_backward(_cube_backward(_right))
    ex.check_cube_backward(_cube_backward(_right), shapes=[(), (3, 4)], seed=None)
    assert "✔ CubeBackward: forward, backward and double backward agree" in capsys.readouterr().out


def test_cube_backward_must_be_differentiable_again():
    """Its backward is Cube's third derivative: a backward that leaves torch for the x term fails."""
    def numpy_x_term(grad, grad_out, x):
        six_x = torch.as_tensor(6 * x.detach().numpy())
        return grad * 3 * x**2, grad * grad_out * six_x

    _fails(ex.check_cube_backward, _cube_backward(numpy_x_term), "CubeBackward: double backward is wrong")


def test_cube_backward_is_checked_at_zero():
    _fails(ex.check_cube_backward, _cube_backward(lambda g, go, x: (g * 3 * x**2, g * go * 6 * x**2 / x)),
           "wrong gradient for `x`")


def test_cube_backward_rejects_a_missing_grad_out_term():
    _fails(ex.check_cube_backward, _cube_backward(lambda g, go, x: (None, g * go * 6 * x)),
           "CubeBackward: wrong gradient for `grad_out`: backward returned None, but `grad_out` needs a gradient.",
           "expected tensor(")


def test_cube_backward_rejects_an_x_term_without_the_incoming_gradient():
    _fails(ex.check_cube_backward, _cube_backward(lambda g, go, x: (g * 3 * x**2, go * 6 * x)),
           "wrong gradient for `x`", "backward ignores grad_output")


def test_cube_backward_rejects_an_x_term_without_the_saved_grad_out():
    _fails(ex.check_cube_backward, _cube_backward(lambda g, go, x: (g * 3 * x**2, g * 6 * x)),
           "wrong gradient for `x`", "the saved grad_out, not the incoming gradient")


def test_cube_backward_rejects_gradients_in_the_wrong_order():
    _fails(ex.check_cube_backward, _cube_backward(lambda g, go, x: _right(g, go, x)[::-1]),
           "wrong gradient for `grad_out`", "is the incoming gradient times 3x²")


# --- hvp -----------------------------------------------------------------------------------

def _hvp(f, x, v):
    x = x.detach().requires_grad_()
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    return torch.autograd.grad(g, x, v)[0]


def test_hvp_accepts_the_double_backward_and_torch_functional(capsys):
    ex.check_hvp(_hvp)
    ex.check_hvp(_hvp, shapes=[(3,), (2, 3)], seed=None)
    ex.check_hvp(lambda f, x, v: torch.autograd.functional.hvp(f, x, v)[1], x_requires_grad=True)
    assert "hvp: H v agrees with the full Hessian for 8 function(s)" in capsys.readouterr().out


def test_hvp_without_create_graph_is_told_to_use_it():
    def hvp(f, x, v):
        x = x.detach().requires_grad_()
        (g,) = torch.autograd.grad(f(x), x)
        return torch.autograd.grad(g, x, v)[0]

    _fails(ex.check_hvp, hvp, "hvp raised RuntimeError: element 0 of tensors does not require grad",
           "f(x) = (x.sin() * x).sum()", "compute it with `torch.autograd.grad(..., create_graph=True)`")


def test_hvp_on_an_x_that_does_not_require_grad_is_told_to_copy_it():
    def hvp(f, x, v):
        (g,) = torch.autograd.grad(f(x), x, create_graph=True)
        return torch.autograd.grad(g, x, v)[0]

    _fails(ex.check_hvp, hvp, "f(x) has no graph because `x` does not require grad",
           "`x = x.detach().requires_grad_()`")


def test_hvp_with_a_vector_of_ones_is_recognised():
    def hvp(f, x, v):
        x = x.detach().requires_grad_()
        (g,) = torch.autograd.grad(f(x), x, create_graph=True)
        return torch.autograd.grad(g.sum(), x)[0]

    _fails(ex.check_hvp, hvp, "hvp(f, x, v) differs from H v.", "expected tensor(", "actual   tensor(",
           "this is H times a vector of ones")


def test_hvp_that_accumulates_in_x_grad_is_recognised():
    def hvp(f, x, v):
        x = x.detach().requires_grad_()
        f(x).backward(create_graph=True)
        x.grad.backward(v)
        return x.grad

    _fails(ex.check_hvp, hvp, "this is the gradient plus H v: `.backward()` adds into `x.grad`")


def test_hvp_returning_the_gradient_is_recognised():
    def hvp(f, x, v):
        x = x.detach().requires_grad_()
        return torch.autograd.grad(f(x), x)[0]

    _fails(ex.check_hvp, hvp, "this is the gradient of f, not H v")


def test_hvp_that_builds_the_hessian_is_rejected():
    def hvp(f, x, v):
        n = x.numel()
        return (torch.autograd.functional.hessian(f, x).reshape(n, n) @ v.flatten()).reshape(x.shape)

    _fails(ex.check_hvp, hvp, "ran 6 backward passes through f for an x of 5 elements",
           "(x.sin() * x).sum()", "two backward passes whatever the size of x")


def test_hvp_that_changes_the_callers_x_is_rejected():
    def hvp(f, x, v):
        x.requires_grad_()
        (g,) = torch.autograd.grad(f(x), x, create_graph=True)
        return torch.autograd.grad(g, x, v)[0]

    _fails(ex.check_hvp, hvp, "hvp changed the caller's x", "work on a copy")


def test_hvp_of_the_wrong_shape_is_rejected():
    _fails(ex.check_hvp, lambda f, x, v: _hvp(f, x, v).sum(),
           "hvp must return a tensor of the shape of x, (5,); got shape ()")


def test_hvp_with_torch_func_is_told_why_it_fails_on_classic_functions():
    _fails(ex.check_hvp, lambda f, x, v: torch.func.jvp(torch.func.grad(f), (x,), (v,))[1],
           "setup_context", "torch.func cannot transform")


def test_hvp_with_a_dot_product_fails_on_a_matrix_x():
    def hvp(f, x, v):
        x = x.detach().requires_grad_()
        (g,) = torch.autograd.grad(f(x), x, create_graph=True)
        return torch.autograd.grad(g @ v, x)[0]

    ex.check_hvp(hvp, shapes=[(5,)])  # right for vectors
    _fails(ex.check_hvp, hvp, "x = tensor([[", "is the dot product only when x is a vector",
           "grad_outputs=v")


def test_hvp_not_implemented():
    def hvp(f, x, v):
        raise NotImplementedError()

    _fails(ex.check_hvp, hvp, "hvp raised NotImplementedError", "not implemented yet")


def _hvp_changing_x(f, x, v):
    x.requires_grad_()
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    return torch.autograd.grad(g, x, v)[0]


def _hvp_without_create_graph(f, x, v):
    x = x.detach().requires_grad_()
    (g,) = torch.autograd.grad(f(x), x)
    return torch.autograd.grad(g, x, v)[0]


def _hvp_of_ones(f, x, v):
    x = x.detach().requires_grad_()
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    return torch.autograd.grad(g.sum(), x)[0]


def _hvp_by_hessian(f, x, v):
    n = x.numel()
    return (torch.autograd.functional.hessian(f, x).reshape(n, n) @ v.flatten()).reshape(x.shape)


def _message(check, student, **kwargs) -> str | None:
    try:
        check(student, **kwargs)
    except CheckFailed as failure:
        return str(failure)
    return None


@pytest.mark.parametrize("check, student, kwargs, right", [
    (ex.check_hvp, _hvp, {}, True),
    (ex.check_hvp, _hvp, {"shapes": [(2, 3)], "x_requires_grad": True}, True),
    (ex.check_hvp, lambda f, x, v: torch.autograd.functional.vhp(f, x, v, create_graph=True)[1], {}, True),
    (ex.check_hvp, _hvp_changing_x, {}, False),
    (ex.check_hvp, _hvp_without_create_graph, {}, False),
    (ex.check_hvp, _hvp_of_ones, {}, False),
    (ex.check_hvp, _hvp_by_hessian, {}, False),
    (ex.check_hvp, lambda f, x, v: _hvp(f, x, v).sum(), {}, False),
    (ex.check_hvp, lambda f, x, v: None, {}, False),
    (ex.check_hvp, lambda f, x, v: torch.func.jvp(torch.func.grad(f), (x,), (v,))[1], {}, False),
    (ex.check_sinh, _sinh("output"), {}, True),
    (ex.check_sinh, _sinh("intermediates"), {}, False),
    (ex.check_sinh, _sinh("output", cosh_of_output=lambda y: (1 + y**2).sqrt()), {}, False),
    (ex.check_sinh_intermediates, _sinh_intermediates(), {}, True),
    (ex.check_sinh_intermediates, _sinh_intermediates(extra=False), {}, False),
    (ex.check_sinh_intermediates, _sinh_intermediates(save="copies"), {}, False),
    (ex.check_sinh_intermediates, _sinh_intermediates(mark=True), {}, False),
    (ex.check_cube_backward, _cube_backward(lambda g, go, x: _right(g, go, x)[::-1]), {}, False),
], ids=["hvp", "hvp-matrix-x-requires-grad", "vhp", "hvp-changes-x", "hvp-no-create-graph", "hvp-ones",
        "hvp-hessian", "hvp-shape", "hvp-none", "hvp-torch-func", "sinh", "sinh-intermediates", "sinh-overflow",
        "sinh-returns-intermediates", "sinh-returns-without-extra-terms", "sinh-returns-copies-saved",
        "sinh-returns-marked", "cube-order"])
def test_a_check_says_the_same_in_the_grader_as_in_the_kernel(check, student, kwargs, right):
    local = _message(check, student, **kwargs)
    assert (local is None) == right, local
    assert _message(check, Remote("student", loopback({"student": student})), **kwargs) == local


# --- The key of the graph questions matches the graphs ------------------------------------

class Tanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (y,) = ctx.saved_tensors
        return grad_out * (1 - y * y)


CubeBackward = _cube_backward(_right)  # named as in the notebook: its node is CubeBackwardBackward


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return CubeBackward.apply(grad_out, x)


def _drawn(function) -> tuple[graphs.Graph, torch.Tensor]:
    """The create_graph=True graph as the notebook draws it, and grad_x."""
    x = torch.tensor([0.5, 2.0], dtype=torch.float64, requires_grad=True)
    out = function.apply(x)
    grad_out = torch.ones_like(out)
    (grad_x,) = torch.autograd.grad(out, x, grad_out, create_graph=True)
    return graphs.draw({"out": out}, {"grad_x": grad_x}, inputs={"x": x, "grad_out": grad_out}), grad_x


def _model_answers() -> dict:
    nb = nbformat.read(authoring.solution_path("07_double_backward"), as_version=4)
    (answer,) = [e for e in exercises(nb) if e.answer_id == "graph_answers"]
    namespace: dict = {}
    exec(answer.solution, namespace)
    return namespace["graph_answers"]


def _busy() -> tuple[graphs.Graph, list]:
    """The busy graph of the tutorial's SinhWithIntermediates (only `out` used), and the
    grad_expx its backward received."""
    received = []
    base = _sinh_intermediates()

    class SinhWithIntermediates(base):
        @staticmethod
        def backward(ctx, grad_out, grad_expx, grad_expnegx):
            received.append(grad_expx.detach().clone())
            return base.backward(ctx, grad_out, grad_expx, grad_expnegx)

    x = torch.tensor([0.5, 1.0], dtype=torch.float64, requires_grad=True)
    out, expx, expnegx = SinhWithIntermediates.apply(x)
    grad_out = torch.ones_like(out)
    (grad_x,) = torch.autograd.grad(out, x, grad_out, create_graph=True)
    names = {"x": x, "expx": expx, "expnegx": expnegx, "grad_out": grad_out}
    return graphs.draw({"out": out}, {"grad_x": grad_x}, inputs=names), received


def test_the_graph_answers_are_what_the_graphs_show():
    key = _model_answers()
    tanh, _ = _drawn(Tanh)
    cube, cube_grad = _drawn(Cube)
    sinh, sinh_grad = _drawn(_sinh("intermediates"))
    busy, received = _busy()
    backward_pass = [n for n in tanh.nodes if n.backward_pass]
    shown = {
        "a": tanh.saved_by("TanhBackward"),
        "b": [str(len(backward_pass))],
        "c": sorted({f for n in backward_pass for f in n.next_functions} - {n.name for n in backward_pass}),
        "d": [type(cube_grad.grad_fn).__name__],
        "e": [s for s in cube.saved_by("CubeBackwardBackward") if s != "x"],
        "f": [str(cube.count("AccumulateGrad"))],
        "g": [type(fn).__name__ for fn, _ in cube_grad.grad_fn.next_functions if fn is not None],
        "h": [str(len(sinh.backward_pass()))],
        "i": sorted({str(int(v)) for g in received for v in g.tolist()}),
        "j": [str(len(busy.saved_by("SinhWithIntermediatesBackward")))],
    }
    assert busy.saved_by("SinhWithIntermediatesBackward") == ["expx", "expnegx"]
    assert sinh_grad.grad_fn is None
    assert set(key) == set(ex.GRAPH_QUESTIONS) and set(key.values()) <= set(ex.GRAPH_CHOICES)
    assert {q: [a] for q, a in key.items()} == shown
