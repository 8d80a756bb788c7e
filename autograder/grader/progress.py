"""What an instructor watches while a class is graded: one status line from the run's first
second to its end — what it does now, the time since it started, and while notebooks run,
how far it is, what is running and how long the rest will take.

The estimate is the median time a submission has taken so far, times the submissions not
started yet, shared by the workers, plus what the running ones have left: the median minus
what they have run — or, for one slower than that, as long again as it has run — and never
more than what its time limit leaves: a hanging notebook ends at its limit, so it cannot
make the estimate a lie for long.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.table import Column
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


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(max(seconds, 0.0)))


class _Text(ProgressColumn):
    """A column whose text comes from a function, kept whole (never cut to make room)."""

    def __init__(self, text: Callable[[], str]) -> None:
        super().__init__(table_column=Column(no_wrap=True))
        self.text = text

    def render(self, task: Task) -> Text:
        return Text(self.text())


class Display:
    """The one status line of a run, from its first second to its end: what is happening now,
    the time since the run started (the summary's own clock), and while grading the count
    done, a bar and the time left. It fits the terminal's width (80 columns included): the
    description gives way, with an ellipsis; the numbers never do. `label` names the run
    ("Grading", "Replaying")."""

    def __init__(self, console: Console, started: float, label: str = "Grading") -> None:
        self.started = started
        self.estimate: Estimate | None = None
        self.running: Callable[[], dict[str, float]] = dict
        self.done = 0
        self.bar = Progress(
            TextColumn(f"[bold]{label}"), BarColumn(bar_width=10), _Text(self._count), _Text(self._elapsed),
            _Text(self._left), TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis",
                                                                                  ratio=1)),
            console=console, expand=True,
        )
        self.task = self.bar.add_task("", total=None)

    def phase(self, description: str) -> None:
        """Say what the run does now (before and after the notebooks run)."""
        self.bar.update(self.task, description=description)

    def grading(self, total: int, workers: int, limit: float, running: Callable[[], dict[str, float]]) -> None:
        """`total` submissions are about to run on `workers` workers, each within `limit` seconds;
        `running()`: key -> when it started (time.monotonic)."""
        self.estimate, self.running, self.done = Estimate(total, workers, limit), running, 0
        self.bar.update(self.task, total=total, completed=0)

    def finished(self, seconds: float) -> None:
        """One more submission saved; it took `seconds` from start to end."""
        assert self.estimate is not None
        self.estimate.finished(seconds)
        self.done += 1
        now = time.monotonic()
        running = sorted(self.running().items(), key=lambda item: item[1])
        shown = ", ".join(f"{key} ({now - since:.0f} s)" for key, since in running[:3])
        self.bar.update(self.task, completed=self.done, description=f"running {shown}" if shown else "")

    def _count(self) -> str:
        return f"{self.done}/{self.estimate.total}" if self.estimate else ""

    def _elapsed(self) -> str:
        return _clock(time.monotonic() - self.started)

    def _left(self) -> str:
        if self.estimate is None:
            return ""
        now = time.monotonic()
        seconds = self.estimate.left([now - since for since in self.running().values()])
        return "left -:--:--" if seconds is None else f"left {_clock(seconds)}"

    def __enter__(self) -> "Display":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)


_shown: list[Display] = []  # the run's display, while `showing` holds it


@contextlib.contextmanager
def showing(console: Console, started: float, label: str = "Grading") -> Iterator[Display]:
    """The run's status line, shown from now on (its clock from `started`); `current()` finds it."""
    with Display(console, started, label) as display:
        _shown.append(display)
        try:
            yield display
        finally:
            _shown.remove(display)


def current() -> Display | None:
    """The run's display, if one is shown."""
    return _shown[-1] if _shown else None


def phase(description: str) -> None:
    """Say what the run does now, on the run's status line if there is one."""
    if _shown:
        _shown[-1].phase(description)


class Tracker:
    """The grading part of a run's status line (the run's own line, or one of its own when
    there is none); `update` after each submission is saved."""

    def __init__(self, console: Console, total: int, workers: int, limit: float,
                 running: Callable[[], dict[str, float]]) -> None:
        display = current()
        self.own = display is None
        if display is None:
            display = Display(console, time.monotonic())
        self.display = display
        self.display.grading(total, workers, limit, running)
        self.display.phase(f"starting {workers} worker{'s' * (workers != 1)} ...")

    def update(self, seconds: float) -> None:
        self.display.finished(seconds)

    def __enter__(self) -> "Tracker":
        if self.own:
            self.display.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.own:
            self.display.__exit__(*exc)
