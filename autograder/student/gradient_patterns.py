"""Notebook 04_gradient_patterns in the student's process: calling the student's
unbroadcast, and the course's stand-in for it while Affine is graded."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from . import probe

# Stands in for the notebook's unbroadcast while Affine is graded (exercise 4.3 grades
# the student's own): torch's sum_to_size.
sum_to_size = probe.reference(f"{__name__}:sum_to_size", lambda grad, shape: grad.sum_to_size(tuple(shape)))


@probe.procedure
def run_unbroadcast(student: Any, grad: torch.Tensor, shape: tuple, as_size: bool) -> dict:
    """Call the student's unbroadcast (with `shape` as a torch.Size if `as_size`, as in a
    backward). Whether it changed grad is reported by the student's process: best effort."""
    before = None if grad.device.type == "meta" else grad.clone()
    try:
        got = student(grad, torch.Size(shape) if as_size else shape)
    except Exception as exc:  # the student's code may raise anything
        error = probe.ProbeError.of("call", exc)
        return {"returned": None, "modified": False, "error": asdict(error)}
    returned = got if isinstance(got, torch.Tensor) else type(got).__name__
    return {"returned": returned, "modified": before is not None and not torch.equal(grad, before), "error": None}
