"""What the instructor sees: a progress bar, a summary table, grade plots and a status file."""
from __future__ import annotations

import csv
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, AbstractSet, Any

import nbformat
from nbgrader import utils
from nbgrader.api import Gradebook, MissingEntry
from rich.table import Table

from .discover import Submission, time_source, time_sources

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
    assignments = sorted({o.submission.assignment for o in outcomes} | {s.assignment for s in skipped})
    table.add_column("assignment", no_wrap=True, min_width=max(map(len, assignments), default=0))  # (never cut)
    for column in ("graded", "flagged", "failed", "late", "skipped (done before)", "time"):
        table.add_column(column, justify="right")
    for assignment in assignments:
        counts = Counter(o.status for o in outcomes if o.submission.assignment == assignment)
        late = sum(o.submission.seconds_late > 0 for o in outcomes if o.submission.assignment == assignment)
        busy = sum(o.seconds for o in outcomes if o.submission.assignment == assignment)
        table.add_row(
            assignment, str(counts["graded"]), str(counts["flagged"]), str(counts["failed"]), str(late),
            str(sum(s.assignment == assignment for s in skipped)), f"{busy:.1f} s",
        )
    table.caption = (f"{len(outcomes)} graded in {seconds:.1f} s; flagged and failed submissions need a "
                     "person (formgrader).")
    return table


TIME_FROM = {"lms": "LMS upload", "student": "student's clock", "": "none"}  # where a hand-in's time came from
LMS_SAYS = {"yes": "late", "no": "on time", "": ""}


def late_work(outcomes: list[Outcome]) -> Table | None:
    """The submissions graded late in this run (nbgrader's due date and extensions), with the
    penalty nbgrader took and where the time came from; also those the LMS marks late though
    their time is not. None when there are none."""
    late = [o for o in outcomes if o.submission.seconds_late > 0 or o.submission.lms_late == "yes"]
    if not late:
        return None
    table = Table(title="Late hand-ins", title_justify="left")
    table.add_column("submission", no_wrap=True, min_width=max(len(o.submission.key) for o in late))
    for column in ("late by", "penalty", "time from", "LMS says"):
        table.add_column(column, justify="left" if column in ("time from", "LMS says") else "right", no_wrap=True)
    for o in late:
        s = o.submission
        table.add_row(s.key, late_by(s.seconds_late) or "on time", f"{s.late_penalty:g}", TIME_FROM[s.time_from],
                      LMS_SAYS.get(s.lms_late, ""))
    table.caption = ("\"student's clock\": the hand-in's own timestamp.txt, which the student can set; in a "
                     "dispute, the LMS's record counts.")
    return table


def late_by(seconds: float) -> str:
    """How late, as "0:30:00" or "2 days, 3:04:05"; "" when on time."""
    return str(timedelta(seconds=round(seconds))) if seconds > 0 else ""


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


def bin_width(top: float, whole: bool = True, most_bins: int = 30) -> float:
    """The width of the bars: 1, 2 or 5 times a power of ten (0.5 when points are not all
    whole), the smallest that needs at most `most_bins` bars from 0 to `top`."""
    width = 1.0 if whole else 0.5
    while max(top, 1.0) / width > most_bins:
        width = next(w * 10 ** k for k in range(-1, 10) for w in (1, 2, 5) if w * 10 ** k > width)
    return width


def bin_edges(top: float, width: float, exact: bool) -> list[float]:
    """Bar edges that show a full score as full. `exact` (every total a multiple of `width`):
    a bar centred on each score from 0 to `top`. Else bars from 0 that each hold the totals
    from their left edge up to the next, and the full score a bar of its own."""
    if exact:
        return [(k - 0.5) * width for k in range(round(top / width) + 2)]
    return [k * width for k in range(math.ceil(top / width))] + [top, top + width]


def plot(db_url: str, course_id: str, assignment: str, source: Path, out: Path,
         failed: AbstractSet[str] = frozenset()) -> Path | None:
    """The class's total points (bin_edges: the full score a bar of its own; stacked by status:
    graded, flagged for review, failed; mean and median marked) above each exercise's mean
    share of its points."""
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
    width = bin_width(found.top, all(float(t).is_integer() for t in [*totals, found.top]))
    exact = all(float(t / width).is_integer() for t in [*totals, found.top])
    edges = bin_edges(found.top, width, exact)
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
    top_ax.set_xlim(edges[0], edges[-1])
    # Each bar named by its score (exact), or by where it starts: at most 16 names, always the
    # last bar's, the full score.
    marks = [(lo + hi) / 2 for lo, hi in zip(edges, edges[1:])] if exact else edges[:-1]
    every = math.ceil(len(marks) / 16)
    names = [f"{mark:g}" if (len(marks) - 1 - k) % every == 0 else "" for k, mark in enumerate(marks)]
    names[-1] += "\nfull"
    top_ax.set_xticks(marks, names, fontsize=8)
    bars = f"a bar per score, in steps of {width:g}" if exact else f"each bar from its mark up to the next ({width:g})"
    top_ax.set_xlabel(f"total points (of {found.top:g}; {bars})")
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
    """Grades for an LMS import: one row per student of the gradebook, one column per graded
    assignment (one with a submission in the gradebook), in course order (by name: 01_...,
    02_...), of the points after nbgrader's late penalty (empty where nothing was submitted);
    then, for each graded assignment with late work, a column "ASSIGNMENT late": how late
    and the penalty taken.

    Only graded assignments: an empty column in Canvas's import creates an assignment of its
    name, and blanks a grade entered there by hand. Canvas's gradebook import reads exactly
    this shape (Student, ID, SIS User ID, SIS Login ID, Section, then one column per
    assignment; it lists a column named like no assignment, such as the late ones, for you to
    ignore or create). Moodle's CSV import takes any columns: map "SIS User ID" to the ID
    number (or "SIS Login ID" to the e-mail address), each assignment to its grade item, and
    a late column to Ignore or to the item's feedback. The names come from the roster
    (`nbgrader db student import roster.csv`); without one, Student is the student id. SIS
    Login ID is the e-mail where the roster has one.
    """
    graded = [a.name for a in sorted(gb.assignments, key=lambda a: a.name) if a.submissions]
    late = [a for a in graded if any(s.total_seconds_late > 0 for s in gb.assignment_submissions(a))]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(LMS_HEADER + graded + [f"{a} late" for a in late])
        for student in sorted(gb.students,
                              key=lambda s: ((s.last_name or "").lower(), (s.first_name or "").lower(), s.id)):
            name = ", ".join(part for part in (student.last_name, student.first_name) if part) or student.id
            found = {}
            for assignment in graded:
                try:
                    found[assignment] = gb.find_submission(assignment, student.id)
                except MissingEntry:
                    pass
            points = [f"{max(0.0, found[a].score - found[a].late_submission_penalty):g}" if a in found else ""
                      for a in graded]
            lateness = [_late_note(found[a]) if a in found else "" for a in late]
            writer.writerow([name, "", student.id, student.email or student.id, ""] + points + lateness)


def _late_note(submission: Any) -> str:
    """ "0:30:00 late, penalty 2" for a late submission (nbgrader's SubmittedAssignment), else ""."""
    late = late_by(submission.total_seconds_late)
    penalty = submission.late_submission_penalty
    return f"{late} late" + (f", penalty {penalty:g}" if penalty else "") if late else ""


# nbgrader export's columns, as `nbgrader export` writes them, then ours (at the end, so a
# reader of nbgrader's file reads this one).
NBGRADER_EXPORT = ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
                   "raw_score", "late_submission_penalty", "score", "max_score"]
GRADES_FIELDS = NBGRADER_EXPORT + ["seconds_late", "time_from", "lms_late"]


def write_grades(gb: Gradebook, out: Path, root: Path) -> None:
    """grades.csv: `nbgrader export`'s rows and columns, the same values as it writes them
    (quoted where a value holds a comma, which nbgrader's does not), then how many seconds
    late each submission is (nbgrader's count: due date and extensions), where its time came
    from ("lms": the LMS's upload time; "student": the hand-in's own timestamp.txt, written on
    the student's machine) and the LMS's own word on its lateness ("yes", "no"; empty where
    the LMS's download says nothing)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(GRADES_FIELDS)
        students = gb.students
        for assignment in gb.assignments:
            sources = time_sources(root, assignment.name)
            for student in students:
                row: list[Any] = [assignment.name, assignment.duedate, "", student.id, student.last_name,
                                  student.first_name, student.email, 0.0, 0.0, 0.0, assignment.max_score, "", "", ""]
                try:
                    submission = gb.find_submission(assignment.name, student.id)
                except MissingEntry:
                    pass
                else:
                    penalty, source = submission.late_submission_penalty, time_source(
                        sources, student.id, submission.timestamp)
                    row[2], row[7], row[8] = submission.timestamp, submission.score, penalty
                    row[9] = max(0.0, submission.score - penalty)
                    row[11:] = [f"{submission.total_seconds_late:.0f}", source.time_from, source.lms_late]
                writer.writerow(["" if value is None else str(value) for value in row])


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
