"""11_capstone_extension: wrong answers that must lose points, unusual right ones that must not."""
from . import right, wrong

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
        return losses.sum() / valid.sum().clamp_min(1)
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
            scale = scale / valid.sum().clamp_min(1)
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

# The losses of the chunks, one per row, then the reduction over the whole batch.
_CONCATENATED = '''
    losses = torch.cat(losses)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / (target != ignore_index).sum().clamp_min(1)
'''

_LOOP_OF_LOSSES = '''
def fused_linear_cross_entropy(hidden, weight, target, reduction="mean", ignore_index=-100, chunk_size=1024):
    losses = [torch.nn.functional.cross_entropy(h @ weight.T, t, reduction="none", ignore_index=ignore_index)
              for h, t in zip(hidden.split(chunk_size), target.split(chunk_size))]''' + _CONCATENATED

# Each chunk's loss through torch.utils.checkpoint: its logits are made again in backward, one
# chunk at a time (notebook 08), and no Function of one's own is needed.
_CHECKPOINTED = '''
from torch.utils.checkpoint import checkpoint


def fused_linear_cross_entropy(hidden, weight, target, reduction="mean", ignore_index=-100, chunk_size=1024):
    def chunk_losses(h, w, t):
        return torch.nn.functional.cross_entropy(h @ w.T, t, reduction="none", ignore_index=ignore_index)

    losses = [checkpoint(chunk_losses, h, weight, t, use_reentrant=False)
              for h, t in zip(hidden.split(chunk_size), target.split(chunk_size))]''' + _CONCATENATED

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
        picked = (hidden * weight.index_select(0, safe)).sum(-1)  # the target's logit from its row of weight
        for cols in ChunkedLinearCrossEntropy.tiles(hidden.shape[0], weight.shape[0], chunk_size, hidden.device):
            logits = hidden @ weight[cols].T
            new_top = torch.maximum(top, logits.amax(-1))
            total = total * torch.exp(top - new_top) + torch.exp(logits - new_top.unsqueeze(-1)).sum(-1)
            top = new_top
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
            scale = scale / valid.sum().clamp_min(1)
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
            row_scale = row_scale / valid.sum().clamp_min(1)
        ctx.save_for_backward(*_chunk_grads(hidden, weight, safe, row_scale, chunk_size))
        return (losses.sum() if reduction == "sum" else losses.sum() / valid.sum().clamp_min(1))

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
            scale = scale / (target != ctx.ignore_index).sum().clamp_min(1)
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
            scale = scale / valid.sum().clamp_min(1)
        grad_hidden, grad_weight = torch.empty_like(hidden), torch.zeros_like(weight)
        for rows in torch.arange(hidden.shape[0], device=hidden.device).split(ctx.chunk_size):
            s = scale[rows].unsqueeze(-1)
            grad_logits = torch.exp(hidden[rows] @ weight.T - lse[rows].unsqueeze(-1)) * s
            grad_logits.scatter_add_(-1, safe[rows].unsqueeze(-1), -s)
            grad_hidden[rows] = grad_logits @ weight
            grad_weight.addmm_(grad_logits.T, hidden[rows])
        return grad_hidden, grad_weight, None, None, None, None
''' + _LINEAR_WRAPPER



# The same tiles, the target's logit picked by comparison with each tile's classes: a target
# that is no class lies in no tile, and picks nothing.
_CLASS_CHUNKS_COMPARED = _CLASS_CHUNKS.replace(
    """        picked = (hidden * weight.index_select(0, safe)).sum(-1)  # the target's logit from its row of weight
""", """        picked = hidden.new_zeros(hidden.shape[0])
""").replace(
    """            top = new_top
""", """            top = new_top
            picked = picked + (logits * (safe.unsqueeze(-1) == cols).to(hidden.dtype)).sum(-1)
""", 1)
# Chunks of chunk_size classes, every row: N × chunk_size logits at once, more than the
# chunk_size × V the contract allows when there are more rows than classes.
_CLASS_WIDE = _CLASS_CHUNKS.replace("width = max(1, chunk_size * classes // max(n, 1))", "width = chunk_size")

MUTANTS = [
    # Memory
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
    wrong(LINEAR, "chunks of chunk_size classes of every row (N × chunk_size logits, past chunk_size × V when N > V)",
          source=_CLASS_WIDE),
    # Reductions, ignored rows, edges
    wrong(LINEAR, "the mean of the chunks' means",
          ("        counted = valid.sum()  # over the whole batch; 0 when no row counts: the mean is then 0\n"
           "        return losses.sum() / torch.where(counted > 0, counted, 1)\n",
           "        means = [losses[rows].sum() / valid[rows].sum()\n"
           "                 for rows in torch.arange(hidden.shape[0], device=hidden.device).split(chunk_size)]\n"
           "        return torch.stack(means).mean()\n"),
          ("            counted = valid.sum()\n            scale = scale / torch.where(counted > 0, counted, 1)\n",
           "            chunks = torch.arange(hidden.shape[0], device=hidden.device).split(ctx.chunk_size)\n"
           "            scale = torch.cat([scale[rows] / valid[rows].sum() / len(chunks) for rows in chunks])\n")),
    wrong(LINEAR, "a mean over every row, ignored ones included",
          ("return losses.sum() / torch.where(counted > 0, counted, 1)", "return losses.mean()"),
          ("scale = scale / torch.where(counted > 0, counted, 1)", "scale = scale / valid.numel()")),
    wrong(LINEAR, "the whole batch's mean of nothing left as 0 / 0 (nan, where the contract says 0)",
          ("return losses.sum() / torch.where(counted > 0, counted, 1)", "return losses.sum() / counted"),
          ("scale = scale / torch.where(counted > 0, counted, 1)", "scale = scale / counted")),
    wrong(LINEAR, "gives ignored rows a gradient (no mask in backward)",
          ("scale = grad_output * valid  # one number per row, 0 where ignored",
           "scale = grad_output * torch.ones_like(valid, dtype=hidden.dtype)")),
    wrong(LINEAR, "ignores rows whose target is -100, whatever ignore_index is",
          ("valid = target != ignore_index\n", "valid = target != -100\n"),
          ("valid = target != ctx.ignore_index\n", "valid = target != -100\n")),
    wrong(LINEAR, "class chunks that pick the target's logit by comparison (a target that is no class gives a loss)",
          source=_CLASS_CHUNKS_COMPARED),
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
          ("            return losses.sum()\n        counted",
           "            return losses.double().sum()\n        counted")),
]

VARIANTS = [
    right(LINEAR, "each chunk's loss through torch.utils.checkpoint, no Function of its own", source=_CHECKPOINTED),
    right(LINEAR, "chunks of classes with an online log-sum-exp, not chunks of rows", source=_CLASS_CHUNKS),
    right(LINEAR, "the gradients computed in forward and scaled in backward (Liger Kernel's design)",
          source=_GRADIENTS_IN_FORWARD),
    right(LINEAR, "backward asks autograd for each chunk's gradients", source=_AUTOGRAD_PER_CHUNK,
          flag="asks autograd for the gradient inside backward"),
    right(LINEAR, "each row's log-sum-exp saved (no double backward asked), gradients summed in place",
          source=_LSE_SAVED),
    right(LINEAR, "the rows of the gradient for hidden in a list, concatenated once",
          ("grad_hidden, grad_weight = torch.zeros_like(hidden), torch.zeros_like(weight)",
           "grad_hidden, grad_weight = [], torch.zeros_like(weight)"),
          ("grad_hidden = grad_hidden.index_add(0, rows, grad_logits @ weight)",
           "grad_hidden.append(grad_logits @ weight)"),
          ("return grad_hidden, grad_weight, None", "return torch.cat(grad_hidden), grad_weight, None")),
    right(LINEAR, "names every step of a chunk, keeping the last chunk's until each name is reused",
          ("""            logits = hidden[rows] @ weight.T  # one chunk of logits, gone after this iteration
            picked = logits.gather(-1, safe[rows].unsqueeze(-1)).squeeze(-1)
            losses.append(torch.logsumexp(logits, -1) - picked)""",
           """            logits = hidden[rows] @ weight.T
            top = logits.amax(-1, keepdim=True)
            shifted = logits - top
            e = shifted.exp()
            lse = e.sum(-1).log() + top.squeeze(-1)
            picked = logits.gather(-1, safe[rows].unsqueeze(-1)).squeeze(-1)
            losses.append(lse - picked)"""),
          ("            grad_logits = torch.softmax(hidden[rows] @ weight.T, -1) * s  # this chunk's logits, "
           "recomputed\n            grad_logits = grad_logits.scatter_add(-1, safe[rows].unsqueeze(-1), -s)",
           """            h = hidden[rows]
            logits = h @ weight.T
            top = logits.amax(-1, keepdim=True)
            shifted = logits - top
            e = shifted.exp()
            p = e / e.sum(-1, keepdim=True)
            onehot = torch.zeros_like(p).scatter(-1, safe[rows].unsqueeze(-1), 1.0)
            grad_logits = (p - onehot) * s""")),
]
