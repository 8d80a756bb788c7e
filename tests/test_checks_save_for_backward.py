"""Unit tests of autograder.exercises.save_for_backward (notebook 06), messages included,
and of the answer key of its written exercise, which is checked against torch itself."""
from __future__ import annotations

import ast
import contextlib

import nbformat
import pytest
import torch

from autograder import authoring
from autograder.checks.remote import Remote, loopback
from autograder.student.report import CheckFailed
from autograder.exercises.save_for_backward import check_saved_by, check_sigmoid, check_sort, check_tanh_


def function(name, forward, backward):
    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward),
    })


def failure(check, answer, **kwargs) -> str:
    with pytest.raises(CheckFailed) as info:
        check(answer, **kwargs)
    return str(info.value)


# --- saved_by ------------------------------------------------------------------------------

def saved_by_with(memory=lambda t: t.untyped_storage().data_ptr(), nbytes=lambda t: t.numel() * t.element_size(),
                  hooks=True):
    def saved_by(fn, *args):
        packed = []

        def pack(t):
            packed.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if hooks else contextlib.nullcontext():
            result = fn.apply(*args)
        outputs = result if isinstance(result, tuple) else (result,)
        entries = []
        for t in packed:
            if any(memory(t) == memory(o) for o in outputs):
                kind = "output"
            elif any(isinstance(a, torch.Tensor) and memory(t) == memory(a) for a in args):
                kind = "input"
            else:
                kind = "intermediate"
            entries.append((kind, tuple(t.shape), nbytes(t)))
        return entries

    return saved_by


def test_saved_by_right(capsys):
    check_saved_by(saved_by_with())
    check_saved_by(saved_by_with(), shape=(3, 2), seed=None)
    assert capsys.readouterr().out.count("✔ saved_by: right on 10 Functions") == 2


def test_saved_by_comparing_data_ptr_misses_a_view():
    message = failure(check_saved_by, saved_by_with(memory=lambda t: t.data_ptr()))
    assert message.startswith("saved_by on `SquareTail.apply(x)  # saves x[1:], a view of x` is wrong.")
    assert "expected [('input', (3,), 24)]" in message and "actual   [('intermediate', (3,), 24)]" in message
    assert "t.untyped_storage().data_ptr()" in message


def test_saved_by_counting_elements():
    assert "t.numel() * t.element_size()" in failure(check_saved_by, saved_by_with(nbytes=lambda t: t.numel()))


def test_saved_by_without_hooks():
    assert "nothing was recorded" in failure(check_saved_by, saved_by_with(hooks=False))


def test_saved_by_of_the_wrong_form():
    message = failure(check_saved_by, lambda fn, *args: {"input": 1})
    assert message == "saved_by must return a list of (kind, shape, nbytes) tuples; on `Square.apply(x)  # saves its input` it returned dict."
    message = failure(check_saved_by, lambda fn, *args: [("the input", (4,), 32)])
    assert "kind must be 'input', 'output' or 'intermediate', got 'the input'" in message


def test_saved_by_not_implemented():
    def saved_by(fn, *args):
        raise NotImplementedError()

    assert "not implemented yet" in failure(check_saved_by, saved_by)


# --- Sigmoid -------------------------------------------------------------------------------

def sigmoid(save="output", stash=False):
    def forward(ctx, x):
        y = torch.sigmoid(x)
        saved = {"output": (y,), "input": (x,), "exp(-x)": (torch.exp(-x),), "detached": (y.detach(),)}[save]
        if stash:
            ctx.y = y
        else:
            ctx.save_for_backward(*saved)
        return y

    def backward(ctx, grad_output):
        y = ctx.y if stash else torch.sigmoid(ctx.saved_tensors[0]) if save == "input" else (
            1 / (1 + ctx.saved_tensors[0]) if save == "exp(-x)" else ctx.saved_tensors[0])
        return grad_output * y * (1 - y)

    return function("Sigmoid", forward, backward)


def test_sigmoid_right(capsys):
    check_sigmoid(sigmoid())
    check_sigmoid(sigmoid(), shapes=[(), (2, 3, 4)], seed=None)
    out = capsys.readouterr().out
    assert "✔ Sigmoid saves exactly its output (48 bytes for x of shape (2, 3)), nothing on ctx." in out
    assert "✔ Sigmoid: forward, backward and double backward agree with the reference on 2 input(s)" in out


def test_sigmoid_saving_the_intermediate():
    message = failure(check_sigmoid, sigmoid(save="exp(-x)"))
    assert message.startswith(
        "Sigmoid saved the intermediate exp(-x) of shape (5,), 40 bytes: save only the output: σ'(x) = y·(1 − y)"
    )
    assert "cannot be differentiated again (double backward)" in message


def test_sigmoid_saving_the_input():
    message = failure(check_sigmoid, sigmoid(save="input"))
    assert message.startswith("Sigmoid saved the input `x` of shape (5,), 40 bytes")
    assert "recomputes sigmoid(x)" in message


def test_sigmoid_stashing_its_output():
    message = failure(check_sigmoid, sigmoid(stash=True))
    assert message.startswith("Sigmoid: tensor `ctx.y` (the output of shape (5,), 40 bytes) is stashed on ctx.")
    assert "cannot check its version" in message and "reference cycle" in message


def test_sigmoid_saving_a_detached_output_fails_double_backward():
    message = failure(check_sigmoid, sigmoid(save="detached"))
    assert message.startswith(
        "Sigmoid: double backward is wrong: the gradient of your gradient with respect to `x` differs from the reference."
    )
    assert ".detach()" in message


# --- Tanh_ ---------------------------------------------------------------------------------

def tanh_(mark=True, in_place=True, save_copy=False, backward_in_place=False):
    def forward(ctx, x):
        copy = x.clone()
        y = x.tanh_() if in_place else torch.tanh(x)
        if mark and in_place:
            ctx.mark_dirty(x)
        ctx.save_for_backward(copy if save_copy else y)
        return y

    def backward(ctx, grad_output):
        (saved,) = ctx.saved_tensors
        y = torch.tanh(saved) if save_copy else saved
        return grad_output * (1 - y.pow_(2) if backward_in_place else 1 - y * y)

    return function("Tanh_", forward, backward)


def test_tanh_right(capsys):
    check_tanh_(tanh_())
    check_tanh_(tanh_(), shapes=[(), (2, 3, 4)], seed=None)
    assert "✔ Tanh_ modifies its input in place, returns it, and declares it with ctx.mark_dirty." in capsys.readouterr().out


def test_tanh_without_mark_dirty():
    message = failure(check_tanh_, tanh_(mark=False))
    assert message.startswith("Tanh_ returned a view of x, not x itself.")
    assert "Call ctx.mark_dirty(x) and return x." in message


def test_tanh_out_of_place():
    assert failure(check_tanh_, tanh_(in_place=False)).startswith("Tanh_ did not modify its input")


def test_tanh_saving_a_copy_of_its_input():
    message = failure(check_tanh_, tanh_(save_copy=True))
    assert message.startswith("Tanh_ saved the intermediate x.clone() of shape (5,), 40 bytes")
    assert "an in-place Function exists to save memory" in message


def test_tanh_modifying_the_saved_output_in_backward():
    message = failure(check_tanh_, tanh_(backward_in_place=True))
    assert message.startswith("Tanh_: backward modified a saved tensor in place: the output of shape (5,)")


def test_tanh_marking_dirty_but_returning_a_new_tensor():
    def forward(ctx, x):
        x.tanh_()
        ctx.mark_dirty(x)
        return x.clone()

    message = failure(check_tanh_, function("Tanh_", forward, lambda ctx, g: g))
    assert "return x itself, not a new tensor" in message


# --- Sort ----------------------------------------------------------------------------------

def sort(backward_op="scatter", mark="indices", indices_dtype=None):
    def forward(ctx, x, dim):
        values, indices = torch.sort(x, dim)
        ctx.mark_non_differentiable({"indices": indices, "values": values}[mark])
        ctx.save_for_backward(indices)
        ctx.dim = dim
        return values, indices if indices_dtype is None else indices.to(indices_dtype)

    def backward(ctx, grad_values, grad_indices):
        (indices,) = ctx.saved_tensors
        if backward_op == "gather":
            return grad_values.gather(ctx.dim, indices), None
        return torch.zeros_like(grad_values).scatter(ctx.dim, indices, grad_values), None

    return function("Sort", forward, backward)


def test_sort_right(capsys):
    check_sort(sort())
    check_sort(sort(), shapes=[(2, 3, 4), (5,), (4, 3)], dims=[1, -1, 0], seed=None)
    assert "✔ Sort saves exactly the indices (96 bytes for x of shape (3, 4)), nothing on ctx." in capsys.readouterr().out


def test_sort_gathering():
    message = failure(check_sort, sort(backward_op="gather"))
    assert message.startswith("Sort: wrong gradient for `x`.")
    assert "scatter(dim, indices, grad_values)" in message


def test_sort_with_float_indices():
    assert failure(check_sort, sort(indices_dtype=torch.float64)).startswith(
        "Sort: the indices have dtype torch.float64, expected torch.int64."
    )


def test_sort_marking_the_values():
    message = failure(check_sort, sort(mark="values"))
    assert message.startswith("Sort: the values are not connected to autograd (no grad_fn).")
    assert "pass them, not the values, to ctx.mark_non_differentiable" in message


# --- In the grader: the same messages, the student's code answering through the wire -------

def remote(answer):
    return Remote("answer", loopback({"answer": answer}))


WRONG = {
    "saved_by compares data_ptr()": (check_saved_by, saved_by_with(memory=lambda t: t.data_ptr())),
    "saved_by without hooks": (check_saved_by, saved_by_with(hooks=False)),
    "saved_by raises": (check_saved_by, lambda fn, *args: fn.nothing),
    "Sigmoid saves exp(-x)": (check_sigmoid, sigmoid(save="exp(-x)")),
    "Sigmoid stashes its output": (check_sigmoid, sigmoid(stash=True)),
    "Sigmoid saves a detached output": (check_sigmoid, sigmoid(save="detached")),
    "Tanh_ without mark_dirty": (check_tanh_, tanh_(mark=False)),
    "Tanh_ out of place": (check_tanh_, tanh_(in_place=False)),
    "Tanh_ modifies the saved output": (check_tanh_, tanh_(backward_in_place=True)),
    "Sort gathers": (check_sort, sort(backward_op="gather")),
    "Sort with float indices": (check_sort, sort(indices_dtype=torch.float64)),
    "Sort marks the values": (check_sort, sort(mark="values")),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_the_grader_fails_a_wrong_answer_with_the_kernels_message(case):
    check, answer = WRONG[case]
    assert failure(check, remote(answer)) == failure(check, answer)


@pytest.mark.parametrize("check, answer", [
    (check_saved_by, saved_by_with()), (check_sigmoid, sigmoid()), (check_tanh_, tanh_()), (check_sort, sort()),
], ids=["saved_by", "Sigmoid", "Tanh_", "Sort"])
def test_the_grader_passes_a_right_answer_with_the_kernels_report(capsys, check, answer):
    check(answer)
    local = capsys.readouterr().out
    check(remote(answer))
    assert capsys.readouterr().out == local


# --- The answer key of "error, silently wrong, or correct?" --------------------------------

def _key() -> dict[str, str]:
    nb = nbformat.read(authoring.solution_path("06_save_for_backward"), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "check_what_happens_hidden")
    call = next(n for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Call))
    return ast.literal_eval(next(k.value for k in call.keywords if k.arg == "key"))


def _saves(ctx, t):
    ctx.save_for_backward(t)


Exp = function("Exp", lambda ctx, x: (_saves(ctx, y := x.exp()), y)[1], lambda ctx, g: g * ctx.saved_tensors[0])
Square = function("Square", lambda ctx, x: (_saves(ctx, x), x * x)[1], lambda ctx, g: 2 * ctx.saved_tensors[0] * g)


def _exp_on_ctx(ctx, x):
    ctx.y = x.exp()
    return ctx.y


ExpOnCtx = function("ExpOnCtx", _exp_on_ctx, lambda ctx, g: g * ctx.y)


def _in_place(op, mark, save=False):
    def forward(ctx, x):
        op(x)
        if mark:
            ctx.mark_dirty(x)
        if save:
            ctx.save_for_backward(x)
        return x

    return forward


Double_ = function("Double_", _in_place(lambda x: x.mul_(2), mark=True), lambda ctx, g: g * 2)
DoubleNoMark = function("DoubleNoMark", _in_place(lambda x: x.mul_(2), mark=False), lambda ctx, g: g * 2)
Tanh_ = function("Tanh_", _in_place(torch.Tensor.tanh_, mark=True, save=True),
                 lambda ctx, g: g * (1 - ctx.saved_tensors[0] ** 2))


def _sincos(ctx, x):
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x)
    return x.sin(), x.cos()


SinCos = function("SinCos", _sincos,
                  lambda ctx, gs, gc: gs * ctx.saved_tensors[0].cos() - gc * ctx.saved_tensors[0].sin())


def _sinh_intermediates(ctx, x):
    ex, enx = x.exp(), (-x).exp()
    ctx.save_for_backward(ex, enx)
    return (ex - enx) / 2


SinhSavesIntermediates = function("SinhSavesIntermediates", _sinh_intermediates,
                                  lambda ctx, g: g * sum(ctx.saved_tensors) / 2)


def _exp_then_double(fn):
    x = torch.tensor([0.5, 1.0], dtype=torch.float64, requires_grad=True)
    y = fn.apply(x)
    y.mul_(2)
    y.sum().backward()
    return x.grad, 2 * x.detach().exp()


def _square_then(modify):
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    y = Square.apply(x)
    modify(x)
    y.sum().backward()
    return x.grad, torch.tensor([2.0, 4.0], dtype=torch.float64)


def _plus_h(fn):
    x = torch.tensor([0.5, 1.0], dtype=torch.float64, requires_grad=True)
    h = x * 2
    y = fn.apply(h)
    (y + h).sum().backward()
    exact = torch.func.grad(lambda t: 2 * ((2 * t).tanh() if fn is Tanh_ else 2 * (2 * t)).sum())(x.detach())
    return x.grad, exact


def _allow_mutation():
    with torch.autograd.graph.allow_mutation_on_saved_tensors():
        return _exp_then_double(Exp)


def _double_on_a_leaf():
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    Double_.apply(x).sum().backward()
    return x.grad, torch.full((2,), 2.0, dtype=torch.float64)


def _sin_only():
    x = torch.tensor([0.5, 1.0], dtype=torch.float64, requires_grad=True)
    sin, _ = SinCos.apply(x)
    sin.sum().backward()
    return x.grad, x.detach().cos()


def _gradient_penalty():
    x = torch.tensor([0.5, 1.0], dtype=torch.float64, requires_grad=True)
    y = SinhSavesIntermediates.apply(x)
    (gx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    (y.sum() + (gx**2).sum()).backward()
    x0 = x.detach()
    return x.grad, x0.cosh() + 2 * x0.cosh() * x0.sinh()


SCENARIOS = {
    "a": lambda: _exp_then_double(Exp),
    "b": lambda: _exp_then_double(ExpOnCtx),
    "c": _allow_mutation,
    "d": lambda: _square_then(lambda x: x.data.mul_(10)),
    "e": lambda: _square_then(lambda x: x.detach().mul_(10)),
    "f": _double_on_a_leaf,
    "g": lambda: _plus_h(DoubleNoMark),
    "h": lambda: _plus_h(Tanh_),
    "i": _sin_only,
    "j": _gradient_penalty,
}


@pytest.mark.parametrize("question", sorted(SCENARIOS))
def test_the_answer_key_is_what_torch_does(question):
    try:
        got, exact = SCENARIOS[question]()
        outcome = "correct" if torch.allclose(got, exact) else "silently wrong"
    except (RuntimeError, TypeError):
        outcome = "error"
    assert outcome == _key()[question]
