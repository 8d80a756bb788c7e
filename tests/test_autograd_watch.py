""""Backward computes its own gradient" holds against every route to autograd: another
thread, a thread pool made earlier, the engine's own entry point, a node called directly
(in any thread), torch-function handling disabled, torch.func, forward-mode AD, spans named
like the watch's own, the watch's profiler stopped, paused or restarted or its spans
silenced, the Function renamed after it was made or its `apply` replaced by plain
operations, and a backward that behaves otherwise when it sees a profiler — each fails with
the evidence, judged in the student's own kernel and through the wire as the grader
judges; an honest backward passes, on every run."""
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
from autograder.student import introspect
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


def _in_a_thread(route):
    def gradient(x, g, clip):
        found = {}
        worker = threading.Thread(target=lambda: found.update(g=route(x, g, clip)))
        worker.start(), worker.join()
        return found["g"]

    return gradient


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


def _node(x, g, clip):
    """The node of a clamp, called directly: no engine at all."""
    with torch.enable_grad():
        y = x.detach().requires_grad_().clamp(0, clip)
    found = y.grad_fn(g)
    return found[0] if isinstance(found, tuple) else found


def _profiler_stopped(x, g, clip):
    torch._C._autograd._disable_profiler()
    return _autograd(x, g, clip)


def _profiler_paused(x, g, clip):
    from torch._C._profiler import ProfilerActivity

    torch._C._autograd._toggle_collection_dynamic(False, {ProfilerActivity.CPU})
    return _autograd(x, g, clip)


def _profiler_restarted(x, g, clip):
    """A session of its own instead of the watch's (which ends it)."""
    torch._C._autograd._disable_profiler()
    torch.autograd.profiler.profile(use_kineto=True).__enter__()
    return _autograd(x, g, clip)


ENGINE, LOST = "autograd's engine ran", "the profiler that watched it was stopped while it ran"
ROUTES = {  # name: (backward's gradient, what the evidence says)
    "torch.autograd.grad": (_autograd, ENGINE),
    "the engine's entry point": (_engine, ENGINE),
    "another thread": (_in_a_thread(_autograd), ENGINE),
    "a thread pool made earlier": (lambda x, g, c: POOL.submit(_autograd, x, g, c).result(), ENGINE),
    "torch-function handling disabled": (lambda x, g, c: _disabled(_autograd, x, g, c), ENGINE),
    "torch.func.vjp": (_func, ENGINE),
    "forward-mode AD": (_forward_ad, ENGINE),
    "spans that mimic the watch's own": (_mimicking_the_watch, ENGINE),
    "a node called directly": (_node, "autograd's engine ran ClampBackward1"),
    "a node called directly in a thread": (_in_a_thread(_node), "autograd's engine ran ClampBackward1"),
    "the profiler stopped": (_profiler_stopped, LOST),
    "the profiler paused": (_profiler_paused, LOST),
    "the profiler restarted": (_profiler_restarted, LOST),
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
    gradient, said = ROUTES[route]
    with evidence.collected() as found, pytest.raises(CheckFailed, match=f"asks autograd for its gradient: {said}"):
        check_function(Remote("ClippedReLU", loopback({"ClippedReLU": clipped(gradient)})) if remote
                       else clipped(gradient), FIRST_ORDER, seed=0)
    assert found and "best effort" in found[0]


def renamed(monkeypatch):
    """Its name (which its node's name was made from) changed after it was made."""
    function = clipped(_autograd)
    function.__name__ = function.__qualname__ = "Clamp"
    return function


def applied_as_plain_operations(monkeypatch):
    """No Function at all: `apply` is torch's own clamp, whose gradient autograd computes."""
    function = clipped(lambda x, g, c: g * ((x > 0) & (x < c)))
    function.apply = staticmethod(lambda x, clip: x.clamp(0, clip))
    return function


def with_spans_silenced(monkeypatch):
    """The profiler's spans made no-ops before the check (a test cell puts torch back first
    when grading), so the watch's runs leave none."""
    span = torch.autograd.profiler.record_function
    monkeypatch.setattr(span, "__enter__", lambda self: self)
    monkeypatch.setattr(span, "__exit__", lambda self, *args: None)
    return clipped(_autograd)


@pytest.mark.parametrize("remote", [False, True], ids=["kernel", "grader"])
@pytest.mark.parametrize(("made", "said"), [
    (renamed, ENGINE), (applied_as_plain_operations, "its output came from ClampBackward1, not from the Function"),
    (with_spans_silenced, LOST)])
def test_routes_around_the_watch_fail_with_the_evidence(made, said, remote, monkeypatch):
    with pytest.raises(CheckFailed, match=f"asks autograd for its gradient: {said}"):
        _judged(made(monkeypatch), remote)


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

    monkeypatch.setattr(introspect, "_PROFILE", no_threads_left)
    found = _judged(clipped(lambda x, g, c: g * ((x > 0) & (x < c))), remote=True)
    assert found and all("could not be watched (Resource temporarily unavailable)" in f for f in found), found
