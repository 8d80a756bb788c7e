"""05_gradcheck: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

CENTRAL = "J[i][j][r] = ((p - m) / (2 * eps)).reshape(-1)"
COPIES = "inputs = [x.detach().clone(memory_format=torch.contiguous_format) for x in inputs]"
JACOBIAN_ALLOCATION = "torch.zeros(x.numel(), n, dtype=torch.float64, device=x.device)"
RAISE = "raise JacobianMismatch(i, j, row, col, n[row, col].item(), a[row, col].item())"
SOFTMAX_FIX = "return y * (grad_output - (grad_output * y).sum(-1, keepdim=True))"
SINCOS_FIX = "return grad_sin * x.cos() - grad_cos * x.sin()"
LERP_FIX = "return grad_output * (1 - weight), grad_output * weight, grad_output * (end - start)"

MUTANTS = [
    # 5.1 numerical_jacobian
    wrong("numerical_jacobian", "forward difference instead of central",
          ("flat[r] = original - eps\n            minus = as_tuple(f(*inputs))\n            flat[r] = original\n",
           "flat[r] = original\n            minus = as_tuple(f(*inputs))\n"),
          (CENTRAL, "J[i][j][r] = ((p - m) / eps).reshape(-1)")),
    wrong("numerical_jacobian", "wrong eps scaling: divides by eps",
          (CENTRAL, "J[i][j][r] = ((p - m) / eps).reshape(-1)")),
    wrong("numerical_jacobian", "perturbs by eps / 2",
          ("flat[r] = original + eps", "flat[r] = original + eps / 2"),
          ("flat[r] = original - eps", "flat[r] = original - eps / 2")),
    wrong("numerical_jacobian", "Jacobian transposed (outputs along the rows)",
          (JACOBIAN_ALLOCATION, "torch.zeros(n, x.numel(), dtype=torch.float64, device=x.device)"),
          ("J[i][j][r] = ", "J[i][j][:, r] = ")),
    wrong("numerical_jacobian", "Jacobian in float32",
          (JACOBIAN_ALLOCATION, "torch.zeros(x.numel(), n, device=x.device)")),
    wrong("numerical_jacobian", "evaluates f in float32",
          (COPIES, "inputs = [x.detach().float() for x in inputs]")),
    wrong("numerical_jacobian", "ignores eps",
          ("flat[r] = original + eps", "flat[r] = original + 1e-6"),
          ("flat[r] = original - eps", "flat[r] = original - 1e-6"),
          (CENTRAL, "J[i][j][r] = ((p - m) / 2e-6).reshape(-1)")),
    wrong("numerical_jacobian", "forgets to put the entry back",
          ("minus = as_tuple(f(*inputs))\n            flat[r] = original\n", "minus = as_tuple(f(*inputs))\n")),
    wrong("numerical_jacobian", "perturbs the caller's tensors",
          (COPIES, "inputs = [x.detach().contiguous() for x in inputs]"),
          ("minus = as_tuple(f(*inputs))\n            flat[r] = original\n", "minus = as_tuple(f(*inputs))\n")),
    wrong("numerical_jacobian", "copies keep a transposed input's layout: its flat view fails",
          (COPIES, "inputs = [x.detach().clone() for x in inputs]")),
    wrong("numerical_jacobian", "flattens with reshape, a copy for a transposed input: its rows stay zero",
          (COPIES, "inputs = [x.detach().clone() for x in inputs]"),
          ("flat = x.view(-1)", "flat = x.reshape(-1)")),
    wrong("numerical_jacobian", "loops over len(x): only the first dim, and fails on a 0-d input",
          ("for r in range(flat.numel()):", "for r in range(len(x)):")),
    wrong("numerical_jacobian", "uses autograd instead of finite differences", source='''
def as_tuple(result):
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def numerical_jacobian(f, inputs, eps=1e-6):
    inputs = tuple(x.detach() for x in inputs)
    outputs = as_tuple(f(*inputs))
    full = torch.autograd.functional.jacobian(lambda *xs: as_tuple(f(*xs)), inputs)
    return [[full[i][j].reshape(out.numel(), -1).T for j in range(len(inputs))] for i, out in enumerate(outputs)]
'''),
    # 5.2 analytical_jacobian and mini_gradcheck
    wrong("mini_gradcheck", "does not report the offending entry",
          (RAISE, 'raise AssertionError(f"Jacobian mismatch for output {i} with respect to input {j}")')),
    wrong("mini_gradcheck", "reports row and column swapped",
          (RAISE, "raise JacobianMismatch(i, j, col, row, n[row, col].item(), a[row, col].item())")),
    wrong("mini_gradcheck", "returns False instead of raising", (RAISE, "return False")),
    wrong("mini_gradcheck", "ignores rtol",
          ("excess = (a - n).abs() - (atol + rtol * n.abs())", "excess = (a - n).abs() - atol")),
    wrong("mini_gradcheck", "runs in float32 (accepts float32 inputs)",
          ('raise TypeError(f"input {j} is {x.dtype}: finite differences need float64")', "pass")),
    wrong("mini_gradcheck", "finite differences in float32", ("numerical = numerical_jacobian(f, inputs, eps)",
                                                              "numerical = numerical_jacobian(f, [x.float() for x "
                                                              "in inputs], eps)")),
    wrong("mini_gradcheck", "ignores the atol and rtol arguments",
          ("excess = (a - n).abs() - (atol + rtol * n.abs())", "excess = (a - n).abs() - (1e-5 + 1e-3 * n.abs())")),
    wrong("mini_gradcheck", "analytical Jacobian from finite differences",
          ("inputs = [x.detach().requires_grad_() for x in inputs]  # fresh leaves",
           "return numerical_jacobian(f, inputs)")),
    wrong("mini_gradcheck", "grad_output of ones instead of one-hot", ("one_hot[c] = 1", "one_hot[:] = 1")),
    wrong("mini_gradcheck", "analytical Jacobian in float32",
          ("torch.zeros(x.numel(), out.numel(), dtype=torch.float64, device=x.device)",
           "torch.zeros(x.numel(), out.numel(), device=x.device)")),
    wrong("mini_gradcheck", "does not pass eps on",
          ("numerical = numerical_jacobian(f, inputs, eps)", "numerical = numerical_jacobian(f, inputs)")),
    wrong("mini_gradcheck", "no allow_unused", ("retain_graph=True, allow_unused=True)", "retain_graph=True)")),
    wrong("mini_gradcheck", "one-hot grad_output created on the CPU (fails on a GPU)",
          ("one_hot = torch.zeros(out.numel(), dtype=out.dtype, device=out.device)",
           "one_hot = torch.zeros(out.numel(), dtype=out.dtype)")),
    wrong("mini_gradcheck", "analytical Jacobian transposed",
          ("torch.zeros(x.numel(), out.numel(), dtype=torch.float64, device=x.device)",
           "torch.zeros(out.numel(), x.numel(), dtype=torch.float64, device=x.device)"),
          ("J[i][j][:, c] = g.reshape(-1)", "J[i][j][c] = g.reshape(-1)")),
    # An error test that looks at one side of the error.
    wrong("mini_gradcheck", "names the entry with the largest signed difference a - n",
          ("row, col = divmod(int(excess.argmax()), n.shape[1])",
           "row, col = divmod(int((a - n).argmax()), n.shape[1])")),
    wrong("mini_gradcheck", "counts only an analytical value above the numerical one",
          ("excess = (a - n).abs() - (atol + rtol * n.abs())", "excess = (a - n) - (atol + rtol * n.abs())")),
    wrong("mini_gradcheck", "clamps the difference at zero",
          ("excess = (a - n).abs() - (atol + rtol * n.abs())",
           "excess = (a - n).clamp(min=0) - (atol + rtol * n.abs())")),
    wrong("mini_gradcheck", "counts only an analytical value below the numerical one",
          ("excess = (a - n).abs() - (atol + rtol * n.abs())", "excess = (n - a) - (atol + rtol * n.abs())")),
    # 5.3 diagnoses
    wrong("diagnoses", "float32 read as a small eps", ('"b": "float32"', '"b": "eps too small"')),
    wrong("diagnoses", "a missing term read as ignoring grad_output",
          ('"a": "missing term"', '"a": "ignores grad_output"')),
    wrong("diagnoses", "a tie read as a bug", ('"d": "non-differentiable input"', '"d": "missing term"')),
    # 5.4 the fixed Functions
    wrong("softmax", "fixed Function still has the bug", (SOFTMAX_FIX, "return grad_output * y * (1 - y)")),
    wrong("softmax", "sums over every dimension", (SOFTMAX_FIX, "return y * (grad_output - (grad_output * y).sum())")),
    wrong("softmax", "ignores grad_output", (SOFTMAX_FIX, "return y * (1 - y)")),
    wrong("softmax", "forgets the factor y",
          (SOFTMAX_FIX, "return grad_output - (grad_output * y).sum(-1, keepdim=True)")),
    wrong("softmax", "sums without keepdim", (SOFTMAX_FIX, "return y * (grad_output - (grad_output * y).sum(-1))")),
    wrong("softmax", "Jacobian matrix, then .squeeze(): drops a batch of one",
          (SOFTMAX_FIX, "J = torch.diag_embed(y) - y.unsqueeze(-1) * y.unsqueeze(-2)\n"
                        "        return (J @ grad_output.unsqueeze(-1)).squeeze()")),
    wrong("sincos", "fixed Function still has the bug", (SINCOS_FIX, "return grad_sin * x.cos()")),
    wrong("sincos", "sign of the cosine's derivative", (SINCOS_FIX, "return grad_sin * x.cos() + grad_cos * x.sin()")),
    wrong("sincos", "ignores grad_output", (SINCOS_FIX, "return x.cos() - x.sin()")),
    wrong("lerp", "fixed Function still has the bug",
          (LERP_FIX, "return grad_output * weight, grad_output * (1 - weight), grad_output * (end - start)")),
    wrong("lerp", "sign of the weight gradient",
          (LERP_FIX, "return grad_output * (1 - weight), grad_output * weight, grad_output * (start - end)")),
    wrong("lerp", "ignores grad_output", (LERP_FIX, "return 1 - weight, weight, end - start")),
    # 5.5 max_gradient_error
    wrong("max_gradient_error", "forward difference",
          ("numerical = (f(x + eps) - f(x - eps)) / (2 * eps)", "numerical = (f(x + eps) - f(x)) / eps")),
    wrong("max_gradient_error", "wrong eps scaling", ("numerical = (f(x + eps) - f(x - eps)) / (2 * eps)",
                                                      "numerical = (f(x + eps) - f(x - eps)) / eps")),
    wrong("max_gradient_error", "mean error instead of the largest",
          ("return error[k].item(),", "return error.mean().item(),")),
    wrong("max_gradient_error", "signed difference", ("error = (analytical - numerical).abs().reshape(-1)",
                                                      "error = (analytical - numerical).reshape(-1)")),
    wrong("max_gradient_error", "relative error", ("error = (analytical - numerical).abs().reshape(-1)",
                                                   "error = ((analytical - numerical) / numerical).abs().reshape(-1)")),
    wrong("max_gradient_error", "measures in float32", ("    x = x.detach()\n", "    x = x.detach().float()\n")),
    wrong("max_gradient_error", "returns the index, not the value of x", ("x.detach().reshape(-1)[k].item()", "k")),
]

VARIANTS = [
    right("numerical_jacobian", "contiguous() copies, unravel_index instead of a flat view",
          (COPIES, "inputs = [x.detach().contiguous().clone() for x in inputs]"),
          ("        flat = x.view(-1)  # shares memory with x: writing flat[r] changes the input f sees\n"
           "        for r in range(flat.numel()):\n            original = flat[r].item()\n"
           "            flat[r] = original + eps\n            plus = as_tuple(f(*inputs))\n"
           "            flat[r] = original - eps\n            minus = as_tuple(f(*inputs))\n"
           "            flat[r] = original\n",
           "        for r in range(x.numel()):\n"
           "            at = tuple(int(k) for k in torch.unravel_index(torch.tensor(r), x.shape))\n"
           "            original = x[at].item()\n            x[at] = original + eps\n"
           "            plus = as_tuple(f(*inputs))\n            x[at] = original - eps\n"
           "            minus = as_tuple(f(*inputs))\n            x[at] = original\n")),
    right("numerical_jacobian", "perturbed copies instead of in-place writes, rows stacked", source='''
def as_tuple(result):
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def numerical_jacobian(f, inputs, eps=1e-6):
    inputs = tuple(x.detach() for x in inputs)
    per_input = []
    for j, x in enumerate(inputs):
        rows = []
        for r in range(x.numel()):
            step = torch.zeros(x.numel(), dtype=x.dtype, device=x.device)
            step[r] = eps
            step = step.view_as(x)
            plus = as_tuple(f(*inputs[:j], x + step, *inputs[j + 1:]))
            minus = as_tuple(f(*inputs[:j], x - step, *inputs[j + 1:]))
            rows.append([((p - m) / (2 * eps)).reshape(-1) for p, m in zip(plus, minus)])
        per_input.append([torch.stack([row[i] for row in rows]) for i in range(len(rows[0]))])
    return [[per_input[j][i] for j in range(len(inputs))] for i in range(len(per_input[0]))]
'''),
    right("mini_gradcheck", "functional.jacobian, torch.isclose, first offending entry, keyword arguments", source='''
def analytical_jacobian(f, inputs):
    inputs = tuple(x.detach() for x in inputs)
    outputs = as_tuple(f(*inputs))
    full = torch.autograd.functional.jacobian(lambda *xs: as_tuple(f(*xs)), inputs)  # backward, row by row
    return [[full[i][j].reshape(out.numel(), -1).T for j in range(len(inputs))] for i, out in enumerate(outputs)]


def mini_gradcheck(f, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3):
    if any(x.dtype is not torch.float64 for x in inputs):
        raise TypeError("float64 inputs only")
    pairs = zip(numerical_jacobian(f, inputs, eps=eps), analytical_jacobian(f, inputs))
    for i, (n_row, a_row) in enumerate(pairs):
        for j, (n, a) in enumerate(zip(n_row, a_row)):
            ok = torch.isclose(a, n, rtol=rtol, atol=atol)
            if not ok.all():
                row, col = (~ok).nonzero()[0].tolist()
                raise JacobianMismatch(output=i, input=j, row=row, col=col,
                                       numerical=float(n[row, col]), analytical=float(a[row, col]))
    return True
'''),
    right("diagnoses", "capitals and spaces", source='''
diagnoses = {"a": "Missing term", "b": " float32", "c": "IGNORES grad_output", "d": "non-differentiable  input",
             "e": "Transposed ", "f": "eps too small", "g": "Non-differentiable input"}
'''),
    right("softmax", "grad_output * y computed once",
          (SOFTMAX_FIX, "gy = grad_output * y\n        return gy - y * gy.sum(-1, keepdim=True)")),
    right("softmax", "Jacobian matrix, squeezing only the added dim",
          (SOFTMAX_FIX, "J = torch.diag_embed(y) - y.unsqueeze(-1) * y.unsqueeze(-2)\n"
                        "        return (J @ grad_output.unsqueeze(-1)).squeeze(-1)")),
    right("sincos", "addcmul", (SINCOS_FIX, "return torch.addcmul(grad_sin * x.cos(), grad_cos, x.sin(), value=-1)")),
    right("lerp", "lerp towards zero",
          (LERP_FIX, "return (torch.lerp(grad_output, torch.zeros_like(grad_output), weight), "
                                                  "weight * grad_output, (end - start).mul(grad_output))")),
    right("max_gradient_error", "divides by the distance actually stepped", source='''
def max_gradient_error(f, x, eps=1e-6):
    x = x.detach()
    above, below = x + eps, x - eps
    numerical = (f(above) - f(below)) / (above - below)
    leaf = x.clone().requires_grad_()
    analytical = torch.autograd.grad(f(leaf).sum(), leaf)[0]
    error = (analytical - numerical).abs()
    worst = error.flatten().argmax()
    return float(error.flatten()[worst]), float(x.flatten()[worst])
'''),
]
