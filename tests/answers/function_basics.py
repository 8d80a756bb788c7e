"""03_function_basics: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

MUTANTS = [
    wrong("clipped_relu", "forgets the upper clip",
          ("inside = (x > 0) & (x < ctx.clip)", "inside = x > 0")),
    wrong("clipped_relu", "ignores grad_output",
          ("return grad_output * inside, None", "return inside.to(x.dtype), None")),
    wrong("clipped_relu", "no None for the non-tensor clip",
          ("return grad_output * inside, None", "return grad_output * inside")),
    wrong("clipped_relu", "mask built on the CPU",
          ("return grad_output * inside, None", "return grad_output * inside * torch.ones(x.shape, dtype=x.dtype), None")),
    wrong("clipped_relu", "clamps the input in place",
          ("return x.clamp(0, clip)", "return x.clamp_(0, clip)")),
    wrong("clipped_relu", "asks autograd for the gradient", source='''
class ClippedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clip):
        ctx.save_for_backward(x)
        ctx.clip = clip
        return x.clamp(0, clip)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            (grad_x,) = torch.autograd.grad(x.clamp(0, ctx.clip), x, grad_output)
        return grad_x, None
''', flag="asks autograd for the gradient inside backward"),
    wrong("linear", "ignores needs_input_grad",
          ("if ctx.needs_input_grad[0]:\n", "if True:\n"), ("if ctx.needs_input_grad[1]:\n", "if True:\n")),
    wrong("linear", "transposed weight gradient",
          ("grad_weight = grad_output.T @ input", "grad_weight = input.T @ grad_output")),
    wrong("linear", "bias gradient summed over the features",
          ("grad_bias = grad_output.sum(0)", "grad_bias = grad_output.sum(1)")),
    wrong("linear", "bias gradient averaged over the batch",
          ("grad_bias = grad_output.sum(0)", "grad_bias = grad_output.mean(0)")),
    wrong("linear", "returns no gradient for bias",
          ("return grad_input, grad_weight, grad_bias", "return grad_input, grad_weight")),
    wrong("when_to_write", "thinks autograd follows numpy", ('"b": "function"', '"b": "composite"')),
    wrong("when_to_write", "a composite native op still needs a formula", ('"e": "composite"', '"e": "derivatives.yaml"')),
    wrong("when_to_write", "a straight-through estimator as a composite", ('"d": "function"', '"d": "composite"')),
]

VARIANTS = [
    right("clipped_relu", "saves the output, masks a clone of grad_output in place", source='''
class ClippedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clip):
        y = torch.minimum(torch.relu(x), torch.full_like(x, clip))
        ctx.save_for_backward(y)
        ctx.clip = clip
        return y

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        grad_x = grad_output.clone()
        grad_x[(y <= 0) | (y >= ctx.clip)] = 0
        return grad_x, None
'''),
    right("linear", "addmm and einsum, returns extra trailing None", source='''
class Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight)
        if bias is None:
            return input.mm(weight.t())
        return torch.addmm(bias, input, weight.t())

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        return (
            torch.einsum("bo,oi->bi", grad_output, weight) if needs[0] else None,
            torch.einsum("bo,bi->oi", grad_output, input) if needs[1] else None,
            grad_output.sum(dim=0) if needs[2] else None,
            None,
        )
'''),
    right("when_to_write", "capitals and spaces", source='''
when_to_write = {"a": "Composite", "b": " function", "c": "Derivatives.yaml",
                 "d": "FUNCTION", "e": "composite ", "f": "Function"}
'''),
]
