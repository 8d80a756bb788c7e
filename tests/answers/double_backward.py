"""07_double_backward: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

_SINH_SAVE = '''
class SinhFixed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        expx, expnegx = torch.exp(x), torch.exp(-x)
        {save}
        return (expx - expnegx) / 2

    @staticmethod
    def backward(ctx, grad_out):
        {load}
        return grad_out * (expx + expnegx) / 2
'''

_SINH_INTERMEDIATES = '''
class SinhWithIntermediates(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        expx = torch.exp(x)
        expnegx = torch.exp(-x)
        {forward}

    @staticmethod
    def backward(ctx, grad_out, grad_expx, grad_expnegx):
        {backward}


def sinh_with_intermediates(x):
    return SinhWithIntermediates.apply(x)[0]
'''
# SinhFixed whose backward calls a Function of its own (as Cube calls CubeBackward): right to
# second order; the third derivative goes through the helper's backward.
_COSH_TIMES = '''
import numpy as np


class CoshTimes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, grad_out, x):
        ctx.save_for_backward(grad_out, x)
        return grad_out * torch.cosh(x)

    @staticmethod
{decorator}    def backward(ctx, grad):
        grad_out, x = ctx.saved_tensors
        return grad * torch.cosh(x), grad * grad_out * {sinh}


class SinhFixed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sinh(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return CoshTimes.apply(grad_out, x)
'''
_TUTORIAL_FORWARD = "ctx.save_for_backward(expx, expnegx)\n        return (expx - expnegx) / 2, expx, expnegx"
_EXTRA_TERMS = "return grad_x + grad_expx * expx - grad_expnegx * expnegx"

MUTANTS = [
    wrong("sinh_fixed", "saves the intermediates with save_for_backward", source=_SINH_SAVE.format(
        save="ctx.save_for_backward(expx, expnegx)", load="expx, expnegx = ctx.saved_tensors")),
    wrong("sinh_fixed", "keeps the intermediates on ctx (SinhBad)", source=_SINH_SAVE.format(
        save="ctx.expx, ctx.expnegx = expx, expnegx", load="expx, expnegx = ctx.expx, ctx.expnegx")),
    wrong("sinh_fixed", "adds @once_differentiable",
          ("    @staticmethod\n    def backward",
           "    @staticmethod\n    @torch.autograd.function.once_differentiable\n    def backward")),
    wrong("sinh_fixed", "ignores grad_output",
          ("return grad_out * (torch.exp(x) + torch.exp(-x)) / 2", "return (torch.exp(x) + torch.exp(-x)) / 2")),
    wrong("sinh_fixed", "detaches the saved input in backward",
          ("(x,) = ctx.saved_tensors", "x = ctx.saved_tensors[0].detach()")),
    wrong("sinh_fixed", "computes cosh under torch.no_grad()",
          ("return grad_out * (torch.exp(x) + torch.exp(-x)) / 2  # recomputed, so recorded",
           "with torch.no_grad():\n            cosh = (torch.exp(x) + torch.exp(-x)) / 2\n"
           "        return grad_out * cosh")),
    wrong("sinh_fixed", "reads x.data in backward",
          ("(x,) = ctx.saved_tensors", "x = ctx.saved_tensors[0].data")),
    wrong("sinh_fixed", "cosh computed by NumPy", source='''
import numpy as np


class SinhFixed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sinh(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * torch.as_tensor(np.cosh(x.detach().cpu().numpy()), device=x.device)
'''),
    wrong("sinh_fixed", "cosh = sqrt(1 + y * y) from the output: y * y overflows for |x| > 355", source='''
class SinhFixed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.sinh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (y,) = ctx.saved_tensors
        return grad_out * torch.sqrt(1 + y * y)
'''),
    wrong("sinh_fixed", "cosh = sinh(x) / tanh(x): 0 / 0 at x = 0", source='''
class SinhFixed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.sinh(x)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, y = ctx.saved_tensors
        return grad_out * y / torch.tanh(x)
'''),
    # SinhWithIntermediates (the PyTorch tutorial's fix)
    wrong("sinh_intermediates", "leaves out the extra outputs' gradients (passes gradcheck of out alone)",
          (_EXTRA_TERMS, "return grad_x")),
    wrong("sinh_intermediates", "sign of the exp(-x) term",
          (_EXTRA_TERMS, "return grad_x + grad_expx * expx + grad_expnegx * expnegx")),
    wrong("sinh_intermediates", "multiplies grad_expx by the wrong exponential",
          (_EXTRA_TERMS, "return grad_x + grad_expx * expnegx - grad_expnegx * expx")),
    wrong("sinh_intermediates", "saves copies of the outputs (intermediates again)",
          ("ctx.save_for_backward(expx, expnegx)  # saved, and returned below: outputs",
           "ctx.save_for_backward(expx.clone(), expnegx.clone())")),
    wrong("sinh_intermediates", "returns detached copies, so the saved tensors are not the outputs",
          ("return (expx - expnegx) / 2, expx, expnegx",
           "return (expx - expnegx) / 2, expx.detach(), expnegx.detach()")),
    wrong("sinh_intermediates", "marks the extra outputs non-differentiable",
          ("ctx.save_for_backward(expx, expnegx)  # saved, and returned below: outputs",
           "ctx.save_for_backward(expx, expnegx)\n        ctx.mark_non_differentiable(expx, expnegx)")),
    wrong("sinh_intermediates", "set_materialize_grads(False) without skipping None",
          ("ctx.save_for_backward(expx, expnegx)  # saved, and returned below: outputs",
           "ctx.save_for_backward(expx, expnegx)\n        ctx.set_materialize_grads(False)")),
    wrong("sinh_intermediates", "saves x and recomputes the exponentials", source=_SINH_INTERMEDIATES.format(
        forward="ctx.save_for_backward(x)\n        return (expx - expnegx) / 2, expx, expnegx",
        backward="(x,) = ctx.saved_tensors\n        expx, expnegx = torch.exp(x), torch.exp(-x)\n"
                 "        return grad_out * (expx + expnegx) / 2 + grad_expx * expx - grad_expnegx * expnegx")),
    wrong("sinh_intermediates", "adds the extra terms into grad_out in place", source=_SINH_INTERMEDIATES.format(
        forward=_TUTORIAL_FORWARD,
        backward="expx, expnegx = ctx.saved_tensors\n"
                 "        grad_out += 2 * (grad_expx * expx - grad_expnegx * expnegx) / (expx + expnegx)\n"
                 "        return grad_out * (expx + expnegx) / 2")),
    wrong("sinh_intermediates", "stashes the exponentials on ctx", source=_SINH_INTERMEDIATES.format(
        forward="ctx.expx, ctx.expnegx = expx, expnegx\n        return (expx - expnegx) / 2, expx, expnegx",
        backward="expx, expnegx = ctx.expx, ctx.expnegx\n"
                 "        return grad_out * (expx + expnegx) / 2 + grad_expx * expx - grad_expnegx * expnegx")),
    wrong("cube_backward", "missing the grad_out term",
          ("return grad_grad_out, grad_x", "return None, grad_x")),
    wrong("cube_backward", "ignores the incoming gradient in the x term",
          ("grad_x = grad * grad_out * 6 * x", "grad_x = grad_out * 6 * x")),
    wrong("cube_backward", "returns the gradients in the wrong order",
          ("return grad_grad_out, grad_x", "return grad_x, grad_grad_out")),
    wrong("cube_backward", "forgets the saved grad_out in the x term",
          ("grad_x = grad * grad_out * 6 * x", "grad_x = grad * 6 * x")),
    wrong("cube_backward", "zeros for grad_out",
          ("grad_grad_out = grad * 3 * x**2", "grad_grad_out = torch.zeros_like(grad)")),
    wrong("cube_backward", "multiplies the incoming gradient in place",
          ("grad_x = grad * grad_out * 6 * x", "grad_x = grad.mul_(grad_out * 6 * x)")),
    # Right to second order only: the backward of the backward leaves torch.
    wrong("cube_backward", "the x term computed by NumPy",
          ("grad_x = grad * grad_out * 6 * x",
           "grad_x = grad * torch.as_tensor(grad_out.detach().cpu().numpy() * 6 * x.detach().cpu().numpy(),"
           " device=x.device)")),
    wrong("cube_backward", "the grad_out term by the NumPy kernel", ("grad_grad_out = grad * 3 * x**2",
                                                                     "grad_grad_out = cube_backward_kernel(grad, x)")),
    wrong("cube_backward", "marks its backward @once_differentiable",
          ("    @staticmethod\n    def backward(ctx, grad):",
           "    @staticmethod\n    @torch.autograd.function.once_differentiable\n    def backward(ctx, grad):")),
    wrong("cube_backward", "detaches the saved x",
          ("grad_out, x = ctx.saved_tensors", "grad_out, x = ctx.saved_tensors\n"
                                                   "        x = x.detach()")),
    wrong("cube_backward", "6x² / x: nan at x = 0",
          ("grad_x = grad * grad_out * 6 * x", "grad_x = grad * grad_out * 6 * x**2 / x")),
    wrong("sinh_fixed", "backward through a helper Function whose backward uses NumPy", source=_COSH_TIMES.format(
        decorator="", sinh="torch.as_tensor(np.sinh(x.detach().cpu().numpy()), device=x.device)")),
    wrong("sinh_fixed", "backward through a helper Function marked @once_differentiable", source=_COSH_TIMES.format(
        decorator="    @torch.autograd.function.once_differentiable\n", sinh="torch.sinh(x)")),
    wrong("hvp", "no create_graph", (", create_graph=True)", ")")),
    wrong("hvp", "detaches the gradient",
          ("torch.autograd.grad(g, x, grad_outputs=v)", "torch.autograd.grad(g.detach(), x, grad_outputs=v)")),
    wrong("hvp", "sums the gradient instead of using v",
          ("torch.autograd.grad(g, x, grad_outputs=v)", "torch.autograd.grad(g.sum(), x)")),
    wrong("hvp", "x does not require grad",
          ("x = x.detach().requires_grad_()", "x = x.detach()")),
    wrong("hvp", "sets requires_grad on the caller's x",
          ("x = x.detach().requires_grad_()", "x.requires_grad_()")),
    wrong("hvp", "builds the full Hessian", source='''
def hvp(f, x, v):
    n = x.numel()
    H = torch.autograd.functional.hessian(f, x.detach()).reshape(n, n)
    return (H @ v.flatten()).reshape(x.shape)
'''),
    wrong("hvp", "backward() accumulates both passes in x.grad", source='''
def hvp(f, x, v):
    x = x.detach().requires_grad_()
    f(x).backward(create_graph=True)
    x.grad.backward(v)
    return x.grad
'''),
    wrong("hvp", "g @ v, a dot product only for vectors",
          ("(hv,) = torch.autograd.grad(g, x, grad_outputs=v)", "(hv,) = torch.autograd.grad(g @ v, x)")),
    wrong("hvp", "torch.func, which cannot transform classic Functions", source='''
def hvp(f, x, v):
    return torch.func.jvp(torch.func.grad(f), (x,), (v,))[1]
'''),
    wrong("graph_answers", "thinks Tanh saves its input", ('"a": "out"', '"a": "x"')),
    wrong("graph_answers", "one AccumulateGrad per use of x", ('"f": "1"', '"f": "2"')),
    wrong("graph_answers", "thinks differentiating grad_x re-runs Cube.backward",
          ('"g": "AccumulateGrad"', '"g": "CubeBackward"')),
    wrong("graph_answers", "takes the forward node for grad_x's grad_fn",
          ('"d": "CubeBackwardBackward"', '"d": "CubeBackward"')),
    wrong("graph_answers", "thinks an unconnected gradient still has a node", ('"h": "0"', '"h": "1"')),
    wrong("graph_answers", "thinks an unused output's gradient arrives as None", ('"i": "0"', '"i": "None"')),
    wrong("graph_answers", "counts the saved zeros as the Function's saved tensors", ('"j": "2"', '"j": "4"')),
    # Claims only these refute (test_every_claim_a_check_prints_is_refuted_by_a_known_wrong_answer)
    wrong("hvp", "reuses the caller's x when it requires grad, and backward() fills its .grad", source='''
def hvp(f, x, v):
    if not x.requires_grad:
        x = x.detach().requires_grad_()
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    (g * v).sum().backward()
    return x.grad
'''),
]

VARIANTS = [
    right("sinh_fixed", "saves the output: cosh = hypot(1, sinh), which does not overflow", source='''
class SinhFixed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.sinh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (y,) = ctx.saved_tensors
        return grad_out * torch.hypot(torch.ones_like(y), y)
'''),
    right("sinh_fixed", "saves input and output, torch.cosh, needs_input_grad", source='''
class SinhFixed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.sinh()
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, _ = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None
        return grad_out * x.cosh()
'''),
    right("sinh_intermediates", "set_materialize_grads(False), skipping the gradients that are None",
          source=_SINH_INTERMEDIATES.format(
              forward="ctx.set_materialize_grads(False)\n        " + _TUTORIAL_FORWARD,
              backward="expx, expnegx = ctx.saved_tensors\n        grad_x = None\n"
                       "        for g, d in ((grad_out, (expx + expnegx) / 2), (grad_expx, expx), "
                       "(grad_expnegx, -expnegx)):\n            if g is not None:\n"
                       "                grad_x = g * d if grad_x is None else grad_x + g * d\n"
                       "        return grad_x")),
    right("sinh_intermediates", "the tutorial's in-place accumulation into its own new tensor",
          source=_SINH_INTERMEDIATES.format(
              forward=_TUTORIAL_FORWARD,
              backward="expx, expnegx = ctx.saved_tensors\n        grad_input = grad_out * (expx + expnegx) / 2\n"
                       "        grad_input += grad_expx * expx\n        grad_input -= grad_expnegx * expnegx\n"
                       "        return grad_input")),
    right("cube_backward", "itself for the grad_out term, needs_input_grad", source='''
class CubeBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, grad_out, x):
        ctx.save_for_backward(grad_out, x)
        return cube_backward_kernel(grad_out, x)

    @staticmethod
    def backward(ctx, grad):
        grad_out, x = ctx.saved_tensors
        d_grad_out = d_x = None
        if ctx.needs_input_grad[0]:
            d_grad_out = CubeBackward.apply(grad, x)  # grad · 3x²: a node, differentiable again
        if ctx.needs_input_grad[1]:
            d_x = 6 * x * grad_out * grad
        return d_grad_out, d_x
'''),
    right("hvp", "differentiates (g * v).sum()", source='''
def hvp(f, x, v):
    x = x.detach().clone().requires_grad_(True)
    g = torch.autograd.grad(f(x), [x], create_graph=True)[0]
    return torch.autograd.grad((g * v).sum(), [x])[0]
'''),
    right("hvp", "torch.autograd.functional.hvp", source='''
def hvp(f, x, v):
    return torch.autograd.functional.hvp(f, x, v)[1]
'''),
    right("hvp", "vhp (the Hessian is symmetric), result still attached", source='''
def hvp(f, x, v):
    return torch.autograd.functional.vhp(f, x, v, create_graph=True)[1]
'''),
    right("graph_answers", "capitals, spaces and ints", source='''
graph_answers = {"a": "OUT", "b": 3, "c": " tanhbackward", "d": "CubeBackwardBackward ",
                 "e": "grad_out", "f": 1, "g": "accumulategrad", "h": 0, "i": 0, "j": " 2"}
'''),
]
