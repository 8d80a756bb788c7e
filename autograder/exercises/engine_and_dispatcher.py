"""Checks for notebook 07_engine_and_dispatcher: the engine's order predicted from a graph's
structure, hooks that clip gradients and step parameters inside backward, a dispatch mode
that measures the memory a backward allocates, and the quiz.

Every verdict compares what the student's process reports with what the grader measures in
its own process on the same graph (built from plain data by `student.engine_and_dispatcher`):
the engine's order recorded with pre-hooks, gradients from `torch.autograd.grad`, memory
from the course's own meter. That meter, and the one 08 uses, are in the student package (the
checks run in the student's process too): a meter that is or builds on a class of the course
fails 7.9, observed in the student's process (best effort; a copy of their code is not seen).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..checks import explain, inputs
from ..student import devices, probe
from ..student import engine_and_dispatcher as graphs
from ..student.memory import PeakMemory
from ..student.report import fail, note, passed, quiet, show

AG = "AccumulateGrad"


def _error_line(error: probe.ProbeError) -> str:
    first = error.message.strip().splitlines()[0] if error.message.strip() else ""
    return f"{error.type}: {first}" if first else error.type


def _raised(what: str, error: probe.ProbeError, *details: str) -> None:
    __tracebackhide__ = True
    fail(f"{what} raised {_error_line(error)}", *details,
         cause=explain.NOT_IMPLEMENTED if error.type == "NotImplementedError" else None)


# --- 7.6: the engine's order ---------------------------------------------------------------

# Graphs the visible check uses, beside random ones: (description, program).
PROGRAMS: list[tuple[str, list[list[Any]]]] = [
    ("a chain: sum(exp(sin(x)))", [["leaf", 1], ["sin", 0], ["exp", 1], ["sum", 2]]),
    ("a diamond: x feeds sin and exp, which are added", [["leaf", 1], ["sin", 0], ["exp", 0], ["add", 1, 2],
                                                         ["sum", 3]]),
    ("two leaves, one of them used twice", [["leaf", 1], ["leaf", 1], ["mul", 0, 1], ["tanh", 2], ["mul", 3, 0],
                                            ["sum", 4]]),
    ("x * x (two edges to one node), a constant, and a custom Function",
     [["leaf", 1], ["leaf", 0], ["square", 0], ["twice", 2], ["add", 3, 1], ["sum", 4]]),
    ("unbind: one node with two outputs, used in the opposite order",
     [["leaf", 1], ["exp", 0], ["unbind", 1], ["sin", 3], ["mul", 4, 2], ["neg", 0], ["sum", 6], ["add", 5, 7]]),
]


def random_program(generator: torch.Generator, leaves: int, steps: int) -> list[list[Any]]:
    """A random graph: leaves (most of them requiring grad), `steps` random operations on
    earlier values, then every value no operation used, summed into the root."""

    def pick(n: int) -> int:
        return int(torch.randint(n, (), generator=generator))

    program: list[list[Any]] = [["leaf", 1]] + [["leaf", int(pick(5) > 0)] for _ in range(leaves - 1)]
    vector = [True] * leaves  # each value's shape: (2,) or ()
    grad = [bool(step[1]) for step in program]
    unary, binary = sorted(graphs.UNARY), sorted(graphs.BINARY)
    for _ in range(steps):
        kind = pick(10)
        if kind < 4:
            op, i = unary[pick(len(unary))], pick(len(vector))
            program.append([op, i])
            vector.append(vector[i] and op != "sum")
            grad.append(grad[i])
        elif kind < 9 or not any(vector):
            i, j = pick(len(vector)), pick(len(vector))
            program.append([binary[pick(len(binary))], i, j])
            vector.append(vector[i] or vector[j])
            grad.append(grad[i] or grad[j])
        else:
            i = [k for k, v in enumerate(vector) if v][pick(sum(vector))]
            program.append(["unbind", i])
            vector += [False, False]
            grad += [grad[i], grad[i]]
    used = {i for step in program[leaves:] for i in step[1:]}
    sinks = [i for i in range(len(vector)) if i not in used and grad[i]]
    total = None
    for i in sinks:
        if vector[i]:
            program.append(["sum", i])
            i = len(vector)
            vector.append(False)
        if total is not None:
            program.append(["add", total, i])
            vector.append(False)
            i = len(vector) - 1
        total = i
    return program


@dataclass
class _Truth:
    """What the grader measures on a program's graph, by label: the order the engine ran the
    nodes in, each node's sequence number, whether it is an AccumulateGrad, and the nodes
    that send it a gradient."""

    order: list[str]
    sequence: dict[str, int]
    leaf: dict[str, bool]
    senders: dict[str, set[str]]


def _truth(program: list[list[Any]]) -> _Truth:
    built = graphs.build(program)
    senders: dict[str, set[str]] = {label: set() for label in built.labels.values()}
    for node, label in built.labels.items():
        for nxt, _ in node.next_functions:
            if nxt is not None:
                senders[built.labels[nxt]].add(label)
    sequence = {label: node._sequence_nr() for node, label in built.labels.items()}
    leaf = {label: label.startswith(AG) for label in built.labels.values()}
    order = [built.labels[n] for n in graphs.recorded_order(built.root)]
    return _Truth(order, sequence, leaf, senders)


def _groups(truth: _Truth) -> list[set[str]]:
    """The engine's order as groups: a node alone, or the AccumulateGrads that one node made
    ready at once (the engine runs those in an order of its own: any order is right)."""
    groups: list[set[str]] = []
    for k, label in enumerate(truth.order):
        if truth.leaf[label] and k and truth.leaf[truth.order[k - 1]]:
            groups[-1].add(label)
        else:
            groups.append({label})
    return groups


SCHEDULE = ("the engine counts, for every node, the nodes that send it a gradient; a node is ready when all of "
            "them have run, and of the ready nodes it runs the one with the highest sequence number "
            "(`node._sequence_nr()`: created last in forward). An AccumulateGrad's is the largest there is, so it "
            "runs as soon as it is ready.")


def _judge_order(name: str, truth: _Truth, found: dict[str, Any]) -> None:
    __tracebackhide__ = True
    order = found["order"]
    shown = [f"graph: {name}", f"the engine ran {show(len(truth.order))} nodes"]
    if found["error"] is not None:
        _raised("engine_order", probe.ProbeError(**found["error"]), *shown)
    if found["ran"]:
        fail("engine_order ran the graph's backward (a node of the graph ran while it predicted).", *shown,
             cause="predict the order from the graph's structure (next_functions, sequence numbers) without "
                   "running it: the check measures the engine's order on a copy of its own.")
    if found["type"] not in ("list", "tuple"):
        fail(f"engine_order must return a list of nodes; it returned a {found['type']}.", *shown)
    done: list[str] = []
    position = 0
    for group in _groups(truth):
        for _ in range(len(group)):
            if position >= len(order):
                missing = [label for label in truth.order if label not in done]
                cause = (f"every AccumulateGrad is a node the engine runs (one per leaf that requires grad). "
                         f"{SCHEDULE}") if all(truth.leaf[m] for m in missing) else \
                    "every node reachable from the root through next_functions runs once."
                fail(f"engine_order's answer stops after {show(len(order))} nodes.", *shown,
                     f"not in your order: {', '.join(missing[:6])}" + (" ..." if len(missing) > 6 else ""),
                     cause=cause)
            label = order[position]
            if label not in group:
                _wrong_at(position, label, group, done, truth, shown)
            group = group - {label}
            done.append(label)
            position += 1
    if position < len(order):
        extra = order[position]
        fail(f"engine_order lists {show(len(order))} entries; the engine ran {show(len(truth.order))} nodes.",
             *shown, f"entry {position} is {extra}, after every node has run",
             cause="a node runs once, however many paths lead to it." if extra in done else None)


def _wrong_at(position: int, label: str, group: set[str], done: list[str], truth: _Truth, shown: list[str]) -> None:
    __tracebackhide__ = True
    expected = " or ".join(sorted(group))
    summary = f"engine_order: at position {position} you predict {label}; the engine runs {expected} there."
    if label.startswith("not a node"):
        fail(summary, *shown, cause="return the Node objects themselves (grad_fn and the first item of each "
                                    "next_functions pair), not names; a (None, 0) pair is no node.")
    if label.startswith("a node outside"):
        fail(summary, *shown, cause="return nodes of the graph you were given (reached from the root through "
                                    "next_functions), not new ones.")
    if label in done:
        fail(summary, *shown, f"{label} is already at an earlier position",
             cause="a node runs once, when the gradients from all the nodes that send it one have arrived "
                   "(the engine adds them up first), however many paths lead to it.")
    waiting = sorted(truth.senders[label] - set(done))
    if waiting:
        fail(summary, *shown, f"{label} receives a gradient from {waiting[0]}, which has not run yet",
             cause=f"a node runs only once every node that sends it a gradient has run: {SCHEDULE}")
    (first,) = sorted(group)[:1]
    if truth.leaf[first]:
        fail(summary, *shown, f"{first} is ready: every node that sends it a gradient has run",
             cause=f"an AccumulateGrad runs as soon as it is ready: its sequence number is 2**64 - 1, higher than "
                   f"any other node's. {SCHEDULE}")
    fail(summary, *shown, f"both are ready; {first} was created after {label} in forward (its sequence number is "
                          "higher)", cause=f"the engine does not run ready nodes first come, first served: {SCHEDULE}")


def check_engine_order(engine_order: Any, *, programs: Sequence[tuple[str, list[list[Any]]]] = PROGRAMS,
                       random: int = 4, steps: int = 10, seed: int | None = 0) -> None:
    """engine_order(root) lists the nodes in the order the engine runs them, predicted from
    the graph's structure: on `programs` and on `random` random graphs of `steps` operations."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    cases = list(programs) + [(f"random graph {k + 1} ({steps} operations, hidden from you)",
                               random_program(generator, 1 + int(torch.randint(4, (), generator=generator)), steps))
                              for k in range(random)]
    with quiet():
        for name, program in cases:
            truth = _truth(program)
            found = probe.invoke(graphs.predicted_order, engine_order, program)
            _judge_order(name, truth, _order_report(found))
    passed(f"engine_order: the engine's order on {len(cases)} graphs ({len(programs)} named, {random} random), "
           "predicted without running them.")


def _order_report(found: Any) -> dict[str, Any]:
    try:
        report = {"order": [str(x)[:200] for x in found["order"][: graphs.LONGEST]], "type": str(found["type"])[:100],
                  "ran": bool(found["ran"]), "error": found["error"]}
        probe.ProbeError.from_data(report["error"])
    except (KeyError, TypeError) as bad:
        raise probe.Malformed(f"malformed prediction: {bad}") from None
    return report


# --- 7.7 and 7.8: hooks on the parameters of a model --------------------------------------

PARAMETERS = ("w", "c", "v", "dead")


@dataclass
class _Setting:
    params: list[torch.Tensor]
    grads: list[torch.Tensor | None]  # each parameter's .grad before the first backward
    inputs: list[torch.Tensor]  # one x per backward


def _setting(generator: torch.Generator, batches: int, earlier: bool) -> _Setting:
    """Parameters of `graphs.model`, its inputs, and (with `earlier`) gradients left in .grad
    by earlier micro-batches, for w, c and dead."""
    w = inputs.normal((3, 3), generator)
    c = inputs.normal((4, 3), generator) / 4  # small inputs of tanh and a large v: c's gradient is the largest,
    v = inputs.normal((3,), generator) * 3  # so clipping it changes the tensor x @ w + c shares with x and w
    dead = inputs.normal((2,), generator)
    params = [w, c, v, dead]
    grads = [inputs.normal(tuple(p.shape), generator) if earlier and name != "v" else None
             for p, name in zip(params, PARAMETERS)]
    return _Setting(params, grads, [inputs.normal((4, 3), generator) / 4 for _ in range(batches)])


def _raw(setting: _Setting, x: torch.Tensor, device: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The gradients one backward of the model brings to each parameter, and to x."""
    leaves = [p.detach().to(device).clone().requires_grad_() for p in setting.params]
    x = x.detach().to(device).clone().requires_grad_()
    *grads, gx = torch.autograd.grad(graphs.model(x, *leaves), [*leaves, x])
    return [g.cpu() for g in grads], gx.cpu()


def _clipped(g: torch.Tensor, max_norm: float) -> torch.Tensor:
    norm = float(g.norm())
    return g * (max_norm / norm) if norm > max_norm else g


def _plus(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else a + b


def _hook_report(found: Any, n: int, batches: int) -> dict[str, Any]:
    """What hooks_run reported, checked for its form: n parameters' values and gradients
    (unless an error stopped it), a gradient of x per backward."""
    try:
        report = dict(found)
        probe.ProbeError.from_data(report["error"])
        lengths = {"input_grads": batches, "params": n, "grads": n, "params_after": n, "grads_after": n}
        for key, length in lengths.items():
            values = report[key]
            if not isinstance(values, list) or not all(v is None or isinstance(v, torch.Tensor) for v in values) or (
                    report["error"] is None and len(values) != length):
                raise TypeError(key)
        if not isinstance(report["changed"], list):
            raise TypeError("changed")
    except (KeyError, TypeError) as bad:
        raise probe.Malformed(f"malformed hook run: {bad}") from None
    return report


def _close(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=1e-9, atol=1e-12))


def _run_hooks(student: Any, setting: _Setting, value: float, device: str, what: str, shown: list[str]) -> dict:
    __tracebackhide__ = True
    found = _hook_report(probe.invoke(graphs.hooks_run, student, graphs.MODEL, setting.params, setting.grads,
                                      setting.inputs, value, device), len(setting.params), len(setting.inputs))
    if found["error"] is not None:
        error = probe.ProbeError(**found["error"])
        cause = None
        if error.stage == "remove":
            cause = ("return the handles that register_hook (or register_post_accumulate_grad_hook) returned, in a "
                     "list: the caller removes your hooks with handle.remove().")
        elif "should return None" in error.message:
            cause = "a post-accumulate-grad hook returns nothing: it changes the parameter (or its .grad) in place."
        fail(f"{what} raised {_error_line(error)} ({error.stage}).", *shown,
             cause=cause or (explain.NOT_IMPLEMENTED if error.type == "NotImplementedError" else None))
    return found


def check_clip_hooks(clip_gradients: Any, *, seed: int | None = 0, earlier: bool = True) -> None:
    """clip_gradients(params, max_norm) registers hooks that scale the gradient each backward
    brings to each parameter to a norm of at most max_norm, before it is added to .grad;
    returns the handles."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    with quiet():
        for device in devices.available():
            for batches, before in ((1, False), (2, earlier)):
                setting = _setting(generator, batches, before)
                raws = [_raw(setting, x, device) for x in setting.inputs]
                norms = [float(g.norm()) for g in raws[0][0][:3]]
                low = sorted(norms)
                # one parameter within the bound and two above it, c above it always (its gradient is shared)
                max_norm = min((low[0] + low[1]) / 2, 0.9 * norms[1])
                shown = [f"the model of section 4, {batches} backward pass(es), max_norm = {show(max_norm)}",
                         "parameters with gradients from earlier micro-batches in .grad: "
                         + (", ".join(n for n, g in zip(PARAMETERS, setting.grads) if g is not None) or "none"),
                         f"device: {device}"]
                found = _run_hooks(clip_gradients, setting, max_norm, device, "clip_gradients", shown)
                _judge_clip(setting, raws, max_norm, found, shown)
    passed("clip_gradients: each parameter's gradient of each backward is clipped to max_norm on its own, added "
           "to what .grad held, other gradients untouched, and the handles remove the hooks "
           f"({', '.join(devices.available())}).")
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


def _judge_clip(setting: _Setting, raws: list, max_norm: float, found: dict, shown: list[str]) -> None:
    __tracebackhide__ = True
    for k, (_, gx) in enumerate(raws):
        got = found["input_grads"][k]
        if not _close(got, gx):
            fail("clip_gradients changed the gradient of x, the model's input, which it must leave alone.", *shown,
                 f"x.grad of backward {k + 1}: expected {show(gx)}", f"actual {show(got)}",
                 cause="a hook that changes its gradient in place (mul_, div_, clamp_, copy_) changes a tensor "
                       "that other nodes share: x @ w + c hands one gradient tensor to both terms, so c's hook "
                       "rescaled what reaches x and w. Return a new tensor instead.")
    for i, name in enumerate(PARAMETERS):
        contributions = [grads[i] for grads, _ in raws]
        want = setting.grads[i]
        for g in contributions:
            want = _plus(want, _clipped(g, max_norm))
        got = found["grads"][i]
        if _close(got, want):
            continue
        details = [f"{name}.grad: expected {show(want)}", f"actual {show(got)}"]
        fail(f"clip_gradients: {name}.grad is not its earlier value plus the clipped gradient of each backward.",
             *shown, *details, cause=_clip_cause(setting, raws, max_norm, i, got))
    for i, name in enumerate(PARAMETERS):
        want = _plus(found["grads"][i], raws[0][0][i])
        if not _close(found["grads_after"][i], want):
            fail(f"clip_gradients: after the returned handles were removed, {name}'s gradient was still changed.",
                 *shown, f"{name}.grad: expected {show(want)}", f"actual {show(found['grads_after'][i])}",
                 cause="return every handle your hooks' registration returned (a list of them), so that "
                       "handle.remove() takes each hook away.")


def _clip_cause(setting: _Setting, raws: list, max_norm: float, i: int, got: torch.Tensor | None) -> str | None:
    if got is None:
        return "the parameter got no gradient at all: return a gradient from the hook (a tensor hook's result " \
               "replaces the gradient; returning nothing keeps it)."
    if bool(torch.isnan(got).any()):
        return "a gradient of norm 0 (dead's) divided by its norm is 0/0: scale only gradients above max_norm."
    contributions = [grads[i] for grads, _ in raws]
    after_each = setting.grads[i]  # clipped after each accumulation, earlier micro-batches' gradients included
    for g in contributions:
        after_each = _clipped(_plus(after_each, g), max_norm)
    alternatives = {
        "after_accumulation": after_each,
        "unclipped": _plus(setting.grads[i], sum(contributions[1:], contributions[0])),
        "scaled_up": _plus(setting.grads[i], sum(g * (max_norm / float(g.norm())) if float(g.norm()) else g
                                                 for g in contributions)),
    }
    causes = {
        "after_accumulation": "you clipped .grad, which also holds the gradients of earlier micro-batches: clip what "
                              "this backward brings, in a hook that runs before it is added to .grad (a tensor "
                              "hook), not after (a post-accumulate-grad hook).",
        "unclipped": "the gradients are not clipped at all: a tensor hook must return the new gradient (a hook on the "
                     "AccumulateGrad node's output, register_hook on the Node, runs after .grad was written).",
        "scaled_up": "you rescaled every gradient to norm max_norm, also those below it: scale only gradients "
                     "whose norm is above max_norm.",
    }
    for key, value in alternatives.items():
        if _close(got, value):
            return causes[key]
    return None


def check_step_hooks(step_in_backward: Any, *, seed: int | None = 0) -> None:
    """step_in_backward(params, lr) registers hooks that update each parameter, p -= lr * p.grad,
    as soon as its gradient (earlier micro-batches' included) is complete, then free p.grad;
    returns the handles."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    with quiet():
        for device in devices.available():
            for earlier in (False, True):
                setting = _setting(generator, 1, earlier)
                lr = 0.05 + 0.1 * float(torch.rand((), generator=generator, dtype=torch.float64))
                raw, _ = _raw(setting, setting.inputs[0], device)
                shown = [f"the model of section 4, lr = {show(lr)}",
                         "parameters with gradients from earlier micro-batches in .grad: "
                         + (", ".join(n for n, g in zip(PARAMETERS, setting.grads) if g is not None) or "none"),
                         f"device: {device}"]
                found = _run_hooks(step_in_backward, setting, lr, device, "step_in_backward", shown)
                _judge_step(setting, raw, lr, found, _finished_before(setting, device), device, shown)
    passed("step_in_backward: each parameter steps with its whole accumulated gradient as soon as that is complete, "
           "in the middle of backward, and its .grad is freed; the handles remove the hooks "
           f"({', '.join(devices.available())}).")
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


def _finished_before(setting: _Setting, device: str) -> dict[int, list[bool]]:
    """For each node (by its `reachable` index) that is not an AccumulateGrad: which
    parameters' AccumulateGrad had run when it started, in the grader's own backward."""
    leaves = [p.detach().to(device).clone().requires_grad_() for p in setting.params]
    loss = graphs.model(setting.inputs[0].detach().to(device).clone().requires_grad_(), *leaves)
    nodes = graphs.reachable(loss.grad_fn)
    order = graphs.recorded_order(loss)
    done: list[bool] = [False] * len(leaves)
    found: dict[int, list[bool]] = {}
    for node in order:
        variable = getattr(node, "variable", None)
        if variable is None:
            found[nodes.index(node)] = list(done)
        else:
            done = [d or variable is p for d, p in zip(done, leaves)]
    return found


def _judge_step(setting: _Setting, raw: list[torch.Tensor], lr: float, found: dict,
                finished: dict[int, list[bool]], device: str, shown: list[str]) -> None:
    __tracebackhide__ = True
    for i, name in enumerate(PARAMETERS):
        total = _plus(setting.grads[i], raw[i])
        want = setting.params[i] - lr * total
        got = found["params"][i]
        if not _close(got, want):
            cause = None
            if _close(got, setting.params[i] - lr * raw[i]):
                cause = ("you stepped with this backward's gradient only, without what .grad held from earlier "
                         "micro-batches: step in a hook that runs after the gradient is added to .grad "
                         "(register_post_accumulate_grad_hook), with p.grad.")
            elif _close(got, setting.params[i]):
                cause = "the parameter was not updated: update it in place (p.sub_(...) or p -= ... under no_grad)."
            fail(f"step_in_backward: {name} after backward is not {name} - lr * (its whole gradient).", *shown,
                 f"{name}: expected {show(want)}", f"actual {show(got)}", cause=cause)
        if found["grads"][i] is not None:
            fail(f"step_in_backward: {name}.grad is still set after backward.", *shown,
                 cause="free the gradient once the step used it (p.grad = None): the point of stepping inside "
                       "backward is that the gradients of all parameters never exist at once.")
    for entry in found["changed"]:
        try:
            index, changed = int(entry[0]), [bool(c) for c in entry[1]]
        except (TypeError, ValueError, IndexError):
            raise probe.Malformed("malformed timing") from None
        expected = finished.get(index)
        if expected is None or len(changed) != len(expected):
            continue
        moved = [e and bool((lr * _plus(setting.grads[i], raw[i])).abs().max() > 0) for i, e in enumerate(expected)]
        late = [PARAMETERS[i] for i, (m, c) in enumerate(zip(moved, changed)) if m and not c]
        if late:
            fail(f"step_in_backward: {late[0]} was still unchanged when a later node of backward started, although its "
                 "gradient was complete.", *shown,
                 cause="step as soon as the parameter's gradient is complete, in a hook the engine runs right after "
                       "its AccumulateGrad (register_post_accumulate_grad_hook), not at the end of backward.")
    stepped = _Setting([p - lr * _plus(g, r) for p, g, r in zip(setting.params, setting.grads, raw)],
                       [None] * len(raw), setting.inputs)
    after, _ = _raw(stepped, setting.inputs[0], device)
    for i, name in enumerate(PARAMETERS):
        if not (_close(found["params_after"][i], stepped.params[i]) and _close(found["grads_after"][i], after[i])):
            fail(f"step_in_backward: after the returned handles were removed, a backward still stepped {name} "
                 "(or freed its .grad).", *shown,
                 cause="return every handle your hooks' registration returned (a list of them), so that "
                       "handle.remove() takes each hook away.")


# --- 7.9: a dispatch mode that measures a backward's memory --------------------------------

class Measure(PeakMemory):
    """The grader's own meter: the course's PeakMemory (memory blocks that operations create,
    while alive), and the bytes each operation created."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int]] = []
        self._made = 0

    def created(self, nbytes: int) -> None:
        super().created(nbytes)
        self._made += nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        before = self._made
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.log.append((str(func), self._made - before))
        return out


MEMORY = {"mlp": "tanh(x @ w1) @ w2, summed (matrix products, float64 and float32)",
          "layer_norm": "layer_norm(x, weight), exp, summed",
          "narrow": "a custom Function whose backward returns a view of a block twice the gradient's size",
          "chain": "tanh and a multiplication four times, a transpose, exp, summed"}
CASES = (("mlp", 4), ("layer_norm", 4), ("narrow", 8), ("chain", 4))


def check_backward_memory(meter: Any, *, cases: Sequence[tuple[str, int]] = CASES, seed: int | None = 0) -> None:
    """meter, a TorchDispatchMode class: inside `with meter() as m: loss.backward()`, m.log lists
    (op, bytes of new memory blocks it created) for every ATen op, m.now the bytes of those
    blocks still alive, m.peak the most alive at once; equal to the grader's own measure."""
    __tracebackhide__ = True
    seed_ = inputs.seed_of(seed)
    with quiet():
        for device in devices.available():
            for k, (kind, n) in enumerate(cases):
                want = graphs.memory_case(Measure, kind, n, seed_ + k, device)
                found = probe.invoke(graphs.memory_run, meter, kind, n, seed_ + k, device)
                shown = [f"graph: {MEMORY[kind]}" + (" (sizes hidden from you)" if seed is None else ""),
                         f"device: {device}"]
                _judge_memory(want, found, device, shown)
    passed(f"the meter's log, live bytes and peak equal the grader's own measure on {len(cases)} backward passes "
           f"({', '.join(devices.available())}).")
    if "cuda" not in devices.available():
        note(devices.NO_CUDA)


NEW = ("an op's output is new memory when its memory block, t.untyped_storage(), is none of the op's inputs' "
       "blocks (a view, an in-place op or a detach shares its input's block); count the block's bytes, "
       "untyped_storage().nbytes().")


def _judge_memory(want: dict, found: Any, device: str, shown: list[str]) -> None:
    __tracebackhide__ = True
    if not isinstance(found, dict):
        raise probe.Malformed("malformed memory run")
    if "error" in found:
        _raised("the backward inside your meter", probe.ProbeError(**found["error"]), *shown)
    if found.get("course"):
        fail(f"meter: the backward ran inside {str(found['course'])[:120]}, one of the course's own classes (your "
             "meter is it, or is built on it), not a dispatch mode of yours.", *shown,
             cause="the course's meters are the grader's instruments; write BackwardMemory yourself, a subclass of "
                   "TorchDispatchMode whose __torch_dispatch__ follows the blocks each op creates.")
    log = found.get("log")
    if not isinstance(log, list):
        fail(f"meter.log must be a list of (op, bytes) pairs; it is a {str(found.get('log_type'))[:50]}.", *shown)
    threads = device == "cuda" and len(log) < len(want["log"])
    for k, (op, nbytes) in enumerate(want["log"]):
        if k >= len(log):
            fail(f"meter.log has {show(len(log))} entries; the backward ran {show(len(want['log']))} ATen ops.",
                 *shown, f"first op not in your log: {op} (op {k})",
                 cause="on CUDA the engine runs the backward in a thread of its own: keep the counts on the mode "
                       "object (self), not in thread-local storage." if threads else
                 "log every op that reaches __torch_dispatch__, with 0 for those that create no new memory.")
        got_op, got = (log[k] + [None, None])[:2] if isinstance(log[k], list) else (None, None)
        if got_op != op:
            fail(f"meter.log entry {k} is for {str(got_op)[:80]}; the backward's op {k} is {op}.", *shown,
                 cause="log each op once, in the order they run, as (func, bytes): func is what "
                       "__torch_dispatch__ receives.")
        if got != nbytes:
            fail(f"meter.log: op {k}, {op}, created {show(nbytes)} bytes of new memory; your log says {show(got)}.",
                 *shown, cause=_memory_cause(op, nbytes, got))
    if len(log) > len(want["log"]):
        fail(f"meter.log has {show(len(log))} entries; the backward ran {show(len(want['log']))} ATen ops.", *shown,
             f"entry {len(want['log'])}: {str(log[len(want['log'])])[:100]}")
    for key, what in (("now", "still alive right after backward"), ("peak", "alive at once, at most")):
        got = found.get(key)
        if got != want[key]:
            fail(f"meter.{key}: {show(want[key])} bytes of the blocks the backward created are {what}; yours says "
                 f"{show(got)}.", *shown, cause=_alive_cause(want[key], got, key))


def _memory_cause(op: str, want: int, got: Any) -> str:
    if not isinstance(got, int):
        return "bytes are an int: untyped_storage().nbytes() of each new block."
    if want == 0:
        return f"{op} creates no memory of its own (a view, in place, or a detach): {NEW}"
    if got == 0:
        return (f"look at every tensor {op} returns: some ops return several (a tuple; "
                f"native_layer_norm_backward returns three). {NEW}")
    if got > want:
        return f"count only the blocks this op creates, not its inputs (tensors made before the op): {NEW}"
    return NEW


def _alive_cause(want: int, got: Any, key: str) -> str:
    if not isinstance(got, int):
        return f"meter.{key} is an int, in bytes."
    if got > want:
        return ("memory the backward freed was not subtracted: follow each new block with "
                "weakref.finalize(t.untyped_storage(), ...) and subtract its bytes when it is freed.")
    return ("you subtracted memory that is still alive: a block lives as long as any tensor that views it, so watch "
            "the block (t.untyped_storage()), not the tensor the op returned (which may die while a view of it, "
            "such as a .grad, lives on).")


# --- 7.10: the quiz --------------------------------------------------------------------------

QUIZ_QUESTIONS = "abcdefgh"
QUIZ_CHOICES = (
    "0", "1", "2", "3", "4",
    "the tensor hook", "the post-accumulate-grad hook", "the Node pre-hook", "None",
    "_saved_self", "_saved_result", "_saved_other", "_saved_tensor1",
    "branch A", "branch B",
    "yes", "no",
)
