"""Run student code and record what it computes, without judging.

Probes are the only part of a check that executes the student's code. They return plain
tensors (forward outputs, vector-Jacobian products, second-order products) and the first
error with the stage it happened in. The judges (e.g. :mod:`autograder.checks.functions`)
compare probes of the student's code and of a reference. Keeping the two apart lets the
grader judge in its own process: given a `StudentProxy` (:mod:`autograder.checks.remote`) instead of
the student's object, every probe is answered by the student's process.
"""
from __future__ import annotations

import contextlib
import contextvars
import inspect
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence, cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import report

MESSAGE = 2000  # characters of an error message reported
# A number with a fraction or an exponent, as an error message would print an input's value.
_DECIMAL = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+(?=[eE]))(?:[eE][-+]?\d+)?")


def _cut(text: str) -> str:
    """What the student's code said, cut at MESSAGE characters; in a hidden check, its
    decimal numbers masked: an error message may quote the hidden inputs (an assert that
    prints `x`, a ValueError with a value in it), which the student's feedback must not."""
    if report.hiding():
        text = _DECIMAL.sub("…", text)
    return text if len(text) <= MESSAGE else f"{text[:MESSAGE]}… [cut: {len(text) - MESSAGE} more characters]"


def first_line(error: BaseException, limit: int = MESSAGE) -> str:
    """The first line of what `error` says (its type's name when it says nothing), cut at
    `limit` characters."""
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


@dataclass
class ProbeError:
    stage: str  # "forward", "backward" or "double backward"
    type: str
    message: str

    @staticmethod
    def of(stage: str, exc: BaseException) -> "ProbeError":
        """What the student's code raised, as data (the one way probes record it; a long
        message is cut: no check needs more, and it goes into the student's feedback)."""
        return ProbeError(stage, type(exc).__name__[:MESSAGE], _cut(str(exc)))

    @staticmethod
    def from_data(data: Any) -> "ProbeError | None":
        if data is None:
            return None
        if not isinstance(data, dict) or set(data) != {"stage", "type", "message"} or not all(
            isinstance(v, str) for v in data.values()
        ):
            raise Malformed("malformed error report")
        return ProbeError(data["stage"][:MESSAGE], data["type"][:MESSAGE], _cut(data["message"]))


@dataclass
class Observed:
    """What one run of a student's Function gave (`run`): outputs, gradients, what it changed."""

    outputs: list[torch.Tensor] = field(default_factory=list)
    # grads[k][i]: gradient of <outputs, grad_outputs[k]> with respect to tensor input i.
    grads: list[list[torch.Tensor | None]] = field(default_factory=list)
    # Gradient of <grads[0], grad_grads> with respect to each tensor input, then to
    # each of grad_outputs[0] (None where it does not depend on it: a zero).
    grads2: list[torch.Tensor | None] | None = None
    # Positions of tensor arguments whose values forward changed in place.
    modified: list[int] = field(default_factory=list)
    # Indices k of the grad_outputs sets whose tensors backward changed in place.
    modified_grad_outputs: list[int] = field(default_factory=list)
    error: ProbeError | None = None
    # What asked autograd inside the Function, if it was watched (introspect.AutogradWatch),
    # and why it could not be watched, where it could not.
    asked_autograd: list[str] = field(default_factory=list)
    unwatched: str | None = None
    # With `Run.dtypes` (float32 inputs): the first operation that made a float64 tensor, and
    # the stage it ran in (`Widening`; best effort).
    widened: str | None = None

    @staticmethod
    def from_data(data: Any) -> "Observed":
        try:
            return Observed(
                outputs=_tensors(data["outputs"]),
                grads=[_tensors(g, optional=True) for g in data["grads"]],
                grads2=None if data["grads2"] is None else _tensors(data["grads2"], optional=True),
                modified=[i for i in data["modified"] if isinstance(i, int)],
                modified_grad_outputs=[k for k in data["modified_grad_outputs"] if isinstance(k, int)],
                error=ProbeError.from_data(data["error"]),
                asked_autograd=[_cut(str(a)) for a in data["asked_autograd"][:20]],
                unwatched=None if data.get("unwatched") is None else _cut(str(data["unwatched"])),
                widened=None if data.get("widened") is None else _cut(str(data["widened"])),
            )
        except (KeyError, TypeError) as bad:
            raise Malformed(f"malformed probe: {bad}") from None

    def admit(self, run: "Run") -> "Observed":
        """Refuse what no run of `run` gives, before a check computes with any of it: autograd
        returns each gradient in the shape and dtype of what it differentiates (its engine sums
        and casts it so), so a gradient of any other shape — which arithmetic with the
        reference's would broadcast, to any size — comes from a process that did not compute
        it; positions name arguments and grad_output sets that exist."""
        wrt = [a for a in run.args if differentiable(a) and a.requires_grad]
        given = [v for v in (run.grad_outputs[0] if run.grad_outputs else []) if isinstance(v, torch.Tensor)]
        expected = len(run.grad_outputs)  # one set of gradients per set of grad_outputs, until an error
        if len(self.grads) > expected or (self.error is None and len(self.grads) < expected) or any(
                len(g) != len(wrt) for g in self.grads):
            raise Malformed("a probe's gradients do not match its inputs")
        for grads in self.grads:
            _like_inputs(grads, wrt)
        if self.grads2 is not None:
            _like_inputs(self.grads2[:len(wrt)], wrt)
            tail = self.grads2[len(wrt):]
            if len(self.grads2) < len(wrt) or len(tail) > len(given):
                raise Malformed("a probe's second-order gradients do not match its inputs")
            shapes = [v.shape for v in given]
            for g in tail:  # one per grad_output that reached an output, in order
                if g is not None and g.shape not in shapes:
                    raise Malformed(f"a second-order gradient of shape {tuple(g.shape)[:8]}, which no grad_output "
                                    "has: nothing is computed from it")
        self.modified = [i for i in self.modified if 0 <= i < len(run.args)]
        self.modified_grad_outputs = [k for k in self.modified_grad_outputs if 0 <= k < len(run.grad_outputs)]
        return self


def _like_inputs(grads: Sequence[torch.Tensor | None], wrt: Sequence[torch.Tensor]) -> None:
    for g, a in zip(grads, wrt):
        if g is not None and (g.shape != a.shape or g.dtype != a.dtype):
            raise Malformed(f"a gradient of shape {tuple(g.shape)[:8]} and dtype {g.dtype} for an input of shape "
                            f"{tuple(a.shape)} and dtype {a.dtype}, which autograd never returns: nothing is "
                            "computed from it")


def _tensors(values: Any, optional: bool = False) -> list[Any]:
    if not isinstance(values, list) or not all(
        isinstance(v, torch.Tensor) or (optional and v is None) for v in values
    ):
        raise Malformed("expected a list of tensors")
    return values


class StudentProxy:
    """A student's object in another process (:mod:`autograder.checks.remote`): `invoke`
    runs a probe procedure there and returns its plain-data result."""

    def invoke(self, procedure: str, *args: Any) -> Any:
        raise NotImplementedError


PROCEDURES: dict[str, Callable[..., Any]] = {}


def procedure(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register `fn(student_object, *plain_args) -> plain data`, which runs wherever the
    student's object is (the only functions a grader may ask a student's process to run)."""
    PROCEDURES[f"{fn.__module__}:{fn.__qualname__}"] = fn
    return fn


def invoke(proc: Callable[..., Any], student: Any, *args: Any) -> Any:
    """`proc(student, *args)`, run in the student's process when `student` is a proxy."""
    if isinstance(student, StudentProxy):
        return student.invoke(f"{proc.__module__}:{proc.__qualname__}", *args)
    return proc(student, *args)


# --- Questions from the student's side to the judging side, during a probe ----------------
#
# Code of this package that runs in the student's process may need something only the
# judging side may compute (the gradient of a stand-in operation, say): `ask` sends it a
# plain-data question while a probe runs, and `answering(handler)`, on the judging side,
# says who answers while a check runs. In one process (a student's own kernel, tests) the
# handler is called directly; in a grading child the runner routes questions over the
# notebook's channel (`asking_over`), where the grader answers them with the same handler.

_answering: contextvars.ContextVar[Callable[[Any], Any] | None] = contextvars.ContextVar("answering", default=None)
_asker: Callable[[Any], Any] | None = None  # set in a grading child


class NobodyToAsk(RuntimeError):
    """`ask` was called while no check was answering questions."""


class Refused(RuntimeError):
    """The judging side would not answer a question."""


def ask(question: Any) -> Any:
    """The judging side's answer to `question` (plain data, as is the answer); raises
    Refused (or, in one process, the handler's own exception) when it will not answer."""
    if _asker is not None:
        return _asker(question)
    handler = _answering.get()
    if handler is None:
        raise NobodyToAsk("no check is running that could answer this")
    return handler(question)


@contextlib.contextmanager
def answering(handler: Callable[[Any], Any]) -> Iterator[None]:
    """While the block runs, questions the student's side `ask`s are answered by `handler`
    (judging side: it must treat every question as untrusted data)."""
    token = _answering.set(handler)
    try:
        yield
    finally:
        _answering.reset(token)


def handler() -> Callable[[Any], Any] | None:
    """Who answers questions now (judging side), if anyone."""
    return _answering.get()


def asking_over(asker: Callable[[Any], Any] | None) -> None:
    """In a grading child: send questions with `asker` (None: answer them in this process)."""
    global _asker
    _asker = asker


class Malformed(ValueError):
    """Data from a student's process that does not have the expected form."""


class StudentError(Exception):
    """The student's code raised; `type` and `message` describe the original exception."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type = type_name
        self.message = message


# Functions of the checks that may be handed to student code (e.g. the f of a student's
# numerical Jacobian); they cross processes by name. Key -> function, and back.
REFERENCES: dict[str, Callable[..., Any]] = {}
REFERENCE_KEYS: dict[int, str] = {}


def reference(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register `fn` under `key` ("<module>:<name>") so it can be passed to student code."""
    REFERENCES[key] = fn
    REFERENCE_KEYS[id(fn)] = key
    return fn


def as_callable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`Function` subclasses are called through `.apply`; anything else directly."""
    if isinstance(fn, type) and issubclass(fn, torch.autograd.Function):
        return fn.apply
    return fn


def argument_names(fn: Any) -> list[str]:
    """Names of the arguments a student's Function (or function) takes, without ctx."""
    names = invoke(_argument_names, fn)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise Malformed("malformed argument names")
    return names


@procedure
def _argument_names(fn: Any) -> list[str]:
    target = _signature_target(fn)
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return []
    # *args and **kwargs name no single argument: positions from there on are "input k".
    names = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            break
        names.append(p.name)
    if names and names[0] == "ctx" and target is not fn:
        names = names[1:]
    return names


def _signature_target(fn: Any) -> Any:
    """What to read a student object's arguments from: a Function's forward, an
    nn.Module instance's forward, a custom op's own function, or `fn` itself (a class:
    its constructor's)."""
    if isinstance(fn, type) and issubclass(fn, torch.autograd.Function):
        return fn.forward
    if isinstance(fn, torch.nn.Module):
        return fn.forward
    init = getattr(fn, "_init_fn", None)  # torch.library.custom_op's CustomOpDef
    if callable(init) and type(fn).__name__ == "CustomOpDef":
        return init
    return fn


def differentiable(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def outputs_of(result: Any) -> list[torch.Tensor]:
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def run(
    fn: Any,
    args: Sequence[Any],
    grad_outputs: Sequence[Sequence[torch.Tensor | None]],
    grad_grads: Sequence[torch.Tensor] | None = None,
    layouts: Sequence[str] | None = None,
    watch: bool = False,
) -> Observed:
    """Call `fn(*args)`, then backward once per set of grad_outputs, then double backward.

    Floating-point tensor arguments are differentiated (they must require grad);
    `grad_outputs[k]` has one tensor per floating-point output, or None for an output
    that backward leaves out (its gradient then reaches the Function as zeros, or as None
    with `ctx.set_materialize_grads(False)`). When `grad_grads` is given, the first
    backward builds a graph and is differentiated again with it. `layouts[k]` lays the
    tensors of set k out in memory as autograd may hand them to a backward: "plain",
    "strided" (not contiguous) or "expanded" (one value in memory, seen at every position:
    as `y.sum().backward()` gives; only for sets whose tensors are constant). Backward
    must work with each, and leave them unchanged (`Observed.modified_grad_outputs`). With
    `watch`, a Function is watched for asking autograd (`Observed.asked_autograd`).
    """
    return run_many(fn, [Run(args, grad_outputs, grad_grads, layouts, watch)])[0]


@dataclass
class Run:
    """The arguments of one `run`."""

    args: Sequence[Any]
    grad_outputs: Sequence[Sequence[torch.Tensor | None]]
    grad_grads: Sequence[torch.Tensor] | None = None
    layouts: Sequence[str] | None = None
    watch: bool = False
    dtypes: bool = False  # watch for float64 tensors made on the way (`Widening`): float32 inputs only

    def plain(self) -> list[Any]:
        return [tuple(self.args), [list(vs) for vs in self.grad_outputs],
                None if self.grad_grads is None else list(self.grad_grads),
                None if self.layouts is None else list(self.layouts), self.watch, self.dtypes]


def run_many(fn: Any, runs: Sequence[Run]) -> list[Observed]:
    """`run` for each of `runs`, in one request to the student's process (each request has
    a fixed cost: checks ask for all they can at once)."""
    found = invoke(_run_many, fn, [r.plain() for r in runs])
    if not isinstance(found, list) or len(found) != len(runs):
        raise Malformed("malformed runs")
    return [Observed.from_data(d).admit(r) for d, r in zip(found, runs)]


@procedure
def _run_many(fn: Any, runs: list[Any]) -> list[Any]:
    """Each run; those asked to be watched, of a Function, under one watch."""
    function = isinstance(fn, type) and issubclass(fn, torch.autograd.Function)
    watched = [function and len(r) > 4 and bool(r[4]) for r in runs]
    dtypes = [len(r) > 5 and bool(r[5]) for r in runs]
    if not any(watched):
        return [_probed(fn, *r[:4], dtypes=d) for r, d in zip(runs, dtypes)]
    from .introspect import AutogradWatch

    found = []
    with AutogradWatch(fn).watching() as watch:
        for r, watching, d in zip(runs, watched, dtypes):
            if not watching:
                found.append(_probed(fn, *r[:4], dtypes=d))
                continue
            args, grad_outputs, grad_grads, layouts = r[:4]
            with watch.run() as applied:
                found.append(_probed(fn, args, grad_outputs, grad_grads, layouts, applied, dtypes=d))
    evidence = iter(watch.evidence)
    return [{**f, "asked_autograd": next(evidence), "unwatched": watch.unwatched} if watching else f
            for f, watching in zip(found, watched)]


LAYOUTS = ("plain", "strided", "expanded")


def laid_out(v: torch.Tensor, layout: str) -> torch.Tensor:
    """`v`'s values in the memory layout `layout` (see `run`)."""
    if layout == "strided" and v.device.type != "meta":
        # Every other element of a buffer, in reversed dim order (as after a transpose):
        # no `.view` that merges dims works on it.
        order = list(range(v.dim()))[::-1]
        base = v.new_empty((*(v.shape[d] for d in order), 2))[..., 0]
        out = base.permute(*order) if order else base
        out.copy_(v)
        return out
    if layout == "expanded" and v.numel() and v.device.type != "meta":
        first = v.reshape(-1)[:1].reshape(())
        if bool((v == first).all()):
            return first.clone().expand(v.shape)
    return v


def _probed(fn: Any, args: tuple[Any, ...], grad_outputs: list[Any], grad_grads: list[Any] | None,
            layouts: list[Any] | None, applied: Callable[[Any], None] | None = None, *,
            dtypes: bool = False) -> dict[str, Any]:
    """One `run`; `applied` is told what the call returned (the watch's)."""
    widening = Widening() if dtypes else None
    with widening or contextlib.nullcontext():
        found = _observed(fn, args, grad_outputs, grad_grads, layouts, applied, widening)
    found.widened = None if widening is None else widening.first
    # Field by field (dataclasses.asdict would deep-copy every tensor: a tenth of a check's time).
    return {**vars(found), "error": None if found.error is None else asdict(found.error)}


class Widening(TorchDispatchMode):
    """Watches code given float32 inputs for the first operation that makes a float64 (or
    complex128) tensor with dimensions: a float64 constant, `.double()` or NumPy's float64
    result pulls the computation up, and autograd's engine casts a gradient computed so
    back to float32 without a word (so its values cannot tell). `stage` is set by the
    caller as it goes; `first` says what ran, and where. A 0-d tensor does not count (it
    does not promote the dimensioned tensors it meets). Best effort: the student's process
    reports it."""

    WIDE = (torch.float64, torch.complex128)

    def __init__(self, stage: str = "forward") -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's is unannotated
        self.stage = stage
        self.first: str | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.first is None:
            made = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
            wide = next((t for t in made if t.dim() and t.dtype in self.WIDE), None)
            if wide is not None:
                name = getattr(getattr(func, "overloadpacket", func), "__name__", str(func))
                self.first = (f"an operation ({name}) made a {str(wide.dtype).removeprefix('torch.')} tensor of "
                              f"shape {tuple(wide.shape)} in {self.stage}")
        return out


def _observed(fn: Any, args: tuple[Any, ...], grad_outputs: list[Any], grad_grads: list[Any] | None,
              layouts: list[Any] | None, applied: Callable[[Any], None] | None,
              widening: Widening | None) -> Observed:
    call = as_callable(fn)
    probe = Observed()
    wrt = [a for a in args if differentiable(a) and a.requires_grad]
    stage = "forward"
    before = {i: a.detach().clone() for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    try:
        result = call(*args)
        if applied is not None:
            applied(result)
        probe.modified = [i for i, b in before.items() if not _same(args[i], b)]
        probe.outputs = [t.detach() for t in outputs_of(result)]
        # grad_outputs[k][j] belongs to the j-th floating-point output; those that do not
        # require grad (no input they depend on does) are left out.
        floating = [t for t in outputs_of(result) if differentiable(t)]
        for k, vs in enumerate(grad_outputs):
            stage = "backward"
            if widening is not None:
                widening.stage = stage
            second = grad_grads is not None and k == 0
            layout = layouts[k] if layouts is not None and k < len(layouts) else "plain"
            pairs = [(o, laid_out(v, layout if layout in LAYOUTS else "plain"))
                     for o, v in zip(floating, vs) if v is not None and o.requires_grad]
            if second:  # the double backward also differentiates with respect to grad_output
                pairs = [(o, v.detach().requires_grad_()) for o, v in pairs]
            given = [v.detach().clone() for _, v in pairs]
            if not pairs:  # nothing flows back: no gradient at all
                probe.grads.append([None] * len(wrt))
                continue
            grads = torch.autograd.grad(
                [o for o, _ in pairs], wrt, [v for _, v in pairs],
                allow_unused=True, create_graph=second, retain_graph=True,
            )
            if not all(_same(v, g) for (_, v), g in zip(pairs, given)):
                probe.modified_grad_outputs.append(k)
            probe.grads.append([None if g is None else g.detach() for g in grads])
            if second:
                stage = "double backward"
                if widening is not None:
                    widening.stage = stage
                assert grad_grads is not None  # (second)
                probe.grads2 = _second_order(grads, grad_grads, [*wrt, *(v for _, v in pairs)])
    except Exception as exc:  # the student's code may raise anything
        probe.error = ProbeError.of(stage, exc)
    return probe


def _second_order(
    grads: Sequence[torch.Tensor | None],
    grad_grads: Sequence[torch.Tensor],
    wrt: list[torch.Tensor],
) -> list[torch.Tensor | None]:
    tracked = [(g, u) for g, u in zip(grads, grad_grads) if g is not None and g.requires_grad]
    if not tracked:  # the gradient does not depend on anything: all second derivatives are zero
        return [None] * len(wrt)
    grads2 = torch.autograd.grad(
        [g for g, _ in tracked], wrt, [u for _, u in tracked], allow_unused=True, retain_graph=True
    )
    return [None if g is None else g.detach() for g in grads2]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device.type == "meta":
        return True
    # torch.equal first: fast, and it decides unless a NaN is involved (NaN equals NaN here)
    return a.shape == b.shape and (torch.equal(a.detach(), b)
                                   or bool(torch.allclose(a.detach(), b, rtol=0, atol=0, equal_nan=True)))


def forward(fn: Any, args: Sequence[Any]) -> list[torch.Tensor] | ProbeError:
    """The forward outputs of `fn(*args)` without recording a graph, or the error."""
    try:
        with torch.no_grad():
            return [t.detach() for t in outputs_of(as_callable(fn)(*args))]
    except Exception as exc:  # the student's code may raise anything
        return ProbeError.of("forward", exc)


def forward_many(fn: Any, arg_sets: list[tuple[Any, ...]]) -> list[list[torch.Tensor] | ProbeError]:
    """Forward outputs for many argument tuples (finite differences need dozens)."""
    results = invoke(_forward_many, fn, list(arg_sets))
    if not isinstance(results, list) or len(results) != len(arg_sets):
        raise Malformed("malformed forward results")
    # (from_data gives None for None only)
    return [cast(ProbeError, ProbeError.from_data(r)) if isinstance(r, dict) else _tensors(r) for r in results]


@procedure
def _forward_many(fn: Any, arg_sets: list[tuple[Any, ...]]) -> list[Any]:
    results = [forward(fn, args) for args in arg_sets]
    return [asdict(r) if isinstance(r, ProbeError) else r for r in results]


@dataclass
class OnMeta:
    """A run on `meta` tensors: the device of each output and of each gradient, or the error."""

    outputs: list[str] = field(default_factory=list)
    grads: list[str] = field(default_factory=list)
    error: ProbeError | None = None


def meta(fn: Any, arg_sets: Sequence[Sequence[Any]]) -> list[OnMeta]:
    """Forward and backward on `meta` tensors (shapes and devices only), for each set of
    arguments. A copy to the CPU there gives zeros on the CPU instead of failing (meta
    tensors have no data), so a Function that wraps NumPy runs on, and an output left on
    the CPU shows as such."""
    found = invoke(_meta_many, fn, [tuple(args) for args in arg_sets])
    try:
        assert isinstance(found, list) and len(found) == len(arg_sets)
        return [OnMeta([str(d)[:20] for d in data["outputs"][:100]], [str(d)[:20] for d in data["grads"][:100]],
                       ProbeError.from_data(data["error"])) for data in found]
    except (AssertionError, KeyError, TypeError) as bad:
        raise Malformed(f"malformed meta run: {bad}") from None


@procedure
def _meta_many(fn: Any, arg_sets: list[Any]) -> list[Any]:
    return [_meta(fn, args) for args in arg_sets]


META_OPERATIONS = 1000  # on the meta device each costs a millisecond or so: an iteration there is not followed


class _CopiesToCpu(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's is unannotated
        self.operations = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.operations += 1
        if self.operations > META_OPERATIONS:
            raise RuntimeError(f"more than {META_OPERATIONS} operations: too long to follow on the meta device")
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        device = kwargs.get("device")
        if (func is torch.ops.aten._to_copy.default and source is not None and source.device.type == "meta"
                and device is not None and torch.device(device).type == "cpu"):
            return torch.zeros(source.shape, dtype=kwargs.get("dtype") or source.dtype, device="cpu")
        return func(*args, **kwargs)


def _meta(fn: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    wrt = [a for a in args if differentiable(a)]
    found, stage = OnMeta(), "forward"
    try:
        with _CopiesToCpu():
            outs = outputs_of(as_callable(fn)(*args))
            found.outputs = [o.device.type for o in outs]
            if all(device == "meta" for device in found.outputs):  # (else the check fails on that)
                outs = [o for o in outs if differentiable(o) and o.requires_grad]
                stage = "backward"
                grads = torch.autograd.grad(outs, wrt, [torch.ones_like(o) for o in outs], allow_unused=True)
                found.grads = [g.device.type for g in grads if g is not None]
    except Exception as exc:  # the student's code may raise anything
        found.error = ProbeError.of(stage, exc)
    return asdict(found)


@contextlib.contextmanager
def substituted(student: Any, replacements: dict[str, Callable[..., Any]]) -> Iterator[list[str]]:
    """While the block runs, names of the notebook that `student` comes from are bound to
    registered functions of the course, so that one exercise is graded independently of
    another that the student's code calls. Yields the names replaced (those the notebook
    defines); best effort, as the student's process reports it."""
    replaced = invoke(_replace_names, student, dict(replacements))
    if not isinstance(replaced, list) or not all(isinstance(name, str) for name in replaced):
        raise Malformed("malformed answer to a substitution")
    try:
        yield replaced
    finally:
        if replaced:
            invoke(_restore_names, student)


_REPLACED: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (namespace, its own values of the replaced names)


def _namespace(student: Any) -> dict[str, Any]:
    """The globals the student's code looks names up in: a Function's (its backward's), an
    nn.Module's (its forward's), a custom op's (its function's), or a function's own."""
    if isinstance(student, type) and issubclass(student, torch.autograd.Function):
        target = student.backward
    elif isinstance(student, type) and issubclass(student, torch.nn.Module):
        target = student.forward
    elif isinstance(student, torch.nn.Module):
        target = type(student).forward
    elif type(student).__name__ == "CustomOpDef" and callable(getattr(student, "_init_fn", None)):
        target = student._init_fn
    else:
        target = student
    return getattr(inspect.unwrap(target), "__globals__", {})


@procedure
def _replace_names(student: Any, replacements: dict[str, Any]) -> list[str]:
    namespace = _namespace(student)
    own = {name: namespace[name] for name in replacements if namespace.get(name) is not None}
    if own:
        _REPLACED.append((namespace, own))
        namespace.update({name: replacements[name] for name in own})
    return list(own)


@procedure
def _restore_names(student: Any) -> None:
    namespace, own = _REPLACED.pop()
    namespace.update(own)
