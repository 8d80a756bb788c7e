"""09_real_world: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

MUTANTS = [
    # Swish
    wrong("swish", "keeps the sigmoid in float64 (a float32 input gives a float64 output)",
          ("return x * torch.sigmoid(beta * x)", "return x * torch.sigmoid(beta * x).double()")),
    wrong("swish", "the guide's: saves σ(βx), save_for_backward twice, β's gradient reduced with .sum()", source='''
class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, beta):
        ctx.save_for_backward(input, beta)
        sigmoid_beta_input = torch.sigmoid(beta * input)
        ctx.save_for_backward(input, beta, sigmoid_beta_input)
        return input * sigmoid_beta_input

    @staticmethod
    def backward(ctx, grad_output):
        input, beta, s = ctx.saved_tensors
        grad_input = grad_beta = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output * (s + input * s * (1 - s) * beta)
        if ctx.needs_input_grad[1]:
            grad_beta = (grad_output * input**2 * s * (1 - s)).sum()
        return grad_input, grad_beta
'''),
    wrong("swish", "β's gradient reduced with .sum() (right only for a scalar β)",
          (".sum_to_size(beta.shape)", ".sum()")),
    wrong("swish", "β's gradient not reduced (autograd's engine sums it quietly)",
          (".sum_to_size(beta.shape)", "")),
    wrong("swish", "β's gradient summed over dim 0 only", (".sum_to_size(beta.shape)", ".sum(0)")),
    wrong("swish", "right only for the visible shapes of β", (
        "grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)",
        ("local = grad_output * x * x * s * (1 - s)\n"
        "            if beta.dim() == 0:\n"
        "                grad_beta = local.sum()\n"
        "            elif beta.dim() == 1:\n"
        "                grad_beta = local.sum(0)\n"
        "            else:\n"
        "                grad_beta = local.sum((0, 2, 3), keepdim=True)[0]"),
    )),
    wrong("swish", "σ'(z) as exp(-z) / (1 + exp(-z))² (nan at βx = -1000)", source='''
class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta):
        ctx.save_for_backward(x, beta)
        return x / (1 + torch.exp(-beta * x))

    @staticmethod
    def backward(ctx, grad_output):
        x, beta = ctx.saved_tensors
        e = torch.exp(-beta * x)
        s = 1 / (1 + e)
        ds = e / (1 + e) ** 2
        grad_x = grad_output * (s + beta * x * ds)
        grad_beta = (grad_output * x * x * ds).sum_to_size(beta.shape)
        return grad_x, grad_beta
'''),
    wrong("swish", "saves the output and divides it by x (nan at x = 0)", source='''
class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta):
        y = x * torch.sigmoid(beta * x)
        ctx.save_for_backward(x, beta, y)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        x, beta, y = ctx.saved_tensors
        s = y / x
        grad_x = grad_output * (s + beta * x * s * (1 - s))
        grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)
        return grad_x, grad_beta
'''),
    wrong("swish", "forward returns float32", ("return x * torch.sigmoid(beta * x)",
                                                 "return (x * torch.sigmoid(beta * x)).float()")),
    wrong("swish", "β's gradient accumulated into a tensor made on the CPU", (
        "grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)",
        ("grad_beta = torch.zeros(beta.shape, dtype=beta.dtype)\n"
        "            grad_beta += (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)"),
    )),
    wrong("swish", "forgets the chain rule through βx in dy/dx",
          ("grad_x = grad_output * (s + beta * x * s * (1 - s))", "grad_x = grad_output * (s + x * s * (1 - s))")),
    wrong("swish", "β's gradient summed with .sum() whenever β has one entry (a β of shape (1,) is refused)", (
        "grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)",
        ("local = grad_output * x * x * s * (1 - s)\n"
        "            grad_beta = local.sum() if beta.numel() == 1 else local.sum_to_size(beta.shape)"),
    )),
    wrong("swish", "β's gradient from x's, (dy/dx − s)·x/β: nan at β = 0", (
        "grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)",
        "grad_beta = (grad_output * (s + beta * x * s * (1 - s) - s) * x / beta).sum_to_size(beta.shape)",
    )),
    # ... and the part of backward's formula autograd cannot follow: no double backward
    wrong("swish", "σ(βx) recomputed under torch.no_grad() in backward",
          ("s = torch.sigmoid(beta * x)", "with torch.no_grad():\n            s = torch.sigmoid(beta * x)")),
    wrong("swish", "a scalar β taken out of torch with float()", (
        "x, beta = ctx.saved_tensors\n",
        "x, beta = ctx.saved_tensors\n        b = float(beta) if beta.dim() == 0 else beta\n",
    ), ("grad_x = grad_output * (s + beta * x * s * (1 - s))", "grad_x = grad_output * (s + b * x * s * (1 - s))")),
    # LogSumExp
    wrong("logsumexp", "naive forward: log(sum(exp(x))) overflows at 1000", (
        "m = x.amax(dim, keepdim=True)\n        out = (m + torch.exp(x - m).sum(dim, keepdim=True).log()).squeeze(dim)",
        "out = torch.exp(x).sum(dim).log()",
    )),
    wrong("logsumexp", "backward as exp(x) / exp(out): inf / inf at 1000", (
        "torch.exp(x - out.unsqueeze(ctx.dim))", "torch.exp(x) / torch.exp(out.unsqueeze(ctx.dim))",
    )),
    wrong("logsumexp", "the guide's: saves the softmax", source='''
class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, dim):
        max_val, _ = input.max(dim=dim, keepdim=True)
        input_shifted = input - max_val
        sumexp = torch.exp(input_shifted).sum(dim=dim, keepdim=True)
        logsumexp = torch.log(sumexp) + max_val
        softmax = torch.exp(input_shifted) / sumexp
        ctx.save_for_backward(softmax)
        ctx.dim = dim
        return logsumexp.squeeze(dim)

    @staticmethod
    def backward(ctx, grad_output):
        (softmax,) = ctx.saved_tensors
        return softmax * grad_output.unsqueeze(ctx.dim), None
'''),
    wrong("logsumexp", "the max of the whole tensor, not of each slice",
          ("m = x.amax(dim, keepdim=True)", "m = x.max()")),
    wrong("logsumexp", "unsqueezes at the last dim whatever dim is", (
        "return grad_output.unsqueeze(ctx.dim) * torch.exp(x - out.unsqueeze(ctx.dim)), None",
        "return grad_output.unsqueeze(-1) * torch.exp(x - out.unsqueeze(-1)), None",
    )),
    wrong("logsumexp", "forgets to add the max back",
          ("out = (m + torch.exp(x - m)", "out = (torch.exp(x - m)")),
    wrong("logsumexp", "no gradient (None) for dim", (
        "* torch.exp(x - out.unsqueeze(ctx.dim)), None", "* torch.exp(x - out.unsqueeze(ctx.dim))",
    )),
    wrong("logsumexp", "squeeze() without a dim: a batch of one loses its dim too",
          ("(dim, keepdim=True).log()).squeeze(dim)", "(dim, keepdim=True).log()).squeeze()")),
    wrong("logsumexp", "the softmax detached in backward (no double backward)",
          ("torch.exp(x - out.unsqueeze(ctx.dim))", "torch.exp(x - out.unsqueeze(ctx.dim)).detach()")),
    wrong("logsumexp", "saves the softmax computed from the output", (
        "ctx.save_for_backward(x, out)", "ctx.save_for_backward(torch.exp(x - out.unsqueeze(dim)))",
    ),
    ("x, out = ctx.saved_tensors\n"
     "        return grad_output.unsqueeze(ctx.dim) * torch.exp(x - out.unsqueeze(ctx.dim)), None",
        "(p,) = ctx.saved_tensors\n        return grad_output.unsqueeze(ctx.dim) * p, None")),
    # GradReverse
    wrong("grad_reverse", "wrong sign: α·grad_output", ("return -ctx.alpha * grad_output, None",
                                                         "return ctx.alpha * grad_output, None")),
    wrong("grad_reverse", "reversal applied in forward", ("return x.view_as(x)", "return -alpha * x"),
          ("return -ctx.alpha * grad_output, None", "return -ctx.alpha * grad_output * 1, None")),
    wrong("grad_reverse", "ignores α", ("return -ctx.alpha * grad_output, None", "return -grad_output, None")),
    wrong("grad_reverse", "reverses grad_output in place", ("return -ctx.alpha * grad_output, None",
                                                             "return grad_output.mul_(-ctx.alpha), None")),
    wrong("grad_reverse", "no None for alpha", ("return -ctx.alpha * grad_output, None",
                                                 "return -ctx.alpha * grad_output")),
    wrong("grad_reverse", "saves x although backward needs nothing",
          ("ctx.alpha = alpha", "ctx.alpha = alpha\n        ctx.save_for_backward(x)")),
    wrong("grad_reverse", "detaches grad_output (no double backward)",
          ("return -ctx.alpha * grad_output, None", "return -ctx.alpha * grad_output.detach(), None")),
    wrong("grad_reverse", "backward under @once_differentiable",
          ("    @staticmethod\n    def backward",
           "    @staticmethod\n    @torch.autograd.function.once_differentiable\n    def backward")),
    # TanhFixedPoint
    wrong("fixed_point", "one step of the adjoint only: s * grad_output", (
        ("for _ in range(500):  # the adjoint system w = s * (g + w W), by iteration\n"
        "            w_next = s * (grad_output + w @ W)\n"
        "            change = (w_next - w).abs().max()\n"
        "            w = w_next\n"
        "            if change <= 1e-12:\n"
        "                break\n        "), "",
    )),
    wrong("fixed_point", "adjoint with W.T instead of W",
          ("w_next = s * (grad_output + w @ W)", "w_next = s * (grad_output + w @ W.T)")),
    wrong("fixed_point", "gradient of W transposed",
          ("grad_W = w.reshape(-1, n).T @ z.reshape(-1, n)", "grad_W = z.reshape(-1, n).T @ w.reshape(-1, n)")),
    wrong("fixed_point", "s = 1 - tanh(z)² (z is already the tanh)", ("s = 1 - z * z", "s = 1 - torch.tanh(z) ** 2")),
    wrong("fixed_point", "forward stops after 10 iterations",
          ("for _ in range(500):\n            z_next", "for _ in range(10):\n            z_next"),
          ("            if change <= 1e-12:\n                break\n        ctx.save_for_backward(z, W)",
           "        ctx.save_for_backward(z, W)")),
    wrong("fixed_point", "forward tolerance 1e-6",
          ("            if change <= 1e-12:\n                break\n        ctx",
           "            if change <= 1e-6:\n                break\n        ctx")),
    wrong("fixed_point", "w.T @ z: wrong for a 1-d x",
          ("grad_W = w.reshape(-1, n).T @ z.reshape(-1, n)", "grad_W = w.T @ z")),
    wrong("fixed_point", "saves x as well", ("ctx.save_for_backward(z, W)", "ctx.save_for_backward(z, W, x)"),
          ("z, W = ctx.saved_tensors", "z, W, _ = ctx.saved_tensors")),
    # The adjoint computed where autograd cannot follow it: right gradients, no double backward.
    wrong("fixed_point", "the adjoint iterated under torch.no_grad()", (
        "        w = s * grad_output\n        for _ in range(500):",
        "        w = s * grad_output\n        with torch.no_grad():\n          for _ in range(500):",
    )),
    wrong("fixed_point", "each adjoint iterate detached",
          ("            w = w_next\n", "            w = w_next.detach()\n")),
    wrong("fixed_point", "backward under @once_differentiable",
          ("    @staticmethod\n    def backward",
           "    @staticmethod\n    @torch.autograd.function.once_differentiable\n    def backward")),
    wrong("fixed_point", "the adjoint solved with NumPy", (
        ("w = s * grad_output\n        for _ in range(500):  # the adjoint system w = s * (g + w W), by iteration\n"
        "            w_next = s * (grad_output + w @ W)\n"
        "            change = (w_next - w).abs().max()\n"
        "            w = w_next\n"
        "            if change <= 1e-12:\n"
        "                break\n"
        "        n = W.shape[0]\n"),
        ("n = W.shape[0]\n"
        "        ss, gs = s.detach().reshape(-1, n).numpy(), grad_output.detach().reshape(-1, n).numpy()\n"
        "        a = np.eye(n) - ss[:, :, None] * W.detach().numpy().T[None]  # (I - diag(s) Wᵀ) w = s g, per sample\n"
        "        w = torch.from_numpy(np.linalg.solve(a, (ss * gs)[:, :, None])[:, :, 0])"
        ".reshape(grad_output.shape)\n"),
    )),
    wrong("fixed_point", "backward differentiates the unrolled iteration with autograd", source='''
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
        ctx.save_for_backward(x, W)
        return z

    @staticmethod
    def backward(ctx, grad_output):
        x, W = ctx.saved_tensors
        with torch.enable_grad():
            x_, W_ = x.detach().requires_grad_(), W.detach().requires_grad_()
            z = torch.zeros_like(x_)
            for _ in range(100):
                z = torch.tanh(z @ W_.T + x_)
            return torch.autograd.grad(z, (x_, W_), grad_output)
''', flag="asks autograd for the gradient inside backward"),
    # SwishClassifier
    wrong("swish_classifier", "β a plain tensor, not a Parameter",
          ("self.beta = torch.nn.Parameter(torch.ones(hidden))", "self.beta = torch.ones(hidden)")),
    wrong("swish_classifier", "one β for the layer",
          ("torch.nn.Parameter(torch.ones(hidden))", "torch.nn.Parameter(torch.ones(()))")),
    wrong("swish_classifier", "loss summed over the batch",
          ("logits.gather(1, y[:, None]).squeeze(1)).mean()", "logits.gather(1, y[:, None]).squeeze(1)).sum()")),
    wrong("swish_classifier", "ReLU instead of Swish",
          ("return self.out(Swish.apply(self.hidden(x), self.beta))", "return self.out(torch.relu(self.hidden(x)))")),
    wrong("swish_classifier", "β detached",
          ("Swish.apply(self.hidden(x), self.beta)", "Swish.apply(self.hidden(x), self.beta.detach())")),
    wrong("swish_classifier", "torch.logsumexp instead of LogSumExp",
          ("LogSumExp.apply(logits, 1)", "torch.logsumexp(logits, 1)")),
    wrong("swish_classifier", "forgets the logit of the right class",
          ("return (LogSumExp.apply(logits, 1) - logits.gather(1, y[:, None]).squeeze(1)).mean()",
           "return LogSumExp.apply(logits, 1).mean()")),
    wrong("swish_classifier", "Swish's result discarded: the model is linear",
          ("return self.out(Swish.apply(self.hidden(x), self.beta))",
           "h = self.hidden(x)\n        Swish.apply(h, self.beta)\n        return self.out(h)")),
    wrong("swish_classifier", "the right class's logit detached: right value, wrong gradient",
          ("logits.gather(1, y[:, None])", "logits.detach().gather(1, y[:, None])")),
    # Claims only these refute (test_every_claim_a_check_prints_is_refuted_by_a_known_wrong_answer)
    wrong("swish", "β's gradient summed per channel through .view(N, C, -1): fails on an x not contiguous in memory", (
        "grad_beta = (grad_output * x * x * s * (1 - s)).sum_to_size(beta.shape)",
        ("grad_beta = (x * x * s * (1 - s) * grad_output).view(x.shape[0], beta.numel(), -1)"
         ".sum((0, 2)).view(beta.shape)"),
    )),
]

VARIANTS = [
    right("swish", "explicit unbroadcast loop, saves (beta, x), σ' as s - s², no needs_input_grad", source='''
class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta):
        ctx.save_for_backward(beta, x)
        return x * torch.special.expit(beta * x)

    @staticmethod
    def backward(ctx, grad_output):
        beta, x = ctx.saved_tensors
        s = torch.sigmoid(beta * x)
        ds = s - s * s
        grad_beta = grad_output * x * x * ds
        while grad_beta.dim() > beta.dim():
            grad_beta = grad_beta.sum(0)
        for i, size in enumerate(beta.shape):
            if size == 1:
                grad_beta = grad_beta.sum(i, keepdim=True)
        return grad_output * (s + beta * x * ds), grad_beta
'''),
    right("logsumexp", "max without keepdim, negative dim normalised, softmax recomputed with torch.softmax", source='''
class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        dim = dim % x.dim() if x.dim() else 0
        m = x.max(dim).values
        out = m + torch.log(torch.sum(torch.exp(x - m.unsqueeze(dim)), dim))
        ctx.dim = dim
        ctx.save_for_backward(out, x)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        out, x = ctx.saved_tensors
        return torch.softmax(x, ctx.dim) * grad_output.unsqueeze(ctx.dim), None
'''),
    right("grad_reverse", "x.clone(), neg() * alpha", source='''
class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = float(alpha)
        return x.clone()

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.neg() * ctx.alpha, None
'''),
    right("fixed_point", "while loop from tanh(x); adjoint with torch.linalg.solve", source='''
class TanhFixedPoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, W):
        z = torch.tanh(x)
        for _ in range(1000):
            z, previous = torch.tanh(z @ W.T + x), z
            if torch.allclose(z, previous, rtol=0, atol=1e-13):
                break
        ctx.save_for_backward(z, W)
        return z

    @staticmethod
    def backward(ctx, grad_output):
        z, W = ctx.saved_tensors
        n = W.shape[0]
        zs, gs = z.reshape(-1, n), grad_output.reshape(-1, n)
        s = 1 - zs**2
        eye = torch.eye(n, dtype=z.dtype, device=z.device)
        # (I - diag(s) W^T) w = s * g, one system per sample
        m = eye - s[:, :, None] * W.T[None]
        w = torch.linalg.solve(m, (s * gs)[:, :, None])[:, :, 0]
        return w.reshape(grad_output.shape), w.T @ zs
'''),
    right("fixed_point", "stopping tests on Python numbers (.item())", (
        "            change = (z_next - z).abs().max()\n", "            change = (z_next - z).abs().max().item()\n",
    ), ("change = (w_next - w).abs().max()", "change = (w_next - w).abs().max().item()")),
    right("swish_classifier", "one-hot instead of gather, LogSumExp over dim -1, β via torch.full, calls forward",
          source='''
class SwishClassifier(torch.nn.Module):
    def __init__(self, n_in, hidden, classes):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(n_in, hidden), torch.nn.Linear(hidden, classes)])
        self.register_parameter("beta", torch.nn.Parameter(torch.full((hidden,), 1.0)))

    def forward(self, x):
        first, second = self.layers
        return second(Swish.apply(first(x), self.beta))

    def loss(self, x, y):
        logits = self.forward(x)
        picked = (logits * torch.nn.functional.one_hot(y, logits.shape[-1])).sum(-1)
        return torch.mean(LogSumExp.apply(logits, -1) - picked)
'''),
]
