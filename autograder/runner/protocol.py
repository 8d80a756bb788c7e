"""Messages between the grader and the processes that run student code.

A message is a JSON object, optionally followed by raw byte buffers (tensor data, files):

    4-byte big-endian length of the JSON header | JSON header | buffer 0 | buffer 1 | ...

The header lists the buffers' lengths under "buffers". Nothing is ever unpickled: what
comes from a process that ran student code is untrusted, and JSON plus bytes cannot
execute anything when read. Every read is bounded by the channel's limit.
"""
from __future__ import annotations

import array
import json
import socket
import struct
from typing import Any, Sequence

_LENGTH = struct.Struct(">I")
MAX_FDS = 4  # a control message carries at most a few descriptors


class ProtocolError(Exception):
    """The other side sent something that is not a well-formed message within the limit."""


class ChannelClosed(ProtocolError):
    """The other side closed the channel (it exited or was killed)."""


class Channel:
    """Length-prefixed JSON messages with raw buffers over a stream socket."""

    def __init__(self, sock: socket.socket, limit: int = 64 << 20, accept_fds: bool = False) -> None:
        self.sock = sock
        self.limit = limit  # largest message accepted, header and buffers together
        self.accept_fds = accept_fds  # only trusted peers may pass descriptors
        self.received = 0  # bytes received so far

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def send(self, message: dict[str, Any], buffers: Sequence[bytes] = (), fds: Sequence[int] = ()) -> None:
        header = json.dumps({**message, "buffers": [len(b) for b in buffers]}, separators=(",", ":")).encode()
        frame = b"".join([_LENGTH.pack(len(header)), header, *buffers])
        if fds:
            socket.send_fds(self.sock, [frame[:1]], list(fds))
            frame = frame[1:]
        self.sock.sendall(frame)

    def receive(self, timeout: float | None = None) -> tuple[dict[str, Any], list[bytes], list[int]]:
        """The next message, its buffers and any descriptors passed with it.

        Raises TimeoutError when nothing complete arrives within `timeout` seconds,
        ChannelClosed at end of stream, ProtocolError for anything malformed.
        """
        self.sock.settimeout(timeout)
        fds: list[int] = []
        (size,) = _LENGTH.unpack(self._read(_LENGTH.size, fds))
        if size > self.limit:
            raise ProtocolError(f"message header of {size} bytes exceeds the limit of {self.limit}")
        try:
            message = json.loads(self._read(size, fds))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ProtocolError(f"message is not JSON: {error}") from None
        lengths = message.pop("buffers", None) if isinstance(message, dict) else None
        if not isinstance(message, dict) or not isinstance(lengths, list) or not all(
            isinstance(n, int) and n >= 0 for n in lengths
        ):
            raise ProtocolError("message is not a JSON object with a list of buffer lengths")
        if size + sum(lengths) > self.limit:
            raise ProtocolError(f"message of {size + sum(lengths)} bytes exceeds the limit of {self.limit}")
        return message, [self._read(n, fds) for n in lengths], fds

    def _read(self, n: int, fds: list[int]) -> bytes:
        data = bytearray()
        while len(data) < n:
            if self.accept_fds:
                chunk, ancillary, _, _ = self.sock.recvmsg(n - len(data), socket.CMSG_SPACE(MAX_FDS * 4))
                for level, kind, payload in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        passed = array.array("i")
                        passed.frombytes(payload[: len(payload) - len(payload) % passed.itemsize])
                        fds.extend(passed)
            else:  # descriptors sent anyway are discarded (closed) by the kernel
                chunk = self.sock.recv(min(n - len(data), 1 << 20))
            if not chunk:
                raise ChannelClosed("the other side closed the channel")
            data += chunk
            self.received += len(chunk)
        return bytes(data)
