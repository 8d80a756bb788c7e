"""Functions written the way real projects write them, right and wrong, each with the example
inputs and the options its author would give `autograder.check_function`, and a reference
where one is natural. The right ones must pass with and without their reference; each wrong
one carries a mistake real code makes, and the words its failure must contain.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Real:
    label: str
    function: Any
    inputs: Callable[[torch.Generator], tuple]
    reference: Callable[..., Any] | None = None
    options: dict = field(default_factory=dict)
    # A wrong one: what its failure says (without a reference, then with it, where they differ).
    caught: str | tuple[str, str] = ""


# --- A straight-through estimator (quantization-aware training) ----------------------------

class RoundSTE(torch.autograd.Function):
    """Round in forward; pass the gradient straight through (as in QAT and VQ-VAE code)."""

    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


class SignSTE(torch.autograd.Function):
    """BinaryConnect's sign: the gradient passes where |x| <= 1 (a clipped straight-through)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sign(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * (x.abs() <= 1).to(grad_output.dtype)


class SigmoidSTE(torch.autograd.Function):
    """Wrong: the straight-through gradient taken from autograd, on a recomputed surrogate."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x > 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            (grad,) = torch.autograd.grad(torch.sigmoid(x), x, grad_output)
        return grad


def straight_round(x):
    return x + (x.round() - x).detach()


def clipped_sign(x):
    return x.clamp(-1, 1) + (torch.sign(x) - x.clamp(-1, 1)).detach()


# --- A fused bias + GELU (Megatron-LM's bias_gelu, tanh approximation) -----------------------

def _bias_gelu(bias, y):
    x = bias + y
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def _bias_gelu_back(g, bias, y):
    x = bias + y
    tanh_out = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    ff = 0.5 * x * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + tanh_out)
    return ff * g


class BiasGeLU(torch.autograd.Function):
    """Megatron-LM's GeLUFunction, as it is: the bias gradient is returned unreduced, and
    autograd's engine sums it down to the bias's shape."""

    @staticmethod
    def forward(ctx, input, bias):
        ctx.save_for_backward(input, bias)
        return _bias_gelu(bias, input)

    @staticmethod
    def backward(ctx, grad_output):
        input, bias = ctx.saved_tensors
        tmp = _bias_gelu_back(grad_output, bias, input)
        return tmp, tmp


class BiasGeLUReduced(BiasGeLU):
    """The same, reducing the bias gradient itself and skipping what nobody needs."""

    @staticmethod
    def backward(ctx, grad_output):
        input, bias = ctx.saved_tensors
        tmp = _bias_gelu_back(grad_output, bias, input)
        grad_input = tmp if ctx.needs_input_grad[0] else None
        grad_bias = tmp.sum(0) if ctx.needs_input_grad[1] else None
        return grad_input, grad_bias


class BiasGeLUFloat64(BiasGeLUReduced):
    """Wrong: computed in float64 "for stability", and not cast back to the input's dtype."""

    @staticmethod
    def forward(ctx, input, bias):
        ctx.save_for_backward(input, bias)
        return _bias_gelu(bias.double(), input.double())


class BiasGeLUCpuScale(BiasGeLUReduced):
    """Wrong: a per-feature scale made with torch.full, which lives on the CPU."""

    @staticmethod
    def forward(ctx, input, bias):
        ctx.save_for_backward(input, bias)
        return _bias_gelu(bias, input) * torch.full((input.shape[-1],), 1.0, dtype=input.dtype)


class BiasGeLUFlattened(BiasGeLUReduced):
    """Wrong: backward flattens grad_output with .view, as a fused kernel's wrapper would."""

    @staticmethod
    def backward(ctx, grad_output):
        input, bias = ctx.saved_tensors
        flat = _bias_gelu_back(grad_output.view(-1), bias.repeat(input.shape[0]), input.view(-1))
        tmp = flat.view(input.shape)
        return (tmp if ctx.needs_input_grad[0] else None), (tmp.sum(0) if ctx.needs_input_grad[1] else None)


def tanh_gelu(input, bias):
    return F.gelu(input + bias, approximate="tanh")


def _activations(generator):
    return (torch.randn(6, 4, generator=generator), torch.randn(4, generator=generator))


# --- A custom normalization (RMSNorm, as LLM code writes it by hand) -------------------------

class RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, grad_output):
        x, weight, rstd = ctx.saved_tensors
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            gw = grad_output * weight
            grad_x = rstd * (gw - x * rstd.pow(2) * (gw * x).mean(-1, keepdim=True))
        if ctx.needs_input_grad[1]:
            grad_weight = (grad_output * x * rstd).reshape(-1, x.shape[-1]).sum(0)
        return grad_x, grad_weight, None


class RMSNormAllGrads(RMSNorm):
    """Wrong: both gradients every time, whichever the caller needs (a frozen weight too)."""

    @staticmethod
    def backward(ctx, grad_output):
        x, weight, rstd = ctx.saved_tensors
        gw = grad_output * weight
        grad_x = rstd * (gw - x * rstd.pow(2) * (gw * x).mean(-1, keepdim=True))
        return grad_x, (grad_output * x * rstd).reshape(-1, x.shape[-1]).sum(0), None


class RMSNormStashed(RMSNorm):
    """Wrong: rstd kept as an attribute of ctx (invisible to autograd)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight)
        ctx.rstd = rstd
        return x * rstd * weight

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            gw = grad_output * weight
            grad_x = ctx.rstd * (gw - x * ctx.rstd.pow(2) * (gw * x).mean(-1, keepdim=True))
        if ctx.needs_input_grad[1]:
            grad_weight = (grad_output * x * ctx.rstd).reshape(-1, x.shape[-1]).sum(0)
        return grad_x, grad_weight, None


class RunningCenter(torch.autograd.Function):
    """Wrong: centres with a running mean it updates on every call (state between calls)."""

    running = None

    @staticmethod
    def forward(ctx, x):
        mean = x.detach().mean(0)
        old = RunningCenter.running
        RunningCenter.running = mean if old is None or old.shape != mean.shape else 0.9 * old + 0.1 * mean
        return x - RunningCenter.running

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _normalized(generator):
    return (torch.randn(2, 3, 8, generator=generator), 1 + 0.1 * torch.randn(8, generator=generator), 1e-6)


# --- A chunked loss (cross-entropy whose gradient is computed in forward, chunk by chunk) -----

class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over rows, computed a chunk of rows at a time so that no full softmax
    is ever alive besides the gradient, which forward computes and saves (as Liger's fused
    losses do): backward only scales it."""

    @staticmethod
    def forward(ctx, logits, target, chunk):
        n = logits.shape[0]
        loss = logits.new_zeros(())
        grad = torch.empty_like(logits)
        for start in range(0, n, chunk):
            rows = logits[start:start + chunk]
            lse = torch.logsumexp(rows, -1)
            picked = rows.gather(-1, target[start:start + chunk, None]).squeeze(-1)
            loss = loss + (lse - picked).sum()
            g = torch.softmax(rows, -1)
            g[torch.arange(g.shape[0]), target[start:start + chunk]] -= 1
            grad[start:start + chunk] = g / n
        ctx.save_for_backward(grad)
        return loss / n

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad * grad_output, None, None


_SEEN: list[torch.Tensor] = []  # a debugging list left in place


class ChunkedCrossEntropyLeaky(ChunkedCrossEntropy):
    """Wrong: every call's gradient appended to a module-level list, and never freed."""

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        _SEEN.append(grad)
        return grad * grad_output, None, None


class ChunkedCrossEntropySavesAll(ChunkedCrossEntropy):
    """Wrong: keeps the logits too, "in case backward needs them" (it does not)."""

    @staticmethod
    def forward(ctx, logits, target, chunk):
        loss = ChunkedCrossEntropy.forward(ctx, logits, target, chunk)
        ctx.save_for_backward(*ctx.to_save, logits)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        grad, _ = ctx.saved_tensors
        return grad * grad_output, None, None


def logits_only(logits, target, chunk):
    """What a chunked loss needs to keep: one gradient the size of the logits."""
    return logits.numel() * logits.element_size()


def cross_entropy(logits, target, chunk):
    return F.cross_entropy(logits, target)


def _scored(generator):
    return (3 * torch.randn(7, 5, generator=generator), torch.randint(0, 5, (7,), generator=generator), 3)


# --- Gradient reversal (domain-adversarial training) -----------------------------------------

class GradientReversal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lambd):
        ctx.lambd = lambd
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.neg() * ctx.lambd, None


class GradientReversalOnes(GradientReversal):
    """Wrong: the reversed gradient of ones, grad_output forgotten."""

    @staticmethod
    def backward(ctx, grad_output):
        return -ctx.lambd * torch.ones_like(grad_output), None


def reversal(x, lambd):
    return -lambd * x + ((1 + lambd) * x).detach()


# --- setup_context, vmap and forward-mode AD (torch.func style) ------------------------------

class Softplus(torch.autograd.Function):
    """softplus(x) = log(1 + exp(βx)) / β, stable for large βx; vmap rule generated, jvp."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, beta):
        return torch.where(beta * x > 20, x, torch.log1p(torch.exp(beta * x)) / beta)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, beta = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        ctx.beta = beta

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * torch.sigmoid(ctx.beta * x), None

    @staticmethod
    def jvp(ctx, x_t, beta_t):
        (x,) = ctx.saved_tensors
        return x_t * torch.sigmoid(ctx.beta * x)


class SoftplusNaive(Softplus):
    """Wrong: the slope as exp(βx) / (1 + exp(βx)), inf / inf = nan at large βx."""

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        e = torch.exp(ctx.beta * x)
        return grad_output * e / (1 + e), None


class SoftplusItem(Softplus):
    """Wrong: a Python number read from a tensor in forward, which vmap cannot batch."""

    @staticmethod
    def forward(x, beta):
        if x.max().item() > 20 / beta:
            return torch.where(beta * x > 20, x, torch.log1p(torch.exp(beta * x)) / beta)
        return torch.log1p(torch.exp(beta * x)) / beta


class SoftplusJvpForgetsBeta(Softplus):
    """Wrong: the tangent's slope without β."""

    @staticmethod
    def jvp(ctx, x_t, beta_t):
        (x,) = ctx.saved_tensors
        return x_t * torch.sigmoid(x)


class SoftplusJvpOverflows(Softplus):
    """Wrong: the tangent's slope as exp(βx) / (1 + exp(βx)), inf / inf = nan at large βx."""

    @staticmethod
    def jvp(ctx, x_t, beta_t):
        (x,) = ctx.saved_tensors
        e = torch.exp(ctx.beta * x)
        return x_t * e / (1 + e)


# --- A product whose kernel computes one gradient outside torch ------------------------------

class MulNumpyKernel(torch.autograd.Function):
    """Wrong, promised twice differentiable: the gradient for `x` comes from a NumPy kernel, a
    constant to autograd (gradgradcheck skips a gradient that requires no grad)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x, scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad_output):
        x, scale = ctx.saved_tensors
        grad_x = torch.from_numpy(grad_output.detach().cpu().numpy() * scale.detach().cpu().numpy()).to(x.device)
        return (grad_x if ctx.needs_input_grad[0] else None), (grad_output * x if ctx.needs_input_grad[1] else None)


def softplus(x, beta):
    return F.softplus(x, beta)


def _activated(generator):
    return (3 * torch.randn(5, 4, generator=generator), 2.0)


RIGHT = [
    Real("straight-through round", RoundSTE, lambda g: (3 * torch.randn(6, generator=g),), straight_round,
         {"surrogate_gradient": True}),
    Real("clipped straight-through sign", SignSTE, lambda g: (2 * torch.randn(6, generator=g),), clipped_sign,
         {"surrogate_gradient": True}),
    Real("Megatron's bias GELU, bias gradient summed by the engine", BiasGeLU, _activations, tanh_gelu),
    Real("bias GELU reducing its bias gradient", BiasGeLUReduced, _activations, tanh_gelu),
    Real("RMSNorm (saves rstd: once differentiable)", RMSNorm, _normalized, rms_norm, {"double_backward": False}),
    Real("chunked cross-entropy", ChunkedCrossEntropy, _scored, cross_entropy, {"double_backward": False}),
    Real("gradient reversal", GradientReversal, lambda g: (torch.randn(3, 4, generator=g), 0.5), reversal,
         {"surrogate_gradient": True}),
    Real("softplus with setup_context, vmap and jvp", Softplus, _activated, softplus),
]

WRONG = [
    Real("bias GELU promoting float32 to float64", BiasGeLUFloat64, _activations, tanh_gelu,
         caught="given float32 inputs, forward returned torch.float64"),
    Real("RMSNorm ignoring needs_input_grad", RMSNormAllGrads, _normalized, rms_norm, {"double_backward": False},
         caught="backward still computes a gradient for `weight`"),
    Real("RMSNorm stashing rstd on ctx", RMSNormStashed, _normalized, rms_norm, {"double_backward": False},
         caught="`ctx.rstd`"),
    Real("chunked cross-entropy keeping every gradient in a list", ChunkedCrossEntropyLeaky, _scored, cross_entropy,
         {"double_backward": False}, caught="kept by the global variable `_SEEN`"),
    Real("gradient reversal forgetting grad_output", GradientReversalOnes, lambda g: (torch.randn(3, 4, generator=g),
                                                                                      0.5),
         reversal, {"surrogate_gradient": True}, caught="not linear in grad_output"),
    Real("softplus with exp(βx) / (1 + exp(βx))", SoftplusNaive, _activated, softplus, caught="nan"),
    Real("softplus reading .item() in forward", SoftplusItem, _activated, softplus, caught="vmap"),
    Real("softplus whose jvp forgets β", SoftplusJvpForgetsBeta, _activated, softplus, caught="forward"),
    Real("product whose kernel computes the gradient for x in NumPy", MulNumpyKernel,
         lambda g: (torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)), torch.mul,
         caught=("with respect to grad_output differs from finite differences of your own forward",
                 "double backward is wrong")),
    Real("softplus whose jvp overflows to nan", SoftplusJvpOverflows,
         lambda g: (torch.tensor([[0.0, 800.0, -3.0], [1.5, -800.0, 2.0]]), 2.0), softplus,
         caught=("gradcheck(check_forward_ad=True) failed", "is nan where the right one is finite")),
    Real("bias GELU scaled by a tensor made on the CPU", BiasGeLUCpuScale, _activations, tanh_gelu,
         caught="on another device (meta"),
    Real("bias GELU flattening grad_output with .view", BiasGeLUFlattened, _activations, tanh_gelu,
         caught="not contiguous"),
    Real("centring with a running mean updated on every call", RunningCenter, lambda g: (torch.randn(4, 3,
                                                                                                      generator=g),),
         caught="called again with the same inputs"),
    Real("RMSNorm from a saved rstd, promised twice differentiable", RMSNorm, _normalized, rms_norm,
         caught=("gradgradcheck failed", "double backward is wrong")),
    Real("chunked cross-entropy keeping the logits too", ChunkedCrossEntropySavesAll, _scored, cross_entropy,
         {"double_backward": False, "max_saved_bytes": logits_only}, caught="more than the 280 allowed"),
    Real("straight-through sigmoid taken from autograd in backward", SigmoidSTE,
         lambda g: (torch.randn(6, generator=g),), lambda x: torch.sigmoid(x) + ((x > 0).to(x.dtype)
                                                                                 - torch.sigmoid(x)).detach(),
         {"surrogate_gradient": True}, caught="asks autograd"),
]
