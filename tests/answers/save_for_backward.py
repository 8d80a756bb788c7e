"""06_save_for_backward: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

MUTANTS = [
    wrong("sigmoid", "takes the sigmoid in float64 (a float32 input gives a float64 output)",
          ("y = torch.sigmoid(x)", "y = torch.sigmoid(x.double())")),
    # saved_by
    wrong("saved_by", "compares data_ptr(), where a view starts, not the storage",
          ("return t.untyped_storage().data_ptr()", "return t.data_ptr()")),
    wrong("saved_by", "compares Python objects",
          ("if any(memory(t) == memory(o) for o in outputs):", "if any(t is o for o in outputs):"),
          ("elif any(isinstance(a, torch.Tensor) and memory(t) == memory(a) for a in args):",
           "elif any(t is a for a in args):")),
    wrong("saved_by", "counts elements, not bytes",
          ("t.numel() * t.element_size()", "t.numel()")),
    wrong("saved_by", "calls the Function outside the hooks",
          ("    with saved_tensors_hooks(pack, lambda t: t):\n        result = fn.apply(*args)\n",
           "    result = fn.apply(*args)\n")),
    wrong("saved_by", "checks the inputs before the outputs",
          ("        if any(memory(t) == memory(o) for o in outputs):\n            kind = \"output\"\n"
           "        elif any(isinstance(a, torch.Tensor) and memory(t) == memory(a) for a in args):\n"
           "            kind = \"input\"\n",
           "        if any(isinstance(a, torch.Tensor) and memory(t) == memory(a) for a in args):\n"
           "            kind = \"input\"\n        elif any(memory(t) == memory(o) for o in outputs):\n"
           "            kind = \"output\"\n")),
    # kept_alive
    wrong("saved_by", "kept_alive counts what a view shows, not the storage it keeps alive",
          ("blocks[storage.data_ptr()] = storage.nbytes()",
           "blocks[storage.data_ptr()] = t.numel() * t.element_size()")),
    wrong("saved_by", "kept_alive counts a storage saved twice twice",
          ("blocks = {}  # storage address -> its size: each storage once", "blocks = []"),
          ("blocks[storage.data_ptr()] = storage.nbytes()", "blocks.append(storage.nbytes())"),
          ("return sum(blocks.values())", "return sum(blocks)")),
    wrong("saved_by", "kept_alive counts the inputs' and outputs' memory too",
          ("        if storage.data_ptr() not in theirs:\n            blocks", "        if True:\n            blocks")),
    wrong("saved_by", "kept_alive tells memory apart by data_ptr(), where a view starts",
          ("theirs = {t.untyped_storage().data_ptr() for t in", "theirs = {t.data_ptr() for t in"),
          ("        if storage.data_ptr() not in theirs:", "        if t.data_ptr() not in theirs:")),
    wrong("saved_by", "kept_alive counts elements, not bytes",
          ("blocks[storage.data_ptr()] = storage.nbytes()",
           "blocks[storage.data_ptr()] = storage.nbytes() // t.element_size()")),
    # Sigmoid
    wrong("sigmoid", "saves the intermediate exp(-x) (passes gradcheck)", source='''
class Sigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        e = torch.exp(-x)
        ctx.save_for_backward(e)
        return 1 / (1 + e)

    @staticmethod
    def backward(ctx, grad_output):
        (e,) = ctx.saved_tensors
        return grad_output * e / (1 + e) ** 2
'''),
    wrong("sigmoid", "stashes the output on ctx",
          ("ctx.save_for_backward(y)", "ctx.y = y"), ("(y,) = ctx.saved_tensors", "y = ctx.y")),
    wrong("sigmoid", "saves the input and recomputes sigmoid",
          ("ctx.save_for_backward(y)", "ctx.save_for_backward(x)"),
          ("(y,) = ctx.saved_tensors", "(x,) = ctx.saved_tensors\n        y = torch.sigmoid(x)")),
    wrong("sigmoid", "saves the input and the output",
          ("ctx.save_for_backward(y)", "ctx.save_for_backward(x, y)"),
          ("(y,) = ctx.saved_tensors", "_, y = ctx.saved_tensors")),
    wrong("sigmoid", "ignores grad_output",
          ("return grad_output * y * (1 - y)", "return y * (1 - y)")),
    wrong("sigmoid", "multiplies grad_output in place",
          ("return grad_output * y * (1 - y)", "return grad_output.mul_(y * (1 - y))")),
    wrong("sigmoid", "saves the output detached (breaks double backward)",
          ("ctx.save_for_backward(y)", "ctx.save_for_backward(y.detach())")),
    wrong("sigmoid", "exp(x) / (1 + exp(x)): inf / inf = nan for large x",
          ("y = torch.sigmoid(x)", "e = torch.exp(x)\n        y = e / (1 + e)")),
    # Tanh_
    wrong("tanh_inplace", "forgets mark_dirty", ("        ctx.mark_dirty(x)\n", "")),
    wrong("tanh_inplace", "saves a copy of the input (passes gradcheck)", source='''
class Tanh_(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x.clone())  # the input, before it is overwritten
        x.tanh_()
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * (1 - torch.tanh(x) ** 2)
'''),
    wrong("tanh_inplace", "takes the saved tensor for the input",
          ("return grad_output * (1 - y * y)", "return grad_output * (1 - torch.tanh(y) ** 2)")),
    wrong("tanh_inplace", "computes out of place",
          ("x.tanh_()\n        ctx.mark_dirty(x)\n        ctx.save_for_backward(x)  # x now holds the output\n"
           "        return x",
           "y = torch.tanh(x)\n        ctx.save_for_backward(y)\n        return y")),
    wrong("tanh_inplace", "modifies the saved tensor in backward",
          ("return grad_output * (1 - y * y)", "return grad_output * (1 - y.pow_(2))")),
    wrong("tanh_inplace", "(exp(2x) - 1) / (exp(2x) + 1) in place: nan for large x",
          ("x.tanh_()\n", "e = torch.exp(2 * x)\n        x.copy_((e - 1) / (e + 1))\n")),
    wrong("tanh_inplace", "multiplies grad_output in place",
          ("return grad_output * (1 - y * y)", "return grad_output.mul_(1 - y * y)")),
    wrong("tanh_inplace", "stashes the output on ctx",
          ("ctx.save_for_backward(x)  # x now holds the output", "ctx.y = x"),
          ("(y,) = ctx.saved_tensors", "y = ctx.y")),
    # Sort
    wrong("sort", "gathers instead of scattering",
          ("grad_x = torch.zeros_like(grad_values).scatter(ctx.dim, indices, grad_values)",
           "grad_x = grad_values.gather(ctx.dim, indices)")),
    wrong("sort", "no None for dim (wrong number of gradients)", ("return grad_x, None", "return grad_x")),
    wrong("sort", "backward takes one gradient for two outputs",
          ("def backward(ctx, grad_values, grad_indices):", "def backward(ctx, grad_values):")),
    wrong("sort", "saves the input and sorts again",
          ("ctx.save_for_backward(indices)", "ctx.save_for_backward(x)"),
          ("(indices,) = ctx.saved_tensors",
           "(x,) = ctx.saved_tensors\n        indices = torch.sort(x, ctx.dim).indices")),
    wrong("sort", "stashes the indices on ctx",
          ("ctx.save_for_backward(indices)", "ctx.indices = indices"),
          ("(indices,) = ctx.saved_tensors", "indices = ctx.indices")),
    wrong("sort", "marks the values non-differentiable",
          ("ctx.mark_non_differentiable(indices)", "ctx.mark_non_differentiable(values)")),
    wrong("sort", "ignores grad_values",
          ("scatter(ctx.dim, indices, grad_values)", "scatter(ctx.dim, indices, torch.ones_like(grad_values))")),
    wrong("sort", "returns the indices as floats", ("return values, indices", "return values, indices.to(x.dtype)")),
    wrong("sort", "scatters along the last dim, not along ctx.dim",
          ("scatter(ctx.dim, indices, grad_values)", "scatter(-1, indices, grad_values)")),
    wrong("sort", "scatters along dim 0, not along ctx.dim",
          ("scatter(ctx.dim, indices, grad_values)", "scatter(0, indices, grad_values)")),
    wrong("sort", "allocates the gradient on the CPU",
          ("torch.zeros_like(grad_values)", "torch.zeros(grad_values.shape, dtype=grad_values.dtype)")),
    # What happens
    wrong("what_happens", "thinks ctx attributes are version-checked", ('"b": "silently wrong"', '"b": "error"')),
    wrong("what_happens", "thinks .data is version-checked", ('"d": "silently wrong"', '"d": "error"')),
    wrong("what_happens", "thinks mark_dirty is optional", ('"g": "silently wrong"', '"g": "correct"')),
    wrong("what_happens", "thinks a None gradient counts as zero", ('"i": "error"', '"i": "correct"')),
    # A tensor kept outside ctx, besides what is saved: seen by neither the hooks nor ctx, alive after backward
    wrong("sigmoid", "saves y, and appends it to a global list of activations (to plot them later)",
          ("class Sigmoid(torch.autograd.Function):",
           "ACTIVATIONS = []  # every output, to plot them later\n\n\nclass Sigmoid(torch.autograd.Function):"),
          ("        ctx.save_for_backward(y)\n", "        ctx.save_for_backward(y)\n        ACTIVATIONS.append(y)\n")),
    wrong("sigmoid", "saves y, and keeps the last input in a class attribute (to inspect it)",
          ("        ctx.save_for_backward(y)\n", "        ctx.save_for_backward(y)\n        Sigmoid.last_input = x\n")),
    wrong("sort", "saves the indices, and keeps them in a default argument too (the last call's, for reuse)",
          ("def forward(ctx, x, dim):", "def forward(ctx, x, dim, _last={}):"),
          ("        ctx.save_for_backward(indices)\n",
           "        ctx.save_for_backward(indices)\n        _last[\"indices\"] = indices\n")),
    wrong("tanh_inplace", "keeps a copy of every input in a list of an enclosing function (a closure)", source='''
def _tanh_with_history():
    history = []  # the inputs before they are overwritten, to look at later

    class Tanh_(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            history.append(x.detach().clone())
            x.tanh_()
            ctx.mark_dirty(x)
            ctx.save_for_backward(x)
            return x

        @staticmethod
        def backward(ctx, grad_output):
            (y,) = ctx.saved_tensors
            return grad_output * (1 - y * y)

    return Tanh_


Tanh_ = _tanh_with_history()
'''),
]

VARIANTS = [
    right("saved_by", "sets of storages, t.nbytes, torch.Size shapes; kept_alive built on saved tensors' storages",
          source='''
def _saved(fn, args):
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
        out = fn.apply(*args)
    outs = [out] if torch.is_tensor(out) else list(out)
    return seen, outs


def storage(t):
    return t.untyped_storage().data_ptr()


def saved_by(fn, *args):
    seen, outs = _saved(fn, args)
    out_mem = {storage(o) for o in outs if torch.is_tensor(o)}
    in_mem = {storage(a) for a in args if torch.is_tensor(a)}
    kinds = lambda t: "output" if storage(t) in out_mem else "input" if storage(t) in in_mem else "intermediate"
    return [(kinds(t), t.shape, t.nbytes) for t in seen]


def kept_alive(fn, *args):
    seen, outs = _saved(fn, args)
    others = {storage(t) for t in [*outs, *args] if torch.is_tensor(t)}
    extra = {storage(t): t.untyped_storage() for t in seen if storage(t) not in others}
    return int(sum(s.size() for s in extra.values()))  # an untyped storage's size is in bytes
'''),
    right("sigmoid", "computes y in place on its own tensors, derivative y - y*y", source='''
class Sigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.neg().exp_().add_(1).reciprocal_()  # in place on a tensor forward created: fine
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return grad_output * (y - y * y)
'''),
    right("tanh_inplace", "torch.tanh(x, out=x), (1 - y)(1 + y)", source='''
class Tanh_(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        torch.tanh(x, out=x)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return grad_output * (1 - y) * (1 + y)
'''),
    right("sort", "argsort + gather, inverse permutation, set_materialize_grads(False)", source='''
class Sort(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.set_materialize_grads(False)
        indices = x.argsort(dim)
        values = x.gather(dim, indices)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        ctx.dim = dim
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, grad_indices):
        if grad_values is None:
            return None, None
        (indices,) = ctx.saved_tensors
        inverse = indices.argsort(ctx.dim)
        return grad_values.gather(ctx.dim, inverse), None
'''),
    right("what_happens", "capitals and spaces", source='''
what_happens = {"a": "Error", "b": "silently  wrong", "c": " correct", "d": "Silently Wrong", "e": "ERROR",
                "f": "error", "g": "silently wrong", "h": "Correct", "i": "error ", "j": "silently wrong"}
'''),
]
