"""Unit tests of autograder.exercises.modern_api (notebook 10): right answers pass, each kind
of wrong answer fails with the message that names its mistake, the verdicts are the same
through a Remote proxy (the grader's way of reaching a student's process), custom ops survive
being defined twice, the student's side holds no solution, and the notebook's introduction
states its reading time."""
from __future__ import annotations

import inspect
import sys
import types
from itertools import count

import nbformat
import pytest
import torch

from autograder import authoring
from autograder.checks.remote import Remote, loopback
from autograder.exercises import modern_api as ma
from autograder.student import modern_api as student_side
from autograder.student import probe
from autograder.student.report import CheckFailed

# The model solutions, as the notebook defines them.
SOLUTIONS = '''
import numpy as np
import torch


class ClippedReLU(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, clip):
        return x.clamp(0, clip)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, clip = inputs
        ctx.save_for_backward(x)
        ctx.clip = clip

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * ((x > 0) & (x < ctx.clip)), None


class SquaredDistance(torch.autograd.Function):
    @staticmethod
    def forward(x, y, dim):
        d = np.square(x.detach().cpu().numpy() - y.detach().cpu().numpy()).sum(axis=dim)
        return torch.from_numpy(np.asarray(d)).to(device=x.device, dtype=x.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y, dim = inputs
        ctx.save_for_backward(x, y)
        ctx.dim = dim

    @staticmethod
    def backward(ctx, grad_output):
        x, y = ctx.saved_tensors
        grad_x = 2 * (x - y) * grad_output.unsqueeze(ctx.dim)
        return grad_x, -grad_x, None

    @staticmethod
    def vmap(info, in_dims, x, y, dim):
        x_bdim, y_bdim, _ = in_dims
        x = x.movedim(x_bdim, 0) if x_bdim is not None else x.expand(info.batch_size, *x.shape)
        y = y.movedim(y_bdim, 0) if y_bdim is not None else y.expand(info.batch_size, *y.shape)
        dim = dim + 1 if dim >= 0 else dim
        return SquaredDistance.apply(x, y, dim), 0


class Swish(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, beta):
        return x * torch.sigmoid(beta * x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, beta = inputs
        ctx.save_for_backward(x, beta)
        ctx.save_for_forward(x, beta)

    @staticmethod
    def backward(ctx, grad_output):
        x, beta = ctx.saved_tensors
        s = torch.sigmoid(beta * x)
        grad_x = grad_output * (s + beta * x * s * (1 - s))
        grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)
        return grad_x, grad_beta

    @staticmethod
    def jvp(ctx, x_t, beta_t):
        x, beta = ctx.saved_tensors
        s = torch.sigmoid(beta * x)
        return x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)


@torch.library.custom_op("modern_api::logsumexp", mutates_args=())
def logsumexp(x: torch.Tensor) -> torch.Tensor:
    out = np.logaddexp.reduce(x.detach().cpu().numpy(), axis=-1)
    return torch.from_numpy(np.asarray(out)).to(device=x.device, dtype=x.dtype)


@logsumexp.register_fake
def _(x):
    return x.new_empty(x.shape[:-1])


def logsumexp_setup_context(ctx, inputs, output):
    (x,) = inputs
    ctx.save_for_backward(x, output)


def logsumexp_backward(ctx, grad):
    x, out = ctx.saved_tensors
    return grad.unsqueeze(-1) * torch.exp(x - out.unsqueeze(-1))


logsumexp.register_autograd(logsumexp_backward, setup_context=logsumexp_setup_context)


@torch.library.custom_op("modern_api::softmax", mutates_args=())
def softmax(x: torch.Tensor) -> torch.Tensor:
    a = x.detach().cpu().numpy()
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return torch.from_numpy(e / e.sum(axis=-1, keepdims=True)).to(device=x.device, dtype=x.dtype)


@softmax.register_fake
def _(x):
    return torch.empty_like(x)


@softmax.register_vmap
def _(info, in_dims, x):
    return softmax(x.movedim(in_dims[0], 0)), 0


def softmax_setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def softmax_backward(ctx, grad):
    (y,) = ctx.saved_tensors
    return y * (grad - (grad * y).sum(-1, keepdim=True))


softmax.register_autograd(softmax_backward, setup_context=softmax_setup_context)


class Softmax(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return softmax(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        softmax_setup_context(ctx, inputs, output)

    @staticmethod
    def backward(ctx, grad_output):
        return softmax_backward(ctx, grad_output)
'''

# Each check, and the names of the student's objects it is given.
CHECKS = {
    "ClippedReLU": (ma.check_clipped_relu, ("ClippedReLU",)),
    "SquaredDistance": (ma.check_vmap_rule, ("SquaredDistance",)),
    "Swish": (ma.check_swish_jvp, ("Swish",)),
    "logsumexp": (ma.check_logsumexp_op, ("logsumexp",)),
    "Softmax": (ma.check_softmax_pattern, ("softmax", "Softmax")),
}
_modules = count()


def notebook(*edits: tuple[str, str]) -> dict:
    """A namespace holding the model solutions with `edits` (old, new) applied. (Custom ops
    are registered by name: the op of the namespace built last is the one that runs.) It is
    a module's, as a notebook's is: torch.compile finds a Function's globals through it."""
    source = SOLUTIONS
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    module = types.ModuleType(f"notebook_{next(_modules)}")
    sys.modules[module.__name__] = module
    exec(compile(source, "<notebook>", "exec"), module.__dict__)
    return module.__dict__


def verdict(name: str, namespace: dict, *, remote: bool = False, **kwargs) -> str | None:
    """The check's failure message for the student's objects of check `name` (None if it passed)."""
    check, names = CHECKS[name]
    students = [Remote(n, loopback(namespace)) if remote else namespace[n] for n in names]
    try:
        check(*students, **kwargs)
    except CheckFailed as failed:
        return str(failed)
    return None


def same_both_ways(name: str, *edits: tuple[str, str], **kwargs) -> str | None:
    local = verdict(name, notebook(*edits), **kwargs)
    remote = verdict(name, notebook(*edits), remote=True, **kwargs)
    assert remote == local
    return local


# --- The model solutions ------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CHECKS))
def test_model_solutions_pass_here_and_remotely(name, capsys):
    assert verdict(name, notebook()) is None
    printed = capsys.readouterr().out
    assert "✔" in printed
    assert verdict(name, notebook(), remote=True) is None


@pytest.mark.parametrize("name, hidden", [
    ("ClippedReLU", {"cases": [((2, 3, 4), 3.0), ((), 0.7), ((7,), 1), ((3, 2), 1.5)], "seed": None}),
    ("SquaredDistance", {"cases": [((5,), 0, [(0, 0)], [2]), ((2, 2), 0, [(1, None)], [2]), ((3, 3), -2, [(2, 1)], [3]),
                                   ((3, 2), 1, [(None, 0), (0, 1)], [2, 3]), ((4, 3), 0, [(0, None)], [1])],
                                   "seed": None}),
    ("Swish", {"cases": [((), ()), ((2, 3, 2, 2), (3, 1, 1)), ((5, 2), (1, 2)), ((1, 4), (4,))], "seed": None}),
    ("logsumexp", {"cases": [((6,), 0.0), ((3, 1), 0.0), ((2, 4), 1000.0), ((2, 2, 3), -1000.0)],
                   "compiled": [((5, 2), 0.0)], "seed": None}),
    ("Softmax", {"cases": [(6,), (4, 1), (2, 2, 3)],
                 "vmap_cases": [((3, 3), [1], [3]), ((2, 4), [-1], [4]), ((3,), [0, 1], [2, 2]), ((5,), [-1], [2])],
                 "compiled": [(2, 3, 2)], "seed": None}),
])
def test_model_solutions_pass_the_hidden_tests(name, hidden):
    assert verdict(name, notebook(), **hidden) is None


def test_passing_checks_say_what_they_checked(capsys):
    ma.check_vmap_rule(notebook()["SquaredDistance"])
    printed = capsys.readouterr().out
    assert "in_dims (0, None), dim=1; in_dims (1, 0), dim=0; in_dims (None, 2), dim=-1" in printed
    assert "per-sample gradients and gradients through vmap agree with a loop" in printed
    ma.check_logsumexp_op(notebook()["logsumexp"])
    printed = capsys.readouterr().out
    assert "opcheck passes" in printed and "backend='aot_eager', fullgraph=True" in printed


# --- 10.1 ClippedReLU, ported --------------------------------------------------------------------

CLASSIC = (
    ("    @staticmethod\n    def forward(x, clip):\n        return x.clamp(0, clip)\n\n"
     "    @staticmethod\n    def setup_context(ctx, inputs, output):\n        x, clip = inputs\n"
     "        ctx.save_for_backward(x)\n        ctx.clip = clip\n",
     "    @staticmethod\n    def forward(ctx, x, clip):\n        ctx.save_for_backward(x)\n"
     "        ctx.clip = clip\n        return x.clamp(0, clip)\n"),
)


@pytest.mark.parametrize("edits, expected", [
    (CLASSIC, "ClippedReLU has no setup_context staticmethod: it is still a classic Function (forward(ctx, x, clip))"),
    ((("def forward(x, clip):", "def forward(ctx, x, clip):"),), "ClippedReLU.forward takes ctx"),
    ((("    generate_vmap_rule = True\n\n    @staticmethod\n    def forward(x, clip)",
       "    @staticmethod\n    def forward(x, clip)"),), "generate_vmap_rule = True` when forward"),
    ((("return grad_output * ((x > 0) & (x < ctx.clip)), None",
       "mask = torch.zeros(x.shape)\n        mask[(x > 0) & (x < ctx.clip)] = 1\n"
       "        return grad_output * mask, None"),),
     "on another device (meta) backward mixes devices"),
    ((("return x.clamp(0, clip)",
       "return torch.from_numpy(np.clip(x.detach().cpu().numpy(), 0, clip)).to(x.device, x.dtype)"),),
     "generate_vmap_rule runs forward on batched tensors"),
])
def test_clipped_relu_mistakes_are_named(edits, expected):
    message = same_both_ways("ClippedReLU", *edits)
    assert message is not None and expected in message, message


@pytest.mark.parametrize("edits, expected", [
    # a tensor kept on ctx instead of saved: every value is right
    ((("ctx.save_for_backward(x)\n        ctx.clip = clip", "ctx.x = x\n        ctx.clip = clip"),
      ("(x,) = ctx.saved_tensors\n        return grad_output * ((x > 0)",
       "x = ctx.x\n        return grad_output * ((x > 0)")),
     "`ctx.x` (the input `x` of shape (5,), 40 bytes) is kept as an attribute of ctx instead of being saved"),
    # a tensor kept in a class attribute: every value is right
    ((("ctx.save_for_backward(x)\n        ctx.clip = clip", "ClippedReLU.last_x = x\n        ctx.clip = clip"),
      ("(x,) = ctx.saved_tensors\n        return grad_output * ((x > 0)",
       "x = ClippedReLU.last_x\n        return grad_output * ((x > 0)")),
     "is still alive, kept by"),
    # NaN at exactly 0, a kink: right everywhere else
    ((("return grad_output * ((x > 0) & (x < ctx.clip)), None",
       "return grad_output * torch.where(x < ctx.clip, x.clamp(min=0) / x, 0.0), None"),),
     "ClippedReLU: backward at the kinks gives"),
])
def test_clipped_relu_mistakes_only_special_points_or_ctx_show(edits, expected):
    message = same_both_ways("ClippedReLU", *edits)
    assert message is not None and expected in message, message


def test_either_one_sided_slope_at_a_kink_passes():
    """torch's clamp has slope 1 at both kinks, the model 0: both are right."""
    edits = (("return grad_output * ((x > 0) & (x < ctx.clip)), None",
              "return grad_output * ((x >= 0) & (x <= ctx.clip)), None"),)
    assert same_both_ways("ClippedReLU", *edits) is None


def test_a_classic_function_fails_under_torch_func_with_the_reason():
    """Without the style check, torch.func's own error is explained."""
    namespace = notebook(*CLASSIC)
    with pytest.raises(CheckFailed) as failed:
        ma.check_func_grad(namespace["ClippedReLU"], "ClippedReLU", ma._clipped_relu,
                           [(torch.randn(3, dtype=torch.float64), 1.0)], ("x", "clip"), torch.Generator())
    assert "must override the setup_context staticmethod" in str(failed.value)
    assert "this is a classic Function" in str(failed.value)


# --- 10.2 a vmap rule by hand ---------------------------------------------------------------------

RULE = ("        x_bdim, y_bdim, _ = in_dims\n"
        "        x = x.movedim(x_bdim, 0) if x_bdim is not None else x.expand(info.batch_size, *x.shape)\n"
        "        y = y.movedim(y_bdim, 0) if y_bdim is not None else y.expand(info.batch_size, *y.shape)\n")


@pytest.mark.parametrize("edits, expected", [
    ((("return SquaredDistance.apply(x, y, dim), 0", "return SquaredDistance.apply(x, y, dim), None"),),
     "one batch dim too many"),
    ((("return SquaredDistance.apply(x, y, dim), 0", "return SquaredDistance.apply(x, y, dim), x_bdim"),),
     "the out_dims it returned say otherwise"),
    ((("dim = dim + 1 if dim >= 0 else dim", "pass"),), "with the batch dim in front it is dim + 1"),
    ((("dim = dim + 1 if dim >= 0 else dim", "dim = dim + 1"),), "it counts from the end and stays the same"),
    ((("x = x.movedim(x_bdim, 0) if x_bdim is not None else x.expand(info.batch_size, *x.shape)",
       "x = x.movedim(x_bdim, 0)"),), "has no batch dim at all"),
    (((RULE, "        pass\n"),), "move it there with `x.movedim(in_dims[0], 0)`"),
    ((("    @staticmethod\n    def vmap(info, in_dims, x, y, dim):",
       "    @staticmethod\n    def not_vmap(info, in_dims, x, y, dim):"),),
     "SquaredDistance has no vmap staticmethod"),
])
def test_vmap_rule_mistakes_are_named(edits, expected):
    message = same_both_ways("SquaredDistance", *edits)
    assert message is not None and expected in message, message


def test_a_rule_that_loops_over_the_batch_passes():
    loop = ("        x_bdim, y_bdim, _ = in_dims\n        outs = []\n        for b in range(info.batch_size):\n"
            "            xb = x.select(x_bdim, b) if x_bdim is not None else x\n"
            "            yb = y.select(y_bdim, b) if y_bdim is not None else y\n"
            "            outs.append(SquaredDistance.apply(xb, yb, dim))\n        return torch.stack(outs), 0\n")
    edits = ((RULE + "        dim = dim + 1 if dim >= 0 else dim\n        return SquaredDistance.apply(x, y, dim), 0\n",
              loop),)
    assert same_both_ways("SquaredDistance", *edits) is None


def test_square_shapes_do_not_hide_a_rule_that_ignores_in_dims():
    """With every size equal, a rule that never moves the batch computes without error."""
    message = verdict("SquaredDistance", notebook((RULE, "        pass\n")), cases=[((3, 3), 0, [(1, 2)], [3])])
    assert message is not None and "differs from a loop over the batch" in message


def test_batched_and_loop_agree_with_a_plain_function():
    generator = torch.Generator().manual_seed(0)
    sample = torch.empty(2, 3, dtype=torch.float64)
    x = ma.batched(sample, [None, 2], [4, 5], generator)
    y = ma.batched(sample, [0, 0], [4, 5], generator)
    assert x.shape == (2, 3, 5) and y.shape == (4, 5, 2, 3)
    (out,) = ma.loop(ma._squared_distance, (x, y, 1), [(None, 0, None), (2, 0, None)])
    want = torch.func.vmap(torch.func.vmap(ma._squared_distance, in_dims=(2, 0, None)), in_dims=(None, 0, None))(x, y,
                                                                                                                 1)
    assert torch.allclose(out, want)


# --- 10.3 jvp with save_for_forward --------------------------------------------------------------

JVP = "return x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)"


@pytest.mark.parametrize("edits, expected", [
    ((("        ctx.save_for_forward(x, beta)\n", ""),),
     "inside jvp it holds only what setup_context passed to `ctx.save_for_forward`"),
    ((("        ctx.save_for_backward(x, beta)\n", ""),), "backward raised ValueError: not enough values to unpack"),
    (((JVP, "return x_t * (s + beta * x * s * (1 - s))"),),
     "forward AD (tangents for `beta`) gives a wrong output tangent"),
    (((JVP, "return beta_t * x * x * s * (1 - s)"),), "forward AD (tangents for `x`) gives a wrong output tangent"),
    (((JVP, "return x_t * (s + beta * x * s * (1 - s)) + (beta_t * x * x * s * (1 - s)).sum_to_size(beta.shape)"),),
     "it is not summed"),
    (((JVP, "pass"),), "jvp returned None"),
    ((("    @staticmethod\n    def jvp(ctx, x_t, beta_t):", "    @staticmethod\n    def not_jvp(ctx, x_t, beta_t):"),),
     "the Function has no jvp staticmethod"),
])
def test_swish_jvp_mistakes_are_named(edits, expected):
    message = same_both_ways("Swish", *edits)
    assert message is not None and expected in message, message


@pytest.mark.parametrize("edits, expected", [
    # ∂y/∂x written as y/x + βy(1 − σ): NaN at exactly x = 0
    (((JVP, "y = x * s\n        return x_t * (y / x + beta * y * (1 - s)) + beta_t * x * y * (1 - s)"),),
     "gives a wrong output tangent"),
    # σ' as e^(−βx) / (1 + e^(−βx))²: NaN where e^(−βx) overflows
    (((JVP, "ds = torch.exp(-beta * x) / (1 + torch.exp(-beta * x)) ** 2\n"
            "        return x_t * (s + beta * x * ds) + beta_t * x * x * ds"),), "gives a wrong output tangent"),
    # jvp reads tensors kept on ctx: every tangent is right
    ((("        ctx.save_for_forward(x, beta)\n", "        ctx.x, ctx.beta = x, beta\n"),
      ("x, beta = ctx.saved_tensors\n        s = torch.sigmoid(beta * x)\n        return x_t",
       "x, beta = ctx.x, ctx.beta\n        s = torch.sigmoid(beta * x)\n        return x_t")),
     "is kept as an attribute of ctx instead of being saved"),
])
def test_swish_jvp_mistakes_only_special_points_or_ctx_show(edits, expected):
    message = same_both_ways("Swish", *edits)
    assert message is not None and expected in message, message
    if "kept" in expected:
        assert "save_for_forward" in message


def test_every_draw_holds_the_special_points():
    """Hidden tests draw fresh inputs: the special points are there in each draw (at places
    of its own)."""
    for seed in (None, None, 3):
        generator = torch.Generator().manual_seed(ma.inputs.seed_of(seed))
        (x, _), = ma._swish_cases([((4, 3), (3,))])(generator)
        assert all(v in x.flatten().tolist() for v in ma.SWISH_SPECIAL)
        (x,), = ma._softmax_cases([(2, 3)])(generator)
        assert all(v in x.flatten().tolist() for v in ma.LARGE)


def test_forward_mode_gradcheck_uses_the_students_own_forward():
    """A jvp consistent with a wrong forward passes the finite differences of that forward,
    but not the comparison with the reference: both are needed, and both run."""
    namespace = notebook((JVP, "return 2 * (" + JVP.removeprefix("return ") + ")"))
    student = Remote("Swish", loopback(namespace))
    args = (torch.randn(3, dtype=torch.float64), torch.rand((), dtype=torch.float64) + 0.5)
    with pytest.raises(CheckFailed) as failed:
        ma._forward_gradcheck(student, "Swish", args, ("x", "beta"), torch.Generator().manual_seed(0), {},
                              [ma._swish(*args)])
    assert "disagrees with finite differences of your own forward" in str(failed.value)
    with pytest.raises(CheckFailed) as failed:
        ma._forward_gradcheck(namespace["Swish"], "Swish", args, ("x", "beta"), torch.Generator().manual_seed(0), {},
                              [ma._swish(*args)])
    assert "gradcheck(check_forward_ad=True) failed" in str(failed.value)


# --- 10.4 a custom op ---------------------------------------------------------------------------

@pytest.mark.parametrize("edits, expected", [
    ((("return x.new_empty(x.shape[:-1])", "return torch.empty_like(x)"),),
     "the fake kernel says shape (3, 4), dtype float64 and device cpu; the op returns shape (3,)"),
    ((("return x.new_empty(x.shape[:-1])", "return torch.empty(x.shape[:-1])"),),
     "dtype float32 and device cpu; the op"),
    ((("torch.from_numpy(np.asarray(out))", "torch.from_numpy(out)"),), "np.asarray(...)"),
    ((("ctx.save_for_backward(x, output)", "ctx.save_for_backward(output, x)"),), "backward raised RuntimeError"),
    ((("return grad.unsqueeze(-1) * torch.exp(x - out.unsqueeze(-1))",
       "soft = np.exp(x.detach().numpy() - out.detach().numpy()[..., None])\n"
       "    return grad.unsqueeze(-1) * torch.from_numpy(soft)"),), "double backward is wrong"),
    ((("logsumexp.register_autograd(logsumexp_backward, setup_context=logsumexp_setup_context)", ""),),
     "has no autograd formula"),
    ((("\n@logsumexp.register_fake\ndef _(x):\n    return x.new_empty(x.shape[:-1])\n", ""),), "has no fake kernel"),
    ((('"modern_api::logsumexp"', '"mylib::logsumexp"'),), "outside this notebook's namespace 'modern_api'"),
    ((("out = np.logaddexp.reduce(x.detach().cpu().numpy(), axis=-1)",
       "out = np.logaddexp.reduce(x.detach().cpu().numpy().astype(np.float64), axis=-1)"),
      ("np.asarray(out)).to(device=x.device, dtype=x.dtype)", "np.asarray(out)).to(device=x.device)")),
     "test_faketensor failed"),
])
def test_custom_op_mistakes_are_named(edits, expected):
    shapes = {"cases": [((6,), 0.0), ((3, 4), 0.0)]} if "np.asarray" in expected else {}
    message = same_both_ways("logsumexp", *edits, **shapes)
    assert message is not None and expected in message, message


@pytest.mark.parametrize("edits, expected", [
    # exp(x) / exp(lse): inf / inf at ±1000, right elsewhere
    ((("return grad.unsqueeze(-1) * torch.exp(x - out.unsqueeze(-1))",
       "return grad.unsqueeze(-1) * torch.exp(x) / torch.exp(out).unsqueeze(-1)"),), "logsumexp: "),
    ((("(x,) = inputs\n    ctx.save_for_backward(x, output)", "ctx.x, ctx.out = inputs[0], output"),
      ("x, out = ctx.saved_tensors\n    return grad.unsqueeze(-1)",
       "x, out = ctx.x, ctx.out\n    return grad.unsqueeze(-1)")),
     "is kept as an attribute of ctx instead of being saved"),
])
def test_custom_op_mistakes_only_special_points_or_ctx_show(edits, expected):
    message = same_both_ways("logsumexp", *edits)
    assert message is not None and expected in message, message


def test_a_plain_function_is_not_a_custom_op():
    namespace = notebook()
    namespace["plain"] = lambda x: torch.logsumexp(x, -1)
    with pytest.raises(CheckFailed) as failed:
        ma.check_logsumexp_op(namespace["plain"])
    assert "not an op made with torch.library.custom_op" in str(failed.value)


def test_an_op_defined_twice_is_checked_as_defined_last():
    """Running the answer cell again re-registers the name: no error, and the checks see the
    definition run last, here and remotely."""
    namespace = notebook()
    wrong = SOLUTIONS.replace("return x.new_empty(x.shape[:-1])", "return torch.empty_like(x)")
    exec(compile(wrong, "<notebook, run again>", "exec"), namespace)
    assert "the fake kernel says shape" in verdict("logsumexp", namespace)
    exec(compile(SOLUTIONS, "<notebook, fixed>", "exec"), namespace)
    assert verdict("logsumexp", namespace) is None
    assert verdict("logsumexp", namespace, remote=True) is None


def test_compile_probe_accepts_only_backends_without_a_cpp_compiler():
    namespace = notebook()
    with pytest.raises(ValueError, match="not one of"):
        student_side.compiled(namespace["logsumexp"], (torch.randn(2, 3),), [torch.ones(2)], "inductor", True)


def test_compile_check_finds_the_op_in_the_graph():
    namespace = notebook()
    graphs = ma.check_compile(namespace["logsumexp"], "logsumexp", ma._lse, [(torch.randn(3, 4, dtype=torch.float64),)],
                              ("x",), torch.Generator().manual_seed(0), in_graph="modern_api.logsumexp")
    assert any("modern_api.logsumexp" in op for g in graphs for op in g)
    with pytest.raises(CheckFailed, match="no compiled graph calls"):
        ma.check_compile(namespace["ClippedReLU"], "ClippedReLU", ma._clipped_relu,
                         [(torch.randn(3, dtype=torch.float64), 1.0)],
                         ("x", "clip"), torch.Generator().manual_seed(0), in_graph="modern_api.logsumexp")


def test_a_function_with_a_jvp_does_not_compile_in_one_graph():
    """torch 2.13: dynamo refuses a Function that defines jvp; the check says so."""
    namespace = notebook()
    with pytest.raises(CheckFailed) as failed:
        ma.check_compile(namespace["Swish"], "Swish", ma._swish,
                         [(torch.randn(3, dtype=torch.float64), torch.rand((), dtype=torch.float64))],
                         ("x", "beta"), torch.Generator().manual_seed(0))
    assert "Unsupported custom jvp" in str(failed.value) and "defines a jvp" in str(failed.value)


# --- 10.5 the modern pattern --------------------------------------------------------------------

RULE_105 = "return softmax(x.movedim(in_dims[0], 0)), 0"
BACKWARD_105 = "return y * (grad - (grad * y).sum(-1, keepdim=True))"


@pytest.mark.parametrize("edits, expected", [
    ((("def _(x):\n    return torch.empty_like(x)\n\n\n@softmax",
       "def _(x):\n    return x.new_empty(x.shape[:-1])\n\n\n@softmax"),),
     "softmax keeps x's shape"),
    (((RULE_105, "return softmax(x), in_dims[0]"),), "the batch is at the last dim of what the rule receives"),
    (((RULE_105, "return softmax(x), 0"),), "the batch is at the last dim of what the rule receives"),
    ((("@softmax.register_vmap\ndef _(info, in_dims, x):\n    " + RULE_105 + "\n", ""),),
     "the custom op has no vmap rule"),
    (((BACKWARD_105, "return y * grad"),), "softmax: "),
    (((BACKWARD_105,
       "(x,) = ctx.saved_tensors\n    e = torch.exp(x)\n    y = e / e.sum(-1, keepdim=True)\n    " + BACKWARD_105),
      ("(y,) = ctx.saved_tensors\n    (x,)", "(x,)"),
      ("ctx.save_for_backward(output)", "ctx.save_for_backward(inputs[0])")),
     "softmax: "),  # recomputed naively: NaN at ±1000
    ((("ctx.save_for_backward(output)", "ctx.y = output"),
      ("(y,) = ctx.saved_tensors\n    return", "y = ctx.y\n    return")),
     "`ctx.y` (the output"),
    ((("        return softmax(x)\n", "        return torch.softmax(x, -1)\n"),),
     "no compiled graph calls modern_api.softmax"),
    ((("ctx.save_for_backward(output)", "global kept_output\n    kept_output = output"),
      ("(y,) = ctx.saved_tensors\n    return", "y = kept_output\n    return")), "is still alive, kept by"),
    ((("    generate_vmap_rule = True\n\n    @staticmethod\n    def forward(x):\n        return softmax",
       "    @staticmethod\n    def forward(x):\n        return softmax"),), "vmap needs a rule for the Function"),
    ((("softmax.register_autograd(softmax_backward,", "softmax.register_autograd(lambda ctx, grad: grad,"),),
     "softmax: "),
])
def test_softmax_pattern_mistakes_are_named(edits, expected):
    message = same_both_ways("Softmax", *edits)
    assert message is not None and expected in message, message


@pytest.mark.parametrize("edits", [
    # register_vmap by name, the op called through torch.ops
    ((("@softmax.register_vmap\ndef _(info, in_dims, x):", "def rule(info, in_dims, x):"),
      ("softmax.register_autograd(",
       "torch.library.register_vmap('modern_api::softmax', rule)\nsoftmax.register_autograd("),
      ("        return softmax(x)\n", "        return torch.ops.modern_api.softmax(x)\n"))),
    # the batch moved only when it is at the last dim
    (((RULE_105,
       "b = in_dims[0] % x.dim()\n    if b == x.dim() - 1:\n        x, b = x.movedim(b, 0), 0\n"
       "    return softmax(x), b"),)),
    # the Function's own vmap rule instead of the generated one
    ((("    generate_vmap_rule = True\n\n    @staticmethod\n    def forward(x):\n        return softmax(x)\n",
       "    @staticmethod\n    def forward(x):\n        return softmax(x)\n\n    @staticmethod\n"
       "    def vmap(info, in_dims, x):\n        return Softmax.apply(x.movedim(in_dims[0], 0)), 0\n"),)),
])
def test_unusual_softmax_patterns_pass(edits):
    assert same_both_ways("Softmax", *edits) is None


def test_the_vmap_probe_restores_the_fallback():
    namespace = notebook()
    before = torch._C._functorch._is_vmap_fallback_enabled()
    student_side.vmapped(namespace["softmax"], (torch.randn(3, 2, dtype=torch.float64),), [[0]], None, None, False)
    assert torch._C._functorch._is_vmap_fallback_enabled() == before


def test_stderr_captured_catches_cpp_warnings():
    """vmap's fallback warns from C++, past Python's sys.stderr and warnings."""
    @torch.library.custom_op("modern_api::no_rule", mutates_args=())
    def no_rule(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with student_side.stderr_captured() as written:
        torch.func.vmap(no_rule)(torch.ones(2, 3))
    assert "performance drop" in written[0]


# --- Errors torch raises, in words --------------------------------------------------------------

@pytest.mark.parametrize("message, kind, expected", [
    ("You must implement the jvp function for custom autograd.Function to use it with forward mode AD.",
     "NotImplementedError", "no jvp staticmethod"),
    ("In order to use an autograd.Function with functorch transforms (vmap, grad, jvp, jacrev, ...), it must "
     "override the setup_context staticmethod.", "RuntimeError", "classic Function"),
    ("You tried to vmap over F, but it has both generate_vmap_rule=True and an overridden vmap staticmethod.",
     "RuntimeError", "choose one"),
    ("not enough values to unpack (expected 2, got 0)", "ValueError", "save_for_forward"),
    ("There was no fake impl registered for <CustomOpDef(modern_api::x)>.", "RuntimeError", "register_fake"),
    ("expected np.ndarray (got numpy.float32)", "TypeError", "np.asarray"),
    ("something else entirely", "RuntimeError", None),
])
def test_transform_errors_are_explained(message, kind, expected):
    cause = ma.transform_cause(message, kind)
    assert (cause is None) if expected is None else (expected in cause)


# --- The trust boundary and the cost ------------------------------------------------------------

def _solution_lines() -> set[str]:
    nb = nbformat.read(authoring.solution_path("10_modern_api"), as_version=4)
    found, inside = set(), False
    for cell in nb.cells:
        for line in cell.source.splitlines():
            if "### BEGIN" in line:
                inside = True
            elif "### END" in line:
                inside = False
            elif inside and len(line.strip()) > 20:
                found.add(line.strip())
    return found


def test_the_student_side_holds_no_line_of_the_solutions_or_hidden_tests():
    lines = _solution_lines()
    assert len(lines) >= 10
    source = inspect.getsource(student_side)
    assert [line for line in lines if line in source] == []


def test_procedures_are_registered_and_take_plain_data_only():
    for name in ("describe", "func_grad", "vmapped", "forward_ad", "forward_ad_gradcheck", "opcheck", "fake_outputs",
                 "compiled"):
        assert f"{student_side.__name__}:{name}" in probe.PROCEDURES

