"""Student objects in another process: the trusted end (`Remote`) and the student's end
(`serve`).

A check given a `Remote` instead of the student's object runs unchanged in the grader's
own process: wherever a check runs student code, the probe (:mod:`.probe`) sends a request
instead and gets plain numbers back (:mod:`.wire`). So the judging — references,
comparisons, finite differences — happens where student code never runs, while `serve`,
in the student's process, only computes.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

import torch

from . import probe, wire

Transport = Callable[[str, dict], Any]  # (kind, payload) -> answer; plain data both ways


class RemoteError(Exception):
    """The student's process did not answer properly (crashed, timed out, sent garbage)."""


class Remote(probe.StudentProxy):
    """The object called `name` in the student's notebook, reached through `transport`."""

    def __init__(self, name: str, transport: Transport) -> None:
        self.name = name
        self._transport = transport

    def __repr__(self) -> str:
        return f"<the student's {self.name}>"

    def _ask(self, kind: str, **payload: Any) -> Any:
        return self._transport(kind, {"name": self.name, **payload})

    def argument_names(self) -> list[str]:
        names = self._ask("arguments")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise RemoteError("malformed answer to 'arguments'")
        return names

    def value(self) -> Any:
        """The object itself, when it is plain data (answers to questions)."""
        return self._ask("value")

    def run(self, args, grad_outputs, grad_grads) -> probe.Probe:
        answer = self._ask("run", args=tuple(args), grad_outputs=[list(v) for v in grad_outputs], grad_grads=grad_grads)
        try:
            return probe.Probe(
                outputs=_tensors(answer["outputs"]),
                grads=[_tensors(g, optional=True) for g in answer["grads"]],
                grads2=None if answer["grads2"] is None else _tensors(answer["grads2"], optional=True),
                modified=[int(i) for i in answer["modified"]],
                error=_error(answer["error"]),
            )
        except (KeyError, TypeError, ValueError) as bad:
            raise RemoteError(f"malformed answer to 'run': {bad}") from None

    def forward_many(self, arg_sets: list[tuple]) -> list[list[torch.Tensor] | probe.ProbeError]:
        answer = self._ask("forward_many", arg_sets=list(arg_sets))
        if not isinstance(answer, list) or len(answer) != len(arg_sets):
            raise RemoteError("malformed answer to 'forward_many'")
        return [_error(a) if isinstance(a, dict) else _tensors(a) for a in answer]

    def meta(self, args) -> probe.ProbeError | None:
        return _error(self._ask("meta", args=tuple(args)))


def _tensors(values: Any, optional: bool = False) -> list:
    if not isinstance(values, list) or not all(
        isinstance(v, torch.Tensor) or (optional and v is None) for v in values
    ):
        raise ValueError("expected a list of tensors")
    return values


def _error(value: Any) -> probe.ProbeError | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"stage", "type", "message"} or not all(
        isinstance(v, str) for v in value.values()
    ):
        raise ValueError("malformed error")
    return probe.ProbeError(**value)


# --- the student's end --------------------------------------------------------------------

def serve(namespace: dict, kind: str, payload: dict) -> Any:
    """Answer one request against the student's namespace (in the student's process)."""
    name = payload.get("name")
    if not isinstance(name, str) or name not in namespace:
        raise NameError(f"name {name!r} is not defined in the notebook")
    obj = namespace[name]
    if kind == "arguments":
        return probe.argument_names(obj)
    if kind == "value":
        return obj
    if kind == "run":
        args = _requiring_grad(payload["args"])
        grad_grads = payload["grad_grads"]
        return asdict(probe.run(obj, args, payload["grad_outputs"], grad_grads))
    if kind == "forward_many":
        return [_as_data(probe.forward(obj, args)) for args in payload["arg_sets"]]
    if kind == "meta":
        return _as_data(probe.meta(obj, _requiring_grad(payload["args"])))
    raise ValueError(f"unknown request {kind!r}")


def _requiring_grad(args: Any) -> tuple:
    return tuple(a.requires_grad_() if probe.differentiable(a) else a for a in args)


def _as_data(result: Any) -> Any:
    return asdict(result) if isinstance(result, probe.ProbeError) else result


def loopback(namespace: dict) -> Transport:
    """A transport to `serve` in this process, through the wire format (for tests)."""

    def transport(kind: str, payload: dict) -> Any:
        request = wire.decode(*wire.encode(payload))
        return wire.decode(*wire.encode(serve(namespace, kind, request)))

    return transport
