"""What the instructor sees: a progress bar, a summary table, grade plots and a status file."""
from __future__ import annotations

import csv
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, AbstractSet

import nbformat
from nbgrader import utils
from nbgrader.api import Gradebook, MissingEntry
from rich.table import Table

from .discover import Submission

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass
class Outcome:
    """How one submission went."""

    submission: Submission
    status: str  # "graded", "flagged" (graded, but a person should look) or "failed" (not fully run)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0  # wall time of its notebooks' runs
    code_seconds: float = 0.0  # of which running cells
    code_cpu: float = 0.0  # CPU time of its cells, and of the programs they ran (dot)
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
    table.caption = (f"{len(outcomes)} graded in {seconds:.1f} s; flagged and failed submissions need a "
                     "person (formgrader).")
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


STATUS_COLOURS = {"graded": "#4c72b0", "flagged": "#dd8452", "failed": "#c44e52"}
STATUS_LABELS = {"graded": "graded", "flagged": "flagged for review", "failed": "failed (not fully run)"}


@dataclass
class Scores:
    """One assignment's results, per student: total, per exercise, and status."""

    totals: dict[str, float]  # student -> points over all notebooks of the assignment
    top: float  # the most points there are
    exercises: dict[str, tuple[list[float], float]]  # exercise -> (points per student, its most)
    statuses: dict[str, str]  # student -> "graded", "flagged" or "failed"


def scores(db_url: str, course_id: str, assignment: str, source: Path,
           failed: AbstractSet[str] = frozenset()) -> Scores:
    """What the gradebook holds of `assignment`; `failed`: students whose last run failed
    (the gradebook flags them like any other flagged submission)."""
    totals: dict[str, float] = {}
    top = 0.0
    per_exercise: dict[str, tuple[list[float], float]] = {}
    statuses: dict[str, str] = {}
    with Gradebook(db_url, course_id) as gb:
        for notebook in sorted(source.glob("*.ipynb")):
            groups = exercises(nbformat.read(notebook, as_version=4))
            try:
                rows = gb.notebook_submissions(notebook.stem, assignment)
            except MissingEntry:
                continue
            rows = sorted(rows, key=lambda row: row.student.id)
            grades = [{g.name: (g.score, g.max_score) for g in row.grades} for row in rows]
            for row, graded in zip(rows, grades):
                student = row.student.id
                totals[student] = totals.get(student, 0.0) + sum(score for score, _ in graded.values())
                if row.flagged and statuses.get(student) != "failed":
                    statuses[student] = "flagged"
                statuses.setdefault(student, "graded")
            if grades:
                top += sum(most for _, most in grades[0].values())
            for exercise, cells in groups.items():
                points = [sum(g[c][0] for c in cells if c in g) for g in grades]
                most = sum(grades[0][c][1] for c in cells if c in grades[0]) if grades else 0.0
                per_exercise[f"{notebook.stem}: {exercise}" if len(list(source.glob("*.ipynb"))) > 1
                             else exercise] = (points, most)
    for student in failed & set(statuses):
        statuses[student] = "failed"
    return Scores(totals, top, per_exercise, statuses)


def even_bins(top: float, most_bins: int = 20) -> tuple[list[float], float]:
    """Bin edges from 0 to (at least) `top`, all of one width: 1, 2 or 5 times a power of
    ten, the smallest that needs at most `most_bins` bins (0.5 when points come in halves)."""
    top = max(top, 1.0)
    width = 0.5
    while top / width > most_bins:
        width = next(w * 10 ** k for k in range(-1, 10) for w in (1, 2, 5) if w * 10 ** k > width)
    count = int(-(-top // width))
    return [i * width for i in range(count + 1)], width


def plot(db_url: str, course_id: str, assignment: str, source: Path, out: Path,
         failed: AbstractSet[str] = frozenset()) -> Path | None:
    """The class's total points (bins of one width, stacked by status: graded, flagged for
    review, failed; mean and median marked) above each exercise's mean share of its points."""
    found = scores(db_url, course_id, assignment, source, failed)
    if not found.totals:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    draw(found, assignment).savefig(out, dpi=100)
    return out


def draw(found: Scores, assignment: str) -> Figure:
    """The figure `plot` saves."""
    from matplotlib.figure import Figure  # no pyplot: nothing global, nothing interactive
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    students = sorted(found.totals)
    totals = [found.totals[s] for s in students]
    edges, width = even_bins(found.top)
    figure = Figure(figsize=(9, 7.5))
    top_ax, bottom_ax = figure.subplots(2, 1, gridspec_kw={"height_ratios": [3, 2]})
    stacks, labels, colours = [], [], []
    for status in ("graded", "flagged", "failed"):
        points = [t for s, t in zip(students, totals) if found.statuses.get(s) == status]
        stacks.append(points)
        labels.append(f"{STATUS_LABELS[status]} ({len(points)})")
        colours.append(STATUS_COLOURS[status])
    top_ax.hist(stacks, bins=edges, stacked=True, color=colours, label=labels, edgecolor="white")
    mean, median = statistics.fmean(totals), statistics.median(totals)
    top_ax.axvline(mean, color="black", linestyle="-", linewidth=1.5, label=f"mean {mean:.1f}")
    top_ax.axvline(median, color="#8c8c8c", linestyle=(0, (4, 3)), linewidth=2.5, zorder=3, label=f"median {median:g}")
    top_ax.set_xlim(0, edges[-1])
    top_ax.set_xlabel(f"total points (of {found.top:g}; bins of {width:g})")
    top_ax.set_ylabel("submissions")
    top_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    # Beside the axes, never over them: no bar is hidden, however the totals fall.
    top_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False, borderaxespad=0)
    top_ax.set_title(f"{assignment}: {len(totals)} submissions", loc="left")
    names = list(found.exercises)
    shares = [statistics.fmean(p) / most if most and p else 0.0 for p, most in found.exercises.values()]
    bottom_ax.barh(range(len(names)), shares, color=STATUS_COLOURS["graded"])
    bottom_ax.set_yticks(range(len(names)), [f"{n} (of {found.exercises[n][1]:g})" for n in names], fontsize=8)
    bottom_ax.invert_yaxis()
    bottom_ax.set_xlim(0, 1)
    bottom_ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    bottom_ax.set_xlabel("mean share of the exercise's points")
    for y, share in enumerate(shares):
        bottom_ax.text(min(share, 0.9) + 0.01, y, f"{share:.0%}", va="center", fontsize=8)
    figure.tight_layout()
    figure.set_layout_engine(None)  # laid out: savefig need not lay it out again (a pass of a third of its cost)
    return figure


LMS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def write_lms(gb: Gradebook, out: Path) -> None:
    """Grades for an LMS import: one row per student of the gradebook, one column of total
    points per assignment (empty where nothing was submitted).

    Canvas's gradebook import reads exactly this shape (Student, ID, SIS User ID, SIS Login
    ID, Section, then one column per assignment; a column named like no assignment creates
    one). Moodle's CSV import takes any columns: map "SIS User ID" to the ID number (or
    "SIS Login ID" to the e-mail address) and each assignment to its grade item. The
    names come from the roster (`nbgrader db student import roster.csv`); without one,
    Student is the student id. SIS Login ID is the e-mail where the roster has one.
    """
    assignments = [a.name for a in sorted(gb.assignments, key=lambda a: (a.duedate is None, a.duedate, a.name))]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(LMS_HEADER + assignments)
        for student in sorted(gb.students,
                              key=lambda s: ((s.last_name or "").lower(), (s.first_name or "").lower(), s.id)):
            name = ", ".join(part for part in (student.last_name, student.first_name) if part) or student.id
            row = [name, "", student.id, student.email or student.id, ""]
            for assignment in assignments:
                try:
                    row.append(f"{gb.find_submission(assignment, student.id).score:g}")
                except MissingEntry:
                    row.append("")
            writer.writerow(row)


def read_failed(status_csv: Path) -> set[str]:
    """Students whose submission failed in the run that wrote `status_csv` (last-run.csv)."""
    try:
        with open(status_csv, newline="") as f:
            return {row["student"] for row in csv.DictReader(f) if row.get("status") == "failed"}
    except OSError:
        return set()


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
