"""Checks for notebook 06_views_and_inplace."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..checks import explain, inputs
from ..checks.functions import FunctionSpec, check_function
from ..checks.saved import SaveRule, check_saved
from ..student import devices, probe, views_and_inplace
from ..student.report import fail, folded, passed, quiet, show
from ..student.saved import Names
from ..student.views_and_inplace import expression, view_of

# --- Exercise: diagnose three version-counter errors ---------------------------------------

DIAGNOSIS_CHOICES = ("L1", "L2", "L3", "L4", "L5", "L6")
DIAGNOSIS_QUESTIONS = ("a_saved", "a_modified", "b_saved", "b_modified", "c_saved", "c_modified")

# --- Exercise: grad modes, inference tensors and hooks -------------------------------------

WHAT_HAPPENS_CHOICES = ("works", "error", "silently wrong")


# --- Exercise: Softmax_, in place, on views ------------------------------------------------

@dataclass(frozen=True)
class View:
    """x = the view `recipe` describes (views_and_inplace.view_of) of a base of `shape`."""

    shape: tuple[int, ...]
    recipe: tuple[tuple[Any, ...], ...] = ()

    @property
    def words(self) -> str:
        return f"x = {expression(self.recipe)}, base of shape {self.shape}" if self.recipe else \
            f"x of shape {self.shape}, not a view"


PLAIN = View((4, 5))
VIEWS = (
    View((4, 5), (("slice", 0, 1, 4, 1),)),  # rows: contiguous, at an offset
    View((4, 5), (("slice", 1, 1, 5, 1),)),  # columns: not contiguous
    View((4, 5), (("transpose", 0, 1),)),  # softmax runs along the base's columns
)
GRADIENT_VIEWS = VIEWS[1:]
LEAF_VIEW = View((4, 5), (("slice", 0, 1, 3, 1),))  # of a leaf that requires grad
EXPANDED = View((1, 5), (("expand", 4, 5),))  # one row in memory, seen four times


def softmax_in_view(x: torch.Tensor, recipe: Sequence[Sequence[Any]]) -> torch.Tensor:
    """A copy of x whose view `recipe` holds the softmax of its values (over its last dim):
    what the base holds after Softmax_ on that view (differentiable, out of place)."""
    base = x.clone()
    part = view_of(base, recipe)
    part.copy_(torch.softmax(part, -1))
    return base


SOFTMAX_SAVES = SaveRule(
    name="Softmax_",
    expected=("output 0",),
    fix="save x after writing softmax into it: its memory now holds the output y, and the gradient "
        "y ⊙ (g − Σ g ⊙ y) needs nothing else",
    names=Names(known={"x.clone()": lambda x: x, "softmax(x), but not x itself,": lambda x: torch.softmax(x, -1)}),
    reasons={
        "intermediate": "an in-place Function exists to save the memory of a new output, and a second tensor "
        "undoes that; the gradient needs only the output, which x's memory now holds.",
    },
)

BY_COPY = ("the base did not change where x is: forward wrote into a copy of x, not into x. `x.reshape(...)`, "
           "`x.contiguous()` and `x.flatten()` copy a view that is not contiguous (a column slice, a transpose), "
           "and the copy's memory is not the base's. Write into x itself (`x.copy_(...)`, or in-place operations "
           "on x), which works for any layout.")
VERSION = ("autograd's version counter did not see the write: a tensor saved from x's memory before the call (by "
           "any operation of the graph) now holds other values, yet its backward cannot tell and gives a silently "
           "wrong gradient. `.data` has a version counter of its own; write into x itself (or `x.detach()`, which "
           "shares x's counter) and call `ctx.mark_dirty(x)`.")
MARK_DIRTY = ("without `ctx.mark_dirty(x)` autograd does not know that forward wrote into x. Here x is a view of a "
              "leaf that requires grad, whose values forward overwrote without an error; for a view of a non-leaf, "
              "the base keeps its old place in the graph and every gradient through it is silently wrong. Call "
              "`ctx.mark_dirty(x)` and return x itself: autograd then refuses a leaf, and rewrites a base's history "
              "(CopySlices) otherwise.")
ELSEWHERE = ("forward wrote somewhere else than x's memory: into a copy (`x.contiguous()` or `x.reshape(...)` copy a "
             "tensor they cannot lay out as asked), or into new memory (`x.data = ...`, `x.set_(...)`). Torch's "
             "in-place operations refuse an expanded tensor, whose positions share one memory location; write into "
             "x itself (`x.copy_(...)`, in-place operations on x), and the refusal comes by itself.")


def _report(student: Any, view: View, values: torch.Tensor, leaf: bool = False) -> dict[str, Any]:
    """in_place_report of the student's Function on `view` of a base holding `values`, checked for form."""
    with quiet():
        found = probe.invoke(views_and_inplace.in_place_report, student, values, [list(s) for s in view.recipe], leaf)
    try:
        error = probe.ProbeError.from_data(found["error"])
        report = {"error": error, "changed": bool(found["changed"])}
        if error is None:
            after = found["after"]
            if not isinstance(after, torch.Tensor) or tuple(after.shape) != tuple(values.shape):
                raise TypeError("after")
            report.update(after=after.to(values.device), version=int(found["version"]),
                          grad_fn=found["grad_fn"] if isinstance(found["grad_fn"], str) else None,
                          returned=str(found["returned"])[:80],
                          witness=None if found["witness"] is None else str(found["witness"])[:400])
    except (KeyError, TypeError, ValueError) as bad:
        raise probe.Malformed(f"malformed in-place report: {bad}") from None
    return report


def _fail_error(error: probe.ProbeError, view: View) -> None:
    __tracebackhide__ = True
    what, cause = explain.error("forward", error.type, error.message, ["x"])
    if "marked as dirty" in error.message:
        cause = ("a tensor passed to ctx.mark_dirty must be returned: return x itself, not a new tensor or "
                 "another view of it.")
    elif "view size is not compatible" in error.message:
        cause = ("`.view` needs a layout it can reinterpret, and x may be a slice or a transpose of its base. "
                 "Compute along the last dim directly (`x.amax(-1, keepdim=True)`, ...), or write a result into x "
                 "with `x.copy_(...)`.")
    fail(f"Softmax_: {what}.", view.words, cause=cause)


# Rows of the non-leaf x the check starts with: large magnitudes, where exp overflows float64.
LARGE = (800.0, -800.0, 0.0, 1000.0, -1000.0)
OVERFLOW = ("exp overflows float64 beyond 709.78, and inf / inf is nan, although softmax is finite everywhere: "
            "subtract each row's maximum (along the last dim, kept as a dim) before exponentiating.")


def _check_plain(student: Any, values: torch.Tensor) -> None:
    """Applied to a non-leaf x: in place, the right values (large ones too), seen by the version counter."""
    __tracebackhide__ = True
    report = _report(student, PLAIN, values)
    if report["error"] is not None:
        _fail_error(report["error"], PLAIN)
    want = torch.softmax(values, -1)
    shown = [PLAIN.words, f"x = {show(values)}"]
    if not report["changed"]:
        fail("Softmax_ did not modify its input: x still holds its old values.", *shown,
             cause="write the softmax into x's own memory and return x: an in-place Function saves the memory "
                   "of a new output, which is its point.")
    if not torch.allclose(report["after"], want, rtol=1e-6, atol=1e-9):
        fail("Softmax_ wrote wrong values into x.", *shown, f"expected {show(want)}",
             f"actual   {show(report['after'])}",
             cause=_values_cause(values, report["after"]))
    if report["witness"] != "version error":
        fail(f"Softmax_: after the call, x's version counter moved by {report['version']}, and a tensor saved from x "
             f"before the call gave {report['witness']} in backward instead of the version error.", *shown,
             cause=VERSION)


def _values_cause(values: torch.Tensor, after: torch.Tensor) -> str | None:
    """Why `after` is not the softmax of `values` over the last dim, where that can be told."""
    if bool(torch.isnan(after).any()):
        return OVERFLOW
    for dim in range(values.dim() - 1):
        if torch.allclose(after, torch.softmax(values, dim), rtol=1e-6, atol=1e-9):
            return (f"softmax over dim {dim}, not over the last dim: use `dim=-1`, which is the last dim for any "
                    "number of dims (and for a transposed view, the base's first).")
    return None


def _check_refused(student: Any, values: torch.Tensor, expanded: torch.Tensor) -> None:
    """A view of a leaf that requires grad, and an expanded view, are refused with an error."""
    __tracebackhide__ = True
    report = _report(student, LEAF_VIEW, values, leaf=True)
    shown = f"{LEAF_VIEW.words}, the base a leaf that requires grad"
    if report["error"] is None:
        overwritten = " and silently overwrote the leaf's values" if report["changed"] else ""
        fail(f"Softmax_ accepted a view of a leaf that requires grad{overwritten}.", shown, cause=MARK_DIRTY)
    if "leaf" not in report["error"].message:
        _fail_error(report["error"], LEAF_VIEW)
    report = _report(student, EXPANDED, expanded)
    if report["error"] is None:
        still = "" if report["changed"] else ", and the base still holds its old values"
        fail(f"Softmax_ accepted an expanded x without an error{still}.", EXPANDED.words + " (one row in memory)",
             cause=ELSEWHERE)


def _check_views(student: Any, views: Sequence[View], generator: torch.Generator, device: str) -> None:
    """On each view of a non-leaf base: the base holds softmax inside the view, its old values elsewhere."""
    __tracebackhide__ = True
    for view in views:
        values = inputs.normal(view.shape, generator).to(device)
        report = _report(student, view, values)
        if report["error"] is not None:
            _fail_error(report["error"], view)
        want = softmax_in_view(values, view.recipe)
        after = report["after"]
        if torch.allclose(after, want, rtol=1e-6, atol=1e-9):
            continue
        inside = view_of(torch.zeros(view.shape, dtype=torch.bool, device=device), view.recipe)
        inside.fill_(True)
        region = inside._base if inside._base is not None else inside
        outside = ~region & ~torch.isclose(after, values)
        unchanged = torch.equal(after[region], values[region])
        cause = (BY_COPY if unchanged else
                 "forward changed the base outside x: write only into x." if bool(outside.any()) else
                 _values_cause(view_of(values, view.recipe), view_of(after, view.recipe)))
        fail(f"Softmax_ on {expression(view.recipe)}: the base holds wrong values afterwards.", view.words,
             f"expected {show(want)}", f"actual   {show(after)}", cause=cause)


def _gradient_hint(args: tuple, i: int, wrong: torch.Tensor) -> str:
    return ("inside the view the gradient is y ⊙ (g − Σ_j g_j y_j) along its last dim (outside it, g itself): "
            "every entry of a row depends on the whole row through the sum, kept as a dim so that it broadcasts "
            "along the row.")


class _OnAView(probe.StudentProxy):
    """The student's in-place Function applied to a view of a copy of its argument, the whole
    base coming out: every probe of it runs through `on_a_view`, where the Function is."""

    def __init__(self, function: Any, recipe: Sequence[Sequence[Any]]) -> None:
        self.function, self.recipe = function, [list(step) for step in recipe]

    def invoke(self, procedure: str, *args: Any) -> Any:
        return probe.invoke(views_and_inplace.on_a_view, self.function, self.recipe, procedure, *args)


def check_softmax_(student: type[torch.autograd.Function], *, views: Sequence[View] = VIEWS,
                   gradients: Sequence[View] = GRADIENT_VIEWS, seed: int | None = 0) -> None:
    """Softmax_(x): softmax over the last dim computed in place in x's memory, declared with
    ctx.mark_dirty, saving only its output: right when x is a view of a larger base."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    for device in devices.available():
        _check_plain(student, inputs.including(inputs.normal(PLAIN.shape, generator), LARGE, generator).to(device))
    passed("Softmax_ writes softmax into x's own memory (finite at |x| = 800 and 1000) and tells autograd "
           "(ctx.mark_dirty): a tensor saved from x before the call fails the version check afterwards.")
    _check_refused(student, inputs.normal(LEAF_VIEW.shape, generator), inputs.normal(EXPANDED.shape, generator))
    passed("Softmax_ refuses, with an error, a view of a leaf that requires grad and an expanded view.")
    for device in devices.available():
        _check_views(student, views, generator, device)
    passed(f"Softmax_ on {', '.join(expression(v.recipe) for v in views)}: the base holds softmax inside the "
           "view and its old values elsewhere.")
    for device in devices.available():
        for _ in range(2):
            recording = check_saved(student, SOFTMAX_SAVES, devices.prepare((inputs.normal(PLAIN.shape, generator),),
                                                                            device), copy=True)
    x = recording.args[0]
    passed(f"Softmax_ saves exactly its output, the input's own memory ({recording.nbytes} bytes for x of shape "
           f"{tuple(x.shape)}), nothing on ctx.")
    for k, view in enumerate(gradients):
        spec = FunctionSpec(
            name=f"Softmax_ on {expression(view.recipe)} (the whole base)",
            reference=lambda x, recipe=view.recipe: softmax_in_view(x, recipe),
            cases=lambda g, shape=view.shape: [(inputs.normal(shape, g),)],
            double_backward=True,
            hint=_gradient_hint,
        )
        # Softmax_'s mistakes do not depend on the view: every known one fails on the first, so
        # the others' lines are folded into a note each.
        with folded(f"on {expression(view.recipe)}") if k else contextlib.nullcontext():
            check_function(_OnAView(student, view.recipe), spec, seed=seed)


# --- Exercise: a training step that corrupts a saved tensor ---------------------------------

@dataclass(frozen=True)
class StepCase:
    """A two-layer network: x (n, d_in) @ w1 (d_in, hidden), sigmoid, dropout (mask), @ w2 (hidden, d_out)."""

    n: int = 6
    d_in: int = 4
    hidden: int = 5
    d_out: int = 2
    lr: float = 0.5
    steps: int = 2


def _draw(case: StepCase, generator: torch.Generator) -> dict[str, Any]:
    normal = inputs.normal
    keep = torch.rand((case.n, case.hidden), generator=generator, dtype=torch.float64) < 0.5
    return {
        "weights": [normal((case.d_in, case.hidden), generator), 1.5 * normal((case.hidden, case.d_out), generator)],
        "x": normal((case.n, case.d_in), generator),
        "target": normal((case.n, case.d_out), generator),
        "mask": keep.to(torch.float64) * 2,  # dropout with p = 1/2: dropped units 0, kept ones doubled
        "lr": case.lr,
    }


def _loss(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
          mask: torch.Tensor) -> torch.Tensor:
    return ((torch.sigmoid(x @ w1).mul(mask) @ w2 - target).pow(2)).mean()


def _right_steps(data: dict[str, Any], steps: int) -> tuple[list[float], list[list[torch.Tensor]]]:
    """The losses and the weights after each step: the exact gradient of the loss (autograd's),
    the update, then w2 clamped to [-1, 1]."""
    w1, w2 = (w.clone() for w in data["weights"])
    losses, after = [], []
    for _ in range(steps):
        leaves = [w1.requires_grad_(), w2.requires_grad_()]
        loss = _loss(*leaves, data["x"], data["target"], data["mask"])
        g1, g2 = torch.autograd.grad(loss, leaves)
        losses.append(loss.item())
        w1, w2 = (w1 - data["lr"] * g1).detach(), (w2 - data["lr"] * g2).clamp(-1.0, 1.0).detach()
        after.append([w1, w2])
    return losses, after


@dataclass(frozen=True)
class Mistake:
    """A wrong step, as the formulas of its gradient (what `_mistaken_steps` computes)."""

    cause: str
    saved: str = "plain"  # what the sigmoid's backward reads: its output ("plain") or the masked one
    mask_in_graph: bool = True  # the gradient flows through the dropout's multiplication
    w2_read: str = "plain"  # the w2 the backward of `h @ w2` reads: as in forward, or already clamped
    clamp: str = "after"  # where w2 is clamped: "after" the update, "before" it, "none", or in "forward"
    accumulate: bool = False  # the gradients are never reset


DROPOUT_BY_DATA = (
    "the dropout is still written through `.data`: h's version counter missed it, so the sigmoid's backward "
    "reads the dropped-out h, and the mask is not in the graph. Make the dropout out of place (a new tensor): "
    "the graph then holds it.")
CLAMP_EARLY = (
    "w2 is clamped between forward and backward: `h @ w2` saved w2 for h's gradient, and the clamp through "
    "`.data` changed it unseen, so w1's gradient is computed with another w2 than the loss used. Clamp after "
    "the update, as the goal says.")
MISTAKES = (
    Mistake(f"both silent corruptions are still there. First, {DROPOUT_BY_DATA} Second, {CLAMP_EARLY}",
            saved="masked", mask_in_graph=False, w2_read="clamped", clamp="before"),
    Mistake(DROPOUT_BY_DATA, saved="masked", mask_in_graph=False),
    Mistake(CLAMP_EARLY, w2_read="clamped", clamp="before"),
    Mistake("w2 is clamped after backward but before the update: the update must start from the w2 the loss "
            "used. Clamp after the update, as the goal says.", clamp="before"),
    Mistake("the mask multiplies h's values but is not in the graph (a `.data` assignment, or a change autograd "
            "was told to ignore): the gradient reaching the sigmoid misses the mask's factor. Compute the dropout "
            "with a tensor operation autograd records.", mask_in_graph=False),
    Mistake("w2 is not clamped to [-1, 1] after the update (an out-of-place `clamp` whose result is dropped does "
            "nothing).", clamp="none"),
    Mistake("w2 is clamped before the forward uses it: that changes the loss. Clamp after the update.",
            clamp="forward"),
    Mistake("the gradients are never reset: the second step adds the first step's gradient to its own. Set "
            "`p.grad = None` (or zero it) after each update.", accumulate=True),
)
UNCHANGED = ("the weights in `params` did not change: update the tensors themselves, in place under torch.no_grad() "
             "(`p -= lr * p.grad`, `p.sub_(...)`); `w1 = w1 - lr * w1.grad` only gives the name w1 to a new tensor, "
             "and the optimizer's tensors stay as they were.")


def _mistaken_steps(data: dict[str, Any], steps: int, m: Mistake) -> tuple[list[float], list[list[torch.Tensor]]]:
    """What a step with mistake `m` gives, written out with the chain rule."""
    w1, w2 = (w.clone() for w in data["weights"])
    x, target, mask, lr = data["x"], data["target"], data["mask"], data["lr"]
    total = [torch.zeros_like(w1), torch.zeros_like(w2)]
    losses, after = [], []
    for _ in range(steps):
        used = w2.clamp(-1.0, 1.0) if m.clamp == "forward" else w2
        s = torch.sigmoid(x @ w1)
        out = (s * mask) @ used
        losses.append(float(((out - target) ** 2).mean()))
        g = 2 * (out - target) / out.numel()
        grad_w2 = (s * mask).T @ g
        if m.clamp == "forward":
            grad_w2 = grad_w2 * (w2.abs() <= 1)
        grad_h = g @ (used.clamp(-1.0, 1.0) if m.w2_read == "clamped" else used).T
        read = s * mask if m.saved == "masked" else s
        grad_w1 = x.T @ ((grad_h * mask if m.mask_in_graph else grad_h) * read * (1 - read))
        total = [total[0] + grad_w1, total[1] + grad_w2] if m.accumulate else [grad_w1, grad_w2]
        start = w2.clamp(-1.0, 1.0) if m.clamp == "before" else w2
        w1, w2 = w1 - lr * total[0], start - lr * total[1]
        w2 = w2.clamp(-1.0, 1.0) if m.clamp == "after" else w2
        after.append([w1, w2])
    return losses, after


STEP_ERRORS = {
    "modified by an inplace operation": (
        "an in-place change to a tensor a backward needs: the sigmoid's backward reads its output h, and `h.mul_`, "
        "even through `h.detach()` or under `torch.no_grad()`, moves h's version counter, so backward refuses. "
        "Make the dropout out of place: a new tensor, recorded in the graph."),
    "leaf Variable that requires grad": (
        "the weights are leaves that require grad: update them in place under `torch.no_grad()`, as an optimizer "
        "does, and clamp there too."),
    "NoneType": (
        "a weight has no gradient (`p.grad` is None): the graph from it to the loss is cut (`.detach()`, "
        "`torch.no_grad()` around the forward), or the gradients were reset before the update."),
    "does not require grad": (
        "the loss has no graph: the forward ran without recording (`torch.no_grad()`, `.detach()`)."),
}


def check_train_step(train_step: Any, *, case: StepCase = StepCase(), seed: int | None = 0) -> None:
    """train_step(params, x, target, mask, lr): one SGD step of the two-layer network with
    dropout, w2 clamped to [-1, 1] after the update; returns the loss as a float."""
    __tracebackhide__ = True
    data = _draw(case, inputs.generator(seed))
    shown = (f"x of shape {tuple(data['x'].shape)}, w1 {tuple(data['weights'][0].shape)}, w2 "
             f"{tuple(data['weights'][1].shape)}, lr = {case.lr}, {case.steps} steps")
    with quiet():
        found = probe.invoke(views_and_inplace.training_report, train_step, data["weights"], data["x"],
                             data["target"], data["mask"], data["lr"], case.steps)
    try:
        error = probe.ProbeError.from_data(found["error"])
        losses, after = list(found["losses"]), [list(ws) for ws in found["after"]]
        if not all(len(ws) == 2 and all(isinstance(w, torch.Tensor) for w in ws) for ws in after):
            raise TypeError("weights")
    except (KeyError, TypeError) as bad:
        raise probe.Malformed(f"malformed training report: {bad}") from None
    if error is not None:
        what, cause = explain.error(error.stage, error.type, error.message, [])
        fail(f"train_step: {what}.", shown,
             cause=next((c for key, c in STEP_ERRORS.items() if key in error.message), cause))
    want_losses, want_after = _right_steps(data, case.steps)
    if len(losses) != case.steps:
        raise probe.Malformed("malformed training report: steps")
    for k in range(case.steps):
        got, want = losses[k], want_losses[k]
        if not isinstance(got, float):
            fail(f"train_step returned a {got}, not the loss as a float.", shown, cause="return `loss.item()`.")
        if abs(got - want) > 1e-9 * max(1.0, abs(want)):
            fail(f"train_step: step {k + 1} returned the loss {got:.6g}, expected {want:.6g}.", shown,
                 cause=_mistake(data, case.steps, losses, after))
        for name, before, now, right in zip(("w1", "w2"), after[k - 1] if k else data["weights"], after[k],
                                            want_after[k]):
            if now.shape != right.shape or not torch.allclose(now, right, rtol=1e-7, atol=1e-10):
                fail(f"train_step: after step {k + 1}, {name} is not {name} − lr · (the gradient of the loss it "
                     f"computed){', clamped to [-1, 1]' if name == 'w2' else ''}.", shown,
                     f"expected {show(right)}", f"actual   {show(now)}",
                     cause=UNCHANGED if torch.equal(now, before) else _mistake(data, case.steps, losses, after))
    passed(f"train_step: over {case.steps} steps the losses and the updated weights are those of the exact "
           "gradient of the loss, dropout included; w2 is clamped after the update.")


def _mistake(data: dict[str, Any], steps: int, losses: list, after: list) -> str | None:
    """The cause of the first known mistake whose steps give what the student's did."""
    for m in MISTAKES:
        want_losses, want_after = _mistaken_steps(data, steps, m)
        same = all(isinstance(a, float) and abs(a - b) <= 1e-9 * max(1.0, abs(b)) for a, b in zip(losses, want_losses))
        if same and all(g.shape == w.shape and torch.allclose(g, w, rtol=1e-7, atol=1e-10)
                        for gs, ws in zip(after, want_after) for g, w in zip(gs, ws)):
            return m.cause
    return None
