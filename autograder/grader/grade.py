"""`autograder grade`: check the course and take it, start the warm workers, then grade
the course with them.

The workers (torch, IPython and the student side, imported once each) start as soon as
the options and the course are checked, and warm up while this process loads nbgrader
and prepares the first submissions (as many at once as there are cores but one: `Pool`).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console
from sqlalchemy.exc import OperationalError

from ..isolation import sandbox
from . import preflight, progress
from .pool import Pool, Workers
from .preflight import FAILED, GradingError
from .records import Options

if TYPE_CHECKING:
    from traitlets.config import Config

    from .class_report import Outcome
    from .cluster import ClusterIsolation
    from .discover import Submission


@dataclass
class Summary:
    outcomes: list[Outcome]  # one per submission graded (imported late: nbgrader loads while workers warm)
    skipped: list[Submission]  # graded before
    seconds: float
    isolation: sandbox.Isolation | ClusterIsolation


def run(options: Options, console: Console | None = None, scheduler: str | None = None) -> Summary:
    """Raises GradingError (its message is one line for the instructor). `scheduler`: the
    address of a Dask scheduler whose workers run the notebooks (see cluster.py)."""
    console = console or Console(file=sys.stderr)  # fixed: judges capture sys.stderr while they run
    started = time.monotonic()
    config = preflight.check(options, scheduler)
    lock = preflight.Lock(options.root)
    try:
        database = preflight.DatabaseLock.take(config)  # a gradebook on a server: one grader there too
        try:
            return _run(options, config, console, started, scheduler)
        finally:
            if database is not None:
                database.release()
    finally:
        lock.release()


def _run(options: Options, config: Config, console: Console, started: float, scheduler: str | None) -> Summary:
    # nbgrader runs `alembic` by name to set up a gradebook: the environment's own scripts first
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    # jsonschema (under nbformat) imports the optional rfc3987_syntax where it is installed
    # (JupyterLab brings it), which compiles a grammar: ~1 s, a third of the grader's
    # start-up. Nothing here checks the "iri" formats it adds; marked absent, it is skipped.
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # (None: import fails)
    pool: Workers | NoWorkers
    isolation: sandbox.Isolation | ClusterIsolation
    with progress.showing(console, started) as display:  # one status line from the first second
        if scheduler is not None:  # each Dask worker probes and warns for its own machine
            try:
                from .cluster import ClusterPool
            except ImportError as error:  # the `grading` extra is not installed
                raise GradingError(f"grading on a Dask cluster needs {error.name}: "
                                   "pip install -c constraints.txt -e '.[lab,grading]'") from None

            display.phase("reaching the Dask scheduler ...")
            pool = cluster = ClusterPool(scheduler, options, console)
        else:
            display.phase("probing the sandbox ...")
            isolation = sandbox.detect(options.sandbox, options.root)
            for warning in isolation.warnings():
                console.print(f"[bold red]WARNING[/] {warning}")
            if _feedback_only(options, config):
                pool = NoWorkers()
            else:
                display.phase(f"starting {options.jobs} worker{'s' * (options.jobs != 1)}, loading nbgrader ...")
                pool = Pool(options.jobs, isolation, options.root, options.limits)
        with pool:
            from . import class_report, course  # nbgrader and nbconvert load while the workers warm up

            try:
                # (NoWorkers only when everything is graded already: it is never asked to run anything)
                outcomes, skipped = course.grade_submissions(options, config, pool, console)  # type: ignore[arg-type]
            except OperationalError as error:
                raise GradingError(f"the gradebook could not be used ({str(error).strip().splitlines()[0][:200]}): "
                                   "if formgrader or another program is writing to it, wait and run again",
                                   FAILED) from None
    if scheduler is not None:
        isolation = cluster.isolation
    summary = Summary(outcomes, skipped, time.monotonic() - started, isolation)
    console.print(class_report.summary(outcomes, skipped, summary.seconds, isolation.summary()))
    late = class_report.late_work(outcomes)
    if late is not None:
        console.print(late)
    if any(o.problems for o in outcomes):
        console.print(class_report.problems(outcomes))
    for warning in isolation.warnings():
        console.print(f"[bold red]WARNING[/] {warning}")
    return summary


def _feedback_only(options: Options, config: Config) -> bool:
    """--feedback when every submission asked for is graded already: no worker is needed."""
    if not options.feedback or options.force:
        return False
    from nbgrader.coursedir import CourseDirectory

    from . import discover

    progress.phase("finding what is left to grade ...")
    coursedir = CourseDirectory(config=config)
    found = discover.find(coursedir, options.assignments, options.students)
    return bool(found) and all(discover.is_done(coursedir, s) for s in found)


class NoWorkers:
    """The pool of a run with nothing to grade: it starts no process."""

    size = 0

    def close(self) -> None:
        pass

    def __enter__(self) -> "NoWorkers":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass
