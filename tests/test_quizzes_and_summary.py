"""Feedback for self-learners: quizzes that explain every answer, the one-call summary of a
notebook's visible checks, and the tape pictures of notebooks 01-02.

- Quizzes: the key and the explanations live in the hidden cell only. Graded, the hidden
  cell's output explains each wrong answer; in a class's package the visible check looks
  at the form only (and says so); in a self-study edition (with the generated keys module)
  the visible check explains every answer at once.
- Summary: every visible check of a notebook, run in the student's namespace, even past
  unfinished stubs, with the points earned; it needs nothing but the kernel.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import re
import sys
import types

import nbformat
import pytest
import torch

from answers import for_notebook
from autograder import authoring
from autograder.checks import answers
from autograder.grader.verdicts import run_cell
from autograder.student import summary as summary_module
from autograder.student import tape_graph
from autograder.student.report import CheckFailed
from grading import exercises, namespace

SLUGS = authoring.assignments()
QUIZ_SLUG = "02_higher_order_and_fusion"
QUIZ_SLUGS = [slug for slug in SLUGS if any("check_answers(" in c.source for c in
                                            nbformat.read(authoring.solution_path(slug), as_version=4).cells)]


def _notebook(slug: str) -> nbformat.NotebookNode:
    return nbformat.read(authoring.solution_path(slug), as_version=4)


def _printed(fn, *args, **kwargs) -> tuple[object, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = fn(*args, **kwargs)
    return result, out.getvalue()


def _hidden_quiz_cells(slug: str) -> dict[str, str]:
    """{answer variable: hidden check cell source} of a notebook's quizzes."""
    found = {}
    for cell in _notebook(slug).cells:
        if cell.cell_type == "code" and "### BEGIN HIDDEN TESTS" in cell.source and "check_answers(" in cell.source:
            call = next(node for node in ast.walk(ast.parse(cell.source)) if isinstance(node, ast.Call)
                        and getattr(node.func, "id", None) == "check_answers")
            found[call.args[0].id] = cell.source
    return found


def _visible_quiz_cells(slug: str) -> dict[str, str]:
    found = {}
    for cell in _notebook(slug).cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("locked") and "check_answers(" in cell.source \
                and "### BEGIN HIDDEN TESTS" not in cell.source:
            call = next(node for node in ast.walk(ast.parse(cell.source)) if isinstance(node, ast.Call)
                        and getattr(node.func, "id", None) == "check_answers")
            found[call.args[0].id] = cell.source
    return found


# --- quizzes: the key and the explanations only in the hidden cell ------------------------

def test_the_keys_of_02s_quizzes_come_from_their_hidden_cells():
    assert set(answers.quiz_keys(_notebook(QUIZ_SLUG), QUIZ_SLUG)) == {f"{QUIZ_SLUG}/tape_reading",
                                                                       f"{QUIZ_SLUG}/pytorch_names"}


@pytest.mark.parametrize("slug", QUIZ_SLUGS)
def test_every_quiz_keys_every_question_with_the_model_answer_and_explains_it(slug):
    keys = answers.quiz_keys(_notebook(slug), slug)
    assert set(keys) == {f"{slug}/{name}" for name in _visible_quiz_cells(slug)}
    ns = namespace(slug)
    for quiz, found in keys.items():
        name = quiz.split("/")[1]
        assert set(found["key"]) == set(ns[name])  # every question keyed
        assert {k: answers._normalise(v) for k, v in found["key"].items()} == \
            {k: answers._normalise(v) for k, v in ns[name].items()}  # the model answers are the key
        for question, choice in found["key"].items():
            line = answers.explanation(found["explain"], question, choice)
            assert line and len(line) > 30, f"{quiz} {question}: explain the right answer"


@pytest.mark.parametrize("slug", SLUGS)
def test_every_visible_quiz_check_names_a_quiz_whose_key_the_hidden_cell_holds(slug):
    """A visible check_answers names its quiz, whose key a self-study edition holds."""
    keys = answers.quiz_keys(_notebook(slug), slug)
    for name, source in _visible_quiz_cells(slug).items():
        call = next(node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                    and getattr(node.func, "id", None) == "check_answers")
        quiz = next((ast.literal_eval(k.value) for k in call.keywords if k.arg == "quiz"), None)
        assert quiz == f"{slug}/{name}" and quiz in keys, f"{name}: pass quiz='{slug}/{name}'"
        assert "key=" not in source and "explain=" not in source  # never in a visible cell


def test_no_keys_module_in_the_repository_so_no_class_package_holds_one():
    assert not (authoring.ROOT / "autograder" / "checks" / answers.KEYS_FILE).exists()
    with pytest.raises(ImportError):
        importlib.import_module(answers.KEYS_MODULE)
    assert answers.self_study_key(f"{QUIZ_SLUG}/tape_reading") is None


def _model_answers(slug: str) -> dict:
    return namespace(slug)


WRONG_TAPE_READING = {"escaped": "b", "why_none": "skipped", "first_order_right": "yes"}


def test_graded_the_hidden_cell_scores_each_answer_and_explains_every_wrong_one():
    ns = dict(_model_answers(QUIZ_SLUG))
    ns["tape_reading"] = dict(WRONG_TAPE_READING)
    exec("from autograder.checks.answers import check_answers", ns)
    score, out = _printed(run_cell, _hidden_quiz_cells(QUIZ_SLUG)["tape_reading"], ns)
    assert score == pytest.approx(2 / 3)
    assert "1 of 3 answers are right." in out
    escaped = next(line for line in out.splitlines() if "escaped" in line)
    assert "✘ escaped: 'b' is not right." in escaped
    assert "input of the program" in escaped  # the misconception named
    assert "The answer is 't'" in escaped and "closure" in escaped  # and why the key is right
    why_none = next(line for line in out.splitlines() if "why_none" in line)
    assert "skip the fused entry, and rightly" in why_none and "The answer is 'escape'" in why_none
    assert "first_order_right" not in out  # right answers are not listed


def test_graded_a_matching_quiz_explains_a_confusion_of_two_names():
    ns = dict(_model_answers(QUIZ_SLUG))
    ns["pytorch_names"] = {**ns["pytorch_names"], "b": "needs_input_grad", "g": "set_materialize_grads"}
    exec("from autograder.checks.answers import check_answers", ns)
    run_cell(_visible_quiz_cells(QUIZ_SLUG)["pytorch_names"], ns)  # defines NAMES
    score, out = _printed(run_cell, _hidden_quiz_cells(QUIZ_SLUG)["pytorch_names"], ns)
    assert score == pytest.approx(2 * 5 / 7)
    assert "about the inputs (which gradients to compute)" in out and "The answer is 'set_materialize_grads'" in out


def test_in_a_class_the_visible_check_checks_the_form_and_says_that_is_all():
    ns = dict(_model_answers(QUIZ_SLUG))
    ns["tape_reading"] = dict(WRONG_TAPE_READING)
    _, out = _printed(run_cell, _visible_quiz_cells(QUIZ_SLUG)["tape_reading"], ns)
    assert "each one of the allowed choices" in out and "graded when you hand in" in out
    assert "The answer is" not in out and "closure" not in out  # no key, no explanation


@pytest.fixture
def self_study(monkeypatch):
    """A self-study edition: the keys module generated from the solution notebooks."""
    module = types.ModuleType(answers.KEYS_MODULE)
    exec(answers.keys_module_source(answers.all_quiz_keys()), module.__dict__)
    monkeypatch.setitem(sys.modules, answers.KEYS_MODULE, module)
    return module


def test_self_study_the_visible_check_explains_every_right_answer_at_once(self_study):
    ns = dict(_model_answers(QUIZ_SLUG))
    for name, source in _visible_quiz_cells(QUIZ_SLUG).items():
        _, out = _printed(run_cell, source, ns)
        assert f"✔ all {len(ns[name])} answers are right." in out
        lines = [line for line in out.splitlines() if line.startswith("  ✔ ")]
        assert len(lines) == len(ns[name])  # one per answer
        assert all(" — " in line for line in lines), lines  # each with its explanation


def test_self_study_the_visible_check_fails_on_a_wrong_answer_and_explains_it(self_study):
    ns = dict(_model_answers(QUIZ_SLUG))
    ns["tape_reading"] = dict(WRONG_TAPE_READING)
    with pytest.raises(CheckFailed) as failure:
        run_cell(_visible_quiz_cells(QUIZ_SLUG)["tape_reading"], ns)
    message = str(failure.value)
    assert message.startswith("2 of 3 answers are wrong.")
    assert "✘ escaped: 'b' is not right." in message and "✔ first_order_right: 'yes'" in message


def test_write_keys_module_writes_an_importable_module_of_every_quiz(tmp_path):
    (tmp_path / "checks").mkdir()
    path = answers.write_keys_module(tmp_path)
    found: dict = {}
    exec(path.read_text(), found)
    assert found["KEYS"] == answers.all_quiz_keys()
    assert f"{QUIZ_SLUG}/pytorch_names" in found["KEYS"]
    assert len(found["KEYS"]) >= 6  # the quizzes of 02, 03, 05, 06, 07 are all extracted


def test_one_line_per_question_explains_the_key_whatever_the_answer():
    explain = {"q": "because of the chain rule."}
    assert answers.feedback("q", "x", "y", explain) == (
        False, "✘ q: 'x' is not right. The answer is 'y': because of the chain rule.")
    assert answers.feedback("q", " Y", "y", explain) == (True, "✔ q: ' Y' — because of the chain rule.")
    assert answers.feedback("q", "x", "y", None) == (False, "✘ q: 'x' is not right. The answer is 'y'.")


# --- the summary: every visible check, in the student's kernel ----------------------------

def test_the_summary_knows_exactly_the_notebooks_visible_checks():
    """The list the student package ships is the notebooks' own, as they are now."""
    shipped = authoring.VISIBLE_CHECKS.read_text(encoding="utf-8")
    assert shipped == authoring.visible_checks_json(), "run `make release`"
    assert set(json.loads(shipped)) == set(SLUGS)


@pytest.mark.parametrize("slug", SLUGS)
def test_every_notebook_ends_with_a_summary_of_its_visible_checks(slug):
    checks = summary_module.visible_checks(slug)
    assert checks and all(c.grade_id.startswith("check") for c in checks)
    assert all(c.exercise for c in checks if c.points)  # a scored check belongs to an exercise
    cell = next(c for c in _notebook(slug).cells if c.cell_type == "code" and "summary(" in c.source)
    assert f'summary("{slug}")' in cell.source
    meta = cell.metadata["nbgrader"]
    assert meta["locked"] and not meta["grade"] and not meta["grade_id"].startswith("check")  # a given cell


@pytest.mark.parametrize("slug", SLUGS)
def test_the_model_solution_earns_every_visible_point(slug):
    ns = namespace(slug)
    rows = summary_module.run_all(slug, ns)
    assert all(r.passed for r in rows), [(r.check.grade_id, r.message) for r in rows if not r.passed]
    _, out = _printed(summary_module.summary, slug, ns)
    possible = sum(c.points for c in summary_module.visible_checks(slug))
    assert f"Visible checks: {possible:g} of {possible:g} points." in out


def _released_namespace(slug: str) -> dict:
    """The released notebook run in a kernel: stubs where the solutions were (cells that
    raise are run as far as they go, as Run-All past errors would)."""
    ns: dict = {"__name__": "__main__"}
    for cell in _notebook(slug).cells:
        meta = cell.metadata.get("nbgrader", {})
        grade_id = meta.get("grade_id", "")
        if cell.cell_type != "code" or meta.get("grade") or grade_id in ("setup",
                                                                         "summary") or grade_id.startswith("check"):
            continue
        source = cell.source
        if meta.get("solution"):
            source = re.sub(r"( *)### BEGIN SOLUTION.*?### END SOLUTION",
                            lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}raise NotImplementedError()",
                            source, flags=re.S)
        with contextlib.suppress(Exception), contextlib.redirect_stdout(io.StringIO()):
            exec(compile(source, grade_id or "demo", "exec"), ns)
    return ns


@pytest.mark.parametrize("slug", SLUGS)
def test_on_the_released_notebook_it_runs_every_check_past_the_stubs(slug):
    rows = summary_module.run_all(slug, _released_namespace(slug))
    assert len(rows) == len(summary_module.visible_checks(slug))
    scored = [r for r in rows if r.check.points]
    assert scored and all(not r.passed and r.earned == 0 for r in scored)
    assert all(any(stub in r.message for stub in ("not implemented yet", "is not defined yet",
                                                  "raised NotImplementedError"))
               for r in scored), [r.message for r in scored]
    _, out = _printed(summary_module.summary, slug, _released_namespace(slug))
    assert "Visible checks: 0 of" in out and "did not pass" in out


def test_one_wrong_exercise_costs_its_own_points_only():
    module = for_notebook("01_tape_autograd")
    answer = next(a for a in module.MUTANTS if a.label == "zeros for inputs L does not depend on")
    nb = _notebook("01_tape_autograd")
    solution = next(e.solution for e in exercises(nb) if e.answer_id == "grad")
    rows = summary_module.run_all("01_tape_autograd", namespace("01_tape_autograd", {"grad": answer.apply(solution)}))
    failed = {r.check.grade_id: r.message for r in rows if not r.passed}
    assert set(failed) == {"check_grad", "check_whole_tape"}
    assert "L does not depend on v2" in failed["check_grad"]
    report = summary_module.report("01_tape_autograd", rows)
    assert "Visible checks: 9 of 12 points." in report


def test_in_a_kernel_it_runs_on_the_callers_names_and_does_nothing_while_grading(monkeypatch):
    ns = namespace("02_higher_order_and_fusion")
    cell = "from autograder.student.summary import summary\nsummary('02_higher_order_and_fusion')"
    _, out = _printed(exec, cell, ns)
    assert out.strip() == summary_module.NO_KERNEL  # a notebook run without IPython (as namespace() does)
    monkeypatch.setattr(summary_module, "_in_a_kernel", lambda: True)
    _, out = _printed(exec, cell, ns)
    assert "Visible checks: 5 of 5 points." in out
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setattr(summary_module, "run_check", lambda *a: pytest.fail("ran a check while grading"))
    _, out = _printed(summary_module.summary, "02_higher_order_and_fusion", ns)
    assert out.strip() == summary_module.GRADING


def test_without_the_check_modules_it_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "autograder.exercises.tape_autograd", None)  # as the grading sandbox masks them
    _, out = _printed(summary_module.summary, "01_tape_autograd", {})
    assert out.strip() == summary_module.NO_CHECKS


# --- pictures of the tape ------------------------------------------------------------------

def _simple_tape():
    ns = namespace("01_tape_autograd")
    V = ns["Variable"]
    ns["reset_tape"]()
    a, b = V(torch.tensor([0.36, 0.99]), name="a"), V(torch.tensor([0.25, 0.35]), name="b")
    t = a + b
    loss = (t * b).sum()
    forward = len(ns["gradient_tape"])
    grads = ns["grad"](loss, [a, b, t, loss])
    return ns, [a, b, t, loss], grads, forward


def test_the_tape_is_drawn_as_svg_with_values_and_gradients():
    ns, variables, grads, forward = _simple_tape()
    drawing = tape_graph.draw_tape(ns["gradient_tape"], variables, grads, backward_from=forward)
    assert drawing.message is None and "<svg" in drawing.svg
    assert drawing._repr_mimebundle_().keys() == {"image/svg+xml", "text/plain"}
    assert "value [0.36 0.99]" in drawing.svg and "grad [0.25 0.35]" in drawing.svg  # a's value and gradient
    assert "grad [0.86 1.69]" in drawing.text  # b's: the sum of its two uses
    assert drawing.text.count("[backward]") == len(ns["gradient_tape"]) - forward
    assert f'fillcolor="{tape_graph.BACKWARD_PASS_COLOUR}", label="expand"' in drawing.source


def test_escaped_values_and_a_topological_order_are_marked():
    ns, variables, _, _ = _simple_tape()
    entries = ns["gradient_tape"][:3]
    drawing = tape_graph.draw_tape(entries, variables, highlight=["v0"], order=list(reversed(entries)))
    assert (f'fillcolor="{tape_graph.ESCAPED_COLOUR}"' in drawing.source
            and "escaped: no entry computed it" in drawing.text)
    assert "#0 v2 = sum(v1)" in drawing.text and "#2 v0 = add(a, b)" in drawing.text


def test_without_graphviz_the_tape_is_text_and_says_what_to_install(monkeypatch):
    ns, variables, grads, _ = _simple_tape()
    monkeypatch.setitem(sys.modules, "graphviz", None)
    drawing = tape_graph.draw_tape(ns["gradient_tape"], variables, grads)
    assert drawing.svg is None and drawing.message == tape_graph.INSTALL_GRAPHVIZ_PACKAGE
    assert drawing._repr_mimebundle_() == {"text/plain": str(drawing)}
    assert "v1 = mul(v0, b)" in str(drawing) and "a, value [0.36 0.99], grad [0.25 0.35]" in str(drawing)


def test_without_dot_the_tape_is_text_and_says_to_install_graphviz(monkeypatch):
    import graphviz

    def missing(*args, **kwargs):
        raise graphviz.ExecutableNotFound(("dot",))

    monkeypatch.setattr(graphviz.Source, "pipe", missing)
    ns, variables, grads, _ = _simple_tape()
    drawing = tape_graph.draw_tape(ns["gradient_tape"], variables, grads)
    assert drawing.svg is None and "apt-get install graphviz" in str(drawing)


def test_brief_values():
    assert tape_graph.brief(torch.tensor(2.5)) == "2.5"
    assert tape_graph.brief(torch.tensor([[1.0, 2.0], [3.0, 4.0]])) == "[[1 2] [3 4]]"
    assert tape_graph.brief(torch.zeros(5, 5)) == "shape (5, 5)"
    assert tape_graph.brief(None) == "None"


def test_the_notebooks_draw_with_the_given_helper_only():
    """Given cells import from autograder.student only (the checks are masked where grading
    runs student code)."""
    for slug in ("01_tape_autograd", "02_higher_order_and_fusion"):
        given = [c.source for c in _notebook(slug).cells if c.cell_type == "code" and "draw_tape" in c.source]
        assert given and all("autograder.exercises" not in s and "autograder.checks" not in s for s in given)
