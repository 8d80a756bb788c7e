"""A child forked from a warm worker: confine itself, then answer the grader's requests.

Requests arrive one at a time on the child's channel: "execute" runs one cell and
replies with its outputs; "exit" ends the process. The grader sends each cell only when
the previous one has finished, so code never sees cells that have not run yet. After a
test cell the grader judges it itself: "restore" puts back what the notebook changed in
the modules the checks rely on (and says what that was), then each "probe" asks for
numbers from the student's objects (:mod:`autograder.checks.remote`).
"""
from __future__ import annotations

import os
import socket
import time
import traceback
from typing import Any, Callable

from IPython.core.interactiveshell import InteractiveShell

from ..student import integrity, wire
from ..student import serve as student
from ..isolation import confine
from . import kernel
from ..isolation.limits import Limits
from .protocol import Channel

REQUEST_LIMIT = 64 << 20  # the grader's requests (cell sources, later tensors)


def main(channel_fd: int, config: dict, limits: Limits, files: dict[str, bytes], shell: InteractiveShell) -> None:
    """Never returns: the process ends with os._exit."""
    code = 0
    try:
        channel = Channel(socket.socket(fileno=channel_fd), limit=REQUEST_LIMIT)
        try:
            scratch, landlock_abi = confine.confine(channel_fd, config, limits, files)
            kernel.start(scratch, limits.output)
        except BaseException:
            channel.send({"op": "error", "message": traceback.format_exc(limit=3)})
            raise
        channel.send({"op": "ready", "landlock": landlock_abi, "uid": os.getuid()})
        serve(channel, {
            "execute": lambda request, buffers: _execute(shell, request),
            "restore": lambda request, buffers: ({"op": "restored", "changes": integrity.restore()}, []),
            "probe": lambda request, buffers: _probe(shell, request, buffers),
        })
    except BaseException:
        code = 70
    finally:
        os._exit(code)


Handler = Callable[[dict, list[bytes]], tuple[dict[str, Any], list[bytes]]]  # (request, buffers) -> reply


def serve(channel: Channel, handlers: dict[str, Handler]) -> None:
    """Answer requests until "exit". Tensors travel as raw buffers beside the JSON."""
    while True:
        request, buffers, _ = channel.receive()
        if request.get("op") == "exit":
            return
        reply, reply_buffers = handlers[request["op"]](request, buffers)
        channel.send(reply, reply_buffers)


def _execute(shell: InteractiveShell, request: dict) -> tuple[dict[str, Any], list[bytes]]:
    started = time.process_time()
    outputs, count = kernel.execute(shell, request["code"])
    return {"op": "executed", "outputs": outputs, "execution_count": count, "cpu": time.process_time() - started}, []


def _probe(shell: InteractiveShell, request: dict, buffers: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
    try:
        answer, answer_buffers = student.answer(shell.user_ns, request.get("request"), buffers)
    except BaseException as error:  # sys.exit in a probed backward: an answer like any error
        answer, answer_buffers = wire.encode({"error": f"{type(error).__name__}: {error}"})
    kernel.RECORDER.take()  # what the student's code printed while probed belongs to no cell
    return {"op": "answer", "answer": answer}, answer_buffers
