"""Unit tests of the checks of 05_gradcheck, in process (no kernel, no nbgrader).

The notebook's model solutions and its graded cells are run here as nbgrader would run
them: the model solutions must get every point, each wrong answer of tests/answers must
lose some of its exercise's points, and the messages must name the mistake.
"""
from __future__ import annotations

import ast
import sys

import nbformat
import pytest
import torch

from answers import gradcheck as answers
from autograder import authoring
from autograder.checks.remote import Remote, loopback
from autograder.exercises import gradcheck as checks
from autograder.student import gradcheck as student_gradcheck
from autograder.student import probe
from autograder.student.report import CheckFailed, quiet
from grading import exercises

NOTEBOOK = nbformat.read(authoring.solution_path("05_gradcheck"), as_version=4)
EXERCISES = {e.answer_id: e for e in exercises(NOTEBOOK)}


def run_cell(source: str, namespace: dict):
    """Execute a cell; return the value of its last expression, as a notebook would."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), namespace)
    return eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace) if last else None


def namespace(answers_by_exercise: dict[str, str] | None = None) -> dict:
    """The notebook's names: the given JacobianMismatch and every answer cell."""
    ns: dict = {}
    run_cell("import math\nimport torch", ns)
    run_cell(next(c.source for c in NOTEBOOK.cells if c.get("id") == "jacobian_mismatch"), ns)
    for exercise in EXERCISES.values():
        run_cell((answers_by_exercise or {}).get(exercise.answer_id, exercise.solution), ns)
    return ns


def check_cells(exercise_id: str) -> list:
    """The locked cells after an answer cell, up to the next one: its visible and hidden checks."""
    found, inside = [], False
    for cell in NOTEBOOK.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            inside = meta["grade_id"] == exercise_id
        elif inside and cell.cell_type == "code" and meta.get("locked"):
            found.append(cell)
    return found


def points_lost(exercise_id: str, ns: dict) -> list[str]:
    """Run the exercise's check cells; describe each graded one that does not give full points."""
    lost = []
    for cell in check_cells(exercise_id):
        meta = cell.metadata["nbgrader"]
        try:
            value = run_cell(cell.source, ns)
        except CheckFailed as failure:
            lost.append(f"{meta['grade_id']}: {failure}")
            continue
        if meta.get("grade") and value is not None and value < meta["points"]:
            lost.append(f"{meta['grade_id']}: {value} points")
    return lost


def failure(exercise_id: str, answer_source: str) -> str:
    """The message of the first graded cell that fails for this answer."""
    lost = points_lost(exercise_id, namespace({exercise_id: answer_source}))
    assert lost, "the wrong answer kept its points"
    return lost[0]


def mutant(label: str, exercise_id: str | None = None) -> str:
    (answer,) = [a for a in answers.MUTANTS if a.label == label and exercise_id in (None, a.exercise)]
    return answer.apply(EXERCISES[answer.exercise].solution)


# --- the model solutions, the wrong answers and the unusual right ones ------------------

def test_model_solutions_get_every_point():
    ns = namespace()
    for exercise_id in EXERCISES:
        assert points_lost(exercise_id, ns) == [], exercise_id


@pytest.mark.parametrize("answer", answers.MUTANTS, ids=lambda a: f"{a.exercise}: {a.label}")
def test_wrong_answer_loses_points(answer):
    ns = namespace({answer.exercise: answer.apply(EXERCISES[answer.exercise].solution)})
    assert points_lost(answer.exercise, ns)


@pytest.mark.parametrize("answer", answers.VARIANTS, ids=lambda a: f"{a.exercise}: {a.label}")
def test_unusual_right_answer_keeps_points(answer):
    ns = namespace({answer.exercise: answer.apply(EXERCISES[answer.exercise].solution)})
    assert points_lost(answer.exercise, ns) == []


def test_exercises_are_graded_independently():
    """A broken numerical_jacobian must not cost points in exercise 5.2."""
    ns = namespace({"numerical_jacobian": mutant("wrong eps scaling: divides by eps")})
    assert points_lost("numerical_jacobian", ns)
    assert points_lost("mini_gradcheck", ns) == []


# --- messages ------------------------------------------------------------------------------

@pytest.mark.parametrize("label, words", [
    ("forward difference instead of central", "forward difference"),
    ("wrong eps scaling: divides by eps", "divide by 2 * eps"),
    ("perturbs by eps / 2", "perturb by eps, not eps / 2"),
    ("forgets to put the entry back", "put each perturbed entry back"),
    ("Jacobian transposed (outputs along the rows)", "the Jacobian is transposed"),
    ("Jacobian in float32", "has dtype torch.float32"),
    ("evaluates f in float32", "f was evaluated in float32"),
    ("ignores eps", "not at the `eps` you were given"),
    ("perturbs the caller's tensors", "changed input 0 of the caller"),
    ("uses autograd instead of finite differences", "come from backward (autograd)"),
    ("copies keep a transposed input's layout: its flat view fails", "a flat view needs contiguous memory"),
    ("flattens with reshape, a copy for a transposed input: its rows stay zero", "quietly returns a copy"),
    ("loops over len(x): only the first dim, and fails on a 0-d input", "`len(x)` counts only its first dimension"),
])
def test_numerical_jacobian_messages_name_the_mistake(label, words):
    assert words in failure("numerical_jacobian", mutant(label))


@pytest.mark.parametrize("label, words", [
    ("does not report the offending entry", "raise JacobianMismatch(output, input, row, col"),
    ("reports row and column swapped", "row and column are swapped"),
    ("returns False instead of raising", "returned False, but torch's gradcheck fails"),
    ("ignores rtol", "torch's gradcheck passes"),
    ("runs in float32 (accepts float32 inputs)", "in float32 the finite differences themselves are wrong"),
    ("grad_output of ones instead of one-hot", "one-hot grad_output"),
    ("finite differences in float32", "compute it in float64"),
    ("ignores the atol and rtol arguments", "use the atol and rtol you are given"),
    ("analytical Jacobian from finite differences", "not backward's"),
    ("analytical Jacobian in float32", "has dtype torch.float32"),
    ("does not pass eps on", "pass `eps` on to numerical_jacobian"),
    ("no allow_unused", "allow_unused=True"),
    ("analytical Jacobian transposed", "the Jacobian is transposed"),
    ("one-hot grad_output created on the CPU (fails on a GPU)", "Create the one-hot on the output's device"),
    ("counts only an analytical value above the numerical one", "an error counts whatever its sign"),
    ("clamps the difference at zero", "an error counts whatever its sign"),
    ("counts only an analytical value below the numerical one", "0.5 too large"),
    ("names the entry with the largest signed difference a - n", "is not an offending entry"),
])
def test_mini_gradcheck_messages_name_the_mistake(label, words):
    assert words in failure("mini_gradcheck", mutant(label))


@pytest.mark.parametrize("seed", range(20))
def test_every_draw_has_wrong_backwards_of_both_signs(seed):
    """A wrong entry and a wrong scale, each too large and too small: an error test that looks
    at one side of the error fails in every draw, never by chance."""
    g = torch.Generator()
    g.manual_seed(seed)
    names = [case.name for case in checks._mini_gradcheck_cases(g)]
    for wrong in ("OneWrongEntry: (2 x, x @ w) whose backward is 0.5 too", "tanh(x) whose backward is 0.5% too"):
        assert {n.split(wrong)[1].split()[0] for n in names if wrong in n} >= {"large", "small"}, names


def test_a_mismatch_message_names_the_function_and_torchs_verdict():
    message = failure("mini_gradcheck", mutant("returns False instead of raising"))
    assert "OneWrongEntry" in message and "Jacobian mismatch for output 1 with respect to input 1" in message


@pytest.mark.parametrize("label, words", [
    ("forward difference", "forward difference"),
    ("wrong eps scaling", "divides by 2 * eps"),
    ("mean error instead of the largest", "the mean error"),
    ("signed difference", "largest signed difference"),
    ("relative error", "this is the relative error"),
    ("measures in float32", "evaluated in float32"),
    ("returns the index, not the value of x", "not its index"),
])
def test_max_gradient_error_messages_name_the_mistake(label, words):
    assert words in failure("max_gradient_error", mutant(label))


@pytest.mark.parametrize("exercise, label, words", [
    ("softmax", "fixed Function still has the bug", "normalising sum"),
    ("sincos", "fixed Function still has the bug", "adds both paths"),
    ("sincos", "ignores grad_output", "backward ignores grad_output"),
    ("lerp", "fixed Function still has the bug", "d lerp / d start = 1 - weight"),
    ("softmax", "Jacobian matrix, then .squeeze(): drops a batch of one", "has shape (5,) but `x` has shape (1, 5)"),
    ("softmax", "sums without keepdim", "must match the size"),
])
def test_fixed_function_messages(exercise, label, words):
    assert words in failure(exercise, mutant(label, exercise))


def test_unimplemented_answers_say_so():
    stub = "def numerical_jacobian(f, inputs, eps=1e-6):\n    raise NotImplementedError()"
    assert "not implemented yet" in failure("numerical_jacobian", stub)
    stub = ("def analytical_jacobian(f, inputs):\n    raise NotImplementedError()\n"
            "def mini_gradcheck(f, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3):\n    raise NotImplementedError()")
    assert "not implemented yet" in failure("mini_gradcheck", stub)


# --- the references agree with torch's gradcheck internals ---------------------------------

def test_reference_jacobians_equal_torchs_own():
    internals = sys.modules["torch.autograd.gradcheck"]
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)

    def f(x, w):
        return x @ w, (2 * x.sin()).sum()

    numerical = internals._transpose(internals._get_numerical_jacobian(f, (x, w), eps=1e-3))
    outputs = f(x, w)
    for i in range(2):
        for j in range(2):
            assert torch.equal(checks.numerical_jacobian(f, (x, w), 1e-3)[i][j], numerical[i][j])
            analytical = internals._get_analytical_jacobian((x, w), outputs, j, i)
            assert torch.equal(checks.analytical_jacobian(f, (x, w))[i][j], analytical)


def test_every_diagnosis_case_fails_gradcheck_and_has_a_key():
    key = namespace()["diagnoses"]
    for question, (_, fn, inputs, options) in student_gradcheck.diagnosis_cases().items():
        with quiet():
            assert not torch.autograd.gradcheck(fn, inputs, raise_exception=False, **options), question
        assert key[question] in checks.DIAGNOSIS_CHOICES


# --- the grader's process judges as the kernel does -----------------------------------------

def _outcome(check, args, capsys) -> tuple[str | None, str]:
    """(failure message or None, what the check printed)."""
    try:
        check(*args)
        message = None
    except CheckFailed as failure:
        message = str(failure)
    return message, capsys.readouterr().out


CHECKED = {  # exercise: (check, the notebook names it is given)
    "numerical_jacobian": (checks.check_numerical_jacobian, ("numerical_jacobian",)),
    "mini_gradcheck": (checks.check_mini_gradcheck, ("mini_gradcheck", "analytical_jacobian")),
    "max_gradient_error": (checks.check_max_gradient_error, ("max_gradient_error",)),
}


@pytest.mark.parametrize("exercise, label, words", [
    ("numerical_jacobian", None, None),
    ("numerical_jacobian", "forward difference instead of central", "forward difference"),
    ("numerical_jacobian", "perturbs the caller's tensors", "changed input 0 of the caller"),
    ("numerical_jacobian", "flattens with reshape, a copy for a transposed input: its rows stay zero",
     "quietly returns a copy"),
    ("numerical_jacobian", "copies keep a transposed input's layout: its flat view fails",
     "a flat view needs contiguous memory"),
    ("mini_gradcheck", None, None),
    ("mini_gradcheck", "one-hot grad_output created on the CPU (fails on a GPU)", "on the output's device"),
    ("mini_gradcheck", "reports row and column swapped", "row and column are swapped"),
    ("mini_gradcheck", "does not report the offending entry", "raise JacobianMismatch(output, input, row, col"),
    ("mini_gradcheck", "ignores rtol", "torch's gradcheck passes"),
    ("mini_gradcheck", "runs in float32 (accepts float32 inputs)", "in float32 the finite differences"),
    ("mini_gradcheck", "no allow_unused", "allow_unused=True"),
    ("max_gradient_error", None, None),
    ("max_gradient_error", "returns the index, not the value of x", "not its index"),
])
def test_a_check_says_the_same_in_the_grader_as_in_the_kernel(exercise, label, words, capsys):
    """Through Remote proxies (student code answering over the wire format) a check gives
    the same message and output as with the student's own functions."""
    ns = namespace({} if label is None else {exercise: mutant(label, exercise)})
    check, names = CHECKED[exercise]
    local = _outcome(check, [ns[name] for name in names], capsys)
    transport = loopback(ns)
    remote = _outcome(check, [Remote(name, transport) for name in names], capsys)
    assert remote == local
    assert (local[0] is None) if words is None else (words in local[0])


def test_mini_gradcheck_is_graded_independently_in_the_grader_too(capsys):
    ns = namespace({"numerical_jacobian": mutant("wrong eps scaling: divides by eps")})
    broken = ns["numerical_jacobian"]
    transport = loopback(ns)
    message, _ = _outcome(checks.check_mini_gradcheck,
                          [Remote("mini_gradcheck", transport), Remote("analytical_jacobian", transport)], capsys)
    assert message is None
    assert ns["numerical_jacobian"] is broken  # put back after each call


def test_unimplemented_answers_say_so_in_the_grader_too(capsys):
    stub = "def mini_gradcheck(f, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3):\n    raise NotImplementedError()"
    ns = namespace({"mini_gradcheck": stub})  # analytical_jacobian: the reference's
    message, _ = _outcome(checks.check_mini_gradcheck, [ns["mini_gradcheck"], checks.analytical_jacobian], capsys)
    assert "not implemented yet" in message
    remote, _ = _outcome(checks.check_mini_gradcheck,
                         [Remote("mini_gradcheck", loopback(ns)), checks.analytical_jacobian], capsys)
    assert remote == message


def test_a_transposed_input_reaches_the_students_code_not_contiguous():
    seen = []

    def numerical_jacobian(f, inputs, eps=1e-6):
        seen.append([x.is_contiguous() for x in inputs])
        return checks.numerical_jacobian(f, inputs, eps)

    for student in (numerical_jacobian,
                    Remote("numerical_jacobian", loopback({"numerical_jacobian": numerical_jacobian}))):
        seen.clear()
        with quiet():
            checks.check_numerical_jacobian(student)
        assert [False, True] in seen  # the wire format alone would make it contiguous


def test_functions_handed_to_student_code_cross_by_name():
    generator = torch.Generator().manual_seed(0)
    cases = checks._jacobian_cases(generator) + checks._mini_gradcheck_cases(generator)
    handed = [c.f for c in cases] + [a.f for a in checks._approximations(generator)]
    handed += list(student_gradcheck.ONE_WRONG_ENTRY.values())
    for f in handed:
        key = probe.REFERENCE_KEYS[id(f)]
        assert probe.REFERENCES[key] is f and key.startswith("autograder.student.gradcheck:")


def test_the_references_central_differences_are_torchs_numerical_jacobian_diagonal():
    """The reference of 5.5 moves every entry at once (two calls of f): for an elementwise f
    that is, entry for entry, the diagonal of torch's numerical Jacobian (two calls per entry)."""
    for case in checks._approximations(torch.Generator().manual_seed(0)):
        torchs = checks.numerical_jacobian(case.f, [case.x], case.eps)[0][0].diagonal()
        assert torch.equal(checks._central(case.f, case.x, case.eps), torchs), case.name
