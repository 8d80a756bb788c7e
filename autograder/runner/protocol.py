"""Messages between the grader and the processes that run student code.

A message is a JSON object, optionally followed by raw byte buffers (tensor data, files):

    4-byte big-endian length of the JSON header | JSON header | buffer 0 | buffer 1 | ...

The header lists the buffers' lengths under "buffers". Nothing is ever unpickled: what
comes from a process that ran student code is untrusted, and JSON plus bytes cannot
execute anything when read. Every read is bounded by the channel's limit.

Parsed JSON costs far more memory than its text (an empty list: 3 bytes of JSON, about 60
of Python), so the header is kept small: strings of `TEXT` characters or more (cell
outputs, source code) travel as raw buffers of their own, named in the header by a marker
string that starts with NUL (a string that starts with NUL always travels so), and a
header larger than `MAX_HEADER`, or with more than `MAX_VALUES` values (counted by their
separators, those in short strings too), or nested more than `MAX_DEPTH` deep (measured
before parsing: json's recursion is bounded only by the recursion limit, which code in the
grader's process may have raised past what the C stack holds), is refused before it is
parsed. What cannot be decoded (too large, too many values, nested too deeply, an integer
of thousands of digits) is `Undecodable`.
"""
from __future__ import annotations

import array
import itertools
import json
import re
import socket
import struct
from typing import Any, Sequence, TypeGuard

_LENGTH = struct.Struct(">I")
MAX_FDS = 4  # a control message carries at most a few descriptors
MAX_HEADER = 4 << 20  # bytes of JSON in one message
MAX_VALUES = 400_000  # values in it (about 120 bytes each at most, once parsed)
MAX_DEPTH = 100  # nesting of lists and objects (a wire payload at its own limit: under 70)
TEXT = 1024  # strings at least this long travel as raw buffers
MARK = "\x00"  # starts every string in a header that stands for a text buffer


class ProtocolError(Exception):
    """The other side sent something that is not a well-formed message within the limit."""


class ChannelClosed(ProtocolError):
    """The other side closed the channel (it exited or was killed)."""


class Undecodable(ProtocolError):
    """A message beyond the limits of what is decoded: too large a header, nested too
    deeply, a number too large."""


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
        """Raises ChannelClosed when the other side is gone."""
        texts: list[bytes] = []
        lengths = [len(b) for b in buffers]
        header = json.dumps({**message, "buffers": lengths, "texts": texts}, separators=(",", ":")).encode()
        if _MARKED.search(header) or _LONG.search(header):  # (most messages have no string to lift)
            lifted = _lift(message, texts)
            header = json.dumps({**lifted, "buffers": lengths, "texts": [len(t) for t in texts]},
                                separators=(",", ":")).encode()
        frame = b"".join([_LENGTH.pack(len(header)), header, *buffers, *texts])
        try:
            if fds:
                socket.send_fds(self.sock, [frame[:1]], list(fds))
                frame = frame[1:]
            self.sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError) as error:
            raise ChannelClosed(f"the other side closed the channel ({error.strerror})") from None

    def receive(self, timeout: float | None = None) -> tuple[dict[str, Any], list[bytearray], list[int]]:
        """The next message, its buffers and any descriptors passed with it.

        Raises TimeoutError when nothing complete arrives within `timeout` seconds,
        ChannelClosed at end of stream, ProtocolError for anything malformed.
        """
        self.sock.settimeout(timeout)
        fds: list[int] = []
        (size,) = _LENGTH.unpack(self._read(_LENGTH.size, fds))
        if size > min(self.limit, MAX_HEADER):
            raise Undecodable(f"a message header of {size} bytes, more than the limit of {min(self.limit, MAX_HEADER)}")
        header = self._read(size, fds)
        message = _parse(header)
        lengths = message.pop("buffers", None) if isinstance(message, dict) else None
        text_lengths = message.pop("texts", []) if isinstance(message, dict) else None
        if not isinstance(message, dict) or not _lengths(lengths) or not _lengths(text_lengths):
            raise ProtocolError("message is not a JSON object with lists of buffer lengths")
        if size + sum(lengths) + sum(text_lengths) > self.limit:
            raise ProtocolError(f"message of {size + sum(lengths) + sum(text_lengths)} bytes exceeds the "
                                f"limit of {self.limit}")
        buffers = [self._read(n, fds) for n in lengths]
        texts = [self._read(n, fds) for n in text_lengths]
        return (_restore(message, texts) if texts or _MARKED.search(header) else message), buffers, fds

    def _read(self, n: int, fds: list[int]) -> bytearray:
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
        return data  # (not copied into bytes: a tensor's buffer is used as it is)


def _lengths(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(n, int) and n >= 0 for n in value)


def _parse(data: bytes | bytearray) -> Any:
    values = sum(data.count(separator) for separator in (b",", b":", b"[", b"{"))
    if values > MAX_VALUES:
        raise Undecodable(f"a message header of more than {MAX_VALUES} values")
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH and _depth(data) > MAX_DEPTH:  # (fewer cannot nest deeper)
        raise Undecodable(f"a message nested more than {MAX_DEPTH} deep")
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProtocolError(f"message is not JSON: {error}") from None
    except RecursionError:
        raise Undecodable("a message nested too deeply to decode") from None
    except ValueError as error:  # an integer of thousands of digits
        raise Undecodable(f"a message with a value that cannot be decoded ({str(error)[:100]})") from None


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# What a JSON header holds if a string in it travels as a text buffer: a string that starts
# with NUL (json writes NUL as \u0000), or one of TEXT characters or more (each character is
# one or more in JSON). Either may match elsewhere too (then the message is walked for nothing).
_MARKED = re.compile(rb'"\\u0000')
_LONG = re.compile(rb'"(?:[^"\\]|\\.){%d}' % TEXT)
_BRACKET = re.compile(rb"[\[\]{}]")


def _depth(data: bytes | bytearray) -> int:
    """How deep the lists and objects of a JSON text nest (brackets in strings not counted);
    at C speed, without recursion."""
    brackets = _BRACKET.findall(_STRING.sub(b"", data))
    return max(itertools.accumulate(1 if b in (b"[", b"{") else -1 for b in brackets), default=0)


def _lift(value: Any, texts: list[bytes]) -> Any:
    """`value` with its long strings (and those that start with MARK) replaced by markers,
    their UTF-8 bytes appended to `texts`. Only values: dict keys stay as they are."""
    if isinstance(value, str):
        if len(value) < TEXT and not value.startswith(MARK):
            return value
        texts.append(value.encode("utf-8", "surrogatepass"))
        return f"{MARK}{len(texts) - 1}"
    if isinstance(value, dict):
        return {k: _lift(v, texts) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lift(v, texts) for v in value]
    return value


def _restore(value: Any, texts: Sequence[bytes | bytearray]) -> Any:
    """The inverse of `_lift`, on untrusted input (iterative: the depth is the sender's)."""
    decoded: dict[int, str] = {}

    def text(marker: str) -> str:
        index = marker[len(MARK):]
        if not (index.isascii() and index.isdigit() and len(index) < 10) or int(index) >= len(texts):
            raise ProtocolError("a text marker that names no text buffer")
        if int(index) not in decoded:  # (a lone surrogate, which the sender may pass, is replaced)
            decoded[int(index)] = texts[int(index)].decode("utf-8", "replace")
        return decoded[int(index)]

    if isinstance(value, str):
        return text(value) if value.startswith(MARK) else value
    stack = [value]
    while stack:
        container = stack.pop()
        keys = container.keys() if isinstance(container, dict) else range(len(container))
        for key in keys:
            item = container[key]
            if isinstance(item, str) and item.startswith(MARK):
                container[key] = text(item)
            elif isinstance(item, (dict, list)):
                stack.append(item)
    return value
