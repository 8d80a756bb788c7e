"""08_memory: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

MUTANTS = [
    # LeakyReLU saving a mask
    wrong("leaky_relu", "saves the float input x instead of a mask (as F.leaky_relu does)",
          ("ctx.save_for_backward(positive)", "ctx.save_for_backward(x)"),
          ("(positive,) = ctx.saved_tensors", "(x,) = ctx.saved_tensors\n        positive = x > 0")),
    wrong("leaky_relu", "saves the output (nothing else keeps it alive)",
          ("        ctx.save_for_backward(positive)\n", ""),
          ("return torch.where(positive, x, x * negative_slope)",
           "y = torch.where(positive, x, x * negative_slope)\n        ctx.save_for_backward(y)\n        return y"),
          ("(positive,) = ctx.saved_tensors", "(y,) = ctx.saved_tensors\n        positive = y > 0")),
    wrong("leaky_relu", "stashes the mask on ctx (the guide's UltraSelective)",
          ("ctx.save_for_backward(positive)", "ctx.positive = positive"),
          ("(positive,) = ctx.saved_tensors", "positive = ctx.positive")),
    wrong("leaky_relu", "saves the derivative as a float tensor",
          ("ctx.save_for_backward(positive)",
           "ctx.save_for_backward(torch.where(positive, 1.0, negative_slope).to(x.dtype))"),
          ("(positive,) = ctx.saved_tensors\n"
           "        return torch.where(positive, grad_output, grad_output * ctx.negative_slope), None",
           "(slope,) = ctx.saved_tensors\n        return grad_output * slope, None")),
    wrong("leaky_relu", "scales grad_output in place (the guide's CustomReLU without its clone)",
          ("return torch.where(positive, grad_output, grad_output * ctx.negative_slope), None",
           "grad_output[~positive] *= ctx.negative_slope\n        return grad_output, None")),
    wrong("leaky_relu", "blends the two pieces with a steep sigmoid (right far from 0, wrong beside it)",
          ("return torch.where(positive, x, x * negative_slope)",
           "return x * (negative_slope + (1 - negative_slope) * torch.sigmoid(x * 1e6))")),
    wrong("leaky_relu", "views x as flat (fails when x is not contiguous)",
          ("positive = x > 0", "positive = (x.view(-1) > 0).view(x.shape)")),
    wrong("leaky_relu", "no None for negative_slope (one gradient for two inputs)",
          ("grad_output * ctx.negative_slope), None", "grad_output * ctx.negative_slope)")),
    # LinearReLU
    wrong("linear_relu", "saves x, weight and bias whatever needs a gradient (the guide's FusedLinearReLU)",
          ("ctx.save_for_backward(x if weight_needs else None, weight if x_needs else None, mask)",
           "ctx.save_for_backward(x, weight, bias, mask)"),
          ("x, weight, mask = ctx.saved_tensors", "x, weight, _, mask = ctx.saved_tensors")),
    wrong("linear_relu", "ignores needs_input_grad when saving (right for a hidden layer only)",
          ("ctx.save_for_backward(x if weight_needs else None, weight if x_needs else None, mask)",
           "ctx.save_for_backward(x, weight, mask)")),
    wrong("linear_relu", "saves the pre-activation z instead of a mask",
          ("ctx.save_for_backward(x if weight_needs else None, weight if x_needs else None, mask)\n"
           "        return z.relu_()  # in place on z, a tensor forward created: nobody else sees it",
           "ctx.save_for_backward(x if weight_needs else None, weight if x_needs else None, z)\n"
           "        return torch.relu(z)"),
          ("x, weight, mask = ctx.saved_tensors", "x, weight, z = ctx.saved_tensors\n        mask = z > 0")),
    wrong("linear_relu", "saves the output instead of a mask",
          ("ctx.save_for_backward(x if weight_needs else None, weight if x_needs else None, mask)\n"
           "        return z.relu_()  # in place on z, a tensor forward created: nobody else sees it",
           "y = torch.relu(z)\n"
           "        ctx.save_for_backward(x if weight_needs else None, weight if x_needs else None, y)\n"
           "        return y"),
          ("x, weight, mask = ctx.saved_tensors", "x, weight, y = ctx.saved_tensors\n        mask = y > 0")),
    wrong("linear_relu", "stashes the mask on ctx",
          ("ctx.save_for_backward(x if weight_needs else None, weight if x_needs else None, mask)",
           "ctx.save_for_backward(x if weight_needs else None, weight if x_needs else None)\n        ctx.mask = mask"),
          ("x, weight, mask = ctx.saved_tensors", "x, weight = ctx.saved_tensors\n        mask = ctx.mask")),
    wrong("linear_relu", "squeezes grad_bias (wrong when out = 1)",
          ("grad_bias = g.sum(0) if", "grad_bias = g.sum(0).squeeze() if")),
    wrong("linear_relu", "recomputes z in backward from x, weight and bias", source='''
class LinearReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)  # recompute the mask in backward instead of keeping it
        return torch.relu(x @ weight.T + bias)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight, bias = ctx.saved_tensors
        g = grad_output * (x @ weight.T + bias > 0)
        return g @ weight, g.T @ x, g.sum(0)
'''),
    # A tensor kept outside ctx: invisible to the hooks and to ctx, alive after backward
    wrong("leaky_relu", "keeps the mask in a class attribute instead of saving it (saves 0 bytes)",
          ("ctx.save_for_backward(positive)", "LeakyReLU.positive = positive"),
          ("(positive,) = ctx.saved_tensors", "positive = LeakyReLU.positive")),
    wrong("linear_relu", "keeps the mask in a module global instead of saving it",
          ("ctx.save_for_backward(x if weight_needs else None, weight if x_needs else None, mask)",
           "ctx.save_for_backward(x if weight_needs else None, weight if x_needs else None)\n"
           "        global _mask\n        _mask = mask"),
          ("x, weight, mask = ctx.saved_tensors", "x, weight = ctx.saved_tensors\n        mask = _mask")),
    wrong("linear_relu", "keeps x and weight in a dict of an enclosing function (a closure): saves only the mask",
          source='''
def _fused_layer():
    kept = {}  # x and weight for backward, outside what the budget counts

    class LinearReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            z = x @ weight.T + bias
            kept["x"], kept["weight"] = x, weight
            ctx.save_for_backward(z > 0)
            return z.relu_()

        @staticmethod
        def backward(ctx, grad_output):
            (mask,) = ctx.saved_tensors
            g = grad_output * mask
            return (g @ kept["weight"] if ctx.needs_input_grad[0] else None,
                    g.T @ kept["x"] if ctx.needs_input_grad[1] else None,
                    g.sum(0) if ctx.needs_input_grad[2] else None)

    return LinearReLU


LinearReLU = _fused_layer()
'''),
    # Claims only these refute (test_every_claim_a_check_prints_is_refuted_by_a_known_wrong_answer)
    wrong("linear_relu", "z computed in float32 to save memory (inf once |z| passes 3e38)",
          ("z = x @ weight.T + bias\n", "z = (x.float() @ weight.float().T + bias.float()).to(x.dtype)\n")),
]

VARIANTS = [
    right("leaky_relu", "one bit per element: the mask packed into uint8", source='''
class LeakyReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, negative_slope):
        bits = (x > 0).flatten()
        bits = torch.cat([bits, bits.new_zeros((-bits.numel()) % 8)]).view(-1, 8).to(torch.uint8)
        weights = 2 ** torch.arange(8, dtype=torch.uint8, device=x.device)
        ctx.save_for_backward((bits * weights).sum(1, dtype=torch.uint8))
        ctx.shape, ctx.slope = x.shape, negative_slope
        return torch.nn.functional.leaky_relu(x, negative_slope)

    @staticmethod
    def backward(ctx, grad_output):
        (packed,) = ctx.saved_tensors
        shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
        bits = (packed.unsqueeze(1) >> shifts) & 1
        positive = bits.flatten()[: grad_output.numel()].view(ctx.shape).bool()
        return grad_output * (positive + ~positive * ctx.slope), None
'''),
    right("linear_relu", "F.linear, a uint8 mask from the output, Nones skipped in save_for_backward", source='''
import torch.nn.functional as F


class LinearReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        y = F.linear(x, weight, bias).clamp_(min=0)
        ctx.keep = [ctx.needs_input_grad[1], ctx.needs_input_grad[0]]  # x, weight
        ctx.save_for_backward(*[t for t, k in zip((x, weight), ctx.keep) if k], (y > 0).to(torch.uint8))
        return y

    @staticmethod
    def backward(ctx, grad_output):
        saved = list(ctx.saved_tensors)
        mask = saved.pop()
        x = saved.pop(0) if ctx.keep[0] else None
        weight = saved.pop(0) if ctx.keep[1] else None
        g = torch.where(mask.bool(), grad_output, torch.zeros_like(grad_output))
        return (
            g.mm(weight) if weight is not None else None,
            g.t().mm(x) if x is not None else None,
            g.sum(dim=0) if ctx.needs_input_grad[2] else None,
        )
'''),
]
