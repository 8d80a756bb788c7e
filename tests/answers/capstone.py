"""11_capstone: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

EX = "fused_cross_entropy"

_WRAPPER = '''

def fused_cross_entropy(logits, target, weight=None, reduction="mean", ignore_index=-100):
    return SoftmaxCrossEntropy.apply(logits, target, weight, reduction, ignore_index)
'''

_HEAD = '''
class SoftmaxCrossEntropy(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(logits, target, weight, reduction, ignore_index):
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        lse = torch.logsumexp(logits, -1)
        picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        losses = torch.where(valid, lse - picked, 0) * row_weight
        if reduction == "none":
            return losses
        if reduction == "sum":
            return losses.sum()
        return losses.sum() / row_weight.sum().clamp_min(torch.finfo(row_weight.dtype).tiny)
'''

# The log-probabilities as a second output: saved as an output, so double backward is right;
# but an N x C tensor is kept for backward, which the wrapper never returns.
_LOGP_OUTPUT = '''
class SoftmaxCrossEntropy(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(logits, target, weight, reduction, ignore_index):
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        logp = torch.log_softmax(logits, -1)
        picked = logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        losses = torch.where(valid, -picked, 0) * row_weight
        if reduction == "sum":
            losses = losses.sum()
        elif reduction == "mean":
            losses = losses.sum() / row_weight.sum().clamp_min(torch.finfo(row_weight.dtype).tiny)
        return losses, logp

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, target, weight, reduction, ignore_index = inputs
        ctx.save_for_backward(output[1], target, weight)
        ctx.reduction, ctx.ignore_index = reduction, ignore_index

    @staticmethod
    def backward(ctx, grad_output, grad_logp):
        logp, target, weight = ctx.saved_tensors
        valid = target != ctx.ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logp.dtype) if weight is None else weight.take(safe) * valid
        scale = grad_output * row_weight
        if ctx.reduction == "mean":
            scale = scale / row_weight.sum().clamp_min(torch.finfo(row_weight.dtype).tiny)
        p = torch.exp(logp)
        grad = p * scale.unsqueeze(-1)
        grad = grad.scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))
        grad = grad + grad_logp - p * grad_logp.sum(-1, keepdim=True)
        return grad, None, None, None, None


def fused_cross_entropy(logits, target, weight=None, reduction="mean", ignore_index=-100):
    return SoftmaxCrossEntropy.apply(logits, target, weight, reduction, ignore_index)[0]
'''

_CLASSIC = '''
class SoftmaxCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, weight, reduction, ignore_index):
        ctx.save_for_backward(logits, target, weight)
        ctx.reduction, ctx.ignore_index = reduction, ignore_index
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        lse = torch.logsumexp(logits, -1)
        picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        losses = torch.where(valid, lse - picked, 0) * row_weight
        if reduction == "none":
            return losses
        if reduction == "sum":
            return losses.sum()
        return losses.sum() / row_weight.sum().clamp_min(torch.finfo(row_weight.dtype).tiny)

    @staticmethod
    def backward(ctx, grad_output):
        logits, target, weight = ctx.saved_tensors
        valid = target != ctx.ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        scale = grad_output * row_weight
        if ctx.reduction == "mean":
            scale = scale / row_weight.sum().clamp_min(torch.finfo(row_weight.dtype).tiny)
        grad = torch.softmax(logits, -1) * scale.unsqueeze(-1)
        grad = grad.scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))
        return grad, None, None, None, None
''' + _WRAPPER

_BACKWARD_TAIL = '''
    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, target, weight, reduction, ignore_index = inputs
        ctx.save_for_backward(logits, target, weight)
        ctx.reduction, ctx.ignore_index = reduction, ignore_index

    @staticmethod
    def backward(ctx, grad_output):
        logits, target, weight = ctx.saved_tensors
        valid = target != ctx.ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        scale = grad_output * row_weight
        if ctx.reduction == "mean":
            scale = scale / row_weight.sum().clamp_min(torch.finfo(row_weight.dtype).tiny)
        grad = torch.softmax(logits, -1) * scale.unsqueeze(-1)
        grad = grad.scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))
        return grad, None, None, None, None
'''

# A vmap rule by hand: the batch of each input to dim 0 (expanded where there is none), the
# per-row losses of the whole batch from one call, reduced per sample; per-sample class
# weights (a batched weight) weigh each sample's rows outside the Function.
_VMAP_RULE = '''
    @staticmethod
    def vmap(info, in_dims, logits, target, weight, reduction, ignore_index):
        logits_dim, target_dim, weight_dim = in_dims[:3]
        logits = logits.movedim(logits_dim, 0) if logits_dim is not None else logits.expand(info.batch_size, *logits.shape)
        target = target.movedim(target_dim, 0) if target_dim is not None else target.expand(info.batch_size, *target.shape)
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        if weight_dim is None:
            losses = SoftmaxCrossEntropy.apply(logits, target, weight, "none", ignore_index)
            row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        else:
            own = weight.movedim(weight_dim, 0).gather(1, safe.reshape(info.batch_size, -1))
            row_weight = own.reshape(target.shape) * valid
            losses = SoftmaxCrossEntropy.apply(logits, target, None, "none", ignore_index) * row_weight
        if reduction == "none":
            return losses, 0
        per_sample = losses.reshape(info.batch_size, -1).sum(1)
        if reduction == "sum":
            return per_sample, 0
        return per_sample / row_weight.reshape(info.batch_size, -1).sum(1).clamp_min(torch.finfo(row_weight.dtype).tiny), 0
'''  # noqa: E501  (a student's code as written)

# The same rule, reading only the batch dims of logits and target: a batched weight is taken
# for one sample's (weight.take reads the first sample's weights for every sample).
_VMAP_RULE_NO_WEIGHT_DIM = '''
    @staticmethod
    def vmap(info, in_dims, logits, target, weight, reduction, ignore_index):
        logits_dim, target_dim = in_dims[0], in_dims[1]
        logits = logits.movedim(logits_dim, 0) if logits_dim is not None else logits.expand(info.batch_size, *logits.shape)
        target = target.movedim(target_dim, 0) if target_dim is not None else target.expand(info.batch_size, *target.shape)
        losses = SoftmaxCrossEntropy.apply(logits, target, weight, "none", ignore_index)
        if reduction == "none":
            return losses, 0
        per_sample = losses.reshape(info.batch_size, -1).sum(1)
        if reduction == "sum":
            return per_sample, 0
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        return per_sample / row_weight.reshape(info.batch_size, -1).sum(1).clamp_min(torch.finfo(row_weight.dtype).tiny), 0
'''  # noqa: E501  (a student's code as written)

_VMAP_AT_ZERO = '''
    @staticmethod
    def vmap(info, in_dims, logits, target, weight, reduction, ignore_index):
        losses = SoftmaxCrossEntropy.apply(logits, target, weight, "none", ignore_index)
        if reduction == "none":
            return losses, 0
        per_sample = losses.reshape(info.batch_size, -1).sum(1)
        if reduction == "sum":
            return per_sample, 0
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        return per_sample / row_weight.reshape(info.batch_size, -1).sum(1).clamp_min(torch.finfo(row_weight.dtype).tiny), 0
'''  # noqa: E501  (a student's code as written)

_VMAP_FOLDED = '''
    @staticmethod
    def vmap(info, in_dims, logits, target, weight, reduction, ignore_index):
        logits_dim, target_dim = in_dims[0], in_dims[1]
        logits = logits.movedim(logits_dim, 0) if logits_dim is not None else logits.expand(info.batch_size, *logits.shape)
        target = target.movedim(target_dim, 0) if target_dim is not None else target.expand(info.batch_size, *target.shape)
        if reduction == "none":
            return SoftmaxCrossEntropy.apply(logits, target, weight, "none", ignore_index), 0
        loss = SoftmaxCrossEntropy.apply(logits, target, weight, reduction, ignore_index)  # one for the whole batch
        return loss.expand(info.batch_size), 0
'''  # noqa: E501  (a student's code as written)


def _with_vmap(rule: str) -> str:
    return (_HEAD.replace("    generate_vmap_rule = True\n\n", "") + _BACKWARD_TAIL + rule + _WRAPPER)


# Row log-sum-exp saved (N numbers), and backward a Function of its own whose backward is the
# second derivative, written by hand (the flash-attention design).
_LSE_BACKWARD_FUNCTION = '''
class SoftmaxCrossEntropyGrad(torch.autograd.Function):
    """(softmax(logits) - onehot(safe)) * scale, from the saved row log-sum-exp."""

    generate_vmap_rule = True

    @staticmethod
    def forward(logits, lse, safe, scale):
        p = torch.exp(logits - lse.unsqueeze(-1))
        return (p * scale.unsqueeze(-1)).scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, lse, safe, scale = inputs
        ctx.save_for_backward(logits, lse, safe, scale)

    @staticmethod
    def backward(ctx, u):
        logits, lse, safe, scale = ctx.saved_tensors
        p = torch.exp(logits - lse.unsqueeze(-1))
        pu = p * u
        grad_logits = scale.unsqueeze(-1) * (pu - p * pu.sum(-1, keepdim=True))
        grad_scale = pu.sum(-1) - u.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        return grad_logits, None, None, grad_scale


class SoftmaxCrossEntropy(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(logits, target, weight, reduction, ignore_index):
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        lse = torch.logsumexp(logits, -1)
        picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        losses = torch.where(valid, lse - picked, 0) * row_weight
        if reduction == "sum":
            losses = losses.sum()
        elif reduction == "mean":
            losses = losses.sum() / row_weight.sum().clamp_min(torch.finfo(row_weight.dtype).tiny)
        return losses, lse

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, target, weight, reduction, ignore_index = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(logits, target, weight, output[1])
        ctx.reduction, ctx.ignore_index = reduction, ignore_index

    @staticmethod
    def backward(ctx, grad_output, _):
        logits, target, weight, lse = ctx.saved_tensors
        valid = target != ctx.ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        scale = grad_output * row_weight
        if ctx.reduction == "mean":
            scale = scale / row_weight.sum().clamp_min(torch.finfo(row_weight.dtype).tiny)
        return SoftmaxCrossEntropyGrad.apply(logits, lse, safe, scale), None, None, None, None


def fused_cross_entropy(logits, target, weight=None, reduction="mean", ignore_index=-100):
    loss, _ = SoftmaxCrossEntropy.apply(logits, target, weight, reduction, ignore_index)
    return loss
'''

# The row log-sum-exp as a second, differentiable output, saved as an output: backward reads
# p = exp(logits - lse) and is differentiable again (notebook 07's Sinh with its extra outputs).
_LSE_OUTPUT = '''
class SoftmaxCrossEntropy(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(logits, target, weight, reduction, ignore_index):
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        lse = torch.logsumexp(logits, -1)
        picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        losses = torch.where(valid, lse - picked, 0) * row_weight
        if reduction == "sum":
            losses = losses.sum()
        elif reduction == "mean":
            losses = losses.sum() / row_weight.sum().clamp_min(torch.finfo(row_weight.dtype).tiny)
        return losses, lse

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, target, weight, reduction, ignore_index = inputs
        ctx.save_for_backward(logits, target, weight, output[1])
        ctx.reduction, ctx.ignore_index = reduction, ignore_index

    @staticmethod
    def backward(ctx, grad_output, grad_lse):
        logits, target, weight, lse = ctx.saved_tensors
        valid = target != ctx.ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        scale = grad_output * row_weight
        if ctx.reduction == "mean":
            scale = scale / row_weight.sum().clamp_min(torch.finfo(row_weight.dtype).tiny)
        p = torch.exp(logits - lse.unsqueeze(-1))
        grad = p * (scale + grad_lse).unsqueeze(-1)
        grad = grad.scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))
        return grad, None, None, None, None


def fused_cross_entropy(logits, target, weight=None, reduction="mean", ignore_index=-100):
    return SoftmaxCrossEntropy.apply(logits, target, weight, reduction, ignore_index)[0]
'''


MUTANTS = [
    # Numerically unstable formulas
    wrong(EX, "log Σ exp without the row max (overflows at logits of 1000)",
          ("lse = torch.logsumexp(logits, -1)", "lse = torch.log(torch.exp(logits).sum(-1))")),
    wrong(EX, "the log of the softmax (-inf when the target's probability underflows to 0)",
          ("losses = torch.where(valid, lse - picked, 0) * row_weight",
           "probability = torch.softmax(logits, -1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)\n"
           "        losses = torch.where(valid, -torch.log(probability), 0) * row_weight")),
    wrong(EX, "log-probabilities times a one-hot matrix (0 · -inf = nan at -inf logits)",
          ("losses = torch.where(valid, lse - picked, 0) * row_weight",
           "onehot = torch.zeros_like(logits).scatter(-1, safe.unsqueeze(-1), 1.0)\n"
           "        losses = -(torch.log_softmax(logits, -1) * onehot).sum(-1) * row_weight")),
    wrong(EX, "zeroes ignored rows by multiplying (inf · 0 = nan in an ignored row with -inf logits)",
          ("losses = torch.where(valid, lse - picked, 0) * row_weight", "losses = (lse - picked) * row_weight")),
    # Memory
    wrong(EX, "saves the probabilities (an N × C intermediate; not differentiable again either)",
          ("ctx.save_for_backward(logits, target, weight)  # inputs only: nothing new is kept",
           "ctx.save_for_backward(torch.softmax(logits, -1), target, weight)"),
          ("logits, target, weight = ctx.saved_tensors", "probabilities, target, weight = ctx.saved_tensors"),
          ("row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid\n        scale",
           "row_weight = valid.to(probabilities.dtype) if weight is None else weight.take(safe) * valid\n"
           "        scale"),
          ("grad = torch.softmax(logits, -1) * scale.unsqueeze(-1)", "grad = probabilities * scale.unsqueeze(-1)")),
    wrong(EX, "the log-probabilities as a second output (double backward right, but N × C kept)", source=_LOGP_OUTPUT),
    wrong(EX, "stashes the logits on ctx (hidden from the hooks, kept all the same)",
          ("ctx.save_for_backward(logits, target, weight)  # inputs only: nothing new is kept",
           "ctx.save_for_backward(target, weight)\n        ctx.logits = logits"),
          ("logits, target, weight = ctx.saved_tensors",
           "target, weight = ctx.saved_tensors\n        logits = ctx.logits")),
    wrong(EX, "keeps the softmax in a class attribute for backward (hidden from ctx, kept all the same)",
          ("ctx.save_for_backward(logits, target, weight)  # inputs only: nothing new is kept",
           "ctx.save_for_backward(logits, target, weight)\n"
           "        SoftmaxCrossEntropy.softmax = torch.softmax(logits, -1)"),
          ("grad = torch.softmax(logits, -1) * scale.unsqueeze(-1)",
           "grad = SoftmaxCrossEntropy.softmax * scale.unsqueeze(-1)")),
    wrong(EX, "keeps the logits in a module global (never given back)",
          ("ctx.save_for_backward(logits, target, weight)  # inputs only: nothing new is kept",
           "ctx.save_for_backward(target, weight)\n        global LOGITS\n        LOGITS = logits"),
          ("logits, target, weight = ctx.saved_tensors",
           "target, weight = ctx.saved_tensors\n        logits = LOGITS")),
    wrong(EX, "keeps the last logits in a default-argument cache of the wrapper (never given back)",
          ('def fused_cross_entropy(logits, target, weight=None, reduction="mean", ignore_index=-100):',
           'def fused_cross_entropy(logits, target, weight=None, reduction="mean", ignore_index=-100, _cache={}):'),
          ("    return SoftmaxCrossEntropy.apply(logits, target, weight, reduction, ignore_index)",
           '    _cache["logits"] = logits\n'
           '    return SoftmaxCrossEntropy.apply(logits, target, weight, reduction, ignore_index)')),
    # Double backward
    wrong(EX, "saves each row's log-sum-exp and uses exp(logits - lse): right once, wrong twice",
          ("ctx.save_for_backward(logits, target, weight)  # inputs only: nothing new is kept",
           "ctx.save_for_backward(logits, target, weight, torch.logsumexp(logits, -1))"),
          ("logits, target, weight = ctx.saved_tensors", "logits, target, weight, lse = ctx.saved_tensors"),
          ("grad = torch.softmax(logits, -1) * scale.unsqueeze(-1)",
           "grad = torch.exp(logits - lse.unsqueeze(-1)) * scale.unsqueeze(-1)")),
    wrong(EX, "backward marked @once_differentiable",
          ("    @staticmethod\n    def backward(ctx, grad_output):",
           "    @staticmethod\n    @torch.autograd.function.once_differentiable\n    def backward(ctx, grad_output):")),
    # Reductions, class weights, ignored rows
    wrong(EX, "ignores the reduction (always the mean)",
          ('        if reduction == "none":\n            return losses\n        if reduction == "sum":\n'
           '            return losses.sum()\n', ""),
          ('        if ctx.reduction == "mean":\n            total = row_weight.sum()\n',
           "        if True:\n            total = row_weight.sum()\n")),
    wrong(EX, "a weighted mean divided by the number of rows (not by their weights)",
          ("total = row_weight.sum()  # 0 when", "total = valid.sum()  # 0 when"),
          ("            total = row_weight.sum()\n", "            total = valid.sum()\n")),
    wrong(EX, "a mean over every row, ignored ones included",
          ("total = row_weight.sum()  # 0 when", "total = row_weight.sum() + (~valid).sum()  # 0 when"),
          ("            total = row_weight.sum()\n", "            total = row_weight.sum() + (~valid).sum()\n")),
    wrong(EX, "a mean of nothing left as 0 / 0 (nan, where the contract says 0)",
          ("return losses.sum() / torch.where(total > 0, total, 1)", "return losses.sum() / total"),
          ("scale = scale / torch.where(total > 0, total, 1)", "scale = scale / total")),
    wrong(EX, "the mean's total weight clamped at 1 (right for counts, wrong for weights that sum below 1)",
          ("return losses.sum() / torch.where(total > 0, total, 1)", "return losses.sum() / total.clamp_min(1)"),
          ("scale = scale / torch.where(total > 0, total, 1)", "scale = scale / total.clamp_min(1)")),
    wrong(EX, "ignores the class weights in backward",
          ("row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid\n        scale",
           "row_weight = valid.to(logits.dtype)\n        scale"),
          ("            total = row_weight.sum()\n",
           "            total = (valid.to(logits.dtype) if weight is None else weight.take(safe) * valid).sum()\n")),
    wrong(EX, "picks the target's logit by comparison with arange (a target that is no class gives a loss, silently)",
          ("picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # raises for a target that is no class",
           "classes = torch.arange(logits.shape[-1], device=logits.device)\n"
           "        picked = torch.where(classes == safe.unsqueeze(-1), logits, 0).sum(-1)")),
    wrong(EX, "clamps the target into the classes (a target that is no class is read as another)",
          ("safe = torch.where(valid, target, 0)  # an index",
           "safe = torch.where(valid, target, 0).clamp(0, logits.shape[-1] - 1)  # an index")),
    wrong(EX, "gathers with the raw target (ignore_index -100 is no index)",
          ("picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)",
           "picked = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1)")),
    wrong(EX, "ignores rows with a negative target, not those equal to ignore_index",
          ("valid = target != ignore_index\n", "valid = target >= 0\n"),
          ("valid = target != ctx.ignore_index\n", "valid = target >= 0\n")),
    # Shapes, dtypes, devices
    wrong(EX, "classes on dim 1, as F.cross_entropy's input (wrong for 1-d and 3-d logits)",
          ("lse = torch.logsumexp(logits, -1)", "lse = torch.logsumexp(logits, 1)")),
    wrong(EX, "squeezes the per-row losses ('none' with a batch of one loses its dim)",
          ('        if reduction == "none":\n            return losses\n',
           '        if reduction == "none":\n            return losses.squeeze()\n')),
    wrong(EX, "backward computes the softmax in float32 (a float64 gradient to float32's 7 digits)",
          ("grad = torch.softmax(logits, -1) * scale.unsqueeze(-1)",
           "grad = torch.softmax(logits.float(), -1).to(logits.dtype) * scale.unsqueeze(-1)")),
    wrong(EX, "computes the log-sum-exp in float64 (float32 logits give a float64 loss)",
          ("lse = torch.logsumexp(logits, -1)", "lse = torch.logsumexp(logits.double(), -1)")),
    wrong(EX, "a one-hot matrix made on the CPU in backward (not device-generic)",
          ("grad = grad.scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))  # minus the one-hot",
           "onehot = torch.zeros(logits.shape, dtype=logits.dtype).scatter(-1, safe.unsqueeze(-1), 1.0)\n"
           "        grad = grad - onehot * scale.unsqueeze(-1)")),
    wrong(EX, "backward ignores grad_output",
          ("scale = grad_output * row_weight  # one number per row", "scale = row_weight")),
    wrong(EX, "flattens the logits with .view (fails on logits that are not contiguous)",
          ("lse = torch.logsumexp(logits, -1)  # the row max is taken out first: no overflow",
           "lse = torch.logsumexp(logits.view(-1, logits.shape[-1]), -1).view(target.shape)")),
    wrong(EX, "a Python loop over the rows (torch.stack of no rows fails on an empty batch)",
          ("lse = torch.logsumexp(logits, -1)  # the row max is taken out first: no overflow",
           "lse = torch.stack([torch.logsumexp(row, -1) for row in logits.reshape(-1, logits.shape[-1])])"
           ".reshape(target.shape)")),
    # Transforms and compile
    wrong(EX, "F.one_hot in backward (data-dependent: vmap cannot run it)",
          ("grad = grad.scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))  # minus the one-hot",
           "onehot = torch.nn.functional.one_hot(safe, logits.shape[-1]).to(logits.dtype)\n"
           "        grad = grad - onehot * scale.unsqueeze(-1)")),
    wrong(EX, "a classic Function (forward(ctx, ...)): torch.func refuses it", source=_CLASSIC),
    wrong(EX, "a vmap rule by hand that assumes the batch at dim 0 of both inputs", source=_with_vmap(_VMAP_AT_ZERO)),
    wrong(EX, "a vmap rule by hand that reads the batch dims of logits and target only (per-sample weights lost)",
          source=_with_vmap(_VMAP_RULE_NO_WEIGHT_DIM)),
    wrong(EX, "a vmap rule by hand that folds the batch into the rows (one mean for the whole batch)",
          source=_with_vmap(_VMAP_FOLDED)),
    wrong(EX, "reads the mean's denominator with .item() (no single graph; vmap cannot either)",
          ("return losses.sum() / torch.where(total > 0, total, 1)",
           "return losses.sum() / max(total.item(), 1e-300)")),
    wrong(EX, "defines jvp (forward mode): torch.compile cannot trace it into one graph",
          ("        return grad, None, None, None, None\n",
           "        return grad, None, None, None, None\n\n"
           "    @staticmethod\n"
           "    def jvp(ctx, logits_t, target_t, weight_t, reduction_t, ignore_index_t):\n"
           "        raise NotImplementedError(\"forward mode is not needed here\")\n")),
    # 11.2 true or false
    wrong("claims", "thinks a reduction shrinks what the log-probabilities keep", ('"a": "false"', '"a": "true"')),
    wrong("claims", "thinks e^700 overflows float64", ('"b": "true"', '"b": "false"')),
    wrong("claims", "thinks any row statistic saved in forward breaks double backward",
          ('"c": "true"', '"c": "false"')),
    wrong("claims", "thinks F.one_hot fails in per-sample gradients even on shared targets",
          ('"d": "false"', '"d": "true"')),
    wrong("claims", "thinks a function under vmap sees the batch dim", ('"e": "false"', '"e": "true"')),
    wrong("claims", "misjudges the bytes of N × C float32 numbers", ('"f": "true"', '"f": "false"')),
]

VARIANTS = [
    right(EX, "saves the row log-sum-exp; backward is a Function with its own hand-written backward",
          source=_LSE_BACKWARD_FUNCTION),
    right(EX, "the row log-sum-exp as a second output, saved as an output (notebook 07's Sinh pattern)",
          source=_LSE_OUTPUT),
    right(EX, "a vmap rule by hand (per-row losses of the whole batch, reduced per sample)",
          source=_with_vmap(_VMAP_RULE)),
    right(EX, "one-hot by comparison with arange; the mean through normalised row weights",
          ("return losses.sum() / torch.where(total > 0, total, 1)",
           "return (losses / torch.where(total > 0, total, 1)).sum()"),
          ("grad = grad.scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))  # minus the one-hot",
           "classes = torch.arange(logits.shape[-1], device=logits.device)\n"
           "        grad = grad - (classes == safe.unsqueeze(-1)).to(logits.dtype) * scale.unsqueeze(-1)")),
    right(EX, "saves each row's max (a constant to autograd): softmax from exp(logits - max) does not depend on it",
          ("ctx.save_for_backward(logits, target, weight)  # inputs only: nothing new is kept",
           "ctx.save_for_backward(logits, target, weight, logits.detach().amax(-1, keepdim=True))"),
          ("logits, target, weight = ctx.saved_tensors", "logits, target, weight, top = ctx.saved_tensors"),
          ("grad = torch.softmax(logits, -1) * scale.unsqueeze(-1)",
           "top = torch.where(torch.isfinite(top), top, 0)\n"
           "        shifted = torch.exp(logits - top)\n"
           "        grad = shifted / shifted.sum(-1, keepdim=True) * scale.unsqueeze(-1)")),
    right(EX, "the row max and log-sum-exp by hand, max(-inf) guarded",
          ("lse = torch.logsumexp(logits, -1)  # the row max is taken out first: no overflow",
           "top = logits.amax(-1, keepdim=True).detach()\n"
           "        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))\n"
           "        lse = (logits - top).exp().sum(-1).log() + top.squeeze(-1)")),
    right("claims", "capitals and spaces", source='''
claims = {"a": "FALSE", "b": " true", "c": "True", "d": "false ", "e": "False", "f": "TRUE"}
'''),
]
