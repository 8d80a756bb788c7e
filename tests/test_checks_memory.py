"""Unit tests of autograder.exercises.memory (notebook 08: 08_memory and
08_memory_checkpointing) and of the meters in autograder.student.memory: budgets of bytes
saved with the messages they give, the checkpoint and hooks checks, the same verdicts
through a Remote proxy, and the answer key of the true-or-false exercise, checked against
torch itself."""
from __future__ import annotations

import ast
import contextlib
import functools
import io
import warnings

import nbformat
import pytest
import torch
import torch.nn.functional as F

from answers import in_parts
from autograder import authoring
from autograder.checks.answers import quiz_keys
from autograder.checks.remote import Remote, loopback
from autograder.exercises import memory as m
from autograder.student import memory as meters
from autograder.student.report import CheckFailed
from grading import exercises

SLUGS = ("08_memory", "08_memory_checkpointing")  # parts 1 and 2
QUIZ = "08_memory_checkpointing"  # the notebook of the true-or-false exercise (on both parts)
answers = in_parts("memory", "memory_checkpointing")


def function(name, forward, backward):
    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def failure(check, answer, **kwargs) -> str:
    with pytest.raises(CheckFailed) as info:
        check(answer, **kwargs)
    return str(info.value)


def remote(name, answer):
    return Remote(name, loopback({name: answer}))


@functools.lru_cache(maxsize=None)
def _solutions() -> dict[str, str]:
    notebooks = [nbformat.read(authoring.solution_path(slug), as_version=4) for slug in SLUGS]
    return {e.answer_id: e.solution for nb in notebooks for e in exercises(nb)}


def defined(answer_id: str, source: str | None = None) -> dict:
    """The names an answer cell defines (the model solution unless `source` is given)."""
    namespace = {"torch": torch, "F": F}
    exec(compile(source or _solutions()[answer_id], f"<{answer_id}>", "exec"), namespace)
    return namespace


LeakyReLU = defined("leaky_relu")["LeakyReLU"]
LinearReLU = defined("linear_relu")["LinearReLU"]
Checkpoint = defined("manual_checkpoint")["Checkpoint"]
checkpoint_with_hooks = defined("hooked_checkpoint")["checkpoint_with_hooks"]
save_as_bf16 = defined("save_as_bf16")["save_as_bf16"]


# --- The meters ----------------------------------------------------------------------------

def test_saved_memory_counts_each_memory_block_once():
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)
    with meters.SavedMemory() as saved:
        torch.tanh(x @ w) @ w  # the tanh output is saved by tanh and by the second matmul
    assert saved.count == 4  # x, tanh's output twice, w
    assert saved.nbytes == 2 * 3 * 4 + 2 * 3 * 4 + 3 * 3 * 4
    assert "4 tensors saved, keeping 84 bytes alive" in str(saved)


def test_saved_memory_through_other_hooks_counts_what_they_keep():
    x = torch.randn(4, 8, requires_grad=True)
    with meters.SavedMemory(through=save_as_bf16()) as saved:
        torch.tanh(x * 2)
    assert saved.count == 1 and saved.nbytes == 4 * 8 * 2
    with meters.SavedMemory(through=torch.autograd.graph.save_on_cpu()) as saved:
        torch.tanh(x * 2)
    assert saved.nbytes == 4 * 8 * 4  # on the CPU: the tensor itself


def test_peak_memory_sees_forward_and_backward():
    x = torch.randn(256, requires_grad=True)  # created before: not counted
    with meters.PeakMemory() as mem:
        y = x.exp()  # 1 KiB, saved by exp
        view = y[1:]  # a view: no new memory
        assert mem.now == 1024
        y.sum().backward()
        assert mem.peak >= 2048  # the output and the gradient computed from it
    del y, view
    x.grad = None
    assert mem.now == 0


def _hooked(kept: dict):
    """torch's non-reentrant checkpoint of tanh(tanh(x)) as hooks written by hand: a handle per
    saved tensor, everything recomputed at the first unpack into `kept`, popped when unpacked
    unless `kept` is a dict that keeps them (any other mapping)."""
    x = torch.randn(64, dtype=torch.float64, requires_grad=True)
    handles = iter(range(10))
    steps = meters.BackwardSteps()

    def unpack(handle):
        if not kept:
            with steps.recomputing(), torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(
                    lambda t: kept.__setitem__(len(kept), t.detach()), lambda _: None):
                torch.tanh(torch.tanh(x))
        return kept.pop(handle) if isinstance(kept, dict) else kept[handle]

    with torch.autograd.graph.saved_tensors_hooks(lambda t: next(handles), unpack):
        y = torch.tanh(torch.tanh(x))
    with steps.watching(y):
        torch.autograd.grad(y.sum(), [x])
    return steps.held()


class Keeping(dict):
    pop = dict.get  # hands the tensor out and keeps it


def test_backward_steps_see_a_recomputed_tensor_kept_past_its_last_read():
    assert _hooked({}) == (0, 512)  # the inner tanh's output, needed by its own step: 64 float64
    assert _hooked(Keeping()) == (512, 512)  # and the outer one's, kept past the step that read it


def test_human():
    assert meters.human(1536) == "1.5 KiB" and meters.human(12) == "12 bytes"


# --- LeakyReLU -----------------------------------------------------------------------------

def leaky(save="mask", stash=False, backward_in_place=False):
    def forward(ctx, x, slope):
        positive = x > 0
        y = torch.where(positive, x, x * slope)
        saved = {"mask": positive, "input": x, "float mask": positive.to(x.dtype), "output": y}[save]
        if stash:
            ctx.saved = saved
        else:
            ctx.save_for_backward(saved)
        ctx.slope = slope
        return y

    def backward(ctx, grad_output):
        (saved,) = (ctx.saved,) if stash else ctx.saved_tensors
        positive = saved > 0
        if backward_in_place:
            grad_output[~positive] *= ctx.slope
            return grad_output, None
        return torch.where(positive, grad_output, grad_output * ctx.slope), None

    return function("LeakyReLU", forward, backward)


def test_leaky_relu_right(capsys):
    m.check_leaky_relu(leaky())
    m.check_leaky_relu(LeakyReLU, shapes=[(), (7,), (2, 1, 3)], slopes=[0.5, 0.01, 0.3], seed=None)
    out = capsys.readouterr().out
    assert "✔ LeakyReLU saves 5 bytes for x of shape (5,) (float64: 40 bytes), within its budget" in out
    assert "✔ LeakyReLU: forward and backward agree with the reference" in out


def test_leaky_relu_saving_the_input():
    message = failure(m.check_leaky_relu, leaky(save="input"))
    assert message.startswith(
        "LeakyReLU saved the input `x`, float64 of shape (2, 3), 48 bytes; a bool mask of x > 0 (6 bytes) "
        "is all backward needs."
    )
    assert "A torch.bool mask takes 1 byte per element" in message


def test_leaky_relu_saving_the_output():
    message = failure(m.check_leaky_relu, leaky(save="output"))
    assert message.startswith("LeakyReLU saved the output, float64 of shape (2, 3), 48 bytes;")
    assert "here nothing does" in message


def test_leaky_relu_saving_a_float_mask():
    message = failure(m.check_leaky_relu, leaky(save="float mask"))
    assert message.startswith("LeakyReLU saved the intermediate (x > 0) as a float, float64 of shape (2, 3), 48 bytes")
    assert "keep it as the torch.bool tensor x > 0" in message


def test_leaky_relu_stashing_the_mask():
    message = failure(m.check_leaky_relu, leaky(stash=True))
    assert message.startswith("LeakyReLU: tensor `ctx.saved` (an intermediate of shape (2, 3), 6 bytes) "
                              "is stashed on ctx.")
    assert "Stashing saves no memory" in message


def test_leaky_relu_scaling_grad_output_in_place():
    message = failure(m.check_leaky_relu, leaky(backward_in_place=True))
    assert message.startswith("LeakyReLU: backward modified grad_output in place.")


def test_leaky_relu_two_masks_exceed_the_budget():
    def forward(ctx, x, slope):
        ctx.save_for_backward(x > 0, x > 0)
        ctx.slope = slope
        return torch.where(x > 0, x, x * slope)

    def backward(ctx, g):
        positive = ctx.saved_tensors[0]
        return torch.where(positive, g, g * ctx.slope), None

    message = failure(m.check_leaky_relu, function("LeakyReLU", forward, backward))
    assert message.startswith("LeakyReLU saves 12 bytes, more than its budget of 6; a bool mask of x > 0 (6 bytes)")


# --- LinearReLU ----------------------------------------------------------------------------

def linear_relu(save=("x", "weight", "mask"), by_needs=True, extra_matmul=False, bias_squeezed=False):
    def forward(ctx, x, weight, bias):
        z = x @ weight.T + bias
        y = torch.relu(z)
        x_needs, weight_needs, _ = ctx.needs_input_grad
        table = {"x": x if weight_needs or not by_needs else None,
                 "weight": weight if x_needs or not by_needs else None,
                 "mask": z > 0, "bias": bias, "z": z, "output": y}
        ctx.save_for_backward(*(table[name] for name in save))
        ctx.names = save
        return y

    def backward(ctx, grad_output):
        saved = dict(zip(ctx.names, ctx.saved_tensors))
        mask = saved["mask"] if "mask" in saved else (saved.get("z", saved.get("output")) > 0)
        g = grad_output * mask
        x, weight = saved.get("x"), saved.get("weight")
        grad_x = g @ weight if ctx.needs_input_grad[0] else None
        if extra_matmul and grad_x is not None:
            grad_x = grad_x @ torch.eye(weight.shape[1], dtype=g.dtype, device=g.device)
        grad_weight = g.T @ x if ctx.needs_input_grad[1] else None
        grad_bias = g.sum(0) if ctx.needs_input_grad[2] else None
        if bias_squeezed and grad_bias is not None:
            grad_bias = grad_bias.squeeze()
        return grad_x, grad_weight, grad_bias

    return function("LinearReLU", forward, backward)


def test_linear_relu_right(capsys):
    m.check_linear_relu(linear_relu())
    m.check_linear_relu(LinearReLU, shapes=[(7, 4, 6), (1, 3, 2), (5, 1, 1)], seed=None)
    out = capsys.readouterr().out
    assert "✔ LinearReLU saves only what each needed gradient reads, plus a 1-byte mask" in out
    assert "no matmul recomputed in backward" in out


def test_linear_relu_saving_the_bias():
    message = failure(m.check_linear_relu, linear_relu(save=("x", "weight", "bias", "mask")))
    assert message.startswith(
        "LinearReLU saved the input `bias`, float64 of shape (5,), 40 bytes; x (for grad_weight), weight (for grad_x) "
        "and a bool mask of z > 0 (20 bytes), 236 bytes in all is all backward needs."
    )
    assert "backward never reads the bias" in message


def test_linear_relu_ignoring_needs_input_grad():
    message = failure(m.check_linear_relu, linear_relu(by_needs=False))
    assert message.startswith("LinearReLU saved the input `weight`, float64 of shape (5, 3), 120 bytes; x "
                              "(for grad_weight)")
    assert "x requires grad: False, weight requires grad: True, bias requires grad: True" in message
    assert "save weight only when x needs a gradient" in message


def test_linear_relu_saving_z_or_the_output():
    message = failure(m.check_linear_relu, linear_relu(save=("x", "weight", "z")))
    assert message.startswith("LinearReLU saved the intermediate z = x @ weight.T + bias, float64 of shape "
                              "(4, 5), 160 bytes")
    message = failure(m.check_linear_relu, linear_relu(save=("x", "weight", "output")))
    assert message.startswith("LinearReLU saved the output, float64 of shape (4, 5), 160 bytes")
    assert "a residual sum, which saves nothing" in message


def test_linear_relu_extra_matmul_in_backward():
    message = failure(m.check_linear_relu, linear_relu(extra_matmul=True))
    assert message.startswith("LinearReLU: backward multiplies matrices 3 times where 2 product(s) give the "
                              "needed gradients")


def test_linear_relu_right_only_on_the_visible_shapes():
    m.check_linear_relu(linear_relu(bias_squeezed=True))  # passes where out > 1
    message = failure(m.check_linear_relu, linear_relu(bias_squeezed=True), shapes=[(5, 1, 1)], seed=None)
    assert "the gradient for `bias` has shape () but `bias` has shape (1,)" in message


# --- Checkpoint ----------------------------------------------------------------------------

def test_checkpoint_right(capsys):
    m.check_checkpoint(Checkpoint)
    m.check_checkpoint(Checkpoint, shapes=[(1, 3), (5, 2)], seed=None)
    out = capsys.readouterr().out
    assert "✔ Checkpoint keeps the tensor inputs of run and a generator state, nothing else on ctx nor anywhere " \
           "else, and after backward nothing: for run = x + tanh(x @ w1) @ w2 and run = sin(x * s) * s." in out
    assert "backward leaves the caller's random generator alone" in out
    # the first block's line, and the second block's folded into one note (no mistake tells them apart)
    assert out.count("✔ Checkpoint with run = x + tanh(x @ w1) @ w2: forward and backward agree") == 2
    assert out.count("  and run = sin(x * s) * s: the same checks, the same result.") == 2
    assert "✔ Checkpoint with run = sin" not in out


def _mutant(label: str):
    answer = next(a for a in answers.MUTANTS if a.label == label)
    name = {"leaky_relu": "LeakyReLU", "linear_relu": "LinearReLU", "manual_checkpoint": "Checkpoint",
            "hooked_checkpoint": "checkpoint_with_hooks", "save_as_bf16": "save_as_bf16"}[answer.exercise]
    return defined(answer.exercise, answer.apply(_solutions()[answer.exercise]))[name]


@pytest.mark.parametrize("label, expected", [
    ("does not restore the random generator (preserve_rng_state=False)",
     "Checkpoint: the gradient for `x` differs from the block's own, with dropout in the block."),
    ("restores the generator without fork_rng (moves the caller's generator)",
     "Checkpoint: backward moved the caller's random generator"),
    ("returns None for the parameters (the guide's CheckpointedSequential)",
     "Checkpoint: the gradient for `w1` differs from the block's own"),
    ("saves the output too", "Checkpoint saved the output, float64 of shape (3, 4), 96 bytes; the tensor inputs"),
    ("keeps forward's graph on ctx instead of recomputing", "Checkpoint: tensor `ctx.inputs[0]` (the input `x`"),
    ("recomputes from inputs that do not require grad",
     "Checkpoint: backward raised RuntimeError: `inputs` argument to `grad()` cannot be empty"),
    ("recomputes without recording (no enable_grad)",
     "Checkpoint: backward raised RuntimeError: element 0 of tensors does not require grad"),
])
def test_checkpoint_mutants(label, expected):
    message = failure(m.check_checkpoint, _mutant(label))
    assert message.startswith(expected), message


def test_checkpoint_messages_name_the_cause():
    message = failure(m.check_checkpoint, _mutant("does not restore the random generator (preserve_rng_state=False)"))
    assert "preserve_rng_state=True" in message
    message = failure(m.check_checkpoint,
                      _mutant("returns None for the parameters (the guide's CheckpointedSequential)"))
    assert "parameters included" in message
    message = failure(m.check_checkpoint, _mutant("recomputes from inputs that do not require grad"))
    assert "requires_grad_(needed)" in message
    message = failure(m.check_checkpoint, _mutant("recomputes without recording (no enable_grad)"))
    assert "torch.enable_grad()" in message


def test_checkpoint_that_never_recomputes():
    def forward(ctx, run, *inputs):
        with torch.enable_grad():
            detached = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
            output = run(*detached)
        grads = torch.autograd.grad(output, [t for t in detached if t.requires_grad], torch.ones_like(output))
        ctx.save_for_backward(*inputs)
        ctx.grads = grads  # a gradient for a grad_output of ones: wrong anyway
        return output.detach()

    message = failure(m.check_checkpoint, function("Checkpoint", forward, lambda ctx, g: (None, *ctx.grads)))
    assert "is stashed on ctx" in message


# --- checkpoint_with_hooks -----------------------------------------------------------------

def test_checkpoint_with_hooks_right(capsys):
    m.check_checkpoint_with_hooks(checkpoint_with_hooks)
    out = capsys.readouterr().out
    assert "✔ checkpoint_with_hooks keeps none of the tensors run saves after forward, only run's inputs" in out
    assert "run recomputed once in backward; each recomputed tensor let go of once backward has read it" in out


@pytest.mark.parametrize("label, expected, cause", [
    ("pack keeps the tensor with its handle (recomputes, but keeps everything)",
     "checkpoint_with_hooks: after forward, a tensor forward created", "whatever pack returns, the graph keeps"),
    ("pack keeps the tensor and unpack returns it (no checkpoint at all)",
     "checkpoint_with_hooks: after forward, a tensor forward created", "Return a handle"),
    ("recomputes at every unpack", "checkpoint_with_hooks: run ran 7 times for one forward and one backward.",
     "Recompute once, at the first unpack of a backward"),
    ("the recomputation does not restore the random generator",
     "checkpoint_with_hooks: the gradient for `x` differs from the block's own", "preserve_rng_state=True"),
    ("the recomputation moves the caller's generator (no fork_rng)",
     "checkpoint_with_hooks: backward moved the caller's random generator", "fork_rng"),
    ("the recomputation runs without recording (no enable_grad)", "checkpoint_with_hooks: backward raised KeyError",
     "torch.enable_grad()"),
    ("recomputes from detached inputs (they save less)", "checkpoint_with_hooks: backward raised KeyError",
     "require grad as in forward"),
    ("recomputes run in float64 (for accuracy: the graph's float32 tensors get float64 ones back)",
     "checkpoint_with_hooks with run = x + tanh(x @ w1) @ w2: backward mixes dtypes", "keep every step in the "
     "inputs' dtype"),
    ("also logs every saved tensor in a module global list", "checkpoint_with_hooks: after forward, a tensor forward "
     "created", "kept by the global variable `SAVED`"),
    *[(label, "checkpoint_with_hooks: during backward, 576 bytes of recomputed tensors were still alive after the last "
       "step of backward that read them", "recomputed.pop(handle)") for label in (
        "unpack keeps every recomputed tensor in its dict until the graph is freed",
        "unpack hands out a copy and keeps the recomputed tensor",
        "keeps a trace of every recomputed tensor beside the dict, for debugging")],
])
def test_checkpoint_with_hooks_mutants(label, expected, cause):
    message = failure(m.check_checkpoint_with_hooks, _mutant(label))
    assert message.startswith(expected) and cause in message, message


# --- A tensor kept outside ctx (the bug class every memory check catches) ------------------

@pytest.mark.parametrize("label, check, expected", [
    ("keeps the mask in a class attribute instead of saving it (saves 0 bytes)", m.check_leaky_relu,
     "LeakyReLU: after forward, a tensor forward created (bool of shape (2, 3), 6 bytes) is still alive, kept by "
     "the class attribute `LeakyReLU.positive`"),
    ("keeps the mask in a module global instead of saving it", m.check_linear_relu,
     "LinearReLU: after forward, a tensor forward created (bool of shape (4, 5), 20 bytes) is still alive, kept by "
     "the global variable `_mask`"),
    ("saves the inputs, and logs them through a helper with a list default argument", m.check_checkpoint,
     "Checkpoint: after backward, with the inputs, the outputs and the graph let go of, the input `x` (float64 of "
     "shape (3, 4), 96 bytes) is still alive, kept by a default argument of `logged`"),
    ("keeps x and weight in a dict of an enclosing function (a closure): saves only the mask", m.check_linear_relu,
     "LinearReLU: after backward, with the inputs, the outputs and the graph let go of, the input `x` (float64 of "
     "shape (4, 3), 96 bytes) is still alive, kept by the variable `kept` of `_fused_layer`"),
    ("keeps the inputs in a class attribute instead of saving them", m.check_checkpoint,
     "Checkpoint: after backward, with the inputs, the outputs and the graph let go of, the input `x` (float64 of "
     "shape (3, 4), 96 bytes) is still alive, kept by the class attribute `Checkpoint.inputs`"),
])
def test_a_tensor_kept_outside_ctx_fails_with_what_keeps_it(label, check, expected):
    message = failure(check, _mutant(label))
    assert message.startswith(expected), message
    assert "no tensor anywhere else" in message


# --- save_as_bf16 --------------------------------------------------------------------------

def test_save_as_bf16_right(capsys):
    m.check_save_as_bf16(save_as_bf16)
    m.check_save_as_bf16(save_as_bf16, shapes=[(4, 3, 8, 300), (1, 2, 3, 4)], dtype="float64", seed=None)
    m.check_save_as_bf16(save_as_bf16, shapes=[(5, 4, 6, 7)], scale=1e5, seed=None)
    out = capsys.readouterr().out
    assert "✔ save_as_bf16 keeps the activations in 540 bytes instead of 1080" in out
    assert "(float32, cpu, meta)" in out


@pytest.mark.parametrize("label, kwargs, expected", [
    ("unpack gives back bfloat16", {}, "save_as_bf16: unpack returned bfloat16 for an activation, float32 of shape"),
    ("compresses the parameters too", {}, "save_as_bf16: pack made a bfloat16 copy of the parameter of shape (16, 5)."),
    ("compresses every tensor, indices and masks included", {},
     "save_as_bf16: pack stored the bool mask masked_fill saves, bool of shape (6, 16) (96 bytes) as bfloat16."),
    ("float16 instead of bfloat16 (overflows above 65504)", {"scale": 1e5},
     "save_as_bf16: unpack gave back an activation, float32 of shape (6, 5) (120 bytes) with values that differ"),
    ("compresses float32 only (float64 kept as it is)", {"dtype": "float64"},
     "save_as_bf16: pack kept an activation, float64 of shape (6, 5) (240 bytes) as it is; bfloat16 takes 2 bytes"),
    ("unpack always gives back float32", {"dtype": "float64"},
     "save_as_bf16: unpack returned float32 for an activation"),
    ("offloads to the CPU and forgets the device", {},
     "save_as_bf16: pack fails on the meta device: NotImplementedError"),
    ("compresses nothing", {}, "save_as_bf16: pack kept an activation, float32 of shape (6, 5) (120 bytes) as it is"),
])
def test_save_as_bf16_mutants(label, kwargs, expected):
    message = failure(m.check_save_as_bf16, _mutant(label), **kwargs)
    assert message.startswith(expected), message


def test_save_as_bf16_integers_above_256():
    def pack(t):  # indices through bfloat16 and back to int64: the values change above 256
        if t.dtype == torch.int64:
            return ("int", t.to(torch.bfloat16))
        return ("as is", t)

    class hooks(torch.autograd.graph.saved_tensors_hooks):
        def __init__(self):
            super().__init__(pack, lambda p: p[1].to(torch.int64) if p[0] == "int" else p[1])

    message = failure(m.check_save_as_bf16, hooks, shapes=[(4, 3, 8, 300)])
    assert "unpack gave back other values for the int64 indices gather saves" in message
    assert "257 becomes 256" in message


def test_save_as_bf16_without_super_init():
    class hooks(torch.autograd.graph.saved_tensors_hooks):
        def __init__(self):
            pass

    message = failure(m.check_save_as_bf16, hooks)
    assert message.startswith("save_as_bf16() raised AttributeError") and "super().__init__(pack, unpack)" in message


def test_save_as_bf16_float8_is_too_coarse():
    class hooks(torch.autograd.graph.saved_tensors_hooks):
        def __init__(self):
            def pack(t):
                if t.dtype == torch.float32 and not (t.is_leaf and t.requires_grad):
                    return (t.dtype, t.to(torch.float8_e4m3fn))
                return (None, t)

            super().__init__(pack, lambda p: p[1] if p[0] is None else p[1].to(p[0]))

    assert "more than bfloat16's rounding" in failure(m.check_save_as_bf16, hooks)


# --- Every known answer: the same verdict in the grader, through the wire ------------------

CHECKS = {
    "leaky_relu": ("LeakyReLU", [(m.check_leaky_relu, {}),
                                 (m.check_leaky_relu, {"shapes": [(), (7,), (2, 1, 3)], "slopes": [0.5, 0.01, 0.3]})]),
    "linear_relu": ("LinearReLU", [(m.check_linear_relu, {}),
                                   (m.check_linear_relu, {"shapes": [(7, 4, 6), (1, 3, 2), (5, 1, 1)]})]),
    "manual_checkpoint": ("Checkpoint", [(m.check_checkpoint, {}),
                                         (m.check_checkpoint, {"shapes": [(1, 3), (5, 2), (1, 1)]})]),
    "hooked_checkpoint": ("checkpoint_with_hooks", [
        (m.check_checkpoint_with_hooks, {}), (m.check_checkpoint_with_hooks, {"shapes": [(1, 3), (5, 2), (1, 1)]})]),
    "save_as_bf16": ("save_as_bf16", [
        (m.check_save_as_bf16, {}),
        (m.check_save_as_bf16, {"shapes": [(4, 3, 8, 300), (1, 2, 3, 4)], "dtype": "float64"}),
        (m.check_save_as_bf16, {"shapes": [(5, 4, 6, 7)], "scale": 1e5}),
    ]),
}


def _verdict(exercise: str, student) -> str | None:
    """The first failure message of the exercise's visible and hidden checks (None: all pass)."""
    for check, kwargs in CHECKS[exercise][1]:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                check(student, **kwargs)
        except CheckFailed as error:
            return str(error)
    return None


KNOWN = [a for a in answers.MUTANTS + answers.VARIANTS if a.exercise in CHECKS]


@pytest.mark.parametrize("answer", KNOWN, ids=[f"{a.exercise}: {a.label}" for a in KNOWN])
def test_known_answers_get_the_same_verdict_remotely(answer):
    name = CHECKS[answer.exercise][0]
    student = defined(answer.exercise, answer.apply(_solutions()[answer.exercise]))[name]
    local = _verdict(answer.exercise, student)
    assert (local is None) == (answer in answers.VARIANTS), local
    assert _verdict(answer.exercise, remote(name, student)) == local


@pytest.mark.parametrize("exercise", sorted(CHECKS))
def test_the_model_solution_passes_the_same_way_remotely(exercise, capsys):
    name = CHECKS[exercise][0]
    student = defined(exercise)[name]
    for check, kwargs in CHECKS[exercise][1]:
        check(student, **kwargs)
        local = capsys.readouterr().out
        check(remote(name, student), **kwargs)
        assert capsys.readouterr().out == local


# --- The answer key of "true or false?" ----------------------------------------------------

def _key() -> dict[str, str]:
    nb = nbformat.read(authoring.solution_path(QUIZ), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "check_claims_hidden")
    call = next(n for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Call))
    return ast.literal_eval(next(k.value for k in call.keywords if k.arg == "key"))


def _claim_a() -> bool:  # ctx.row = x[0] keeps only the row's bytes alive
    x = torch.randn(64, 64)
    row = x[0]
    whole = __import__("weakref").ref(x)
    del x
    return whole() is None or row.untyped_storage().nbytes() == row.numel() * row.element_size()


def _claim_b() -> bool:  # saving only the mask z > 0 keeps z alive until backward
    seen = []

    class MaskOnly(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            z = x * 2
            seen.append(__import__("weakref").ref(z.untyped_storage()))
            ctx.save_for_backward(z > 0)
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            (mask,) = ctx.saved_tensors
            return g * mask

    out = MaskOnly.apply(torch.randn(100, requires_grad=True))
    return seen[0]() is not None and out is not None


def _claim_c() -> bool:  # the mask taken after z.relu_() changes LinearReLU's gradients
    z = torch.randn(16, 8)
    z[0, 0] = 0.0
    before = z > 0
    return not torch.equal(before, z.relu_() > 0)


def _peak_in_segments(size: int) -> int:
    ws = [torch.randn(16, 16) / 4 for _ in range(64)]
    h = torch.randn(8, 16, requires_grad=True)

    def segment(h, *ws):
        for w in ws:
            h = torch.tanh(h @ w)
        return h

    with meters.PeakMemory() as mem:
        out = h
        for start in range(0, 64, size):
            out = torch.utils.checkpoint.checkpoint(segment, out, *ws[start:start + size], use_reentrant=False)
        out.sum().backward()
    return mem.peak


def _claim_e() -> bool:  # without restoring the generator, p = 0 dropout still gives the right gradient
    h = torch.randn(4, 8)
    return torch.equal(F.dropout(h, 0.0, training=True), F.dropout(h, 0.0, training=True))


def _claim_f() -> bool:  # x @ w with both requiring grad saves both
    x, w = torch.randn(2, 3, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    with meters.SavedMemory() as saved:
        x @ w
    return {tuple(e.shape) for e in saved.entries} >= {(2, 3), (3, 4)}


def _claim_g() -> bool:  # reentrant checkpoint: a weight read from outside makes out require grad
    w = torch.randn(4, 4, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "None of the inputs have requires_grad=True"
        out = torch.utils.checkpoint.checkpoint(lambda h: h @ w, torch.randn(2, 4), use_reentrant=True)
    return out.requires_grad


def _claim_h() -> bool:  # float16 keeps 1e-8 non-zero
    return bool(torch.tensor(1e-8).to(torch.float16) != 0)


def _claim_i() -> bool:  # non-reentrant: two backward passes run the block three times in all
    runs = []

    def block(x):
        runs.append(1)
        return torch.tanh(x) * x

    x = torch.randn(3, requires_grad=True)
    out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).sum()
    out.backward(retain_graph=True)
    out.backward()
    return len(runs) == 3


CLAIMS = {
    "a": _claim_a,
    "b": _claim_b,
    "c": _claim_c,
    "d": lambda: _peak_in_segments(8) < _peak_in_segments(4),
    "e": _claim_e,
    "f": _claim_f,
    "g": _claim_g,
    "h": _claim_h,
    "i": _claim_i,
}


@pytest.mark.parametrize("question", sorted(CLAIMS))
def test_the_answer_key_is_what_torch_does(question):
    assert _key()[question] == ("true" if CLAIMS[question]() else "false")


def test_every_claim_is_explained_whichever_way_it_is_answered():
    """The hidden cell explains the key and the tempting wrong answer of every claim."""
    found = quiz_keys(nbformat.read(authoring.solution_path(QUIZ), as_version=4), QUIZ)[f"{QUIZ}/claims"]
    assert found["key"] == _key()
    assert {q: set(lines) for q, lines in found["explain"].items()} == {q: {"true", "false"} for q in CLAIMS}


def test_checkpoint_segments():
    """Claim d: with √n segments of √n layers, O(√n) activations after forward and at the peak."""
    n, unit_shape = 16, (8, 32)
    ws = [torch.randn(32, 32) / 32**0.5 for _ in range(n)]
    h0 = torch.randn(*unit_shape, requires_grad=True)
    unit = 8 * 32 * 4

    def chain(h, *ws):
        for w in ws:
            h = torch.tanh(h @ w)
        return h

    with meters.PeakMemory() as mem:
        h = h0
        for i in range(0, n, 4):
            h = torch.utils.checkpoint.checkpoint(chain, h, *ws[i:i + 4], use_reentrant=False)
        kept = mem.now
        h.sum().backward()
    assert kept == 4 * unit and mem.peak <= 2 * 4 * unit + 2 * unit


def test_the_second_blocks_failure_is_shown_though_its_lines_are_folded():
    """The block folded into a note is checked all the same: a checkpoint wrong only there fails with its message."""
    class WrongOnSin(Checkpoint):
        @staticmethod
        def backward(ctx, grad_output):
            grads = Checkpoint.backward(ctx, grad_output)
            scale = 2.0 if len(grads) == 3 else 1.0  # (run, x, s): wrong for sin(x * s) * s only
            return tuple(g if g is None else scale * g for g in grads)

    message = failure(m.check_checkpoint, WrongOnSin)
    assert message.startswith("Checkpoint with run = sin(x * s) * s:"), message
