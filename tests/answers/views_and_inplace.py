"""06_views_and_inplace: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

_SOFTMAX = '''
class Softmax_(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
{forward}

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return y * (grad_output - (grad_output * y).sum(dim=-1, keepdim=True))
'''

_STEP = '''
def train_step(params, x, target, mask, lr):
    w1, w2 = params
    h = torch.sigmoid(x @ w1)
{body}
    return loss.item()
'''

_GIVEN_STEP = _STEP.format(body='''    h.data.mul_(mask)
    out = h @ w2
    loss = ((out - target) ** 2).mean()
    w2.data.clamp_(-1.0, 1.0)
    loss.backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad
            p.grad = None''')

MUTANTS = [
    # Diagnose three version-counter errors: each misreading of what is saved, or of where a write lands
    wrong("diagnosis", "thinks x @ w_in saves w_in although x is data", ('"a_modified": "L5"', '"a_modified": "L4"')),
    wrong("diagnosis", "thinks the product with onehot saved p", ('"b_saved": "L2"', '"b_saved": "L4"')),
    wrong("diagnosis", "thinks softmax saves its input", ('"b_modified": "L6"', '"b_modified": "L5"')),
    wrong("diagnosis", "takes CopySlices for the in-place relu's saved output", ('"c_saved": "L3"', '"c_saved": "L2"')),
    wrong("diagnosis", "blames the write into the product's output", ('"c_modified": "L5"', '"c_modified": "L4"')),
    # Softmax_
    wrong("softmax_inplace", "forgets mark_dirty", ("        ctx.mark_dirty(x)\n", "")),
    wrong("softmax_inplace", "writes through .data, without mark_dirty", source=_SOFTMAX.format(forward='''\
        x.data.sub_(x.data.amax(dim=-1, keepdim=True))
        x.data.exp_()
        x.data.div_(x.data.sum(dim=-1, keepdim=True))
        ctx.save_for_backward(x)
        return x''')),
    wrong("softmax_inplace", "computes out of place and returns a new tensor", source=_SOFTMAX.format(forward='''\
        y = torch.softmax(x, dim=-1)
        ctx.save_for_backward(y)
        return y''')),
    wrong("softmax_inplace", "marks x dirty but returns a copy", ("        return x\n", "        return x.clone()\n")),
    wrong("softmax_inplace", "assigns x.data instead of writing into x", source=_SOFTMAX.format(forward='''\
        x.data = torch.softmax(x, dim=-1)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x''')),
    wrong("softmax_inplace", "computes in x.contiguous() (a copy for a column slice)",
          source=_SOFTMAX.format(forward='''\
        rows = x.contiguous()
        rows.sub_(rows.amax(dim=-1, keepdim=True)).exp_()
        rows.div_(rows.sum(dim=-1, keepdim=True))
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x''')),
    wrong("softmax_inplace", "flattens the leading dims with reshape (a copy for a permutation)",
          source=_SOFTMAX.format(forward='''\
        rows = x.reshape(-1, x.shape[-1])
        rows.sub_(rows.amax(dim=1, keepdim=True)).exp_()
        rows.div_(rows.sum(dim=1, keepdim=True))
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x''')),
    wrong("softmax_inplace", "softmax over dim 1, right for 2-d only",
          ("x.sub_(x.amax(dim=-1, keepdim=True))", "x.sub_(x.amax(dim=1, keepdim=True))"),
          ("x.div_(x.sum(dim=-1, keepdim=True))", "x.div_(x.sum(dim=1, keepdim=True))"),
          ("inner = (grad_output * y).sum(dim=-1, keepdim=True)",
           "inner = (grad_output * y).sum(dim=1, keepdim=True)")),
    wrong("softmax_inplace", "exponentiates without subtracting the maximum (nan for large x)",
          ("        x.sub_(x.amax(dim=-1, keepdim=True))\n", "")),
    wrong("softmax_inplace", "backward forgets the sum's term",
          ("return y * (grad_output - inner)", "return y * grad_output")),
    wrong("softmax_inplace", "backward's sum drops the dim (broadcasts along the wrong one)",
          ("inner = (grad_output * y).sum(dim=-1, keepdim=True)", "inner = (grad_output * y).sum(dim=-1)")),
    wrong("softmax_inplace", "saves a copy of the input and recomputes softmax", source='''
class Softmax_(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x.clone())
        x.copy_(torch.softmax(x, dim=-1))
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        y = torch.softmax(x, dim=-1)
        return y * (grad_output - (grad_output * y).sum(dim=-1, keepdim=True))
'''),
    wrong("softmax_inplace", "stashes the output on ctx",
          ("ctx.save_for_backward(x)  # x now holds the output", "ctx.y = x"),
          ("(y,) = ctx.saved_tensors", "y = ctx.y")),
    wrong("softmax_inplace", "backward writes into grad_output",
          ("return y * (grad_output - inner)", "return y * grad_output.sub_(inner)")),
    wrong("softmax_inplace", "backward writes into the saved output",
          ("return y * (grad_output - inner)", "return y.mul_(grad_output - inner)")),
    # train_step
    wrong("train_step", "the given step, both .data writes kept", source=_GIVEN_STEP),
    wrong("train_step", "fixes the dropout, keeps clamping w2 through .data before backward",
          source=_GIVEN_STEP.replace("    h.data.mul_(mask)\n", "    h = h * mask\n")),
    wrong("train_step", "moves the clamp after the update, keeps the dropout through .data",
          source=_GIVEN_STEP.replace("    w2.data.clamp_(-1.0, 1.0)\n", "").replace(
              "            p.grad = None", "            p.grad = None\n        w2.clamp_(-1.0, 1.0)")),
    wrong("train_step", "dropout in place through .detach() (the version error)",
          ("    dropped = h * mask  # a new tensor: sigmoid's saved output stays intact\n",
           "    h.detach().mul_(mask)\n    dropped = h\n")),
    wrong("train_step", "dropout in place on h (the version error)",
          ("dropped = h * mask  # a new tensor: sigmoid's saved output stays intact", "dropped = h.mul_(mask)")),
    wrong("train_step", "dropout in place under torch.no_grad()",
          ("    dropped = h * mask  # a new tensor: sigmoid's saved output stays intact\n",
           "    with torch.no_grad():\n        h.mul_(mask)\n    dropped = h\n")),
    wrong("train_step", "assigns h.data = h.data * mask (the mask never enters the graph)",
          ("    dropped = h * mask  # a new tensor: sigmoid's saved output stays intact\n",
           "    h.data = h.data * mask\n    dropped = h\n")),
    wrong("train_step", "detaches h for the dropout (w1 gets no gradient)",
          ("dropped = h * mask  # a new tensor: sigmoid's saved output stays intact", "dropped = h.detach() * mask")),
    wrong("train_step", "clamps out of place and drops the result",
          ("w2.clamp_(-1.0, 1.0)  # after the update: no backward reads w2 any more", "w2.clamp(-1.0, 1.0)")),
    wrong("train_step", "clamps w2 in the forward",
          ("out = dropped @ w2", "out = dropped @ w2.clamp(-1.0, 1.0)"),
          ("        w2.clamp_(-1.0, 1.0)  # after the update: no backward reads w2 any more\n", "")),
    wrong("train_step", "clamps w2 after backward but before the update",
          ("    loss.backward()\n    with torch.no_grad():\n",
           "    loss.backward()\n    with torch.no_grad():\n        w2.clamp_(-1.0, 1.0)\n"),
          ("        w2.clamp_(-1.0, 1.0)  # after the update: no backward reads w2 any more\n", "")),
    wrong("train_step", "never resets the gradients", ("            p.grad = None\n", "")),
    wrong("train_step", "updates the weights without torch.no_grad()",
          ("    with torch.no_grad():\n        for p in params:\n            p -= lr * p.grad\n"
           "            p.grad = None\n"
           "        w2.clamp_(-1.0, 1.0)  # after the update: no backward reads w2 any more\n",
           "    for p in params:\n        p -= lr * p.grad\n        p.grad = None\n"
           "    with torch.no_grad():\n        w2.clamp_(-1.0, 1.0)\n")),
    wrong("train_step", "rebinds the names instead of updating the tensors",
          source=_STEP.format(body='''    out = (h * mask) @ w2
    loss = ((out - target) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        w1 = w1 - lr * w1.grad
        w2 = (w2 - lr * w2.grad).clamp(-1.0, 1.0)
    for p in params:
        p.grad = None''')),
    # What happens?
    wrong("what_happens", "thinks an inference tensor may be saved", ('"a": "error"', '"a": "works"')),
    wrong("what_happens", "thinks no_grad writes escape the version counter",
          ('"d": "error"', '"d": "silently wrong"')),
    wrong("what_happens", "thinks autograd follows a write made under no_grad",
          ('"e": "silently wrong"', '"e": "works"')),
    wrong("what_happens", "thinks a pack hook keeps the version check", ('"g": "works"', '"g": "error"')),
    wrong("what_happens", "thinks .double() always copies", ('"h": "silently wrong"', '"h": "works"')),
    # Claims only these refute (test_every_claim_a_check_prints_is_refuted_by_a_known_wrong_answer)
    wrong("softmax_inplace", "x = x.contiguous() after the first in-place step (a copy for a column slice)",
          source=_SOFTMAX.format(forward='''\
        x.sub_(x.amax(dim=-1, keepdim=True))
        x = x.contiguous()  # exp and sum run faster on contiguous memory
        x.exp_()
        x.div_(x.sum(dim=-1, keepdim=True))
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x''')),
]

VARIANTS = [
    right("diagnosis", "lower case labels and spaces", source='''
diagnosis = {"a_saved": " l2", "a_modified": "L5 ", "b_saved": "l2", "b_modified": "L6", "c_saved": "L3",
             "c_modified": "l5"}
'''),
    right("softmax_inplace", "copies torch.softmax into x; writes nothing else", source=_SOFTMAX.format(forward='''\
        x.copy_(torch.softmax(x, dim=-1))
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x''')),
    right("softmax_inplace", "writes through x.detach(), out= and /=; backward with torch's own softmax backward",
          source='''
class Softmax_(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        alias = x.detach()  # shares x's memory and its version counter
        alias -= alias.max(dim=-1, keepdim=True).values
        torch.exp(alias, out=alias)
        alias /= alias.sum(dim=-1, keepdim=True)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return torch._softmax_backward_data(grad_output, y, -1, y.dtype)
'''),
    right("train_step", "clones h before an in-place dropout; torch.autograd.grad; .data in the update", source='''
def train_step(params, x, target, mask, lr):
    w1, w2 = params
    h = torch.sigmoid(x @ w1).clone()  # the clone is the dropout's own tensor
    h.mul_(mask)
    loss = ((h @ w2 - target) ** 2).mean()
    grads = torch.autograd.grad(loss, params)
    for p, g in zip(params, grads):
        p.data -= lr * g  # after backward: nothing saved p any more
    w2.data.clamp_(-1.0, 1.0)
    return loss
'''),
    right("train_step", "torch.where for the dropout, zero_grad, clamp_ with min and max", source='''
def train_step(params, x, target, mask, lr):
    w1, w2 = params
    h = torch.sigmoid(x @ w1)
    out = torch.where(mask > 0, h * mask, torch.zeros_like(h)) @ w2
    loss = torch.nn.functional.mse_loss(out, target)
    loss.backward()
    with torch.no_grad():
        for p in params:
            p.sub_(lr * p.grad)
            p.grad.zero_()
        w2.clamp_(min=-1.0, max=1.0)
    return float(loss.detach())
'''),
    right("what_happens", "capitals and spaces", source='''
what_happens = {"a": "Error", "b": " works", "c": "WORKS", "d": "error ", "e": "Silently  Wrong", "f": "error",
                "g": "works", "h": "silently wrong"}
'''),
]
