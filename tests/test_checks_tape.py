"""Checks of the tape notebooks (01, 02), run on the notebooks' own definitions: in-process
(as in a student's kernel) and through `Remote(name, loopback(ns))` (as when grading).

The student's process holds no reference implementation of any exercise: operations not
under test are forward-only stand-ins whose gradients the judging side gives, during one
check only, never about the operations under test."""
from __future__ import annotations

import gc
import inspect
import subprocess
import sys
import textwrap

import nbformat
import pytest
import torch

from answers import higher_order_and_fusion, tape_autograd
from autograder import authoring
from autograder.checks.remote import Remote, loopback
from autograder.exercises import higher_order_and_fusion as checks02
from autograder.exercises import tape_autograd as checks
from autograder.student import probe
from autograder.student import tape as student_tape
from autograder.student.report import CheckFailed
from grading import exercises, namespace

BASIC, MORE = ("mul", "add", "sum", "expand"), ("exp", "sin", "cos", "matmul")
CALLS = {
    "basic_ops": lambda get: checks.check_ops(*(get(f"operator_{o}") for o in BASIC)),
    "grad": lambda get: checks.check_grad(get("grad")),
    "more_ops": lambda get: checks.check_ops(*(get(f"operator_{o}") for o in MORE)),
    "topological_order": lambda get: checks.check_topological_order(get("topological_order")),
    "hvp": lambda get: checks02.check_hvp(get("hvp")),
    "exp_mul": lambda get: checks02.check_exp_mul(get("operator_exp_mul")),
}
# The hidden checks, which judge more (random programs, fresh values).
HIDDEN = {
    "basic_ops": lambda get: checks.check_ops(*(get(f"operator_{o}") for o in BASIC), programs=4, seed=None),
    "grad": lambda get: checks.check_grad(get("grad"), programs=4, seed=None),
    "more_ops": lambda get: checks.check_ops(*(get(f"operator_{o}") for o in MORE), programs=4, seed=None),
    "topological_order": lambda get: checks.check_topological_order(get("topological_order"), programs=3, seed=None),
    "hvp": lambda get: checks02.check_hvp(get("hvp"), seed=None),
    "exp_mul": lambda get: checks02.check_exp_mul(get("operator_exp_mul"), programs=4, seed=None),
}

# What the message of each wrong answer must say (a piece of the likely cause).
EXPECTED = {
    "mul gradients swapped": "the gradients are swapped: you return for `self` what `rhs` should get",
    "sum backward not expanded": "the backward of sum is expand",
    "expand backward not summed": "operator_expand: the gradient for `self` has shape (4,), expected ()",
    "mul computes on .value (leaves the tape)": "computed with Variable operations",
    "add ignores dL_dr": "propagate ignores dL_dr",
    "overwrites instead of adding": "do not overwrite them (`=`)",
    "never skips entries without gradient": "skip the entry",
    "adds on .value": "accumulate with Variable addition",
    "does not skip None input gradients": "None means 'known to be zero'",
    "skips an entry when any output gradient is None": "Skip the entry only when *all* of them are None",
    "skips an entry when its first output gradient is None": "one gradient per output",
    "zeros for inputs L does not depend on": "but L does not depend on v2: expected None",
    "walks the tape even when an order is given": "when `order` is given, walk those entries",
    "exp recomputed from .value": "computed with Variable operations",
    "cos derivative without the minus": "the derivative of cos is -sin(x) (the sign is wrong)",
    "matmul factors in the wrong order": "let the shapes guide you",
    "sin derivative is sin": "multiplies dL_dr by sin(x), but the derivative of sin is cos(x)",
    "recursive depth-first search": "`visit` was running more than 100 times at once",
    "depth-first pre-order": "Depth-first order is not enough",
    "breadth-first order": "which uses its output",
    "no visited set: shared entries twice": "appears more than once",
    "recursion with the recursion limit raised inside": "`visit` was running more than 100 times at once",
    "recursion with the recursion limit raised in the answer cell": "`visit` was running more than 100 times at once",
    "a recursive generator (yield from), the limit raised": "`post_order` was running more than 100 times at once",
    "returns the first gradient": "that is the gradient of f, not the Hessian times v",
    "detaches the gradient": "must stay a Variable on the tape",
    "forgets v": "multiply the gradient by v before summing it",
    "differentiates the squared gradient": "multiply the gradient by v, not by itself",
    "the escaping intermediate": "the intermediate exp(a) escapes",
    "ignores the gradient arriving at t": "None for an output that has none",
    "adds None gradients": "None means 'known to be zero'",
    "gradient of b uses b": "operator_exp_mul: the gradient for `b` is wrong",
    "a fresh Variable of t inside propagate": "a new `Variable(...)` made from a tensor is an escaped value too",
    "recomputes t from a.value inside propagate": "a new `Variable(...)` made from a tensor is an escaped value too",
    "materialises zeros for None gradients": "an incoming None was turned into a tensor of zeros",
    "zeros instead of None for b": "it is known to be zero: expected None",
}
SLUGS = {"01_tape_autograd": tape_autograd, "02_higher_order_and_fusion": higher_order_and_fusion}
MODES = ["local", "remote"]


def _solutions(slug: str) -> dict[str, str]:
    nb = nbformat.read(authoring.solution_path(slug), as_version=4)
    return {e.answer_id: e.solution for e in exercises(nb)}


def _getter(ns: dict, mode: str):
    if mode == "local":
        return ns.__getitem__
    transport = loopback(ns)
    return lambda name: Remote(name, transport)


def _cases(kind: str) -> list:
    return [
        pytest.param(slug, answer, mode, id=f"{mode}-{answer.label}")
        for slug, module in SLUGS.items()
        for answer in getattr(module, kind)
        if answer.exercise in CALLS
        for mode in MODES
    ]


@pytest.mark.parametrize("slug, answer, mode", _cases("MUTANTS"))
def test_wrong_answer_fails_with_its_explanation(slug, answer, mode):
    assert answer.label in EXPECTED, f"say what the message of '{answer.label}' must contain"
    ns = namespace(slug, {answer.exercise: answer.apply(_solutions(slug)[answer.exercise])})
    with pytest.raises(CheckFailed) as failure:
        CALLS[answer.exercise](_getter(ns, mode))
    assert EXPECTED[answer.label] in str(failure.value)


@pytest.mark.parametrize("slug, answer, mode", _cases("VARIANTS"))
def test_right_answer_passes_visible_and_hidden_checks(slug, answer, mode):
    ns = namespace(slug, {answer.exercise: answer.apply(_solutions(slug)[answer.exercise])})
    CALLS[answer.exercise](_getter(ns, mode))
    HIDDEN[answer.exercise](_getter(ns, mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("slug", SLUGS)
def test_model_solution_passes_every_check(slug, mode):
    ns = namespace(slug)
    for exercise in _solutions(slug):
        if exercise in CALLS:
            CALLS[exercise](_getter(ns, mode))
            HIDDEN[exercise](_getter(ns, mode))
    if slug == "01_tape_autograd":
        get = _getter(ns, mode)
        checks.check_whole_tape(get("grad"), *(get(f"operator_{o}") for o in BASIC + MORE), programs=2)


EXP_MUL_T_FIRST = '''
def operator_exp_mul(a, b):
    t = Variable(a.value.exp())
    r = Variable(t.value * b.value)

    def propagate(dL_doutputs):
        dL_dt, dL_dr = dL_doutputs  # t is the first output here
        total = add_optional(dL_dt, None if dL_dr is None else dL_dr * b)
        return [None if total is None else total * t, None if dL_dr is None else dL_dr * t]

    record("exp_mul", [a, b], [t, r], propagate)
    return r
'''


@pytest.mark.parametrize("mode", MODES)
def test_an_entry_may_list_its_outputs_in_any_order(mode):
    ns = namespace("02_higher_order_and_fusion", {"exp_mul": EXP_MUL_T_FIRST})
    HIDDEN["exp_mul"](_getter(ns, mode))


# --- no reference implementation in the student's process ----------------------------------

def _distinctive_solution_lines(slug: str) -> set[str]:
    """Lines between the SOLUTION markers of the solution notebook, stripped, longer than 20
    characters, that the released notebook does not show."""
    solution = nbformat.read(authoring.solution_path(slug), as_version=4)
    released = nbformat.read(authoring.ROOT / "course" / slug / f"{slug}.ipynb", as_version=4)
    shown = "\n".join(cell.source for cell in released.cells)
    found, inside = set(), False
    for cell in solution.cells:
        for line in cell.source.splitlines():
            if "### BEGIN SOLUTION" in line:
                inside = True
            elif "### END SOLUTION" in line:
                inside = False
            elif inside and len(line.strip()) > 20 and line.strip() not in shown:
                found.add(line.strip())
    return found


@pytest.mark.parametrize("slug", SLUGS)
def test_the_student_side_holds_no_line_of_the_solutions(slug):
    lines = _distinctive_solution_lines(slug)
    assert len(lines) >= 3  # the test sees the solutions
    source = inspect.getsource(student_tape)
    assert [line for line in lines if line in source] == []


def test_the_student_side_holds_no_reference_operations_or_walk():
    source = inspect.getsource(student_tape)
    for name in ("reference_ops", "reference_grad", "reference"):
        assert not hasattr(student_tape, name)
    assert "reference_ops" not in source and "reference_grad" not in source
    assert "autograd.grad(" not in source and ".backward(" not in source  # stand-ins: forward values only


# --- the judging side's answers to the stand-ins --------------------------------------------

def _question(op="mul", vjp=0, inputs=None, grads=None, sizes=None) -> dict:
    x, y = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), torch.tensor([4.0, 5.0, 6.0], dtype=torch.float64)
    return {"op": op, "sizes": sizes, "vjp": vjp, "inputs": [x, y] if inputs is None else inputs,
            "grads": [torch.ones(3, dtype=torch.float64)] if grads is None else grads}


def test_stand_in_questions_are_answered_with_torchs_gradients_to_second_order():
    x, y, g = (torch.tensor(v, dtype=torch.float64) for v in ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [0.5, -1.0, 2.0]))
    with checks.answering({"mul", "sin", "expand"}):
        assert torch.equal(probe.ask(_question(grads=[g]))[0], g * y)
        # the VJP of mul's VJP: inputs (x, y, g), outputs (gx, gy); gradients (u, None)
        u = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
        gx, gy, gg = probe.ask(_question(vjp=1, inputs=[x, y, g], grads=[u, None]))
        assert gx is None and torch.equal(gy, g * u) and torch.equal(gg, y * u)
        (d,) = probe.ask(_question("sin", inputs=[x], grads=[g]))
        assert torch.allclose(d, g * x.cos())
        (s,) = probe.ask(_question("expand", inputs=[torch.tensor(2.0, dtype=torch.float64)], grads=[g], sizes=[3]))
        assert torch.equal(s, g.sum())
        # a student's seed may be an integer (Variable(torch.tensor(1))): as good as a float
        gx, gy = probe.ask(_question(grads=[torch.tensor([1, 2, 3])]))
        assert torch.equal(gx, torch.tensor([4.0, 10.0, 18.0], dtype=torch.float64)) and gy.dtype == torch.float64


def test_the_two_output_test_entry_is_answered_for_each_pattern_of_output_gradients():
    """pair(x, w) = (x * w, x + w), the grad checks' entry with two outputs."""
    x, y, g = (torch.tensor(v, dtype=torch.float64) for v in ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [0.5, -1.0, 2.0]))
    with checks.answering({"pair"}):
        gx, gy = probe.ask(_question("pair", grads=[g, None]))
        assert torch.equal(gx, g * y) and torch.equal(gy, g * x)
        gx, gy = probe.ask(_question("pair", grads=[None, g]))
        assert torch.equal(gx, g) and torch.equal(gy, g)
        with pytest.raises(probe.Refused):
            probe.ask(_question("pair", grads=[g]))  # one gradient per output


BAD_QUESTIONS = {
    "not a dict": ["mul"],
    "a key too many": {**_question(), "code": "print(1)"},
    "a key missing": {k: v for k, v in _question().items() if k != "sizes"},
    "unknown operation": _question("pow"),
    "operation name not a string": _question(["mul"]),
    "an operation not answered in this check": _question("matmul"),
    "the fused exercise": _question("exp_mul"),
    "negative depth": _question(vjp=-1),
    "too deep": _question(vjp=checks.MAX_DEPTH + 1),
    "depth as a bool": _question(vjp=True),
    "depth as a string": _question(vjp="1"),
    "sizes for mul": _question(sizes=[3]),
    "no sizes for expand": _question("expand", inputs=[torch.tensor(1.0, dtype=torch.float64)]),
    "huge expand": _question("expand", inputs=[torch.tensor(1.0, dtype=torch.float64)], sizes=[10**6, 10**6]),
    "one input too few": _question(inputs=[torch.ones(3, dtype=torch.float64)]),
    "one gradient too many": _question(grads=[torch.ones(3, dtype=torch.float64)] * 2),
    "an input that is a list": _question(inputs=[[1.0, 2.0, 3.0], torch.ones(3, dtype=torch.float64)]),
    "an input of None": _question(inputs=[None, torch.ones(3, dtype=torch.float64)]),
    "a complex tensor": _question(inputs=[torch.ones(3, dtype=torch.complex128)] * 2),
    "a tensor subclass": _question(inputs=[torch.nn.Parameter(torch.ones(3, dtype=torch.float64))] * 2),
    "a meta tensor": _question(inputs=[torch.ones(3, dtype=torch.float64, device="meta")] * 2),
    "a huge tensor": _question(inputs=[torch.ones(10**5, dtype=torch.float64)] * 2, grads=[torch.ones(10**5)]),
    "a gradient of the wrong shape": _question(grads=[torch.ones(4, dtype=torch.float64)]),
    "inputs that do not fit": _question(inputs=[torch.ones(3, dtype=torch.float64),
                                                torch.ones(4, dtype=torch.float64)]),
}


@pytest.mark.parametrize("question", BAD_QUESTIONS.values(), ids=BAD_QUESTIONS)
def test_malformed_questions_are_refused(question):
    with checks.answering({"mul", "expand", "sin"}), pytest.raises(probe.Refused):
        probe.ask(question)


def test_a_question_when_no_check_runs_has_nobody_to_ask():
    with pytest.raises(probe.NobodyToAsk):
        probe.ask(_question())
    with checks.answering({"mul"}):
        probe.ask(_question())
    with pytest.raises(probe.NobodyToAsk):
        probe.ask(_question())


def test_too_many_questions_are_refused():
    with checks.answering({"mul"}) as answers:
        answers.asked = checks.MAX_QUESTIONS
        with pytest.raises(probe.Refused, match="too many"):
            probe.ask(_question())


# A student's grad that keeps what it finds while grad is checked (the stand-in for mul,
# an entry of a stand-in, and the judging side's answerer), and a mul whose propagate
# replays them while mul is checked.
STEALING_GRAD = '''
STOLEN = {}
_own_grad = grad


def grad(L, desired_results, order=None):
    import autograder.student.probe as probe
    if probe.handler() is not None and not STOLEN:  # grad is being checked
        STOLEN.update(operator_mul=operator_mul, answerer=probe.handler(),
                      entry=next((e for e in gradient_tape if e.op == "mul"), None))
    return _own_grad(L, desired_results, order)
'''
REPLAYING_MUL = {
    "stand-in": "STOLEN['operator_mul'](self, rhs).grad_fn.propagate(dL_doutputs)",
    "entry": "STOLEN['entry'].propagate(dL_doutputs)",
    "answerer": "[Variable(g) for g in STOLEN['answerer']({'op': 'mul', 'sizes': None, 'vjp': 0, "
                "'inputs': [self.value, rhs.value], 'grads': [dL_doutputs[0].value]})]",
}


def _replaying(how: str) -> str:
    model = _solutions("01_tape_autograd")["basic_ops"]
    return model.replace("        (dL_dr,) = dL_doutputs\n        return [dL_dr * rhs, dL_dr * self]",
                         f"        return {REPLAYING_MUL[how]}", 1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", REPLAYING_MUL)
def test_what_a_student_captures_in_one_check_gets_no_answer_in_another(how, mode):
    model = _solutions("01_tape_autograd")
    ns = namespace("01_tape_autograd", {"grad": model["grad"] + STEALING_GRAD, "basic_ops": _replaying(how)})
    get = _getter(ns, mode)
    CALLS["grad"](get)  # passes, and the student's grad captured the stand-ins
    stolen = ns["STOLEN"]
    assert stolen["operator_mul"].__module__ == student_tape.__name__ and stolen["entry"] is not None
    assert isinstance(stolen["answerer"], checks.StandInAnswers)
    refused = "Refused: (no answers about `mul`|the check that this question belongs to is over)"
    with pytest.raises(CheckFailed, match=refused):
        CALLS["basic_ops"](get)
    # ... because the judging side refused: the same replay gets answers while mul may be asked about
    V = ns["Variable"]
    ones, twos = torch.ones(3, dtype=torch.float64), torch.full((3,), 2.0, dtype=torch.float64)
    with checks.answering({"mul"}):
        r = student_tape.stand_in(student_tape.Tape(ns["grad"]), "mul")(V(ones), V(twos))
        assert torch.equal(r.grad_fn.propagate([V(ones)])[0].value, twos)
    # and outside any check, nobody answers at all
    with pytest.raises(probe.NobodyToAsk):
        stolen["entry"].propagate([V(ones)])
    with pytest.raises(probe.Refused):
        stolen["answerer"](_question())


@pytest.mark.parametrize("mode", MODES)
def test_checks_of_operations_ask_nothing_and_grad_asks_only_about_stand_ins(mode, monkeypatch):
    """check_ops judges second order itself (from what the student's code recorded); grad's
    check asks about the stand-ins it walks, none of them an exercise of the check."""
    asked: list[str] = []
    answer = checks.answer_question
    monkeypatch.setattr(checks, "answer_question", lambda q, allowed: asked.append(q["op"]) or answer(q, allowed))
    ns = namespace("01_tape_autograd")
    get = _getter(ns, mode)
    CALLS["basic_ops"](get)
    CALLS["more_ops"](get)
    HIDDEN["basic_ops"](get)
    assert asked == []
    CALLS["grad"](get)
    assert asked and set(asked) <= checks.GRAD_STAND_INS


# --- the checks themselves -------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_the_whole_tape_agrees_with_torch_on_many_random_programs(seed):
    """The model answers pass on fresh random programs, again and again (no flaky checks)."""
    ns = namespace("01_tape_autograd")
    ops = [ns[f"operator_{o}"] for o in BASIC + MORE]
    checks.check_whole_tape(ns["grad"], *ops, programs=20, seed=1000 + seed)
    checks.check_grad(ns["grad"], programs=10, seed=seed)
    checks.check_ops(*ops[:4], programs=10, seed=seed)
    checks.check_ops(*ops[4:8], programs=10, seed=seed)
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


SWITCHES_THE_TRACER_OFF = '''
import sys


def topological_order(root):
    sys.settrace(None)
    sys.setrecursionlimit(100_000)
    order, visited = [], set()

    def visit(entry):
        visited.add(entry)
        for child in entry.next_entries:
            if child is not None and child not in visited:
                visit(child)
        order.append(entry)

    visit(root)
    return order[::-1]
'''


@pytest.mark.parametrize("mode", MODES)
def test_the_recursion_watch_restores_the_limit_and_the_tracer_and_sees_a_student_switch_it_off(mode):
    ns = namespace("01_tape_autograd", {"topological_order": SWITCHES_THE_TRACER_OFF})
    limit, tracer = sys.getrecursionlimit(), sys.gettrace()
    sys.setrecursionlimit(limit + 7)  # as a notebook might
    try:
        with pytest.raises(CheckFailed, match="switched off the tracer"):
            CALLS["topological_order"](_getter(ns, mode))
        assert sys.getrecursionlimit() == limit + 7 and sys.gettrace() is tracer
    finally:
        sys.setrecursionlimit(limit)


def test_the_notebooks_tape_is_restored_after_a_check():
    ns = namespace("01_tape_autograd")
    before = {k: ns[k] for k in ("record", "_name", *(f"operator_{o}" for o in student_tape.NOTEBOOK_OPS))}
    tape_before = list(ns["gradient_tape"])
    checks.check_ops(*(ns[f"operator_{o}"] for o in BASIC))
    checks.check_grad(ns["grad"])
    assert {k: ns[k] for k in before} == before and ns["gradient_tape"] == tape_before


def test_the_watch_stopping_a_recursion_is_not_the_notebooks_tracer_but_a_cell_installing_one_is():
    """Python switches a trace function that raised off with an audited settrace, in the
    student's frame: the recursion watch stopping a recursion is not counted as the
    notebook installing a trace function (it flagged every recursive answer of 01)."""
    code = textwrap.dedent('''
        import sys
        from autograder.student import attempts, tape
        attempts.watch()
        cell = compile("def visit(n):\\n    return visit(n + 1)\\n", "<ipython-input-25-abc>", "exec")
        ns = {}
        exec(cell, ns)
        try:
            with tape.RecursionWatch():
                ns["visit"](0)
        except RecursionError:
            pass
        print(attempts.take())
        exec(compile("import sys\\nsys.settrace(lambda *a: None)\\n", "<ipython-input-26-abc>", "exec"), {})
        print(attempts.take())
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    stopped, installed = done.stdout.splitlines()
    assert stopped == "[]", done.stdout + done.stderr
    assert "installs a trace function (In [26], line 2)" in installed, installed
