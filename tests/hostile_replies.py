"""Replies no honest process sends, and what they cost the grader: a generative test.

A student's process answers the grader's requests; one that is hostile (or broken) can
answer with tensors of any shape and dtype. Here the grader's own checks (notebook 03's,
through the wire format, as when grading) judge a model solution whose replies are
rewritten at random: a tensor replaced by one with empty dimensions, huge dimensions
(declared in the header beyond what the wire accepts, or real up to its limit), a shape
that broadcasts against the reference's, another dtype, or a stride-0 view. Every
verdict must stay within the grader's bounds: its peak memory (this process's, student
side included) within `MEMORY` of an honest check's, and each check's CPU within `CPU`.

Run in a process of its own (`python tests/hostile_replies.py COUNT SEED`, as
tests/test_fuzz.py does), which prints one JSON line: the peak over the baseline, the
slowest example, and how the checks ended.
"""
from __future__ import annotations

import json
import math
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from autograder.checks import remote  # noqa: E402
from autograder.exercises import function_basics  # noqa: E402
from autograder.student import probe, report, serve, wire  # noqa: E402
from grading import namespace  # noqa: E402

MEMORY = 600 << 20  # bytes the grader may use for one reply, over an honest check's peak
CPU = 5.0  # seconds of CPU per check, whatever the replies
SLUG = "03_function_basics"
CHECKS = [(function_basics.check_polar_to_cartesian, "PolarToCartesian"),
          (function_basics.check_clipped_relu, "ClippedReLU")]
HUGE = [2**20, 2**24, 2**31 - 1]
REQUESTS = 40  # the requests of one check, about: the one answered wrongly is drawn among them
DTYPES = list(wire.DTYPES.values())


def _tensors(value: Any, path: tuple = ()) -> list[tuple]:
    """The paths of the tensors in a reply's value."""
    if isinstance(value, torch.Tensor):
        return [path]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    return [p for k, v in items for p in _tensors(v, (*path, k))]


def _replaced(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replaced(value[head], rest, new)}
    items = [_replaced(v, rest, new) if k == head else v for k, v in enumerate(value)]
    return tuple(items) if isinstance(value, tuple) else items


@st.composite
def shapes(draw: Any, like: torch.Size) -> tuple[int, ...]:
    """Empty dims, huge dims, a shape that broadcasts against `like`, or any small one."""
    kind = draw(st.sampled_from(["empty", "huge", "broadcast", "small"]))
    if kind == "broadcast":
        dims = [draw(st.sampled_from([1, n])) for n in like]
        dims.insert(draw(st.integers(0, len(dims))), draw(st.sampled_from([1, 2**16, 2**20, 2**23])))
        return tuple(dims)
    dims = draw(st.lists(st.integers(0, 4), min_size=0, max_size=4))
    if kind == "empty":
        dims = [*dims, 0, draw(st.sampled_from(HUGE))]
    if kind == "huge":
        dims = [*dims, draw(st.sampled_from(HUGE))]
    order = draw(st.permutations(range(len(dims))))
    return tuple(dims[i] for i in order)


@st.composite
def replacements(draw: Any, like: torch.Tensor) -> Any:
    """A tensor to answer with instead of `like` (or a header that declares one)."""
    shape, dtype = draw(shapes(like.shape)), draw(st.sampled_from([like.dtype, *DTYPES]))
    cells = math.prod(max(n, 1) for n in shape)
    if cells * dtype.itemsize > wire.MAX_BYTES:
        return ("declared", shape, dtype)  # what a process may claim; the wire must refuse it unread
    if draw(st.booleans()) and cells:  # a stride-0 view of one value (its sender materialises it)
        return torch.ones((), dtype=dtype).expand(shape)
    return torch.zeros(shape, dtype=dtype)


def hostile(ns: dict[str, Any], data: Any, target: int) -> remote.Transport:
    """A transport to the model solution whose reply to request number `target` (counting
    from 0) `data` rewrites: every stage of a check is reached, and answered wrongly."""
    asked = iter(range(10**9))

    def transport(request: dict[str, Any]) -> Any:
        structure, buffers = serve.answer(ns, *wire.encode(request))
        reply = wire.decode(structure, buffers)
        paths = _tensors(reply)
        if next(asked) == target and paths:
            path = data.draw(st.sampled_from(paths))
            new = data.draw(replacements(_value(reply, path)))
            declared = isinstance(new, tuple)
            reply = _replaced(reply, path, torch.zeros(1) if declared else new)
            structure, buffers = wire.encode(reply)
            if declared:
                _declare(structure, new[1], new[2])
        try:
            return remote.result(structure, buffers)
        except wire.WireError as error:  # as autograder.grader.conversation says it
            raise remote.RemoteError(f"the student's process answered with more than the grader accepts ({error})") \
                from None

    return transport


def _value(value: Any, path: tuple) -> Any:
    for k in path:
        value = value[k]
    return value


def _declare(structure: Any, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Make the first one-element tensor header of `structure` claim `shape` and `dtype`."""
    if isinstance(structure, dict):
        if "__tensor__" in structure and structure.get("shape") == [1]:
            structure.update(shape=list(shape), dtype=wire.NAMES[dtype])
            return True
        return any(_declare(v, shape, dtype) for v in structure.values())
    return isinstance(structure, list) and any(_declare(v, shape, dtype) for v in structure)


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10


def main(count: int, at: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    ns = namespace(SLUG)
    with report.quiet():
        for check, name in CHECKS:  # honest first: the baseline holds what every check costs anyway
            check(remote.Remote(name, remote.loopback(ns)))
            with report.hidden():
                check(remote.Remote(name, remote.loopback(ns)))
    baseline, slowest, ended = peak(), 0.0, Counter()

    @seed(at)
    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data(), st.sampled_from(CHECKS), st.integers(0, REQUESTS), st.booleans())
    def judge(data: Any, target: tuple, request: int, hidden: bool) -> None:
        nonlocal slowest
        check, name = target
        started = time.process_time()
        with report.quiet(), report.hidden(hidden):
            try:
                check(remote.Remote(name, hostile(ns, data, request)))
                ended["passed"] += 1
            except (report.CheckFailed, remote.RemoteError, probe.Malformed) as failure:
                ended[type(failure).__name__] += 1
            except Exception as failure:  # the cell would score 0 with this message: counted, named
                ended[f"{type(failure).__name__}: {str(failure)[:120]}"] += 1
        slowest = max(slowest, time.process_time() - started)

    judge()
    return {"over_baseline": peak() - baseline, "slowest": slowest, "ended": dict(ended)}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
