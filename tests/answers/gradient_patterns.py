"""04_gradient_patterns: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

_UNSQUEEZE = "        if not ctx.keepdim:\n            grad_output = grad_output.unsqueeze(ctx.dim)\n"

MUTANTS = [
    wrong("gelu", "computes in float64 for accuracy (a float32 input gives a float64 output)",
          ("return x * normal_cdf(x)", "return x.double() * normal_cdf(x.double())")),
    # 4.1 GELU
    wrong("gelu", "forgets the x·φ(x) term of the product rule",
          ("return grad_output * (normal_cdf(x) + x * normal_pdf(x))", "return grad_output * normal_cdf(x)")),
    wrong("gelu", "ignores grad_output",
          ("return grad_output * (normal_cdf(x) + x * normal_pdf(x))", "return normal_cdf(x) + x * normal_pdf(x)")),
    wrong("gelu", "subtracts the second term",
          ("normal_cdf(x) + x * normal_pdf(x)", "normal_cdf(x) - x * normal_pdf(x)")),
    wrong("gelu", "differentiates the tanh approximation",
          ("return grad_output * (normal_cdf(x) + x * normal_pdf(x))",
           "with torch.enable_grad():\n"
           "            t = x.detach().requires_grad_()\n"
           "            (slope,) = torch.autograd.grad(F.gelu(t, approximate='tanh').sum(), t)\n"
           "        return grad_output * slope"),
          flag="asks autograd for the gradient inside backward"),
    wrong("gelu", "saves the derivative computed in forward (an intermediate: no double backward)", source='''
class GELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        cdf = torch.special.ndtr(x)
        ctx.save_for_backward(cdf + x * torch.exp(-x**2 / 2) / math.sqrt(2 * math.pi))
        return x * cdf

    @staticmethod
    def backward(ctx, grad_output):
        (slope,) = ctx.saved_tensors
        return grad_output * slope
'''),
    wrong("gelu", "saves the output and recovers Φ(x) as y / x: nan at x = 0", source='''
class GELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x * normal_cdf(x)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        x, y = ctx.saved_tensors
        return grad_output * (y / x + x * normal_pdf(x))
'''),
    wrong("gelu", "marks backward @once_differentiable", source='''
from torch.autograd.function import once_differentiable


class GELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * normal_cdf(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * (normal_cdf(x) + x * normal_pdf(x))
'''),
    # 4.2 BatchedMatmul
    wrong("batched_matmul", ".T (all dims reversed) instead of .mT",
          ("return grad_output @ b.mT, a.mT @ grad_output", "return grad_output @ b.T, a.T @ grad_output")),
    wrong("batched_matmul", "transposed gradient for b",
          ("a.mT @ grad_output  #", "grad_output.mT @ a  #")),
    wrong("batched_matmul", "ignores grad_output",
          ("return grad_output @ b.mT, a.mT @ grad_output",
           "return torch.ones_like(grad_output) @ b.mT, a.mT @ torch.ones_like(grad_output)")),
    wrong("batched_matmul", "transposes the first two dims",
          ("return grad_output @ b.mT, a.mT @ grad_output",
           "return grad_output @ b.transpose(0, 1), a.transpose(0, 1) @ grad_output")),
    wrong("batched_matmul", "returns one gradient",
          ("return grad_output @ b.mT, a.mT @ grad_output", "return grad_output @ b.mT")),
    wrong("batched_matmul", "flattens the batch with view (fails on a non-contiguous grad_output)", source='''
class BatchedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, grad_output):
        a, b = ctx.saved_tensors
        n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
        g = grad_output.view(-1, n, m)  # one batch dim, for bmm
        a3, b3 = a.reshape(-1, n, k), b.reshape(-1, k, m)
        return torch.bmm(g, b3.mT).view(a.shape), torch.bmm(a3.mT, g).view(b.shape)
'''),
    # 4.3 unbroadcast
    wrong("unbroadcast", "forgets the expanded size-1 dims",
          ("dims = [*range(lead), *(lead + i for i, size in enumerate(shape) if size == 1)]", "dims = [*range(lead)]")),
    wrong("unbroadcast", "sums without keepdim",
          ("grad = grad.sum(dims, keepdim=True)", "grad = grad.sum(dims)"),
          ("return grad.reshape(shape)", "return grad")),
    wrong("unbroadcast", "falls into the empty-tuple trap", source='''
def unbroadcast(grad, shape):
    lead = grad.dim() - len(shape)
    grad = grad.sum(dim=tuple(range(lead)))
    ones = tuple(i for i, size in enumerate(shape) if size == 1)
    return grad.sum(dim=ones, keepdim=True) if ones else grad
'''),
    wrong("unbroadcast", "matches dims from the left", source='''
def unbroadcast(grad, shape):
    extra = list(range(len(shape), grad.dim()))
    if extra:
        grad = grad.sum(extra)
    ones = [i for i, size in enumerate(shape) if size == 1]
    if ones:
        grad = grad.sum(ones, keepdim=True)
    return grad
'''),
    wrong("unbroadcast", "mean instead of sum",
          ("grad = grad.sum(dims, keepdim=True)", "grad = grad.mean(dims, keepdim=True)")),
    wrong("unbroadcast", "builds the result on the CPU in float32", source='''
def unbroadcast(grad, shape):
    out = torch.zeros(shape)
    out += grad.sum_to_size(shape)
    return out
'''),
    # 4.4 Affine
    wrong("affine", "forgets to unbroadcast the gradient of x",
          ("unbroadcast(grad_output * weight, x.shape)", "grad_output * weight")),
    wrong("affine", "unbroadcasts weight's gradient to x's shape",
          ("unbroadcast(grad_output * x, weight.shape)", "unbroadcast(grad_output * x, x.shape)")),
    wrong("affine", "ignores grad_output for the bias",
          ("unbroadcast(grad_output, ctx.bias_shape)", "unbroadcast(torch.ones_like(grad_output), ctx.bias_shape)")),
    wrong("affine", "returns two gradients",
          ("            unbroadcast(grad_output, ctx.bias_shape),\n", "")),
    wrong("affine", "multiplies by the wrong factor",
          ("unbroadcast(grad_output * weight, x.shape)", "unbroadcast(grad_output * x, x.shape)")),
    wrong("affine", "tests needs_input_grad[1] for the bias too", source='''
class Affine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.bias_shape = bias.shape
        return x * weight + bias

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = unbroadcast(grad_output * weight, x.shape)
        if ctx.needs_input_grad[1]:
            grad_weight = unbroadcast(grad_output * x, weight.shape)
        if ctx.needs_input_grad[1]:  # copied from the line above
            grad_bias = unbroadcast(grad_output, ctx.bias_shape)
        return grad_x, grad_weight, grad_bias
'''),
    # 4.5 Mean
    wrong("mean", "forgets to unsqueeze the reduced dim", (_UNSQUEEZE, "")),
    wrong("mean", "forgets to divide by n",
          ("grad_output.expand(ctx.shape) / ctx.shape[ctx.dim]", "grad_output.expand(ctx.shape)")),
    wrong("mean", "divides by numel", ("/ ctx.shape[ctx.dim]", "/ ctx.shape.numel()")),
    wrong("mean", "returns one gradient for three inputs", (", None, None", "")),
    wrong("mean", "ignores grad_output",
          ("grad_output.expand(ctx.shape) / ctx.shape[ctx.dim]",
           "torch.ones_like(grad_output).expand(ctx.shape) / ctx.shape[ctx.dim]")),
    # 4.6 Max
    wrong("max", "gives the whole gradient to every tied element",
          ("grad_output * is_max / is_max.sum(ctx.dim, keepdim=True)", "grad_output * is_max")),
    wrong("max", "gives everything to one index, like torch.max(dim)", source='''
class Max(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim=False):
        values, index = x.max(dim, keepdim=True)
        ctx.save_for_backward(index)
        ctx.shape, ctx.dim, ctx.keepdim = x.shape, dim, keepdim
        return values if keepdim else values.squeeze(dim)

    @staticmethod
    def backward(ctx, grad_output):
        (index,) = ctx.saved_tensors
        if not ctx.keepdim:
            grad_output = grad_output.unsqueeze(ctx.dim)
        return grad_output.new_zeros(ctx.shape).scatter(ctx.dim, index, grad_output), None, None
'''),
    wrong("max", "ignores grad_output",
          ("grad_output * is_max / is_max.sum", "torch.ones_like(grad_output) * is_max / is_max.sum")),
    wrong("max", "returns one gradient for three inputs", (", None, None", "")),
    wrong("max", "forgets to unsqueeze the reduced dim", (_UNSQUEEZE, "")),
    # right until a dim has size 1
    wrong("max", "squeeze() without a dim in forward: a batch of one goes too",
          ("return out if keepdim else out.squeeze(dim)", "return out if keepdim else out.squeeze()")),
    wrong("max", "grad_output.squeeze().unsqueeze(dim) for either keepdim: a batch of one goes too",
          (_UNSQUEEZE, "        grad_output = grad_output.squeeze().unsqueeze(ctx.dim)\n")),
    wrong("max", "returns grad_output as it is when the reduced dim has size 1 (forgets keepdim=False)",
          ("        (is_max,) = ctx.saved_tensors\n",
           "        (is_max,) = ctx.saved_tensors\n"
           "        if is_max.shape[ctx.dim] == 1:  # every entry is the maximum of its slice\n"
           "            return grad_output, None, None\n")),
    # 4.7 Conv2d
    wrong("conv2d", "bias gradient summed over the batch only",
          ("grad_output.sum((0, 2, 3))", "grad_output.sum(0)")),
    wrong("conv2d", "forgets stride and padding for the input gradient",
          ("conv2d_input(input.shape, weight, grad_output, ctx.stride, ctx.padding)",
           "conv2d_input(input.shape, weight, grad_output)")),
    wrong("conv2d", "conv_transpose2d without output_padding",
          ("torch.nn.grad.conv2d_input(input.shape, weight, grad_output, ctx.stride, ctx.padding)",
           "F.conv_transpose2d(grad_output, weight, stride=ctx.stride, padding=ctx.padding)")),
    wrong("conv2d", "ignores grad_output for the weight",
          ("conv2d_weight(input, weight.shape, grad_output, ctx.stride, ctx.padding)",
           "conv2d_weight(input, weight.shape, torch.ones_like(grad_output), ctx.stride, ctx.padding)")),
    wrong("conv2d", "returns three gradients for five inputs",
          ("return grad_input, grad_weight, grad_bias, None, None", "return grad_input, grad_weight, grad_bias")),
    wrong("conv2d", "returns a bias gradient when bias is None",
          ("grad_output.sum((0, 2, 3)) if ctx.needs_input_grad[2] else None", "grad_output.sum((0, 2, 3))")),
    wrong("conv2d", "tests needs_input_grad[1] for the input gradient",
          ("grad_input = torch.nn.grad.conv2d_input(input.shape, weight, grad_output, ctx.stride, ctx.padding)",
           "grad_input = (torch.nn.grad.conv2d_input(input.shape, weight, grad_output, ctx.stride, ctx.padding)\n"
           "                      if ctx.needs_input_grad[1] else None)")),
]

# Conv2d's gradients with conv_transpose2d and an output_padding computed per axis: an unusual
# right answer, and the base of the wrong ones that use one axis's parameter for both.
_CONV_TRANSPOSED = '''
def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


class Conv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias=None, stride=1, padding=0):
        ctx.save_for_backward(input, weight)
        ctx.stride, ctx.padding = _pair(stride), _pair(padding)
        return F.conv2d(input, weight, bias, stride, padding)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        sizes = zip(input.shape[-2:], grad_output.shape[-2:], weight.shape[-2:], ctx.stride, ctx.padding)
        output_padding = tuple(n - ((o - 1) * s - 2 * p + k) for n, o, k, s, p in sizes)
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = F.conv_transpose2d(grad_output, weight, None, ctx.stride, ctx.padding, output_padding)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.nn.grad.conv2d_weight(input, weight.shape, grad_output, ctx.stride, ctx.padding)
        if ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum((0, 2, 3))
        return grad_input, grad_weight, grad_bias, None, None
'''

VARIANTS = [
    right("gelu", "torch.special.ndtr and the density in backward, needs_input_grad", source='''
class GELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.special.ndtr(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None
        density = torch.exp(-0.5 * x.square()) * (2 * math.pi) ** -0.5
        return grad_output * (torch.special.ndtr(x) + x * density)
'''),
    right("batched_matmul", "einsum, needs_input_grad", source='''
class BatchedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.einsum("...nk,...km->...nm", a, b)

    @staticmethod
    def backward(ctx, grad_output):
        a, b = ctx.saved_tensors
        grad_a = torch.einsum("...nm,...km->...nk", grad_output, b) if ctx.needs_input_grad[0] else None
        grad_b = torch.einsum("...nk,...nm->...km", a, grad_output) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b
'''),
    right("unbroadcast", "a loop over dims", source='''
def unbroadcast(grad, shape):
    while grad.dim() > len(shape):
        grad = grad.sum(0)
    for i, size in enumerate(shape):
        if size == 1 and grad.shape[i] != 1:
            grad = grad.sum(i, keepdim=True)
    return grad
'''),
    right("unbroadcast", "sum_to_size", source='''
def unbroadcast(grad, shape):
    return grad.sum_to_size(shape)
'''),
    right("affine", "saves all three, sum_to_size, needs_input_grad", source='''
class Affine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        return torch.addcmul(bias, x, weight)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight, bias = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        return (
            (grad_output * weight).sum_to_size(x.shape) if need_x else None,
            (grad_output * x).sum_to_size(weight.shape) if need_w else None,
            grad_output.sum_to_size(bias.shape) if need_b else None,
        )
'''),
    right("mean", "saves x, broadcast_to, a non-negative dim, an extra trailing None", source='''
class Mean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim=False):
        ctx.save_for_backward(x)
        ctx.dim, ctx.keepdim = dim % x.dim(), keepdim
        return x.sum(dim, keepdim=keepdim) / x.shape[dim]

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        g = grad_output if ctx.keepdim else grad_output.unsqueeze(ctx.dim)
        return torch.broadcast_to(g / x.shape[ctx.dim], x.shape).clone(), None, None, None
'''),
    right("max", "saves x and the output, torch.where", source='''
class Max(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim=False):
        out = torch.amax(x, dim, keepdim)
        ctx.save_for_backward(x, out)
        ctx.dim, ctx.keepdim = dim, keepdim
        return out

    @staticmethod
    def backward(ctx, grad_output):
        x, out = ctx.saved_tensors
        if not ctx.keepdim:
            out, grad_output = out.unsqueeze(ctx.dim), grad_output.unsqueeze(ctx.dim)
        mask = (x == out).to(grad_output.dtype)
        share = mask / mask.sum(ctx.dim, keepdim=True)
        return torch.where(mask.bool(), grad_output * share, torch.zeros_like(x)), None, None
'''),
    right("conv2d", "conv_transpose2d with a computed output_padding", source=_CONV_TRANSPOSED),
]

MUTANTS += [
    wrong("conv2d", "output_padding of the height used for the width", source=_CONV_TRANSPOSED.replace(
        "        sizes = zip(input.shape[-2:], grad_output.shape[-2:], weight.shape[-2:], ctx.stride, ctx.padding)\n"
        "        output_padding = tuple(n - ((o - 1) * s - 2 * p + k) for n, o, k, s, p in sizes)\n",
        "        n, o, k, s, p = input.shape[2], grad_output.shape[2], weight.shape[2], ctx.stride[0], ctx.padding[0]\n"
        "        output_padding = n - ((o - 1) * s - 2 * p + k)  # the same for both axes\n")),
    wrong("conv2d", "output_padding of the width used for the height", source=_CONV_TRANSPOSED.replace(
        "        sizes = zip(input.shape[-2:], grad_output.shape[-2:], weight.shape[-2:], ctx.stride, ctx.padding)\n"
        "        output_padding = tuple(n - ((o - 1) * s - 2 * p + k) for n, o, k, s, p in sizes)\n",
        "        n, o, k, s, p = input.shape[3], grad_output.shape[3], weight.shape[3], ctx.stride[1], ctx.padding[1]\n"
        "        output_padding = (n - ((o - 1) * s - 2 * p + k),) * 2\n")),
    wrong("conv2d", "stride and padding of the first axis for both", source=_CONV_TRANSPOSED.replace(
        "ctx.stride, ctx.padding = _pair(stride), _pair(padding)",
        "ctx.stride, ctx.padding = _pair(stride)[:1] * 2, _pair(padding)[:1] * 2")),
]
VARIANTS += [
    right("conv2d", "stride and padding spelled out per axis, the bias summed in two steps", source='''
class Conv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias=None, stride=1, padding=0):
        sh, sw = (stride, stride) if isinstance(stride, int) else stride
        ph, pw = (padding, padding) if isinstance(padding, int) else padding
        ctx.save_for_backward(input, weight)
        ctx.hw = (sh, sw), (ph, pw)
        return F.conv2d(input, weight, bias, (sh, sw), (ph, pw))

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        stride, padding = ctx.hw
        grad_input = torch.nn.grad.conv2d_input(input.shape, weight, grad_output, stride, padding)
        grad_weight = torch.nn.grad.conv2d_weight(input, weight.shape, grad_output, stride, padding)
        grad_bias = grad_output.sum(3).sum(2).sum(0) if ctx.needs_input_grad[2] else None
        return grad_input, grad_weight, grad_bias, None, None
'''),
]

# A backward that leaves torch for part of its formula: right values, no double backward.
MUTANTS += [
    wrong("batched_matmul", "detaches the saved factors in backward",
          ("a, b = ctx.saved_tensors", "a, b = (t.detach() for t in ctx.saved_tensors)")),
    wrong("affine", "multiplies by a detached weight",
          ("unbroadcast(grad_output * weight, x.shape)", "unbroadcast(grad_output * weight.detach(), x.shape)")),
    wrong("mean", "spreads the gradient with NumPy",
          ("return grad_output.expand(ctx.shape) / ctx.shape[ctx.dim], None, None",
           "spread = __import__('numpy').broadcast_to(grad_output.detach().cpu().numpy(), ctx.shape)\n"
           "        return torch.as_tensor(spread / ctx.shape[ctx.dim], device=grad_output.device), None, None")),
    wrong("max", "splits the gradient with NumPy",
          ("return grad_output * is_max / is_max.sum(ctx.dim, keepdim=True), None, None",
           "g, m = grad_output.detach().cpu().numpy(), is_max.cpu().numpy()\n"
           "        return torch.as_tensor(g * m / m.sum(ctx.dim, keepdims=True), device=is_max.device), None, None")),
    wrong("conv2d", "detaches the weight for the input gradient",
          ("conv2d_input(input.shape, weight, grad_output, ctx.stride, ctx.padding)",
           "conv2d_input(input.shape, weight.detach(), grad_output, ctx.stride, ctx.padding)")),
]

# An empty dim: the sum over it is zeros.
MUTANTS += [
    wrong("unbroadcast", "a mean times the count (nan over an empty dim)",
          ("grad = grad.sum(dims, keepdim=True)",
           "grad = grad.mean(dims, keepdim=True) * math.prod(grad.shape[d] for d in dims)")),
]

# Float32 inputs: a gradient computed in float64 comes back as float32 (autograd's engine casts it without
# a word), so only the float32 run's watch for float64 steps tells.
MUTANTS += [
    wrong("gelu", "computes the gradient in float64 (the engine casts it back to float32)",
          ("return grad_output * (normal_cdf(x) + x * normal_pdf(x))",
           "return grad_output.double() * (normal_cdf(x.double()) + x.double() * normal_pdf(x.double()))")),
    wrong("gelu", "computes the gradient in float64 and casts it back itself",
          ("return grad_output * (normal_cdf(x) + x * normal_pdf(x))",
           "x64 = x.double()\n"
           "        return (grad_output.double() * (normal_cdf(x64) + x64 * normal_pdf(x64))).to(x.dtype)")),
]
