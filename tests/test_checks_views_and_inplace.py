"""Unit tests of autograder.exercises.views_and_inplace (notebook 06½), messages included,
and of the answer keys of its two written exercises, which are checked against torch itself."""
from __future__ import annotations

import ast
import linecache
import re
import warnings

import nbformat
import pytest
import torch

from answers import for_notebook
from autograder import authoring
from autograder.checks.answers import explanation, quiz_keys
from autograder.checks.remote import Remote, loopback
from autograder.exercises import views_and_inplace as ex
from autograder.student.report import CheckFailed
from autograder.student.views_and_inplace import expression, view_of
from grading import exercises

SLUG = "06_views_and_inplace"
NOTEBOOK = nbformat.read(authoring.solution_path(SLUG), as_version=4)
KNOWN = for_notebook(SLUG)
MODELS = {e.answer_id: e.solution for e in exercises(NOTEBOOK)}


def answer(label: str, name: str):
    """The object `name` that the known answer `label` (or "model" for exercise `name`'s model) defines."""
    found = [a for a in KNOWN.MUTANTS + KNOWN.VARIANTS if a.label == label]
    grade_id = found[0].exercise if found else label
    namespace = {"torch": torch}
    exec(found[0].apply(MODELS[grade_id]) if found else MODELS[grade_id], namespace)
    return namespace[name]


def failure(check, student, **kwargs) -> str:
    with pytest.raises(CheckFailed) as info:
        check(student, **kwargs)
    return str(info.value)


def remote(student):
    return Remote("answer", loopback({"answer": student}))


# --- Views from recipes ---------------------------------------------------------------------

@pytest.mark.parametrize("recipe, words, indexing", [
    ((("slice", 1, 1, 5, 1),), "base[:, 1:5]", lambda b: b[:, 1:5]),
    ((("slice", 2, 0, 6, 2),), "base[:, :, 0:6:2]", lambda b: b[:, :, 0:6:2]),
    ((("select", 0, 1), ("transpose", 0, 1)), "base[1].transpose(0, 1)", lambda b: b[1].transpose(0, 1)),
    ((("diagonal", 0, 1, 2),), "base.diagonal(0, 1, 2)", lambda b: b.diagonal(0, 1, 2)),
])
def test_a_recipe_is_the_view_its_expression_names(recipe, words, indexing):
    base = torch.arange(3 * 6 * 6.0).reshape(3, 6, 6)
    view = view_of(base, recipe)
    assert expression(recipe) == words
    assert view._base is base._base and torch.equal(view, indexing(base)) and view.stride() == indexing(base).stride()


def test_a_recipe_of_anything_but_view_steps_is_refused():
    with pytest.raises(ValueError):
        view_of(torch.zeros(3), [("copy_", 1)])


# --- Softmax_ ------------------------------------------------------------------------------

def test_softmax_right(capsys):
    ex.check_softmax_(answer("softmax_inplace", "Softmax_"))
    out = capsys.readouterr().out
    assert "✔ Softmax_ writes softmax into x's own memory (finite at |x| = 800 and 1000)" in out
    assert "✔ Softmax_ refuses, with an error, a view of a leaf that requires grad and an expanded view." in out
    assert "✔ Softmax_ on base[1:4], base[:, 1:5], base.transpose(0, 1): the base holds softmax inside" in out
    assert "✔ Softmax_ saves exactly its output, the input's own memory (160 bytes for x of shape (4, 5))" in out
    # the first view's line, the second's folded into a note (no known mistake tells them apart)
    assert out.count("(the whole base): forward, backward and double backward agree with the reference") == 1
    assert "  and on base.transpose(0, 1): the same checks, the same result." in out


def test_a_view_whose_lines_are_folded_is_checked_all_the_same():
    """A Softmax_ wrong only on the transpose fails there, with that view named."""
    right = answer("softmax_inplace", "Softmax_")

    class WrongOnTranspose(right):
        @staticmethod
        def backward(ctx, grad_output):
            (y,) = ctx.saved_tensors
            grad = right.backward(ctx, grad_output)
            return 2 * grad if y.stride(-1) != 1 else grad  # softmax along the base's columns only

    message = failure(ex.check_softmax_, WrongOnTranspose)
    assert message.startswith("Softmax_ on base.transpose(0, 1) (the whole base):"), message


@pytest.mark.parametrize("label, view, cause", [
    ("flattens the leading dims with reshape (a copy for a permutation)", "base.permute(2, 0, 1)", "into a copy of x"),
    ("softmax over dim 1, right for 2-d only", "base[:, :, 0:6:2]", "softmax over dim 1, not over the last dim"),
])
def test_softmax_mistakes_only_the_hidden_views_catch(label, view, cause):
    hidden = [ex.View((2, 3, 4), (("select", 0, 1),)), ex.View((2, 3, 6), (("slice", 2, 0, 6, 2),)),
              ex.View((2, 3, 4), (("permute", 2, 0, 1),))]
    student = answer(label, "Softmax_")
    ex.check_softmax_(student, gradients=[])  # the visible views do not tell
    message = failure(ex.check_softmax_, student, views=hidden, gradients=[], seed=None)
    assert message.startswith(f"Softmax_ on {view}: the base holds wrong values afterwards.") and cause in message


def test_the_reference_rewrites_the_base_as_torch_does():
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    for view in (*ex.VIEWS, ex.View((3, 4, 4), (("diagonal", 0, 1, 2),))):
        x = torch.randn(view.shape, dtype=torch.float64, requires_grad=True)
        after = ex.softmax_in_view(x, view.recipe)
        inside = view_of(after, view.recipe)
        assert torch.allclose(inside, torch.softmax(view_of(x, view.recipe), -1))
        assert torch.autograd.gradcheck(lambda t, r=view.recipe: ex.softmax_in_view(t, r), (x,))


REMOTE = ["forgets mark_dirty", "writes through .data, without mark_dirty", "assigns x.data instead of writing into x",
          "backward forgets the sum's term", "saves a copy of the input and recomputes softmax"]


def gist(message: str) -> tuple[str, list[str]]:
    """The summary and the cause, without random values (a proxy draws its own finite differences)."""
    lines = message.splitlines()
    return lines[0], [line for line in lines if line.startswith("Likely cause")]


@pytest.mark.parametrize("label", REMOTE)
def test_the_grader_fails_a_wrong_softmax_with_the_kernels_message(label):
    student = answer(label, "Softmax_")
    assert gist(failure(ex.check_softmax_, remote(student))) == gist(failure(ex.check_softmax_, student))


def test_the_grader_passes_a_right_softmax_with_the_kernels_report(capsys):
    student = answer("softmax_inplace", "Softmax_")
    ex.check_softmax_(student)
    local = capsys.readouterr().out
    ex.check_softmax_(remote(student))
    assert capsys.readouterr().out == local


# --- train_step ----------------------------------------------------------------------------

def test_train_step_right(capsys):
    ex.check_train_step(answer("train_step", "train_step"))
    ex.check_train_step(remote(answer("train_step", "train_step")))
    assert capsys.readouterr().out.count("✔ train_step: over 2 steps the losses and the updated weights") == 2


def test_the_mistakes_formulas_without_a_mistake_are_autograds():
    data = ex._draw(ex.StepCase(), torch.Generator().manual_seed(3))
    losses, after = ex._right_steps(data, 3)
    mistaken_losses, mistaken_after = ex._mistaken_steps(data, 3, ex.Mistake(""))
    assert losses == pytest.approx(mistaken_losses, rel=1e-12)
    assert all(torch.allclose(a, b) for xs, ys in zip(after, mistaken_after) for a, b in zip(xs, ys))


MISTAKES = [
    ("softmax", "forgets mark_dirty", "Softmax_ accepted a view of a leaf that requires grad and silently overwrote",
     "without `ctx.mark_dirty(x)`"),
    ("softmax", "writes through .data, without mark_dirty", "Softmax_: after the call, x's version counter moved by 0",
     "`.data` has a version counter of its own"),
    ("softmax", "computes out of place and returns a new tensor",
     "Softmax_ did not modify its input", "x's own memory"),
    ("softmax", "marks x dirty but returns a copy",
     "Softmax_: forward raised RuntimeError: Some elements marked as dirty",
     "return x itself"),
    ("softmax", "assigns x.data instead of writing into x",
     "Softmax_ accepted an expanded x without an error, and the base still",
     "`x.data = ...`"),
    ("softmax", "computes in x.contiguous() (a copy for a column slice)",
     "Softmax_ accepted an expanded x", "into a copy"),
    ("softmax", "exponentiates without subtracting the maximum (nan for large x)",
     "Softmax_ wrote wrong values into x.",
     "subtract each row's maximum"),
    ("softmax", "backward forgets the sum's term", "Softmax_ on base[:, 1:5] (the whole base): wrong gradient for `x`.",
     "through the sum"),
    ("softmax", "saves a copy of the input and recomputes softmax",
     "Softmax_ saved the intermediate x.clone() of shape (4, 5)",
     "an in-place Function exists to save"),
    ("softmax", "stashes the output on ctx",
     "Softmax_: tensor `ctx.y` (the output of shape (4, 5), 160 bytes) is stashed",
     "reference cycle"),
    ("softmax", "backward writes into grad_output",
     "Softmax_: backward modified grad_output in place.", "grad_output belongs"),
    ("softmax", "backward writes into the saved output",
     "Softmax_: backward modified a saved tensor in place", "new tensor"),
    ("train_step", "the given step, both .data writes kept", "train_step: after step 1, w1 is not w1 − lr",
     "both silent corruptions are still there"),
    ("train_step", "fixes the dropout, keeps clamping w2 through .data before backward", "train_step: after step 1, w1",
     "w2 is clamped between forward and backward"),
    ("train_step", "moves the clamp after the update, keeps the dropout through .data", "train_step: after step 1, w1",
     "the dropout is still written through `.data`"),
    ("train_step", "dropout in place through .detach() (the version error)",
     "train_step: step 1 failed: a tensor saved for backward was modified in place.",
     "Make the dropout out of place"),
    ("train_step", "assigns h.data = h.data * mask (the mask never enters the graph)", "train_step: after step 1, w1",
     "misses the mask's factor"),
    ("train_step", "clamps w2 in the forward", "train_step: step 1 returned the loss", "that changes the loss"),
    ("train_step", "clamps w2 after backward but before the update", "train_step: after step 1, w2",
     "the update must start from the w2 the loss used"),
    ("train_step", "never resets the gradients", "train_step: after step 2, w1", "never reset"),
    ("train_step", "updates the weights without torch.no_grad()",
     "train_step: step 1 modifies a leaf tensor that requires grad",
     "under `torch.no_grad()`"),
    ("train_step", "rebinds the names instead of updating the tensors",
     "train_step: after step 1, w1", "did not change"),
    ("train_step", "detaches h for the dropout (w1 gets no gradient)",
     "train_step: step 1 raised TypeError", "is None"),
]


@pytest.mark.parametrize("exercise, label, start, cause", MISTAKES)
def test_mistakes_are_named(exercise, label, start, cause):
    check, name = {"softmax": (ex.check_softmax_, "Softmax_"),
                   "train_step": (ex.check_train_step, "train_step")}[exercise]
    message = failure(check, answer(label, name))
    assert message.startswith(start), message
    assert cause in message.split("Likely cause:")[-1], message


def test_the_grader_fails_a_wrong_train_step_with_the_kernels_message():
    student = answer("the given step, both .data writes kept", "train_step")
    assert failure(ex.check_train_step, remote(student)) == failure(ex.check_train_step, student)


def test_a_step_that_returns_no_number_is_told_so():
    def train_step(params, x, target, mask, lr):
        return "done"

    assert failure(ex.check_train_step, train_step).startswith("train_step returned a str, not the loss as a float.")


def test_a_step_not_written_yet_is_told_so():
    def train_step(params, x, target, mask, lr):
        raise NotImplementedError()

    assert "not implemented yet" in failure(ex.check_train_step, train_step)


# --- The diagnosis key: what torch does with the notebook's own programs -------------------

def _programs() -> str:
    return next(c.source for c in NOTEBOOK.cells if c.cell_type == "code" and "def program_a():" in c.source)


def _run(name: str, without: str | None = None) -> tuple[str | None, str]:
    """(the error of program `name`, with line `without` replaced by `pass`; the forward line of the
    node that failed, from anomaly mode)."""
    source = _programs()
    if without:
        source = re.sub(rf"^(\s*)\S.*# {without}\b.*$", r"\1pass", source, flags=re.M)
    filename = f"<{SLUG} programs{' without ' + without if without else ''}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for the traceback's lines
    namespace = {"torch": torch}
    exec(compile(source, filename, "exec"), namespace)
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught, torch.autograd.detect_anomaly(check_nan=False):
        warnings.simplefilter("always")
        try:
            namespace[f"program_{name}"]()
            error = None
        except RuntimeError as exc:
            error = str(exc)
    trace = next((str(w.message) for w in caught if "Error detected" in str(w.message)), "")
    return error, trace


def _diagnosis_key() -> dict[str, str]:
    return quiz_keys(NOTEBOOK, SLUG)[f"{SLUG}/diagnosis"]["key"]


@pytest.mark.parametrize("name", "abc")
def test_the_diagnosis_key_is_what_torch_does(name):
    key = _diagnosis_key()
    error, trace = _run(name)
    assert error and "modified by an inplace operation" in error
    saved_line = re.findall(r"# (L\d)\b", trace.split("Traceback of forward call")[-1])
    assert saved_line[-1] == key[f"{name}_saved"], trace  # the forward line of the node that failed
    assert _run(name, without=key[f"{name}_modified"])[0] is None  # the one write the error needs
    others = {"a": ["L4"], "b": ["L5"], "c": ["L4"]}[name]  # the harmless writes
    for line in others:
        assert "modified by an inplace operation" in (_run(name, without=line)[0] or "")


# --- The what_happens key: what torch does ---------------------------------------------------

def _start(dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=generator, dtype=dtype)
    w = torch.randn(4, 3, generator=generator, dtype=dtype).requires_grad_()
    v = torch.randn(3, generator=generator, dtype=dtype).requires_grad_()
    return x, w, v


def _features(mode):
    x, w, v = _start()
    with mode():
        feats = torch.tanh(x @ w)
    return feats, x, w, v


def _a():
    feats, _, _, v = _features(torch.inference_mode)
    (feats @ v).sum().backward()
    return v.grad, v.grad


def _b():
    feats, x, w, v = _features(torch.inference_mode)
    (torch.sigmoid(feats) * v).sum().backward()
    return v.grad, torch.sigmoid(torch.tanh(x @ w.detach())).sum(0)


def _c():
    feats, x, w, v = _features(torch.no_grad)
    (feats @ v).sum().backward()
    return v.grad, torch.tanh(x @ w.detach()).sum(0)


def _d():
    x, w, _ = _start()
    y = torch.tanh(x @ w)
    with torch.no_grad():
        y.mul_(2)
    y.sum().backward()
    return w.grad, w.grad


def _e():
    x, w, _ = _start()
    h = x @ w
    with torch.no_grad():
        h[:2].zero_()
    (2 * h).sum().backward()
    return w.grad, 2 * x[2:].T @ torch.ones(6, 3)


def _f():
    _, _, v = _start()
    with torch.inference_mode():
        total = torch.zeros(3)
    total += v.detach()
    return total, total


def _hooked(dtype):
    x, w, _ = _start(dtype)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.double(), lambda t: t.to(dtype)):
        y = torch.tanh(x @ w)
    y.mul_(2)
    y.sum().backward()
    return w.grad, x.T @ (2 * (1 - torch.tanh(x @ w.detach()) ** 2))


SCENARIOS = {"a": _a, "b": _b, "c": _c, "d": _d, "e": _e, "f": _f, "g": lambda: _hooked(torch.float32),
             "h": lambda: _hooked(torch.float64)}


@pytest.mark.parametrize("question", sorted(SCENARIOS))
def test_the_what_happens_key_is_what_torch_does(question):
    try:
        got, exact = SCENARIOS[question]()
        outcome = "works" if torch.allclose(got, exact, rtol=1e-5, atol=1e-6) else "silently wrong"
    except RuntimeError:
        outcome = "error"
    assert outcome == quiz_keys(NOTEBOOK, SLUG)[f"{SLUG}/what_happens"]["key"][question]


@pytest.mark.parametrize("quiz", ["diagnosis", "what_happens"])
def test_the_key_and_every_known_wrong_answer_are_explained(quiz):
    found = quiz_keys(NOTEBOOK, SLUG)[f"{SLUG}/{quiz}"]
    key, explain = found["key"], found["explain"]
    for question, choice in key.items():
        assert len(explanation(explain, question, choice) or "") > 30, question
    wrong = {}
    for mutant in KNOWN.MUTANTS:
        for _, edited in mutant.edits if mutant.exercise == quiz else ():
            wrong.update(ast.literal_eval("{" + edited + "}"))
    assert wrong
    for question, choice in wrong.items():  # the misconception named, not only the key explained
        assert explanation(explain, question, choice) not in (None, explanation(explain, question, key[question]))
