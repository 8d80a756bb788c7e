"""Unit tests of the checks of notebook 07_engine_and_dispatcher, messages included, and of
what the notebook's quiz key claims about torch."""
from __future__ import annotations

import functools

import nbformat
import pytest
import torch

from answers import for_notebook
from autograder import authoring
from autograder.checks import inputs
from autograder.checks.remote import Remote, loopback
from autograder.exercises import engine_and_dispatcher as ex
from autograder.student import engine_and_dispatcher as graphs
from autograder.student.memory import PeakMemory
from autograder.student.report import CheckFailed
from grading import check_fails as _fails
from grading import exercises

SLUG = "07_engine_and_dispatcher"
NAMES = {"engine_order": "engine_order", "clip_gradients": "clip_gradients", "step_in_backward": "step_in_backward",
         "backward_memory": "BackwardMemory", "engine_answers": "engine_answers"}


@functools.cache
def _solutions() -> dict[str, str]:
    nb = nbformat.read(authoring.solution_path(SLUG), as_version=4)
    return {e.answer_id: e.solution for e in exercises(nb)}


def answer(grade_id: str, label: str | None = None):
    """The model answer of an exercise, or the known answer called `label`, as the notebook defines it."""
    source = _solutions()[grade_id]
    if label is not None:
        known = for_notebook(SLUG)
        (found,) = [a for a in known.MUTANTS + known.VARIANTS if a.exercise == grade_id and a.label == label]
        source = found.apply(source)
    namespace: dict = {}
    exec("import torch\nfrom torch.utils._python_dispatch import TorchDispatchMode\n" + source, namespace)
    return namespace[NAMES[grade_id]]


# --- The engine's order ------------------------------------------------------------------------

def test_the_judge_accepts_the_engines_own_rule_on_many_random_graphs():
    """Dependencies counted, a heap on sequence numbers: the engine's order on 60 random graphs,
    AccumulateGrads that become ready together in any order."""
    engine_order = answer("engine_order")
    generator = inputs.generator(7)
    for k in range(60):
        program = ex.random_program(generator, 1 + k % 4, 4 + k % 20)
        built = graphs.build(program)
        found = {"order": [built.labels[n] for n in engine_order(built.root.grad_fn)], "type": "list",
                 "error": None, "ran": False}
        ex._judge_order(f"random graph {k}", ex._truth(program), found)


def test_accumulate_grads_ready_together_run_in_an_order_of_the_engines_own():
    """Why the judge accepts any order among them: six leaves stacked, their AccumulateGrads
    are not run in the order of next_functions."""
    leaves = [torch.rand(2, requires_grad=True) for _ in range(6)]
    loss = torch.stack(leaves).sum()
    order = [n.variable for n in graphs.recorded_order(loss) if hasattr(n, "variable")]
    assert [next(i for i, p in enumerate(leaves) if p is v) for v in order] != list(range(6))


@pytest.mark.parametrize("label, needles", [
    ("walks the graph depth first (no dependencies counted)", ["has not run yet", "a node runs only once"]),
    ("ready nodes first come, first served (a queue, not by sequence number)",
     ["both are ready", "first come, first served"]),
    ("AccumulateGrads at the end, not as soon as they are ready", ["is ready", "2**64 - 1"]),
    ("returns the names of the nodes", ["not a node (str)", "return the Node objects"]),
    ("leaves out the AccumulateGrad nodes", ["stops after", "every AccumulateGrad is a node the engine runs"]),
    ("runs the engine from the root node and records the order", ["ran the graph's backward", "without running it"]),
])
def test_a_wrong_order_is_told_why(label, needles):
    _fails(ex.check_engine_order, answer("engine_order", label), *needles)


def test_a_hidden_graph_is_named_without_its_program():
    message = _fails(ex.check_engine_order, answer("engine_order", "walks the graph depth first (no dependencies "
                                                                   "counted)"), programs=[], seed=None)
    assert "graph: random graph 1 (10 operations, hidden from you)" in message


# --- Hooks ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("label, needles", [
    ("clips the gradient in place (the shared tensor)", ["changed the gradient of x", "x @ w + c hands one"]),
    ("clips .grad after accumulation (earlier micro-batches' too)", ["you clipped .grad", "post-accumulate-grad"]),
    ("rescales every gradient to max_norm, small ones too", ["also those below it"]),
    ("divides by the norm with no guard: 0/0 for a zero gradient", ["dead.grad", "0/0"]),
    ("computes the clipped gradient and returns nothing", ["not clipped at all"]),
    ("returns only the last handle", ["after the returned handles were removed"]),
])
def test_wrong_clipping_is_told_why(label, needles):
    _fails(ex.check_clip_hooks, answer("clip_gradients", label), *needles)


@pytest.mark.parametrize("label, needles", [
    ("steps in a tensor hook, before accumulation (and leaves .grad set)", ["w.grad is still set"]),
    ("steps every parameter at the end of backward", ["still unchanged when a later node", "right after its"]),
    ("rebinds the name instead of updating the parameter", ["was not updated"]),
    ("returns no handles", ["(remove)", "return the handles"]),
])
def test_wrong_steps_are_told_why(label, needles):
    _fails(ex.check_step_hooks, answer("step_in_backward", label), *needles)


def test_a_step_that_misses_earlier_micro_batches_is_told_so():
    def step_in_backward(params, lr):
        def before(p):
            def step(grad):
                p.sub_(lr * grad)  # this backward's gradient only
            return step

        def free(p):
            p.grad = None

        return [h for p in params for h in (p.register_hook(before(p)), p.register_post_accumulate_grad_hook(free))]

    _fails(ex.check_step_hooks, step_in_backward, "without what .grad held from earlier micro-batches")


# --- The memory meter ----------------------------------------------------------------------------

@pytest.mark.parametrize("label, needles", [
    # A meter that never lets a freed block go is told so, or, where the allocator has handed
    # that block's address to a later op's output first (which depends on what the process ran
    # before), told that this output was new memory it did not log.
    ("never subtracts freed blocks", [["meter.now", "was not subtracted"], ["created", "your log says 0"]]),
    ("counts views and in-place results as new memory", ["aten.t.default, created 0 bytes", "no memory of its own"]),
    ("looks at a single output only, not tuples", ["native_layer_norm_backward", "several (a tuple"]),
    ("follows the tensor, not its block", ["still alive", "watch the block"]),
    ("counts every block it sees, the inputs' too", ["not its inputs"]),
    ("logs only the operations that create memory", ["log each op once"]),
    ("is the grader's own meter, imported", ["exercises.engine_and_dispatcher.Measure", "write BackwardMemory"]),
    ("08's PeakMemory with a log added", ["student.memory.PeakMemory", "not a dispatch mode of yours"]),
])
def test_a_wrong_meter_is_told_why(label, needles):
    message = _fails(ex.check_backward_memory, answer("backward_memory", label))
    told = needles if isinstance(needles[0], list) else [needles]  # one of several diagnoses, or this one
    assert any(all(needle in message for needle in diagnosis) for diagnosis in told), message


def test_the_grader_measure_is_the_course_meter_and_the_same_every_time():
    for kind, n in ex.CASES:
        first = graphs.memory_case(ex.Measure, kind, n, 3, "cpu")
        assert graphs.memory_case(ex.Measure, kind, n, 3, "cpu") == first
        course = graphs.memory_case(PeakMemory, kind, n, 3, "cpu")
        assert (course["now"], course["peak"]) == (first["now"], first["peak"])
        assert first["peak"] > first["now"] > 0 and any(b == 0 for _, b in first["log"])


# --- Both ways: in the kernel and through the grader's proxy ---------------------------------------

def _message(check, student) -> str | None:
    try:
        check(student)
    except CheckFailed as failure:
        return str(failure)
    return None


@pytest.mark.parametrize("check, grade_id, label", [
    (ex.check_engine_order, "engine_order", None),
    (ex.check_engine_order, "engine_order", "ready nodes first come, first served (a queue, not by sequence number)"),
    (ex.check_clip_hooks, "clip_gradients", None),
    (ex.check_clip_hooks, "clip_gradients", "clips the gradient in place (the shared tensor)"),
    (ex.check_step_hooks, "step_in_backward", None),
    (ex.check_step_hooks, "step_in_backward", "steps every parameter at the end of backward"),
    (ex.check_backward_memory, "backward_memory", None),
    (ex.check_backward_memory, "backward_memory", "follows the tensor, not its block"),
], ids=["order", "order-fifo", "clip", "clip-in-place", "step", "step-late", "memory", "memory-tensor"])
def test_a_check_says_the_same_in_the_grader_as_in_the_kernel(check, grade_id, label):
    student = answer(grade_id, label)
    local = _message(check, student)
    assert (local is None) == (label is None), local
    assert _message(check, Remote("student", loopback({"student": student}))) == local


# --- The quiz's key is what torch does -------------------------------------------------------------

def _key() -> dict[str, str]:
    namespace: dict = {}
    exec(_solutions()["engine_answers"], namespace)
    return namespace["engine_answers"]


def test_the_quiz_key_is_what_torch_does():
    shown = {}
    x = torch.tensor([0.5, 1.0], requires_grad=True)
    h, calls = x.sin(), []
    h.register_hook(lambda g: calls.append(1))
    (h * 2 + h.exp() + h * h).sum().backward()
    shown["a"] = str(len(calls))

    y, received = x.exp(), []
    y.register_hook(lambda g: g + 1)
    y.grad_fn.register_prehook(lambda grads: (grads[0] * 2,))
    y.grad_fn.register_prehook(lambda grads: received.append(grads[0]))
    y.sum().backward()
    shown["b"] = str(int(received[0][0]))

    p, log = torch.ones(2, requires_grad=True), []
    node = p.view_as(p).grad_fn.next_functions[0][0]
    node.register_prehook(lambda grads: log.append("the Node pre-hook"))
    p.register_hook(lambda g: log.append("the tensor hook"))
    (p * 2).sum().backward()
    shown["c"] = log[0]

    shown["d"] = [a for a in dir(x.sigmoid().grad_fn) if a.startswith("_saved_")][0]
    shown["e"] = str((x * torch.ones(2)).grad_fn._saved_self)

    seq = {}
    a = x.exp().sin()
    b = x.cos().tanh()
    for name, branch in (("branch A", a), ("branch B", b)):
        branch.grad_fn.register_prehook(lambda grads, name=name: seq.update(first=seq.get("first", name)))
    (a + b).sum().backward()
    shown["f"] = seq["first"]

    q, hooked = torch.ones(2, requires_grad=True), []
    q.register_post_accumulate_grad_hook(lambda q: hooked.append(1))
    torch.autograd.grad((q * 2).sum(), [q])
    shown["g"] = "yes" if hooked else "no"

    meter = answer("backward_memory")
    y = torch.ones(3, requires_grad=True)
    loss = y.sum()
    with meter() as m:
        loss.backward()
    shown["h"] = str(dict((str(op), n) for op, n in m.log)["aten.expand.default"])
    assert shown == _key()
    assert set(_key()) == set(ex.QUIZ_QUESTIONS) and set(_key().values()) <= set(ex.QUIZ_CHOICES)
