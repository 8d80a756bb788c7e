"""Unit tests of autograder.checks.saved: recording what a Function saved, and check_saved."""
from __future__ import annotations

import pytest
import torch

from autograder.checks.remote import Remote, loopback
from autograder.checks.saved import Backward, SaveRule, check_saved, observe
from autograder.student.report import CheckFailed
from autograder.student.saved import Names, classify, record, show_saved, summary


def leaf(*shape: int) -> torch.Tensor:
    """Seeded, so the same every run (seed 0 gives both signs: masks are neither all True nor all False)."""
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)


def function(forward, backward=lambda ctx, g: g):
    """A Function class from two plain functions."""
    return type("Fn", (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward),
    })


def saves_output(ctx, x):
    y = x.exp()
    ctx.save_for_backward(y)
    return y


def exp_backward(ctx, g):
    (y,) = ctx.saved_tensors
    return g * y


Exp = function(saves_output, exp_backward)


# --- record and classify -------------------------------------------------------------------

def roles(fn, *args) -> list[str]:
    return [s.role for s in record(fn, *args).saved]


def test_an_input_an_output_and_an_intermediate_are_told_apart():
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(x, y, y * 2)
        return y

    assert roles(function(forward), leaf(3)) == ["input 0", "output 0", "intermediate"]


def test_views_share_the_storage_but_not_the_layout():
    def forward(ctx, x):
        ctx.save_for_backward(x[1:], x.T)
        return x * 1

    assert roles(function(forward), leaf(3, 2)) == ["view of input 0", "view of input 0"]


def test_the_output_of_an_in_place_function_counts_as_the_output():
    def forward(ctx, x):
        x.exp_()
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    assert roles(function(forward, exp_backward), leaf(3) * 1) == ["output 0"]


def test_an_integer_output_and_the_bytes_of_each_dtype():
    def forward(ctx, x):
        values, indices = x.sort()
        ctx.save_for_backward(indices, x > 0)
        return values, indices

    recording = record(function(forward, lambda ctx, g, gi: g), leaf(5))
    assert [(s.role, s.tensor.dtype, s.nbytes) for s in recording.saved] == [
        ("output 1", torch.int64, 40), ("intermediate", torch.bool, 5),
    ]
    assert recording.nbytes == 45


def test_nothing_is_saved_without_a_graph():
    assert record(Exp, leaf(3).detach()).saved == []


def test_a_second_argument_that_needs_no_grad_is_still_an_input():
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    assert roles(function(forward, lambda ctx, g: (g, g)), leaf(2), leaf(2).detach()) == ["input 0", "input 1"]


def test_tensors_stashed_on_ctx_are_found_in_attributes_lists_and_dicts():
    def forward(ctx, x):
        y = x.exp()
        ctx.y, ctx.cache, ctx.scale = y, [x, {"e": y * 2}], 3.0
        return y

    stashed = record(function(forward), leaf(3)).stashed
    assert {path: s.role for path, s in stashed.items()} == {
        "y": "output 0", "cache[0]": "input 0", "cache[1]['e']": "intermediate",
    }


def test_classify_falls_back_to_an_intermediate():
    x = torch.ones(2)
    assert classify(x.clone(), (x,), []).role == "intermediate"


# --- summary and show_saved ----------------------------------------------------------------

def test_summary_names_known_intermediates_and_stashes(capsys):
    def forward(ctx, x):
        e = torch.exp(-x)
        ctx.save_for_backward(e)
        ctx.y = 1 / (1 + e)
        return ctx.y

    x = leaf(3)
    text = summary(record(function(forward), x), Names(args=["x"], known={"exp(-x)": lambda x: torch.exp(-x)}))
    assert text.splitlines() == [
        "saved 1 tensor, 24 bytes (all in intermediates, kept alive only for backward)",
        "  the intermediate exp(-x) of shape (3,), 24 bytes, float64",
        "  stashed on ctx, invisible to autograd: ctx.y = the output of shape (3,), 24 bytes",
    ]
    show_saved(Exp, x)
    assert capsys.readouterr().out.splitlines() == ["Fn: saved 1 tensor, 24 bytes",
                                                    "  the output of shape (3,), 24 bytes, float64"]


# --- check_saved ---------------------------------------------------------------------------

RULE = SaveRule(
    name="Exp", expected=("output 0",), fix="save the output instead",
    names=Names(known={"exp(x)": torch.exp}), reasons={"input": "backward would compute exp again."},
)


def failure(fn, rule=RULE, *args) -> str:
    with pytest.raises(CheckFailed) as info:
        check_saved(fn, rule, args or (leaf(3),))
    return str(info.value)


def test_check_saved_passes_and_returns_the_recording():
    recording = check_saved(Exp, RULE, (leaf(4),))
    assert recording.nbytes == 32


def test_a_stashed_output_is_rejected_with_the_reasons():
    def forward(ctx, x):
        ctx.y = x.exp()
        return ctx.y

    message = failure(function(forward, lambda ctx, g: g * ctx.y))
    assert message.startswith("Exp: tensor `ctx.y` (the output of shape (3,), 24 bytes) is stashed on ctx.")
    for reason in ("check its version", "free it after backward", "saved-tensor hooks", "reference cycle",
                   "ctx.save_for_backward"):
        assert reason in message


def test_a_stash_without_a_grad_fn_makes_no_cycle():
    def forward(ctx, x):
        values, ctx.indices = x.sort()
        ctx.mark_non_differentiable(ctx.indices)
        return values, ctx.indices

    rule = SaveRule(name="Sort", expected=("output 1",), fix="save the indices", names=Names(outputs=("v", "indices")))
    message = failure(function(forward, lambda ctx, g, gi: g), rule)
    assert "`ctx.indices` (the output `indices` of shape (3,), 24 bytes)" in message
    assert "cycle" not in message


def test_an_unexpected_intermediate_is_named_with_its_size_and_why():
    def forward(ctx, x):
        e = x.exp()
        ctx.save_for_backward(e)
        return e * 1

    message = failure(function(forward, exp_backward))
    assert message.splitlines()[0] == ("Exp saved the intermediate exp(x) of shape (3,), 24 bytes: save the output "
                                       "instead.")
    assert "double backward" in message and "memory" in message


def test_an_unexpected_input_gets_the_exercise_reason():
    def forward(ctx, x):
        ctx.save_for_backward(x, x.exp())
        return x.exp()

    message = failure(function(forward))
    assert message.startswith("Exp saved the input `x` of shape (3,), 24 bytes: save the output instead.")
    assert "Likely cause: backward would compute exp again." in message


def test_an_expected_tensor_that_is_missing():
    rule = SaveRule(name="Exp", expected=("output 0", "input 0"), fix="save both")
    assert failure(Exp, rule).startswith("Exp does not save the input `x`: save both.")


def test_backward_that_modifies_a_saved_tensor():
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y.add_(1)

    assert "backward modified a saved tensor in place: the output" in failure(function(saves_output, backward))


def test_backward_that_modifies_grad_output():
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g.mul_(y)

    assert "backward modified grad_output in place" in failure(function(saves_output, backward))


def test_backward_with_too_few_parameters_for_the_outputs():
    def forward(ctx, x):
        values, indices = x.sort()
        ctx.save_for_backward(indices)
        return values, indices

    def backward(ctx, grad_values):  # no parameter for the gradient of the indices
        return grad_values

    rule = SaveRule(name="Sort", expected=("output 1",), fix="save the indices")
    assert "one gradient per output of forward (2 here)" in failure(function(forward, backward), rule)


def test_forward_not_implemented():
    def forward(ctx, x):
        raise NotImplementedError()

    assert "not implemented yet" in failure(function(forward))


# --- observe, and check_saved in the grader ---------------------------------------------------

def remote(fn):
    return Remote("Fn", loopback({"Fn": fn}))


def in_place_exp(ctx, x):
    x.exp_()
    ctx.mark_dirty(x)
    ctx.save_for_backward(x)
    return x


def modifies_saved(ctx, g):
    (y,) = ctx.saved_tensors
    return g * y.add_(1)


def test_observe_copies_what_was_saved_before_backward_and_reports_backward():
    x = leaf(3)
    recording, backward = observe(function(saves_output, modifies_saved), (x,))
    assert [s.role for s in recording.saved] == ["output 0"]
    assert torch.equal(recording.saved[0].tensor, x.detach().exp())  # before backward added 1
    assert backward.error is None and backward.modified == [0] and not backward.modified_grad_output


def test_observe_on_non_leaf_copies_leaves_the_arguments_alone():
    x = leaf(3)
    before = x.detach().clone()
    recording, backward = observe(function(in_place_exp, exp_backward), (x,), copy=True)
    assert [s.role for s in recording.saved] == ["output 0"] and backward.error is None
    assert torch.equal(x.detach(), before) and torch.equal(recording.args[0], before.exp())


def test_observe_through_the_wire_sees_what_it_sees_here():
    def forward(ctx, x):
        values, indices = x.sort()
        ctx.save_for_backward(indices, x > 0)
        ctx.values = values
        return values, indices

    def seen(fn):
        recording, backward = observe(fn, (x,))
        saved = [(s.role, s.graph, s.nbytes) for s in recording.saved]
        return saved, {path: (s.role, s.graph) for path, s in recording.stashed.items()}, backward

    fn, x = function(forward, lambda ctx, g, gi: g), leaf(4)
    assert seen(remote(fn)) == seen(fn) == (
        [("output 1", False, 32), ("intermediate", False, 4)], {"values": ("output 0", True)}, Backward(),
    )


@pytest.mark.parametrize("forward, backward, rule", [
    (lambda ctx, x: (setattr(ctx, "y", x.exp()), ctx.y)[1], lambda ctx, g: g * ctx.y, RULE),
    (lambda ctx, x: (ctx.save_for_backward(e := x.exp()), e * 1)[1], exp_backward, RULE),
    (saves_output, modifies_saved, RULE),
    (in_place_exp, exp_backward, SaveRule(name="Exp_", expected=("input 0",), fix="save the input")),
], ids=["stashed output", "intermediate exp(x)", "backward modifies", "in place"])
def test_check_saved_gives_the_same_message_in_the_grader(forward, backward, rule):
    fn, x = function(forward, backward), leaf(3)
    local, there = (failure_with(f, rule, x) for f in (fn, remote(fn)))
    assert local == there


def failure_with(fn, rule, x) -> str:
    with pytest.raises(CheckFailed) as info:
        check_saved(fn, rule, (x,), copy=True)
    return str(info.value)


def test_a_rule_without_expected_roles_accepts_anything_saved_but_no_stash():
    def saves_a_mask(ctx, x):
        ctx.save_for_backward(x > 0, x)
        return x.relu()

    rule = SaveRule(name="ReLU", expected=None, fix="")
    check_saved(function(saves_a_mask, lambda ctx, g: g * ctx.saved_tensors[0]), rule, (leaf(3),))

    def stashes(ctx, x):
        ctx.x = x
        return x.relu()

    assert "is stashed on ctx" in failure(function(stashes, lambda ctx, g: g * (ctx.x > 0)), rule)

    def zeroes_grad_output(ctx, g):
        (mask, _) = ctx.saved_tensors
        g[~mask] = 0
        return g

    assert "backward modified grad_output in place" in failure(function(saves_a_mask, zeroes_grad_output), rule)


def test_backward_left_alone_is_public_for_other_checks():
    from autograder.checks.saved import check_backward_left_alone

    recording, backward = observe(function(saves_output, modifies_saved), (leaf(3),))
    with pytest.raises(CheckFailed, match="backward modified a saved tensor in place"):
        check_backward_left_alone("Exp", recording, backward, Names(args=["x"]))


# --- Memory kept alive outside ctx ---------------------------------------------------------

def sigmoid_backward(ctx, g):
    (y,) = ctx.saved_tensors
    return g * y * (1 - y)


def saving_sigmoid(keep=lambda x, y: None, name="Sigmoid"):
    """A Sigmoid that saves its output, as it should, and also hands `keep` what it likes."""

    def forward(ctx, x):
        y = torch.sigmoid(x)
        ctx.save_for_backward(y)
        keep(x, y)
        return y

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(sigmoid_backward),
    })


SIGMOID = SaveRule(name="Sigmoid", expected=("output 0",), fix="save the output")
ACTIVATIONS = []  # a module global, as a notebook's would be


def _class_attribute():
    fn = saving_sigmoid(lambda x, y: setattr(fn, "last", torch.exp(-x)))
    return fn


def _module_global():
    return saving_sigmoid(lambda x, y: ACTIVATIONS.append(y))


def _closure():
    seen = {}

    def keep(x, y):
        seen["x"] = x

    return saving_sigmoid(keep)


def _default_argument():
    def keep(x, y, memo=[]):  # noqa: B006  (the pattern under test)
        memo[:] = [x * 2]

    return saving_sigmoid(keep)


@pytest.mark.parametrize("make, when, what, where", [
    (_class_attribute, "after forward", "a tensor forward created", "the class attribute `Sigmoid.last`"),
    (_module_global, "after backward", "the output", "the global variable `ACTIVATIONS`"),
    (_closure, "after backward", "the input `x`",
     "the variable `seen` of `_closure`, which the functions it defines keep"),
    (_default_argument, "after forward", "a tensor forward created",
     "a default argument of `_default_argument.<locals>.keep`"),
], ids=["class attribute", "global", "closure", "default argument"])
def test_memory_kept_outside_ctx_is_found_and_named(make, when, what, where):
    fn = make()
    student = remote(fn) if make in (_module_global, _closure) else fn  # the same through the wire
    message = failure(student, SIGMOID)
    assert f"{what} (float64 of shape (3,), 24 bytes) is still alive, kept by {where}" in message
    assert message.startswith(f"Sigmoid: {when}, ")
    assert "Keep what backward needs with `ctx.save_for_backward(...)`, and no tensor anywhere else" in message
    ACTIVATIONS.clear()


def test_a_cache_filled_once_is_no_leak():
    cache = {}

    def keep_once(x, y):
        cache.setdefault("ones", torch.ones(3))

    check_saved(saving_sigmoid(keep_once), SIGMOID, (leaf(3),))
    assert list(cache) == ["ones"]


def test_a_stashed_output_is_judged_as_a_stash_and_its_cycle_is_no_leak():
    recording, backward = observe(function(lambda ctx, x: (setattr(ctx, "y", x.exp()), ctx.y)[1],
                                           lambda ctx, g: g * ctx.y), (leaf(3),))
    assert list(recording.stashed) == ["y"] and recording.kept == [] and backward.kept == []


def test_show_saved_lists_memory_kept_elsewhere(capsys):
    fn = _class_attribute()
    show_saved(fn, leaf(3))
    assert "kept alive elsewhere, invisible to autograd: float64 of shape (3,), 24 bytes, by the class attribute " \
           "`Sigmoid.last`" in capsys.readouterr().out
