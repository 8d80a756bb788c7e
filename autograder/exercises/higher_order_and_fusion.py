"""Checks for notebook 02_higher_order_and_fusion: Hessian-vector products on the tape, and a
fused operation that must be right to second order.

They use the tape machinery of :mod:`autograder.exercises.tape_autograd` (transcripts in
the student's process, judges here); see its docstring. The quizzes (2.2, 2.4) are checked
with :func:`autograder.checks.answers.check_answers`.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Sequence

import torch

from ..checks import inputs
from ..student import probe, tape
from ..student.report import passed, quiet, show
from .tape_autograd import (
    OpCase,
    _close,
    _draw,
    _entry_reports,
    _fail_error,
    _inputs,
    _judge_cases,
    _program_cases,
    _same,
    _value,
    answering,
    random_program,
)

ZERO_HVP_CAUSE = (
    "None means 'known to be zero': when f is linear in x, the first gradient does not depend on x and "
    "the second grad returns None; pass it on (or a zero), never a non-zero value."
)


def check_hvp(hvp: Callable[..., Any], *, functions: Sequence[str] = tuple(tape.HVP_FUNCTIONS),
              seed: int | None = 0) -> None:
    """`hvp(f, x, v)`: the Hessian of the scalar f at x times v, using grad twice."""
    __tracebackhide__ = True
    generator = inputs.generator(seed)
    with quiet(), answering(tape.NOTEBOOK_OPS):  # f's operations are stand-ins; hvp is under test
        for name in functions:
            f = tape.HVP_FUNCTIONS[name]
            size = (3, 3) if "@" in name else (4,)
            x_t, v_t = (torch.randn(size, generator=generator, dtype=torch.float64) for _ in range(2))
            context = [f"f(x) = {name}", f"x = {show(x_t)}", f"v = {show(v_t)}"]
            transcript = probe.invoke(tape.hvp_transcript, hvp, f, x_t, v_t)
            if transcript["error"]:
                _fail_error("hvp", transcript["error"], context)
            got = _value(transcript["result"], "H v", "hvp")
            want = torch.autograd.functional.hvp(f, x_t, v_t)[1]
            _same("hvp", "H v", got, want, context,
                  cause=lambda f=f, x_t=x_t, v_t=v_t, got=got, want=want: _hvp_cause(f, x_t, v_t, got, want))
    passed(f"hvp: Hessian-vector products of {len(functions)} functions ({', '.join(functions)}) agree with "
           "torch.autograd.functional.hvp.")


def _hvp_cause(f: Callable[[Any], Any], x: torch.Tensor, v: torch.Tensor, got: torch.Tensor | None,
               want: torch.Tensor) -> str:
    """The likely misconception behind a wrong H v (worked out for a failure only)."""
    if not bool(want.any()):
        return ZERO_HVP_CAUSE
    if got is not None:
        first = torch.autograd.functional.vjp(f, x)[1]  # not torch.func: it loads torch._dynamo (~1 s)
        if _close(got, first):
            return ("that is the gradient of f, not the Hessian times v: differentiate again, the sum of "
                    "(gradient * v).")
        if _close(got, torch.autograd.functional.hvp(f, x, torch.ones_like(v))[1]):
            return ("that is H times a vector of ones, the gradient of sum(gradient): multiply the gradient by v "
                    "before summing it.")
        if _close(got, torch.autograd.functional.hvp(f, x, 2 * first)[1]):
            return ("that is the gradient of sum(gradient * gradient) = 2 H grad(f): multiply the gradient by v, "
                    "not by itself.")
    return ("Hv = d/dx sum(grad(f)(x) * v): the first gradient must stay a Variable on the tape (no `.value`), "
            "then be multiplied by v, summed, and differentiated with grad.")


ESCAPE_CAUSE = (
    "the intermediate exp(a) escapes: propagate uses it, but the tape does not know it depends "
    "on a. Declare it as a second output of the entry (and add its incoming gradient, which may "
    "be None), or recompute it inside propagate from a with Variable operations (`a.exp()`); a "
    "new `Variable(...)` made from a tensor is an escaped value too."
)
EXP_MUL_SHAPES = [(3,), (2, 3)]


def check_exp_mul(operator_exp_mul: Callable[..., Any], *, programs: int = 0, seed: int | None = 0) -> None:
    """`exp_mul(a, b) = exp(a) * b` as one entry: its value, what its propagate returns for
    every combination of output gradients, and gradients of those gradients."""
    __tracebackhide__ = True
    rng = random.Random(inputs.seed_of(seed))
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    cases = []
    for size in EXP_MUL_SHAPES:
        a, b = (torch.rand(size, generator=generator, dtype=torch.float64) - 0.5 for _ in range(2))
        cases.append(OpCase("exp_mul", [a, b], [0, 1], ["a", "b"], [_draw(generator, *size) for _ in range(3)],
                            [_draw(generator, *size) for _ in range(2)]))
    for _ in range(programs):
        program = random_program(["add", "mul", "exp_mul", "sin"], 6, rng)
        cases += _program_cases(program, _inputs(program, rng), ["exp_mul"], generator)
    with quiet(), answering(()):
        _judge_cases(cases, _entry_reports(operator_exp_mul, ["exp_mul"], cases), ESCAPE_CAUSE)
    extra = f", also at every use in {programs} random programs" if programs else ""
    passed("exp_mul: values, gradients (for every combination of output gradients, None included) and gradients "
           "of gradients are right on shapes " + ", ".join(map(str, EXP_MUL_SHAPES)) + extra + ".")
