"""`autograder.check_function` against the stock tools, on the course's known wrong Functions.

Every exercise whose answer is a torch.autograd.Function (or a custom op, or a function made of
one) is taken with each of its known answers (tests/answers: the wrong ones, the unusual right
ones, and the model solution), each run as a user would run it, in this process, on the
exercise's own inputs (drawn from a recorded seed):

- the course's own checks (the notebook's graded cells, visible and hidden): what there is to
  catch, and the bug's class (named from the course's message);
- (a) torch.autograd.gradcheck, and gradgradcheck where the exercise promises double backward;
- (b) torch.library.opcheck, where the answer is a custom op;
- (c) `check_function(fn, inputs)`, without a reference: the options an author states about
  their Function (double backward, a surrogate gradient, vmap and compile where the exercise
  needs them), nothing else;
- (d) `check_function(fn, inputs, reference)`, the exercise's reference given, and the bytes the
  model solution saves (and what the capstones' contracts grant besides) as `max_saved_bytes`.

Prints a markdown table (bug class × answers each tool catches, false alarms on right answers,
CPU seconds per Function checked) and writes it, with every answer's verdicts, to
bench/results/. In-place Functions (06's Tanh_, 06½'s Softmax_) are left out: check_function
cannot run them.

    .venv/bin/python bench/function_check_vs_stock.py [--exercise GRADE_ID ...] [--answers N]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import time
import types
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import nbformat
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from answers import for_notebook  # noqa: E402
from autograder import authoring  # noqa: E402
from autograder.checks import inputs  # noqa: E402
from autograder.checks.anyfunction import check_function  # noqa: E402
from autograder.checks.functions import FunctionSpec  # noqa: E402
from autograder.exercises import capstone as cap  # noqa: E402
from autograder.exercises import double_backward as db  # noqa: E402
from autograder.exercises import function_basics as fb  # noqa: E402
from autograder.exercises import gradcheck as gc  # noqa: E402
from autograder.exercises import gradient_patterns as gp  # noqa: E402
from autograder.exercises import memory as mem  # noqa: E402
from autograder.exercises import modern_api as ma  # noqa: E402
from autograder.exercises import real_world as rw  # noqa: E402
from autograder.exercises import save_for_backward as sfb  # noqa: E402
from autograder.student import capstone as cap_side  # noqa: E402
from autograder.student import devices, probe  # noqa: E402
from autograder.student import memory as mem_side  # noqa: E402
from autograder.student.saved import record  # noqa: E402
from grading import exercises, model_solution, namespace  # noqa: E402

SEED = 20261128  # every input of the run is drawn from it
RESULTS = REPO / "bench" / "results"


@dataclass(frozen=True)
class Target:
    """An exercise whose answer is checked as a Function: the objects a user would check
    (names in the notebook), the exercise's inputs and reference, and what its author would
    tell check_function."""

    slug: str
    exercise: str
    objects: tuple[str, ...]
    spec: FunctionSpec
    options: dict = field(default_factory=dict)
    adapter: str | None = None  # the capstone's: the function as its checks call it


def _reversal(x, alpha):
    return -alpha * x + ((1 + alpha) * x).detach()


def _checkpointed(run, *tensors):
    return run(*tensors)


def _reverse_cases(generator):
    return [(inputs.normal(shape, generator), alpha) for shape, alpha in rw.GRAD_REVERSE_CASES]


def _distance_cases(generator):
    return [(inputs.normal(shape, generator), inputs.normal(shape, generator), dim)
            for shape, dim, _, _ in ma.VMAP_RULE_CASES]


def _checkpoint_cases(generator):
    return [(mem_side.residual_tanh, *mem._block_args("residual_tanh", 3, 4, generator)),
            (mem_side.scaled_sin, *mem._block_args("scaled_sin", 3, 4, generator))]


def _spec(name, reference, cases, **options) -> FunctionSpec:
    return FunctionSpec(name=name, reference=reference, cases=cases, **options)


# What the exercises' own checks demand besides the numbers, so an author of such a Function
# would state it: backward skips the gradients nobody asked for; and (given with the reference,
# as `max_saved_bytes`: what the model solution saves on the same call, plus what the capstones'
# contracts grant beyond it) what is saved. (The checkpoint's right answers may save the random
# generator's state: its course checks judge no bytes.)
NEEDS_INPUT_GRAD = {"linear", "polar_to_cartesian", "leaky_relu", "linear_relu"}
SAVED = {"sigmoid", "sort", "sinh_intermediates", "swish", "logsumexp", "grad_reverse", "fixed_point", "leaky_relu",
         "linear_relu", "fused_cross_entropy", "fused_linear_cross_entropy"}
GRANTED: dict[str, Callable[[tuple], int]] = {
    "fused_cross_entropy": lambda args: cap.allowance(max(1, args[1].numel())),  # a few numbers per row
    # (capstone.linear_kept: as much as hidden and weight, and a few numbers per row)
    "fused_linear_cross_entropy": lambda args: (args[0].numel() + args[1].numel()) * cap.BYTES_PER_NUMBER
    + cap.allowance(args[0].shape[0]),
}
TARGETS = [
    Target("03_function_basics", "clipped_relu", ("ClippedReLU",), fb.CLIPPED_RELU),
    Target("03_function_basics", "linear", ("Linear",), fb.LINEAR),
    Target("03_function_basics", "polar_to_cartesian", ("PolarToCartesian",), fb.POLAR),
    Target("04_gradient_patterns", "gelu", ("GELU",), gp.GELU),
    Target("04_gradient_patterns", "batched_matmul", ("BatchedMatmul",), gp.BATCHED_MATMUL),
    Target("04_gradient_patterns", "affine", ("Affine",), gp.AFFINE),
    Target("04_gradient_patterns", "mean", ("Mean",), gp.MEAN),
    Target("04_gradient_patterns", "max", ("Max",), gp.MAX),
    Target("04_gradient_patterns", "conv2d", ("Conv2d",), gp.CONV2D),
    Target("05_gradcheck", "softmax", ("Softmax",),
           _spec("Softmax", lambda x: torch.softmax(x, -1), gc._normal_cases([(5,), (3, 4), (1, 5)], 1))),
    Target("05_gradcheck", "sincos", ("SinCos",),
           _spec("SinCos", lambda x: (x.sin(), x.cos()), gc._normal_cases([(5,), (3, 4)], 1))),
    Target("05_gradcheck", "lerp", ("Lerp",), _spec("Lerp", torch.lerp, gc._normal_cases([(5,), (3, 4)], 3))),
    Target("06_save_for_backward", "sigmoid", ("Sigmoid",),
           replace(sfb.SIGMOID, cases=sfb._normal_cases([(5,), (2, 3)], sfb.SIGMOID_SPECIAL))),
    Target("06_save_for_backward", "sort", ("Sort",), sfb.SORT),
    Target("07_double_backward", "sinh_fixed", ("SinhFixed",), db.SINH),
    Target("07_double_backward", "sinh_intermediates", ("SinhWithIntermediates",), db.SINH_INTERMEDIATES),
    Target("07_double_backward", "cube_backward", ("CubeBackward",), db.CUBE_BACKWARD),
    Target("08_memory", "leaky_relu", ("LeakyReLU",), mem.LEAKY_RELU),
    Target("08_memory", "linear_relu", ("LinearReLU",), mem.LINEAR_RELU),
    Target("08_memory_checkpointing", "manual_checkpoint", ("Checkpoint",),
           _spec("Checkpoint", _checkpointed, _checkpoint_cases, autograd_in_backward=True)),
    Target("09_real_world", "swish", ("Swish",), rw.SWISH),
    Target("09_real_world", "logsumexp", ("LogSumExp",), rw.LOGSUMEXP),
    Target("09_real_world", "grad_reverse", ("GradReverse",),
           _spec("GradReverse", _reversal, _reverse_cases, surrogate_gradient=True)),
    Target("09_real_world", "fixed_point", ("TanhFixedPoint",), rw.FIXED_POINT),
    Target("10_modern_api", "clipped_relu", ("ClippedReLU",), ma.CLIPPED_RELU, {"vmap": True}),
    Target("10_modern_api", "vmap_rule", ("SquaredDistance",),
           _spec("SquaredDistance", ma._squared_distance, _distance_cases), {"vmap": True}),
    Target("10_modern_api", "swish_jvp", ("Swish",), ma.SWISH),
    Target("10_modern_api", "logsumexp_op", ("logsumexp",), ma.LOGSUMEXP_OP, {"compile": "fullgraph"}),
    Target("10_modern_api", "softmax_pattern", ("softmax", "Softmax"), ma.SOFTMAX,
           {"vmap": True, "compile": "fullgraph"}),
    Target("11_capstone", "fused_cross_entropy", ("fused_cross_entropy",),
           _spec(cap.NAME, cap._reference, cap._cases(cap.VALUE_CASES[:4] + cap.DOUBLE_CASES), double_backward=True),
           {"vmap": True, "compile": "fullgraph"}, adapter="cross_entropy"),
    Target("11_capstone_extension", "fused_linear_cross_entropy", ("fused_linear_cross_entropy",),
           _spec(cap.LINEAR_NAME, cap._linear_reference, cap._linear_cases(cap.LINEAR_VALUE_CASES[:4]),
                 autograd_in_backward=True), adapter="linear_cross_entropy"),
]


# --- The bug's class, from the course's message ------------------------------------------------
# In order: the first that matches the message's first line (then its cause) names it.
CLASSES = [
    ("autograd inside backward", r"asks autograd"),
    # What an exercise asks beyond a right Function: the modern style, the notebook's namespace,
    # set_materialize_grads, reducing a broadcast gradient oneself, torch's choice at a tie.
    ("the exercise's own contract", r"classic Function|setup_context|outside this notebook's namespace|not an op "
                                    r"made|received zeros as|should run fewer|backward returned a gradient of shape|"
                                    r"at a tie"),
    ("vmap", r"vmap"),
    ("torch.compile", r"torch\.compile"),
    ("forward-mode AD", r"forward AD|forward-mode|jvp|jacfwd|hessian|tangent"),
    ("custom op (fake kernel, opcheck)", r"fake kernel|opcheck|custom_op|autograd formula"),
    ("kept outside ctx", r"stashed|attribute of ctx|still alive|kept alive|kept by|on ctx"),
    ("modifies in place", r"in place"),
    ("wrong device", r"meta\b|device|CUDA|\.cpu\(\)"),
    ("float32 to float64", r"given float32|in float32|dtype|float64 step"),
    ("NaN at special points", r"\bnan\b|\binf\b|finite"),
    ("raises", r"raised|passed an? \w+ to|returned \d+ gradient\(s\), but|takes \d+ gradient"),
    ("more saved than needed", r"\bsaves?\b|bytes"),
    ("needs_input_grad", r"when only|needs_input_grad|matrix multiplication|requires grad"),
    ("third derivative", r"derivative \d is|third"),
    ("double backward", r"double backward|gradgradcheck|second|differentiab"),
    ("wrong values", r"wrong values|forward (returned|has)|returned \d+ tensor|output"),
    ("wrong gradients", r"gradient|gradcheck|backward"),
]


def bug_class(message: str) -> str:
    lines = message.splitlines()
    for text in (lines[0] if lines else "", message):
        for name, pattern in CLASSES:
            if re.search(pattern, text):
                return name
    return "other"


# --- Running one answer ------------------------------------------------------------------------

@dataclass
class Verdict:
    caught: bool = False
    message: str = ""
    cpu: float = 0.0
    crashed: str = ""  # check_function raised something other than CheckFailed (a bug of ours)


@dataclass
class Row:
    exercise: str
    kind: str  # "wrong", "right" or "model"
    label: str
    device: str | None
    bug: str = ""
    tools: dict[str, Verdict] = field(default_factory=dict)


def _timed(run: Callable[[], None], ours: bool = False) -> Verdict:
    from autograder.student.report import CheckFailed

    verdict = Verdict()
    start = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            run()
        except CheckFailed as failed:
            verdict.caught, verdict.message = True, str(failed)
        except Exception as error:  # a stock tool's verdict, or the answer's own error
            verdict.caught, verdict.message = True, f"{type(error).__name__}: {error}"
            if ours:
                verdict.crashed = verdict.message
    verdict.cpu = time.process_time() - start
    return verdict


def _answer_namespace(base: dict, slug: str, source: str) -> dict:
    """The notebook's namespace with one answer cell run again: a module of its own, as the
    notebook's is (torch.compile finds a Function's globals through it)."""
    module = types.ModuleType(f"answer_{slug}_{next(_answers)}")
    module.__dict__.update({k: v for k, v in base.items() if k not in ("__name__", "__dict__")})
    sys.modules[module.__name__] = module
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        exec(compile(source, f"<{module.__name__}>", "exec"), module.__dict__)
    return module.__dict__


_answers = iter(range(10**9))


def _objects(target: Target, ns: dict) -> list[Any]:
    found = [ns[name] for name in target.objects]
    return [cap_side.ADAPTERS[target.adapter](o) for o in found] if target.adapter else found


def _stock(objects: list[Any], cases: list[tuple], double: bool) -> None:
    for fn in objects:
        for args in cases:
            call, prepared = probe.as_callable(fn), devices.prepare(args, "cpu")
            torch.autograd.gradcheck(call, prepared)
            if double:
                torch.autograd.gradgradcheck(call, prepared)


def _opcheck(objects: list[Any], cases: list[tuple]) -> None:
    for op in objects:
        if type(op).__name__ == "CustomOpDef":
            for args in cases:
                torch.library.opcheck(op, devices.prepare(args, "cpu"))


def _saved_by(model: Any, granted: Callable[[tuple], int] | None) -> Callable[..., int]:
    """A budget of bytes saved for backward: what `model` saves on the same arguments, and what
    the contract grants besides."""
    def budget(*args: Any) -> int:
        copies = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                  for a in args]
        with contextlib.redirect_stderr(io.StringIO()):
            saved = record(model, *copies).nbytes
        return saved + (granted(args) if granted else 0)

    return budget


def _ours(objects, cases, reference, options) -> None:
    for fn in objects:
        check_function(fn, cases, reference, seed=SEED, **options)


def _course(graded: list[str], ns: dict) -> None:
    for n, source in enumerate(graded):
        with inputs.seeded(SEED + n):
            exec(compile(source, "<graded cell>", "exec"), ns)


def run_target(target: Target, base: dict, answers_per_kind: int | None) -> list[Row]:
    nb = nbformat.read(authoring.solution_path(target.slug), as_version=4)
    exercise = next(e for e in exercises(nb) if e.answer_id == target.exercise)
    graded = [model_solution(c.source) for c in nb.cells
              if c.metadata.get("nbgrader", {}).get("grade_id") in exercise.graded]
    known = for_notebook(target.slug)
    answers = [("model", "the model solution", exercise.solution, None)]
    for kind, found in (("wrong", known.MUTANTS), ("right", known.VARIANTS)):
        mine = [a for a in found if a.exercise == target.exercise][:answers_per_kind]
        answers += [(kind, a.label, a.apply(exercise.solution), a.device) for a in mine]
    cases = target.spec.cases(inputs.generator(SEED))
    model = _objects(target, _answer_namespace(base, target.slug, exercise.solution))
    first = {"double_backward": target.spec.double_backward, "surrogate_gradient": target.spec.surrogate_gradient,
             "autograd_in_backward": target.spec.autograd_in_backward, "keeps_dtype": target.spec.keeps_dtype,
             "needs_input_grad": target.exercise in NEEDS_INPUT_GRAD, **target.options}
    budget = _saved_by(model[0], GRANTED.get(target.exercise))
    given = {**first, "max_saved_bytes": budget} if target.exercise in SAVED else first
    rows = []
    for kind, label, source, device in answers:
        row = Row(target.exercise, kind, label, device)
        try:
            ns = _answer_namespace(base, target.slug, source)
            objects = _objects(target, ns)
        except Exception as error:  # an answer that does not even define its Function
            row.bug = "does not run"
            row.tools = {tool: Verdict(True, f"{type(error).__name__}: {error}") for tool in TOOLS}
            rows.append(row)
            continue
        row.tools = _verdicts(target, graded, ns, objects, cases, first, given)
        row.bug = bug_class(row.tools["course"].message) if row.tools["course"].caught else ""
        rows.append(row)
        print(f"{target.slug} {target.exercise} {kind}: {label} — course {_mark(row, 'course')}, gradcheck "
              f"{_mark(row, 'gradcheck')}, alone {_mark(row, 'alone')}, reference {_mark(row, 'reference')}",
              file=sys.stderr)
    return rows


TOOLS = ("course", "gradcheck", "opcheck", "alone", "reference")


def _verdicts(target: Target, graded: list[str], ns: dict, objects: list[Any], cases: list[tuple], first: dict,
              given: dict) -> dict[str, Verdict]:
    """Each tool's verdict on one answer (`first`: check_function's options without a
    reference; `given`: with one)."""
    ops = any(type(o).__name__ == "CustomOpDef" for o in objects)
    return {
        "course": _timed(lambda: _course(graded, ns)),
        "gradcheck": _timed(lambda: _stock(objects, cases, target.spec.double_backward)),
        "opcheck": _timed(lambda: _opcheck(objects, cases)) if ops else Verdict(message="n/a"),
        "alone": _timed(lambda: _ours(objects, cases, None, first), ours=True),
        "reference": _timed(lambda: _ours(objects, cases, target.spec.reference, given), ours=True),
    }


def _mark(row: Row, tool: str) -> str:
    verdict = row.tools[tool]
    return "crashed" if verdict.crashed else "caught" if verdict.caught else "passed"


# --- The table ---------------------------------------------------------------------------------

def table(rows: list[Row]) -> str:
    wrong = [r for r in rows if r.kind == "wrong" and r.bug not in ("", "does not run")]
    classes = sorted({r.bug for r in wrong}, key=lambda c: [n for n, _ in CLASSES].index(c)
                     if c in dict(CLASSES) else len(CLASSES))
    header = ("| bug class (the course's message) | known wrong | gradcheck + gradgradcheck | opcheck | "
              "check_function, no reference | with a reference |")
    lines = [header, "|---|---|---|---|---|---|"]
    for name in classes + ["all"]:
        mine = [r for r in wrong if name in ("all", r.bug)]
        ops = [r for r in mine if r.tools["opcheck"].message != "n/a"]
        cells = [str(len(mine)), *(str(sum(r.tools[t].caught for r in mine)) for t in ("gradcheck",)),
                 f"{sum(r.tools['opcheck'].caught for r in ops)} of {len(ops)}" if ops else "—",
                 *(str(sum(r.tools[t].caught for r in mine)) for t in ("alone", "reference"))]
        lines.append(f"| {'**all**' if name == 'all' else name} | " + " | ".join(cells) + " |")
    right = [r for r in rows if r.kind in ("right", "model")]
    lines.append(f"| false alarms on {len(right)} right answers | | "
                 + " | ".join(str(sum(r.tools[t].caught for r in right)) for t in ("gradcheck", "opcheck", "alone",
                                                                                    "reference")) + " |")
    checked = [r for r in rows if r.bug != "does not run"]
    cpu = {t: sum(r.tools[t].cpu for r in checked) / max(len(checked), 1) for t in TOOLS}
    lines.append(f"| CPU s per answer (mean) | | {cpu['gradcheck']:.3f} | "
                 f"{cpu['opcheck']:.3f} | {cpu['alone']:.3f} ({cpu['alone'] / cpu['gradcheck']:.1f}×) | "
                 f"{cpu['reference']:.3f} ({cpu['reference'] / cpu['gradcheck']:.1f}×) |")
    missed = [r for r in wrong if not r.tools["reference"].caught]
    notes = [f"{len(rows)} answers of {len({r.exercise for r in rows})} exercises; the course's checks (the "
             f"notebooks' graded cells) catch {len(wrong)} of the wrong ones here (the others: a device bug only "
             f"a GPU shows, or a mistake of the notebook outside the Function)."]
    if missed:
        notes.append("Caught by the course, not by check_function with a reference: " + "; ".join(
            f"{r.exercise} / {r.label} ({r.bug})" for r in missed) + ".")
    crashed = [r for r in rows if any(v.crashed for v in r.tools.values())]
    if crashed:
        notes.append("check_function crashed on: " + "; ".join(f"{r.exercise} / {r.label}" for r in crashed) + ".")
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exercise", action="append", default=[], metavar="GRADE_ID",
                        help="only these exercises (repeatable; default: every one)")
    parser.add_argument("--answers", type=int, default=None, metavar="N",
                        help="at most N wrong and N right known answers per exercise (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a notebook's setup cell does; and CPU seconds of one thread compare
    targets = [t for t in TARGETS if not args.exercise or t.exercise in args.exercise]
    rows: list[Row] = []
    for slug in dict.fromkeys(t.slug for t in targets):
        base = namespace(slug)
        for target in (t for t in targets if t.slug == slug):
            rows += run_target(target, base, args.answers)
    text = table(rows)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "function_check.md").write_text(text)
    (RESULTS / "function_check.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
