"""Warm workers, several in parallel, each running one notebook at a time in a fresh child.

The grader drives each child cell by cell and keeps the clock: the notebook's own cells
run in the child, its test cells here, at their place (`Conversation`). When a
notebook's time is up its child is killed (SIGKILL, so a loop that ignores SIGINT dies
too), and when a worker does not answer it is killed and replaced. Whatever goes wrong is
reported as the failure of that one notebook.
"""
from __future__ import annotations

import dataclasses
import fcntl
import itertools
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Protocol, Sequence

from ..isolation import sandbox
from ..isolation.limits import TRUNCATED, Limits
from ..runner.protocol import Channel, ChannelClosed, ProtocolError, Undecodable
from . import syntax
from .records import Cell, Program, Run, cores, cpu_seconds

if TYPE_CHECKING:  # torch loads in the grader only once the workers are warming up
    from .conversation import Conversation
    from .verdicts import Judge

STARTUP = 300.0  # seconds a worker may take to warm up (imports torch on a busy machine)
GRACE = 5.0  # seconds a worker has to report a child's end
# A sandboxed worker's notebooks run as the user FIRST_UID + its slot (sandbox.py), and the
# process limit counts per user across the machine: every pool of the machine (two courses
# graded at once, the Dask workers of one machine) takes slots no other holds, each held with
# a lock that the kernel releases when its holder ends, however it ends.
SLOTS = Path(tempfile.gettempdir()) / f"autograder-slots-{os.geteuid()}"
REPLY_SLACK = 1 << 20  # JSON framing around a notebook's outputs
ESCAPED = 6  # bytes JSON may take for one byte of output (a control character is \u0000)


class SetupError(Exception):
    """The child could not confine itself (it runs no student code then)."""


class WorkerError(Exception):
    """The worker itself failed (not the notebook)."""


class Worker:
    """One warm worker process (a zygote), inside the sandbox when there is one."""

    def __init__(self, isolation: sandbox.Isolation, course_root: Path, runtime: Path, slot: int) -> None:
        self.isolation, self.course_root, self.runtime, self.slot = isolation, course_root, runtime, slot
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.modules: list[str] = []  # to preload, also after a restart
        self.compiles = False  # and whether to compile once on starting
        # The pool's thread starts it while the grader's asks it to preload: one at a time.
        self.starting = threading.RLock()
        self.closed = False  # its pool is closing: never started again

    def start(self) -> None:
        with self.starting:
            if self.closed:
                raise WorkerError("its pool is closing")
            self._start()

    def close(self) -> None:
        """Killed, and never started again: a pool closing while this worker warms up must not
        see it started once more (ensure_ready would then wait STARTUP seconds for it)."""
        with self.starting:
            self.closed = True
            self.kill()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        self.starts += 1
        runtime = self.runtime / f"start-{self.starts}"
        runtime.mkdir()
        launch = sandbox.launch(self.isolation, self.course_root, runtime, theirs.fileno(), self.slot)
        self.log = open(runtime.parent / f"worker-{self.starts}.log", "w+b")
        self.process = subprocess.Popen(
            launch.argv, env=launch.env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=self.log, start_new_session=True,
        )
        theirs.close()
        self.control = Channel(ours)
        self._tell(launch.config.to_message())  # (one that died at once: ensure_ready says so)
        self.ready = False
        if self.modules or self.compiles:
            self.preload(self.modules, self.compiles)

    def preload(self, modules: list[str], compiles: bool) -> None:
        with self.starting:
            self.modules, self.compiles = modules, compiles
            if self.process is None:  # not started yet: it preloads them when it starts
                return
            if not self._tell({"op": "preload", "modules": modules, "compiles": compiles}):
                self.kill()  # started again (preloading these) before its next notebook

    def ensure_ready(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.start()
        if not self.ready:
            try:
                message, _, _ = self.control.receive(timeout=STARTUP)
            except (TimeoutError, ProtocolError) as error:
                self.kill()
                raise WorkerError(f"the worker did not start ({error}): {self._log_tail()}") from None
            if message.get("op") != "ready":
                raise WorkerError(f"unexpected message from a starting worker: {message}")
            self.ready = True

    def _log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-2000:].decode("utf-8", "replace")

    def kill(self) -> None:
        with self.starting:  # (also from the thread that closes the pool)
            if self.process is not None and self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            self.process = None

    def _tell(self, message: dict[str, Any], buffers: Sequence[bytes] = (), fds: Sequence[int] = ()) -> bool:
        """Send the worker `message`; False when it is gone (it died, or was killed)."""
        try:
            self.control.send(message, buffers, fds)
        except (OSError, ChannelClosed):  # (a closed channel is no OSError)
            return False
        return True

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None and self._tell({"op": "stop"}):
            try:
                self.process.wait(timeout=GRACE)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def run(self, program: Program, limits: Limits) -> Run:
        from .conversation import Conversation  # here: it loads torch, which the grader needs only now

        self.ensure_ready()
        run = Run()
        ours, theirs = socket.socketpair()
        started = time.monotonic()
        deadline = started + limits.timeout
        taken = self._tell({"op": "run", "limits": limits.to_message(), "files": list(program.files),
                            "compiles": program.compiles},
                           buffers=list(program.files.values()), fds=[theirs.fileno()])
        theirs.close()
        if not taken:
            ours.close()
            raise WorkerError("the worker had died before it took the notebook")
        channel = Channel(ours, limit=ESCAPED * limits.output + REPLY_SLACK)
        where, ended, conversation = "while starting", False, None
        try:
            hello, _, _ = channel.receive(timeout=max(deadline - time.monotonic(), 0.001))
            if hello.get("op") != "ready":
                raise SetupError(str(hello.get("message", hello)).strip().splitlines()[-1])
            conversation = Conversation(channel, limits.timeout)
            # The notebook's time: starting and running its cells, not judging.
            spent = time.monotonic() - started
            def judged(item: tuple[Any, ...]) -> bool:
                return program.judge is not None and program.judge.judges(item[1][0])

            # Test cells run here, one by one; each run of the notebook's own cells between
            # them goes to the child in one request, and comes back a reply per cell.
            group: Iterable[tuple[int, tuple[int, str, str]]]
            for tests, group in itertools.groupby(enumerate(program.cells, start=1), key=judged):
                group = list(group)
                if tests:
                    assert program.judge is not None  # (judged)
                    for count, (index, label, _) in group:
                        where = f"while the grader ran {label}"
                        self._judge(conversation, program.judge, index, count, run)
                    continue
                sent = time.monotonic()
                # The time left, read when asked: spent and sent move on with every reply.
                replies = conversation.execute([(source, count) for count, (_, _, source) in group],
                                               lambda: max(limits.timeout - spent - (time.monotonic() - sent),  # noqa: B023
                                                           0.001))
                for count, (index, label, _) in group:
                    where = f"while running {label}"
                    reply = next(replies)
                    if channel.received - conversation.answers > ESCAPED * limits.output + REPLY_SLACK:
                        raise Undecodable(f"more than {limits.output} bytes of output")
                    run.cells[index] = Cell(reply["outputs"], count, time.monotonic() - sent,
                                            cpu_seconds(reply.get("cpu")))
                    spent += time.monotonic() - sent
                    sent = time.monotonic()
            where = "after the last cell"
            conversation.restore(run)
            channel.send({"op": "exit"})
        except SetupError as error:
            run.failure, ended = f"the notebook could not be confined, so it was not run: {error}", True
        except TimeoutError:
            run.failure = f"stopped after {limits.timeout:g} s, the notebook's time limit, {where}"
            if conversation is not None and conversation.lost is not None:
                run.failure = ("stopped: the notebook's code did not answer the grader's checks within "
                               f"{limits.timeout:g} s ({where})")
        except ChannelClosed:
            run.failure, ended = f"the notebook's process ended {where}", True
        except Undecodable as error:
            run.failure = f"stopped {where}: the notebook's process sent a message beyond the grader's limits ({error})"
        except ProtocolError as error:
            run.failure = f"the notebook's process sent something no notebook sends {where}: {error}"
            run.tampering = f"{error} ({where})"
        except OSError as error:
            run.failure = f"stopped {where}: the channel to the notebook's process failed ({error})"
        except Exception as error:  # the grader's own failure, on this notebook only: named, not retried
            run.failure = f"stopped {where}: the grader failed on this notebook ({type(error).__name__}: {error})"
        finally:
            channel.close()
            run.probe_cpu = conversation.probe_cpu if conversation is not None else 0.0
        if run.failure is not None:
            run.stopped_at = next((i for i, _, _ in program.cells if i not in run.cells), None)
            if not ended and not self._tell({"op": "kill"}):
                raise WorkerError("the worker died while it ran the notebook")
        self._finish(run, started, limits, explain_exit=ended)
        return run

    @staticmethod
    def _judge(conversation: Conversation, judge: Judge, index: int, count: int, run: Run) -> None:
        """Test cell `index`, run here; its outputs go into the notebook, its verdict into `run`."""
        started, cpu = time.monotonic(), time.thread_time()
        try:
            verdict = conversation.judge(judge, index, run)
        finally:
            run.judge_cpu += time.thread_time() - cpu
        if conversation.lost is not None:  # whatever the checks made of it: no answer, no points
            verdict = dataclasses.replace(verdict, score=0.0, outputs=[*verdict.outputs, _error(
                "NotJudged", f"the notebook's process stopped answering the grader ({conversation.lost})")])
        elif conversation.breach is not None:
            verdict = dataclasses.replace(verdict, score=0.0, outputs=[*verdict.outputs, _error(
                "LimitExceeded", conversation.breach)])
            run.limits_reached.append(f"the cell '{verdict.grade_id}' scored 0: {conversation.breach}")
        outputs = [{**o,
                    "execution_count": count} if o["output_type"] == "execute_result" else o for o in verdict.outputs]
        run.cells[index] = Cell(outputs, count, time.monotonic() - started, 0.0)
        run.seeds[verdict.grade_id] = verdict.seed
        run.worth_a_look += [flag for flag in verdict.flags if flag not in run.worth_a_look]
        if verdict.graded:
            run.verdicts[index] = verdict
        if conversation.lost is not None:
            raise conversation.lost

    def _finish(self, run: Run, started: float, limits: Limits, explain_exit: bool) -> None:
        """Wait for the worker's report on the child (replacing a worker that does not answer).
        Raises WorkerError when the worker itself died: then the notebook ended with it,
        through no doing of its own, and is run again elsewhere."""
        try:
            report, _, _ = self.control.receive(timeout=GRACE)
        except (TimeoutError, ProtocolError) as error:
            # Only the worker holds the other end, so a closed channel is a worker that ended,
            # even while its sandbox's processes are still exiting (poll() then says running).
            died = isinstance(error, ChannelClosed) or (self.process is not None and self.process.poll() is not None)
            self.kill()
            if died:
                raise WorkerError("the worker died while it ran the notebook") from None
            run.failure = run.failure or "the notebook did not exit"
            return
        run.seconds = time.monotonic() - started
        run.cpu, run.maxrss = float(report.get("cpu", 0)), int(report.get("maxrss", 0))
        if any(TRUNCATED in json.dumps(cell.outputs) for cell in run.cells.values()):
            run.limits_reached.append(f"its output reached the limit of {limits.output >> 20} MiB and was cut")
        used = (run.maxrss - int(report.get("worker_maxrss", 0))) >> 10  # MiB beyond the warm worker's
        if used > limits.memory // 2:
            run.limits_reached.append(f"it used {used} MiB, more than half of its memory limit of {limits.memory} MiB")
        if explain_exit and isinstance(report.get("code"), int):
            assert run.failure is not None  # (it ended on its own: failed)
            run.failure += f": {_exit_reason(report['code'], limits)}"


def _error(ename: str, message: str) -> dict[str, Any]:
    return {"output_type": "error", "ename": ename, "evalue": message, "traceback": [f"{ename}: {message}"]}


def _exit_reason(code: int, limits: Limits) -> str:
    if code >= 0:
        return f"it exited with code {code} (os._exit, sys.exit in a thread, or a crash)"
    sig = signal.Signals(-code)
    reasons = {
        signal.SIGXCPU: f"it used up its CPU time limit ({limits.cpu} s)",
        signal.SIGSEGV: "it crashed (segmentation fault)",
        signal.SIGABRT: "it aborted (out of memory in native code, or a failed assertion)",
        signal.SIGKILL: "it was killed (SIGKILL)",
    }
    return reasons.get(sig, f"it was killed by {sig.name}")


class Workers(Protocol):
    """What grading asks of its workers: `Pool` here, `cluster.ClusterPool` on a Dask cluster."""

    @property
    def size(self) -> int: ...
    def preload(self, modules: list[str], first_compile: bool = False) -> None: ...
    def submit(self, key: str, programs: list[Program]) -> None: ...
    def result(self) -> tuple[str, list[Run]]: ...
    def running(self) -> dict[str, float]: ...
    def close(self) -> None: ...
    def __enter__(self) -> object: ...
    def __exit__(self, *exc: Any) -> None: ...


class Pool:
    """`jobs` warm workers, warming up while the grader prepares: as many at once as there
    are cores but one (left to the grader), so that on a small machine the first worker is
    ready, and the first verdict comes, before all of them have warmed up.

    `submit` queues a submission (its notebooks run one after another on one worker);
    `result` returns the next finished one, in completion order.
    """

    def __init__(self, jobs: int, isolation: sandbox.Isolation, course_root: Path, limits: Limits) -> None:
        syntax.guard()  # the threads below judge, and judging builds syntax trees
        self.limits = limits
        self.runtime = sandbox.runtime_directory()
        self.todo: queue.Queue[Any] = queue.Queue()
        self.done: queue.Queue[Any] = queue.Queue()
        self._running: dict[Any, float] = {}
        self.workers, self.threads = [], []
        # Workers still warming up for their first notebook: closing does not wait for them.
        self._warming: set[Worker] = set()
        self._closing = False
        self._lock = threading.Lock()
        warming = threading.Semaphore(max(cores() - 1, 1))
        slots, self._slot_locks = _take_slots(jobs)
        for k in range(jobs):
            directory = self.runtime / f"worker-{k}"
            directory.mkdir()
            worker = Worker(isolation, course_root, directory, slots[k])
            self.workers.append(worker)
            self.threads.append(threading.Thread(target=self._serve, args=(worker, warming), daemon=True))
        for thread in self.threads:
            thread.start()

    @property
    def size(self) -> int:
        return len(self.workers)

    def preload(self, modules: list[str], first_compile: bool = False) -> None:
        """Have every worker import `modules` before its first notebook, and warm this process,
        which judges, for them; call before `submit`. The workers compile once before the
        first notebook that compiles, and this process warms up for the compiler then, or
        both at once if the first notebooks compile (`first_compile`)."""
        from .verdicts import warm, warm_compiler, warmth  # torch: loaded only now, while the workers warm up

        for worker in self.workers:
            worker.preload(modules, first_compile)
        warm(modules)
        if first_compile:
            warmth.pay(warm_compiler)

    def submit(self, key: Any, programs: list[Program]) -> None:
        self.todo.put((key, programs))

    def result(self) -> tuple[Any, list[Run]]:
        found: tuple[Any, list[Run]] = self.done.get()
        return found

    def running(self) -> dict[Any, float]:
        """What the workers run now: key -> when it started (time.monotonic)."""
        return dict(self._running)

    def _serve(self, worker: Worker, warming: threading.Semaphore) -> None:
        with warming:
            with self._lock:
                if self._closing:  # closed before its turn to warm up: the others run what is left
                    return
                self._warming.add(worker)
            try:
                worker.start()
                worker.ensure_ready()
            except Exception:  # started again for its first notebook, which fails alone if it must (_run)
                worker.kill()
            finally:
                with self._lock:
                    self._warming.discard(worker)
        while (job := self.todo.get()) is not None:
            key, programs = job
            self._running[key] = time.monotonic()
            runs = [self._run(worker, program) for program in programs]
            self._running.pop(key, None)
            self.done.put((key, runs))

    def _run(self, worker: Worker, program: Program) -> Run:
        """The notebook's run; a worker that fails (not the notebook: its faults are the
        run's) is replaced and the notebook run once more."""
        first = program.cells[0][0] if program.cells else None  # never lose a submission, never hang the run
        if program.compiles:
            from .verdicts import warm_compiler, warmth  # (loaded: the program's judge is one)

            warmth.pay(warm_compiler)
        for _ in range(2):
            try:
                return worker.run(program, self.limits)
            except WorkerError as error:
                worker.kill()
                failure = f"the grading worker failed twice: {error}"
            except Exception as error:  # the grader's own failure outside the notebook's run
                worker.kill()
                return Run(failure=f"the grader failed on this notebook ({type(error).__name__}: {error})",
                           stopped_at=first)
        return Run(failure=failure, stopped_at=first)

    def close(self) -> None:
        if not self.threads:
            return
        with self._lock:
            self._closing = True
            for worker in self._warming:  # not waited for: there is nothing left for it to run
                worker.close()
        for _ in self.threads:
            self.todo.put(None)
        for thread in self.threads:
            thread.join()
        self.threads = []
        for worker in self.workers:
            worker.stop()
        for fd in self._slot_locks:
            os.close(fd)
        shutil.rmtree(self.runtime, ignore_errors=True)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _take_slots(count: int) -> tuple[list[int], list[int]]:
    """The `count` lowest slots that no other pool of this machine holds, and their locks."""
    SLOTS.mkdir(mode=0o700, exist_ok=True)
    slots: list[int] = []
    locks: list[int] = []
    slot = 0
    while len(slots) < count:
        fd = os.open(SLOTS / str(slot), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            slots.append(slot)
            locks.append(fd)
        except BlockingIOError:  # another pool has it
            os.close(fd)
        slot += 1
    return slots, locks
