"""A warm worker: import torch, IPython and the student side of the course
(:mod:`autograder.student`) once, then fork a fresh child for every notebook, so no state
passes from one submission to the next.

Started by the grader as `python -I -m autograder.runner.zygote CONTROL_FD`, inside
the sandbox. Control messages: the grader sends its configuration, then "preload" (the
modules the notebooks to grade import, and whether to compile once now), "run" (with the
child's channel as a passed descriptor, and whether the notebook compiles) or "stop"; the
worker answers "ready" once, then "exited" after each child, with its exit status and
resource use. A "kill" during a run ends the child and everything it started.
"""
from __future__ import annotations

import functools
import gc
import importlib
import os
import pkgutil
import resource
import select
import signal
import socket
import stat
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from ..isolation import confine
from ..isolation.limits import Limits, WorkerConfig
from . import child, kernel
from .protocol import Channel

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


def warm() -> InteractiveShell:
    """Pay every first-call cost once, here, instead of in every child."""
    import torch
    from torch.overrides import TorchFunctionMode

    torch.set_num_threads(1)  # no thread pools in a process that forks
    torch.set_num_interop_threads(1)
    shell = kernel.make_shell()
    import autograder.student

    for module in pkgutil.iter_modules(autograder.student.__path__, autograder.student.__name__ + "."):
        importlib.import_module(module.name)  # the probe procedures, and what notebooks import

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(torch.sin, (x,))
    torch.autograd.gradgradcheck(torch.sin, (x,))
    with Mode():
        torch.ones(2).sum()
    torch.empty(2, device="meta").clamp(0, 1)  # loads torch._dynamo
    _untimed_guards()
    with torch.autograd.forward_ad.dual_level():  # the first loads torch's jvp decompositions
        torch.autograd.forward_ad.make_dual(x.detach(), x.detach()) * 2
    shell.transform_cell("x = 1\n")
    class Wrong(torch.autograd.Function):  # the error wrong answers meet most, raised in torch's backward
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad, grad

    try:  # the first traceback through torch parses its files and builds pygments' lexers: pay it here
        Wrong.apply(torch.ones(1, requires_grad=True)).sum().backward()  # type: ignore[no-untyped-call]
    except RuntimeError:
        shell.InteractiveTB.structured_traceback(*sys.exc_info())
    gc.collect()
    gc.freeze()  # children neither scan nor copy the objects that exist now
    return shell


def _untimed_guards() -> None:
    """torch.compile times the guards of each graph it makes once, after flushing the CPU's
    caches, for a metric nothing here reads: a quarter of a small graph's compilation."""
    import torch._dynamo.guards

    torch._dynamo.guards.profile_guard_manager = lambda *args: 0.0  # type: ignore[attr-defined]


def main(control_fd: int) -> None:
    control = Channel(socket.socket(fileno=control_fd), accept_fds=True)
    message, _, _ = control.receive()
    config = WorkerConfig.from_message(message)
    confine.die_with_parent()
    shell = warm()
    tasks = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()
    control.send({"op": "ready", "threads": tasks})
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_write)
    while True:
        message, buffers, fds = control.receive()
        if message["op"] == "stop":
            return
        if message["op"] == "preload":
            preload(message["modules"], message["compiles"])
        if message["op"] == "run":
            _run(control, config, message, buffers, fds, wake_read, shell)


def preload(modules: list[str], compiles: bool) -> None:
    """Import, once for all children, what the notebooks import (matplotlib, torchviz, ...),
    and compile once now if `compiles` (the first notebooks compile).

    The names come from the instructor's notebooks; their imports must start no threads
    (this process forks). A module of the course's student package may name in `PRELOAD`
    what its functions import when called: that too."""
    import autograder.student

    for name in modules:
        try:
            module = importlib.import_module(name)
            for later in getattr(module, "PRELOAD", ()) if name.startswith(autograder.student.__name__ + ".") else ():
                importlib.import_module(later)
        except Exception:  # the notebook meets the same error in its own process, and reports it
            pass
    if compiles:
        _compile_once()
    gc.collect()
    gc.freeze()


@functools.cache
def _compile_once() -> None:
    """The first torch.compile of a process costs a second or more (dynamo, fake tensors,
    AOTAutograd, sympy): pay it here, for a Function forward and backward as the notebooks do,
    before the first notebook that compiles (at the start only if the first notebooks do:
    otherwise it would hold up their verdicts, and a worker given none never pays it)."""
    import torch

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad * 2

    x = torch.ones(2, requires_grad=True)
    torch.autograd.grad(torch.compile(lambda t: Twice.apply(t).sum(), backend="aot_eager", fullgraph=True)(x), x)  # type: ignore[no-untyped-call]
    torch._dynamo.reset()  # children start with nothing compiled
    gc.collect()
    gc.freeze()


def _run(control: Channel, config: WorkerConfig, message: dict[str, Any], buffers: list[bytearray], fds: list[int],
         wake: int, shell: InteractiveShell) -> None:
    (channel_fd,) = fds
    limits = Limits.from_message(message["limits"])
    files = dict(zip(message["files"], buffers))
    if message.get("compiles"):
        _compile_once()
    pid = os.fork()
    if pid == 0:
        child.main(channel_fd, config, limits, files, shell)
    os.close(channel_fd)
    status, usage = _wait(control, pid, wake, config)
    _kill_all(pid, config)  # whatever the notebook left running
    _wipe(config.scratch, config.uid)
    control.send({
        "op": "exited",
        "code": os.waitstatus_to_exitcode(status),
        "cpu": usage.ru_utime + usage.ru_stime,
        "maxrss": usage.ru_maxrss,
        "worker_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,  # what the child started with
    })


def _wait(control: Channel, pid: int, wake: int, config: WorkerConfig) -> tuple[int, resource.struct_rusage]:
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage
        watched: list[Channel | int] = [control, wake]
        ready, _, _ = select.select(watched, [], [])
        if wake in ready:
            os.read(wake, 4096)
        if control in ready:
            message, _, fds = control.receive()
            for fd in fds:
                os.close(fd)
            if message["op"] == "kill":
                _signal_all(pid, config)  # the rest is waited for once the child is reaped


def _signal_all(pid: int, config: WorkerConfig) -> bool:
    """SIGKILL the child and everything it started: all of this sandbox's other processes
    (its own PID namespace), or without a sandbox the child's process group. False if
    there was none left."""
    try:
        if config.sandboxed:
            os.kill(-1, signal.SIGKILL)
        else:
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _kill_all(pid: int, config: WorkerConfig) -> None:
    """Kill whatever the notebook left running, once its child is reaped (a zombie stays
    listed in /proc until then)."""
    if not _signal_all(pid, config) or not config.sandboxed:
        return
    # Until the namespace's init has reaped them they still count against the next
    # child's process limit: wait for them to be gone.
    for _ in range(2000):
        if not [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]:
            return
        time.sleep(0.001)


def _wipe(scratch_root: str, uid: int | None) -> None:
    """Empty the scratch area, as the notebooks' own user (they may have locked their files)."""
    if uid is not None:
        os.seteuid(uid)  # the saved uid stays root: the worker becomes itself again below
    try:
        for entry in os.scandir(scratch_root):
            try:
                _remove(entry.path)
            except OSError:  # not the notebooks' (their user could remove anything of theirs)
                pass
    finally:
        if uid is not None:
            os.seteuid(0)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, stat.S_IRWXU)
        for entry in os.scandir(path):
            _remove(entry.path)
        os.rmdir(path)
    else:
        os.unlink(path)


if __name__ == "__main__":
    main(int(sys.argv[1]))
    os._exit(0)  # nothing to flush or close; Python's own teardown of torch takes most of a second
