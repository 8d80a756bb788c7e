"""Seeded float64 inputs for checks, kept away from points where a derivative jumps.

Every input a check draws comes from a recorded seed. In a notebook's own kernel a check
uses the seed it is given (`seed=0` in the visible checks, so a student sees the same
inputs on every run; `seed=None` takes the next of a fixed sequence). When grading, the
grader runs each test cell inside `seeded(cell_seed(...))`: every check of the cell then
draws from a seed derived from the course's secret, the assignment, the notebook and the
cell (and from the check's own seed and its place in the cell) — the same for every
student, so two students with the same bug get the same score and a regrade is identical,
and unknown to the students, so inputs they have seen gain them nothing.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import hmac
import itertools
from typing import Iterator, Sequence

import torch

# The seed of the test cell being judged and the number of seeds drawn from it so far (per
# thread: the grader judges several notebooks at once).
_cell: contextvars.ContextVar[tuple[int, Iterator[int]] | None] = contextvars.ContextVar("cell_seed", default=None)
_unseeded = itertools.count()  # `seed=None` outside a judged cell: a fixed sequence


def cell_seed(secret: bytes, *names: str) -> int:
    """The seed of one test cell's checks, from the course's secret and the cell's names
    (assignment, notebook, grade_id)."""
    return int.from_bytes(hmac.new(secret, "/".join(names).encode(), hashlib.sha256).digest()[:8], "big") >> 1


def _derived(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest(), "big") >> 1


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Judge a test cell: its checks draw from `seed` (see the module's docstring)."""
    token = _cell.set((seed, itertools.count()))
    try:
        yield
    finally:
        _cell.reset(token)


def seed_of(seed: int | None) -> int:
    """The seed a check uses (see the module's docstring). (Not torch.seed(): it would
    reseed the global generator, which the notebook's own examples use.)"""
    judged = _cell.get()
    if judged is not None:
        base, drawn = judged
        return _derived(base, next(drawn), seed)
    return _derived("unseeded", next(_unseeded)) if seed is None else seed


def generator(seed: int | None) -> torch.Generator:
    """The random generator a check draws its inputs from (see `seed_of`)."""
    found = torch.Generator()
    found.manual_seed(seed_of(seed))
    return found


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


def including(x: torch.Tensor, values: Sequence[float], generator: torch.Generator) -> torch.Tensor:
    """`x` with `values` at positions drawn from `generator`: special points (zero, a large
    magnitude, exactly a kink for a forward-only case) present in every draw, never left to
    chance, and never in the same places: an answer cannot tell a check's input by where its
    special points are, nor be right only there."""
    found = x.clone()
    flat = found.view(-1)
    n = min(len(values), flat.numel())
    places = torch.randperm(flat.numel(), generator=generator)[:n]
    flat[places] = torch.tensor(list(values)[:n], dtype=x.dtype)
    return found


def among(values: Sequence[float] | torch.Tensor, generator: torch.Generator, others: int = 3) -> torch.Tensor:
    """The special points `values` at random places among `others` standard-normal values
    (float64, one dimension): a case of special points that no answer can recognise by its
    layout."""
    special = values.tolist() if isinstance(values, torch.Tensor) else list(values)
    return including(normal((len(special) + others,), generator), special, generator)
