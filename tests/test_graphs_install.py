"""Notebook 07's graphs say which package is missing: torchviz, or the graphviz Python
package that torchviz imports (a fresh virtualenv with only torch has neither)."""
import sys

import torch

from autograder.student import graphs


def _graph():
    x = torch.ones(2, requires_grad=True)
    return graphs.draw({"y": (x * 2).sum()}, inputs={"x": x})


def test_without_the_graphviz_package_it_names_that_package(monkeypatch):
    monkeypatch.delitem(sys.modules, "torchviz", raising=False)
    monkeypatch.delitem(sys.modules, "torchviz.dot", raising=False)
    monkeypatch.setitem(sys.modules, "graphviz", None)  # `import graphviz` raises ImportError
    graph = _graph()
    assert graph.svg is None and graph.message == graphs.INSTALL_GRAPHVIZ_PACKAGE
    assert "pip install graphviz" in str(graph) and "torchviz is not installed" not in str(graph)
    assert "MulBackward0" in str(graph)  # the graph itself, as text


def test_without_torchviz_it_names_torchviz(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchviz", None)
    assert _graph().message == graphs.INSTALL_TORCHVIZ
