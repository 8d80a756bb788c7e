"""Device bugs, for every exercise whose checks run on each device: answers that are right on
the CPU and wrong on a GPU, by notebook (for_notebook adds them to the notebook's own).

`device` says which run catches each: "meta" (the checks' run of a Function on the meta
device, on any machine: a tensor made on the CPU meets the inputs, or an output or a
gradient comes back on the CPU), "cuda" (only a run on a GPU: checks with no meta run; an
operation whose meta kernel checks no device, as matmul; a forward-mode tangent; a custom
op, whose meta run is its fake kernel), "cpu" (a device hard-coded to CUDA fails on the CPU
already). test_grading.py skips the "cuda" ones, visibly, where there
is no GPU; `make gpu-check` grades them all on one. The exercises of notebooks 01 and 02 are
left out: their checks run the tape's values on the CPU only.
"""
from . import right, wrong

_THREAD_LOCAL_METER = """
import threading
import weakref

from torch.utils._pytree import tree_leaves


class BackwardMemory(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.mine = threading.local()  # a log and counts per thread
        self.blocks = {}

    def counts(self):
        if not hasattr(self.mine, "log"):
            self.mine.log, self.mine.now, self.mine.peak = [], 0, 0
        return self.mine

    log = property(lambda self: self.counts().log)
    now = property(lambda self: self.counts().now)
    peak = property(lambda self: self.counts().peak)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        created = 0
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given | set(self.blocks):
                block = t.untyped_storage()
                self.blocks[block.data_ptr()] = block.nbytes()
                weakref.finalize(block, self.freed, block.data_ptr())
                created += block.nbytes()
        mine = self.counts()
        mine.now += created
        mine.peak = max(mine.peak, mine.now)
        mine.log.append((func, created))
        return out

    def freed(self, address):
        self.counts().now -= self.blocks.pop(address)
"""

MUTANTS = {
    "03_function_basics": [
        wrong("clipped_relu", "gradient moved to the CPU",
              ("return grad_output * inside, None", "return (grad_output * inside).cpu(), None"), device="meta"),
        wrong("linear", "bias gradient summed into zeros made on the CPU",
              ("grad_bias = grad_output.sum(0)",
               "grad_bias = torch.zeros(grad_output.shape[1], dtype=grad_output.dtype) + grad_output.sum(0)"),
              device="meta"),
        wrong("linear", "output sent to the GPU with .cuda()", ("return output", "return output.cuda()"), device="cpu"),
        wrong("polar_to_cartesian", "outputs moved to the CPU in forward",
              ("return r * torch.cos(theta), r * torch.sin(theta)",
               "return (r * torch.cos(theta)).cpu(), (r * torch.sin(theta)).cpu()"), device="meta"),
    ],
    "04_gradient_patterns": [
        wrong("gelu", "a ones tensor made on the CPU in backward",
              ("return grad_output * (normal_cdf(x) + x * normal_pdf(x))",
               "return grad_output * (normal_cdf(x) + x * normal_pdf(x)) * torch.ones(x.shape, dtype=x.dtype)"),
              device="meta"),
        wrong("batched_matmul", "output preallocated on the CPU (out=)",
              ("return a @ b",
               "return torch.matmul(a, b, out=torch.empty(a.shape[:-1] + b.shape[-1:], dtype=a.dtype))"),
              device="cuda"),
        wrong("unbroadcast", "returns its result on the CPU",
              ("return grad.reshape(shape)", "return grad.reshape(shape).cpu()"), device="cuda"),
        wrong("affine", "bias gradient added to zeros made on the CPU",
              ("unbroadcast(grad_output, ctx.bias_shape)",
               "torch.zeros(ctx.bias_shape, dtype=grad_output.dtype) + unbroadcast(grad_output, ctx.bias_shape)"),
              device="meta"),
        wrong("mean", "1/n as a tensor of the input's shape made on the CPU",
              ("return grad_output.expand(ctx.shape) / ctx.shape[ctx.dim], None, None",
               "return grad_output.expand(ctx.shape) * torch.full(ctx.shape, 1 / ctx.shape[ctx.dim], "
               "dtype=grad_output.dtype), None, None"), device="meta"),
        wrong("max", "the mask of maxima kept on the CPU",
              ("is_max = x == out", "is_max = (x == out).cpu()"), device="meta"),
        wrong("conv2d", "bias gradient added to zeros made on the CPU",
              ("grad_bias = grad_output.sum((0, 2, 3))",
               "grad_bias = torch.zeros(weight.shape[0], dtype=weight.dtype) + grad_output.sum((0, 2, 3))"),
              device="meta"),
    ],
    "05_gradcheck": [
        wrong("softmax", "row sums by a matmul with ones made on the CPU (the meta device's matmul checks no device)",
              ("(grad_output * y).sum(-1, keepdim=True)",
               "(grad_output * y) @ torch.ones(y.shape[-1], 1, dtype=y.dtype)"),
              device="cuda"),
        wrong("sincos", "gradient moved to the CPU",
              ("return grad_sin * x.cos() - grad_cos * x.sin()",
               "return (grad_sin * x.cos() - grad_cos * x.sin()).cpu()"),
              device="meta"),
        wrong("lerp", "1 - weight with ones made on the CPU",
              ("grad_output * (1 - weight)", "grad_output * (torch.ones(weight.shape, dtype=weight.dtype) - weight)"),
              device="meta"),
        wrong("max_gradient_error", "grad_output of ones made on the CPU",
              ("torch.autograd.grad(out, x, torch.ones_like(out))",
               "torch.autograd.grad(out, x, torch.ones(out.shape, dtype=out.dtype))"), device="cuda"),
    ],
    "06_save_for_backward": [
        wrong("sigmoid", "1 - y with ones made on the CPU",
              ("return grad_output * y * (1 - y)", "return grad_output * y * (torch.ones(y.shape, dtype=y.dtype) - y)"),
              device="meta"),
        wrong("tanh_inplace", "gradient moved to the CPU",
              ("return grad_output * (1 - y * y)", "return (grad_output * (1 - y * y)).cpu()"), device="meta"),
        wrong("sort", "gradient scattered into zeros made on the CPU",
              ("torch.zeros_like(grad_values).scatter",
               "torch.zeros(grad_values.shape, dtype=grad_values.dtype).scatter"),
              device="meta"),
    ],
    "06_views_and_inplace": [
        wrong("softmax_inplace", "the row sums moved to the CPU",
              ("return y * (grad_output - inner)", "return y * (grad_output - inner.cpu())"), device="meta"),
    ],
    "07_double_backward": [
        wrong("sinh_fixed", "the halving by a tensor of x's shape made on the CPU",
              ("return grad_out * (torch.exp(x) + torch.exp(-x)) / 2",
               "return grad_out * (torch.exp(x) + torch.exp(-x)) / torch.full(x.shape, 2.0, dtype=x.dtype)"),
              device="meta"),
        wrong("sinh_intermediates", "gradient moved to the CPU",
              ("return grad_x + grad_expx * expx - grad_expnegx * expnegx",
               "return (grad_x + grad_expx * expx - grad_expnegx * expnegx).cpu()"), device="meta"),
        wrong("cube_backward", "the factor 6 as a tensor made on the CPU",
              ("grad_x = grad * grad_out * 6 * x",
               "grad_x = grad * grad_out * torch.full(x.shape, 6.0, dtype=x.dtype) * x"),
              device="meta"),
        wrong("hvp", "v moved to the CPU", ("grad_outputs=v)", "grad_outputs=v.cpu())"), device="cuda"),
    ],
    "07_engine_and_dispatcher": [
        wrong("clip_gradients", "the factor as a tensor of the gradient's shape made on the CPU",
              ("            return grad * (max_norm / norm)  # a new tensor: the incoming one may be shared",
               "            return grad * torch.full(grad.shape, float(max_norm / norm), dtype=grad.dtype)"),
              device="cuda"),
        wrong("backward_memory", "counts in thread-local storage: the engine's CUDA thread has its own",
              source=_THREAD_LOCAL_METER, device="cuda"),
    ],
    "08_memory": [
        wrong("leaky_relu", "the mask offloaded to the CPU", ("positive = x > 0", "positive = (x > 0).cpu()"),
              device="meta"),
        wrong("linear_relu", "bias gradient added to zeros made on the CPU",
              ("grad_bias = g.sum(0)", "grad_bias = torch.zeros(g.shape[1], dtype=g.dtype) + g.sum(0)"), device="meta"),
    ],
    "08_memory_checkpointing": [
        wrong("manual_checkpoint", "restores the CPU's random state only",
              ("ctx.devices = sorted({t.device.index or 0 for t in inputs if t.is_cuda})", "ctx.devices = []"),
              device="cuda"),
    ],
    "09_real_world": [
        wrong("swish", "beta's gradient added to zeros made on the CPU",
              ("grad_beta = (grad_output", "grad_beta = torch.zeros(beta.shape, dtype=beta.dtype) + (grad_output"),
              device="meta"),
        wrong("logsumexp", "output moved to the CPU",
              ("ctx.dim = dim\n        return out", "ctx.dim = dim\n        return out.cpu()"), device="meta"),
        wrong("grad_reverse", "-alpha as a tensor made on the CPU",
              ("return -ctx.alpha * grad_output, None",
               "return torch.full(grad_output.shape, -ctx.alpha, dtype=grad_output.dtype) * grad_output, None"),
              device="meta"),
        wrong("fixed_point", "iterates from zeros made on the CPU",
              ("z = torch.zeros_like(x)", "z = torch.zeros(x.shape, dtype=x.dtype)"), device="meta"),
    ],
    "10_modern_api": [
        wrong("clipped_relu", "gradient moved to the CPU",
              ("return grad_output * ((x > 0) & (x < ctx.clip)), None",
               "return (grad_output * ((x > 0) & (x < ctx.clip))).cpu(), None"), device="meta"),
        wrong("swish_jvp", "tangent moved to the CPU",
              ("return x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)",
               "return (x_t * (s + beta * x * s * (1 - s)) + beta_t * x * x * s * (1 - s)).cpu()"), device="cuda"),
        wrong("logsumexp_op", "NumPy's result not moved back to the input's device (meta runs the fake kernel)",
              ("return torch.from_numpy(np.asarray(out)).to(device=x.device, dtype=x.dtype)",
               "return torch.from_numpy(np.asarray(out)).to(dtype=x.dtype)"), device="cuda"),
    ],
    "11_capstone": [
        wrong("fused_cross_entropy", "gradient moved to the CPU",
              ("return grad, None, None, None, None", "return grad.cpu(), None, None, None, None"), device="meta"),
    ],
}

# Device-generic code that looks like a device bug and is not: it must keep every point.
VARIANTS = {
    "04_gradient_patterns": [
        right("batched_matmul", "backward computed on the CPU and moved back to the input's device",
              ("return grad_output @ b.mT, a.mT @ grad_output",
               "return (grad_output.cpu() @ b.mT.cpu()).to(a.device), (a.mT.cpu() @ grad_output.cpu()).to(b.device)")),
    ],
    "07_double_backward": [
        right("sinh_fixed", "halved by a 0-d tensor made on the CPU (a 0-d tensor mixes with any device)",
              ("return grad_out * (torch.exp(x) + torch.exp(-x)) / 2",
               "return grad_out * (torch.exp(x) + torch.exp(-x)) / torch.tensor(2.0, dtype=x.dtype)")),
    ],
}
