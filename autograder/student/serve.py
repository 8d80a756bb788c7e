"""The student's end of judging in another process: answer the grader's requests.

The grader sends a request naming an object of the student's notebook and a probe
procedure registered in this package (:mod:`.probe`); the procedure runs here, on the
student's object, and its plain-data result goes back in wire form (:mod:`.wire`). No
other code can be asked for: the procedures only compute, the grader judges.
"""
from __future__ import annotations

import importlib
import types
from typing import Any

from . import probe, wire

PACKAGE = __package__ + "."  # procedures and references live in this package only


@probe.procedure
def resolve(obj: Any) -> dict[str, Any]:
    """A name in the student's notebook: plain data is copied to the grader; a module is
    named (the grader imports its own: `torch` in a test cell is torch); anything else stays
    where it is (and is reached through a proxy)."""
    if isinstance(obj, types.ModuleType):
        return {"data": False, "module": obj.__name__}
    try:
        wire.encode(obj)
    except wire.WireError:
        return {"data": False}
    return {"data": True, "value": obj}


def serve(namespace: dict[str, Any], request: Any) -> Any:
    """Answer one request against the student's namespace (in the student's process).

    Only registered probe procedures of this package can be run.
    """
    if not isinstance(request, dict) or set(request) != {"name", "procedure", "args"}:
        raise ValueError("malformed request")
    name, key, args = request["name"], request["procedure"], request["args"]
    if not isinstance(key, str) or not key.startswith(PACKAGE) or ":" not in key:
        raise ValueError(f"not a probe procedure: {key!r}")
    importlib.import_module(key.split(":")[0])  # registers the module's procedures
    if key not in probe.PROCEDURES:
        raise ValueError(f"not a probe procedure: {key!r}")
    if not isinstance(name, str) or name not in namespace:
        raise NameError(f"name {name!r} is not defined in the notebook")
    if not isinstance(args, list):
        raise ValueError("malformed request")
    return probe.PROCEDURES[key](namespace[name], *args)


def answer(namespace: dict[str, Any], structure: Any, buffers: list[bytes]) -> tuple[Any, list[bytes]]:
    """A request in wire form -> the answer in wire form (in the student's process).

    Whatever goes wrong — an unknown name, a result that is not plain data — becomes an
    error answer, which the grader turns into a failed check.
    """
    try:
        return wire.encode({"value": serve(namespace, wire.decode(structure, buffers, references=True))})
    except Exception as error:  # report it; never let the request loop die
        failure = probe.ProbeError.of("probe", error)
        return wire.encode({"error": f"{failure.type}: {failure.message}", "type": failure.type})
