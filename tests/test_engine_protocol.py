"""The grader's channel: JSON and raw bytes only, bounded, and nothing executable."""
from __future__ import annotations

import os
import socket
import struct

import pytest

from autograder.runner.protocol import Channel, ChannelClosed, ProtocolError


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
