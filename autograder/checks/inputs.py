"""Seeded float64 inputs for checks, kept away from points where a derivative jumps."""
from __future__ import annotations

import contextlib
import contextvars
import secrets
from typing import Iterator, Sequence

import torch

# Set while the grader re-runs checks: every check draws new inputs (per thread: the
# grader judges several notebooks at once).
_fresh = contextvars.ContextVar("fresh_inputs", default=False)


def seed_of(seed: int | None) -> int:
    """The seed a check uses: `seed` (reproducible inputs, as in the visible checks), or a
    fresh one for `None` — and always a fresh one in `fresh_inputs()`. (Not torch.seed(): it
    would reseed the global generator, which the notebook's own examples use.)"""
    return secrets.randbits(63) if seed is None or _fresh.get() else seed


def generator(seed: int | None) -> torch.Generator:
    """The random generator a check draws its inputs from (see `seed_of`)."""
    found = torch.Generator()
    found.manual_seed(seed_of(seed))
    return found


@contextlib.contextmanager
def fresh_inputs() -> Iterator[None]:
    """Checks draw inputs nobody could have seen (the grader's trusted re-run), so code that
    recognises the visible checks' inputs gains nothing."""
    token = _fresh.set(True)
    try:
        yield
    finally:
        _fresh.reset(token)


def uniform(
    shape: Sequence[int],
    generator: torch.Generator,
    low: float = -2.0,
    high: float = 2.0,
    *,
    kinks: Sequence[float] = (),
    margin: float = 0.05,
) -> torch.Tensor:
    """Uniform float64 values in [low, high), none closer than `margin` to a kink.

    Finite differences straddling a kink (relu at 0, a clip value) measure an average of
    two slopes, so gradcheck would fail a correct backward there.
    """
    x = low + (high - low) * torch.rand(tuple(shape), generator=generator, dtype=torch.float64)
    for k in kinks:
        d = x - k
        x = torch.where(d.abs() < margin, k + torch.where(d >= 0, margin, -margin), x)
    return x


def normal(shape: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float64)


def including(x: torch.Tensor, values: Sequence[float]) -> torch.Tensor:
    """`x` with its first entries (in memory order) set to `values`: special points (zero, a
    large magnitude, exactly a kink for a forward-only case) present in every draw, never
    left to chance."""
    found = x.clone()
    flat = found.view(-1)
    n = min(len(values), flat.numel())
    flat[:n] = torch.tensor(list(values)[:n], dtype=x.dtype)
    return found
