"""What students get: the student package and the released notebooks, and nothing else.

`build(out)` writes a folder meant to be pushed as the course's *public* repository (the
instructor's own repository, with `solutions/`, stays private):

    out/README.md                     how to work on the course (Colab, JupyterLab, hand-in)
    out/pyproject.toml                the package `autograd-course-student`
    out/autograder/                   __init__.py, student/, checks/, exercises/ (no grader)
    out/course/SLUG/SLUG.ipynb        the released notebooks (no solutions, no hidden tests)

Colab's setup cell installs that package from the public repository
(`[tool.autograd-course] student-repository` in pyproject.toml). The student package
holds what runs in a student's kernel — the setup cell's code, the visible checks, the
given helpers — and nothing of the instructor's side: no grader, no command line, no
authoring tools, no solutions, hidden tests or quiz keys (tests/test_publish.py builds it
and searches it for the distinctive lines of each).

`build(out, self_study=True)` is the edition for self-learners, who have no one to grade
them: the same, plus every tier of every hint (a class receives the first `hint-tiers`,
autograder/hints.py) and every quiz's key and explanations (`autograder/checks/quiz_keys.py`),
so each quiz's visible check judges and explains every answer at once; its notebooks, its
summary and its README speak to a learner alone (no hand-in cell, no instructor). It has a
repository and a distribution name of its own (`self-study-repository`,
`autograd-course-self-study`), which its notebooks install from. Never publish it for a
graded class: it gives the quizzes' points away — so `build` refuses to write one edition
into a clone of the other's repository, or over the other's content.

`build` writes only into an empty folder (a fresh clone of an empty repository: `.git`
alone) or one it wrote itself: `.autograder-publish` (MARKER, committed with the rest) lists
the files it wrote, and the next build replaces those and nothing else. It refuses, in one
line saying what is there and before it writes anything, any other folder, any folder that
holds a course's own files (nbgrader_config.py, solutions/, a gradebook, submissions, the
grading secret), and the course root or a folder above it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path, PurePosixPath

import nbformat

from . import authoring

STUDENT_PACKAGES = ("student", "checks", "exercises")  # subpackages of `autograder` students get
MARKER = ".autograder-publish"  # in what `build` wrote: the files it wrote (JSON), committed with them
# What only an instructor's course holds: `build` never writes into a folder that has one.
COURSE_FILES = ("nbgrader_config.py", "solutions", "gradebook.db", "submitted", "autograded", ".autograder")
SHOWN = 6  # names listed in a refusal, at most
# What the student side imports besides the standard library. No upper bound on torch: in
# Colab, pip keeps the preinstalled torch whenever it satisfies this (it always has).
DEPENDENCIES = ["torch>=2.4", "numpy>=1.26", "torchviz==0.0.3", "graphviz>=0.20", "setuptools>=68"]

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
description = "The student side of the autograd course: the setup cell, the visible checks and the given helpers."
readme = "README.md"
license = "MIT"
requires-python = ">=3.10"
dependencies = {dependencies}

[project.urls]
Repository = "{url}"

[project.entry-points.pytest11]
autograd_course = "autograder.checks.pytest_plugin"

[tool.setuptools]
packages = {packages}

[tool.setuptools.package-data]
"autograder.student" = ["visible_checks.json"]
'''

INIT = '''\
"""The student side of the autograd course: setup, visible checks and given helpers."""

__version__ = "{version}"
'''

# How to work on the course, in both editions' READMEs.
OWN_MACHINE = '''\
## In Google Colab

Open a notebook with its link above (or File → Open notebook → GitHub, and paste this
repository's address). Run the first cell: it installs this course's checks (a few
seconds; Colab's own PyTorch stays) and prints `torch ...; checks run on ...`. If the
install fails it says why (most often: the runtime has no internet) — run the cell again.
Colab keeps your work in your Google Drive only if you save a copy there (File → Save a
copy in Drive).

## On your own machine (JupyterLab)

    python -m venv .venv && . .venv/bin/activate      # Windows: .venv\\Scripts\\activate
    pip install -e . jupyterlab                       # the checks, torch and JupyterLab
    cp -r course my-work                              # work on your own copy
    jupyter lab my-work

On Linux without an NVIDIA GPU, install PyTorch's CPU build first
(`pip install torch --index-url https://download.pytorch.org/whl/cpu`): PyPI's torch for
Linux is the CUDA build, a 527 MB wheel plus the `nvidia-*` libraries it needs.

Graphs in notebook 07 are drawn by Graphviz's `dot` program (`apt-get install graphviz`,
`brew install graphviz`, `conda install -c conda-forge graphviz`); without it they are
shown as text.

'''

README = '''\
# Autograd, from the inside — student notebooks

Notebooks that teach how PyTorch's autograd works inside and how to write correct custom
`torch.autograd.Function`s. Each exercise has a check you can run; your instructor grades
the hidden checks.

| # | notebook | open in Colab |
|---|---|---|
{rows}

''' + OWN_MACHINE + '''## Handing in

The last cell of every notebook hands it in: write your student id between its quotes and
run it. It saves the notebook and writes `your-student-id__SLUG.zip` beside it (in Colab
it also downloads it), your notebook as your instructor's grading tools expect it. Upload
that file where your instructor asks. On a JupyterHub whose menu has Nbgrader → Assignment
List, submit there instead (the cell says so).
'''

SELF_STUDY_README = '''\
# Autograd, from the inside — the self-study edition

Notebooks that teach how PyTorch's autograd works inside and how to write correct custom
`torch.autograd.Function`s, for learning on your own. Each exercise has a check you can run
at any time; each quiz's check tells you at once which answers are right and explains every
one; the last cell of a notebook adds up your points.

| # | notebook | open in Colab |
|---|---|---|
{rows}

''' + OWN_MACHINE + '''## What the checks tell you

A check names the input, the expected and the actual value, and the likely mistake. A class
taught with this course is also graded on hidden checks (other inputs, other shapes); they
are not part of this edition, so a passing check is a good sign, not a proof: try your code
on inputs of your own too.
'''

# The class edition's sentences about grading, and what the self-study edition says instead.
SELF_STUDY_TEXT = [
    (r"The hidden checks and the quizzes' keys are graded when you hand in\.",
     "The quizzes' checks tell you at once which answers are right and why. A graded class also runs hidden "
     "checks on other inputs; this edition has none, so a passing check is a good sign, not a proof."),
    (r"The hidden checks(?: \([^)]*\))? are graded when you hand in\.",
     "A graded class also runs hidden checks on other inputs; this edition has none, so a passing check is a good "
     "sign, not a proof."),
    (r"and a hidden part with other inputs and fresh random values, graded when you hand in; the design write-up "
     r"is read and graded by your instructor, with the rubric shown above it\.",
     "and, in a graded class, a hidden part with other inputs (not in this edition: a passing check is a good "
     "sign, not a proof); grade your design write-up yourself, with the rubric shown above it."),
    (r"The hidden checks \(other inputs, fresh random values\) are graded when you hand in, and your design "
     r"write-up is graded by a person \(4 points, not counted here\)\.",
     "A graded class also runs hidden checks on other inputs, and a person grades its design write-ups (4 points, "
     "not counted here)."),
    (r"Your instructor reads it in formgrader and grades it with this rubric, one point a row:",
     "In a graded class a person grades it with this rubric, one point a row; grade yours the same way:"),
    (r"and a hidden part with other inputs and fresh random values, graded when you hand in\.",
     "and, in a graded class, a hidden part with other inputs (not in this edition: a passing check is a good "
     "sign, not a proof)."),
    (r"The quizzes' visible checks look at the form of your answers only; whether they are right is graded when you "
     r"hand in, and your feedback then explains each answer\.",
     "Each quiz's check tells you at once which answers are right, and explains every one."),
]


class PublishError(Exception):
    """Nothing was written; the message (one line) says why and what to do."""


def _config(root: Path) -> dict:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


student_repository = authoring.student_repository


def _address(url: str) -> str:
    """A repository's address without its scheme, user, `.git` or case: the same repository
    as https://, ssh:// or git@host:path compares equal."""
    url = re.sub(r"^[a-z+]+://", "", url.strip().lower()).removesuffix("/").removesuffix(".git")
    return re.sub(r"^[^@/]*@", "", url).replace(":", "/", 1)


def _addresses_in(out: Path) -> set[str]:
    """The repositories `out` belongs to: its git remotes, and the one a build wrote there."""
    found = set()
    if (out / ".git").exists():
        remotes = subprocess.run(["git", "-C", str(out), "config", "--get-regexp", r"^remote\..*\.url$"],
                                 capture_output=True, text=True)
        found |= {_address(line.split(maxsplit=1)[1]) for line in remotes.stdout.splitlines() if " " in line}
    if (out / "pyproject.toml").exists():
        try:
            found.add(_address(_config(out)["project"]["urls"]["Repository"]))
        except (KeyError, tomllib.TOMLDecodeError):
            pass
    return found


def check_edition(out: Path, root: Path = authoring.ROOT, self_study: bool = False) -> str:
    """The repository this edition goes to; PublishError when `out` belongs to the other
    edition's (a clone of it, or its content), or both editions have one address."""
    mine, theirs = student_repository(root, self_study), student_repository(root, not self_study)
    key = "self-study-repository" if self_study else "student-repository"
    if _address(mine) == _address(theirs):
        raise PublishError(f"the class and the self-study editions have one address ({mine}) in pyproject.toml: give "
                           "each its own repository ([tool.autograd-course] student-repository, self-study-repository)")
    if _address(theirs) in _addresses_in(out):
        edition = "self-study" if self_study else "class"
        other = "class" if self_study else "self-study (with every quiz's key)"
        raise PublishError(f"{out} holds the {other} edition ({theirs}): the {edition} edition goes to {mine} "
                           f"([tool.autograd-course] {key} in pyproject.toml); publish it into a clone of that")
    return mine


def _colab_link(repository: str, slug: str) -> str:
    path = repository.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{path}/blob/main/course/{slug}/{slug}.ipynb"


def build_package(out: Path, root: Path = authoring.ROOT, self_study: bool = False) -> Path:
    """Only the student package (pyproject.toml, README.md, autograder/) in `out`; with
    `self_study`, the quizzes' keys too."""
    version = _config(root)["project"]["version"]
    url = student_repository(root, self_study)
    package = out / "autograder"
    package.mkdir(parents=True, exist_ok=True)
    source = root / "autograder"
    (package / "__init__.py").write_text(INIT.format(version=version) + _after_version(source / "__init__.py"))
    for name in STUDENT_PACKAGES:
        target = package / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if self_study:
        from .checks import answers  # (the checks import torch: not for a refusal)

        answers.write_keys_module(package, root)
    packages = sorted(".".join(p.parent.relative_to(out).parts) for p in package.rglob("__init__.py"))
    (out / "pyproject.toml").write_text(PYPROJECT.format(
        name=authoring.distribution(self_study), version=version, url=url,
        dependencies=_toml_list(DEPENDENCIES), packages=_toml_list(packages),
    ))
    slugs = released(root)
    rows = "\n".join(f"| {slug[:2]} | `{slug}` | [open]({_colab_link(url, slug)}) |" for slug in slugs)
    (out / "README.md").write_text((SELF_STUDY_README if self_study else README).format(rows=rows))
    if (root / "LICENSE").exists():
        shutil.copy(root / "LICENSE", out / "LICENSE")
    return out


def _after_version(init: Path) -> str:
    """What the package's own __init__.py defines after its version: `from autograder import
    check_function` works in the student package too."""
    return init.read_text().split("\n__version__", 1)[1].split("\n", 1)[1]


def released(root: Path = authoring.ROOT) -> list[str]:
    """Slugs of the notebooks released in course/."""
    return sorted(p.parent.name for p in (root / "course").glob("*/*.ipynb") if p.stem == p.parent.name)


def build(out: Path, root: Path = authoring.ROOT, self_study: bool = False) -> Path:
    """The public repository's content in `out`: the student package and course/ (with
    `self_study`, the edition for self-learners: the quizzes' keys too).

    `out` must be empty (but for `.git`: a clone of the public repository) or written by an
    earlier build (its MARKER): the files that build wrote are replaced, anything else in
    `out` stays. Any other folder is refused (PublishError) before anything is written.
    """
    out = Path(out).resolve()
    before = _written_before(out, root)
    check_edition(out, root, self_study)
    with tempfile.TemporaryDirectory(prefix="autograder-publish-") as staging:
        built = Path(staging)
        _build_into(built, root, self_study)
        files = sorted(str(PurePosixPath(*p.relative_to(built).parts)) for p in built.rglob("*") if p.is_file())
        theirs = [f for f in files if f not in before and os.path.lexists(out / f)]
        if theirs:
            raise PublishError(f"{out} holds {_listed(theirs)}, which `autograder publish` did not write (its "
                               f"{MARKER} does not list them) and would replace: move them away, then publish again")
        out.mkdir(parents=True, exist_ok=True)
        _mark(out, sorted(set(before) | set(files)))  # from here, every file that may be there is listed
        for name in sorted(set(before) - set(files)):  # written before, not now: a notebook since removed
            _remove(out, name)
        for name in files:
            target = out / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(built / name, target)
        _mark(out, files)
    return out


def _build_into(out: Path, root: Path, self_study: bool) -> None:
    build_package(out, root, self_study)
    for slug in released(root):
        target = out / "course" / slug
        target.mkdir(parents=True)
        notebook = root / "course" / slug / f"{slug}.ipynb"
        if self_study:
            (target / f"{slug}.ipynb").write_text(nbformat.writes(self_study_notebook(notebook, root)) + "\n")
        else:
            shutil.copy(notebook, target / f"{slug}.ipynb")
    (out / ".gitignore").write_text("__pycache__/\n*.egg-info/\nbuild/\n.ipynb_checkpoints/\n*.zip\n")


def _written_before(out: Path, root: Path) -> list[str]:
    """The files an earlier build wrote in `out` ([] for an empty or new folder); PublishError
    for the course root or a folder above it, a folder with a course's own files, or a folder
    that `build` did not write."""
    root = Path(root).resolve()
    if root.is_relative_to(out):
        what = "the course root" if out == root else f"a folder above the course root {root}"
        raise PublishError(f"{out} is {what}: publishing there would replace the course itself; publish into an "
                           "empty folder (make publish writes public/) or a clone of the public repository")
    if not out.exists():
        return []
    if not out.is_dir():
        raise PublishError(f"{out} is a file, not a folder: publish into an empty folder or a clone of the public "
                           "repository")
    entries = sorted(e.name for e in os.scandir(out) if e.name != ".git")
    course = [name for name in COURSE_FILES if name in entries]
    if course:
        raise PublishError(f"{out} holds a course's own files ({_listed(course)}): publish never writes there, so "
                           "nothing of the course can be lost or pushed; publish into an empty folder or a clone of "
                           "the public repository")
    if not entries:
        return []
    if MARKER not in entries:
        raise PublishError(f"{out} is not empty and `autograder publish` did not write it (no {MARKER}; it holds "
                           f"{_listed(entries)}): publish into an empty folder or a clone of the public repository")
    try:
        listed = json.loads((out / MARKER).read_text())["files"]
        if not all(isinstance(f, str) and _inside(f) for f in listed):
            raise ValueError("a file outside the folder")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise PublishError(f"{out / MARKER} does not list what publish wrote ({error}): restore it from the public "
                           "repository (git checkout), or publish into an empty folder") from None
    return list(listed)


def _inside(name: str) -> bool:
    """`name` is a path a build writes: relative, within the folder, outside .git."""
    path = PurePosixPath(name)
    return bool(path.parts) and not path.is_absolute() and ".." not in path.parts and path.parts[0] != ".git"


def _mark(out: Path, files: list[str]) -> None:
    text = json.dumps({"written by": "autograder publish: it replaces these files, and no other, when run again",
                       "files": files}, indent=1) + "\n"
    staged = out / f"{MARKER}.new"
    staged.write_text(text)
    os.replace(staged, out / MARKER)


def _remove(out: Path, name: str) -> None:
    """A file an earlier build wrote, and the folders it leaves empty."""
    path = out / name
    if path.is_symlink() or path.is_file():
        path.unlink()
    for parent in path.parents:
        if parent == out or not parent.is_dir() or any(parent.iterdir()):
            break
        parent.rmdir()


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _nothing_to_run(cell) -> bool:
    """A graded code cell of comments alone: a hidden test cell as the release leaves it."""
    lines = [line.strip() for line in cell.source.splitlines()]
    return cell.cell_type == "code" and bool(cell.metadata.get("nbgrader", {}).get("grade")) and \
        all(not line or line.startswith("#") for line in lines)


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def self_study_notebook(released: Path, root: Path = authoring.ROOT) -> nbformat.NotebookNode:
    """A released notebook as the self-study edition has it: every tier of every hint (from
    solutions/: a class receives only the first few), its setup cell installs from the
    self-study repository, no hand-in cell, no hidden test cell (left with only its comment
    by the release: this edition has no hidden tests), and its text speaks to a learner alone."""
    from . import hints  # (it loads nbgrader: not for a refusal)

    nb = hints.every_tier(nbformat.read(released, as_version=4),
                          nbformat.read(authoring.solution_path(released.stem, root), as_version=4))
    nb.cells = [c for c in nb.cells
                if authoring.HAND_IN_TAG not in c.metadata.get("tags", []) and not _nothing_to_run(c)]
    setup = next(c for c in nb.cells if c.cell_type == "code")
    setup.source = authoring.setup_source(root, self_study=True)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for pattern, sentence in SELF_STUDY_TEXT:  # a sentence may break across lines anywhere
                cell.source = re.sub(pattern.replace(" ", r"\s+"), sentence, cell.source)
    return nb
