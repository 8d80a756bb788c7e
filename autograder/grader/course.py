"""Grading one course with warm workers: the trusted steps, in order.

Discover the submissions; prepare, run and save them interleaved (this thread prepares and
saves, so only it touches the gradebook; each worker's thread in the pool drives its
notebooks and judges their test cells); then export grades.csv, plot each
assignment, write the status files and, if asked, nbgrader's feedback.
"""
from __future__ import annotations

from contextlib import closing
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.coursedir import CourseDirectory
from nbgrader.plugins.export import CsvExportPlugin
from rich.console import Console
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from .verdicts import Judge, warm
from . import discover, feedback, report, results, speedups
from .grade import GradingError
from .pool import Pool
from .records import Options, Program
from .prepare import Preparer, Rejected
from .writer import Writer

REPORTS = "reports"  # per-assignment plots and status files, in the course root
GRADES_CSV = "grades.csv"  # nbgrader export's default name


def load_config(options: Options) -> Config:
    """The course's nbgrader_config.py, as `nbgrader` run from the course root would read it."""
    config = Config()
    if (options.root / "nbgrader_config.py").exists():
        config = PyFileConfigLoader("nbgrader_config.py", path=str(options.root)).load_config()
    config.CourseDirectory.root = str(options.root)
    if options.db_url:
        config.CourseDirectory.db_url = options.db_url
    return config


def grade(options: Options, pool: Pool, console: Console) -> tuple[list[report.Outcome], list[discover.Submission]]:
    """Grade what `options` asks for with `pool`'s workers; (outcomes, submissions skipped as done)."""
    with speedups.applied():
        return _grade(options, pool, console)


def _grade(options: Options, pool: Pool, console: Console) -> tuple[list[report.Outcome], list[discover.Submission]]:
    config = load_config(options)
    coursedir = CourseDirectory(config=config)
    submissions = discover.find(coursedir, options.assignments, options.students)
    if not submissions:
        raise GradingError(
            f"no submissions found in {coursedir.submitted_directory}/STUDENT/ASSIGNMENT "
            "(collect them with `nbgrader collect` or `nbgrader zip_collect` first)"
        )
    known = _known_notebooks(coursedir, {s.assignment for s in submissions})
    skipped = [s for s in submissions if not options.force and discover.is_done(coursedir, s)]
    todo = [s for s in submissions if s not in skipped]
    outcomes: list[report.Outcome] = []
    if todo:
        released = Path(coursedir.format_path(coursedir.release_directory, ".", "."))
        with closing(Preparer(coursedir.db_url, coursedir.course_id, config, released)) as preparer, \
                closing(Writer(coursedir, config)) as writer:
            modules = preparer.imports({s.assignment: known[s.assignment] for s in todo})
            pool.preload(modules)
            warm(modules)
            outcomes = _grade_all(todo, known, pool, preparer, writer, console)
    pool.close()  # the workers' memory and CPU go to what follows
    _export(coursedir, config, {s.assignment for s in submissions})
    graded = sorted({o.submission.assignment for o in outcomes})
    if options.feedback and graded:
        console.print("Generating feedback (nbgrader generate_feedback, hidden tests cleared) ...")
        for assignment in feedback.generate(coursedir, config, graded):
            console.print(f"[bold red]feedback failed for some submissions of {assignment}[/]")
    for assignment in graded:
        report.write_status(
            [o for o in outcomes if o.submission.assignment == assignment],
            options.root / REPORTS / assignment / "last-run.csv",
        )
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


def _grade_all(todo, known, pool, preparer, writer, console) -> list[report.Outcome]:
    """Prepare, run and save, interleaved: this thread prepares and saves in turn, while the
    pool's threads run and judge."""
    waiting = iter(todo)
    running: dict[str, tuple[discover.Submission, list]] = {}  # key -> (submission, [(path, Prepared | reason)])
    outcomes = []
    with report.progress(console) as bar:
        task = bar.add_task("", total=len(todo))
        while True:
            while len(running) < AHEAD * pool.size and (submission := next(waiting, None)) is not None:
                items = _prepare(submission, known[submission.assignment], preparer, console)
                running[submission.key] = (submission, items)
                files = {name: path.read_bytes() for name, path in submission.extra_files.items()}
                pool.submit(submission.key, [
                    Program(p.code_cells(), files, Judge(p.nb.cells)) for _, p in items if not isinstance(p, str)
                ])
            if not running:
                return outcomes
            key, runs = pool.result()
            submission, items = running.pop(key)
            queue = iter(runs)
            notebook_results = [
                results.rejected(path, item) if isinstance(item, str) else results.graded(item, next(queue), path)
                for path, item in items
            ]
            writer.save(submission, notebook_results)
            outcomes.append(_outcome(submission, notebook_results))
            bar.update(task, advance=1, description=key)


def _prepare(submission, known: set[str], preparer: Preparer, console) -> list:
    items = []
    for path in submission.notebooks:
        if path.stem not in known:
            console.print(f"skipping {path}: no notebook '{path.stem}' in assignment '{submission.assignment}'")
            continue
        try:
            items.append((path, preparer.prepare(path, submission.student, submission.assignment)))
        except Rejected as error:
            items.append((path, str(error)))
    return items


def _outcome(submission, notebook_results) -> report.Outcome:
    problems = [f"{r.name}: {p}" for r in notebook_results for p in r.problems]
    failed = any(r.nb is None or (r.run and r.run.failure) for r in notebook_results)
    runs = [r.run for r in notebook_results if r.run]
    return report.Outcome(
        submission, "failed" if failed else "flagged" if problems else "graded", problems,
        sum(r.seconds for r in runs), sum(r.code_seconds for r in runs), sum(r.code_cpu for r in runs),
        sum(r.judge_cpu for r in runs),
    )


def _export(coursedir: CourseDirectory, config: Config, assignments: set[str]) -> None:
    """grades.csv as `nbgrader export` writes it; a plot of each assignment's points per exercise."""
    root = Path(coursedir.root)
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        CsvExportPlugin(config=config, to=str(root / GRADES_CSV)).export(gb)
    for assignment in sorted(assignments):
        source = Path(coursedir.format_path(coursedir.source_directory, ".", assignment))
        report.plot(coursedir.db_url, coursedir.course_id, assignment, source, root / REPORTS / assignment / "grades.png")
