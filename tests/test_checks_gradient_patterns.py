"""Unit tests of the checks of notebook 04_gradient_patterns: right answers pass, and each
kind of wrong answer fails with the message that names its mistake."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from autograder.checks.remote import Remote, loopback
from autograder.exercises import gradient_patterns as gp
from autograder.student.report import CheckFailed


def function(forward, backward, name="Student"):
    """A Function class from a forward(ctx, ...) and a backward(ctx, grad_output)."""
    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def fails(check, *args, **kwargs) -> str:
    with pytest.raises(CheckFailed) as info:
        check(*args, **kwargs)
    return str(info.value)


# --- 4.1 GELU ----------------------------------------------------------------------------

def _cdf(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


def _pdf(x):
    return torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _gelu_forward(ctx, x):
    ctx.save_for_backward(x)
    return x * _cdf(x)


def _gelu(slope):
    return function(_gelu_forward, lambda ctx, g: g * slope(ctx.saved_tensors[0]))


def test_gelu_right():
    gp.check_gelu(_gelu(lambda x: _cdf(x) + x * _pdf(x)), shapes=[(5,), ()])


def test_gelu_missing_term_names_the_product_rule():
    message = fails(gp.check_gelu, _gelu(_cdf))
    assert "wrong gradient for `x`" in message and "product rule" in message


# --- 4.2 BatchedMatmul -------------------------------------------------------------------

def _matmul_forward(ctx, a, b):
    ctx.save_for_backward(a, b)
    return a @ b


def test_batched_matmul_right():
    gp.check_batched_matmul(function(_matmul_forward,
                                     lambda ctx, g: (g @ ctx.saved_tensors[1].mT, ctx.saved_tensors[0].mT @ g)))


def test_batched_matmul_transposed_gradient():
    wrong = function(_matmul_forward, lambda ctx, g: (g @ ctx.saved_tensors[1].mT, g.mT @ ctx.saved_tensors[0]))
    message = fails(gp.check_batched_matmul, wrong)
    assert "gradient for `b` has shape (2, 4) but `b` has shape (4, 2)" in message and "swapped" in message


def test_batched_matmul_hint_names_the_shape():
    wrong = function(_matmul_forward, lambda ctx, g: (2 * g @ ctx.saved_tensors[1].mT, ctx.saved_tensors[0].mT @ g))
    message = fails(gp.check_batched_matmul, wrong, sizes=[((2,), 3, 4, 5)])
    assert "wrong gradient for `a`" in message and "2 times the right one" in message


# --- 4.3 unbroadcast ---------------------------------------------------------------------

def unbroadcast(grad, shape):  # also the global that course_unbroadcast substitutes (see Affine)
    return grad.sum_to_size(tuple(shape))


def test_unbroadcast_right():
    gp.check_unbroadcast(unbroadcast)


def _dims(grad, shape):
    """(prepended dims, expanded dims) of grad for an input of shape `shape`."""
    lead = grad.dim() - len(shape)
    return list(range(lead)), [lead + i for i, n in enumerate(shape) if n == 1]


def _summed(grad, dims, keepdim=False):
    return grad.sum(dims, keepdim=keepdim) if dims else grad


def _empty_tuple_trap(grad, shape):
    prepended, expanded = _dims(grad, shape)
    return _summed(grad.sum(dim=tuple(prepended)), [d - len(prepended) for d in expanded], keepdim=True)


def _prepended_only(grad, shape):
    return _summed(grad, _dims(grad, shape)[0])


def _expanded_only(grad, shape):
    return _summed(grad, _dims(grad, shape)[1], keepdim=True)


def _without_keepdim(grad, shape):
    prepended, expanded = _dims(grad, shape)
    return _summed(grad, prepended + expanded)


def _from_the_left(grad, shape):
    trailing = list(range(len(shape), grad.dim()))
    return _summed(_summed(grad, trailing), [i for i, n in enumerate(shape) if n == 1], keepdim=True)


def _mean(grad, shape):
    return grad.sum_to_size(shape) * (math.prod(shape) / max(1, grad.numel()))


@pytest.mark.parametrize(
    "student, expected",
    [
        (_empty_tuple_trap, "sums over *every* dim"),
        (_prepended_only, "only the prepended dims"),
        (_expanded_only, "prepended are still there"),
        (_without_keepdim, "without keepdim=True"),
        (_from_the_left, "matched from the left"),
        (_mean, "not the mean"),
    ],
)
def test_unbroadcast_names_each_known_mistake(student, expected):
    assert expected in fails(gp.check_unbroadcast, student)


def test_unbroadcast_must_return_a_tensor():
    assert "returned list, not a tensor" in fails(gp.check_unbroadcast, lambda g, s: g.sum_to_size(s).tolist())


def test_unbroadcast_must_not_modify_grad():
    def in_place(grad, shape):
        out = grad.sum_to_size(shape).clone()
        grad.zero_()
        return out

    assert "modified `grad` in place" in fails(gp.check_unbroadcast, in_place)


def test_unbroadcast_keeps_dtype():
    message = fails(gp.check_unbroadcast, lambda g, s: g.sum_to_size(s).float())
    assert "torch.float32" in message and "keep grad's dtype" in message


def test_unbroadcast_error_is_reported():
    def broken(grad, shape):
        raise ValueError("nope")

    message = fails(gp.check_unbroadcast, broken)
    assert "unbroadcast raised ValueError: nope" in message and "grad = " in message


def test_unbroadcast_tensor_tied_to_the_cpu_shows_on_meta():
    def on_cpu(grad, shape):
        out = torch.zeros(tuple(shape), dtype=grad.dtype)
        return out + grad.sum_to_size(shape)

    assert "on another device (meta)" in fails(gp.check_unbroadcast, on_cpu)


def test_unbroadcast_with_an_operation_meta_lacks_is_not_failed(capsys):
    def via_item(grad, shape):
        if grad.device.type == "meta":
            raise NotImplementedError("no meta kernel")
        return grad.sum_to_size(shape)

    gp.check_unbroadcast(via_item)
    assert "meta device: not checked" in capsys.readouterr().out


# --- 4.4 Affine --------------------------------------------------------------------------

def _affine_forward(ctx, x, weight, bias):
    ctx.save_for_backward(x, weight)
    ctx.bias_shape = bias.shape
    return x * weight + bias


def _affine_backward(ctx, g):
    x, weight = ctx.saved_tensors
    return unbroadcast(g * weight, x.shape), unbroadcast(g * x, weight.shape), unbroadcast(g, ctx.bias_shape)


Affine = function(_affine_forward, _affine_backward, "Affine")


def test_affine_right(capsys):
    gp.check_affine(Affine)
    assert "course's unbroadcast in place of yours" in capsys.readouterr().out


def test_affine_is_graded_with_the_course_unbroadcast(monkeypatch):
    wrong = lambda grad, shape: grad  # noqa: E731  (a wrong unbroadcast, graded by exercise 4.3 only)
    monkeypatch.setitem(globals(), "unbroadcast", wrong)
    gp.check_affine(Affine)
    assert globals()["unbroadcast"] is wrong  # restored after the check


def test_affine_without_unbroadcast_fails_although_the_engine_hides_it():
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        return g * weight, g * x, g

    message = fails(gp.check_affine, function(_affine_forward, backward))
    assert "returned a gradient of shape (2, 3, 4) for `weight`, which has shape (3, 1)" in message
    assert "engine sums" in message


def test_affine_hint_names_the_local_gradient():
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        return unbroadcast(g * x, x.shape), unbroadcast(g * x, weight.shape), unbroadcast(g, ctx.bias_shape)

    message = fails(gp.check_affine, function(_affine_forward, backward))
    assert "wrong gradient for `x`" in message and "grad_output * weight" in message


# --- 4.5 Mean ----------------------------------------------------------------------------

def _mean_forward(ctx, x, dim, keepdim=False):
    ctx.shape, ctx.dim, ctx.keepdim = x.shape, dim, keepdim
    return x.mean(dim, keepdim=keepdim)


def _mean(unsqueeze=True, gradients=3):
    def backward(ctx, g):
        if unsqueeze and not ctx.keepdim:
            g = g.unsqueeze(ctx.dim)
        return (g.expand(ctx.shape) / ctx.shape[ctx.dim], None, None)[:gradients]

    return function(_mean_forward, backward)


def test_mean_right():
    gp.check_mean(_mean())


def test_mean_without_unsqueeze_on_a_square_input_is_a_transpose():
    message = fails(gp.check_mean, _mean(unsqueeze=False))
    assert "wrong gradient for `x`" in message and "transpose of the right one" in message


def test_mean_hint_names_n_and_unsqueeze():
    message = fails(gp.check_mean, _mean(unsqueeze=False), specs=[((3, 3, 3), 1, False)])
    assert "contributes 1/3" in message and "unsqueeze grad_output at dim 1" in message


def test_mean_wrong_number_of_gradients():
    assert "backward returned 1 gradient(s), but forward takes 3 input(s)" in fails(gp.check_mean, _mean(gradients=1))


# --- 4.6 Max -----------------------------------------------------------------------------

def _max_forward(ctx, x, dim, keepdim=False):
    out = x.amax(dim, keepdim=True)
    ctx.save_for_backward(x == out)
    ctx.dim, ctx.keepdim = dim, keepdim
    return out if keepdim else out.squeeze(dim)


def _max(share):
    def backward(ctx, g):
        (is_max,) = ctx.saved_tensors
        g = g if ctx.keepdim else g.unsqueeze(ctx.dim)
        return g * share(is_max, ctx.dim), None, None

    return function(_max_forward, backward)


def _equal_split(is_max, dim):
    return is_max / is_max.sum(dim, keepdim=True)


def test_max_right_although_gradcheck_fails_at_three_way_ties():
    gp.check_max(_max(_equal_split))
    x = torch.tensor([3.0, 3.0, 3.0, 0.0], dtype=torch.float64, requires_grad=True)
    assert not torch.autograd.gradcheck(lambda t: _max(_equal_split).apply(t, 0), (x,), raise_exception=False)


def test_crafted_ties_include_two_three_and_all_way_ties():
    counts = set()
    for x, dim, _ in gp.CRAFTED_TIES:
        counts |= set((x == x.amax(dim, keepdim=True)).sum(dim).flatten().tolist())
    assert {2, 3, 4} <= counts


def test_max_whole_gradient_to_every_tied_entry():
    message = fails(gp.check_max, _max(lambda is_max, dim: is_max))
    assert "at a tie" in message and "every tied entry got the whole grad_output" in message


def test_max_whole_gradient_to_one_index():
    def first_only(is_max, dim):
        return torch.zeros_like(is_max, dtype=torch.float32).scatter(dim,
                                                                     is_max.to(torch.uint8).argmax(dim, keepdim=True),
                                                                     1.0)

    message = fails(gp.check_max, _max(first_only))
    assert "as torch.max(x, dim) does" in message


def test_max_other_split_gets_the_rule():
    def half_each(is_max, dim):
        return is_max * (0.5 if is_max.sum(dim).max() > 1 else 1.0)

    message = fails(gp.check_max, _max(half_each))
    assert "each tied entry gets grad_output / k" in message


def test_max_error_only_at_ties_is_reported():
    def unique_only(is_max, dim):
        if bool((is_max.sum(dim) > 1).any()):
            raise RuntimeError("ties are not supported")
        return is_max

    message = fails(gp.check_max, _max(unique_only))
    assert "Max on an input with ties: backward raised RuntimeError: ties are not supported" in message


def _max_squeezing_every_dim(ctx, x, dim, keepdim=False):
    out = x.amax(dim, keepdim=True)
    ctx.save_for_backward(x == out)
    ctx.dim, ctx.keepdim = dim, keepdim
    return out if keepdim else out.squeeze()  # also a batch of one


def _max_squeeze_unsqueeze(ctx, g):  # the same for either keepdim, unless another dim has size 1
    (is_max,) = ctx.saved_tensors
    return g.squeeze().unsqueeze(ctx.dim) * _equal_split(is_max, ctx.dim), None, None


def _max_shortcut_at_size_one(ctx, g):
    (is_max,) = ctx.saved_tensors
    if is_max.shape[ctx.dim] == 1:  # every entry is its slice's maximum; but keepdim=False?
        return g, None, None
    return _max(_equal_split).backward(ctx, g)


SIZE_ONE_MISTAKES = [
    (function(_max_squeezing_every_dim, _max(_equal_split).backward),
     "Max on x of shape (1, 5) (dim = 1, keepdim = False): forward has shape (), expected (1,)",
     "`squeeze()` without a dim removes every dim of size 1: the reduced one, and here also dim 0 of x"),
    (function(_max_forward, _max_squeeze_unsqueeze),
     "Max on x of shape (1, 5) (dim = 1, keepdim = False): backward raised IndexError",
     "dim 0 of x has size 1 and is not reduced (like a batch of one)"),
    (function(_max_forward, _max_shortcut_at_size_one),
     "Max on x of shape (3, 1, 4) (dim = 1, keepdim = False): the gradient for `x` has shape (3, 4)",
     "a reduced dim of size 1 is reduced like any other"),
]


@pytest.mark.parametrize("student, where, cause", SIZE_ONE_MISTAKES)
def test_max_names_a_mistake_only_a_dim_of_size_one_shows(student, where, cause):
    gp.check_max(student, specs=[spec for spec in gp.MAX_CASES if 1 not in spec[0]])  # right without such dims
    message = fails(gp.check_max, student)
    assert where in message and "it is right" in message and cause in message


def test_max_hidden_dims_of_size_one():
    gp.check_max(_max(_equal_split), specs=[((1, 2, 3), 2, False), ((4, 1), -1, False)], seed=None)
    for student, _, _ in SIZE_ONE_MISTAKES:
        assert "Max on x of shape" in fails(gp.check_max, student, specs=[((1, 2, 3), 2, False), ((4, 1), -1, False)])


def test_max_mistake_of_any_shape_is_not_blamed_on_a_dim_of_size_one():
    def no_unsqueeze(ctx, g):
        (is_max,) = ctx.saved_tensors
        return g * _equal_split(is_max, ctx.dim), None, None

    message = fails(gp.check_max, function(_max_forward, no_unsqueeze))
    assert message.startswith("Max: backward raised") and "size 1" not in message


# --- 4.7 Conv2d --------------------------------------------------------------------------

def _conv_forward(ctx, input, weight, bias=None, stride=1, padding=0):
    ctx.save_for_backward(input, weight)
    ctx.stride, ctx.padding = stride, padding
    return F.conv2d(input, weight, bias, stride, padding)


def _conv(bias_grad):
    def backward(ctx, g):
        input, weight = ctx.saved_tensors
        return (
            torch.nn.grad.conv2d_input(input.shape, weight, g, ctx.stride, ctx.padding),
            torch.nn.grad.conv2d_weight(input, weight.shape, g, ctx.stride, ctx.padding),
            bias_grad(g) if ctx.needs_input_grad[2] else None,
            None,
            None,
        )

    return function(_conv_forward, backward)


def test_conv2d_right():
    gp.check_conv2d(_conv(lambda g: g.sum((0, 2, 3))))


def test_conv2d_bias_gradient_of_the_first_sample_only():
    message = fails(gp.check_conv2d, _conv(lambda g: g[0].sum((1, 2))),
                    sizes=[((2, 1, 3, 4), (2, 1, 2, 3), True, 1, 1)])
    assert "wrong gradient for `bias`" in message and "sum grad_output over dims 0, 2 and 3" in message


@pytest.mark.parametrize("seed", range(40))
def test_every_draw_has_a_convolution_whose_axes_differ_in_everything(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    (n, c, h, w), (out, c_w, kh, kw), bias, (sh, sw), (ph, pw) = gp.per_axis_sizes(g)
    assert h != w and kh != kw and sh != sw and ph != pw and c == c_w and bias
    assert (h + 2 * ph - kh) % sh != (w + 2 * pw - kw) % sw  # conv_transpose2d's output_padding differs too
    x = F.conv2d(torch.zeros(n, c, h, w), torch.zeros(out, c, kh, kw), None, (sh, sw), (ph, pw))
    assert min(x.shape[-2:]) >= 1
    assert len(gp._conv_cases([])(g)) == 1  # and every list of sizes gets one


def _first_axis_for_both(ctx, g):
    """A backward that takes the stride and padding of the height for both axes."""
    input, weight = ctx.saved_tensors
    first = tuple(v if isinstance(v, int) else v[0] for v in (ctx.stride, ctx.padding))
    return (torch.nn.grad.conv2d_input(input.shape, weight, g, *first),
            torch.nn.grad.conv2d_weight(input, weight.shape, g, *first),
            g.sum((0, 2, 3)) if ctx.needs_input_grad[2] else None, None, None)


def test_conv2d_one_axis_used_for_both_fails_even_on_square_sizes():
    square = [((1, 2, 4, 4), (2, 2, 3, 3), True, 1, 0), ((1, 1, 6, 6), (2, 1, 3, 3), False, 2, 1)]
    message = fails(gp.check_conv2d, function(_conv_forward, _first_axis_for_both), sizes=square)
    assert "Conv2d:" in message and "stride = (" in message


def test_conv2d_backward_must_stay_differentiable():
    def backward(ctx, g):
        input, weight = ctx.saved_tensors
        return (torch.nn.grad.conv2d_input(input.shape, weight.detach(), g, ctx.stride, ctx.padding),
                torch.nn.grad.conv2d_weight(input, weight.shape, g, ctx.stride, ctx.padding),
                g.sum((0, 2, 3)) if ctx.needs_input_grad[2] else None, None, None)

    message = fails(gp.check_conv2d, function(_conv_forward, backward))
    assert "double backward is wrong" in message and "`weight`" in message


# --- shared helpers ----------------------------------------------------------------------

def test_known_mistake_skips_mistakes_that_cannot_run():
    def impossible():
        raise RuntimeError("shapes do not fit")

    actual = torch.ones(2)
    assert gp._known_mistake(actual, [(impossible, "no"), (lambda: torch.ones(2), "yes")]) == "yes"
    assert gp._known_mistake(actual, [(lambda: torch.zeros(2), "no")]) is None


# --- the same verdicts through a student's process ----------------------------------------

def _outcome(check, student, capsys, **kwargs) -> tuple[str | None, str]:
    """(failure message or None, what the check printed)."""
    try:
        check(student, **kwargs)
        message = None
    except CheckFailed as failure:
        message = str(failure)
    return message, capsys.readouterr().out


def same_remotely(check, student, name, capsys, **kwargs) -> tuple[str | None, str]:
    """Run `check` on `student` here and through Remote(name, loopback(...)): the same
    failure message either way. Returns it (None if the check passed) and what the check
    printed remotely."""
    local = _outcome(check, student, capsys, **kwargs)
    remote = _outcome(check, Remote(name, loopback({name: student})), capsys, **kwargs)
    assert remote[0] == local[0]
    return remote


def _in_place(grad, shape):
    out = grad.sum_to_size(shape).clone()
    grad.zero_()
    return out


def _on_cpu(grad, shape):
    return torch.zeros(tuple(shape), dtype=grad.dtype) + grad.sum_to_size(shape)


def _tuples_only(grad, shape):  # fails where a backward would pass x.shape, a torch.Size
    return grad if isinstance(shape, torch.Size) else grad.sum_to_size(shape)


@pytest.mark.parametrize(
    "student, expected",
    [
        (unbroadcast, None),
        (_without_keepdim, "without keepdim=True"),
        (_from_the_left, "matched from the left"),
        (lambda g, s: g.sum_to_size(s).tolist(), "returned list, not a tensor"),
        (lambda g, s: g.sum_to_size(s).float(), "torch.float32"),
        (_in_place, "modified `grad` in place"),
        (_on_cpu, "on another device (meta)"),
        (_tuples_only, "unbroadcast(grad, torch.Size([3, 1])) has shape (2, 3, 4), expected (3, 1)"),
    ],
)
def test_unbroadcast_verdicts_are_the_same_remotely(student, expected, capsys):
    message, printed = same_remotely(gp.check_unbroadcast, student, "unbroadcast", capsys)
    assert message is None if expected is None else expected in message
    assert message is not None or "meta device: no tensor is tied to the CPU" in printed


def test_unbroadcast_error_is_the_same_remotely(capsys):
    def broken(grad, shape):
        raise ValueError("nope")

    message, _ = same_remotely(gp.check_unbroadcast, broken, "unbroadcast", capsys)
    assert "unbroadcast raised ValueError: nope" in message


def test_affine_verdicts_are_the_same_remotely(capsys, monkeypatch):
    def engine_sums(ctx, g):
        x, weight = ctx.saved_tensors
        return g * weight, g * x, g

    message, printed = same_remotely(gp.check_affine, Affine, "Affine", capsys)
    assert message is None and "course's unbroadcast in place of yours" in printed
    message, _ = same_remotely(gp.check_affine, function(_affine_forward, engine_sums), "Affine", capsys)
    assert "returned a gradient of shape (2, 3, 4) for `weight`" in message

    wrong = lambda grad, shape: grad  # noqa: E731  (graded by exercise 4.3 only)
    monkeypatch.setitem(globals(), "unbroadcast", wrong)
    assert same_remotely(gp.check_affine, Affine, "Affine", capsys)[0] is None
    assert globals()["unbroadcast"] is wrong  # restored in the student's namespace


def test_max_verdict_at_ties_is_the_same_remotely(capsys):
    message, _ = same_remotely(gp.check_max, _max(lambda is_max, dim: is_max), "Max", capsys)
    assert "every tied entry got the whole grad_output" in message


@pytest.mark.parametrize("student, where, cause", SIZE_ONE_MISTAKES)
def test_max_verdict_at_a_dim_of_size_one_is_the_same_remotely(student, where, cause, capsys):
    message, _ = same_remotely(gp.check_max, student, "Max", capsys)
    assert where in message and cause in message


# --- the classes of mistakes this quality pass added checks for ---------------------------

def test_gelu_must_be_differentiable_twice():
    def forward(ctx, x):
        ctx.save_for_backward(_cdf(x) + x * _pdf(x))  # the derivative, computed in forward
        return x * _cdf(x)

    message = fails(gp.check_gelu, function(forward, lambda ctx, g: g * ctx.saved_tensors[0]))
    assert "double backward is wrong" in message and "an intermediate saved in forward" in message


def test_gelu_is_checked_at_zero_and_far_out():
    def forward(ctx, x):
        y = x * _cdf(x)
        ctx.save_for_backward(x, y)
        return y

    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * (y / x + x * _pdf(x))  # Φ(x) = y / x: 0/0 at x = 0

    message = fails(gp.check_gelu, function(forward, backward))
    assert "your gradient is nan" in message and "divides by zero" in message


def test_batched_matmul_must_take_a_grad_output_that_is_not_contiguous():
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
        g3 = g.view(-1, n, m)
        return torch.bmm(g3, b.reshape(-1, k, m).mT).view(a.shape), torch.bmm(a.reshape(-1, n, k).mT, g3).view(b.shape)

    message = fails(gp.check_batched_matmul, function(_matmul_forward, backward))
    assert "called `.view` on a tensor that is not contiguous" in message and "`.reshape(...)`" in message


def test_affine_is_tried_with_each_combination_of_inputs_requiring_grad():
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        return (unbroadcast(g * weight, x.shape) if need[0] else None,
                unbroadcast(g * x, weight.shape) if need[1] else None,
                unbroadcast(g, ctx.bias_shape) if need[1] else None)  # the index of weight, copied

    message = fails(gp.check_affine, function(_affine_forward, backward))
    assert "wrong gradient for `bias` when only `bias` requires grad" in message


def test_mean_over_a_dim_of_size_one_and_a_batch_of_one():
    gp.check_mean(_mean(), specs=[((3, 1, 4), 1, False), ((1, 5), 0, True)])


def test_the_pictures_draw(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autograder.student import gradient_patterns

    shown = []
    monkeypatch.setattr(plt, "show", lambda: shown.append(plt.gcf()))
    gradient_patterns.show_broadcasting()
    gradient_patterns.show_unbroadcasting()
    assert len(shown) == 2 and all(len(f.axes[0].patches) > 20 for f in shown)
    plt.close("all")


def test_gelu_verdicts_are_the_same_remotely(capsys):
    right = _gelu(lambda x: _cdf(x) + x * _pdf(x))
    message, printed = same_remotely(gp.check_gelu, right, "GELU", capsys)
    assert message is None and "gradcheck and gradgradcheck pass" in printed

    def forward(ctx, x):
        ctx.save_for_backward(_cdf(x) + x * _pdf(x))
        return x * _cdf(x)

    message, _ = same_remotely(gp.check_gelu, function(forward, lambda ctx, g: g * ctx.saved_tensors[0]), "GELU",
                               capsys)
    assert "double backward is wrong" in message


def test_batched_matmul_verdict_is_the_same_remotely(capsys):
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return (g.reshape(g.shape) @ b.mT), (a.mT @ g.view(g.shape[:-2] + (-1,)).view(g.shape))

    message, _ = same_remotely(gp.check_batched_matmul, function(_matmul_forward, backward), "BatchedMatmul", capsys)
    assert message is None or "`.view`" in message
