"""10_modern_api: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

_CLIPPED_RELU_CLASSIC = '''
class ClippedReLU(torch.autograd.Function):
    """min(max(x, 0), clip) for a tensor x and a plain number clip, in the modern style."""

    generate_vmap_rule = True

    @staticmethod
    def forward(ctx, x, clip):
        ctx.save_for_backward(x)
        ctx.clip = clip
        return x.clamp(0, clip)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * ((x > 0) & (x < ctx.clip)), None
'''

_VMAP_BY_LOOP = '''
        x_bdim, y_bdim, _ = in_dims
        outs = []
        for b in range(info.batch_size):
            xb = x.select(x_bdim, b) if x_bdim is not None else x
            yb = y.select(y_bdim, b) if y_bdim is not None else y
            outs.append(SquaredDistance.apply(xb, yb, dim))
        return torch.stack(outs), 0'''

_SOFTMAX_RULE = "return softmax(x.movedim(in_dims[0], 0)), 0  # the batch away from the last dim, which softmax reduces"
_SOFTMAX_BACKWARD = "return y * (grad - (grad * y).sum(-1, keepdim=True))"

_VMAP_SOLUTION = '''        x_bdim, y_bdim, _ = in_dims  # dim is not a tensor: its entry is None
        x = x.movedim(x_bdim, 0) if x_bdim is not None else x.expand(info.batch_size, *x.shape)
        y = y.movedim(y_bdim, 0) if y_bdim is not None else y.expand(info.batch_size, *y.shape)
        dim = dim + 1 if dim >= 0 else dim  # the dims of a sample, counted in the batch
        return SquaredDistance.apply(x, y, dim), 0'''

MUTANTS = [
    # 10.1 ClippedReLU, ported
    wrong("clipped_relu", "keeps the classic style (forward(ctx, ...), no setup_context)",
          source=_CLIPPED_RELU_CLASSIC),
    wrong("clipped_relu", "keeps ctx in forward's signature as well as setup_context",
          ("def forward(x, clip):", "def forward(ctx, x, clip):")),
    wrong("clipped_relu", "saves clip with save_for_backward (not a tensor)",
          ("ctx.save_for_backward(x)\n        ctx.clip = clip",
           "ctx.save_for_backward(x, clip)\n        ctx.clip = clip")),
    wrong("clipped_relu", "a CPU float32 mask in backward (not device-generic)",
          ("return grad_output * ((x > 0) & (x < ctx.clip)), None",
           "mask = torch.zeros(x.shape)\n        mask[(x > 0) & (x < ctx.clip)] = 1\n"
           "        return grad_output * mask, None")),
    wrong("clipped_relu", "forward builds the clip tensor on the CPU (not device-generic)",
          ("return x.clamp(0, clip)", "return torch.minimum(x.clamp(min=0), torch.full(x.shape, clip))")),
    wrong("clipped_relu", "forward through NumPy (the generated vmap rule cannot run it)",
          ("return x.clamp(0, clip)",
           "import numpy as np\n"
           "        return torch.from_numpy(np.clip(x.detach().cpu().numpy(), 0, clip)).to(x.device, x.dtype)")),
    wrong("clipped_relu", "forgets generate_vmap_rule",
          ("    generate_vmap_rule = True  # forward, setup_context and backward use torch operations only\n", "")),
    wrong("clipped_relu", "returns one gradient (no None for clip)",
          ("return grad_output * ((x > 0) & (x < ctx.clip)), None", "return grad_output * ((x > 0) & (x < ctx.clip))")),
    wrong("clipped_relu", "keeps x as an attribute of ctx instead of saving it (every value right)",
          ("ctx.save_for_backward(x)\n        ctx.clip = clip", "ctx.x = x\n        ctx.clip = clip"),
          ("(x,) = ctx.saved_tensors\n        return", "x = ctx.x\n        return")),
    wrong("clipped_relu", "keeps x in a class attribute for backward (every value right)",
          ("ctx.save_for_backward(x)\n        ctx.clip = clip", "ClippedReLU.last_x = x\n        ctx.clip = clip"),
          ("(x,) = ctx.saved_tensors\n        return", "x = ClippedReLU.last_x\n        return")),
    wrong("clipped_relu", "the slope as output / x: NaN at exactly 0, right everywhere else",
          ("return grad_output * ((x > 0) & (x < ctx.clip)), None",
           "return grad_output * torch.where(x < ctx.clip, x.clamp(min=0) / x, 0.0), None")),
    # 10.2 a vmap rule by hand
    wrong("vmap_rule", "right only for in_dims 0 (never moves the batch dims)",
          ("        x = x.movedim(x_bdim, 0) if x_bdim is not None else x.expand(info.batch_size, *x.shape)\n"
           "        y = y.movedim(y_bdim, 0) if y_bdim is not None else y.expand(info.batch_size, *y.shape)\n", "")),
    wrong("vmap_rule", "out_dims copied from x's in_dims",
          ("return SquaredDistance.apply(x, y, dim), 0", "return SquaredDistance.apply(x, y, dim), x_bdim")),
    wrong("vmap_rule", "dim not shifted past the batch dim",
          ("dim = dim + 1 if dim >= 0 else dim  # the dims of a sample, counted in the batch", "")),
    wrong("vmap_rule", "shifts negative dims too",
          ("dim = dim + 1 if dim >= 0 else dim", "dim = dim + 1")),
    wrong("vmap_rule", "no case for an unbatched input (in_dims None)",
          ("x = x.movedim(x_bdim, 0) if x_bdim is not None else x.expand(info.batch_size, *x.shape)",
           "x = x.movedim(x_bdim, 0)"),
          ("y = y.movedim(y_bdim, 0) if y_bdim is not None else y.expand(info.batch_size, *y.shape)",
           "y = y.movedim(y_bdim, 0)")),
    wrong("vmap_rule", "out_dims None (claims the output is unbatched)",
          ("return SquaredDistance.apply(x, y, dim), 0", "return SquaredDistance.apply(x, y, dim), None")),
    wrong("vmap_rule", "generate_vmap_rule = True instead of a rule", source='''
class SquaredDistance(torch.autograd.Function):
    """Σ over dim of (x − y)², computed by NumPy, for x and y of the same shape."""

    generate_vmap_rule = True

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
'''),
    # 10.3 jvp with save_for_forward
    wrong("swish_jvp", "saves with save_for_backward only (jvp finds an empty tuple)",
          ("        ctx.save_for_forward(x, beta)\n", "")),
    wrong("swish_jvp", "saves with save_for_forward only (backward finds an empty tuple)",
          ("        ctx.save_for_backward(x, beta)\n", "")),
    wrong("swish_jvp", "computes the tangent in float64 and casts it back to the input's dtype",
          ("return x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)",
           "dtype, x, beta, x_t, beta_t, s = x.dtype, x.double(), beta.double(), x_t.double(), beta_t.double(), "
           "s.double()\n"
           "        return (x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)).to(dtype)")),
    wrong("swish_jvp", "computes the tangent in float64 (a float64 tangent for a float32 output)",
          ("return x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)",
           "return x_t.double() * (s + beta * x * s * (1 - s)).double() + beta_t * x * x * s * (1 - s)")),
    wrong("swish_jvp", "ignores beta's tangent",
          ("return x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)",
           "return x_t * (s + beta * x * s * (1 - s))")),
    wrong("swish_jvp", "ignores x's tangent",
          ("return x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)",
           "return beta_t * x * x * s * (1 - s)")),
    wrong("swish_jvp", "sums beta's term to beta's shape, as backward does",
          ("return x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)",
           "return x_t * (s + beta * x * s * (1 - s)) + (beta_t * x * x * s * (1 - s)).sum_to_size(beta.shape)")),
    wrong("swish_jvp", "drops the product rule's first term (x_t * beta * x * s(1 - s) only)",
          ("return x_t * (s + beta * x * s * (1 - s))", "return x_t * (beta * x * s * (1 - s))")),
    wrong("swish_jvp", "∂y/∂x written as y/x + βy(1 − σ): NaN at exactly x = 0",
          ("return x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)",
           "y = x * s\n        return x_t * (y / x + beta * y * (1 - s)) + beta_t * x * y * (1 - s)")),
    wrong("swish_jvp", "σ' as e^(−βx) / (1 + e^(−βx))²: NaN where e^(−βx) overflows (x = −10⁴)",
          ("return x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)",
           "ds = torch.exp(-beta * x) / (1 + torch.exp(-beta * x)) ** 2\n"
           "        return x_t * (s + beta * x * ds) + beta_t * x * x * ds")),
    wrong("swish_jvp", "jvp reads x and beta kept on ctx (no save_for_forward; every tangent right)",
          ("        ctx.save_for_forward(x, beta)\n", "        ctx.x, ctx.beta = x, beta\n"),
          ("x, beta = ctx.saved_tensors\n        s = torch.sigmoid(beta * x)\n        return x_t",
           "x, beta = ctx.x, ctx.beta\n        s = torch.sigmoid(beta * x)\n        return x_t")),
    # 10.4 a custom op
    wrong("logsumexp_op", "fake kernel with the input's shape",
          ("return x.new_empty(x.shape[:-1])", "return torch.empty_like(x)")),
    wrong("logsumexp_op", "fake kernel with torch.empty (float32, on the CPU)",
          ("return x.new_empty(x.shape[:-1])", "return torch.empty(x.shape[:-1])")),
    wrong("logsumexp_op", "torch.from_numpy on NumPy's scalar (a 1-d x)",
          ("torch.from_numpy(np.asarray(out))", "torch.from_numpy(out)")),
    wrong("logsumexp_op", "setup_context saves output and x in the order backward does not read",
          ("ctx.save_for_backward(x, output)", "ctx.save_for_backward(output, x)")),
    wrong("logsumexp_op", "backward in NumPy (no double backward)",
          ("return grad.unsqueeze(-1) * torch.exp(x - out.unsqueeze(-1))",
           "soft = np.exp(x.detach().cpu().numpy() - out.detach().cpu().numpy()[..., None])\n"
           "    return grad.unsqueeze(-1) * torch.from_numpy(soft).to(grad.device, grad.dtype)")),
    wrong("logsumexp_op", "no register_autograd",
          ("logsumexp.register_autograd(logsumexp_backward, setup_context=logsumexp_setup_context)", "")),
    wrong("logsumexp_op", "naive log(sum(exp)) kernel (overflows at 1000)",
          ("out = np.logaddexp.reduce(x.detach().cpu().numpy(), axis=-1)",
           "out = np.log(np.exp(x.detach().cpu().numpy()).sum(-1))")),
    wrong("logsumexp_op", "the float64 of NumPy's sum kept (no dtype conversion)",
          ("out = np.logaddexp.reduce(x.detach().cpu().numpy(), axis=-1)",
           "out = np.logaddexp.reduce(x.detach().cpu().numpy().astype(np.float64), axis=-1)"),
          (".to(device=x.device, dtype=x.dtype)", ".to(device=x.device)")),
    wrong("logsumexp_op", "another notebook's namespace",
          ('"modern_api::logsumexp"', '"mylib::logsumexp"')),
    wrong("logsumexp_op", "backward as exp(x) / exp(lse): inf / inf at ±1000",
          ("return grad.unsqueeze(-1) * torch.exp(x - out.unsqueeze(-1))",
           "return grad.unsqueeze(-1) * torch.exp(x) / torch.exp(out).unsqueeze(-1)")),
    wrong("logsumexp_op", "setup_context keeps x and the output on ctx (every value right)",
          ("(x,) = inputs\n    ctx.save_for_backward(x, output)", "ctx.x, ctx.out = inputs[0], output"),
          ("x, out = ctx.saved_tensors", "x, out = ctx.x, ctx.out")),
    # 10.5 the modern pattern
    wrong("softmax_pattern", "fake kernel with the shape of a reduction (10.4's)",
          ("def _(x):\n    return torch.empty_like(x)", "def _(x):\n    return x.new_empty(x.shape[:-1])")),
    wrong("softmax_pattern", "fake kernel with torch.empty (float32, on the CPU)",
          ("def _(x):\n    return torch.empty_like(x)", "def _(x):\n    return torch.empty(x.shape)")),
    wrong("softmax_pattern", "vmap rule keeps the batch where it is (wrong when it is the last dim)",
          (_SOFTMAX_RULE, "return softmax(x), in_dims[0]")),
    wrong("softmax_pattern", "vmap rule says out_dims 0 without moving the batch",
          (_SOFTMAX_RULE, "return softmax(x), 0")),
    wrong("softmax_pattern", "vmap rule moves the batch to the last dim (softmax over the samples)",
          (_SOFTMAX_RULE, "return softmax(x.movedim(in_dims[0], -1)), -1")),
    wrong("softmax_pattern", "no register_vmap (vmap's slow per-sample fallback, with a warning)",
          ("@softmax.register_vmap\ndef _(info, in_dims, x):\n    " + _SOFTMAX_RULE,
           "def _(info, in_dims, x):\n    " + _SOFTMAX_RULE)),
    wrong("softmax_pattern", "backward without the sum term (y · grad)",
          (_SOFTMAX_BACKWARD, "return y * grad")),
    wrong("softmax_pattern", "backward sums without keepdim (broadcasts the wrong way)",
          (_SOFTMAX_BACKWARD, "return y * (grad - (grad * y).sum(-1))")),
    wrong("softmax_pattern", "saves x and recomputes exp(x) / Σ exp(x) in backward: NaN at ±1000",
          ("ctx.save_for_backward(output)", "ctx.save_for_backward(inputs[0])"),
          ("(y,) = ctx.saved_tensors\n    return",
           "(x,) = ctx.saved_tensors\n    e = torch.exp(x)\n    y = e / e.sum(-1, keepdim=True)\n    return")),
    wrong("softmax_pattern", "backward in NumPy (no double backward)",
          (_SOFTMAX_BACKWARD, "g, s = grad.detach().cpu().numpy(), y.detach().cpu().numpy()\n"
           "    return torch.from_numpy(s * (g - (g * s).sum(-1, keepdims=True))).to(grad.device, grad.dtype)")),
    wrong("softmax_pattern", "setup_context keeps the output on ctx (every value right)",
          ("ctx.save_for_backward(output)", "ctx.y = output"),
          ("(y,) = ctx.saved_tensors\n    return", "y = ctx.y\n    return")),
    wrong("softmax_pattern", "the output kept in a global for backward (every value right)",
          ("ctx.save_for_backward(output)", "global kept_output\n    kept_output = output"),
          ("(y,) = ctx.saved_tensors\n    return", "y = kept_output\n    return")),
    wrong("softmax_pattern", "the Function computes torch.softmax instead of calling the op",
          ("        return softmax(x)\n", "        return torch.softmax(x, -1)\n")),
    wrong("softmax_pattern", "the Function has no vmap rule (no generate_vmap_rule)",
          ("    generate_vmap_rule = True  # forward calls the op, whose vmap rule takes the batch\n", "")),
    wrong("softmax_pattern", "the op's own autograd formula passes grad through (the Function's is right)",
          ("softmax.register_autograd(softmax_backward,", "softmax.register_autograd(lambda ctx, grad: grad,")),
    wrong("softmax_pattern", "the Function in the classic style (forward(ctx, x))",
          ("    @staticmethod\n    def forward(x):\n        return softmax(x)\n\n    @staticmethod\n"
           "    def setup_context(ctx, inputs, output):\n        softmax_setup_context(ctx, inputs, output)\n",
           "    @staticmethod\n    def forward(ctx, x):\n        y = softmax(x)\n        ctx.save_for_backward(y)\n"
           "        return y\n")),
    # Claims only these refute (test_every_claim_a_check_prints_is_refuted_by_a_known_wrong_answer)
    wrong("clipped_relu", "backward reads grad_output.data (old style: torch.func's jacrev cannot run it)",
          ("return grad_output * ((x > 0) & (x < ctx.clip)), None",
           "return grad_output.data * ((x > 0) & (x < ctx.clip)), None")),
]

VARIANTS = [
    right("clipped_relu", "saves the output and masks with it (0 < y < clip iff 0 < x < clip)",
          ("x, clip = inputs\n        ctx.save_for_backward(x)",
           "x, clip = inputs\n        ctx.save_for_backward(output)"),
          ("(x,) = ctx.saved_tensors\n        return grad_output * ((x > 0) & (x < ctx.clip)), None",
           "(y,) = ctx.saved_tensors\n        return torch.where((y > 0) & (y < ctx.clip), grad_output, 0.0), None")),
    right("clipped_relu", "clamp through torch.minimum/maximum and a float mask", ("return x.clamp(0, clip)",
          "return torch.minimum(torch.relu(x), torch.full_like(x, clip))"),
          ("return grad_output * ((x > 0) & (x < ctx.clip)), None",
           "return grad_output * ((x > 0) & (x < ctx.clip)).to(grad_output.dtype), None")),
    right("vmap_rule", "a loop over the batch, stacked", (_VMAP_SOLUTION, _VMAP_BY_LOOP.lstrip("\n"))),
    right("vmap_rule", "the batch moved to the end, out_dims -1",
          (_VMAP_SOLUTION, '''        x_bdim, y_bdim, _ = in_dims
        x = x.movedim(x_bdim, -1) if x_bdim is not None else x.unsqueeze(-1)
        y = y.movedim(y_bdim, -1) if y_bdim is not None else y.unsqueeze(-1)
        return SquaredDistance.apply(x, y, dim if dim >= 0 else dim - 1), -1''')),
    right("vmap_rule", "unbatched inputs get a size-1 batch dim and broadcast",
          ("else x.expand(info.batch_size, *x.shape)", "else x.unsqueeze(0)"),
          ("else y.expand(info.batch_size, *y.shape)", "else y.unsqueeze(0)")),
    right("swish_jvp", "materialize_grads off: None tangents handled", source='''
class Swish(torch.autograd.Function):
    """x * sigmoid(beta * x), for a beta that broadcasts against x, with a forward mode."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, beta):
        return x * torch.sigmoid(beta * x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, beta = inputs
        ctx.save_for_backward(x, beta)
        ctx.save_for_forward(x, beta)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_output):
        if grad_output is None:  # materialize_grads is off: an unused output's gradient
            return None, None
        x, beta = ctx.saved_tensors
        s = torch.sigmoid(beta * x)
        grad_x = grad_output * (s + beta * x * s * (1 - s))
        grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)
        return grad_x, grad_beta

    @staticmethod
    def jvp(ctx, x_t, beta_t):
        x, beta = ctx.saved_tensors
        s = torch.special.expit(beta * x)
        ds = s * (1 - s)
        tangent = torch.zeros_like(x * beta)
        if x_t is not None:
            tangent = tangent + x_t * s * (1 + beta * x * (1 - s))
        if beta_t is not None:
            tangent = tangent + beta_t * x.square() * ds
        return tangent
'''),
    right("swish_jvp", "the product rule written on the tangent of beta·x",
          ("return x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)",
           "z_t = beta_t * x + beta * x_t  # tangent of z = beta * x\n        return x_t * s + x * s * (1 - s) * z_t")),
    right("logsumexp_op", "max trick by hand in NumPy, torch.empty with dtype and device, saves x only", source='''
@torch.library.custom_op("modern_api::logsumexp", mutates_args=())
def logsumexp(x: torch.Tensor) -> torch.Tensor:
    """log Σ exp(x) over the last dim, computed by NumPy."""
    a = x.detach().cpu().numpy()
    m = a.max(axis=-1, keepdims=True)
    out = (m + np.log(np.exp(a - m).sum(axis=-1, keepdims=True)))[..., 0]
    return torch.as_tensor(out).to(device=x.device, dtype=x.dtype)


@logsumexp.register_fake
def _(x):
    return torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)


def logsumexp_setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def logsumexp_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad.unsqueeze(-1) * torch.softmax(x, -1)


logsumexp.register_autograd(logsumexp_backward, setup_context=logsumexp_setup_context)
'''),
    right("logsumexp_op", "torch.library.register_fake / register_autograd by name, torch.as_tensor", source='''
@torch.library.custom_op("modern_api::logsumexp", mutates_args=())
def logsumexp(x: torch.Tensor) -> torch.Tensor:
    """log Σ exp(x) over the last dim, computed by NumPy."""
    return torch.as_tensor(np.logaddexp.reduce(x.detach().cpu().numpy(), axis=-1), device=x.device, dtype=x.dtype)


@torch.library.register_fake("modern_api::logsumexp")
def _(x):
    return x.sum(-1).new_empty(x.shape[:-1])


def setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output)


def backward(ctx, grad):
    x, out = ctx.saved_tensors
    return torch.exp(x - out[..., None]) * grad[..., None]


torch.library.register_autograd("modern_api::logsumexp", backward, setup_context=setup)
'''),
    right("softmax_pattern", "register_vmap by name, the op called through torch.ops",
          ("@softmax.register_vmap\ndef _(info, in_dims, x):", "def softmax_rule(info, in_dims, x):"),
          ("softmax.register_autograd(",
           "torch.library.register_vmap(\"modern_api::softmax\", softmax_rule)\nsoftmax.register_autograd("),
          ("        return softmax(x)\n", "        return torch.ops.modern_api.softmax(x)\n")),
    right("softmax_pattern", "the batch moved only when it is at the last dim",
          (_SOFTMAX_RULE, "b = in_dims[0] % x.dim()\n    if b == x.dim() - 1:\n        x, b = x.movedim(b, 0), 0\n"
           "    return softmax(x), b")),
    right("softmax_pattern", "saves x, backward from torch.softmax; the Function's own vmap staticmethod",
          ("ctx.save_for_backward(output)", "ctx.save_for_backward(inputs[0])"),
          ("(y,) = ctx.saved_tensors\n    return",
           "(x,) = ctx.saved_tensors\n    y = torch.softmax(x, -1)\n    return"),
          ("    generate_vmap_rule = True  # forward calls the op, whose vmap rule takes the batch\n", ""),
          ("        return softmax_backward(ctx, grad_output)",
           "        return softmax_backward(ctx, grad_output)\n\n    @staticmethod\n    def vmap(info, in_dims, x):\n"
           "        return Softmax.apply(x.movedim(in_dims[0], 0)), 0")),
]
