"""What students install and open holds nothing of the instructor's: the student package
and the released notebooks, built by `make publish`, searched for the distinctive lines of
every solution, hidden test and quiz key."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder import authoring, publish
from autograder.checks import answers
from instructor_material import instructor_lines

# Lines of solutions that the student side may share without giving an answer away, each
# with the reason. Boilerplate of any custom Function:
COMMON = {
    "(indices,) = ctx.saved_tensors": "boilerplate: student/save_for_backward.py's TopTwo (a given example, not Sort)",
    "ctx.mark_non_differentiable(indices)": "boilerplate: TopTwo, a given example of notebook 06",
    "ctx.save_for_backward(indices)": "boilerplate: TopTwo",
    "return values, indices": "boilerplate: TopTwo",
    "ctx.save_for_backward(x, beta)": "boilerplate: student/real_world.py's SwishStandIn, whose values "
                                      "come from the grader",
    "x, beta = ctx.saved_tensors": "boilerplate: SwishStandIn",
    "z = torch.zeros_like(x)": "the start of a plain fixed-point iteration (exercises/real_world.py's "
                               "unrolled reference)",
    # The forward of a function as its exercise defines it (the exercise is its backward):
    "return x * torch.sigmoid(beta * x)": "Swish's definition, forward only",
    "return x.clamp(0, clip)": "ClippedReLU's definition, forward only",
    "out = func(*args, **(kwargs or {}))": "boilerplate: any dispatch mode's first line (student/saved.py's Watch)",
}
# The course's own code doing what an exercise asks for — a reference its visible check needs
# in the student's kernel, or a meter the notebooks use — shares the answer's key lines.
KNOWN = {
    "with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):":
        "student/saved.py's recorder is the heart of exercise 6's saved_by answer",
    "if t.dtype in (torch.float32, torch.float64) and not (t.is_leaf and t.requires_grad):":
        "exercises/memory.py's reference rounding is save_as_bf16's pack (08_memory_checkpointing)",
    "storage = t.untyped_storage()": "student/memory.py's meter reads storages as kept_alive must",
    "blocks[storage.data_ptr()] = storage.nbytes()": "exercises/save_for_backward.py's kept_alive reference",
    "return sum(blocks.values())": "exercises/save_for_backward.py's kept_alive reference",
    "return r * torch.cos(theta), r * torch.sin(theta)": "the formula 03's exercise 3.3 states, as its reference",
    "self.peak = max(self.peak, self.now)": "student/memory.py's PeakMemory, 08's meter, keeps a peak as exercise "
                                            "7.9's BackwardMemory must",
}


def _texts(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.suffix in (".py", ".ipynb", ".md", ".toml", ".txt", ".json")}


@pytest.fixture(scope="module")
def public(tmp_path_factory) -> Path:
    return publish.build(tmp_path_factory.mktemp("public") / "repo")


def test_the_public_repository_holds_the_student_package_and_the_released_notebooks_only(public):
    top = sorted(p.name for p in public.iterdir())
    assert top == [".gitignore", "LICENSE", "README.md", "autograder", "course", "pyproject.toml"]
    assert sorted(p.name for p in (public / "autograder").iterdir() if p.name != "__pycache__") == \
        ["__init__.py", "checks", "exercises", "student"]
    assert publish.released() == sorted(p.name for p in (public / "course").iterdir())
    for slug in publish.released():
        assert (public / "course" / slug / f"{slug}.ipynb").read_bytes() == \
            (authoring.ROOT / "course" / slug / f"{slug}.ipynb").read_bytes()
    assert not list(public.rglob("solutions")) and not list(public.rglob("grader"))


def test_nothing_of_a_solution_hidden_test_or_key_is_in_what_students_get(public):
    secrets = instructor_lines()
    assert len(secrets) > 150, len(secrets)
    assert {where.split()[0] for where in secrets.values()} == set(authoring.assignments())  # every notebook's
    leaks = []
    for name, text in _texts(public).items():
        lines = {line.strip() for line in text.splitlines()}
        if name.endswith(".ipynb"):
            lines = {line.strip() for cell in nbformat.reads(text,
                                                             as_version=4).cells for line in cell.source.splitlines()}
        leaks += [f"{name}: {line!r}  <- {secrets[line]}" for line in sorted(lines & set(secrets))
                  if line not in COMMON and line not in KNOWN]
    assert not leaks, "\n".join(leaks)


@pytest.mark.slow
def test_the_student_package_builds_a_wheel_without_the_instructor_side(public, tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(tmp_path),
         str(public)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("autograd_course_student-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "autograder/student/__init__.py" in names and "autograder/exercises/function_basics.py" in names
    assert "autograder/student/visible_checks.json" in names  # the summary cells read it
    assert not [n for n in names if n.startswith(("autograder/grader", "autograder/runner", "autograder/isolation",
                                                    "autograder/cli", "autograder/authoring", "autograder/publish"))]
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: torchviz==0.0.3" in metadata and "typer" not in metadata


QUIZ = "03_function_basics/when_to_write"
ASK = """
import autograder
from autograder.checks.answers import check_answers
from autograder.exercises.function_basics import WHEN_TO_WRITE_CHOICES
assert autograder.__file__.startswith({out!r}), autograder.__file__
check_answers({answers!r}, WHEN_TO_WRITE_CHOICES, "abcdefg", quiz={quiz!r})
"""


@pytest.mark.parametrize("self_study", [False, True])
def test_autograder_publish_writes_the_class_or_the_self_study_edition(tmp_path, self_study):
    """`autograder publish OUT [--self-study]` (make publish): a class's quiz check looks at the
    form only; the self-study edition's names each wrong answer and explains it."""
    out = tmp_path / "public"
    command = [str(Path(sys.executable).with_name("autograder")), "publish", str(out)]
    result = subprocess.run(command + ["--self-study"] * self_study, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    keys = out / "autograder" / "checks" / answers.KEYS_FILE
    assert keys.exists() == self_study
    key = answers.all_quiz_keys()[QUIZ]["key"]
    wrong = {**key, "a": next(c for c in ("composite", "function") if c != key["a"])}
    asked = subprocess.run([sys.executable, "-c", ASK.format(out=str(out), answers=wrong, quiz=QUIZ)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(out)})
    if self_study:
        assert asked.returncode != 0 and "1 of 7 answers are wrong" in asked.stderr, asked.stderr
        assert f"The answer is '{key['a']}'" in asked.stderr
    else:
        assert asked.returncode == 0, asked.stderr
        assert "graded when you hand in" in asked.stdout


@pytest.fixture(scope="module")
def self_study(tmp_path_factory) -> Path:
    return publish.build(tmp_path_factory.mktemp("self-study") / "repo", self_study=True)


def test_the_self_study_edition_has_its_own_address_and_speaks_to_a_learner_alone(self_study):
    """Its package, links and every notebook's setup cell name the self-study repository; no
    notebook has a hand-in cell, and no text speaks of handing in or of an instructor."""
    mine, class_edition = authoring.student_repository(self_study=True), authoring.student_repository()
    assert mine != class_edition
    readme = (self_study / "README.md").read_text()
    assert f'Repository = "{mine}"' in (self_study / "pyproject.toml").read_text()
    assert mine.removeprefix("https://github.com/") in readme and class_edition not in readme
    speaks_of_grading = re.compile(r"\bhand(ed)? in\b|instructor|graded when|upload", re.IGNORECASE)
    assert not speaks_of_grading.search(readme), speaks_of_grading.search(readme)
    for path in sorted((self_study / "course").glob("*/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert not [c for c in nb.cells if authoring.HAND_IN_TAG in c.metadata.get("tags", [])], path.name
        assert next(c for c in nb.cells if c.cell_type == "code").source == authoring.setup_source(self_study=True)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                assert not speaks_of_grading.search(cell.source), (path.name, speaks_of_grading.search(cell.source))


def test_the_self_study_summary_speaks_of_no_grading(self_study):
    shown = subprocess.run(
        [sys.executable, "-c", "from autograder.student import summary as s\n"
         "check = s.VisibleCheck('3.1', 'check_x', 2, '', hidden_points=2)\n"
         "print(s.report('03_function_basics', [s.Row(check, True, 2, '')]))"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(self_study)}, cwd=self_study)
    assert shown.returncode == 0, shown.stderr
    assert "this edition has none" in shown.stdout and "when your notebook is graded" not in shown.stdout


def _clone_of(folder: Path, url: str) -> Path:
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "remote", "add", "origin", url], check=True)
    return folder


@pytest.mark.parametrize("self_study_edition", [False, True])
def test_publishing_refuses_to_write_one_edition_where_the_other_belongs(tmp_path, self_study_edition):
    """Into a clone of the other edition's repository (its address as https or ssh), or over the
    other edition's content: one line, nothing written."""
    other = authoring.student_repository(self_study=not self_study_edition)
    ssh = "git@github.com:" + other.removeprefix("https://github.com/") + ".git"
    for out in (_clone_of(tmp_path / "https", other), _clone_of(tmp_path / "ssh", ssh)):
        with pytest.raises(publish.PublishError, match="edition goes to"):
            publish.build(out, self_study=self_study_edition)
        assert [p.name for p in out.iterdir()] == [".git"]
    built = publish.build(tmp_path / "built", self_study=not self_study_edition)
    command = [str(Path(sys.executable).with_name("autograder")), "publish", str(built)]
    refused = subprocess.run(command + ["--self-study"] * self_study_edition, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "edition goes to" in refused.stderr
    assert (built / "autograder" / "checks" / answers.KEYS_FILE).exists() != self_study_edition  # left as it was
    mine = _clone_of(tmp_path / "mine", authoring.student_repository(self_study=self_study_edition))
    publish.build(mine, self_study=self_study_edition)  # its own repository's clone: written


def test_publish_help_names_the_configuration_keys():
    shown = subprocess.run([str(Path(sys.executable).with_name("autograder")), "publish", "--help"],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert "[tool.autograd-course] student-repository" in shown.stdout and "self-study-repository" in shown.stdout
