"""03_function_basics: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

_POLAR_FORWARD = '''
class PolarToCartesian(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r, theta):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(r, theta)
        return r * torch.cos(theta), r * torch.sin(theta)
'''

MUTANTS = [
    # 3.1 ClippedReLU
    wrong("clipped_relu", "forgets the upper clip",
          ("inside = (x > 0) & (x < ctx.clip)", "inside = x > 0")),
    wrong("clipped_relu", "ignores grad_output",
          ("return grad_output * inside, None", "return inside.to(x.dtype), None")),
    wrong("clipped_relu", "no None for the non-tensor clip",
          ("return grad_output * inside, None", "return grad_output * inside")),
    wrong("clipped_relu", "mask built on the CPU",
          ("return grad_output * inside, None",
           "return grad_output * inside * torch.ones(x.shape, dtype=x.dtype), None")),
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
    wrong("clipped_relu", "stashes x on ctx instead of saving it",
          ("ctx.save_for_backward(x)\n", "ctx.x = x\n"), ("(x,) = ctx.saved_tensors", "x = ctx.x")),
    wrong("clipped_relu", "zeroes grad_output in place", source='''
class ClippedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clip):
        ctx.save_for_backward(x)
        ctx.clip = clip
        return x.clamp(0, clip)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        grad_output[(x <= 0) | (x >= ctx.clip)] = 0
        return grad_output, None
'''),
    wrong("clipped_relu", "gives the clip to save_for_backward too",
          ("ctx.save_for_backward(x)\n", "ctx.save_for_backward(x, clip)\n"),
          ("(x,) = ctx.saved_tensors", "x, _ = ctx.saved_tensors")),
    wrong("clipped_relu", "mask as y / x: nan at x = 0", source='''
class ClippedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clip):
        y = x.clamp(0, clip)
        ctx.save_for_backward(x, y)
        ctx.clip = clip
        return y

    @staticmethod
    def backward(ctx, grad_output):
        x, y = ctx.saved_tensors
        slope = (y / x) * (y < ctx.clip)  # 1 between 0 and clip, 0 elsewhere
        return grad_output * slope, None
'''),
    # 3.2 Linear
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
    wrong("linear", "squeezes the bias gradient (shape () for one output feature)",
          ("grad_bias = grad_output.sum(0)", "grad_bias = grad_output.sum(0).squeeze()")),
    wrong("linear", "gradients in the wrong order",
          ("return grad_input, grad_weight, grad_bias", "return grad_weight, grad_input, grad_bias")),
    wrong("linear", "tests needs_input_grad[0] for the weight too",
          ("if ctx.needs_input_grad[1]:\n", "if ctx.needs_input_grad[0]:\n")),
    # 3.3 PolarToCartesian
    wrong("polar_to_cartesian", "no set_materialize_grads(False): zeros arrive",
          ("        ctx.set_materialize_grads(False)\n", "")),
    wrong("polar_to_cartesian", "builds zeros in place of a None gradient", source=_POLAR_FORWARD + '''
    @staticmethod
    def backward(ctx, grad_x, grad_y):
        r, theta = ctx.saved_tensors
        if grad_x is None:
            grad_x = torch.zeros_like(r)
        if grad_y is None:
            grad_y = torch.zeros_like(r)
        cos, sin = torch.cos(theta), torch.sin(theta)
        grad_r = grad_x * cos + grad_y * sin if ctx.needs_input_grad[0] else None
        grad_theta = r * (grad_y * cos - grad_x * sin) if ctx.needs_input_grad[1] else None
        return grad_r, grad_theta
'''),
    wrong("polar_to_cartesian", "cannot take a None gradient", source=_POLAR_FORWARD + '''
    @staticmethod
    def backward(ctx, grad_x, grad_y):
        r, theta = ctx.saved_tensors
        cos, sin = torch.cos(theta), torch.sin(theta)
        return grad_x * cos + grad_y * sin, r * (grad_y * cos - grad_x * sin)
'''),
    wrong("polar_to_cartesian", "wrong sign in the theta gradient",
          ("grad_theta = -grad_x * r * sin", "grad_theta = grad_x * r * sin")),
    wrong("polar_to_cartesian", "forgets r in the theta gradient",
          ("grad_theta = -grad_x * r * sin", "grad_theta = -grad_x * sin"),
          ("add_optional(grad_theta, grad_y * r * cos)", "add_optional(grad_theta, grad_y * cos)")),
    wrong("polar_to_cartesian", "returns gradients nobody needs",
          ("            if ctx.needs_input_grad[0]:\n                grad_r = grad_x * cos\n"
           "            if ctx.needs_input_grad[1]:\n                grad_theta = -grad_x * r * sin\n",
           "            grad_r = grad_x * cos\n            grad_theta = -grad_x * r * sin\n"),
          ("            if ctx.needs_input_grad[0]:\n                grad_r = add_optional(grad_r, grad_y * sin)\n"
           "            if ctx.needs_input_grad[1]:\n"
           "                grad_theta = add_optional(grad_theta, grad_y * r * cos)\n",
           "            grad_r = add_optional(grad_r, grad_y * sin)\n"
           "            grad_theta = add_optional(grad_theta, grad_y * r * cos)\n")),
    wrong("polar_to_cartesian", "gradients in the wrong order",
          ("return grad_r, grad_theta", "return grad_theta, grad_r")),
    wrong("polar_to_cartesian", "saves the outputs and divides by r: nan at r = 0", source='''
class PolarToCartesian(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r, theta):
        ctx.set_materialize_grads(False)
        x, y = r * torch.cos(theta), r * torch.sin(theta)
        ctx.save_for_backward(r, x, y)
        return x, y

    @staticmethod
    def backward(ctx, grad_x, grad_y):
        r, x, y = ctx.saved_tensors
        grad_r = grad_theta = None
        if grad_x is not None:
            grad_r = grad_x * x / r if ctx.needs_input_grad[0] else None
            grad_theta = -grad_x * y if ctx.needs_input_grad[1] else None
        if grad_y is not None:
            if ctx.needs_input_grad[0]:
                grad_r = add_optional(grad_r, grad_y * y / r)
            if ctx.needs_input_grad[1]:
                grad_theta = add_optional(grad_theta, grad_y * x)
        return grad_r, grad_theta
'''),
    # Every check used to put its special point (here r = 0) first: an answer right only there passed.
    wrong("polar_to_cartesian", "divides by r, patched at the first entry only (where checks used to put r = 0)",
          source='''
class PolarToCartesian(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r, theta):
        ctx.set_materialize_grads(False)
        x, y = r * torch.cos(theta), r * torch.sin(theta)
        ctx.save_for_backward(r, theta, x, y)
        return x, y

    @staticmethod
    def backward(ctx, grad_x, grad_y):
        r, theta, x, y = ctx.saved_tensors
        first = (torch.arange(r.numel(), device=r.device) == 0).reshape(r.shape)
        r_there = torch.where(first, torch.ones_like(r), r)
        cos = torch.where(first, torch.cos(theta), x / r_there)
        sin = torch.where(first, torch.sin(theta), y / r_there)
        grad_r = grad_theta = None
        if grad_x is not None:
            grad_r = grad_x * cos if ctx.needs_input_grad[0] else None
            grad_theta = -grad_x * y if ctx.needs_input_grad[1] else None
        if grad_y is not None:
            if ctx.needs_input_grad[0]:
                grad_r = add_optional(grad_r, grad_y * sin)
            if ctx.needs_input_grad[1]:
                grad_theta = add_optional(grad_theta, grad_y * x)
        return grad_r, grad_theta
'''),
    wrong("polar_to_cartesian", "stashes r and theta on ctx",
          ("ctx.save_for_backward(r, theta)\n", "ctx.r, ctx.theta = r, theta\n"),
          ("r, theta = ctx.saved_tensors", "r, theta = ctx.r, ctx.theta")),
    # A backward that leaves torch: right values, no double backward (the notebook teaches it)
    wrong("clipped_relu", "backward computed in NumPy",
          ("return grad_output * inside, None",
           "return torch.as_tensor(grad_output.detach().cpu().numpy() * inside.cpu().numpy(), device=x.device), None")),
    wrong("linear", "weight gradient computed in NumPy",
          ("grad_weight = grad_output.T @ input",
           "grad_weight = torch.from_numpy(grad_output.detach().cpu().numpy().T @ input.detach().cpu().numpy())")),
    wrong("polar_to_cartesian", "cos and sin of a detached theta",
          ("cos, sin = torch.cos(theta), torch.sin(theta)",
           "cos, sin = torch.cos(theta.detach()), torch.sin(theta.detach())")),
    # 3.4 When to write a Function
    wrong("when_to_write", "thinks autograd follows numpy", ('"b": "function"', '"b": "composite"')),
    wrong("when_to_write", "a composite native op still needs a formula",
          ('"e": "composite"', '"e": "derivatives.yaml"')),
    wrong("when_to_write", "thinks the detach trick still needs a Function", ('"d": "composite"', '"d": "function"')),
    wrong("when_to_write", "thinks clipping a gradient needs a backward of its own",
          ('"g": "composite"', '"g": "function"')),
    # Claims only these refute (test_every_claim_a_check_prints_is_refuted_by_a_known_wrong_answer)
    wrong("linear", "a bias gradient whatever bias is (one for bias=None, which is not a tensor)",
          ("if ctx.needs_input_grad[2]:  # False when bias is None\n            grad_bias", "grad_bias")),
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
    right("clipped_relu", "the kinks included in the mask (<= and >=)",
          ("inside = (x > 0) & (x < ctx.clip)", "inside = (x >= 0) & (x <= ctx.clip)")),
    right("clipped_relu", "saves a boolean mask, torch.where", source='''
class ClippedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clip):
        ctx.save_for_backward((x > 0) & (x < clip))  # 1 byte per entry
        return torch.where(x < 0, 0.0, torch.where(x > clip, float(clip), x))

    @staticmethod
    def backward(ctx, grad_output):
        (inside,) = ctx.saved_tensors
        return torch.where(inside, grad_output, torch.zeros_like(grad_output)), None
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
    right("linear", "bias gradient as a product with a vector of ones",
          ("grad_bias = grad_output.sum(0)", "grad_bias = grad_output.new_ones(grad_output.shape[0]) @ grad_output")),
    right("polar_to_cartesian", "saves the outputs and theta, cos and sin only when needed", source='''
class PolarToCartesian(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r, theta):
        ctx.set_materialize_grads(False)
        x, y = r * torch.cos(theta), r * torch.sin(theta)
        ctx.save_for_backward(theta, x, y)
        return x, y

    @staticmethod
    def backward(ctx, grad_x, grad_y):
        theta, x, y = ctx.saved_tensors
        need_r, need_theta = ctx.needs_input_grad
        terms_r, terms_theta = [], []
        if grad_x is not None:
            if need_r:
                terms_r.append(grad_x * torch.cos(theta))
            if need_theta:
                terms_theta.append(-grad_x * y)
        if grad_y is not None:
            if need_r:
                terms_r.append(grad_y * torch.sin(theta))
            if need_theta:
                terms_theta.append(grad_y * x)
        return (sum(terms_r[1:], terms_r[0]) if terms_r else None,
                sum(terms_theta[1:], terms_theta[0]) if terms_theta else None)
'''),
    right("when_to_write", "capitals and spaces", source='''
when_to_write = {"a": "Composite", "b": " function", "c": "Derivatives.yaml",
                 "d": "COMPOSITE", "e": "composite ", "f": "Function", "g": "COMPOSITE"}
'''),
]
