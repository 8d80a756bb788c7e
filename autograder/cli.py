"""The `autograder` command."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(help="The autograd course's instructor tools.", no_args_is_help=True, add_completion=False)


@app.command()
def release() -> None:
    """Normalise the notebooks in solutions/ and regenerate the student notebooks in course/."""
    from . import authoring

    for slug in authoring.normalize_all():
        typer.echo(f"normalised solutions/{slug}")
    authoring.release()
    authoring.write_visible_checks()
    typer.echo("course/ regenerated from solutions/ (and the summary cells' list of visible checks)")
    _remind_to_rotate(authoring.ROOT)


def _remind_to_rotate(root: Path) -> None:
    """A new term's class must not draw the hidden inputs the last class drew (README,
    "Rotate the secret each term"): say so when a release finds a secret made before it."""
    import datetime

    from .grader import secret

    where = secret.path(root)
    if where.is_file():
        made = datetime.date.fromtimestamp(where.stat().st_mtime)
        typer.echo(f"the grading secret was made on {made}: if this release starts a new term, run `autograder "
                   "secret --rotate` before its class is graded, so that its hidden checks draw inputs no earlier "
                   "feedback has shown (earlier grades still replay from the seeds they recorded)")


@app.command()
def grade(
    assignments: List[str] = typer.Argument(None, help="Assignments to grade, e.g. 03_function_basics (default: all)."),
    student: List[str] = typer.Option([], "--student", "-s", help="Grade only this student (repeatable)."),
    force: bool = typer.Option(False, "--force", help="Grade again submissions that were graded before."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Notebooks run at once (default: one per CPU core)."),
    timeout: float = typer.Option(120, help="Seconds a notebook may run in total; then it is stopped and flagged."),
    memory: int = typer.Option(2048, help="MiB of memory a notebook may use."),
    no_sandbox: bool = typer.Option(
        False, "--no-sandbox",
        help="Run without bubblewrap even if it is installed (isolation is reduced: not for untrusted code)."
    ),
    feedback: bool = typer.Option(
        False, "--feedback",
        help="Also write feedback/ (HTML for students, hidden tests removed), as `nbgrader generate_feedback` does."
    ),
    db: Optional[str] = typer.Option(None,
                                     help="Gradebook URL (default: nbgrader's, sqlite:///gradebook.db in the course; "
                                                "PostgreSQL: postgresql+psycopg://USER@HOST/DATABASE)."),
    scheduler: Optional[str] = typer.Option(
        None, help="Grade on a Dask cluster: the scheduler's address (tcp://HOST:8786). Each Dask worker runs as many "
                   "notebooks at once as it has threads, sandboxed on its machine; this process writes the gradebook "
                   "(--jobs is then the workers' --nthreads). See the README, 'A large course'."
    ),
    course: Path = typer.Option(Path("."), help="The course root: the folder with nbgrader_config.py and submitted/."),
    gpu: bool = typer.Option(
        False, "--gpu",
        help="Insist on a GPU: refuse to start without one. (A GPU that torch can use is passed into the "
                             "sandbox anyway, device nodes and driver libraries only: README, 'Grading on a GPU'.)"
    ),
) -> None:
    """Grade the submissions in submitted/STUDENT/ASSIGNMENT/, like `nbgrader autograde`, but fast and safely.

    Every notebook runs in its own process, several at once, inside a sandbox: no
    network, no access to solutions/, the gradebook or other students' work, and hard
    limits on time, memory, processes and output. Scores are those nbgrader gives.

    Results go where nbgrader keeps them: the gradebook (formgrader and `nbgrader export`
    read it) and autograded/. It also writes grades.csv and, per assignment,
    reports/ASSIGNMENT/grades.png (points per exercise) and reports/ASSIGNMENT/last-run.csv.
    Feedback for students comes after any manual grading, from `nbgrader generate_feedback`
    (or right away with --feedback); either way it shows no hidden tests.

    A notebook that crashes, runs out of time or memory, or whose test cells were
    deleted, retyped or renamed is graded as far as it ran (unfinished test cells score
    0) and flagged for manual review with the reason. Interrupt at any time: running the
    command again grades only what is left (use --force to grade everything again).

    One grader per course at a time. Exit codes: 0 graded (flagged submissions included),
    2 a wrong option or a course that is not ready (nothing was done), 3 another run is
    grading this course, 4 an operational failure (gradebook locked, disk full, folder not
    writable): what was saved stays saved, and running again finishes the rest.
    """
    from .grader.grade import run
    from .grader.preflight import FAILED, GradingError
    from .grader.records import Options
    from .isolation import sandbox
    from .isolation.limits import Limits

    if gpu and scheduler is None:  # a cluster's workers find their own
        name, why = sandbox.find_gpu()
        if name is None:
            typer.echo(f"error: --gpu was given, but {why}", err=True)
            raise typer.Exit(2)

    options = Options(
        root=course.resolve(), assignments=list(assignments or []), students=list(student), force=force,
        limits=Limits(timeout=timeout, memory=memory), sandbox=not no_sandbox, db_url=db, feedback=feedback,
    )
    if jobs is not None:
        options.jobs = jobs
    code = 0
    try:
        summary = run(options, scheduler=scheduler)
        unsaved = [o for o in summary.outcomes if not o.saved]
        if unsaved:
            typer.echo(f"error: {len(unsaved)} submission(s) could not be saved (see above); run again to grade them",
                       err=True)
            code = FAILED
    except GradingError as error:
        typer.echo(f"error: {error}", err=True)
        code = error.code
    # Everything is written and closed: skip Python's teardown of torch's modules (~1 s).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@app.command()
def replay(
    assignment: str = typer.Argument(..., help="The assignment, e.g. 03_function_basics."),
    student: str = typer.Argument(..., help="The student whose verdict to replay."),
    cell: str = typer.Argument(..., help="The test cell's grade_id, e.g. check_linear_hidden."),
    course: Path = typer.Option(Path("."), help="The course root."),
) -> None:
    """Judge one test cell of one submission again and compare it with the recorded verdict.

    After a complaint, say: the cell's checks draw the inputs its verdict was drawn from
    (the seeds its autograded notebook records), and the notebook runs sandboxed up to
    that cell, as when it was graded; nothing is written. A hidden test cell is shown as
    the student saw it (no values), then with every value shown, its inputs included.
    Exit codes: 0 the verdict is the recorded one, 1 it differs (or was never recorded),
    2 there is nothing to replay.
    """
    from .grader.preflight import GradingError
    from .grader.records import Options, as_text
    from .grader.replay import replay as run

    try:
        found = run(Options(root=course.resolve()), assignment, student, cell)
    except GradingError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(error.code) from None
    typer.echo(f"{student} / {assignment} / {cell}, judged again with {found.seeds}:")
    typer.echo(as_text(found.outputs).rstrip() or "(no output)")
    if found.revealed is not None:
        typer.echo("the same cell with every value shown, its hidden inputs included (for you: the student's "
                   "feedback shows none):")
        typer.echo(as_text(found.revealed).rstrip() or "(no output)")
    if found.failure:
        typer.echo(f"the notebook stopped: {found.failure}")
    score = "no score (a visible check)" if found.score is None else f"score {found.score:g}"
    recorded = "never graded" if found.recorded_outputs is None else f"recorded score {found.recorded_score}"
    typer.echo(f"{score}; {recorded}: {'the same verdict' if found.same else 'a DIFFERENT verdict'}")
    raise typer.Exit(0 if found.same else 1)


@app.command()
def exercise(
    grade_id: str = typer.Argument(..., help="The answer cell's grade_id, e.g. conv2d."),
) -> None:
    """Everything of one exercise: its notebook and cells, the checks its graded cells call
    (and where they are written), its known answers and the command that runs its tests."""
    from . import registry

    if not registry.named(grade_id):
        close = list(dict.fromkeys(e.grade_id for e in registry.exercises() if grade_id in e.grade_id))
        typer.echo(f"error: no exercise {grade_id!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""),
                   err=True)
        raise typer.Exit(2)
    typer.echo(registry.describe(grade_id))


@app.command()
def secret(
    rotate: bool = typer.Option(False, "--rotate", help="Make a new secret: grades from now on draw other inputs."),
    course: Path = typer.Option(Path("."), help="The course root."),
) -> None:
    """Show or rotate the course's grading secret, which every check's inputs derive from.

    It is made the first time the course is graded and kept with the gradebook (copy both
    when grading moves to another machine: regrades draw the same inputs only with it).
    Students never see it. Rotate it if it may have leaked; each autograded notebook
    records its cells' seeds, so `autograder replay` still replays earlier grades.
    """
    from .grader import secret as secrets

    root = course.resolve()
    if not (root / "nbgrader_config.py").exists():
        typer.echo(f"error: {root} is not a course root (no nbgrader_config.py): run this there, or pass --course",
                   err=True)
        raise typer.Exit(2)
    try:
        key = secrets.rotate(root) if rotate else secrets.load(root)[0]
    except (OSError, ValueError) as error:
        typer.echo(f"error: the grading secret {secrets.path(root)} cannot be {'made' if rotate else 'read or made'} "
                   f"({error})" + ("" if rotate else "; `autograder secret --rotate` makes a new one"), err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{'new ' if rotate else ''}grading secret {secrets.fingerprint(key)} in {secrets.path(root)}")


@app.command()
def publish(
    out: Path = typer.Argument(Path("public"),
                               help="Folder for the public repository's content (a clone of it, or a new folder)."),
    self_study: bool = typer.Option(
        False, "--self-study", help="The edition for self-learners, for its own repository (self-study-repository in "
                                    "pyproject.toml): every quiz's key and explanations are included, so each quiz's "
                                    "check explains the answers at once. Never for a graded class."
    ),
) -> None:
    """Write what students get into OUT: the student package and the released notebooks.

    Nothing of solutions/, the hidden tests, the quiz keys or the grader goes there, so OUT
    can be pushed as the course's public repository while this one stays private. Colab's
    setup cell installs the student package from that repository
    (`\\[tool.autograd-course] student-repository` in pyproject.toml; the self-study
    edition's: `self-study-repository`). Run `autograder release` first (`make publish`
    does): course/ is copied as it is. OUT's files are replaced, its .git is kept; OUT must
    not be the other edition's (a clone of its repository, or its content).
    """
    from . import publish as publishing

    try:
        publishing.build(out.resolve(), self_study=self_study)
    except publishing.PublishError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    edition = ("the self-study edition of the student package (quiz keys included)" if self_study
               else "the student package")
    typer.echo(f"{out}/ holds {edition} and {len(publishing.released())} notebooks; push it to "
               f"{publishing.student_repository(self_study=self_study)}")


@app.callback()
def main() -> None:
    """Instructor tools of the autograd course."""
