""""Backward computes its own gradient" holds against every route to autograd: another
thread, a thread pool made earlier, the engine's own entry point, torch-function handling
disabled, torch.func, forward-mode AD, spans named like the watch's own, and a backward
that behaves otherwise when it sees a profiler — each fails with the evidence, judged in
the student's own kernel and through the wire as the grader judges; an honest backward
passes, on every run."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch

from autograder.checks import evidence
from autograder.checks.functions import check_function
from autograder.checks.remote import Remote, loopback
from autograder.exercises.function_basics import CLIPPED_RELU
from autograder.student.report import CheckFailed

FIRST_ORDER = replace(CLIPPED_RELU, double_backward=False)
POOL = ThreadPoolExecutor(1)


def _autograd(x, g, clip):
    with torch.enable_grad():
        leaf = x.detach().requires_grad_()
        return torch.autograd.grad(leaf.clamp(0, clip), leaf, g)[0]


def _engine(x, g, clip):
    with torch.enable_grad():
        leaf = x.detach().requires_grad_()
        run = torch.autograd.variable.Variable._execution_engine.run_backward
        return run((leaf.clamp(0, clip),), (g,), False, False, (leaf,), False, False)[0]


def _thread(x, g, clip):
    found = {}
    worker = threading.Thread(target=lambda: found.update(g=_autograd(x, g, clip)))
    worker.start(), worker.join()
    return found["g"]


def _forward_ad(x, g, clip):
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(fwAD.make_dual(x, torch.ones_like(x)).clamp(0, clip)).tangent
    return g * tangent


def _func(x, g, clip):
    return torch.func.vjp(lambda t: t.clamp(0, clip), x)[1](g)[0]


def _mimicking_the_watch(x, g, clip):
    """Empty profiler spans named as the watch might name its runs, to stand in for them."""
    from autograder.student.introspect import RUN

    for k in range(20):
        for name in (f"{RUN}{k}", f"{RUN} {k}"):
            with torch.autograd.profiler.record_function(name):
                pass
    return _autograd(x, g, clip)


def _unless_watched(x, g, clip):
    """Honest only when a profiler runs (what the watch uses): its numbers are judged too."""
    if torch.autograd.profiler._is_profiler_enabled:
        return g * ((x > 0) & (x < clip))
    return _autograd(x, g, clip)


ROUTES = {
    "torch.autograd.grad": _autograd,
    "the engine's entry point": _engine,
    "another thread": _thread,
    "a thread pool made earlier": lambda x, g, c: POOL.submit(_autograd, x, g, c).result(),
    "torch-function handling disabled": lambda x, g, c: _disabled(_autograd, x, g, c),
    "torch.func.vjp": _func,
    "forward-mode AD": _forward_ad,
    "spans that mimic the watch's own": _mimicking_the_watch,
}


def _disabled(route, *args):
    with torch._C.DisableTorchFunction():
        return route(*args)


def clipped(gradient):
    class ClippedReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, clip):
            ctx.save_for_backward(x)
            ctx.clip = clip
            return x.clamp(0, clip)

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return gradient(x, grad_output, ctx.clip), None

    return ClippedReLU


def _judged(student, remote: bool):
    target = Remote("ClippedReLU", loopback({"ClippedReLU": student})) if remote else student
    with evidence.collected() as found:
        check_function(target, FIRST_ORDER, seed=0)
    return found


@pytest.mark.parametrize("remote", [False, True], ids=["kernel", "grader"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_every_route_to_autograd_fails_with_the_evidence(route, remote):
    with evidence.collected() as found, pytest.raises(CheckFailed, match="asks autograd for its gradient: autograd's"):
        check_function(Remote("ClippedReLU", loopback({"ClippedReLU": clipped(ROUTES[route])})) if remote
                       else clipped(ROUTES[route]), FIRST_ORDER, seed=0)
    assert found and "best effort" in found[0]


def test_a_backward_that_behaves_otherwise_unwatched_is_judged_as_it_behaves_watched():
    """Every judged run is watched: it passes only by computing honestly (which is the point)."""
    assert _judged(clipped(_unless_watched), remote=True) == []


@pytest.mark.parametrize("remote", [False, True], ids=["kernel", "grader"])
def test_an_honest_backward_passes_and_leaves_no_evidence(remote, capfd):
    assert _judged(clipped(lambda x, g, c: g * ((x > 0) & (x < c))), remote) == []
    assert capfd.readouterr().err == ""  # the profiler's own messages never reach a test cell's stderr


def test_where_the_watch_cannot_run_there_is_no_verdict_on_it_but_a_look(monkeypatch):
    """When the profiler cannot start (no threads left: a fork bomb's children hold the
    process limit) the values still decide, and a person is told why it was not watched
    (an honest backward lost its points to "could not be watched")."""
    def no_threads_left(*args, **kwargs):
        raise RuntimeError("Resource temporarily unavailable")

    monkeypatch.setattr(torch.autograd.profiler, "profile", no_threads_left)
    found = _judged(clipped(lambda x, g, c: g * ((x > 0) & (x < c))), remote=True)
    assert found and all("could not be watched (Resource temporarily unavailable)" in f for f in found), found
