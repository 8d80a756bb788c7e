"""Unit tests of autograder.exercises.real_world (notebook 09): right answers pass, each kind
of wrong answer fails with the message that names its mistake, and the verdicts are the
same through a Remote proxy (the grader's way of reaching a student's process)."""
from __future__ import annotations

import textwrap

import nbformat
import pytest
import torch

from autograder import authoring
from autograder.checks.remote import Remote, loopback
from autograder.exercises import real_world as rw
from autograder.student import real_world as student_side
from autograder.student.report import CheckFailed

# The model solutions, as a notebook defines them (one namespace: the classifier looks up
# Swish and LogSumExp in it, as in a notebook).
SOLUTIONS = '''
import torch


class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta):
        ctx.save_for_backward(x, beta)
        return x * torch.sigmoid(beta * x)

    @staticmethod
    def backward(ctx, grad_output):
        x, beta = ctx.saved_tensors
        s = torch.sigmoid(beta * x)
        grad_x = grad_output * (s + beta * x * s * (1 - s))
        grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)
        return grad_x, grad_beta


class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        m = x.amax(dim, keepdim=True)
        out = (m + torch.exp(x - m).sum(dim, keepdim=True).log()).squeeze(dim)
        ctx.save_for_backward(x, out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, grad_output):
        x, out = ctx.saved_tensors
        return grad_output.unsqueeze(ctx.dim) * torch.exp(x - out.unsqueeze(ctx.dim)), None


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return -ctx.alpha * grad_output, None


class TanhFixedPoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, W):
        z = torch.zeros_like(x)
        for _ in range(500):
            z_next = torch.tanh(z @ W.T + x)
            change = (z_next - z).abs().max()
            z = z_next
            if change <= 1e-12:
                break
        ctx.save_for_backward(z, W)
        return z

    @staticmethod
    def backward(ctx, grad_output):
        z, W = ctx.saved_tensors
        s = 1 - z * z
        w = s * grad_output
        for _ in range(500):
            w_next = s * (grad_output + w @ W)
            change = (w_next - w).abs().max()
            w = w_next
            if change <= 1e-12:
                break
        n = W.shape[0]
        return w, w.reshape(-1, n).T @ z.reshape(-1, n)


class SwishClassifier(torch.nn.Module):
    def __init__(self, n_in, hidden, classes):
        super().__init__()
        self.hidden = torch.nn.Linear(n_in, hidden)
        self.beta = torch.nn.Parameter(torch.ones(hidden))
        self.out = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        return self.out(Swish.apply(self.hidden(x), self.beta))

    def loss(self, x, y):
        logits = self(x)
        return (LogSumExp.apply(logits, 1) - logits.gather(1, y[:, None]).squeeze(1)).mean()
'''


def notebook(*edits: tuple[str, str]) -> dict:
    """A namespace holding the model solutions with `edits` (old, new) applied."""
    source = SOLUTIONS
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    namespace: dict = {"__name__": "__main__"}
    exec(compile(source, "<notebook>", "exec"), namespace)
    return namespace


def fails(check, *args, **kwargs) -> str:
    with pytest.raises(CheckFailed) as info:
        check(*args, **kwargs)
    return str(info.value)


def remotely(namespace: dict, name: str) -> Remote:
    return Remote(name, loopback(namespace))


RIGHT = notebook()


# --- 9.1 Swish ---------------------------------------------------------------------------------

def test_swish_right(capsys):
    rw.check_swish(RIGHT["Swish"])
    rw.check_swish(RIGHT["Swish"], cases=[((2, 3, 4), (4,), "normal"), ((), (), "normal"), ((5, 2), (1, 2), "large")],
                   seed=None)
    out = capsys.readouterr().out
    assert out.count("✔ Swish saves exactly x and beta, nothing on ctx.") == 2
    assert "✔ Swish: forward, backward and double backward agree with the reference on 6 input(s)" in out
    assert "β (3, 1, 1)" in out and "β (1,)" in out and "β (1, 2)" in out


@pytest.mark.parametrize("seed", range(5))
def test_swish_inputs_hold_their_special_points_in_every_draw(seed):
    """x = 0 in every case, beta = 0 wherever beta has more than one entry, and beta·x at 0,
    near +1000 and near -1000 in every large case: by construction, not by chance."""
    cases = [((4, 3), (3,), "normal"), ((4, 3), (), "normal"), ((3, 2), (1, 1), "normal"), ((2, 5), (5,), "large")]
    drawn = rw._swish_cases(cases)(torch.Generator().manual_seed(seed))
    for (x, beta), (_, _, kind) in zip(drawn, cases):
        z = (beta * x).flatten()
        assert (x == 0).any() and (z == 0).any()
        if kind == "large":
            assert z.max() >= 750 and z.min() <= -750
        else:
            assert bool((beta == 0).any() and (beta < 0).any()) == (beta.numel() > 1)


def test_swish_sum_for_a_one_entry_beta_fails_on_a_beta_of_shape_1():
    one = notebook(("grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)",
                    ("local = grad_output * x * x * s * (1 - s)\n"
                     "        grad_beta = local.sum() if beta.numel() == 1 else local.sum_to_size(beta.shape)")))
    message = fails(rw.check_swish, one["Swish"])
    assert "the gradient for `beta` has shape () but `beta` has shape (1,)" in message


def test_swish_dividing_by_beta_fails_at_beta_0():
    divides = notebook(("grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)",
                        "grad_beta = (grad_output * (s + beta * x * s * (1 - s) - s) * x / "
                        "beta).sum_to_size(beta.shape)"))
    message = fails(rw.check_swish, divides["Swish"])
    assert "wrong gradient for `beta`" in message and "got nan" in message
    assert "beta is exactly 0 at some entries: a formula that divides by beta gives nan there" in message


def test_swish_the_guides_version_saves_an_intermediate():
    guide = notebook((
        "        ctx.save_for_backward(x, beta)\n        return x * torch.sigmoid(beta * x)",
        ("        ctx.save_for_backward(x, beta)\n        s = torch.sigmoid(beta * x)\n"
        "        ctx.save_for_backward(x, beta, s)\n        return x * s"),
    ))
    message = fails(rw.check_swish, guide["Swish"])
    assert message.startswith("Swish saved the intermediate σ(βx) of shape (4, 3), 96 bytes")
    assert "the second replaces it" in message


def test_swish_sum_fails_for_a_per_channel_beta():
    message = fails(rw.check_swish, notebook((".sum_to_size(beta.shape)", ".sum()"))["Swish"])
    assert "the gradient for `beta` has shape () but `beta` has shape (3,)" in message


def test_swish_unreduced_gradient_is_found_although_the_engine_sums_it(capsys):
    message = fails(rw.check_swish, notebook((".sum_to_size(beta.shape)", ""))["Swish"])
    assert "✔ Swish: forward, backward and double backward agree" in capsys.readouterr().out  # the engine summed it
    assert "backward returned a gradient of shape (4, 3) for `beta`, which has shape (3,)" in message
    assert "sum_to_size(beta.shape)" in message


def test_swish_overflow_at_large_beta_x():
    overflowing = notebook(
        ("s = torch.sigmoid(beta * x)\n", "e = torch.exp(-beta * x)\n        s = 1 / (1 + e)\n"),
        ("grad_x = grad_output * (s + beta * x * s * (1 - s))",
         "grad_x = grad_output * (s + beta * x * e / (1 + e) ** 2)"),
    )
    message = fails(rw.check_swish, overflowing["Swish"])
    assert "wrong gradient for `x`" in message and "overflows to inf" in message


@pytest.mark.parametrize("check, name, edit", [
    (rw.check_swish, "Swish", ("ctx.save_for_backward(x, beta)\n        return x * torch.sigmoid(beta * x)",
                               "ctx.save_for_backward(x, beta)\n"
                               "        return x * torch.sigmoid(beta * x.view(-1).view(x.shape))")),
    (rw.check_logsumexp, "LogSumExp",
     ("m = x.amax(dim, keepdim=True)", "m = x.view(-1).view(x.shape).amax(dim, keepdim=True)")),
    (rw.check_fixed_point, "TanhFixedPoint",
     ("z = torch.zeros_like(x)\n", "z = torch.zeros_like(x.view(-1)).view(x.shape)\n")),
])
def test_inputs_not_contiguous_in_memory(check, name, edit):
    """A .view that merges dims of x works on the checks' own (contiguous) inputs only: the
    run on inputs laid out as a transpose's finds it, locally and remotely alike."""
    wrong = notebook(edit)
    message = fails(check, wrong[name])
    assert message.startswith(f"{name}: forward called `.view` on a tensor that is not contiguous, given "
                              "inputs that are not contiguous in memory.") and "use `.reshape(...)`" in message
    assert fails(check, remotely(wrong, name)) == message


def test_swish_tensor_made_on_the_cpu_shows_on_the_meta_device():
    cpu = notebook(("grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)",
                    ("grad_beta = torch.zeros(beta.shape, dtype=beta.dtype)\n"
                    "        grad_beta += (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)")))
    message = fails(rw.check_swish, cpu["Swish"])
    assert message.startswith("on another device (meta) backward mixes devices") and "device=" in message


def test_swish_float32():
    message = fails(rw.check_swish,
                    notebook(("return x * torch.sigmoid(beta * x)",
                              "return (x * torch.sigmoid(beta * x)).float()"))["Swish"])
    assert "forward has dtype torch.float32, expected torch.float64" in message


def test_swish_verdicts_are_the_same_remotely(capsys):
    rw.check_swish(remotely(RIGHT, "Swish"))
    assert "✔ Swish saves exactly x and beta" in capsys.readouterr().out
    wrong = notebook((".sum_to_size(beta.shape)", ""))
    assert fails(rw.check_swish, remotely(wrong, "Swish")) == fails(rw.check_swish, wrong["Swish"])


# --- 9.2 LogSumExp -----------------------------------------------------------------------------

def test_extreme_inputs_are_near_plus_and_minus_1000_and_mixed():
    x = rw._extreme(torch.zeros(4, 3), 0)
    assert x[:, 0].tolist() == [1000.0, -1000.0, 1000.0, -1000.0]  # mixed along dim 0
    assert x[:, 1].tolist() == [1000.0] * 4 and x[:, 2].tolist() == [-1000.0] * 4


def test_logsumexp_right(capsys):
    rw.check_logsumexp(RIGHT["LogSumExp"])
    rw.check_logsumexp(RIGHT["LogSumExp"], cases=[((4, 5), 0, "extreme"), ((7,), -1, "extreme")], seed=None)
    out = capsys.readouterr().out
    assert out.count("✔ LogSumExp: forward and backward are finite at x = 1000, -1000 and mixed.") == 2
    assert "✔ LogSumExp saves exactly x and its output" in out
    assert "gradcheck and gradgradcheck pass" in out


def test_logsumexp_naive_forward():
    naive = notebook(("out = (m + torch.exp(x - m).sum(dim, keepdim=True).log()).squeeze(dim)",
                      "out = torch.exp(x).sum(dim).log()"))
    message = fails(rw.check_logsumexp, naive["LogSumExp"])
    assert message.startswith("LogSumExp: forward is not finite at large inputs.") and "Subtract the max" in message


def test_logsumexp_global_max_fails_on_mixed_slices():
    message = fails(rw.check_logsumexp, notebook(("m = x.amax(dim, keepdim=True)", "m = x.max()"))["LogSumExp"])
    assert "forward is not finite" in message and "not of the whole tensor" in message


def test_logsumexp_naive_backward():
    naive = notebook(("torch.exp(x - out.unsqueeze(ctx.dim))", "torch.exp(x) / torch.exp(out.unsqueeze(ctx.dim))"))
    message = fails(rw.check_logsumexp, naive["LogSumExp"])
    assert message.startswith("LogSumExp: backward is not finite at large inputs.") and "exp(x − out)" in message


def test_logsumexp_saving_the_softmax():
    softmax = notebook(
        ("ctx.save_for_backward(x, out)", "ctx.save_for_backward(torch.softmax(x, dim))"),
        ("x, out = ctx.saved_tensors\n"
         "        return grad_output.unsqueeze(ctx.dim) * torch.exp(x - out.unsqueeze(ctx.dim)), None",
         "(p,) = ctx.saved_tensors\n        return grad_output.unsqueeze(ctx.dim) * p, None"),
    )
    message = fails(rw.check_logsumexp, softmax["LogSumExp"])
    assert message.startswith("LogSumExp saved the intermediate softmax(x) of shape (3, 4)")


def test_logsumexp_squeezing_every_size_1_dim():
    squeezed = notebook(("(dim, keepdim=True).log()).squeeze(dim)", "(dim, keepdim=True).log()).squeeze()"))
    message = fails(rw.check_logsumexp, squeezed["LogSumExp"])
    assert message.startswith("LogSumExp: forward returned shape (), expected (1,).")
    assert "x has slices along dim 1 mixed (±1000):" in message and "`.squeeze(dim)`" in message


def test_logsumexp_wrong_dim_in_backward():
    wrong = notebook(("return grad_output.unsqueeze(ctx.dim) * torch.exp(x - out.unsqueeze(ctx.dim)), None",
                      "return grad_output.unsqueeze(-1) * torch.exp(x - out.unsqueeze(-1)), None"))
    assert "LogSumExp: backward raised RuntimeError" in fails(rw.check_logsumexp, wrong["LogSumExp"])


def test_logsumexp_verdicts_are_the_same_remotely(capsys):
    rw.check_logsumexp(remotely(RIGHT, "LogSumExp"))
    assert "✔ LogSumExp saves exactly x and its output" in capsys.readouterr().out
    naive = notebook(("torch.exp(x - out.unsqueeze(ctx.dim))", "torch.exp(x) / torch.exp(out.unsqueeze(ctx.dim))"))
    assert fails(rw.check_logsumexp, remotely(naive, "LogSumExp")) == fails(rw.check_logsumexp, naive["LogSumExp"])


# --- 9.3 GradReverse ---------------------------------------------------------------------------

def test_grad_reverse_right(capsys):
    rw.check_grad_reverse(RIGHT["GradReverse"])
    rw.check_grad_reverse(RIGHT["GradReverse"], cases=[((4, 1, 3), 0.25), ((1, 2), 3)], seed=None)
    out = capsys.readouterr().out
    assert "✔ GradReverse: forward returns x unchanged, backward returns −α·grad_output (α = 0.5, 1.0, 2.0)" in out
    assert "(α = 0.25, 3)" in out


@pytest.mark.parametrize("edits, expected", [
    ((("return -ctx.alpha * grad_output, None", "return ctx.alpha * grad_output, None"),), "the sign is wrong"),
    ((("return -ctx.alpha * grad_output, None", "return -grad_output, None"),), "α is ignored"),
    ((("return -ctx.alpha * grad_output, None", "return grad_output, None"),), "passes through unchanged"),
    ((("return x.view_as(x)", "return -alpha * x"),), "forward multiplies x by −α"),
    ((("return -ctx.alpha * grad_output, None", "return grad_output.mul_(-ctx.alpha), None"),),
     "backward modified grad_output in place"),
    ((("return -ctx.alpha * grad_output, None", "return -ctx.alpha * grad_output.detach(), None"),),
     "double backward is wrong"),
    ((("ctx.alpha = alpha\n", "ctx.alpha = alpha\n        ctx.save_for_backward(x)\n"),), "save nothing"),
    ((("return -ctx.alpha * grad_output, None", "return -ctx.alpha * grad_output"),),
     "backward returned 1 gradient(s), but forward takes 2 input(s)"),
])
def test_grad_reverse_wrong(edits, expected):
    wrong = notebook(*edits)
    message = fails(rw.check_grad_reverse, wrong["GradReverse"])
    assert expected in message
    assert fails(rw.check_grad_reverse, remotely(wrong, "GradReverse")) == message


# --- 9.4 TanhFixedPoint ------------------------------------------------------------------------

def test_fixed_point_right(capsys):
    rw.check_fixed_point(RIGHT["TanhFixedPoint"])
    rw.check_fixed_point(RIGHT["TanhFixedPoint"], cases=[((1, 6), 6), ((5, 2), 2)], seed=None)
    out = capsys.readouterr().out
    assert out.count("✔ TanhFixedPoint saves exactly z and W, nothing on ctx.") == 2
    assert ("✔ TanhFixedPoint: forward, backward and double backward agree with the reference on 3 input(s); "
            "gradcheck and gradgradcheck pass") in out


@pytest.mark.parametrize("edits", [
    (("        w = s * grad_output\n        for _ in range(500):",
      "        w = s * grad_output\n        with torch.no_grad():\n          for _ in range(500):"),),
    (("            w = w_next\n", "            w = w_next.detach()\n"),),
    (("    def backward(ctx, grad_output):\n        z, W",
      "    @torch.autograd.function.once_differentiable\n    def backward(ctx, grad_output):\n        z, W"),),
], ids=["no_grad", "detach", "once_differentiable"])
def test_fixed_point_adjoint_autograd_cannot_follow_fails_double_backward(edits):
    """Right first-order gradients from an adjoint computed outside autograd's view: only
    double backward shows it."""
    wrong = notebook(*edits)
    message = fails(rw.check_fixed_point, wrong["TanhFixedPoint"])
    assert message.startswith("TanhFixedPoint: double backward is wrong")
    assert fails(rw.check_fixed_point, remotely(wrong, "TanhFixedPoint")).startswith("TanhFixedPoint: double backward")


def test_fixed_point_inputs_contract():
    ((_, w),) = rw._fixed_point_cases([((2, 5), 5)])(torch.Generator().manual_seed(1))
    assert torch.linalg.matrix_norm(w, 2).item() == pytest.approx(rw.RHO)
    assert not torch.allclose(w, w.T)  # a transposed W in backward must show


def test_fixed_point_one_step_backward():
    one_step = notebook(("        for _ in range(500):\n            w_next",
                         "        for _ in range(0):\n            w_next"))
    message = fails(rw.check_fixed_point, one_step["TanhFixedPoint"])
    assert "wrong gradient for `x`" in message and "adjoint system" in message


def test_fixed_point_transposed_w_gradient():
    wrong = notebook(("return w, w.reshape(-1, n).T @ z.reshape(-1, n)",
                      "return w, z.reshape(-1, n).T @ w.reshape(-1, n)"))
    message = fails(rw.check_fixed_point, wrong["TanhFixedPoint"])
    assert "wrong gradient for `W`" in message and "transpose" in message


def test_fixed_point_unconverged_forward():
    early = notebook(("if change <= 1e-12:\n                break\n        ctx",
                      "if change <= 1e-6:\n                break\n        ctx"))
    message = fails(rw.check_fixed_point, early["TanhFixedPoint"])
    assert message.startswith("TanhFixedPoint: forward stops before the fixed point")


def test_fixed_point_autograd_in_backward():
    autograd = notebook((
        "        z, W = ctx.saved_tensors\n        s = 1 - z * z\n",
        ("        z, W = ctx.saved_tensors\n"
        "        with torch.enable_grad():\n"
        "            z_ = z.detach().requires_grad_()\n"
        "            torch.autograd.grad((z_ * z_).sum(), z_)\n"
        "        s = 1 - z * z\n"),
    ))
    assert "asks autograd for its gradient" in fails(rw.check_fixed_point, autograd["TanhFixedPoint"])


def test_fixed_point_verdicts_are_the_same_remotely(capsys):
    rw.check_fixed_point(remotely(RIGHT, "TanhFixedPoint"))
    assert "✔ TanhFixedPoint saves exactly z and W" in capsys.readouterr().out
    wrong = notebook(("w_next = s * (grad_output + w @ W)", "w_next = s * (grad_output + w @ W.T)"))
    assert fails(rw.check_fixed_point, remotely(wrong, "TanhFixedPoint")) == fails(rw.check_fixed_point,
                                                                                   wrong["TanhFixedPoint"])


# --- 9.5 SwishClassifier -----------------------------------------------------------------------

def test_classifier_right_with_the_course_stand_ins(capsys):
    rw.check_classifier(RIGHT["SwishClassifier"])
    out = capsys.readouterr().out
    assert "✔ SwishClassifier: uses Swish with a learnable β of shape (32,) and LogSumExp" in out
    assert "target ≤ 0.15" in out
    assert "trained with the course's LogSumExp and Swish in place of yours" in out
    assert RIGHT["Swish"].__name__ == "Swish" and RIGHT["LogSumExp"].__name__ == "LogSumExp"  # put back


def test_classifier_is_graded_without_the_notebooks_own_functions(capsys):
    namespace = notebook()
    del namespace["Swish"], namespace["LogSumExp"]  # exercises 9.1 and 9.2 left out
    rw.check_classifier(namespace["SwishClassifier"])
    out = capsys.readouterr().out
    assert "✔ SwishClassifier: trained by the check" in out and "in place of yours" not in out
    assert "Swish" not in namespace and "LogSumExp" not in namespace


def test_classifier_is_graded_independently_of_a_broken_swish(capsys):
    broken = notebook(("grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)", "grad_beta = 1 / 0"))
    rw.check_classifier(broken["SwishClassifier"])
    assert "✔ SwishClassifier: trained by the check" in capsys.readouterr().out


@pytest.mark.parametrize("edits, expected", [
    ((("self.beta = torch.nn.Parameter(torch.ones(hidden))", "self.beta = torch.ones(hidden)"),),
     "the beta passed to Swish is not one of the model's parameters"),
    ((("torch.nn.Parameter(torch.ones(hidden))", "torch.nn.Parameter(torch.ones(()))"),),
     "Swish is called with a beta of shape (); expected (32,)"),
    ((("squeeze(1)).mean()", "squeeze(1)).sum()"),), "the loss is summed over the batch"),
    ((("return self.out(Swish.apply(self.hidden(x), self.beta))", "return self.out(torch.relu(self.hidden(x)))"),),
     "model(x) never calls Swish.apply"),
    ((("LogSumExp.apply(logits, 1)", "torch.logsumexp(logits, 1)"),), "model.loss never calls LogSumExp.apply"),
    ((("return (LogSumExp.apply(logits, 1) - logits.gather(1, y[:, None]).squeeze(1)).mean()",
       "return (logits.gather(1, y[:, None]).squeeze(1) - LogSumExp.apply(logits, 1)).mean()"),),
       "the sign is flipped"),
    ((("logits.gather(1, y[:, None])", "logits.detach().gather(1, y[:, None])"),), "must be at most 0.15"),
    ((("return self.out(Swish.apply(self.hidden(x), self.beta))",
       "h = self.hidden(x)\n        Swish.apply(h, self.beta)\n        return self.out(h)"),),
     "training did not change the parameter(s) beta"),
    ((("self.out = torch.nn.Linear(hidden, classes)", "self.out = torch.nn.Linear(hidden, classes + 1)"),),
     "model(x) returned (150, 4), expected logits of shape (150, 3)"),
])
def test_classifier_wrong(edits, expected):
    wrong = notebook(*edits)
    message = fails(rw.check_classifier, wrong["SwishClassifier"])
    assert expected in message
    assert fails(rw.check_classifier, remotely(wrong, "SwishClassifier")) == message
    assert wrong["Swish"].__name__ == "Swish"  # the stand-ins are gone again


def test_classifier_verdict_is_the_same_remotely(capsys):
    rw.check_classifier(remotely(RIGHT, "SwishClassifier"))
    assert "✔ SwishClassifier: trained by the check" in capsys.readouterr().out


def test_classifier_raising_constructor():
    raising = notebook(("super().__init__()\n", "super().__init__()\n        raise NotImplementedError()\n"))
    message = fails(rw.check_classifier, raising["SwishClassifier"])
    assert "raised NotImplementedError" in message and "not implemented yet" in message


def test_the_swish_stand_in_is_the_composite_and_its_gradients():
    """What the classifier trains with in the student's process: x·σ(βx), a β that
    broadcasts, gradients for both (float64, gradcheck), and β of another dtype."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    beta = torch.rand(3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.equal(student_side.SwishStandIn.apply(x, beta), x * torch.sigmoid(beta * x))
    assert torch.autograd.gradcheck(student_side.SwishStandIn.apply, (x, beta))
    half = beta.detach().float().requires_grad_()
    student_side.SwishStandIn.apply(x, half).sum().backward()
    assert half.grad is not None and half.grad.dtype == torch.float32 and half.grad.shape == (3,)


def test_spirals_are_balanced_and_seeded():
    x, y = rw.spirals(torch.Generator().manual_seed(3))
    again, _ = rw.spirals(torch.Generator().manual_seed(3))
    assert x.shape == (150, 2) and x.dtype == torch.float32 and torch.equal(x, again)
    assert torch.bincount(y).tolist() == [50, 50, 50]


def test_solutions_source_matches_the_notebook():
    """The model solutions above are the notebook's (so these tests test what students see)."""
    nb = nbformat.read(authoring.solution_path("09_real_world"), as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
    for name in ("Swish", "LogSumExp", "GradReverse", "TanhFixedPoint", "SwishClassifier"):
        assert f"class {name}(" in text
    for line in ("return x * torch.sigmoid(beta * x)", "torch.exp(x - out.unsqueeze(ctx.dim))",
                 "w_next = s * (grad_output + w @ W)", "LogSumExp.apply(logits, 1)"):
        assert line in text and line in textwrap.dedent(SOLUTIONS)
