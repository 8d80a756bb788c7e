"""Checks of the tape notebooks (01, 02), run in-process on the notebooks' own definitions."""
from __future__ import annotations

import gc

import nbformat
import pytest

from answers import higher_order_and_fusion, tape_autograd
from autograder import authoring
from autograder.student.report import CheckFailed
from autograder.exercises import tape_autograd as checks
from grading import exercises, namespace

CALLS = {
    "basic_ops": lambda ns: checks.check_ops(*(ns[f"operator_{o}"] for o in ("mul", "add", "sum", "expand"))),
    "grad": lambda ns: checks.check_grad(ns["grad"]),
    "more_ops": lambda ns: checks.check_ops(*(ns[f"operator_{o}"] for o in ("exp", "sin", "cos", "matmul"))),
    "topological_order": lambda ns: checks.check_topological_order(ns["topological_order"]),
    "hvp": lambda ns: checks.check_hvp(ns["hvp"]),
    "exp_mul": lambda ns: checks.check_exp_mul(ns["operator_exp_mul"]),
}

# What the message of each wrong answer must say (a piece of the likely cause).
EXPECTED = {
    "mul gradients swapped": "the chain rule",
    "sum backward not expanded": "the backward of sum is expand",
    "expand backward not summed": "operator_expand: the gradient for `self` has shape (4,), expected ()",
    "mul computes on .value (leaves the tape)": "computed with Variable operations",
    "add ignores dL_dr": "propagate ignores dL_dr",
    "overwrites instead of adding": "do not overwrite them (`=`)",
    "never skips entries without gradient": "skip the entry",
    "adds on .value": "accumulate with Variable addition",
    "does not skip None input gradients": "None means 'known to be zero'",
    "exp recomputed from .value": "computed with Variable operations",
    "cos derivative without the minus": "wrong sign",
    "matmul factors in the wrong order": "let the shapes guide you",
    "recursive depth-first search": "RecursionError on a chain of 10,000",
    "depth-first pre-order": "Depth-first order is not enough",
    "breadth-first order": "which uses its output",
    "no visited set: shared entries twice": "appears more than once",
    "returns the first gradient": "that is the gradient of f, not the Hessian times v",
    "detaches the gradient": "must stay a Variable on the tape",
    "the escaping intermediate": "the intermediate exp(a) escapes",
    "adds None gradients": "None means 'known to be zero'",
}


def _solutions(slug: str) -> dict[str, str]:
    nb = nbformat.read(authoring.solution_path(slug), as_version=4)
    return {e.answer_id: e.solution for e in exercises(nb)}


CASES = [
    (slug, answer)
    for slug, module in (("01_tape_autograd", tape_autograd), ("02_higher_order_and_fusion", higher_order_and_fusion))
    for answer in module.MUTANTS
    if answer.label in EXPECTED
]


@pytest.mark.parametrize("slug, answer", CASES, ids=[a.label for _, a in CASES])
def test_wrong_answer_is_explained(slug, answer):
    ns = namespace(slug, {answer.exercise: answer.apply(_solutions(slug)[answer.exercise])})
    with pytest.raises(CheckFailed) as failure:
        CALLS[answer.exercise](ns)
    assert EXPECTED[answer.label] in str(failure.value)


@pytest.mark.parametrize("seed", range(5))
def test_the_whole_tape_agrees_with_torch_on_many_random_programs(seed):
    """The model answers pass on fresh random programs, again and again (no flaky checks)."""
    ns = namespace("01_tape_autograd")
    ops = [ns[f"operator_{o}"] for o in ("mul", "add", "sum", "expand", "exp", "sin", "cos", "matmul")]
    checks.check_whole_tape(ns["grad"], *ops, programs=20, seed=1000 + seed)
    checks.check_grad(ns["grad"], programs=10, seed=seed)
    checks.check_topological_order(ns["topological_order"], programs=5, seed=seed)


@pytest.mark.parametrize("enabled", [True, False], ids=["collector on", "collector off"])
def test_the_deep_chain_leaves_garbage_collection_as_it_found_it(enabled):
    """The collector pauses while the 10,000-deep chain is built, and only then: also when
    the notebook's code raises, and never switched on for a student who switched it off."""
    ns = namespace("01_tape_autograd")
    (gc.enable if enabled else gc.disable)()
    try:
        checks.check_topological_order(ns["topological_order"])
        assert gc.isenabled() is enabled

        def broken_record(*args):
            raise ValueError("broken record")

        ns["record"] = broken_record
        with pytest.raises(ValueError, match="broken record"):
            checks.check_topological_order(ns["topological_order"])
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
