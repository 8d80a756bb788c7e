"""Unit tests of autograder.checks.graphs: drawing autograd graphs safely in notebooks."""
from __future__ import annotations

import re
import sys
import warnings

import pytest
import torch

from autograder.student import graphs


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**2

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * 2 * x


class Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        result = x.exp()
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_out):
        (result,) = ctx.saved_tensors
        return grad_out * result


class OnCtx(torch.autograd.Function):  # 2 exp(x), with an intermediate stashed on ctx
    @staticmethod
    def forward(ctx, x):
        ctx.e = x.exp()
        return 2 * ctx.e

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out * 2 * ctx.e


def _leaf():
    return torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)


def _with_gradient(function):
    """(out, grad_x, x, grad_out) with grad_x computed with create_graph=True."""
    x = _leaf()
    out = function.apply(x)
    grad_out = torch.ones_like(out)
    (grad_x,) = torch.autograd.grad(out, x, grad_out, create_graph=True)
    return out, grad_x, x, grad_out


def _last_fillcolor(source: str, node_id: int) -> str:
    return re.findall(rf"^\s*{node_id} \[[^\]]*fillcolor=(\w+)", source, re.MULTILINE)[-1]


def test_forward_graph_is_drawn_as_svg_and_names_what_a_function_saved():
    x = _leaf()
    graph = graphs.draw({"out": Square.apply(x)}, inputs={"x": x})
    assert graph.message is None and "<svg" in graph.svg
    assert graph._repr_mimebundle_().keys() == {"image/svg+xml", "text/plain"}
    assert graph.saved_by("SquareBackward") == ["x"]
    assert graph.count("AccumulateGrad") == 1 and graph.backward_pass() == []
    assert "saved: x" in graph.source and "SquareBackward  saved: x" in str(graph)


def test_a_saved_output_is_recognised_although_unpacked_as_a_new_tensor():
    x = _leaf()
    out = Exp.apply(x)
    assert out.grad_fn.saved_tensors[0] is not out  # why names are matched by storage
    assert graphs.draw({"out": out}, inputs={"x": x}).saved_by("ExpBackward") == ["out"]


def test_nodes_recorded_by_the_backward_pass_are_marked_and_coloured():
    out, grad_x, x, grad_out = _with_gradient(Exp)
    graph = graphs.draw({"out": out}, {"grad_x": grad_x}, inputs={"x": x, "grad_out": grad_out})
    assert graph.backward_pass() == ["MulBackward0"]
    mul = next(n for n in graph.nodes if n.name == "MulBackward0")
    assert mul.next_functions == ["ExpBackward"] and mul.saved == ["grad_out"]
    assert _last_fillcolor(graph.source, id(grad_x.grad_fn)) == graphs.BACKWARD_PASS_COLOUR
    assert "[recorded by the backward pass]" in graph.text


def test_a_leaf_that_is_also_saved_stays_light_blue():
    out, grad_x, x, grad_out = _with_gradient(Square)
    graph = graphs.draw({"out": out}, {"grad_x": grad_x}, inputs={"x": x})
    assert "fillcolor=orange" in graph.source  # torchviz declared x as a saved tensor
    assert _last_fillcolor(graph.source, id(x)) == graphs.LEAF_COLOUR


def test_a_function_that_saved_nothing_says_so_and_its_gradient_has_no_graph():
    x = _leaf()
    out = OnCtx.apply(x)
    (grad_x,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    graph = graphs.draw({"out": out}, {"grad_x": grad_x}, inputs={"x": x})
    assert graph.saved_by("OnCtxBackward") == [] and "saved: nothing" in graph.source
    assert "grad_x: not connected to any graph (grad_fn is None)" in graph.text
    assert graph.backward_pass() == []


def test_after_backward_it_explains_instead_of_raising():
    x = _leaf()
    out = Square.apply(x)
    out.sum().backward()
    graph = graphs.draw({"out": out}, inputs={"x": x})
    assert graph.svg is None and graph.message == graphs.FREED
    assert graph._repr_mimebundle_() == {"text/plain": str(graph)}
    assert "Draw the graph before calling `.backward()`" in str(graph)
    assert "saved tensors freed by a backward pass" in graph.text


def test_saved_by_names_the_nodes_when_asked_for_a_missing_one():
    x = _leaf()
    graph = graphs.draw({"out": Square.apply(x)}, inputs={"x": x})
    with pytest.raises(KeyError, match="the nodes are SquareBackward, AccumulateGrad"):
        graph.saved_by("ExpBackward")


def test_retain_graph_keeps_it_drawable():
    x = _leaf()
    out = Square.apply(x)
    out.sum().backward(retain_graph=True)
    assert graphs.draw({"out": out}, inputs={"x": x}).svg is not None


def test_without_the_dot_program_it_shows_text_and_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no `dot` anywhere
    x = _leaf()
    graph = graphs.draw({"out": Square.apply(x)}, inputs={"x": x})
    assert graph.svg is None and graph.message == graphs.INSTALL_DOT
    bundle = graph._repr_mimebundle_()
    assert list(bundle) == ["text/plain"]
    assert "apt-get install graphviz" in bundle["text/plain"] and "SquareBackward  saved: x" in bundle["text/plain"]
    assert graph.saved_by("SquareBackward") == ["x"]  # the questions stay answerable


def test_without_torchviz_it_shows_text_and_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchviz", None)  # `import torchviz` raises ImportError
    x = _leaf()
    graph = graphs.draw({"out": Square.apply(x)}, inputs={"x": x})
    assert graph.svg is None and graph.message == graphs.INSTALL_TORCHVIZ
    assert "pip install torchviz" in str(graph)


def test_torchviz_warnings_never_reach_stderr(capfd):
    out, grad_x, x, _ = _with_gradient(Square)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning escaping draw would raise here
        graphs.draw({"out": out}, {"grad_x": grad_x}, inputs={"x": x})
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("function", [Square, Exp])
def test_text_lists_every_node_once(function):
    out, grad_x, x, grad_out = _with_gradient(function)
    graph = graphs.draw({"out": out}, {"grad_x": grad_x}, inputs={"x": x, "grad_out": grad_out})
    described = [line for line in graph.text.splitlines() if "<-" not in line and "(shown above)" not in line]
    assert len(described) == len(graph.nodes) == 3
