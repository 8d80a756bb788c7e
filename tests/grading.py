"""A throwaway nbgrader course for tests: release, submit, autograde with stock nbgrader."""
from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder import authoring
from autograder.student.report import CheckFailed

SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def model_solution(source: str) -> str:
    """An answer cell as a student who got it right would leave it (markers removed)."""
    return "\n".join(line for line in source.splitlines() if line.strip() not in SOLUTION_MARKERS)


def check_fails(check, student, *needles: str, **kwargs) -> str:
    """The message of `check(student, **kwargs)`, which must fail and name every needle."""
    with pytest.raises(CheckFailed) as info:
        check(student, **kwargs)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


@dataclass
class Exercise:
    answer_id: str  # grade_id of the answer cell
    solution: str  # its model solution
    graded: list[str]  # grade_ids of the graded cells that check it


def exercises(nb: nbformat.NotebookNode) -> list[Exercise]:
    """Answer cells in order, each with the graded cells that follow it. A markdown answer is
    graded by a person in formgrader (11's design write-up): no check grades it, so it is none."""
    found: list[Exercise] = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code":
            continue
        if meta.get("solution"):
            found.append(Exercise(meta["grade_id"], model_solution(cell.source), []))
        elif meta.get("grade") and found:
            found[-1].graded.append(meta["grade_id"])
    return found


def written_answers(nb: nbformat.NotebookNode) -> dict[str, str]:
    """{grade_id: the model answer} of the markdown answers a person grades (11's design write-up)."""
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("solution")}


def points(slug: str, answer_id: str | None = None) -> float:
    """The most a submission of `slug` can score: in all, or from the graded cells that check
    the answer cell `answer_id`."""
    nb = nbformat.read(authoring.solution_path(slug), as_version=4)
    graded = None if answer_id is None else next(e.graded for e in exercises(nb) if e.answer_id == answer_id)
    return sum(c.metadata["nbgrader"]["points"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")
               and (graded is None or c.metadata["nbgrader"]["grade_id"] in graded))


class Course:
    """An nbgrader course root in `root`, with this repository's config and solutions."""

    def __init__(self, root: Path, slugs: list[str]) -> None:
        self.root = root
        config = root / "pyproject.toml"  # a course's own settings (its hint tiers) shape its release
        shutil.copytree(released(tuple(slugs), config.read_text() if config.exists() else None), root,
                        dirs_exist_ok=True)
        self.db_url = f"sqlite:///{root / 'gradebook.db'}"

    def keep_secret(self, name: str) -> bytes:
        """Give the course a grading secret derived from `name` (recorded), as `autograder grade`
        would make one at random: its hidden checks then draw the same inputs on every run."""
        from autograder.grader import secret

        key = hashlib.sha256(f"test course secret: {name}".encode()).digest()
        secret.path(self.root).parent.mkdir(exist_ok=True)
        secret.path(self.root).write_text(key.hex() + "\n")
        return key

    def released(self, slug: str) -> nbformat.NotebookNode:
        return nbformat.read(self.root / "course" / slug / f"{slug}.ipynb", as_version=4)

    def submit(self, student: str, slug: str, answers: dict[str, str] | None) -> None:
        """Submit the released notebook with `answers` {answer_id: source} filled in
        (None: submit it untouched)."""
        nb = self.released(slug)
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if answers is not None and grade_id in answers:
                cell.source = answers[grade_id]
        folder = self.root / "submitted" / student / slug
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, folder / f"{slug}.ipynb")

    def autograde(self, slug: str) -> subprocess.CompletedProcess:
        """Stock `nbgrader autograde`, as an instructor runs it from the course root, on purpose
        (nbgrader_config.py refuses it otherwise)."""
        nbgrader = Path(sys.executable).with_name("nbgrader")
        return subprocess.run(
            [str(nbgrader), "autograde", slug, "--force"],
            cwd=self.root, capture_output=True, text=True, timeout=1800,
            env={**os.environ, "NBGRADER_STOCK_AUTOGRADE": "1"},
        )

    def scores(self, slug: str, student: str) -> dict[str, tuple[float, float]]:
        """{grade_id: (score, max_score)} of every graded cell of a submission."""
        with Gradebook(self.db_url) as gradebook:
            notebook = gradebook.find_submission_notebook(slug, slug, student)
            return {g.name: (g.score, g.max_score) for g in notebook.grades if g.cell.cell_type == "code"}


@functools.cache
def released(slugs: tuple[str, ...], config: str | None = None) -> Path:
    """A course root with `slugs` released by stock nbgrader under the course's own
    pyproject.toml `config` (None: none), made once per test process (a release and its new
    gradebook cost seconds): every Course of them is a copy."""
    root = Path(tempfile.mkdtemp(prefix="released-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    shutil.copy(authoring.ROOT / "nbgrader_config.py", root)
    if config is not None:
        (root / "pyproject.toml").write_text(config)
    for slug in slugs:
        shutil.copytree(authoring.ROOT / "solutions" / slug, root / "solutions" / slug)
    authoring.release(root)
    return root


def canvas_download(course: Course, slug: str, uploads: list[tuple[str, Path, bool]]) -> Path:
    """hand_in() zips as Canvas's "Download Submissions" gives them, in
    downloaded/SLUG/archive/: one zip of every upload (uploader, zip, LATE), each named
    "{name}[_LATE]_{Canvas user id}_{attachment id}_{file}", and Canvas's gradebook export as
    the course's lms-roster.csv (ID: the Canvas user id, SIS User ID: the student id)."""
    archive = course.root / "downloaded" / slug / "archive"
    archive.mkdir(parents=True, exist_ok=True)
    users = {student: 1000 + k for k, student in enumerate(dict.fromkeys(s for s, _, _ in uploads))}
    with open(course.root / "lms-roster.csv", "w", newline="") as f:
        f.write("Student,ID,SIS User ID,SIS Login ID,Section\n    Points Possible,,,,\n")
        f.writelines(f'"{s.title()}, Student",{user},{s},{s}@example.org,\n' for s, user in users.items())
    with zipfile.ZipFile(archive / f"autograd-course-{slug} submissions.zip", "w") as download:
        for attachment, (student, zipped, late) in enumerate(uploads, 5000):
            late_mark = "_LATE" if late else ""
            download.write(zipped, f"{student}student{late_mark}_{users[student]}_{attachment}_{zipped.name}")
    return archive


def namespace(slug: str, answers: dict[str, str] | None = None) -> dict:
    """Run a notebook in-process as a kernel would, without its checks: given and answer
    cells must run, demonstrations may fail (a wrong answer breaks them); output is
    discarded. `answers` {answer_id: source} replace model solutions."""
    nb = nbformat.read(authoring.solution_path(slug), as_version=4)
    # A module of its own, as IPython's __main__ is: torch.compile finds the notebook's
    # classes through sys.modules[cls.__module__].
    module = types.ModuleType(f"notebook_{slug}")
    sys.modules[module.__name__] = module
    ns: dict = module.__dict__
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            grade_id = meta.get("grade_id", "")
            if cell.cell_type != "code" or meta.get("grade") or grade_id == "setup" or grade_id.startswith("check"):
                continue
            source = (answers or {}).get(grade_id, model_solution(cell.source) if meta.get("solution") else cell.source)
            try:
                exec(compile(source, f"<{slug}:{grade_id or 'demo'}>", "exec"), ns)
            except Exception:
                if grade_id:
                    raise
    return ns


@dataclass
class Submission:
    student: str
    answers: dict = field(default_factory=dict)  # exercise -> the answers.Answer it carries
    wrong: bool = False  # the answers it carries are wrong ones


def packed(kind: str, answers: list, wrong: bool) -> list[Submission]:
    """Answers of different exercises share submissions: submission k carries the k-th answer
    of each exercise (so each exercise must be graded independently)."""
    by_exercise: dict[str, list] = {}
    for answer in answers:
        by_exercise.setdefault(answer.exercise, []).append(answer)
    rows = itertools.zip_longest(*by_exercise.values())
    return [Submission(f"{kind}{k}", {a.exercise: a for a in row if a is not None}, wrong)
            for k, row in enumerate(rows)]


# The notebooks stock nbgrader runs on in `make test` (`--stock-all`: every one): together
# they have every kind of graded cell and answer — Functions' visible and hidden checks, a
# quiz scored in part (03); answers of an earlier notebook imported (02); a design and a
# written answer a person grades, capstone checks (11).
COVERING = ("02_higher_order_and_fusion", "03_function_basics", "11_capstone")
# The notebook whose class batch grades every known answer in `make test` (`--classes-all`:
# every notebook's); the others grade the first wrong and right answer of each exercise.
GRADED_WHOLE = ("03_function_basics",)


def every_answer_graded(slug: str, config: pytest.Config) -> bool:
    """Whether `slug`'s class batch grades every known answer in this run, not the sample."""
    return slug in GRADED_WHOLE or any(config.getoption(o) for o in ("--classes-all", "--stock-all"))

@dataclass
class ClassBatch:
    """Every known answer of one notebook, submitted, and graded by `autograder grade`."""

    slug: str
    course: Course
    exercises: list[Exercise]
    submissions: dict[str, Submission]
    result: subprocess.CompletedProcess
    every: bool  # every known answer graded, not the sample (every_answer_graded)
    scores_read: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict, repr=False)

    # What stock nbgrader also grades in `make test`: a wrong and a right answer of every
    # exercise (right0 passes every graded cell, as the model does); `make compare-stock`
    # grades every submission of the batch, the released notebook included.
    SAMPLE = ("wrong0", "right0")

    @staticmethod
    def submissions_of(slug: str, every: bool) -> list[Submission]:
        """The model solution, and every known answer packed (`every`) or only the first
        submission of each kind: the first wrong and the first right answer of each exercise."""
        from answers import for_notebook

        module = for_notebook(slug)
        kept = None if every else 1
        return [Submission("correct"), *packed("wrong", module.MUTANTS, True)[:kept],
                *packed("right", module.VARIANTS, False)[:kept]]

    @staticmethod
    def graded(slug: str, root: Path, every: bool) -> "ClassBatch":
        course = Course(root, [slug])
        nb = nbformat.read(authoring.solution_path(slug), as_version=4)
        found = exercises(nb)
        model = {e.answer_id: e.solution for e in found}
        submissions = ClassBatch.submissions_of(slug, every)
        for sub in submissions:  # each writes the answers a person grades too: they stay for formgrader
            course.submit(sub.student, slug, {**written_answers(nb), **model,
                                              **{ex: a.apply(model[ex]) for ex, a in sub.answers.items()}})
        course.submit("released", slug, None)
        course.keep_secret(f"class batch {slug}")
        autograder = Path(sys.executable).with_name("autograder")
        result = subprocess.run([str(autograder), "grade", slug, "--feedback"], cwd=root, capture_output=True,
                                text=True, timeout=1800)
        return ClassBatch(slug, course, found, {s.student: s for s in submissions}, result, every)

    def scores(self, student: str) -> dict[str, tuple[float, float]]:
        """Course.scores, read from the gradebook once per submission (hundreds of tests ask)."""
        if student not in self.scores_read:
            self.scores_read[student] = self.course.scores(self.slug, student)
        return self.scores_read[student]

    def points(self, student: str, exercise: Exercise) -> tuple[float, float]:
        scores = self.scores(student)
        return (sum(scores[g][0] for g in exercise.graded), sum(scores[g][1] for g in exercise.graded))
