"""What the instructor sees: a progress bar, a summary table, grade plots and a status file."""
from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import nbformat
from nbgrader import utils
from nbgrader.api import Gradebook, MissingEntry
from rich.table import Table

from .discover import Submission


@dataclass
class Outcome:
    """How one submission went."""

    submission: Submission
    status: str  # "graded", "flagged" (graded, but a person should look) or "failed" (not fully run)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0  # wall time of its notebooks' runs
    code_seconds: float = 0.0  # of which running cells
    code_cpu: float = 0.0  # CPU time of its cells
    checks_cpu: float = 0.0  # CPU time of its test cells: the grader's judging and the child's answers
    engine_cpu: float = 0.0  # the engine's own CPU for it: preparing, forking, confining, saving
    saved: bool = True  # its results are in the gradebook and autograded/
    graded_at: datetime = field(default_factory=datetime.now)  # when its results were saved


def summary(outcomes: list[Outcome], skipped: list[Submission], seconds: float, isolation: str) -> Table:
    table = Table(title=f"Grading summary ({isolation})", title_justify="left")
    for column in ("assignment", "graded", "flagged", "failed", "skipped (done before)", "time"):
        table.add_column(column, justify="left" if column == "assignment" else "right")
    assignments = sorted({o.submission.assignment for o in outcomes} | {s.assignment for s in skipped})
    for assignment in assignments:
        counts = Counter(o.status for o in outcomes if o.submission.assignment == assignment)
        busy = sum(o.seconds for o in outcomes if o.submission.assignment == assignment)
        table.add_row(
            assignment, str(counts["graded"]), str(counts["flagged"]), str(counts["failed"]),
            str(sum(s.assignment == assignment for s in skipped)), f"{busy:.1f} s",
        )
    table.caption = f"{len(outcomes)} graded in {seconds:.1f} s; flagged and failed submissions need a person (formgrader)."
    return table


def problems(outcomes: list[Outcome]) -> Table:
    table = Table(title="Flagged for manual review", title_justify="left", show_lines=True)
    for column in ("submission", "status", "why"):
        table.add_column(column)
    for outcome in outcomes:
        if outcome.problems:
            table.add_row(outcome.submission.key, outcome.status, "\n".join(outcome.problems))
    return table


def exercises(nb: nbformat.NotebookNode) -> dict[str, list[str]]:
    """Graded cells grouped by the answer cell before them: {exercise: [grade_id, ...]}."""
    groups: dict[str, list[str]] = {}
    current = "before the first answer"
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if utils.is_solution(cell):
            current = meta["grade_id"]
        if utils.is_grade(cell):
            groups.setdefault(current, []).append(meta["grade_id"])
    return groups


def plot(db_url: str, course_id: str, assignment: str, source: Path, out: Path) -> Path | None:
    """A histogram of the class's points per exercise, one panel each (PNG)."""
    from matplotlib.figure import Figure  # no pyplot: nothing global, nothing interactive
    from matplotlib.ticker import MaxNLocator

    panels: list[tuple[str, list[float], float]] = []
    with Gradebook(db_url, course_id) as gb:
        for notebook in sorted(source.glob("*.ipynb")):
            groups = exercises(nbformat.read(notebook, as_version=4))
            try:
                rows = gb.notebook_submissions(notebook.stem, assignment)
            except MissingEntry:
                continue
            scores = [{g.name: (g.score, g.max_score) for g in row.grades} for row in rows]
            for exercise, cells in groups.items():
                points = [sum(s[c][0] for c in cells if c in s) for s in scores]
                panels.append((exercise, points, sum(scores[0][c][1] for c in cells if c in scores[0]) if scores else 0))
    if not panels or not panels[0][1]:
        return None
    figure = Figure(figsize=(3.2 * len(panels), 2.8))
    axes = figure.subplots(1, len(panels), squeeze=False)
    for ax, (exercise, points, top) in zip(axes[0], panels):
        ax.hist(points, bins=max(int(top), 1) * 2, range=(0, max(top, 1)), color="#4c72b0", edgecolor="white")
        ax.set_title(exercise, fontsize=10)
        ax.set_xlabel(f"points (of {top:g})")
        ax.set_ylabel("students")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    figure.suptitle(f"{assignment}: {len(panels[0][1])} submissions")
    figure.subplots_adjust(left=0.5 / figure.get_figwidth(), right=0.98, bottom=0.2, top=0.78, wspace=0.45)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    return out


def write_status(outcomes: list[Outcome], out: Path) -> None:
    """Every submission graded in this run, with its status and reasons (CSV)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "status", "graded_at", "seconds", "code_seconds", "code_cpu", "checks_cpu",
                         "engine_cpu", "problems"])
        for o in outcomes:
            times = (o.graded_at.isoformat(), f"{o.seconds:.3f}", f"{o.code_seconds:.3f}", f"{o.code_cpu:.3f}",
                     f"{o.checks_cpu:.3f}", f"{o.engine_cpu:.3f}")
            writer.writerow([o.submission.student, o.status, *times, " | ".join(o.problems)])
