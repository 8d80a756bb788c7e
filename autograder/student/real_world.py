"""Notebook 09_real_world in the student's process: training the student's classifier.

While the classifier is graded, the names `Swish` and `LogSumExp` of the student's notebook
stand for the course's stand-ins, so that the model is graded independently of exercises
9.1 and 9.2 (which grade the student's own Functions):

- `SwishStandIn` is x·σ(βx), as the notebook defines Swish, differentiated by autograd:
  nothing of the exercise's answer (its backward formula) is in this file;
- `LogSumExpStandIn` is torch's own `torch.logsumexp`, counted.

Both record how the model called them (best effort: the student's process reports it).
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import asdict
from typing import Any, Iterator

import torch

from . import probe

STAND_INS = ("Swish", "LogSumExp")


class _Calls:
    """How the model called the stand-ins while one classifier was trained."""

    def __init__(self) -> None:
        self.swish = 0
        self.betas: list[torch.Tensor] = []  # the beta of each Swish call (the objects)
        self.logsumexp = 0
        self.dims: list[Any] = []


_calls: _Calls | None = None


def _swish(x: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(beta * x)  # Swish as the notebook defines it


class SwishStandIn(torch.autograd.Function):
    """Stands in for the notebook's Swish(x, beta) while the classifier is graded: the
    composite's values, and its gradients as autograd finds them."""

    @staticmethod
    def forward(ctx: Any, x: Any, beta: Any) -> Any:
        if _calls is not None:
            _calls.swish += 1
            _calls.betas.append(beta)
        ctx.save_for_backward(x, beta)
        return _swish(x, beta.to(x.dtype))

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        x, beta = ctx.saved_tensors
        with torch.enable_grad():
            x, cast = x.detach().requires_grad_(), beta.detach().to(x.dtype).requires_grad_()
            grad_x, grad_beta = torch.autograd.grad(_swish(x, cast), (x, cast), grad_output.to(x.dtype))
        return grad_x, grad_beta.to(beta.dtype)


class LogSumExpStandIn:
    """Stands in for the notebook's LogSumExp(x, dim): torch.logsumexp, counted."""

    @staticmethod
    def apply(x: torch.Tensor, dim: Any) -> torch.Tensor:
        if _calls is not None:
            _calls.logsumexp += 1
            _calls.dims.append(dim if isinstance(dim, int) else repr(dim))
        return torch.logsumexp(x, dim)


def _namespace(model_class: Any) -> dict[str, Any]:
    """The globals the model's methods look names up in (the notebook's)."""
    for name in ("forward", "loss", "__init__"):
        method = getattr(model_class, name, None)
        found = getattr(inspect.unwrap(method), "__globals__", None) if method is not None else None
        if isinstance(found, dict):
            return found
    return {}


@contextlib.contextmanager
def standing_in(model_class: Any) -> Iterator[list[str]]:
    """While the block runs, the notebook's `Swish` and `LogSumExp` are the stand-ins (also
    where the notebook does not define them); yields the names of the student's own that
    were replaced."""
    namespace = _namespace(model_class)
    own = {name: namespace[name] for name in STAND_INS if name in namespace}
    namespace.update({"Swish": SwishStandIn, "LogSumExp": LogSumExpStandIn})
    try:
        yield sorted(name for name, value in own.items() if value is not None)
    finally:
        for name in STAND_INS:
            if name in own:
                namespace[name] = own[name]
            else:
                namespace.pop(name, None)


@probe.procedure
def train_classifier(model_class: Any, x: torch.Tensor, y: torch.Tensor, settings: dict[str, Any]) -> dict[str, Any]:
    """Build `model_class(n_in, hidden, classes)` with torch's generator seeded, then train it
    full-batch with Adam on (x, y) for `steps` steps, minimising `model.loss(x, y)`.

    Returns the logits and the model's own loss before training, the logits after, and
    how the model used Swish and LogSumExp (best effort)."""
    global _calls
    hidden, classes, steps, lr, seed = (settings[k] for k in ("hidden", "classes", "steps", "lr", "seed"))
    stage = "SwishClassifier(...)"
    calls = _Calls()
    _calls = calls
    try:
        with standing_in(model_class) as replaced:
            torch.manual_seed(seed)
            model = model_class(x.shape[1], hidden, classes)
            parameters = [(name, list(p.shape)) for name, p in model.named_parameters()]
            stage = "model(x)"
            logits0 = model(x)
            swish_calls = calls.swish
            if not isinstance(logits0, torch.Tensor) or tuple(logits0.shape) != (x.shape[0], classes):
                shape = tuple(logits0.shape) if isinstance(logits0, torch.Tensor) else type(logits0).__name__
                raise TypeError(f"model(x) returned {shape}, expected logits of shape {(x.shape[0], classes)}")
            stage = "model.loss(x, y)"
            loss0 = model.loss(x, y)
            if not isinstance(loss0, torch.Tensor) or loss0.dim() != 0:
                raise TypeError(f"model.loss(x, y) returned {type(loss0).__name__} "
                                f"{tuple(loss0.shape) if isinstance(loss0, torch.Tensor) else ''}, not a 0-d tensor")
            own = {id(p) for p in model.parameters()}
            betas = [{"shape": list(b.shape), "parameter": id(b) in own, "requires_grad": bool(b.requires_grad)}
                     for b in calls.betas[:swish_calls]]
            before = {name: p.detach().clone() for name, p in model.named_parameters()}
            stage = "training"
            optimizer = torch.optim.Adam(model.parameters(), lr=lr)
            for _ in range(steps):
                optimizer.zero_grad()
                loss = model.loss(x, y)
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                logits = model(x)
            changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    except Exception as exc:  # the student's code may raise anything
        return {"error": asdict(probe.ProbeError.of(stage, exc))}
    finally:
        _calls = None
    return {
        "error": None,
        "replaced": replaced,
        "parameters": parameters,
        "changed": changed,
        "logits0": logits0.detach(),
        "loss0": float(loss0.detach()),
        "logits": logits.detach(),
        "swish_calls": swish_calls,
        "betas": betas,
        "logsumexp_calls": calls.logsumexp,
        "dims": calls.dims[:8],
    }
