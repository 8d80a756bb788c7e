"""The records the grader's modules pass to one another: what to grade (`Options`), one
notebook to run (`Program`), what happened to it (`Run`, `Cell`) and each test cell's
trusted verdict (`Verdict`). Kept apart so that no module imports another for its types."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..isolation.limits import Limits

if TYPE_CHECKING:
    from .verdicts import Judge


def is_test_cell(cell: Any) -> bool:
    """Graded test cells, and locked `check_*` cells (visible checks that import names)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    if cell.get("cell_type") != "code" or meta.get("solution"):
        return False
    return bool(meta.get("grade")) or (bool(meta.get("locked")) and str(meta.get("grade_id", "")).startswith("check"))


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass
class Options:
    root: Path
    assignments: list[str] = field(default_factory=list)  # empty: all
    students: list[str] = field(default_factory=list)  # empty: all
    force: bool = False
    jobs: int = field(default_factory=cores)
    limits: Limits = field(default_factory=Limits)
    sandbox: bool = True
    db_url: str | None = None
    feedback: bool = False  # also run nbgrader's feedback step for what was graded


@dataclass
class Program:
    """One notebook to run: its code cells in order, the files it expects beside it, and
    the judge of its test cells (None: the notebook's own test outputs are the grade)."""

    cells: list[tuple[int, str, str]]  # (cell index in the notebook, label, source)
    files: dict[str, bytes] = field(default_factory=dict)
    judge: Judge | None = None
    compiles: bool = False  # it calls torch.compile: its worker pays the compiler's start once, first


@dataclass
class Verdict:
    grade_id: str
    score: float
    max_score: float
    graded: bool  # a graded cell (else a visible check that scores nothing)
    outputs: list[dict[str, Any]]  # nbformat outputs: what the checks printed, then the failure or the result
    seed: int | None = None  # what its checks' inputs were drawn from (inputs.seeded), to replay it
    flags: list[str] = field(default_factory=list)  # what its checks saw that a person should look at
    # A hidden test cell's outputs with every value shown (Judge.reveal: for the instructor only, never written)
    revealed: list[dict[str, Any]] | None = None

    @property
    def report(self) -> str:
        """The outputs as text (for messages)."""
        return as_text(self.outputs)


def cpu_seconds(value: Any) -> float:
    """CPU seconds as a student's process reports them (for statistics only): a finite
    number within an hour, or 0 (JSON carries NaN and Infinity too)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return min(max(float(value), 0.0), 3600.0)
    return 0.0


def cut(text: str, limit: int) -> str:
    """`text` within `limit` characters, saying so when it was cut (what a student's process
    sent is written into notebooks and the gradebook only so)."""
    return text if len(text) <= limit else f"{text[:limit]}… [cut: {len(text) - limit} more characters]"


def as_text(outputs: list[dict[str, Any]]) -> str:
    """What a list of nbformat outputs says, as text."""
    return "".join(o.get("text", "") if o["output_type"] == "stream" else
                   f"{o['ename']}: {o['evalue']}\n" if o["output_type"] == "error" else
                   f"{o.get('data', {}).get('text/plain', '')}\n" for o in outputs)


@dataclass
class Cell:
    outputs: list[dict[str, Any]]
    execution_count: int
    seconds: float  # wall time, measured here
    cpu: float  # CPU time, as the notebook's process reports it (for statistics only)


@dataclass
class Run:
    """What happened to one notebook."""

    cells: dict[int, Cell] = field(default_factory=dict)  # by cell index, for the cells that finished
    verdicts: dict[int, Verdict] = field(default_factory=dict)  # of the graded test cells, by cell index
    seeds: dict[str, int | None] = field(default_factory=dict)  # of every test cell judged, by grade_id (to replay it)
    changed: list[str] = field(default_factory=list)  # what the notebook changed in the modules the probes rely on
    worth_a_look: list[str] = field(default_factory=list)  # what it did that earned nothing, yet a person should see
    tampering: str | None = None  # what the notebook's process sent that no honest child sends
    limits_reached: list[str] = field(default_factory=list)  # limits it ran into, though it ran on
    failure: str | None = None  # why the notebook did not run to the end
    stopped_at: int | None = None  # index of the cell running when it stopped
    seconds: float = 0.0  # wall time, from fork to exit
    cpu: float = 0.0  # CPU seconds of the child
    judge_cpu: float = 0.0  # CPU seconds the grader spent running its test cells
    probe_cpu: float = 0.0  # CPU seconds the child spent answering them (as it says: statistics only)
    maxrss: int = 0  # peak resident memory of the child, KiB

    @property
    def code_seconds(self) -> float:
        return sum(c.seconds for c in self.cells.values())

    @property
    def code_cpu(self) -> float:
        return sum(c.cpu for c in self.cells.values())
