"""The `autograder` command.

Every command checks its arguments before it loads torch, nbgrader or a worker (which take
seconds), so a mistake is answered at once, in one line that lists the valid choices; a
longer run shows what it does on one status line. Help is plain text (no type after a flag),
and no failure goes through typer's rich traceback.
"""
from __future__ import annotations

import difflib
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from . import __version__

# jsonschema (under nbformat) imports the optional rfc3987_syntax where it is installed
# (JupyterLab brings it), which compiles a grammar: 2-3 CPU-s, more than most commands' own
# work. Nothing here checks the "iri" formats it adds; marked absent, it is skipped.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # (None: import fails)

app = typer.Typer(help="The autograd course's instructor tools.", no_args_is_help=True, add_completion=False,
                  rich_markup_mode=None, pretty_exceptions_enable=False)

# What a flag's value would be: `grade --force true` is the flag and then an assignment "true".
FLAG_VALUES = {"true", "false", "yes", "no", "on", "off", "1", "0"}


def fail(message: str, code: int = 2) -> typer.Exit:
    """One line on stderr; the exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@app.command()
def release() -> None:
    """Regenerate course/ from solutions/.

    Each notebook of solutions/ is put in its stored form (outputs cleared, the shared setup
    and hand-in cells), then released with stock `nbgrader generate_assignment` into course/
    and the gradebook, with the first hint-tiers tiers of each hint. course/ASSIGNMENT/ is
    replaced whole: a file there that solutions/ does not have (one added by hand) stops the
    release before anything is written. The student package's earlier answers (the model
    answers later notebooks import) are written for the assignments listed as past-due.
    ([tool.autograd-course] hint-tiers and past-due in pyproject.toml.)
    """
    from rich.console import Console

    from . import authoring, earlier_answers, hints
    from .grader import progress

    try:
        hints.class_tiers(authoring.ROOT)
        earlier_answers.past_due()
    except (hints.HintConfigError, earlier_answers.PastDueError) as error:
        raise fail(str(error)) from None
    slugs = authoring.assignments()
    extra = authoring.hand_made(slugs)
    if extra:
        raise fail(f"course/ holds {', '.join(extra)}, which solutions/ does not: the release replaces "
                   "course/ASSIGNMENT/ whole and would delete it; move it into solutions/ASSIGNMENT/ (or away)")
    from nbgrader.converters import NbGraderException

    with progress.showing(Console(stderr=True), time.monotonic(), "Releasing") as display:
        display.phase("normalising solutions/ ...")
        changed = authoring.normalize_all()
        for n, slug in enumerate(slugs, 1):
            display.phase(f"{slug} ({n} of {len(slugs)}) ...")
            try:
                authoring.release(slugs=[slug])
            except NbGraderException as error:
                raise fail(f"nbgrader could not release {slug} ({str(error).strip() or 'see its messages above'}); "
                           f"course/{slug} is as git has it (git checkout course/{slug})", 1) from None
        authoring.write_visible_checks()
        earlier_answers.write()
    for slug in changed:
        typer.echo(f"normalised solutions/{slug}")
    due = [slug for slug in earlier_answers.past_due() if earlier_answers.exported(slug)]
    typer.echo(f"course/ regenerated from solutions/ ({len(slugs)} notebooks, {hints.class_tiers(authoring.ROOT)} "
               f"hint tiers), the summary cells' list of visible checks, and the earlier answers later notebooks "
               f"import (given: {', '.join(due) or 'none yet'})")
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
    assignments: List[str] = typer.Argument(None, metavar="[ASSIGNMENT]...",
                                            help="Assignments to grade, e.g. 03_function_basics (default: all)."),
    student: List[str] = typer.Option([], "--student", "-s", metavar="STUDENT",
                                      help="Grade only this student (repeatable)."),
    force: bool = typer.Option(False, "--force",
                               help="Grade again submissions that were graded before: their autograded/ notebooks, "
                                    "automatic scores and feedback are replaced (manual grades and comments stay)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", metavar="N",
                                       help="Notebooks run at once (default: one per CPU core)."),
    timeout: float = typer.Option(120, metavar="SECONDS",
                                  help="Seconds a notebook may run in total; then it is stopped and flagged."),
    memory: int = typer.Option(2048, metavar="MIB", help="MiB of memory a notebook may use."),
    no_sandbox: bool = typer.Option(
        False, "--no-sandbox",
        help="Run without bubblewrap even if it is installed (isolation is reduced: not for untrusted code)."
    ),
    feedback: bool = typer.Option(
        False, "--feedback",
        help="Also write feedback/ (HTML for students, hidden tests removed), as `nbgrader generate_feedback` does."
    ),
    db: Optional[str] = typer.Option(None, metavar="URL",
                                     help="Gradebook URL (default: nbgrader's, sqlite:///gradebook.db in the course; "
                                          "PostgreSQL: postgresql+psycopg://USER@HOST/DATABASE)."),
    scheduler: Optional[str] = typer.Option(
        None, metavar="ADDRESS",
        help="Grade on a Dask cluster: the scheduler's address (tcp://HOST:8786). Each Dask worker runs as many "
             "notebooks at once as it has threads, sandboxed on its machine; this process writes the gradebook "
             "(--jobs is then the workers' --nthreads). See the README, 'A large course'."
    ),
    course: Path = typer.Option(Path("."), metavar="FOLDER",
                                help="The course root: the folder with nbgrader_config.py and submitted/."),
    gpu: bool = typer.Option(
        False, "--gpu",
        help="Insist on a GPU: refuse to start without one. (A GPU that torch can use is passed into the "
             "sandbox anyway, device nodes and driver libraries only: README, 'Grading on a GPU'.)"
    ),
) -> None:
    """Grade submitted/ like `nbgrader autograde`, fast and sandboxed.

    Grades the submissions in submitted/STUDENT/ASSIGNMENT/. Every notebook runs in its own
    process, several at once, inside a sandbox: no network, no access to solutions/, the
    gradebook or other students' work, and hard limits on time, memory, processes and
    output. Scores are those nbgrader gives.

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
    stray = [a for a in assignments or [] if a.lower() in FLAG_VALUES]
    if stray:
        raise fail(f"'{stray[0]}' is not an assignment: --force, --feedback, --no-sandbox and --gpu are flags and "
                   f"take no value (write --force, not --force {stray[0]})")
    from .grader.grade import run
    from .grader.preflight import FAILED, GradingError
    from .grader.records import Options
    from .isolation import sandbox
    from .isolation.limits import Limits

    if gpu and scheduler is None:  # a cluster's workers find their own
        name, why = sandbox.find_gpu()
        if name is None:
            raise fail(f"--gpu was given, but {why}")

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
    course: Path = typer.Option(Path("."), metavar="FOLDER", help="The course root."),
) -> None:
    """Judge one test cell of one submission again, with its inputs.

    After a complaint, say: the cell's checks draw the inputs its verdict was drawn from
    (the seeds its autograded notebook records), and the notebook runs sandboxed up to
    that cell, as when it was graded; nothing is written. A wrong assignment, student or
    cell is answered at once, with the valid ones. A hidden test cell is shown as the
    student saw it (no values), then with every value shown, its inputs included.
    Exit codes: 0 the verdict is the recorded one, 1 it differs (or was never recorded),
    2 there is nothing to replay.
    """
    from .grader.preflight import GradingError
    from .grader.records import Options, as_text
    from .grader.replay import check

    options = Options(root=course.resolve())
    try:
        check(options, assignment, student, cell)
        found = _replayed(options, assignment, student, cell)
    except GradingError as error:
        raise fail(str(error), error.code) from None
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


def _replayed(options, assignment: str, student: str, cell: str):
    """`replay`'s run, with its status line (loading, preparing, running: tens of seconds)."""
    from rich.console import Console

    from .grader import progress
    from .grader.replay import replay as run

    with progress.showing(Console(stderr=True), time.monotonic(), "Replaying") as display:
        return run(options, assignment, student, cell, display.phase)


@app.command()
def exercise(
    grade_id: str = typer.Argument(..., help="The answer cell's grade_id, e.g. conv2d."),
) -> None:
    """Show one exercise: its cells, checks, answers and tests.

    Its notebook and cells, the checks its graded cells call (and where they are written),
    its known answers and the command that runs its tests.
    """
    from . import registry

    if not registry.named(grade_id):
        known = list(dict.fromkeys(e.grade_id for e in registry.exercises()))
        close = [g for g in known if grade_id in g] or difflib.get_close_matches(grade_id, known, n=3)
        raise fail(f"no exercise {grade_id!r}" + (f" (did you mean {', '.join(close)}?)" if close else
                                                  f"; the exercises: {', '.join(known)}"))
    typer.echo(registry.describe(grade_id))


@app.command()
def secret(
    rotate: bool = typer.Option(
        False, "--rotate",
        help="Make a new secret: grades from now on draw other inputs. The one it replaces is kept beside it."),
    course: Path = typer.Option(Path("."), metavar="FOLDER", help="The course root."),
) -> None:
    """Show or rotate the course's grading secret.

    Every check's inputs derive from it. It is made the first time the course is graded and
    kept with the gradebook (copy both when grading moves to another machine: regrades draw
    the same inputs only with it). Students never see it. Rotate it if it may have leaked;
    each autograded notebook records its cells' seeds, so `autograder replay` still replays
    earlier grades.
    """
    from .grader import secret as secrets

    root = course.resolve()
    if not (root / "nbgrader_config.py").exists():
        raise fail(f"{root} is not a course root (no nbgrader_config.py): run this there, or pass --course")
    try:
        if rotate:
            key, kept = secrets.rotate(root)
        else:
            key, kept = secrets.load(root)[0], None
    except (OSError, ValueError) as error:
        raise fail(f"the grading secret {secrets.path(root)} cannot be {'made' if rotate else 'read or made'} "
                   f"({error})" + ("" if rotate else "; `autograder secret --rotate` makes a new one"), 1) from None
    typer.echo(f"{'new ' if rotate else ''}grading secret {secrets.fingerprint(key)} in {secrets.path(root)}")
    if kept is not None:
        typer.echo(f"the secret it replaced is kept as {kept} (to undo: mv {kept} {secrets.path(root)})")


@app.command()
def publish(
    out: Path = typer.Argument(Path("public"), metavar="[OUT]",
                               help="Folder for the public repository's content: a new or empty folder, a clone of "
                                    "the public repository, or a folder an earlier publish wrote (default: public)."),
    self_study: bool = typer.Option(
        False, "--self-study", help="The edition for self-learners, for its own repository (self-study-repository in "
                                    "pyproject.toml): every quiz's key and explanations are included, so each quiz's "
                                    "check explains the answers at once. Never for a graded class."
    ),
) -> None:
    """Write what students get (the public repository) into OUT.

    The student package and the released notebooks: nothing of solutions/, the hidden
    tests, the quiz keys or the grader goes there, so OUT can be pushed as the course's
    public repository while this one stays private. Colab's setup cell installs the student
    package from that repository ([tool.autograd-course] student-repository in
    pyproject.toml; the self-study edition's: self-study-repository). Run `autograder
    release` first (`make publish` does): course/ is copied as it is.

    OUT must be empty (a clone of an empty repository: .git alone) or written by publish
    before: it lists the files it wrote in OUT/.autograder-publish (commit it with them) and
    replaces those, and no others, when run again. Anything else is refused in one line,
    and so are a course's own folders, the course root and the folders above it, and the
    other edition's repository.
    """
    from . import publish as publishing

    try:
        publishing.build(out.resolve(), self_study=self_study)
    except publishing.PublishError as error:
        raise fail(str(error)) from None
    except OSError as error:  # a folder it may not write, a full disk
        raise fail(f"publishing into {out} stopped: {error.strerror or error} ({error.filename or out}); what it "
                   f"wrote is listed in {publishing.MARKER}, so publishing again replaces it", 1) from None
    edition = ("the self-study edition of the student package (quiz keys included)" if self_study
               else "the student package")
    typer.echo(f"{out}/ holds {edition} and {len(publishing.released())} notebooks; commit everything (with "
               f"{publishing.MARKER}) and push it to {publishing.student_repository(self_study=self_study)}")


@app.command()
def check(
    target: str = typer.Argument(..., metavar="FILE.py:NAME",
                                 help="The torch.autograd.Function (or custom op, or function) to check: a Python "
                                      "file and the name it defines, e.g. layers.py:Swish."),
    inputs: str = typer.Option(
        ..., "--inputs", metavar="SPEC",
        help="Example inputs: the arguments of one call, a shape in brackets for a random float64 tensor and a "
             "Python literal for anything else, e.g. '[8, 4] [4] 0.5'; or a name FILE.py defines: a tuple of "
             "arguments, a list of them, or a function of a torch.Generator returning either."),
    reference: Optional[str] = typer.Option(
        None, "--reference", metavar="NAME",
        help="A function of the same arguments FILE.py defines, made of torch operations: the values and "
             "gradients are then compared with its, in float64."),
    no_double_backward: bool = typer.Option(False, "--no-double-backward",
                                            help="The gradient need not be differentiable (no gradgradcheck)."),
    surrogate_gradient: bool = typer.Option(
        False, "--surrogate-gradient",
        help="Backward deliberately is not the derivative of forward (a straight-through estimator, gradient "
             "reversal): no gradcheck."),
    autograd_in_backward: bool = typer.Option(False, "--autograd-in-backward",
                                              help="Backward may ask autograd (recomputation, checkpointing)."),
    vmap: Optional[bool] = typer.Option(None, "--vmap/--no-vmap",
                                        help="Check torch.func.vmap (default: where the Function declares a rule)."),
    compile: bool = typer.Option(False, "--compile", help="Check torch.compile(backend='aot_eager')."),
    fullgraph: bool = typer.Option(False, "--fullgraph", help="With --compile: in one graph (fullgraph=True)."),
    max_saved_bytes: Optional[int] = typer.Option(None, "--max-saved-bytes", metavar="N",
                                                  help="What one call may save for backward, at most."),
    seed: int = typer.Option(0, metavar="N", help="The seed random inputs are drawn from."),
) -> None:
    """Check your own autograd Function with the course's checks.

    Values, gradients (gradcheck) and double backward (gradgradcheck); the same results every
    time and for every memory layout of grad_output; ctx.needs_input_grad respected; float32
    kept; the meta device (a tensor tied to the CPU); no NaN at 0 and ±1000; nothing stashed on
    ctx or kept elsewhere; backward asks autograd for nothing; vmap, forward-mode AD and
    torch.compile where asked for; with --reference, values and gradients against it. One line
    per group of checks; on the first failure, the course's message: the input, the expected
    and actual values, the likely cause. It runs FILE.py in this process.
    Exit codes: 0 every check passed, 1 a check failed, 2 nothing was checked (a wrong argument,
    a file that does not import).
    """
    path, _, name = target.rpartition(":")
    if not path.endswith(".py") or not name.isidentifier():
        raise fail(f"'{target}' is not FILE.py:NAME (a Python file, a colon, and the name of the Function in it)")
    if not Path(path).is_file():
        raise fail(f"{path} is not a file")
    try:
        spec = _inputs_spec(inputs)
    except ValueError as error:
        raise fail(f"--inputs {inputs!r}: {error}") from None
    if reference is not None and not reference.isidentifier():
        raise fail(f"--reference {reference!r} is not a name (the reference must be defined in {path})")
    if fullgraph and not compile:
        raise fail("--fullgraph goes with --compile")
    module = _imported(Path(path))
    fn, reference_fn = _defined(module, path, name), None if reference is None else _defined(module, path, reference)
    from .checks.anyfunction import check_function
    from .student.report import CheckFailed

    try:
        check_function(fn, _defined(module, path, spec) if isinstance(spec, str) else _random_inputs(spec),
                       reference_fn, double_backward=not no_double_backward, surrogate_gradient=surrogate_gradient,
                       autograd_in_backward=autograd_in_backward, vmap=vmap,
                       compile="fullgraph" if fullgraph else compile, max_saved_bytes=max_saved_bytes, seed=seed)
    except CheckFailed as failed:
        typer.echo(f"✘ {failed}")
        raise typer.Exit(1) from None
    except TypeError as error:  # inputs that are no call's arguments
        raise fail(str(error)) from None


def _inputs_spec(text: str) -> str | list:
    """`--inputs`: a name, or a list of shapes (tuples) and Python literals."""
    import ast
    import re

    if text.strip().isidentifier():
        return text.strip()
    found: list = []
    for token in re.findall(r"\[[^\]]*\]|[^\s\[\]]+", text):
        if token.startswith("["):
            dims = [d.strip() for d in token[1:-1].split(",") if d.strip()]
            if not all(d.isdigit() for d in dims):
                raise ValueError(f"the shape {token} is not a list of sizes (whole numbers)")
            found.append(tuple(int(d) for d in dims))
        else:
            try:
                found.append(ast.literal_eval(token))
            except (ValueError, SyntaxError):
                raise ValueError(f"{token!r} is neither a shape in brackets nor a Python literal") from None
    if not found:
        raise ValueError("no arguments: give at least one, e.g. '[8, 4]'")
    return found


def _random_inputs(spec: list):
    """The arguments `spec` describes, drawn from check_function's generator."""
    import torch

    return lambda generator: tuple(torch.randn(s, generator=generator, dtype=torch.float64)
                                   if isinstance(s, tuple) else s for s in spec)


def _imported(path: Path):
    """FILE.py as a module of its own, importable by its name (torch.compile looks a
    Function's globals up there), its folder first on sys.path (for its own imports)."""
    import importlib.util

    name = f"checked_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # (a .py file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # anything the user's file raises
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise fail(f"importing {path} raised {type(error).__name__}{': ' + first if first else ''}") from None
    return module


def _defined(module, path: str, name: str):
    if not hasattr(module, name):
        known = [n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n))]
        close = difflib.get_close_matches(name, known, n=3)
        raise fail(f"{path} defines no {name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    return getattr(module, name)


def _version(shown: bool) -> None:
    if shown:
        typer.echo(f"autograder {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Show the version and exit."),
) -> None:
    """Instructor tools of the autograd course."""
