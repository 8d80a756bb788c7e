"""Student objects in another process, seen from the judging side.

A check given a `Remote` instead of the student's object runs unchanged in the grader's
own process: wherever a check runs student code, it goes through a probe procedure
(:func:`autograder.student.probe.invoke`), which a `Remote` sends to the student's process
(:mod:`autograder.student.serve` answers there); plain numbers come back
(:mod:`autograder.student.wire`). So the judging — references, comparisons, finite
differences — happens where student code never runs.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..student import probe, serve, wire

Transport = Callable[[dict[str, Any]], Any]  # request -> answer, both plain data


class RemoteError(Exception):
    """The student's process could not answer a request; `type` names the exception it
    reported, if any (as it reported it: for messages only)."""

    def __init__(self, message: str, type_name: str | None = None) -> None:
        super().__init__(message)
        self.type = type_name


class Remote(probe.StudentProxy):
    """The object called `name` in the student's notebook, reached through `transport`."""

    def __init__(self, name: str, transport: Transport) -> None:
        self.name = name
        self._transport = transport

    def __repr__(self) -> str:
        return f"<the student's {self.name}>"

    @property
    def __name__(self) -> str:  # checks name student functions in their messages
        return self.name

    def invoke(self, procedure: str, *args: Any) -> Any:
        return self._transport({"name": self.name, "procedure": procedure, "args": list(args)})


def result(structure: Any, buffers: Sequence[bytes | bytearray]) -> Any:
    """An answer in wire form -> its value (in the grader); raises RemoteError for errors."""
    reply = wire.decode(structure, buffers)
    if not isinstance(reply, dict) or not (set(reply) == {"value"} or set(reply) == {"error", "type"}):
        raise RemoteError("malformed answer from the student's process")
    if "error" in reply:
        failure = probe.ProbeError.from_data({"stage": "probe", "type": str(reply["type"]),
                                              "message": str(reply["error"])})
        raise RemoteError(f"the student's process answered with an error: {failure.message}", failure.type)
    return reply["value"]


def loopback(namespace: dict[str, Any]) -> Transport:
    """A transport to `serve` in this process, through the wire format (for tests)."""

    def transport(request: dict[str, Any]) -> Any:
        return result(*serve.answer(namespace, *wire.encode(request)))

    return transport
