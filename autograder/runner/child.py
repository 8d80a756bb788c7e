"""A child forked from a warm worker: confine itself, then answer the grader's requests.

Requests arrive one at a time on the child's channel, each with an id that its replies
repeat: "execute" runs a run of the notebook's own cells, one after the other (never a
test cell: those run in the grader), and replies with each cell's outputs as soon as it
has run; "exit" ends the process. The grader sends the cells up to the next test cell
only, so code never sees a test cell before it has been judged. At each test cell the
grader judges in its own process: "restore" puts back what the notebook changed in the
modules the probes rely on (and says what that was), then each "probe" asks for numbers
from the student's objects (:mod:`autograder.student.serve`); while a probe runs, the
course's code may put a "question" to the grader (:func:`autograder.student.probe.ask`),
answered on the same channel under the probe's id.
"""
from __future__ import annotations

import functools
import os
import resource
import socket
import time
import traceback
from typing import Any, Callable

from IPython.core.interactiveshell import InteractiveShell

from ..isolation import confine
from ..isolation.limits import Limits, WorkerConfig
from ..student import attempts, integrity, probe, wire
from ..student import serve as student
from . import kernel
from .protocol import Channel

REQUEST_LIMIT = 64 << 20  # the grader's requests (cell sources, later tensors)
ANSWER_LIMIT = 4 << 20  # bytes of tensors in one answer; a larger one is answered with an error


def main(channel_fd: int, config: WorkerConfig, limits: Limits, files: dict[str, bytes],
         shell: InteractiveShell) -> None:
    """Never returns: the process ends with os._exit."""
    code = 0
    try:
        channel = Channel(socket.socket(fileno=channel_fd), limit=REQUEST_LIMIT)
        try:
            scratch, landlock_abi = confine.confine(channel_fd, config, limits, files)
            kernel.start(scratch, limits.output)
            attempts.watch()
            integrity.snapshot()  # the last step before student code: what the grader will put back
        except BaseException:
            channel.send({"op": "error", "message": traceback.format_exc(limit=3)})
            raise
        channel.send({"op": "ready", "landlock": landlock_abi, "uid": os.getuid()})
        # Bound now, before any student code runs: replacing this module's functions later
        # does not change who answers the grader.
        serve(channel, {
            "execute": functools.partial(_execute, shell),
            "restore": functools.partial(_restore, integrity.restore, attempts.take),
            "probe": functools.partial(_probe, channel, shell, student.answer, probe.asking_over),
        })
    except BaseException:
        code = 70
    finally:
        os._exit(code)


Reply = Callable[[dict[str, Any], list[bytes]], None]  # sends one reply under the request's id
Handler = Callable[[dict[str, Any], list[bytearray], Reply], None]  # (request, buffers, reply)


def serve(channel: Channel, handlers: dict[str, Handler]) -> None:
    """Answer requests until "exit", every reply under its request's id. Tensors travel as
    raw buffers beside the JSON."""
    while True:
        request, buffers, _ = channel.receive()
        if request.get("op") == "exit":
            return
        # (the handler replies before the next request is read)
        handlers[request["op"]](request, buffers, lambda reply, reply_buffers: channel.send(
            {**reply, "id": request.get("id")}, reply_buffers))  # noqa: B023


def _restore(restore: Callable[[], list[str]], attempted: Callable[[], list[str]], request: dict[str, Any],
             buffers: list[bytearray], reply: Reply) -> None:
    reply({"op": "restored", "changes": restore(), "attempts": attempted()}, [])


def _cpu() -> float:
    """CPU seconds of this (the main) thread, and of the programs it ran and waited for (a
    cell's `dot` renders its graph in one). The process's clock lags here (it catches up
    when the process sleeps, so a probe's CPU showed in the wait for the next request)."""
    ran = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.thread_time() + ran.ru_utime + ran.ru_stime


def _execute(shell: InteractiveShell, request: dict[str, Any], buffers: list[bytearray], reply: Reply) -> None:
    for cell in request["cells"]:
        started = _cpu()
        shell.execution_count = cell["count"]  # the grader numbers every code cell, test cells too
        outputs, count = kernel.execute(shell, cell["code"])
        reply({"op": "executed", "outputs": outputs, "execution_count": count, "cpu": _cpu() - started},
              [])


def _probe(channel: Channel, shell: InteractiveShell, answer_request: Callable[..., Any],
           asking_over: Callable[..., Any], request: dict[str, Any], buffers: list[bytearray], reply: Reply) -> None:
    def ask(question: Any) -> Any:  # while this probe runs, under its id
        structure, question_buffers = wire.encode(question)
        channel.send({"op": "question", "id": request.get("id"), "question": structure}, question_buffers)
        reply, reply_buffers, _ = channel.receive()
        answer = wire.decode(reply.get("answer"), reply_buffers)
        if not isinstance(answer, dict) or "value" not in answer:
            raise probe.Refused(str(answer.get("error") if isinstance(answer, dict) else answer))
        return answer["value"]

    started = _cpu()
    asking_over(ask)
    try:
        answer, answer_buffers = answer_request(shell.user_ns, request.get("request"), buffers)
    except BaseException as error:  # sys.exit in a probed backward: an answer like any error
        failure = probe.ProbeError.of("probe", error)
        answer, answer_buffers = wire.encode({"error": f"{failure.type}: {failure.message}", "type": failure.type})
    finally:
        asking_over(None)
    if sum(map(len, answer_buffers)) > ANSWER_LIMIT:
        answer, answer_buffers = wire.encode({"error": f"the answer has more than {ANSWER_LIMIT >> 20} MiB of tensors",
                                              "type": "ValueError"})
    kernel.RECORDER.take()  # what the student's code printed while probed belongs to no cell
    reply({"op": "answer", "answer": answer, "cpu": _cpu() - started}, answer_buffers)
