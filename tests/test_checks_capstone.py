"""Unit tests of autograder.exercises.capstone (notebook 11): the model solution and the unusual
right answers pass every check, each kind of wrong answer fails the check that is about it
with a message naming the mistake, the verdicts are the same through a Remote proxy (the
grader's way of reaching a student's process), the inputs are what the checks say they are,
and the student's side holds no solution."""
from __future__ import annotations

import inspect
import sys
import time
import types

import nbformat
import pytest
import torch
import torch.nn.functional as F
from answers import capstone as answers

from autograder import authoring
from autograder.checks.remote import Remote, loopback
from autograder.exercises import capstone as cp
from autograder.student import capstone as student_side
from autograder.student import probe
from autograder.student.report import CheckFailed

SLUG = "11_capstone"
NAME = "fused_cross_entropy"
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def _cell(grade_id: str) -> str:
    nb = nbformat.read(authoring.solution_path(SLUG), as_version=4)
    return next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


SOLUTION = "\n".join(line for line in _cell(NAME).splitlines() if line.strip() not in MARKERS)

CHECKS = {
    "values": cp.check_fused_values,
    "double": cp.check_fused_double_backward,
    "memory": cp.check_fused_memory,
    "vmap": cp.check_fused_vmap,
    "compile": cp.check_fused_compile,
}

HIDDEN = {  # as in the notebook's hidden test cells
    "values": {"cases": [((6,), "mean", True, None, "normal"), ((1, 4), "none", False, None, "large"),
                         ((3, 1), "mean", True, None, "normal"), ((4, 2, 3), "mean", True, 0, "far"),
                         ((5, 6), "sum", True, -1, "masked"), ((2, 7), "none", True, -100, "masked")], "seed": None},
    "double": {"cases": [((6,), "sum", True, None, "large"), ((3, 4), "mean", False, 2, "masked"),
                         ((1, 1), "none", False, None, "normal")], "seed": None},
    "memory": {"cases": [((10,), "sum", True, None, "normal"), ((8, 12), "mean", False, 3, "normal")], "seed": None},
    "vmap": {"cases": [((5,), "mean", True, None, [(0, 0)], [4]), ((2, 3, 4), "none", False, 1, [(2, 0)], [2]),
                       ((3, 4), "mean", True, -100, [(0, None)], [3]),
                       ((3, 4), "mean", False, None, [(0, 0), (1, None)], [2, 3])], "seed": None},
    "compile": {"cases": [((2, 3, 4), "none", False, 1, "large"), ((6,), "sum", True, None, "masked")], "seed": None},
}

_COUNT = [0]


def notebook(source: str = SOLUTION) -> dict:
    """The namespace of a notebook that ran `source`: a module of its own, as a kernel's
    __main__ is (torch.compile looks globals up through their module)."""
    _COUNT[0] += 1
    module = types.ModuleType(f"capstone_notebook_{_COUNT[0]}")
    sys.modules[module.__name__] = module
    exec(compile("import torch\n" + source, f"<{module.__name__}>", "exec"), module.__dict__)
    return module.__dict__


def edited(*edits: tuple[str, str]) -> dict:
    source = SOLUTION
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return notebook(source)


def verdict(check: str, namespace: dict, *, remote: bool = False, **kwargs) -> str | None:
    """The check's failure message for the notebook's fused_cross_entropy (None if it passed)."""
    student = Remote(NAME, loopback(namespace)) if remote else namespace[NAME]
    try:
        CHECKS[check](student, **kwargs)
    except CheckFailed as failed:
        return str(failed)
    return None


def same_both_ways(check: str, namespace: dict, **kwargs) -> str | None:
    local = verdict(check, namespace, **kwargs)
    remote = verdict(check, namespace, remote=True, **kwargs)
    assert remote == local
    return local


def _answer(label: str, kind: list) -> dict:
    found = [a for a in kind if a.exercise == NAME and a.label.startswith(label)]
    assert len(found) == 1, label
    return notebook(found[0].apply(SOLUTION))


# --- The model solution and the unusual right answers --------------------------------------------

@pytest.mark.parametrize("check", list(CHECKS))
def test_model_solution_passes_here_and_remotely(check, capsys):
    namespace = notebook()
    assert verdict(check, namespace) is None
    assert "✔" in capsys.readouterr().out
    assert verdict(check, namespace, remote=True) is None


@pytest.mark.parametrize("check", list(CHECKS))
def test_model_solution_passes_the_hidden_tests(check):
    assert verdict(check, notebook(), **HIDDEN[check]) is None


@pytest.mark.parametrize("label", [a.label for a in answers.VARIANTS if a.exercise == NAME])
def test_unusual_right_answers_pass_every_check(label):
    namespace = _answer(label, answers.VARIANTS)
    for check in CHECKS:
        assert verdict(check, namespace) is None, check
        assert verdict(check, namespace, **HIDDEN[check]) is None, check


def test_passing_checks_say_what_they_checked(capsys):
    namespace = notebook()
    cp.check_fused_values(namespace[NAME])
    printed = capsys.readouterr().out
    assert "gradcheck passes (float64, cpu)" in printed and "float32 logits" in printed
    assert "rows at ±1000" in printed and "-inf logits" in printed and "a target 800 below the rest" in printed
    cp.check_fused_memory(namespace[NAME])
    printed = capsys.readouterr().out
    assert "0 new bytes (allowed 224; the logits are 480)" in printed
    cp.check_fused_vmap(namespace[NAME])
    assert "in_dims (None, 0)" in capsys.readouterr().out


# --- Check 1: values and gradients ---------------------------------------------------------------

@pytest.mark.parametrize("edits, expected", [
    ((("lse = torch.logsumexp(logits, -1)", "lse = torch.log(torch.exp(logits).sum(-1))"),),
     "fused_cross_entropy: forward has wrong values"),
    ((("losses = torch.where(valid, lse - picked, 0) * row_weight", "losses = (lse - picked) * row_weight"),),
     "expected 0, got nan"),
    ((("lse = torch.logsumexp(logits, -1)", "lse = torch.logsumexp(logits.double(), -1)"),),
     "returns torch.float64, not float32"),
    ((("grad = grad.scatter_add(-1, safe.unsqueeze(-1), -scale.unsqueeze(-1))  # minus the one-hot",
       ("onehot = torch.zeros(logits.shape, dtype=logits.dtype).scatter(-1, safe.unsqueeze(-1), 1.0)\n"
        "        grad = grad - onehot * scale.unsqueeze(-1)")),), "on another device (meta) backward mixes devices"),
    ((("row_weight = valid.to(logits.dtype) if weight is None else weight.take(safe) * valid\n        scale",
       "row_weight = valid.to(logits.dtype)\n        scale"),), "scaled by weight[target]"),
    ((("return losses.sum() / row_weight.sum()", "return losses.sum() / valid.sum()"),
      ("scale = scale / row_weight.sum()", "scale = scale / valid.sum()")), "forward has wrong values"),
    ((("valid = target != ignore_index\n", "valid = target >= 0\n"),
      ("valid = target != ctx.ignore_index\n", "valid = target >= 0\n")), "ignore_index': 1"),
    ((("scale = grad_output * row_weight  # one number per row", "scale = row_weight"),),
     "backward ignores grad_output"),
])
def test_value_mistakes_are_named(edits, expected):
    message = same_both_ways("values", edited(*edits))
    assert message is not None and expected in message, message


def test_the_log_of_the_softmax_fails_on_a_target_far_below():
    namespace = _answer("the log of the softmax", answers.MUTANTS)
    message = verdict("values", namespace, cases=[((5, 3), "mean", False, -100, "far")])
    assert message is not None and "got inf" in message, message
    assert verdict("values", namespace, cases=[((5, 3), "mean", False, -100, "normal")]) is None


def test_a_zero_d_index_is_found_by_the_compile_check():
    """weight[target] on one row reads the 0-d target with .item(): the meta run only notes it,
    the compiled graph cannot hold it."""
    namespace = edited(*[("weight.take(safe) * valid\n        " + after, "weight[safe] * valid\n        " + after)
                         for after in ("lse", "scale")])
    assert verdict("values", namespace, cases=[((6,), "mean", True, None, "normal")]) is None
    message = verdict("compile", namespace, cases=[((6,), "sum", True, None, "masked")])
    assert message is not None and "torch.compile" in message, message


# --- Check 2: double backward --------------------------------------------------------------------

@pytest.mark.parametrize("label, expected", [
    ("saves each row's log-sum-exp", "In a cross-entropy this usually means a row statistic"),
    ("backward marked @once_differentiable", "double backward"),
    ("saves the probabilities", "double backward is wrong"),
])
def test_double_backward_mistakes_are_named(label, expected):
    namespace = _answer(label, answers.MUTANTS)
    message = same_both_ways("double", namespace)
    assert message is not None and expected in message, message
    assert verdict("values", namespace) is None  # right once


# --- Check 3: memory -----------------------------------------------------------------------------

@pytest.mark.parametrize("label, expected", [
    ("saves the probabilities", "saved the intermediate softmax(logits), float64 of shape (6, 10), 480 bytes"),
    ("the log-probabilities as a second output", "saved the intermediate log_softmax(logits)"),
    ("stashes the logits on ctx", "tensor `ctx.logits` (the input `logits` of shape (6, 10), 480 bytes) is stashed"),
])
def test_memory_mistakes_are_named(label, expected):
    message = same_both_ways("memory", _answer(label, answers.MUTANTS))
    assert message is not None and expected in message, message


def test_a_composite_keeps_the_log_probabilities_and_fails_the_budget():
    def composite(logits, target, weight=None, reduction="mean", ignore_index=-100):
        return cp.reference(logits, target, weight, reduction, ignore_index)

    with pytest.raises(CheckFailed) as failed:
        cp.check_fused_memory(composite)
    assert "log_softmax(logits)" in str(failed.value)
    cp.check_fused_values(composite)  # right numbers all the same


def test_a_few_numbers_per_row_are_allowed_and_no_more():
    assert cp.allowance(6) == (4 * 6 + 4) * 8
    lse_saved = _answer("saves each row's log-sum-exp", answers.MUTANTS)
    assert verdict("memory", lse_saved) is None  # 8 bytes a row: within the budget
    too_many = edited(("ctx.save_for_backward(logits, target, weight)  # inputs only: nothing new is kept",
                       "ctx.save_for_backward(logits, target, weight, logits[..., :5].clone())"))
    message = verdict("memory", too_many)
    assert message is not None and "more than its budget" in message, message


# --- Check 4: vmap --------------------------------------------------------------------------------

@pytest.mark.parametrize("label, expected", [
    ("F.one_hot in backward", "such as F.one_hot"),
    ("a classic Function", "this is a classic Function"),
    ("a vmap rule by hand that assumes the batch at dim 0", "not at dim 0 of both inputs"),
    ("a vmap rule by hand that folds the batch", "its 'mean' divides by the weight of its own rows"),
    ("reads the mean's denominator with .item()", "reads a tensor's value"),
])
def test_vmap_mistakes_are_named(label, expected):
    message = same_both_ways("vmap", _answer(label, answers.MUTANTS))
    assert message is not None and expected in message, message


def test_per_sample_gradients_vmap_the_targets_too():
    """The targets are integers, and batched: each sample's gradient must see its own."""
    loss = student_side.as_loss(notebook()[NAME])
    logits = torch.randn(3, 4, 5, dtype=torch.float64)
    target = torch.randint(5, (3, 4))
    options = {"weight": None, "reduction": "mean", "ignore_index": -100}
    weights = [torch.randn(3, dtype=torch.float64)]
    found = student_side.per_sample_grads(loss, (logits, target, options), [0, 0, None], weights)
    assert found["error"] is None
    want = torch.stack([torch.func.grad(lambda x, b=b: F.cross_entropy(x, target[b]) * weights[0][b])(logits[b])
                        for b in range(3)])
    assert torch.allclose(found["grads"][0], want)


# --- Check 5: compile -----------------------------------------------------------------------------

@pytest.mark.parametrize("label, expected", [
    ("defines jvp", "Unsupported custom jvp"),
    ("reads the mean's denominator with .item()", "reads a tensor's value"),
])
def test_compile_mistakes_are_named(label, expected):
    message = same_both_ways("compile", _answer(label, answers.MUTANTS))
    assert message is not None and expected in message, message


# --- Inputs ----------------------------------------------------------------------------------------

def test_inputs_are_what_the_cases_say():
    generator = torch.Generator().manual_seed(1)
    logits, target, options = cp._draw(((6, 5), "mean", True, -100, "masked"), generator)
    ignored = target == -100
    assert not bool(ignored[0]) and bool(ignored[-1])
    assert bool(torch.isinf(logits[ignored][:, 0]).all()) and bool(torch.isfinite(logits[ignored][:, -1]).all())
    assert bool(torch.isfinite(logits[~ignored].gather(-1, target[~ignored].unsqueeze(-1))).all())
    assert options["weight"].shape == (5,) and options["reduction"] == "mean"
    logits, target, _ = cp._draw(((4, 3), "sum", False, None, "far"), generator)
    assert float(logits.amax(-1)[0] - logits[0, target[0]]) > cp.FAR - 20
    logits, _, _ = cp._draw(((4, 3), "sum", False, None, "large"), generator)
    assert float(logits[0].mean()) > 900 and float(logits[1].mean()) < -900
    logits, target, _ = cp._draw(((3,), "none", False, 1, "normal"), generator)
    assert target.shape == () and int(target) != 1
    for bad in [((), "mean", False, None, "normal"), ((4, 1), "mean", False, 0, "normal"),
                ((4, 3), "average", False, None, "normal"), ((4, 3), "mean", False, None, "huge")]:
        with pytest.raises(ValueError):
            cp._draw(bad, generator)


def test_the_reference_is_f_cross_entropy_with_classes_last():
    logits = torch.randn(2, 3, 4, dtype=torch.float64)
    target = torch.randint(4, (2, 3))
    want = F.cross_entropy(logits.permute(0, 2, 1), target, reduction="none")
    assert torch.allclose(cp.reference(logits, target, reduction="none"), want)
    assert cp.reference(logits[0, 0], target[0, 0], reduction="none").shape == ()


# --- The trust boundary and the cost ---------------------------------------------------------------

def _secret_lines() -> set[str]:
    nb = nbformat.read(authoring.solution_path(SLUG), as_version=4)
    found, inside = set(), False
    for cell in nb.cells:
        for line in cell.source.splitlines():
            if "### BEGIN" in line:
                inside = True
            elif "### END" in line:
                inside = False
            elif inside and len(line.strip()) > 20:
                found.add(line.strip())
    return found


def test_the_student_side_holds_no_line_of_the_solution_or_hidden_tests():
    lines = _secret_lines()
    assert len(lines) >= 20
    source = inspect.getsource(student_side)
    assert [line for line in lines if line in source] == []


def test_procedures_are_registered():
    for name in ("with_options", "per_sample_grads"):
        assert f"{student_side.__name__}:{name}" in probe.PROCEDURES


def test_with_options_runs_only_probe_procedures():
    with pytest.raises(ValueError, match="not a probe procedure"):
        student_side.with_options(notebook()[NAME], "os:system", "true")


def test_warm_checks_are_cheap():
    """Each visible check, once torch's lazy imports are paid, stays well under a few seconds."""
    namespace = notebook()
    for check in CHECKS.values():
        check(namespace[NAME])  # warm
        start = time.perf_counter()
        check(namespace[NAME])
        assert time.perf_counter() - start < 3.0, check.__name__
