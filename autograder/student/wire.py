"""Plain data and tensors as JSON plus raw buffers — the only form in which values leave
a process that runs student code.

Decoding builds nothing but dicts, lists, tuples, strings, numbers, booleans, None and
CPU tensors of a few dtypes, checking every size against its buffer: a hostile peer can
send wrong values, never code. What the receiver may later allocate from a shape is
bounded too: every tensor counts its bytes, a meta tensor (a shape without data) as if it
had them and an empty one as if its dimensions of size 0 were 1, against `MAX_BYTES` per
payload, and a payload holds at most `MAX_TENSORS`.
"""
from __future__ import annotations

import importlib
import math
from typing import Any, Sequence

import torch

from . import probe

DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                  torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex128, torch.complex64)
}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
MAX_DEPTH = 32
MAX_BYTES = 64 << 20  # bytes of tensors in one payload, counting a meta tensor's as if it had data
MAX_TENSORS = 10_000
PACKAGE = __package__ + "."  # registered functions live in this package only


class WireError(ValueError):
    """A payload that is not plain data."""


def encode(value: Any) -> tuple[Any, list[bytes]]:
    """(JSON-able structure, buffers) for `value`."""
    buffers: list[bytes] = []

    def walk(v: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise WireError("payload nested too deeply")
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v if v == v and abs(v) != float("inf") else {"__float__": repr(v)}
        if isinstance(v, torch.Tensor):
            device, dtype = v.device.type, _name(v.dtype)
            if device == "meta":
                return {"__meta__": list(v.shape), "dtype": dtype, "grad": v.requires_grad}
            t = v.detach() if device == "cpu" else v.detach().to("cpu")
            buffers.append(_bytes(t) if t.numel() else b"")
            return {"__tensor__": len(buffers) - 1, "dtype": dtype, "shape": list(t.shape), "grad": v.requires_grad,
                    "device": device}
        if isinstance(v, tuple):
            return {"__tuple__": [walk(x, depth + 1) for x in v]}
        if isinstance(v, list):
            return [walk(x, depth + 1) for x in v]
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise WireError("only string keys can be sent")
            return {"__dict__": {k: walk(x, depth + 1) for k, x in v.items()}}
        if isinstance(v, torch.Size):
            return {"__tuple__": list(v)}
        if callable(v) and id(v) in probe.REFERENCE_KEYS:
            return {"__reference__": probe.REFERENCE_KEYS[id(v)]}
        raise WireError(f"{type(v).__name__} cannot be sent (plain data and tensors only)")

    return walk(value, 0), buffers


def _name(dtype: torch.dtype) -> str:
    return NAMES.get(dtype) or str(dtype).removeprefix("torch.")  # (a dtype not in DTYPES is refused when read)


def _bytes(t: torch.Tensor) -> bytes:
    """A CPU tensor's elements in order, as bytes (NumPy has no bfloat16: its bits as int16)."""
    if t.dtype is torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy(force=t.is_conj() or t.is_neg()).tobytes()


def decode(structure: Any, buffers: Sequence[bytes | bytearray], *, references: bool = False) -> Any:
    """The value `encode` produced, rebuilt from untrusted input.

    With `references` (only on the student's side, reading the grader's requests),
    registered functions of the checks are resolved by name.
    """

    spent = {"bytes": 0, "tensors": 0}

    def charge(shape: list[int], dtype: torch.dtype) -> int:
        """The tensor's element count, once it fits what is left of the payload's budget. A
        dimension of size 0 is charged as 1: an empty tensor of shape (8000000, 0) has no
        data, yet 8 million rows to anything that walks it (`.tolist()`, a loop)."""
        numel = math.prod(shape)
        spent["bytes"] += math.prod(max(n, 1) for n in shape) * dtype.itemsize
        spent["tensors"] += 1
        if spent["bytes"] > MAX_BYTES or spent["tensors"] > MAX_TENSORS:
            raise WireError(f"payload larger than {MAX_BYTES >> 20} MiB of tensors or {MAX_TENSORS} tensors "
                            f"(a tensor of shape {tuple(shape)[:8]} {dtype})")
        return numel

    def walk(v: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise WireError("payload nested too deeply")
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [walk(x, depth + 1) for x in v]
        if not isinstance(v, dict) or len(v) == 0:
            raise WireError("malformed payload")
        if "__float__" in v:
            text = v["__float__"]
            if text not in ("nan", "inf", "-inf"):
                raise WireError("malformed float")
            return float(text)
        if "__tuple__" in v:
            return tuple(walk(x, depth + 1) for x in _list(v["__tuple__"]))
        if "__dict__" in v:
            items = v["__dict__"]
            if not isinstance(items, dict):
                raise WireError("malformed dict")
            return {str(k): walk(x, depth + 1) for k, x in items.items()}
        if "__reference__" in v:
            return _reference(v["__reference__"], references)
        if "__meta__" in v:
            shape, dtype = _shape(v["__meta__"]), _dtype(v.get("dtype"))
            charge(shape, dtype)
            return _grad(torch.empty(shape, dtype=dtype, device="meta"), v)
        if "__tensor__" in v:
            index, dtype, shape = v["__tensor__"], _dtype(v.get("dtype")), _shape(v.get("shape"))
            if not isinstance(index, int) or not 0 <= index < len(buffers):
                raise WireError("tensor refers to a missing buffer")
            data = buffers[index]
            numel = charge(shape, dtype)
            if len(data) != numel * dtype.itemsize:
                raise WireError("tensor size does not match its buffer")
            # The tensor owns the buffer it was read into (copied only if it came as bytes).
            buffer = data if isinstance(data, bytearray) else bytearray(data)
            t = torch.frombuffer(buffer, dtype=dtype).reshape(shape) if numel else torch.empty(shape, dtype=dtype)
            return _grad(_device(t, v.get("device", "cpu")), v)
        raise WireError("malformed payload")

    return walk(structure, 0)


def _reference(key: Any, allowed: bool) -> Any:
    if not allowed or not isinstance(key, str) or not key.startswith(PACKAGE) or ":" not in key:
        raise WireError("a function reference is not accepted here")
    importlib.import_module(key.split(":")[0])  # registers the module's references
    if key not in probe.REFERENCES:
        raise WireError(f"unknown function reference {key!r}")
    return probe.REFERENCES[key]


def _device(t: torch.Tensor, device: Any) -> torch.Tensor:
    """Tensors travel as CPU bytes and come back to the device they were sent from."""
    if device == "cpu":
        return t
    if device == "cuda" and torch.cuda.is_available():
        return t.to("cuda")
    raise WireError(f"device {device!r} is not available here")


def _grad(t: torch.Tensor, header: dict[str, Any]) -> torch.Tensor:
    """A leaf that requires grad if the sender's tensor did (floating point only)."""
    return t.requires_grad_() if header.get("grad") is True and (t.is_floating_point() or t.is_complex()) else t


def _list(v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise WireError("malformed payload")
    return v


def _dtype(name: Any) -> torch.dtype:
    if name not in DTYPES:
        raise WireError(f"dtype {name!r} is not accepted")
    return DTYPES[name]


def _shape(shape: Any) -> list[int]:
    if (not isinstance(shape, list) or len(shape) > 16
            or not all(isinstance(n, int) and 0 <= n < 1 << 31 for n in shape)):
        raise WireError("malformed shape")
    return shape
