"""The grader's side of judging in a student's process: probe requests and their answers
on the notebook's channel, within a time budget of their own (the notebook's time is not
spent on them). When the process fails to answer, the failure ends the run."""
from __future__ import annotations

import dataclasses
import time

from ..checks import remote
from ..student import wire
from .verdicts import Judge
from .pool import Run
from ..runner.protocol import Channel, ProtocolError


class Probes:
    """Requests to one notebook's process; `lost` is why it stopped answering, if it did."""

    def __init__(self, channel: Channel, budget: float) -> None:
        self.channel, self.budget = channel, budget
        self.seconds = 0.0  # spent so far
        self.received = 0  # bytes of answers (not the notebook's output)
        self.lost: Exception | None = None

    def judge(self, judge: Judge, index: int, run: Run) -> None:
        reply, _ = self._ask({"op": "restore"}, [])
        changes = reply.get("changes")
        if not isinstance(changes, list) or not all(isinstance(c, str) for c in changes):
            raise ProtocolError("a reply that is not a list of changes")
        run.changed.extend(c for c in changes if c not in run.changed)
        found = judge.judge(index, self.transport)
        if found is not None and self.lost is not None:  # whatever the checks made of it: no answer, no points
            found = dataclasses.replace(found, score=0.0, report=f"{found.report}\nThe notebook's process stopped answering.")
        if found is not None:
            run.verdicts[index] = found
        if self.lost is not None:
            raise self.lost

    def transport(self, request: dict) -> object:
        if self.lost is not None:
            raise remote.RemoteError("the student's process stopped answering")
        try:
            structure, buffers = wire.encode(request)
            reply, buffers = self._ask({"op": "probe", "request": structure}, buffers)
        except (TimeoutError, ProtocolError, OSError) as error:
            self.lost = error  # the checks may swallow it: the run ends when the judge returns
            raise remote.RemoteError(f"the student's process did not answer ({error})") from None
        return remote.result(reply.get("answer"), buffers)

    def _ask(self, request: dict, buffers: list[bytes]) -> tuple[dict, list[bytes]]:
        started, received = time.monotonic(), self.channel.received
        try:
            self.channel.send(request, buffers)
            reply, buffers, _ = self.channel.receive(timeout=max(self.budget - self.seconds, 0.001))
        finally:
            self.seconds += time.monotonic() - started
            self.received += self.channel.received - received
        return reply, buffers
