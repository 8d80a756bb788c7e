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
        return losses.sum() / row_weight.sum()
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
            losses = losses.sum() / row_weight.sum()
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
            scale = scale / row_weight.sum()
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
        return losses.sum() / row_weight.sum()

    @staticmethod
    def backward(ctx, grad_output):
        logits, target, weight = ctx.saved_tensors
        valid = target != ctx.ignore_index
        safe = torch.where(valid, target, 0)
        row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid
        scale = grad_output * row_weight
        if ctx.reduction == "mean":
            scale = scale / row_weight.sum()
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
            scale = scale / row_weight.sum()
        grad = torch.softmax(logits, -1) * scale.unsqueeze(-1)
        grad = grad.scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))
        return grad, None, None, None, None
'''

# A vmap rule by hand: the batch of each input to dim 0 (expanded where there is none), the
# per-row losses of the whole batch from one call, reduced per sample.
_VMAP_RULE = '''
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
        return per_sample / row_weight.reshape(info.batch_size, -1).sum(1), 0
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
        return per_sample / row_weight.reshape(info.batch_size, -1).sum(1), 0
'''

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
            losses = losses.sum() / row_weight.sum()
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
            scale = scale / row_weight.sum()
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
            losses = losses.sum() / row_weight.sum()
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
            scale = scale / row_weight.sum()
        p = torch.exp(logits - lse.unsqueeze(-1))
        grad = p * (scale + grad_lse).unsqueeze(-1)
        grad = grad.scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))
        return grad, None, None, None, None


def fused_cross_entropy(logits, target, weight=None, reduction="mean", ignore_index=-100):
    return SoftmaxCrossEntropy.apply(logits, target, weight, reduction, ignore_index)[0]
'''

# --- Part B: the chunked Linear + cross-entropy ---------------------------------------------------

LINEAR = "fused_linear_cross_entropy"

_LINEAR_WRAPPER = '''

def fused_linear_cross_entropy(hidden, weight, target, reduction="mean", ignore_index=-100, chunk_size=1024):
    return ChunkedLinearCrossEntropy.apply(hidden, weight, target, reduction, ignore_index, chunk_size)
'''

_LINEAR_REDUCE = '''
        if reduction == "none":
            return losses
        if reduction == "sum":
            return losses.sum()
        return losses.sum() / valid.sum()
'''

# A classic Function that keeps every chunk's logits for backward, in one tensor or in a list
# on ctx: forward never holds more than a chunk at a time, yet all of them live until backward.
_KEEPS_CHUNKS = '''
class ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, reduction, ignore_index, chunk_size):
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        losses, chunks = [], []
        for rows in torch.arange(hidden.shape[0], device=hidden.device).split(chunk_size):
            logits = hidden[rows] @ weight.T
            chunks.append(logits)
            picked = logits.gather(-1, safe[rows].unsqueeze(-1)).squeeze(-1)
            losses.append(torch.logsumexp(logits, -1) - picked)
        losses = torch.where(valid, torch.cat(losses), 0)
        KEEP
        ctx.reduction, ctx.ignore_index, ctx.chunk_size = reduction, ignore_index, chunk_size
''' + _LINEAR_REDUCE + '''
    @staticmethod
    def backward(ctx, grad_output):
        hidden, weight, target = ctx.saved_tensors[:3]
        chunks = CHUNKS
        valid = target != ctx.ignore_index
        safe = torch.where(valid, target, 0)
        scale = grad_output * valid
        if ctx.reduction == "mean":
            scale = scale / valid.sum()
        grad_hidden, grad_weight = torch.zeros_like(hidden), torch.zeros_like(weight)
        for rows, logits in zip(torch.arange(hidden.shape[0], device=hidden.device).split(ctx.chunk_size), chunks):
            s = scale[rows].unsqueeze(-1)
            grad_logits = torch.softmax(logits, -1) * s
            grad_logits = grad_logits.scatter_add(-1, safe[rows].unsqueeze(-1), -s)
            grad_hidden = grad_hidden.index_add(0, rows, grad_logits @ weight)
            grad_weight = grad_weight + grad_logits.T @ hidden[rows]
        return grad_hidden, grad_weight, None, None, None, None
''' + _LINEAR_WRAPPER

_SAVES_CHUNKS = (_KEEPS_CHUNKS
                 .replace("KEEP", "ctx.save_for_backward(hidden, weight, target, *chunks)")
                 .replace("CHUNKS", "ctx.saved_tensors[3:]"))
_STASHES_CHUNKS = (_KEEPS_CHUNKS
                   .replace("KEEP", "ctx.save_for_backward(hidden, weight, target)\n        ctx.chunks = chunks")
                   .replace("CHUNKS", "ctx.chunks"))
_GLOBAL_CHUNKS = ("\nCHUNK_CACHE = []\n" + _KEEPS_CHUNKS
                  .replace("KEEP", "ctx.save_for_backward(hidden, weight, target)\n        CHUNK_CACHE[:] = chunks")
                  .replace("CHUNKS", "list(CHUNK_CACHE)"))

_COMPOSITE = '''
def fused_linear_cross_entropy(hidden, weight, target, reduction="mean", ignore_index=-100, chunk_size=1024):
    return torch.nn.functional.cross_entropy(hidden @ weight.T, target, reduction=reduction, ignore_index=ignore_index)
'''

_LOOP_OF_LOSSES = '''
def fused_linear_cross_entropy(hidden, weight, target, reduction="mean", ignore_index=-100, chunk_size=1024):
    losses = [torch.nn.functional.cross_entropy(h @ weight.T, t, reduction="none", ignore_index=ignore_index)
              for h, t in zip(hidden.split(chunk_size), target.split(chunk_size))]
    losses = torch.cat(losses)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / (target != ignore_index).sum()
'''

# Each chunk's loss through torch.utils.checkpoint: its logits are made again in backward, one
# chunk at a time (notebook 08), and no Function of one's own is needed.
_CHECKPOINTED = '''
from torch.utils.checkpoint import checkpoint


def fused_linear_cross_entropy(hidden, weight, target, reduction="mean", ignore_index=-100, chunk_size=1024):
    def chunk_losses(h, w, t):
        return torch.nn.functional.cross_entropy(h @ w.T, t, reduction="none", ignore_index=ignore_index)

    losses = [checkpoint(chunk_losses, h, weight, t, use_reentrant=False)
              for h, t in zip(hidden.split(chunk_size), target.split(chunk_size))]
    losses = torch.cat(losses)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / (target != ignore_index).sum()
'''

# Chunks of classes instead of rows, each as wide as chunk_size rows of logits hold: an online
# log-sum-exp (a running max and sum per row) in forward, the same tiles again in backward.
_CLASS_CHUNKS = '''
class ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def tiles(n, classes, chunk_size, device):
        width = max(1, chunk_size * classes // max(n, 1))
        return torch.arange(classes, device=device).split(width)

    @staticmethod
    def forward(hidden, weight, target, reduction, ignore_index, chunk_size):
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        top = hidden.new_full((hidden.shape[0],), -float("inf"))
        total = hidden.new_zeros(hidden.shape[0])
        picked = hidden.new_zeros(hidden.shape[0])
        for cols in ChunkedLinearCrossEntropy.tiles(hidden.shape[0], weight.shape[0], chunk_size, hidden.device):
            logits = hidden @ weight[cols].T
            new_top = torch.maximum(top, logits.amax(-1))
            total = total * torch.exp(top - new_top) + torch.exp(logits - new_top.unsqueeze(-1)).sum(-1)
            top = new_top
            inside = (safe.unsqueeze(-1) == cols).to(hidden.dtype)
            picked = picked + (logits * inside).sum(-1)
        losses = torch.where(valid, top + torch.log(total) - picked, 0)
''' + _LINEAR_REDUCE + '''
    @staticmethod
    def setup_context(ctx, inputs, output):
        hidden, weight, target, reduction, ignore_index, chunk_size = inputs
        ctx.save_for_backward(hidden, weight, target)
        ctx.reduction, ctx.ignore_index, ctx.chunk_size = reduction, ignore_index, chunk_size

    @staticmethod
    def backward(ctx, grad_output):
        hidden, weight, target = ctx.saved_tensors
        valid = target != ctx.ignore_index
        safe = torch.where(valid, target, 0)
        scale = grad_output * valid
        if ctx.reduction == "mean":
            scale = scale / valid.sum()
        tiles = ChunkedLinearCrossEntropy.tiles(hidden.shape[0], weight.shape[0], ctx.chunk_size, hidden.device)
        lse = hidden.new_full((hidden.shape[0],), -float("inf"))
        for cols in tiles:
            lse = torch.logaddexp(lse, torch.logsumexp(hidden @ weight[cols].T, -1))
        grad_hidden, grad_weight = torch.zeros_like(hidden), torch.zeros_like(weight)
        for cols in tiles:
            p = torch.exp(hidden @ weight[cols].T - lse.unsqueeze(-1))
            grad_logits = (p - (safe.unsqueeze(-1) == cols).to(hidden.dtype)) * scale.unsqueeze(-1)
            grad_hidden = grad_hidden + grad_logits @ weight[cols]
            grad_weight = grad_weight.index_add(0, cols, grad_logits.T @ hidden)
        return grad_hidden, grad_weight, None, None, None, None
''' + _LINEAR_WRAPPER

# The gradients computed in forward, chunk by chunk, and only scaled by grad_output in backward
# (Liger Kernel's design); 'none' has one grad_output per row, so its backward recomputes.
_GRADIENTS_IN_FORWARD = '''
def _chunk_grads(hidden, weight, safe, row_scale, chunk_size):
    grad_hidden, grad_weight = torch.zeros_like(hidden), torch.zeros_like(weight)
    for rows in torch.arange(hidden.shape[0], device=hidden.device).split(chunk_size):
        s = row_scale[rows].unsqueeze(-1)
        grad_logits = torch.softmax(hidden[rows] @ weight.T, -1) * s
        grad_logits = grad_logits.scatter_add(-1, safe[rows].unsqueeze(-1), -s)
        grad_hidden[rows] = grad_logits @ weight
        grad_weight.addmm_(grad_logits.T, hidden[rows])
    return grad_hidden, grad_weight


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, reduction, ignore_index, chunk_size):
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        losses = []
        for rows in torch.arange(hidden.shape[0], device=hidden.device).split(chunk_size):
            logits = hidden[rows] @ weight.T
            losses.append(torch.logsumexp(logits, -1) - logits.gather(-1, safe[rows].unsqueeze(-1)).squeeze(-1))
        losses = torch.where(valid, torch.cat(losses), 0)
        ctx.reduction, ctx.chunk_size = reduction, chunk_size
        if reduction == "none":
            ctx.save_for_backward(hidden, weight, safe, valid)
            return losses
        row_scale = valid.to(hidden.dtype)
        if reduction == "mean":
            row_scale = row_scale / valid.sum()
        ctx.save_for_backward(*_chunk_grads(hidden, weight, safe, row_scale, chunk_size))
        return (losses.sum() if reduction == "sum" else losses.sum() / valid.sum())

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.reduction == "none":
            hidden, weight, safe, valid = ctx.saved_tensors
            grads = _chunk_grads(hidden, weight, safe, grad_output * valid, ctx.chunk_size)
        else:
            grads = [g * grad_output for g in ctx.saved_tensors]
        return grads[0], grads[1], None, None, None, None
''' + _LINEAR_WRAPPER

# Backward asks autograd for each chunk's gradients, the chunk's loss rebuilt with torch
# operations under enable_grad: autograd does the calculus, one chunk at a time.
_AUTOGRAD_PER_CHUNK = '''
class ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def losses(hidden, weight, target, ignore_index):
        return torch.nn.functional.cross_entropy(hidden @ weight.T, target, reduction="none", ignore_index=ignore_index)

    @staticmethod
    def forward(hidden, weight, target, reduction, ignore_index, chunk_size):
        losses = [ChunkedLinearCrossEntropy.losses(h, weight, t, ignore_index)
                  for h, t in zip(hidden.split(chunk_size), target.split(chunk_size))]
        losses = torch.cat(losses)
        valid = target != ignore_index
''' + _LINEAR_REDUCE + '''
    @staticmethod
    def setup_context(ctx, inputs, output):
        hidden, weight, target, reduction, ignore_index, chunk_size = inputs
        ctx.save_for_backward(hidden, weight, target)
        ctx.reduction, ctx.ignore_index, ctx.chunk_size = reduction, ignore_index, chunk_size

    @staticmethod
    def backward(ctx, grad_output):
        hidden, weight, target = ctx.saved_tensors
        scale = grad_output.expand(target.shape) if ctx.reduction != "none" else grad_output
        if ctx.reduction == "mean":
            scale = scale / (target != ctx.ignore_index).sum()
        grad_hidden, grad_weight = [], torch.zeros_like(weight)
        for h, t, s in zip(hidden.split(ctx.chunk_size), target.split(ctx.chunk_size), scale.split(ctx.chunk_size)):
            with torch.enable_grad():
                h, w = h.detach().requires_grad_(), weight.detach().requires_grad_()
                part = ChunkedLinearCrossEntropy.losses(h, w, t, ctx.ignore_index)
                gh, gw = torch.autograd.grad(part, (h, w), s)
            grad_hidden.append(gh)
            grad_weight = grad_weight + gw
        return torch.cat(grad_hidden), grad_weight, None, None, None, None
''' + _LINEAR_WRAPPER


# A classic Function that keeps each row's log-sum-exp (N numbers, within the budget) and reads
# the softmax as exp(logits - lse) in backward, which is right once (part B asks no more); the
# gradients are summed into their buffers in place.
_LSE_SAVED = '''
class ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, reduction, ignore_index, chunk_size):
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        lse, picked = hidden.new_empty(hidden.shape[0]), hidden.new_empty(hidden.shape[0])
        for rows in torch.arange(hidden.shape[0], device=hidden.device).split(chunk_size):
            logits = hidden[rows] @ weight.T
            lse[rows] = torch.logsumexp(logits, -1)
            picked[rows] = logits.gather(-1, safe[rows].unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(hidden, weight, safe, valid, lse)
        ctx.reduction, ctx.chunk_size = reduction, chunk_size
        losses = torch.where(valid, lse - picked, 0)
''' + _LINEAR_REDUCE + '''
    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        hidden, weight, safe, valid, lse = ctx.saved_tensors
        scale = grad_output * valid
        if ctx.reduction == "mean":
            scale = scale / valid.sum()
        grad_hidden, grad_weight = torch.empty_like(hidden), torch.zeros_like(weight)
        for rows in torch.arange(hidden.shape[0], device=hidden.device).split(ctx.chunk_size):
            s = scale[rows].unsqueeze(-1)
            grad_logits = torch.exp(hidden[rows] @ weight.T - lse[rows].unsqueeze(-1)) * s
            grad_logits.scatter_add_(-1, safe[rows].unsqueeze(-1), -s)
            grad_hidden[rows] = grad_logits @ weight
            grad_weight.addmm_(grad_logits.T, hidden[rows])
        return grad_hidden, grad_weight, None, None, None, None
''' + _LINEAR_WRAPPER


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
          ('        if ctx.reduction == "mean":\n            scale = scale / row_weight.sum()\n',
           "        scale = scale / row_weight.sum()\n")),
    wrong(EX, "a weighted mean divided by the number of rows (not by their weights)",
          ("return losses.sum() / row_weight.sum()", "return losses.sum() / valid.sum()"),
          ("scale = scale / row_weight.sum()", "scale = scale / valid.sum()")),
    wrong(EX, "a mean over every row, ignored ones included",
          ("return losses.sum() / row_weight.sum()",
           "return losses.sum() / (row_weight.sum() + (~valid).sum())"),
          ("scale = scale / row_weight.sum()", "scale = scale / (row_weight.sum() + (~valid).sum())")),
    wrong(EX, "ignores the class weights in backward",
          ("row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid\n        scale",
           "row_weight = valid.to(logits.dtype)\n        scale"),
          ("scale = scale / row_weight.sum()",
           "scale = scale / (valid.to(logits.dtype) if weight is None else weight.take(safe) * valid).sum()")),
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
    wrong(EX, "a vmap rule by hand that folds the batch into the rows (one mean for the whole batch)",
          source=_with_vmap(_VMAP_FOLDED)),
    wrong(EX, "reads the mean's denominator with .item() (no single graph; vmap cannot either)",
          ("return losses.sum() / row_weight.sum()", "return losses.sum() / row_weight.sum().item()")),
    wrong(EX, "defines jvp (forward mode): torch.compile cannot trace it into one graph",
          ("        return grad, None, None, None, None\n",
           "        return grad, None, None, None, None\n\n"
           "    @staticmethod\n"
           "    def jvp(ctx, logits_t, target_t, weight_t, reduction_t, ignore_index_t):\n"
           "        raise NotImplementedError(\"forward mode is not needed here\")\n")),
    # 11.2 true or false
    wrong("claims", "thinks F.cross_entropy keeps no N × C matrix", ('"a": "true"', '"a": "false"')),
    wrong("claims", "thinks log(softmax) is as stable as log_softmax", ('"b": "false"', '"b": "true"')),
    wrong("claims", "thinks a saved log-sum-exp is differentiable again", ('"c": "true"', '"c": "false"')),
    wrong("claims", "thinks saving the logits the caller holds copies them", ('"d": "true"', '"d": "false"')),
    wrong("claims", "thinks F.one_hot works under vmap", ('"e": "false"', '"e": "true"')),
    wrong("claims", "thinks keeping the logits always saves memory", ('"f": "false"', '"f": "true"')),
    wrong("claims", "thinks a custom op rules out per-sample gradients", ('"g": "false"', '"g": "true"')),
    wrong("claims", "thinks torch.compile cannot trace NumPy", ('"h": "false"', '"h": "true"')),
    # Part B: memory
    wrong(LINEAR, "the composite: F.cross_entropy of the whole logits", source=_COMPOSITE),
    wrong(LINEAR, "a loop of F.cross_entropy over chunks: autograd keeps every chunk's log-probabilities",
          source=_LOOP_OF_LOSSES),
    wrong(LINEAR, "forward in one chunk (the whole logits at once)",
          ("for rows in torch.arange(hidden.shape[0], device=hidden.device).split(chunk_size):",
           "for rows in [torch.arange(hidden.shape[0], device=hidden.device)]:")),
    wrong(LINEAR, "backward in one chunk (the whole softmax at once)",
          ("for rows in torch.arange(hidden.shape[0], device=hidden.device).split(ctx.chunk_size):",
           "for rows in [torch.arange(hidden.shape[0], device=hidden.device)]:")),
    wrong(LINEAR, "saves every chunk's logits for backward", source=_SAVES_CHUNKS),
    wrong(LINEAR, "keeps every chunk's logits in a list on ctx", source=_STASHES_CHUNKS),
    wrong(LINEAR, "keeps every chunk's logits in a module-level list", source=_GLOBAL_CHUNKS),
    # Part B: reductions, ignored rows, edges
    wrong(LINEAR, "the mean of the chunks' means",
          ("        return losses.sum() / valid.sum()\n",
           "        means = [losses[rows].sum() / valid[rows].sum()\n"
           "                 for rows in torch.arange(hidden.shape[0], device=hidden.device).split(chunk_size)]\n"
           "        return torch.stack(means).mean()\n"),
          ("            scale = scale / valid.sum()\n",
           "            chunks = torch.arange(hidden.shape[0], device=hidden.device).split(ctx.chunk_size)\n"
           "            scale = torch.cat([scale[rows] / valid[rows].sum() / len(chunks) for rows in chunks])\n")),
    wrong(LINEAR, "a mean over every row, ignored ones included",
          ("return losses.sum() / valid.sum()", "return losses.mean()"),
          ("scale = scale / valid.sum()", "scale = scale / valid.numel()")),
    wrong(LINEAR, "gives ignored rows a gradient (no mask in backward)",
          ("scale = grad_output * valid  # one number per row, 0 where ignored",
           "scale = grad_output * torch.ones_like(valid, dtype=hidden.dtype)")),
    wrong(LINEAR, "ignores rows whose target is -100, whatever ignore_index is",
          ("valid = target != ignore_index\n", "valid = target != -100\n"),
          ("valid = target != ctx.ignore_index\n", "valid = target != -100\n")),
    wrong(LINEAR, "gathers with the raw target (-100 is no index)",
          ("picked = logits.gather(-1, safe[rows].unsqueeze(-1)).squeeze(-1)",
           "picked = logits.gather(-1, target[rows].unsqueeze(-1)).squeeze(-1)")),
    wrong(LINEAR, "the gradient for weight of the last chunk only (not summed over the chunks)",
          ("grad_weight = grad_weight + grad_logits.T @ hidden[rows]", "grad_weight = grad_logits.T @ hidden[rows]")),
    wrong(LINEAR, "backward ignores grad_output",
          ("scale = grad_output * valid  # one number per row, 0 where ignored", "scale = valid.to(hidden.dtype)")),
    wrong(LINEAR, "drops the last, shorter chunk",
          ("for rows in torch.arange(hidden.shape[0], device=hidden.device).split(chunk_size):",
           "for rows in torch.arange(hidden.shape[0], device=hidden.device).split(chunk_size)[: "
           "hidden.shape[0] // chunk_size]:"),
          ("for rows in torch.arange(hidden.shape[0], device=hidden.device).split(ctx.chunk_size):",
           "for rows in torch.arange(hidden.shape[0], device=hidden.device).split(ctx.chunk_size)"
           "[: hidden.shape[0] // ctx.chunk_size]:")),
    wrong(LINEAR, "sums the loss in float64 (a float32 input gives a float64 loss)",
          ("            return losses.sum()\n        return",
           "            return losses.double().sum()\n        return")),
]

VARIANTS = [
    right(EX, "saves the row log-sum-exp; backward is a Function with its own hand-written backward",
          source=_LSE_BACKWARD_FUNCTION),
    right(EX, "the row log-sum-exp as a second output, saved as an output (notebook 07's Sinh pattern)",
          source=_LSE_OUTPUT),
    right(EX, "a vmap rule by hand (per-row losses of the whole batch, reduced per sample)",
          source=_with_vmap(_VMAP_RULE)),
    right(EX, "one-hot by comparison with arange; the mean through normalised row weights",
          ("return losses.sum() / row_weight.sum()", "return (losses / row_weight.sum()).sum()"),
          ("grad = grad.scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))  # minus the one-hot",
           "classes = torch.arange(logits.shape[-1], device=logits.device)\n"
           "        grad = grad - (classes == safe.unsqueeze(-1)).to(logits.dtype) * scale.unsqueeze(-1)")),
    right(EX, "the row max and log-sum-exp by hand, max(-inf) guarded",
          ("lse = torch.logsumexp(logits, -1)  # the row max is taken out first: no overflow",
           "top = logits.amax(-1, keepdim=True).detach()\n"
           "        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))\n"
           "        lse = (logits - top).exp().sum(-1).log() + top.squeeze(-1)")),
    right(LINEAR, "each chunk's loss through torch.utils.checkpoint, no Function of its own", source=_CHECKPOINTED),
    right(LINEAR, "chunks of classes with an online log-sum-exp, not chunks of rows", source=_CLASS_CHUNKS),
    right(LINEAR, "the gradients computed in forward and scaled in backward (Liger Kernel's design)",
          source=_GRADIENTS_IN_FORWARD),
    right(LINEAR, "backward asks autograd for each chunk's gradients", source=_AUTOGRAD_PER_CHUNK,
          flag="asks autograd for the gradient inside backward"),
    right(LINEAR, "each row's log-sum-exp saved (no double backward asked), gradients summed in place",
          source=_LSE_SAVED),
    right("claims", "capitals and spaces", source='''
claims = {"a": "TRUE", "b": " false", "c": "True", "d": "true ", "e": "False", "f": "FALSE", "g": "false ",
          "h": "False"}
'''),
]
