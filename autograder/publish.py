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
them: the same, plus every quiz's key and explanations (`autograder/checks/quiz_keys.py`),
so each quiz's visible check judges and explains every answer at once; its notebooks, its
summary and its README speak to a learner alone (no hand-in cell, no instructor). It has a
repository of its own (`self-study-repository`), which its notebooks install from. Never
publish it for a graded class: it gives the quizzes' points away — so `build` refuses to
write one edition into a clone of the other's repository, or over the other's content.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import nbformat

from . import authoring
from .checks import answers

STUDENT_PACKAGES = ("student", "checks", "exercises")  # subpackages of `autograder` students get
DISTRIBUTION = authoring.STUDENT_DISTRIBUTION
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

[tool.setuptools]
packages = {packages}

[tool.setuptools.package-data]
"autograder.student" = ["visible_checks.json"]
'''

INIT = '''\
"""The student side of the autograd course: setup, visible checks and given helpers."""

__version__ = "{version}"
'''

README = '''\
# Autograd, from the inside — student notebooks

Notebooks that teach how PyTorch's autograd works inside and how to write correct custom
`torch.autograd.Function`s. Each exercise has a check you can run; your instructor grades
the hidden checks.

| # | notebook | open in Colab |
|---|---|---|
{rows}

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

Graphs in notebook 07 are drawn by Graphviz's `dot` program (`apt-get install graphviz`,
`brew install graphviz`, `conda install -c conda-forge graphviz`); without it they are
shown as text.

## Handing in

The last cell of every notebook hands it in: write your student id between its quotes and
run it. It saves the notebook and writes `your-student-id__SLUG.zip` beside it (in Colab
it also downloads it), your notebook as your instructor's grading tools expect it. Upload
that file where your instructor asks.
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

Graphs in notebook 07 are drawn by Graphviz's `dot` program (`apt-get install graphviz`,
`brew install graphviz`, `conda install -c conda-forge graphviz`); without it they are
shown as text.

## What the checks tell you

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
    (r"and a hidden part with other inputs and fresh random values, graded when you hand in\.",
     "and, in a graded class, a hidden part with other inputs (not in this edition: a passing check is a good "
     "sign, not a proof)."),
    (r"The quizzes' visible checks look at the form of your answers only; whether they are right is graded when you "
     r"hand in, and your feedback then explains each answer\.",
     "Each quiz's check tells you at once which answers are right, and explains every one."),
]


class PublishError(Exception):
    """Nothing was written; the message says why and what to do."""


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
    (package / "__init__.py").write_text(INIT.format(version=version))
    source = root / "autograder"
    for name in STUDENT_PACKAGES:
        target = package / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if self_study:
        answers.write_keys_module(package, root)
    packages = ["autograder", *(f"autograder.{name}" for name in STUDENT_PACKAGES)]
    (out / "pyproject.toml").write_text(PYPROJECT.format(
        name=DISTRIBUTION, version=version, url=url,
        dependencies=_toml_list(DEPENDENCIES), packages=_toml_list(packages),
    ))
    slugs = released(root)
    rows = "\n".join(f"| {slug[:2]} | `{slug}` | [open]({_colab_link(url, slug)}) |" for slug in slugs)
    (out / "README.md").write_text((SELF_STUDY_README if self_study else README).format(rows=rows))
    if (root / "LICENSE").exists():
        shutil.copy(root / "LICENSE", out / "LICENSE")
    return out


def released(root: Path = authoring.ROOT) -> list[str]:
    """Slugs of the notebooks released in course/."""
    return sorted(p.parent.name for p in (root / "course").glob("*/*.ipynb") if p.stem == p.parent.name)


def build(out: Path, root: Path = authoring.ROOT, self_study: bool = False) -> Path:
    """The public repository's content in `out`: the student package and course/ (with
    `self_study`, the edition for self-learners: the quizzes' keys too).

    Whatever `out` held before is replaced, except `.git` (so `out` can be a clone of the
    public repository: build, commit, push) — unless it is the other edition's (PublishError).
    """
    check_edition(out, root, self_study)
    out.mkdir(parents=True, exist_ok=True)
    for entry in out.iterdir():
        if entry.name != ".git":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
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
    return out


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def self_study_notebook(released: Path, root: Path = authoring.ROOT) -> nbformat.NotebookNode:
    """A released notebook as the self-study edition has it: its setup cell installs from the
    self-study repository, no hand-in cell, and its text speaks to a learner alone."""
    nb = nbformat.read(released, as_version=4)
    nb.cells = [c for c in nb.cells if authoring.HAND_IN_TAG not in c.metadata.get("tags", [])]
    setup = next(c for c in nb.cells if c.cell_type == "code")
    setup.source = authoring.setup_source(root, self_study=True)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for pattern, sentence in SELF_STUDY_TEXT:  # a sentence may break across lines anywhere
                cell.source = re.sub(pattern.replace(" ", r"\s+"), sentence, cell.source)
    return nb
