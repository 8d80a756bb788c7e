"""Grading on a Dask cluster (`autograder grade --scheduler ADDRESS`): the notebooks run
on Dask workers, the gradebook is written here, by this one process, as always.

Each Dask worker grades as the local grader does: a worker plugin (`Grading`) starts a
`pool.Pool` of warm, sandboxed workers on its machine — one per Dask thread — and each
Dask task (`grade_submission`: the notebooks of one submission) runs there, its notebook
cells in the sandbox and its test cells judged by the trusted checks in that Dask worker's
own process. Only plain data travels: to the worker, the notebook's code cells, the files
handed in beside it and the instructor's test cells (from this gradebook); back, the
`Run` of each notebook as a dict — outputs, verdicts, flags, reasons, timings. The
autograded notebook is put together and saved here (`course._grade_all`), one gradebook
transaction per submission.

`ClusterPool` has the interface of `pool.Pool` (`size`, `preload`, `submit`, `result`,
`running`, `close`), so the course is graded by the same loop either way. It uses Dask's
own mechanisms: the plugin (sent again by the scheduler to every worker that joins or is
restarted), futures with `as_completed`, task retries, the scheduler rescheduling the
tasks of a worker that died (a task is idempotent: nothing is written until its result is
here, and a future yields its result once, so nothing is lost or saved twice), and events
(`log_event`) for what runs now. A lost scheduler stops the run (exit code 4): what was
saved stays saved, and running again grades only what is left.

Every machine must have the same environment (this package, torch, Python): the checks
that judge run there. A worker whose package differs (`fingerprint`) is refused, so that
no score depends on which machine graded it. The checks hold the hidden tests and
references, so Dask workers must be the instructor's machines, as this one is.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import hashlib
import importlib.metadata
import logging
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from distributed import Client, WorkerPlugin, as_completed, get_worker
from distributed.scheduler import KilledWorker
from rich.console import Console

import autograder

from ..isolation import sandbox
from ..isolation.limits import Limits
from ..student.probe import first_line
from .pool import STARTUP, Pool
from .preflight import FAILED, USAGE, GradingError
from .records import Cell, Options, Program, Run, Verdict

if TYPE_CHECKING:
    from dask.typing import Key

CONNECT = 20.0  # seconds to reach the scheduler
WORKERS = 120.0  # seconds to wait for a first Dask worker, and without any worker during a run
RETRIES = 2  # of a task that raised (the grading plugin not ready on that worker): elsewhere, or once it is
CHECK_EVERY = 5.0  # seconds between looks at the cluster while waiting for results
PACKAGE = Path(autograder.__file__).resolve().parent


class DifferentVersion(Exception):
    """A Dask worker's environment differs from the grader's (the message says how)."""


@functools.cache
def fingerprint() -> dict[str, str]:
    """What decides a verdict besides the notebook: this package's code, torch, Python. Taken
    once per process, before it imports the checks: a Dask worker that outlives an upgrade
    keeps the code it loaded, and is refused until it is restarted."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return {"autograder": digest.hexdigest()[:16], "torch": importlib.metadata.version("torch"),
            "python": ".".join(map(str, sys.version_info[:2]))}


# --- on each Dask worker -------------------------------------------------------------------

class Grading(WorkerPlugin):
    """The grading pool of one Dask worker: as many warm sandboxed workers as the Dask worker
    has threads, started at setup (while the client prepares), stopped at teardown."""

    idempotent = False
    error: BaseException | None  # why the pool could not start (set up in `setup`)

    def __init__(self, root: str, sandboxed: bool, limits: Limits, modules: list[str], first_compile: bool,
                 expected: dict[str, str], topic: str) -> None:
        """`first_compile`: whether the first notebooks call torch.compile (Pool.preload)."""
        self.root, self.sandboxed, self.limits = root, sandboxed, limits
        self.modules, self.first_compile = modules, first_compile
        self.expected, self.topic = expected, topic

    def setup(self, worker: Any) -> Any:
        found = fingerprint()
        if found != self.expected:
            differs = ", ".join(f"{k} {found[k]} instead of {self.expected[k]}"
                                for k in found if found[k] != self.expected[k])
            raise DifferentVersion(f"the Dask worker {worker.address} on {socket.gethostname()} has {differs}: install "
                                   "the same version of the course there as here (scores must not "
                                   "depend on the machine)")
        self.jobs = max(int(worker.state.nthreads), 1)
        self.ready, self.error, self.stopping = threading.Event(), None, False
        self.waiting: dict[str, concurrent.futures.Future[Any]] = {}
        self.lock = threading.Lock()
        self.pool: Pool | None = None
        return self._setup()

    async def _setup(self) -> None:
        self.isolation = await asyncio.to_thread(sandbox.detect, self.sandboxed, Path(self.root))
        # The thread that starts the sandboxed workers lives as long as they do: they die with it.
        self.thread = threading.Thread(target=self._serve, name="autograder-pool", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.pool = Pool(self.jobs, self.isolation, Path(self.root), self.limits)
            self.pool.preload(self.modules, self.first_compile)
        except BaseException as error:  # noqa: BLE001 - told to every task, which fails over to another worker
            self.error = error
            self.ready.set()
            if self.pool is not None:
                self.pool.close()
            return
        self.ready.set()
        while (done := self.pool.result()) is not None:
            token, runs = done
            with self.lock:
                future = self.waiting.pop(token, None)
            if future is not None:
                future.set_result(runs)
        self.pool.close()

    def grade(self, key: str, programs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self.ready.wait(STARTUP):
            raise RuntimeError(f"the grading workers on {socket.gethostname()} did not start within {STARTUP:g} s")
        if self.error is not None or self.stopping:
            raise RuntimeError(f"grading cannot run on {socket.gethostname()}: {self.error or 'it is stopping'}")
        future: concurrent.futures.Future[list[Run]]
        token, future = uuid.uuid4().hex, concurrent.futures.Future()
        with self.lock:
            self.waiting[token] = future
        get_worker().log_event(self.topic, key)  # the client's progress: this one runs now
        assert self.pool is not None  # ready, without an error
        self.pool.submit(token, [_program(p) for p in programs])
        return [_plain(run) for run in future.result()]

    def teardown(self, worker: Any) -> None:
        """The end of the run (or of this worker): nothing new starts; the pool stops in its
        own thread once its running notebooks end (the event loop is not held up)."""
        self.stopping = True
        if self.pool is None:
            return
        with self.lock:
            waiting, self.waiting = self.waiting, {}
        for future in waiting.values():
            future.set_exception(RuntimeError("grading stopped on this worker"))
        while True:  # what was queued and not started is dropped: its task is elsewhere, or gone
            try:
                self.pool.todo.get_nowait()
            except Exception:  # queue.Empty
                break
        self.pool.done.put(None)

    def describe(self) -> dict[str, Any]:
        return {"host": socket.gethostname(), "threads": self.jobs, "summary": self.isolation.summary(),
                "warnings": self.isolation.warnings()}


def grade_submission(plugin: str, key: str, programs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Dask task: one submission's notebooks, run and judged on this Dask worker."""
    grading = cast("Grading | None", get_worker().plugins.get(plugin))  # the plugin registered as `plugin`
    if grading is None:
        raise RuntimeError(f"this Dask worker has no grading plugin {plugin!r}")
    return grading.grade(key, programs)


def _describe(dask_worker: Any, plugin: str) -> dict[str, Any]:
    description: dict[str, Any] = dask_worker.plugins[plugin].describe()
    return description


def _program(plain: dict[str, Any]) -> Program:
    from .verdicts import Judge

    judge = Judge({int(index): cell for index, cell in plain["tests"].items()},
                  {int(index): int(seed) for index, seed in plain["seeds"].items()})
    return Program([tuple(cell) for cell in plain["cells"]], dict(plain["files"]), judge, bool(plain["compiles"]))


def _plain(run: Run) -> dict[str, Any]:
    return dataclasses.asdict(run)


# --- on the client (the one process that writes the gradebook) -----------------------------

def plain_program(program: Program) -> dict[str, Any]:
    """What a Dask worker needs of a notebook: plain data only."""
    tests = program.judge.tests if program.judge is not None else {}
    return {
        "cells": [list(cell) for cell in program.cells],
        "files": dict(program.files),
        "tests": {index: {"source": str(cell["source"]), "metadata": {"nbgrader": dict(cell["metadata"]["nbgrader"])}}
                  for index, cell in tests.items()},
        "seeds": dict(program.judge.seeds) if program.judge is not None else {},
        "compiles": program.compiles,
    }


def run_of(plain: dict[str, Any]) -> Run:
    plain = dict(plain)
    cells = {int(i): Cell(**c) for i, c in plain.pop("cells").items()}
    verdicts = {int(i): Verdict(**v) for i, v in plain.pop("verdicts").items()}
    return Run(cells=cells, verdicts=verdicts, **plain)


class ClusterIsolation:
    """What the cluster's machines offer for running student code (as sandbox.Isolation says it)."""

    def __init__(self, address: str, described: dict[str, dict[str, Any]]) -> None:
        self.address, self.described = address, described

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for d in self.described.values():
            kinds[d["summary"]] = kinds.get(d["summary"], 0) + 1
        threads = sum(d["threads"] for d in self.described.values())
        where = "; ".join(kinds) if len(kinds) == 1 else "; ".join(f"{n} worker(s): {k}" for k, n in kinds.items())
        count = len(self.described)
        return f"Dask cluster {self.address}, {count} worker{'s' * (count != 1)}, {threads} at once: {where}"

    def warnings(self) -> list[str]:
        found: dict[str, list[str]] = {}
        for address, d in self.described.items():
            for warning in d["warnings"]:
                found.setdefault(warning, []).append(f"{d['host']} ({address})")
        return [f"on {', '.join(where)}: {warning}" for warning, where in found.items()]


class ClusterPool:
    """`pool.Pool`'s interface, on the Dask workers of the scheduler at `address`."""

    def __init__(self, address: str, options: Options, console: Console) -> None:
        self.address, self.options, self.console = address, options, console
        self.run_id = uuid.uuid4().hex[:12]
        self.plugin, self.topic = f"autograder-{self.run_id}", f"autograder-running-{self.run_id}"
        self.client: Client | None = None
        self.isolation = ClusterIsolation(address, {})
        # Dask's own log lines (reconnection tracebacks, slow event loops) are not for the
        # instructor: what matters is said here, in one line each.
        for name in ["distributed", *logging.root.manager.loggerDict]:  # Dask's config sets some levels of their own
            if name.split(".")[0] == "distributed":
                logging.getLogger(name).setLevel(logging.CRITICAL)
        try:
            self.client = Client(address, timeout=CONNECT, set_as_default=False, name=f"autograder grade {self.run_id}")
        except (OSError, TimeoutError, ValueError) as error:
            raise GradingError(f"the Dask scheduler at {address} could not be reached "
                               f"({first_line(error, 200)}): start it "
                               "(`dask scheduler`) or correct --scheduler", USAGE) from None
        self.futures: dict[Key, tuple[str, int]] = {}  # Dask key -> (submission key, notebooks)
        self.completed = as_completed(loop=self.client.loop)
        self._keys: set[str] = set()  # submissions on the cluster now
        self._running: dict[str, float] = {}
        self._size, self._looked = 0, 0.0
        self.client.subscribe_topic(self.topic, self._started)
        console.print(f"Connecting to the Dask workers of {address} ...")
        try:
            self.client.wait_for_workers(1, timeout=WORKERS)
        except TimeoutError:
            self.close()
            raise GradingError(f"the Dask scheduler at {address} has had no worker for {WORKERS:g} s: start some "
                               f"(`dask worker {address} --nthreads N`)", FAILED) from None
        console.print(f"Grading on {self.size} Dask worker thread{'s' * (self.size != 1)} ({len(self._threads())} "
                      f"worker{'s' * (len(self._threads()) != 1)}) ...")

    def _threads(self) -> dict[str, int]:
        assert self.client is not None  # (open)
        threads: dict[str, int] = self.client.nthreads()
        return threads

    @property
    def size(self) -> int:
        """Notebooks the cluster runs at once (its Dask threads), looked up every few seconds."""
        if time.monotonic() - self._looked > CHECK_EVERY:
            self._size, self._looked = sum(self._threads().values()), time.monotonic()
        return max(self._size, 1)

    def preload(self, modules: list[str], first_compile: bool = False) -> None:
        """Start the grading pool on every Dask worker (and on those that join later)."""
        plugin = Grading(str(self.options.root), self.options.sandbox, self.options.limits, modules,
                         first_compile, fingerprint(), self.topic)
        assert self.client is not None  # (open)
        try:
            self.client.register_plugin(plugin, name=self.plugin)
            described = self.client.run(_describe, plugin=self.plugin)
        except DifferentVersion as error:
            raise GradingError(str(error), USAGE) from None
        except Exception as error:
            raise GradingError(f"the Dask workers could not start grading ({first_line(error, 200)})", FAILED) from None
        self.isolation = ClusterIsolation(self.address, described)
        for warning in self.isolation.warnings():
            self.console.print(f"[bold red]WARNING[/] {warning}")

    def submit(self, key: str, programs: list[Program]) -> None:
        assert self.client is not None  # (open)
        future = self.client.submit(grade_submission, self.plugin, key, [plain_program(p) for p in programs],
                                    key=f"grade-{self.run_id}-{key}-{uuid.uuid4().hex[:8]}", pure=False,
                                    retries=RETRIES)
        self.futures[future.key] = (key, len(programs))
        self._keys.add(key)
        self.completed.add(future)

    def result(self) -> tuple[str, list[Run]]:
        """The next submission whose notebooks came back, in completion order."""
        self._wait()
        future = next(self.completed)
        key, notebooks = self.futures.pop(future.key)
        self._keys.discard(key)
        self._running.pop(key, None)
        if future.status == "finished":
            runs = [run_of(plain) for plain in future.result()]
        elif future.status == "error":
            error = future.exception()
            if isinstance(error, KilledWorker):
                why = ("its Dask worker died each time it was run, on several machines (machines that failed, or a "
                       "notebook that took its grading process down)")
            else:
                why = f"the grading worker failed: {first_line(error, 200)}"
            runs = [Run(failure=why) for _ in range(notebooks)]
        else:  # cancelled: the client lost the scheduler
            raise self._lost()
        future.release()
        return key, runs

    def _wait(self) -> None:
        """Until a result is ready; stops the run if the scheduler is gone, or if no worker
        has been there for WORKERS seconds."""
        alone_since = None
        while not self.completed.has_ready():
            assert self.client is not None  # (open)
            if self.client.status not in ("running", "newly-created"):
                raise self._lost()
            with self.completed.thread_condition:
                self.completed.thread_condition.wait(timeout=CHECK_EVERY / 50)
            if self.completed.has_ready() or time.monotonic() - self._looked < CHECK_EVERY:
                continue
            try:
                self._size, self._looked = sum(self._threads().values()), time.monotonic()
            except (OSError, TimeoutError):
                raise self._lost() from None
            alone_since = None if self._size else alone_since or time.monotonic()
            if alone_since is not None and time.monotonic() - alone_since > WORKERS:
                raise GradingError(f"the Dask scheduler at {self.address} has had no worker for "
                                   f"{WORKERS:g} s, so grading "
                                   "stopped; what was saved stays saved: start workers and run again", FAILED)

    def _lost(self) -> GradingError:
        return GradingError(f"the connection to the Dask scheduler at {self.address} was lost, so "
                            "grading stopped; what was saved stays saved: run again (with the scheduler back) "
                            "to grade the rest", FAILED)

    def _started(self, event: tuple[float, Any]) -> None:
        _, key = event
        if key in self._keys:  # (called in the client's event loop thread)
            self._running[key] = time.monotonic()

    def running(self) -> dict[str, float]:
        """What the Dask workers run now: key -> when it started (here, as the worker told)."""
        return dict(self._running)

    def close(self) -> None:
        if self.client is None:
            return
        client, self.client = self.client, None
        if client.status == "running":
            try:  # the workers' grading pools stop; nothing of this run stays on the cluster
                client.unregister_worker_plugin(self.plugin)
            except Exception:  # noqa: BLE001 - never registered, or the scheduler went away meanwhile
                pass
        try:
            client.close(timeout=CONNECT / 2)
        except Exception:  # noqa: BLE001 - the scheduler is gone: nothing to close there
            pass

    def __enter__(self) -> "ClusterPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
