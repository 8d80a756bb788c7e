"""The grader's memory under the worst messages a student's process can send.

Each payload goes through the grader's own reading path — `Channel.receive` (framing, the
header limit, JSON) and `remote.result` (tensors, meta shapes) — and what a check then
allocates from it (a random tensor of each shape it received, as finite differences do).
Prints the peak of Python's allocations (tracemalloc, torch's CPU tensors included) per
payload, refused or not. Run: .venv/bin/python bench/hostile_payloads.py
"""
from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import tracemalloc

import torch

from autograder.checks import remote
from autograder.runner.protocol import MAX_HEADER, MAX_VALUES, Channel, ProtocolError
from autograder.student import wire

LIMIT = 6 * (8 << 20) + (1 << 20)  # a notebook channel's limit at the default output limit (grader/pool.py)


def _frame(header: dict | bytes, buffers: list[bytes] = ()) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps({**header, "buffers": [len(b) for b in buffers]}).encode()
    return struct.pack(">I", len(raw)) + raw + b"".join(buffers)


def _answer(value: dict) -> bytes:
    structure, buffers = wire.encode({"value": value}) if "__raw__" not in value else (value["__raw__"], [])
    return _frame({"op": "answer", "id": "x", "answer": structure}, buffers)


def _text_answer(message: str) -> bytes:
    """An error answer whose message travels as a raw text buffer, as Channel.send sends it."""
    a, b = socket.socketpair()
    writer = threading.Thread(target=Channel(a).send, args=({"op": "answer", "id": "x", "answer": {
        "__dict__": {"error": message, "type": "E"}}},))
    writer.start()
    data = bytearray()
    b.settimeout(5)
    with contextlib.suppress(TimeoutError):
        while chunk := b.recv(1 << 20):
            data += chunk
    writer.join()
    a.close(), b.close()
    return bytes(data)


def _empty_lists(count: int) -> bytes:
    return b'{"op":"answer","id":"x","answer":[' + b"[]," * count + b'[]],"buffers":[]}'


PAYLOADS = {
    "empty lists, as many as a header may hold": lambda: _frame(_empty_lists(MAX_VALUES // 2 - 10)),
    "empty lists, over the limit of values": lambda: _frame(_empty_lists(MAX_VALUES)),
    "header just over the limit": lambda: struct.pack(">I", MAX_HEADER + 1) + b"{",
    "nested 100,000 deep": lambda: _frame(b'{"buffers":[],"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "a meta tensor of 2^40 float64 elements": lambda: _answer(
        {"__raw__": {"__dict__": {"value": {"__meta__": [1 << 20, 1 << 20], "dtype": "float64", "grad": False}}}}),
    "10,001 meta tensors": lambda: _answer(
        {"__raw__": {"__dict__": {"value": [{"__meta__": [64], "dtype": "float64", "grad": False}] * 10_001}}}),
    "48 MiB of real tensor data": lambda: _answer({"t": torch.zeros(6 << 20, dtype=torch.float64)}),
    "a 40 MB exception message (as a text buffer)": lambda: _text_answer("x" * 40_000_000),
}


def measure(name: str, make) -> tuple[float, str]:
    data = make()
    a, b = socket.socketpair()
    def send() -> None:
        with contextlib.suppress(OSError):  # the grader stops reading what it refuses
            a.sendall(data)
        a.close()

    sender = threading.Thread(target=send)
    tracemalloc.start()
    sender.start()
    outcome = "accepted"
    try:
        message, buffers, _ = Channel(b, limit=LIMIT).receive(timeout=30)
        value = remote.result(message.get("answer"), buffers)
        for t in (value.values() if isinstance(value, dict) else value if isinstance(value, list) else []):
            if isinstance(t, torch.Tensor):
                torch.randn(t.shape, dtype=t.dtype)  # what a check allocates from a shape it received
    except (ProtocolError, wire.WireError, remote.RemoteError) as error:
        outcome = f"refused: {type(error).__name__}: {str(error)[:70]}"
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    b.close()
    sender.join()
    return peak / 2**20, outcome


if __name__ == "__main__":
    print(f"{'payload':<52} {'peak MiB':>9}  outcome")
    for name, make in PAYLOADS.items():
        peak, outcome = measure(name, make)
        print(f"{name:<52} {peak:9.1f}  {outcome}")
