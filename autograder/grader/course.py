"""Grading one course with warm workers: the trusted steps, in order.

Discover the submissions; prepare, run and save them interleaved (this thread prepares and
saves, so only it touches the gradebook; each worker's thread in the pool drives its
notebooks and judges their test cells); then export grades.csv, plot each
assignment, write the status files and, if asked, nbgrader's feedback.
"""
from __future__ import annotations

import functools
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.coursedir import CourseDirectory
from rich.console import Console
from sqlalchemy.exc import OperationalError
from traitlets.config import Config

from ..checks import inputs
from ..isolation.limits import Limits
from ..student.probe import first_line
from . import class_report, discover, feedback, nbgrader_adapter, progress, results, secret, untrusted
from .pool import Workers
from .preflight import FAILED, GradingError
from .prepare import Prepared, Preparer, Rejected
from .records import Options, Program, Run
from .verdicts import Judge
from .writer import Writer

REPORTS = "reports"  # per-assignment plots and status files, in the course root
GRADES_CSV = "grades.csv"  # nbgrader export's default name
LMS_CSV = "grades-lms.csv"  # one row per student, one column per assignment: Canvas's and Moodle's import


Graded = tuple[list[class_report.Outcome], list[discover.Submission]]  # (outcomes, submissions skipped as done)


def grade_submissions(options: Options, config: Config, pool: Workers, console: Console) -> Graded:
    """Grade what `options` asks for with `pool`'s workers; (outcomes, submissions skipped as done)."""
    with nbgrader_adapter.applied():
        return _grade_submissions(options, config, pool, console)


def _grade_submissions(options: Options, config: Config, pool: Workers, console: Console) -> Graded:
    coursedir = CourseDirectory(config=config)
    submissions = discover.find(coursedir, options.assignments, options.students)
    if not submissions:
        raise GradingError(
            f"no submissions found in {coursedir.submitted_directory}/STUDENT/ASSIGNMENT "
            "(collect them with `nbgrader collect` or `nbgrader zip_collect` first)"
        )
    known = _known_notebooks(coursedir, {s.assignment for s in submissions})
    key = _secret(options.root, console)
    skipped = [s for s in submissions if not options.force and discover.is_done(coursedir, s)]
    todo = [s for s in submissions if s not in skipped]
    outcomes: list[class_report.Outcome] = []
    if todo:
        released = Path(coursedir.format_path(coursedir.release_directory, ".", "."))
        with closing(Preparer(coursedir.db_url, coursedir.course_id, config, released)) as preparer, \
                closing(Writer(coursedir, config)) as writer:
            notebooks = {s.assignment: known[s.assignment] for s in todo}
            pool.preload(preparer.imports(notebooks),
                         preparer.compiles({todo[0].assignment: known[todo[0].assignment]}))
            outcomes = _grade_all(todo, known, pool, preparer, writer, console, options.limits, key)
    pool.close()  # the workers' memory and CPU go to what follows
    progress.phase("writing grades.csv, grades-lms.csv and the plots ...")
    graded = sorted({o.submission.assignment for o in outcomes})
    for assignment in graded:
        class_report.write_status(
            [o for o in outcomes if o.submission.assignment == assignment],
            options.root / REPORTS / assignment / "last-run.csv",
        )
    _export(coursedir, {s.assignment for s in submissions})  # its plots read the status files
    if options.feedback:  # graded now or before: feedback is for every submission that has none up to date
        wanted = sorted({s.assignment for s in submissions})
        progress.phase(f"writing feedback for {', '.join(wanted)} (nbgrader generate_feedback, hidden "
                       "tests cleared) ...")
        for assignment in feedback.generate(coursedir, config, wanted):
            console.print(f"[bold red]feedback failed for some submissions of {assignment}[/]")
        written = sum(1 for s in submissions if any(Path(coursedir.format_path(
            coursedir.feedback_directory, s.student, s.assignment)).glob("*.html")))
        console.print(f"Feedback: {written} of {len(submissions)} submissions have theirs in "
                      f"{coursedir.feedback_directory}/.")
    return outcomes, skipped


def _known_notebooks(coursedir: CourseDirectory, assignments: set[str]) -> dict[str, set[str]]:
    known = {}
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        for assignment in sorted(assignments):
            try:
                known[assignment] = {nb.name for nb in gb.find_assignment(assignment).notebooks}
            except MissingEntry:
                raise GradingError(
                    f"the assignment '{assignment}' is not in the gradebook: release it first "
                    "(`autograder release` or `nbgrader generate_assignment`)"
                ) from None
    return known


AHEAD = 2  # submissions prepared and queued per worker, so no worker waits for the grader


def _secret(root: Path, console: Console) -> bytes:
    """The course's grading secret (made on the first run)."""
    try:
        key, made = secret.load(root)
    except (OSError, ValueError) as error:
        raise GradingError(f"the course's grading secret {secret.path(root)} cannot be read or made ({error}): "
                           "free space or fix the permissions, restore it from your copy of the instructor's "
                           "files, or make a new one with `autograder secret --rotate` (grades from then on draw "
                           "other inputs)", FAILED) from None
    if made:
        console.print(f"Made the course's grading secret, {secret.path(root)}: keep it with the gradebook "
                      "(regrades draw the same inputs only with it).")
    return key


def _grade_all(todo: list[discover.Submission], known: dict[str, set[str]], pool: Workers, preparer: Preparer,
               writer: Writer, console: Console, limits: Limits, course_key: bytes) -> list[class_report.Outcome]:
    """Prepare, run and save, interleaved: this thread prepares and saves in turn, while the
    pool's threads run and judge."""
    waiting = iter(todo)
    running: dict[str, tuple[discover.Submission, list[Any]]] = {}  # key -> (submission, [NotebookResult | Prepared])
    spent: dict[str, float] = {}  # key -> CPU seconds preparing it
    outcomes: list[class_report.Outcome] = []
    limit = 2 * limits.timeout * max(len(known[s.assignment]) for s in todo)  # its notebooks, and judging them
    with progress.Tracker(console, len(todo), pool.size, limit, pool.running) as tracker:
        while True:
            while len(running) < AHEAD * pool.size and (submission := next(waiting, None)) is not None:
                cpu = time.thread_time()
                items = _prepare(submission, known[submission.assignment], preparer, writer.coursedir.ignore)
                spent[submission.key] = time.thread_time() - cpu
                running[submission.key] = (submission, items)
                pool.submit(submission.key, [
                    Program(p.code_cells(), submission.contents,
                            Judge.of(p.nb.cells,
                                     functools.partial(inputs.cell_seed, course_key, submission.assignment, p.name)),
                            preparer.compiles({submission.assignment: {p.name}}))
                    for p in items
                    if not isinstance(p, results.NotebookResult)
                ])
            if not running:
                return outcomes
            key, runs = pool.result()
            submission, items = running.pop(key)
            took = sum(r.seconds for r in runs)
            queue = iter(runs)
            notebook_results = [item if isinstance(item, results.NotebookResult) else _graded(item, next(queue))
                                for item in items]
            cpu = time.thread_time()
            try:
                outcome = _outcome(submission, _save(writer, submission, notebook_results))
            except OperationalError as error:  # the gradebook is locked or gone: this one waits for a rerun
                outcome = _outcome(submission, notebook_results)
                outcome.status, outcome.saved = "failed", False
                outcome.problems.append(f"not saved: the gradebook could not be written ({first_line(error, 200)}); "
                                        "run `autograder grade` again to grade it")
            except OSError as error:
                where = f" ({error.filename})" if error.filename else ""
                raise GradingError(f"stopped while saving {key}: {error.strerror or error}{where}; what was saved "
                                   "before stays saved: free the disk or fix the folder, and run again",
                                   FAILED) from None
            outcome.engine_cpu += spent.pop(key) + time.thread_time() - cpu
            outcomes.append(outcome)
            tracker.update(took)


def _prepare(submission: discover.Submission, known: set[str], preparer: Preparer, ignore: list[str]) -> list[Any]:
    """Each notebook of the submission, ready to run (Prepared), or its result already
    (NotebookResult): refused, unreadable or ungradable."""
    if submission.unusable is not None:
        return [results.rejected(name, f"not graded: {submission.unusable}") for name in sorted(known)]
    submission.contents = submission.files(ignore)
    items: list[Any] = []
    for entry, reason in list(submission.refused):
        name = entry.removesuffix(".ipynb")
        if "/" not in entry and entry.endswith(".ipynb") and name in known:  # the notebook itself
            items.append(results.rejected(name, f"not graded: {reason}"))
            submission.refused.remove((entry, reason))
    for filename in submission.notebooks:
        name = filename.removesuffix(".ipynb")
        if name not in known:
            submission.refused.append((filename, f"'{filename}' is not a notebook of {submission.assignment}"))
            continue
        try:
            data = submission.read(filename)
        except untrusted.UnreadableFile as refused:
            items.append(results.rejected(name, f"not graded: {refused}"))
            continue
        try:
            items.append(preparer.prepare(name, data, submission.student, submission.assignment))
        except Rejected as error:
            items.append(results.rejected(name, str(error), data))
        except Exception as error:  # whatever a notebook holds, it stops no one else's grading
            items.append(results.rejected(name,
                                          f"not graded: the grader could not prepare it ({first_line(error, 200)})",
                                          data))
    unused = [f"{reason}: not used" for _, reason in submission.refused]  # a person should know
    for item in items:
        (item.problems if isinstance(item, results.NotebookResult) else item.flags).extend(unused)
    return items


def _graded(prepared: Prepared, run: Run) -> results.NotebookResult:
    try:
        return results.graded(prepared, run)
    except Exception as error:  # outputs nothing can hold: the notebook alone fails
        return results.rejected(prepared.name,
                                f"not graded: its results could not be recorded ({first_line(error, 200)})")


def _save(writer: Writer, submission: discover.Submission, notebook_results: list[Any]) -> list[results.NotebookResult]:
    """Save the submission, and return what was saved: one whose autograded notebooks cannot
    be written (what a notebook holds can break nbgrader's scorers) is saved as refused,
    with the reason."""
    try:
        writer.save(submission, notebook_results)
        return notebook_results
    except (OperationalError, OSError):
        raise
    except Exception as error:
        reason = f"not graded: its autograded notebook could not be written ({first_line(error, 200)})"
        refused = [results.rejected(r.name, reason, r.data) if r.nb is not None else r for r in notebook_results]
        writer.save(submission, refused)
        return refused


def _outcome(submission: discover.Submission, notebook_results: list[results.NotebookResult]) -> class_report.Outcome:
    problems = [f"{r.name}: {p}" for r in notebook_results for p in r.problems]
    failed = any(r.nb is None or (r.run and r.run.failure) for r in notebook_results)
    runs = [r.run for r in notebook_results if r.run]
    return class_report.Outcome(
        submission, "failed" if failed else "flagged" if problems else "graded", problems,
        sum(r.seconds for r in runs), sum(r.code_seconds for r in runs), sum(r.code_cpu for r in runs),
        sum(r.judge_cpu + r.probe_cpu for r in runs), sum(max(r.cpu - r.code_cpu - r.probe_cpu, 0.0) for r in runs),
    )


def _export(coursedir: CourseDirectory, assignments: set[str]) -> None:
    """grades.csv as `nbgrader export` writes it, with late work in columns at its end;
    grades-lms.csv for Canvas and Moodle; a plot of each assignment's totals and exercises
    (failed submissions as last-run.csv says)."""
    root = Path(coursedir.root)
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        class_report.write_grades(gb, root / GRADES_CSV, root)
        class_report.write_lms(gb, root / LMS_CSV)
    for assignment in sorted(assignments):
        source = Path(coursedir.format_path(coursedir.source_directory, ".", assignment))
        failed = class_report.read_failed(root / REPORTS / assignment / "last-run.csv")
        class_report.plot(coursedir.db_url, coursedir.course_id, assignment, source,
                    root / REPORTS / assignment / "grades.png", failed)
