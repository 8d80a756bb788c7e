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
so each quiz's visible check judges and explains every answer at once. Never publish it
for a graded class: it gives the quizzes' points away.
"""
from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

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

At the end of a notebook (in Colab or Jupyter), run

    from autograder.student.handin import hand_in
    hand_in("your-student-id")

It writes `your-student-id__SLUG.zip` (in Colab it also downloads it) with your notebook
as your instructor's grading tools expect it. Upload that file where your instructor
asks. Save the notebook first (Ctrl+S) in Jupyter: the file on disk is what is handed in.
'''


SELF_STUDY = '''
## Quizzes

This is the self-study edition: each quiz's check tells you at once which answers are right
and explains every one. (A graded class gets an edition without the keys; there the
quizzes are graded when you hand in.)
'''


def _config(root: Path) -> dict:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


student_repository = authoring.student_repository


def _colab_link(repository: str, slug: str) -> str:
    path = repository.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{path}/blob/main/course/{slug}/{slug}.ipynb"


def build_package(out: Path, root: Path = authoring.ROOT, self_study: bool = False) -> Path:
    """Only the student package (pyproject.toml, README.md, autograder/) in `out`; with
    `self_study`, the quizzes' keys too."""
    version = _config(root)["project"]["version"]
    url = student_repository(root)
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
    (out / "README.md").write_text(README.format(rows=rows) + (SELF_STUDY if self_study else ""))
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
    public repository: build, commit, push).
    """
    out.mkdir(parents=True, exist_ok=True)
    for entry in out.iterdir():
        if entry.name != ".git":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    build_package(out, root, self_study)
    for slug in released(root):
        target = out / "course" / slug
        target.mkdir(parents=True)
        shutil.copy(root / "course" / slug / f"{slug}.ipynb", target / f"{slug}.ipynb")
    (out / ".gitignore").write_text("__pycache__/\n*.egg-info/\nbuild/\n.ipynb_checkpoints/\n*.zip\n")
    return out


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"
