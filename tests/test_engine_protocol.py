"""The grader's channel: JSON and raw bytes only, bounded, and nothing executable."""
from __future__ import annotations

import os
import socket
import struct
import sys
from typing import Any

import pytest

from autograder.grader.records import cpu_seconds
from autograder.runner.protocol import MAX_HEADER, TEXT, Channel, ChannelClosed, ProtocolError, Undecodable
from autograder.student import wire


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield Channel(a), Channel(b, limit=1 << 16)
    a.close()
    b.close()


def test_messages_and_buffers_round_trip(pair):
    sender, receiver = pair
    sender.send({"op": "probe", "shape": [2, 3]}, buffers=[b"\x00\x01", b""])
    message, buffers, fds = receiver.receive(timeout=5)
    assert message == {"op": "probe", "shape": [2, 3]} and buffers == [b"\x00\x01", b""] and fds == []


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">I", 1 << 20) + b"{}",  # header over the limit
        struct.pack(">I", 5) + b"\x80abcd",  # not UTF-8 JSON
        struct.pack(">I", 2) + b"[]",  # not an object
        struct.pack(">I", 15) + b'{"buffers":[-1]}'[:15],  # broken JSON
        struct.pack(">I", 18) + b'{"buffers":[70000]}'[:18] + b"}",  # buffers over the limit
    ],
    ids=["header over the limit", "not UTF-8", "not an object", "broken JSON", "buffers over the limit"],
)
def test_malformed_frames_are_refused(pair, frame):
    sender, receiver = pair
    sender.sock.sendall(frame)
    with pytest.raises(ProtocolError):
        receiver.receive(timeout=5)


def test_pickles_are_just_bytes(pair):
    import pickle

    sender, receiver = pair
    payload = pickle.dumps(os.system)  # would run code if anything unpickled it
    sender.send({"op": "x"}, buffers=[payload])
    _, buffers, _ = receiver.receive(timeout=5)
    assert buffers == [payload]


def test_end_of_stream_and_timeout(pair):
    sender, receiver = pair
    with pytest.raises(TimeoutError):
        receiver.receive(timeout=0.05)
    sender.close()
    with pytest.raises(ChannelClosed):
        receiver.receive(timeout=5)


def test_descriptors_are_dropped_unless_accepted(pair):
    sender, receiver = pair
    before = len(os.listdir("/proc/self/fd"))
    with open(os.devnull) as f:
        sender.send({"op": "x"}, fds=[f.fileno()])
    _, _, fds = receiver.receive(timeout=5)
    assert fds == [] and len(os.listdir("/proc/self/fd")) == before


def test_long_strings_travel_beside_a_small_header(pair):
    """Outputs and sources leave the JSON header, so its parsed size stays bounded; a
    string that looks like a marker (it starts with NUL) travels as text too."""
    a, b = socket.socketpair()
    sender, receiver = Channel(a), Channel(b, limit=1 << 24)
    long, marker_like = "é" * (TEXT * 4), "\x00" + "0"
    message = {"op": "executed", "outputs": [{"text": long, "short": "x", "other": marker_like}], long[:5]: 1}
    sender.send(message, buffers=[b"tensor"])
    got, buffers, _ = receiver.receive(timeout=5)
    assert got == message and buffers == [b"tensor"]
    a.close(), b.close()


def test_a_short_message_with_a_marker_like_string_still_lifts_it(pair):
    """Only messages that may hold a string to lift are walked: one that starts with NUL,
    alone in a short message, is still found."""
    sender, receiver = pair
    message = {"op": "answer", "value": ["\x00" + "0", {"k": "\x00"}], "\x00key": "x"}
    sender.send(message)
    assert receiver.receive(timeout=5)[0] == message


def test_many_shallow_brackets_are_not_too_deep(pair):
    sender, receiver = pair
    message = {"op": "answer", "value": [[k] for k in range(500)]}
    sender.send(message)
    assert receiver.receive(timeout=5)[0] == message


def _frame(header: bytes) -> bytes:
    return struct.pack(">I", len(header)) + header


@pytest.mark.parametrize("header", [
    b'{"buffers":[],"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"buffers":[],"x":' + b"1" * 5000 + b"}",
], ids=["nested too deeply", "an integer of 5000 digits"])
def test_what_cannot_be_decoded_is_named_so(header):
    a, b = socket.socketpair()
    receiver = Channel(b, limit=1 << 24)
    a.sendall(_frame(header))
    with pytest.raises(Undecodable):
        receiver.receive(timeout=5)
    a.close(), b.close()


def test_depth_is_refused_whatever_the_recursion_limit():
    """json recurses as deep as the recursion limit lets it: raised (as a notebook or a check
    may raise it), a deep header would overflow the C stack. The depth is measured first."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1_000_000)
    try:
        test_what_cannot_be_decoded_is_named_so(b'{"buffers":[],"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    finally:
        sys.setrecursionlimit(limit)


def test_a_payload_at_the_wire_depth_limit_travels(pair):
    sender, receiver = pair
    value: Any = 1.0
    for level in range(wire.MAX_DEPTH):  # tuples and dicts: the deepest JSON per level
        value = (value,) if level % 2 else {"k": value}
    encoded, _ = wire.encode(value)
    sender.send({"op": "result", "value": encoded})
    assert wire.decode(receiver.receive(timeout=5)[0]["value"], []) == value


def test_a_header_is_refused_before_it_is_parsed():
    a, b = socket.socketpair()
    receiver = Channel(b, limit=1 << 30)
    a.sendall(struct.pack(">I", MAX_HEADER + 1))
    with pytest.raises(Undecodable, match="header"):
        receiver.receive(timeout=5)
    a.close(), b.close()


@pytest.mark.parametrize("marker,texts", [("\\u00009", "[1]"), ("\\u0000\u00b2", "[1]"),
                                          ("\\u0000" + "9" * 5000, "[1]"), ("\\u00000", "[]")],
                         ids=["missing", "unicode digit", "huge index", "no text buffers at all"])
def test_a_text_marker_must_name_a_text_buffer(pair, marker, texts):
    sender, receiver = pair
    sender.sock.sendall(_frame(('{"buffers":[],"texts":' + texts + ',"x":"' + marker + '"}').encode()) + b"a")
    with pytest.raises(ProtocolError):
        receiver.receive(timeout=5)


def test_a_closed_peer_is_named_closed_when_sending(pair):
    sender, receiver = pair
    receiver.close()
    with pytest.raises(ChannelClosed):
        for _ in range(100):
            sender.send({"op": "x"}, buffers=[b"0" * 65536])


def test_a_payload_cannot_make_the_receiver_allocate_what_it_chooses():
    """A meta tensor has a shape and no data: its bytes count as if it had them, so a
    check that allocates a tensor of a shape it received stays within the payload's budget."""
    from autograder.student import wire

    huge = {"__meta__": [1 << 20, 1 << 20], "dtype": "float64", "grad": False}
    with pytest.raises(wire.WireError, match="larger than"):
        wire.decode(huge, [])
    many = [{"__meta__": [1], "dtype": "float64", "grad": False}] * (wire.MAX_TENSORS + 1)
    with pytest.raises(wire.WireError, match="tensors"):
        wire.decode(many, [])
    fits = wire.decode({"__meta__": [4, 5], "dtype": "float32", "grad": True}, [])
    assert fits.shape == (4, 5) and fits.device.type == "meta" and fits.requires_grad


@pytest.mark.parametrize("dtype", list(wire.DTYPES.values()), ids=list(wire.DTYPES))
def test_every_accepted_dtype_travels_as_it_reads(dtype):
    """Views, transposes, empty tensors, 0-d ones and lazily conjugated or negated ones
    arrive with the values they read as (bfloat16 has no NumPy type: its bits travel)."""
    import torch

    x = (torch.arange(60, dtype=torch.float64).reshape(3, 4, 5) - 30).to(dtype)
    views = [x, x.transpose(0, 2), x[:, 1:, ::2], x.expand(2, 3, 4, 5), x[0, 0, 0], x[:0]]
    if dtype.is_complex:
        views += [x.conj(), x.conj().imag]
    for view in views:
        structure, buffers = wire.encode(view)
        assert torch.equal(wire.decode(structure, buffers), view.resolve_conj().resolve_neg())


@pytest.mark.parametrize("sent, kept", [(0.25, 0.25), (3, 3.0), (-1.0, 0.0), (1e308, 3600.0), (float("nan"), 0.0),
                                        (float("inf"), 0.0), ("1", 0.0), (None, 0.0)])
def test_the_cpu_a_process_reports_is_a_finite_number_within_an_hour(pair, sent, kept):
    """JSON carries NaN and Infinity: a forged CPU time must not reach the class report as one."""
    sender, receiver = pair
    sender.send({"op": "executed", "cpu": sent})
    message, _, _ = receiver.receive(timeout=5)
    assert cpu_seconds(message["cpu"]) == kept
