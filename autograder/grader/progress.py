"""What an instructor watches while a class is graded: how far it is, what is running now,
and how long the rest will take.

The estimate is the median time a submission has taken so far, times the submissions not
started yet, shared by the workers, plus what the running ones have left: the median minus
what they have run — or, for one slower than that, as long again as it has run — and never
more than what its time limit leaves: a hanging notebook ends at its limit, so it cannot
make the estimate a lie for long.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text


class Estimate:
    """Seconds left for `total` submissions on `workers` workers, each within `limit` seconds."""

    def __init__(self, total: int, workers: int, limit: float) -> None:
        self.total, self.workers, self.limit = total, workers, limit
        self.durations: list[float] = []

    def finished(self, seconds: float) -> None:
        self.durations.append(seconds)

    def left(self, running: list[float]) -> float | None:
        """`running`: how long each running submission has run."""
        if not self.durations:
            return None
        typical = statistics.median(self.durations)
        queued = self.total - len(self.durations) - len(running)
        rest = [min(typical - age if age < typical else age, max(self.limit - age, 0.0)) for age in running]
        return (max(queued, 0) * typical + sum(rest)) / self.workers


class _Left(ProgressColumn):
    def __init__(self, left: Callable[[], float | None]) -> None:
        super().__init__()
        self.left = left

    def render(self, task) -> Text:
        seconds = self.left()
        if seconds is None:
            return Text("left -:--:--")
        return Text(f"left {time.strftime('%H:%M:%S', time.gmtime(seconds))}")


class Tracker:
    """The progress bar of one run; `update` after each submission is saved."""

    def __init__(self, console: Console, total: int, workers: int, limit: float,
                 running: Callable[[], dict[str, float]]) -> None:
        self.estimate = Estimate(total, workers, limit)
        self.running = running  # key -> when it started
        self.bar = Progress(TextColumn("[bold]Grading"), BarColumn(), MofNCompleteColumn(), TextColumn("elapsed"),
                            TimeElapsedColumn(), _Left(self._left), TextColumn("{task.description}"), console=console)
        self.task = self.bar.add_task(f"starting {workers} worker{'s' * (workers != 1)} ...", total=total)

    def _left(self) -> float | None:
        now = time.monotonic()
        return self.estimate.left([now - since for since in self.running().values()])

    def update(self, seconds: float) -> None:
        """One more submission saved; it took `seconds` from start to end."""
        self.estimate.finished(seconds)
        now = time.monotonic()
        running = sorted(self.running().items(), key=lambda item: item[1])
        shown = ", ".join(f"{key} ({now - since:.0f} s)" for key, since in running[:3])
        self.bar.update(self.task, advance=1, description=f"running: {shown}" if shown else "")

    def __enter__(self) -> "Tracker":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)
