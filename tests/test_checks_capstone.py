"""Unit tests of autograder.exercises.capstone (notebook 11: part A in 11_capstone, part B in
11_capstone_extension): the model solutions and the unusual right answers pass every check,
visible and hidden; each kind of wrong answer fails the check that is about it with a message
naming the mistake; the verdicts are the same through a Remote proxy (the grader's way of
reaching a student's process); the inputs hold what the checks say they do; the memory budgets
can fail the answers they exist to fail; the student's side holds no solution."""
from __future__ import annotations

import ast
import inspect
import sys
import types

import nbformat
import pytest
import torch
import torch.nn.functional as F

from answers import capstone_extension, in_parts
from autograder import authoring
from autograder.checks.remote import Remote, loopback
from autograder.exercises import capstone as cp
from autograder.student import capstone as student_side
from autograder.student import probe
from autograder.student.report import CheckFailed

SLUGS = ("11_capstone", "11_capstone_extension")  # parts A and B
NAME, LINEAR = cp.NAME, cp.LINEAR_NAME
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
CELLS = [cell for slug in SLUGS for cell in nbformat.read(authoring.solution_path(slug), as_version=4).cells]
answers = in_parts("capstone", "capstone_extension")


def _cell(grade_id: str) -> str:
    return next(c.source for c in CELLS if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _model(grade_id: str) -> str:
    return "\n".join(line for line in _cell(grade_id).splitlines() if line.strip() not in MARKERS)


SOLUTIONS = {NAME: _model(NAME), LINEAR: _model(LINEAR)}
SOLUTION = SOLUTIONS[NAME]

CHECKS = {
    "values": cp.check_fused_values,
    "double": cp.check_fused_double_backward,
    "memory": cp.check_fused_memory,
    "vmap": cp.check_fused_vmap,
    "compile": cp.check_fused_compile,
    "linear_values": cp.check_linear_values,
    "linear_memory": cp.check_linear_memory,
}
OF = {check: LINEAR if check.startswith("linear") else NAME for check in CHECKS}  # the exercise a check grades


def _hidden_calls() -> dict[str, dict]:
    """{check: the keyword arguments of its hidden call}, read from the notebook's hidden cells."""
    names = {fn.__name__: check for check, fn in CHECKS.items()}
    found = {}
    for cell in CELLS:
        if "### BEGIN HIDDEN TESTS" not in cell.source or "check_answers" in cell.source:
            continue
        hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
        call = ast.parse(hidden.strip()).body[0].value
        found[names[call.func.id]] = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    return found


HIDDEN = _hidden_calls()

_COUNT = [0]


def notebook(source: str = SOLUTION) -> dict:
    """The namespace of a notebook that ran `source`: a module of its own, as a kernel's
    __main__ is (torch.compile looks globals up through their module)."""
    _COUNT[0] += 1
    module = types.ModuleType(f"capstone_notebook_{_COUNT[0]}")
    sys.modules[module.__name__] = module
    exec(compile("import torch\n" + source, f"<{module.__name__}>", "exec"), module.__dict__)
    return module.__dict__


def edited(*edits: tuple[str, str], exercise: str = NAME) -> dict:
    source = SOLUTIONS[exercise]
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return notebook(source)


def verdict(check: str, namespace: dict, *, remote: bool = False, **kwargs) -> str | None:
    """The check's failure message for the notebook's answer (None if it passed)."""
    name = OF[check]
    student = Remote(name, loopback(namespace)) if remote else namespace[name]
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
    found = [a for a in kind if a.exercise in SOLUTIONS and a.label.startswith(label)]
    assert len(found) == 1, label
    return notebook(found[0].apply(SOLUTIONS[found[0].exercise]))


# --- The model solutions and the unusual right answers --------------------------------------------

def test_the_hidden_calls_are_read_from_the_notebook():
    assert set(HIDDEN) == set(CHECKS) and all(kwargs["seed"] is None for kwargs in HIDDEN.values())


@pytest.mark.parametrize("check", list(CHECKS))
def test_model_solution_passes_here_and_remotely(check, capsys):
    namespace = notebook(SOLUTIONS[OF[check]])
    assert verdict(check, namespace) is None
    assert "✔" in capsys.readouterr().out
    assert verdict(check, namespace, remote=True) is None


@pytest.mark.parametrize("check", list(CHECKS))
def test_model_solution_passes_the_hidden_tests(check):
    assert verdict(check, notebook(SOLUTIONS[OF[check]]), **HIDDEN[check]) is None


@pytest.mark.parametrize("label", [a.label for a in answers.VARIANTS if a.exercise in SOLUTIONS])
def test_unusual_right_answers_pass_every_check(label):
    namespace = _answer(label, answers.VARIANTS)
    exercise = next(a.exercise for a in answers.VARIANTS if a.label == label)
    for check in (c for c in CHECKS if OF[c] == exercise):
        assert verdict(check, namespace) is None, check
        assert verdict(check, namespace, **HIDDEN[check]) is None, check


def test_passing_checks_say_what_they_checked(capsys):
    namespace = notebook(SOLUTIONS[NAME] + "\n" + SOLUTIONS[LINEAR])
    cp.check_fused_values(namespace[NAME])
    printed = capsys.readouterr().out
    assert "gradcheck passes (float64, cpu)" in printed and "float32 inputs (6 case(s))" in printed
    assert "every row at ±1000" in printed and "-inf logits" in printed and "a target 800 below the rest" in printed
    assert "logits (0, 4)" in printed and "not contiguous" in printed
    cp.check_fused_memory(namespace[NAME])
    printed = capsys.readouterr().out
    assert "0 new bytes saved, 8 alive after forward with the output (allowed 232; the logits are 480)" in printed
    cp.check_fused_vmap(namespace[NAME])
    assert "in_dims (None, 0)" in capsys.readouterr().out
    cp.check_linear_memory(namespace[LINEAR])
    printed = capsys.readouterr().out
    assert "never holds the whole logits" in printed and "the whole logits 98304" in printed


# --- Part A · check 1: values and gradients --------------------------------------------------------

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
    ((("lse = torch.logsumexp(logits, -1)", "lse = torch.logsumexp(logits.view(-1, logits.shape[-1]), -1)"
       ".view(target.shape)"),), "not contiguous"),
])
def test_value_mistakes_are_named(edits, expected):
    message = same_both_ways("values", edited(*edits))
    assert message is not None and expected in message, message


def test_the_log_of_the_softmax_fails_on_a_target_far_below():
    namespace = _answer("the log of the softmax", answers.MUTANTS)
    message = verdict("values", namespace, cases=[((5, 3), "mean", False, -100, "far")])
    assert message is not None and "got inf" in message, message
    assert verdict("values", namespace, cases=[((5, 3), "mean", False, -100, "normal")]) is None


def test_naive_exponentials_fail_in_every_draw():
    """Rows at ±1000 are in every case, whatever its kind: an e^x without the max overflows."""
    namespace = edited(("lse = torch.logsumexp(logits, -1)", "lse = torch.log(torch.exp(logits).sum(-1))"))
    for case in [((3, 4), "sum", False, None, "normal"), ((1, 4), "none", False, None, "masked")]:
        assert verdict("values", namespace, cases=[case]) is not None, case


def test_an_empty_batch_is_checked():
    namespace = _answer("a Python loop over the rows", answers.MUTANTS)
    message = verdict("values", namespace, cases=[((0, 4), "sum", True, None, "normal")])
    assert message is not None and "non-empty" in message, message
    assert verdict("values", namespace, cases=[((2, 4), "sum", True, None, "normal")]) is None


def test_a_zero_d_index_is_found_by_the_compile_check():
    """weight[target] on one row reads the 0-d target with .item(): the meta run only notes it,
    the compiled graph cannot hold it."""
    namespace = edited(*[("weight.take(safe) * valid\n        " + after, "weight[safe] * valid\n        " + after)
                         for after in ("lse", "scale")])
    assert verdict("values", namespace, cases=[((6,), "mean", True, None, "normal")]) is None
    message = verdict("compile", namespace, cases=[((6,), "sum", True, None, "masked")])
    assert message is not None and "torch.compile" in message, message


# --- Part A · check 2: double backward -----------------------------------------------------------

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


# --- Part A · check 3: memory --------------------------------------------------------------------

@pytest.mark.parametrize("label, expected", [
    ("saves the probabilities", "saved the intermediate softmax(logits), float64 of shape (6, 10), 480 bytes"),
    ("the log-probabilities as a second output", "saved the intermediate log_softmax(logits)"),
    ("stashes the logits on ctx", "tensor `ctx.logits` (the input `logits` of shape (6, 10), 480 bytes) is stashed"),
    ("keeps the softmax in a class attribute", "after forward"),
    ("keeps the logits in a module global", "`logits`"),
    ("keeps the last logits in a default-argument cache", "`logits`"),
])
def test_memory_mistakes_are_named(label, expected):
    message = same_both_ways("memory", _answer(label, answers.MUTANTS))
    assert message is not None and expected in message, message


def _memory_report(namespace: dict, name: str, args: tuple, grad_output: torch.Tensor) -> dict:
    found = student_side.memory_run(namespace[name], args, [grad_output])
    assert found["error"] is None, found
    return found


def test_the_memory_meter_sees_what_is_kept_anywhere():
    """memory_run counts new memory blocks wherever they are kept, and inputs still referenced."""
    logits = torch.randn(6, 10, dtype=torch.float64, requires_grad=True)
    args = (logits, torch.randint(10, (6,)), None, "sum", -100)
    model = _memory_report(notebook(), NAME, args, torch.tensor(1.0, dtype=torch.float64))
    assert model["kept"] == 8 and model["left"] == 0 and model["inputs_alive"] == []
    on_class = _memory_report(_answer("keeps the softmax in a class attribute", answers.MUTANTS), NAME, args,
                              torch.tensor(1.0, dtype=torch.float64))
    assert on_class["kept"] >= 480 and on_class["left"] >= 480
    in_global = _memory_report(_answer("keeps the logits in a module global", answers.MUTANTS), NAME, args,
                               torch.tensor(1.0, dtype=torch.float64))
    assert in_global["inputs_alive"] == [0] and in_global["kept"] == 8


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
    assert message is not None and "budget" in message, message


# --- Part A · check 4: vmap ------------------------------------------------------------------------

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


# --- Part A · check 5: compile ---------------------------------------------------------------------

@pytest.mark.parametrize("label, expected", [
    ("defines jvp", "Unsupported custom jvp"),
    ("reads the mean's denominator with .item()", "reads a tensor's value"),
])
def test_compile_mistakes_are_named(label, expected):
    message = same_both_ways("compile", _answer(label, answers.MUTANTS))
    assert message is not None and expected in message, message


# --- Part B · the chunked Linear + cross-entropy ---------------------------------------------------

@pytest.mark.parametrize("label, check, expected", [
    ("the composite", "linear_memory", "log_softmax(hidden @ weight.T)"),
    ("forward in one chunk", "linear_memory", "forward holds"),
    ("backward in one chunk", "linear_memory", "backward holds"),
    ("saves every chunk's logits", "linear_memory", "budget"),
    ("keeps every chunk's logits in a list on ctx", "linear_memory", "stashed on ctx"),
    ("the mean of the chunks' means", "linear_values", "forward has wrong values"),
    ("gives ignored rows a gradient", "linear_values", "only rows whose target is ignore_index"),
    ("the gradient for weight of the last chunk only", "linear_values", "wrong gradient for `weight`"),
    ("drops the last, shorter chunk", "linear_values", "forward raised RuntimeError"),
    ("sums the loss in float64", "linear_values", "float32"),
])
def test_linear_mistakes_are_named(label, check, expected):
    namespace = _answer(label, answers.MUTANTS)
    message = same_both_ways(check, namespace)
    assert message is not None and expected in message, message


@pytest.mark.parametrize("label", ["a loop of F.cross_entropy over chunks", "keeps every chunk's logits in a module"])
def test_chunks_kept_anywhere_fail_the_memory_check(label):
    namespace = _answer(label, answers.MUTANTS)
    assert verdict("linear_values", namespace) is None  # right numbers
    assert verdict("linear_memory", namespace) is not None


def test_the_whole_logits_exceed_the_memory_budget_in_every_memory_case():
    """A budget the whole logits fit in could not fail an answer that makes them."""
    for case in [*cp.LINEAR_MEMORY_CASES, *HIDDEN["linear_memory"]["cases"]]:
        rows, features, classes, reduction, ignore, chunk = case
        args = (torch.empty(rows, features), torch.empty(classes, features), None, reduction, ignore, chunk)
        assert rows * classes * cp.BYTES_PER_NUMBER > cp.linear_work(args), case
        assert rows * classes * cp.BYTES_PER_NUMBER > 2 * cp.linear_kept(args), case


def test_the_memory_meter_measures_the_peaks():
    namespace = notebook(SOLUTIONS[LINEAR])
    hidden, weight, target, options = cp._draw_linear((96, 4, 128, "mean", -100, 4), torch.Generator().manual_seed(0))
    args = (hidden.requires_grad_(), weight.requires_grad_(), target, "mean", -100, 4)
    model = _memory_report(namespace, LINEAR, args, torch.tensor(1.0, dtype=torch.float64))
    assert 0 < model["forward_peak"] < 96 * 128 * 8 / 4 and model["left"] == 0 and model["inputs_alive"] == []
    composite = notebook(capstone_extension._COMPOSITE)
    whole = _memory_report(composite, LINEAR, args, torch.tensor(1.0, dtype=torch.float64))
    assert whole["forward_peak"] >= 96 * 128 * 8 and whole["kept"] >= 96 * 128 * 8


def test_linear_inputs_are_what_the_cases_say():
    generator = torch.Generator().manual_seed(2)
    hidden, weight, target, options = cp._draw_linear((10, 3, 7, "mean", 2, 4), generator, strided=True)
    assert int((hidden == cp.LARGE).sum()) == 1 and hidden.shape == (10, 3) and weight.shape == (7, 3)
    assert bool((target[4:8] == 2).all()) and target[0] != 2 and target[-1] == 2
    assert options == {"reduction": "mean", "ignore_index": 2, "chunk_size": 4, "strided": True}
    hidden, _, target, options = cp._draw_linear((0, 3, 5, "sum", None, 2), generator)
    assert hidden.shape == (0, 3) and target.shape == (0,) and options["ignore_index"] == -100
    assert [cp._strided(i, 2) for i in range(4)] == [False, True, False, True]


def test_strided_options_reach_the_student_not_contiguous():
    seen = []

    def spy(hidden, weight, target, reduction, ignore_index, chunk_size):
        seen.append((hidden.is_contiguous(), weight.is_contiguous()))
        return (hidden @ weight.T).sum()

    hidden = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    loss = student_side.as_linear_loss(spy)(hidden, weight, torch.zeros(3, dtype=torch.long),
                                            {"chunk_size": 2, "strided": True})
    loss.backward()
    assert seen == [(False, False)] and hidden.grad is not None and weight.grad is not None


# --- Inputs ----------------------------------------------------------------------------------------

def test_inputs_are_what_the_cases_say():
    generator = torch.Generator().manual_seed(1)
    logits, target, options = cp._draw(((6, 5), "mean", True, -100, "masked"), generator)
    ignored = target == -100
    assert not bool(ignored[0]) and bool(ignored[-1])
    assert bool(torch.isinf(logits[ignored][:, 0]).all()) and bool(torch.isfinite(logits[ignored][:, -1]).all())
    assert bool(torch.isfinite(logits[~ignored].gather(-1, target[~ignored].unsqueeze(-1))).all())
    assert options["weight"].shape == (5,) and options["reduction"] == "mean" and options["strided"] is False
    logits, target, _ = cp._draw(((4, 3), "sum", False, None, "far"), generator)
    assert float(logits.amax(-1)[0] - logits[0, target[0]]) > cp.FAR - 20
    for kind in ("normal", "far", "masked"):  # rows at ±1000 in every draw
        logits, _, _ = cp._draw(((4, 3), "sum", False, None, kind), generator)
        finite = torch.where(torch.isfinite(logits), logits, 0)
        assert float(finite[0].amax()) > 900 and float(finite[1].amin()) < -900 and float(finite[2:].abs().max()) < 900
    logits, _, _ = cp._draw(((4, 3), "sum", False, None, "large"), generator)
    assert float(logits[2].mean()) > 900 and float(logits[3].mean()) < -900
    logits, target, _ = cp._draw(((3,), "none", False, 1, "normal"), generator)
    assert target.shape == () and int(target) != 1
    logits, target, _ = cp._draw(((0, 3), "sum", False, 1, "masked"), generator)
    assert logits.shape == (0, 3) and target.shape == (0,)
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


# --- The trust boundary, the cost and the time estimate ----------------------------------------------

def _secret_lines() -> set[str]:
    found, inside = set(), False
    for cell in CELLS:
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
    assert len(lines) >= 40
    source = inspect.getsource(student_side)
    assert [line for line in lines if line in source] == []


def test_procedures_are_registered():
    for name in ("with_options", "per_sample_grads", "memory_run"):
        assert f"{student_side.__name__}:{name}" in probe.PROCEDURES


def test_with_options_runs_only_probe_procedures_and_adapters():
    with pytest.raises(ValueError, match="not a probe procedure"):
        student_side.with_options(notebook()[NAME], "cross_entropy", "os:system", "true")
    with pytest.raises(ValueError, match="not an adapter"):
        student_side.with_options(notebook()[NAME], "os", next(iter(probe.PROCEDURES)))

