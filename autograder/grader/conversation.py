"""The grader's side of one notebook's channel: requests with ids, replies checked.

Every request carries a fresh random id, which its reply must repeat. The notebook's own
code shares the child's process, so it can write to the channel too: a message that
answers no request (an unsolicited frame, one written ahead to be read as a later reply,
a reply of the wrong kind), or a malformed or oversized one, is `Tampering` — the grader
stops talking to that notebook, never reads a shifted reply, and the cells it had not
finished judging score 0. While a probe runs, the course's code in the child may put
questions to the grader under that probe's id (:func:`autograder.student.probe.ask`);
the check that is running answers them (:func:`autograder.student.probe.answering`).

The notebook's cells run within the notebook's time budget; judging its test cells has a
budget of its own, so the grader's work is not counted against the student.
"""
from __future__ import annotations

import secrets
import time
from typing import Any, Callable, Iterator

from ..checks import remote
from ..runner.protocol import Channel, ProtocolError
from ..student import probe, wire
from .records import Run, Verdict, cpu_seconds, cut
from .verdicts import Judge

QUESTIONS = 100_000  # per probe: far more than any check asks
CHANGES = 20  # changes to the probes' modules kept per test cell, as evidence


class Tampering(ProtocolError):
    """The notebook's process sent something no honest child sends (the message says what)."""


class Conversation:
    """Requests to one notebook's process. `lost` is why judging stopped, if it did."""

    def __init__(self, channel: Channel, judging_budget: float) -> None:
        self.channel = channel
        self.judging_budget = judging_budget
        self.judging = 0.0  # seconds spent judging so far
        self.answers = 0  # bytes received for judging (not the notebook's output)
        self.probe_cpu = 0.0  # CPU seconds the process says it spent answering (for statistics only)
        self.lost: Exception | None = None
        self.breach: str | None = None  # why the cell being judged scores 0 whatever its checks made of it

    def execute(self, cells: list[tuple[str, int]], deadline: Callable[[], float]) -> Iterator[dict[str, Any]]:
        """Run a run of the notebook's own cells, (source, execution count) each, one after the
        other; yields each one's reply (outputs, execution count, CPU) as it comes, within the
        time `deadline()` says is left then."""
        request_id = self._send({"op": "execute", "cells": [{"code": code, "count": count} for code, count in cells]},
                                [])
        for _ in cells:
            reply, _ = self._reply(request_id, "executed", deadline())
            outputs = reply.get("outputs")
            if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
                raise Tampering("an execution reply that is not a list of outputs")
            yield reply

    def judge(self, judge: Judge, index: int, run: Run) -> Verdict:
        """Judge test cell `index` here: put back what the notebook changed in the modules the
        probes rely on (adding it to `run.changed`, and what it attempted besides to
        `run.worth_a_look`), then run the cell against the process."""
        self.restore(run)
        self.breach = None
        return judge.judge(index, self.transport)

    def restore(self, run: Run) -> None:
        """Put back what the notebook changed and take what it attempted, as before a test
        cell (also after the last one: what the last checks saw)."""
        reply, _ = self._judging({"op": "restore"}, [], "restored")
        for key, found in (("changes", run.changed), ("attempts", run.worth_a_look)):
            listed = reply.get(key)
            if not isinstance(listed, list) or not all(isinstance(c, str) for c in listed):
                raise Tampering(f"a restore reply whose {key} are not a list of strings")
            found.extend(c for c in (cut(c, 200) for c in listed[:CHANGES]) if c not in found)

    def transport(self, request: dict[str, Any]) -> Any:
        """One probe (see autograder.checks.remote.Remote)."""
        if self.lost is not None:
            raise remote.RemoteError("the student's process stopped answering")
        try:
            structure, buffers = wire.encode(request)
            reply, reply_buffers = self._judging({"op": "probe", "request": structure}, buffers, "answer")
        except (TimeoutError, ProtocolError, OSError) as error:
            self.lost = error  # the checks may swallow it: the run ends when the judge returns
            raise remote.RemoteError(f"the student's process did not answer ({error})") from None
        self.probe_cpu += cpu_seconds(reply.get("cpu"))
        try:
            return remote.result(reply.get("answer"), reply_buffers)
        except wire.WireError as error:  # the checks may swallow it too: the cell scores 0 when judged
            self.breach = self.breach or f"the student's process answered with more than the grader accepts ({error})"
            raise remote.RemoteError(self.breach) from None

    def _judging(self, message: dict[str, Any], buffers: list[bytes],
                 expected: str) -> tuple[dict[str, Any], list[bytearray]]:
        started, received = time.monotonic(), self.channel.received
        try:
            return self._request(message, buffers, expected, max(self.judging_budget - self.judging, 0.001))
        finally:
            self.judging += time.monotonic() - started
            self.answers += self.channel.received - received

    def _request(self, message: dict[str, Any], buffers: list[bytes], expected: str,
                 timeout: float) -> tuple[dict[str, Any], list[bytearray]]:
        """Send `message` under a new id; the reply of kind `expected` under the same id."""
        return self._reply(self._send(message, buffers), expected, timeout)

    def _send(self, message: dict[str, Any], buffers: list[bytes]) -> str:
        request_id = secrets.token_hex(8)
        self.channel.send({**message, "id": request_id}, buffers)
        return request_id

    def _reply(self, request_id: str, expected: str, timeout: float) -> tuple[dict[str, Any], list[bytearray]]:
        """The next reply to `request_id`, of kind `expected`. Questions asked meanwhile
        (probes only) are answered on the way."""
        deadline = time.monotonic() + timeout
        for _ in range(QUESTIONS):
            reply, reply_buffers, _ = self.channel.receive(timeout=max(deadline - time.monotonic(), 0.001))
            if reply.get("id") != request_id:
                raise Tampering(f"a message that answers no request ({_describe(reply)})")
            if reply.get("op") == "question" and expected == "answer":
                self._answer_question(request_id, reply, reply_buffers)
                continue
            if reply.get("op") != expected:
                raise Tampering(f"a reply of the wrong kind ({_describe(reply)}; expected '{expected}')")
            return reply, reply_buffers
        raise Tampering(f"more than {QUESTIONS} questions during one probe")

    def _answer_question(self, request_id: str, message: dict[str, Any], buffers: list[bytearray]) -> None:
        """Answer with the running check's handler; a question it refuses, or one asked when
        no check answers questions, gets an error answer (the course's code raises it)."""
        handler = probe.handler()
        try:
            question = wire.decode(message.get("question"), buffers)
            if handler is None:
                raise probe.NobodyToAsk("no check is running that could answer this")
            answer = {"value": handler(question)}
        except Exception as error:  # untrusted question: whatever the handler raises is a refusal
            answer = {"error": f"{type(error).__name__}: {error}"}
        structure, answer_buffers = wire.encode(answer)
        self.channel.send({"op": "reply", "id": request_id, "answer": structure}, answer_buffers)


def _describe(message: dict[str, Any]) -> str:
    """A short, safe description of a message the notebook's process sent."""
    kind = message.get("op")
    return f"op {str(kind)[:40]!r}" if isinstance(kind, str) else "no op"

