"""Student objects in another process: the trusted end (`Remote`) and the student's end
(`serve`).

A check given a `Remote` instead of the student's object runs unchanged in the grader's
own process: wherever a check runs student code, it goes through a probe procedure
(:func:`.probe.invoke`), which a `Remote` sends to the student's process; plain numbers come
back (:mod:`.wire`). So the judging — references, comparisons, finite differences — happens
where student code never runs, while `serve`, in the student's process, only computes.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from . import probe, wire

Transport = Callable[[dict], Any]  # request -> answer, both plain data


class RemoteError(Exception):
    """The student's process could not answer a request."""


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


@probe.procedure
def resolve(obj: Any) -> dict:
    """A name in the student's notebook: plain data is copied to the grader; anything else
    stays where it is (and is reached through a `Remote`)."""
    try:
        wire.encode(obj)
    except wire.WireError:
        return {"data": False}
    return {"data": True, "value": obj}


def serve(namespace: dict, request: Any) -> Any:
    """Answer one request against the student's namespace (in the student's process).

    Only registered probe procedures of this package can be run.
    """
    if not isinstance(request, dict) or set(request) != {"name", "procedure", "args"}:
        raise ValueError("malformed request")
    name, key, args = request["name"], request["procedure"], request["args"]
    if not isinstance(key, str) or not key.startswith("autograder.") or ":" not in key:
        raise ValueError(f"not a probe procedure: {key!r}")
    importlib.import_module(key.split(":")[0])  # registers the module's procedures
    if key not in probe.PROCEDURES:
        raise ValueError(f"not a probe procedure: {key!r}")
    if not isinstance(name, str) or name not in namespace:
        raise NameError(f"name {name!r} is not defined in the notebook")
    return probe.PROCEDURES[key](namespace[name], *args)


def answer(namespace: dict, structure: Any, buffers: list[bytes]) -> tuple[Any, list[bytes]]:
    """A request in wire form -> the answer in wire form (in the student's process).

    Whatever goes wrong — an unknown name, a result that is not plain data — becomes an
    error answer, which the grader turns into a failed check.
    """
    try:
        return wire.encode({"value": serve(namespace, wire.decode(structure, buffers, references=True))})
    except Exception as error:  # report it; never let the request loop die
        return wire.encode({"error": f"{type(error).__name__}: {error}"})


def result(structure: Any, buffers: list[bytes]) -> Any:
    """An answer in wire form -> its value (in the grader); raises RemoteError for errors."""
    reply = wire.decode(structure, buffers)
    if not isinstance(reply, dict) or len(reply) != 1 or not ({"value", "error"} & set(reply)):
        raise RemoteError("malformed answer from the student's process")
    if "error" in reply:
        raise RemoteError(f"the student's process answered with an error: {reply['error']}")
    return reply["value"]


def loopback(namespace: dict) -> Transport:
    """A transport to `serve` in this process, through the wire format (for tests)."""

    def transport(request: dict) -> Any:
        return result(*answer(namespace, *wire.encode(request)))

    return transport
