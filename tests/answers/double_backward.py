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

MUTANTS = [
    wrong("sinh_fixed", "saves the intermediates with save_for_backward", source=_SINH_SAVE.format(
        save="ctx.save_for_backward(expx, expnegx)", load="expx, expnegx = ctx.saved_tensors")),
    wrong("sinh_fixed", "keeps the intermediates on ctx (SinhBad)", source=_SINH_SAVE.format(
        save="ctx.expx, ctx.expnegx = expx, expnegx", load="expx, expnegx = ctx.expx, ctx.expnegx")),
    wrong("sinh_fixed", "adds @once_differentiable",
          ("    @staticmethod\n    def backward", "    @staticmethod\n    @torch.autograd.function.once_differentiable\n    def backward")),
    wrong("sinh_fixed", "ignores grad_output",
          ("return grad_out * (torch.exp(x) + torch.exp(-x)) / 2", "return (torch.exp(x) + torch.exp(-x)) / 2")),
    wrong("sinh_fixed", "detaches the saved input in backward",
          ("(x,) = ctx.saved_tensors", "x = ctx.saved_tensors[0].detach()")),
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
]

VARIANTS = [
    right("sinh_fixed", "saves the output: cosh = sqrt(1 + sinh²)", source='''
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
    right("cube_backward", "kernel for the grad_out term, needs_input_grad", source='''
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
            d_grad_out = cube_backward_kernel(grad, x)  # grad · 3x², the same kernel
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
                 "e": "grad_out", "f": 1, "g": "accumulategrad", "h": 0}
'''),
]
