"""Putting back what student code changed in the modules the checks rely on."""
from __future__ import annotations

import builtins
import functools
import pickle
import types

import pytest
import torch

import autograder.student.gradient_patterns as gradient_patterns
from autograder.student import integrity, introspect, probe


@pytest.fixture
def watched():
    integrity.snapshot()
    yield
    integrity.restore()


def test_nothing_changed_nothing_reported(watched):
    torch.randn(3).sum()
    assert integrity.restore() == []


def test_replaced_functions_are_put_back_and_reported(watched):
    allclose, compile_ = torch.allclose, builtins.compile
    torch.allclose = lambda *args, **kwargs: True
    builtins.compile = lambda *args, **kwargs: None
    changes = integrity.restore()
    assert "torch.allclose was replaced" in changes and "builtins.compile was replaced" in changes
    assert torch.allclose is allclose and builtins.compile is compile_


def test_a_wrapper_that_copies_the_name_is_still_a_replacement(watched):
    grad = torch.autograd.grad
    torch.autograd.grad = functools.wraps(grad)(lambda *args, **kwargs: None)
    assert integrity.restore() == ["torch.autograd.grad was replaced"]
    assert torch.autograd.grad is grad


def test_tensor_methods_and_operators_added_are_removed(watched):
    torch.Tensor.__sub__ = lambda self, other: self
    torch.Tensor.abs = lambda self: self
    changes = integrity.restore()
    assert any("__sub__ was added" in c for c in changes) and any(".abs was added" in c for c in changes)
    assert (torch.ones(2) - torch.ones(2)).sum() == 0 and torch.tensor([-1.0]).abs().item() == 1.0


def test_probe_procedures_replaced_in_place_are_put_back(watched):
    key, original = next(iter(probe.PROCEDURES.items()))
    probe.PROCEDURES[key] = lambda *args: 0.0
    assert integrity.restore() == [f"autograder.student.probe.PROCEDURES.{key} was replaced"]
    assert probe.PROCEDURES[key] is original


def test_the_student_sides_procedures_replaced_are_put_back(watched):
    procedure = gradient_patterns.run_unbroadcast
    gradient_patterns.run_unbroadcast = lambda *args, **kwargs: None
    assert integrity.restore() == ["autograder.student.gradient_patterns.run_unbroadcast was replaced"]
    assert gradient_patterns.run_unbroadcast is procedure


def test_the_globals_torch_compile_adds_to_a_course_module_are_not_tampering(watched):
    """torch.compile installs globals (`__builtins_dict___0`, `__compiled_fn_...`) in the
    module of the code it compiles: notebook 11's compile check compiles in a course module."""
    code = compile("def double(x):\n    return torch.sin(x) * 2\n", "<course>", "exec")
    namespace = vars(gradient_patterns)
    double = types.FunctionType(code.co_consts[0], namespace)
    torch.compile(double, backend="eager", fullgraph=True)(torch.ones(3))
    assert any(name.startswith("__compiled_fn") for name in namespace)
    assert integrity.restore() == []
    gradient_patterns.extra = None  # any other name is still seen
    assert integrity.restore() == ["autograder.student.gradient_patterns.extra was added"]


def test_the_profiler_the_autograd_watch_relies_on_is_put_back(watched):
    """The watch marks its runs with the profiler's spans: spans made no-ops hid every run."""
    span = torch.autograd.profiler.record_function
    enter = span.__enter__
    span.__enter__ = lambda self: self
    torch.autograd.profiler.record_function = lambda *args, **kwargs: None
    assert integrity.restore() == ["torch.autograd.profiler.record_function was replaced",
                                   "torch.autograd.profiler.record_function.__enter__ was replaced"]
    assert torch.autograd.profiler.record_function is span and span.__enter__ is enter


def test_the_classes_of_the_course_are_put_back(watched):
    """A class attribute of the watch replaced (a `watching` that watches nothing) is put back."""
    watching = introspect.AutogradWatch.watching
    introspect.AutogradWatch.watching = lambda self: None
    assert integrity.restore() == ["autograder.student.introspect.AutogradWatch.watching was replaced"]
    assert introspect.AutogradWatch.watching is watching


def test_a_cache_copyreg_sets_on_a_class_is_not_tampering(watched):
    """Pickling a tensor makes copyreg cache `Tensor.__slotnames__` (honest: `torch.save`)."""
    if "__slotnames__" in vars(torch.Tensor):  # cached by an earlier test: as it was in a fresh process
        del torch.Tensor.__slotnames__
        integrity.snapshot()
    pickle.dumps(torch.ones(2))
    assert integrity.restore() == []
