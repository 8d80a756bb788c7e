"""What students install and open holds nothing of the instructor's: the student package
and the released notebooks, built by `make publish`, searched for the distinctive lines of
every solution, hidden test and quiz key."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder import authoring, hints, publish
from autograder.checks import answers
from instructor_material import earlier_lines, instructor_lines

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
    "self.peak = max(self.peak, self.now)": "student/memory.py's PeakMemory, the base of exercises/"
                                            "engine_and_dispatcher.py's Measure, the reference 7.9's visible "
                                            "check needs in the kernel; a meter that is or builds on a course "
                                            "class fails 7.9 (student/engine_and_dispatcher.py's course_class)",
}


def _texts(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.suffix in (".py", ".ipynb", ".md", ".toml", ".txt", ".json")}


@pytest.fixture(scope="module")
def public(tmp_path_factory) -> Path:
    return publish.build(tmp_path_factory.mktemp("public") / "repo")


def test_the_public_repository_holds_the_student_package_and_the_released_notebooks_only(public):
    top = sorted(p.name for p in public.iterdir())
    assert top == [".autograder-publish", ".gitignore", "LICENSE", "README.md", "autograder", "course",
                   "pyproject.toml"]
    assert sorted(p.name for p in (public / "autograder").iterdir() if p.name != "__pycache__") == \
        ["__init__.py", "checks", "exercises", "student"]
    assert publish.released() == sorted(p.name for p in (public / "course").iterdir())
    for slug in publish.released():
        assert (public / "course" / slug / f"{slug}.ipynb").read_bytes() == \
            (authoring.ROOT / "course" / slug / f"{slug}.ipynb").read_bytes()
    assert not list(public.rglob("solutions")) and not list(public.rglob("grader"))


def _leaks(folder: Path) -> list[str]:
    """Lines of the instructor's material in `folder`, but the ones allowed (COMMON, KNOWN, and
    the earlier answers a module of autograder/student/earlier/ may give)."""
    secrets = instructor_lines()
    leaks = []
    for name, text in _texts(folder).items():
        lines = {line.strip() for line in text.splitlines()}
        if name.endswith(".ipynb"):
            lines = {line.strip() for cell in nbformat.reads(text,
                                                             as_version=4).cells for line in cell.source.splitlines()}
        given = earlier_lines(name)
        leaks += [f"{name}: {line!r}  <- {secrets[line]}" for line in sorted(lines & set(secrets))
                  if line not in COMMON and line not in KNOWN and line not in given]
    return leaks


def test_nothing_of_a_solution_hidden_test_or_key_is_in_what_students_get(public):
    secrets = instructor_lines()
    assert len(secrets) > 150, len(secrets)
    assert {where.split()[0] for where in secrets.values()} == set(authoring.assignments())  # every notebook's
    leaks = _leaks(public)
    assert not leaks, "\n".join(leaks)


def test_an_earlier_answer_is_allowed_in_its_own_module_only(public, tmp_path):
    """The allowance for autograder/student/earlier/ is its past-due notebook's model answers,
    in that notebook's module: another notebook's line there, or one of them elsewhere, is a leak."""
    copy = tmp_path / "public"
    shutil.copytree(public, copy)
    given = sorted(earlier_lines("autograder/student/earlier/function_basics.py") & set(instructor_lines()))
    assert given, "03's ClippedReLU is given, past due, in this repository's configuration"
    other = next(line for line, where in instructor_lines().items() if where.startswith("05_gradcheck"))
    with open(copy / "autograder" / "student" / "earlier" / "function_basics.py", "a") as f:
        f.write(f"\n{other}\n")
    with open(copy / "autograder" / "student" / "report.py", "a") as f:
        f.write(f"\n{given[0]}\n")
    assert len(_leaks(copy)) == 2, _leaks(copy)


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
    assert "autograder/student/earlier/function_basics.py" in names  # a subpackage: 10 imports 03's answer
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


@pytest.mark.slow  # `autograder publish` in processes of its own: seconds
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
    """Its package (a distribution of its own), links and every notebook's setup cell name the
    self-study repository; no notebook has a hand-in cell or a hidden test cell, and no text
    speaks of handing in or of an instructor."""
    mine, class_edition = authoring.student_repository(self_study=True), authoring.student_repository()
    assert mine != class_edition
    readme = (self_study / "README.md").read_text()
    project = (self_study / "pyproject.toml").read_text()
    assert f'Repository = "{mine}"' in project and f'name = "{authoring.SELF_STUDY_DISTRIBUTION}"' in project
    assert mine.removeprefix("https://github.com/") in readme and class_edition not in readme
    speaks_of_grading = re.compile(r"\bhand(ed)? in\b|instructor|graded when|upload", re.IGNORECASE)
    assert not speaks_of_grading.search(readme), speaks_of_grading.search(readme)
    for path in sorted((self_study / "course").glob("*/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert not [c for c in nb.cells if authoring.HAND_IN_TAG in c.metadata.get("tags", [])], path.name
        assert next(c for c in nb.cells if c.cell_type == "code").source == authoring.setup_source(self_study=True)
        hidden = [c.metadata.nbgrader.grade_id for c in nb.cells if "# Hidden tests" in c.source]
        assert not hidden, (path.name, hidden)  # this edition has none: no cell says it has
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                assert not speaks_of_grading.search(cell.source), (path.name, speaks_of_grading.search(cell.source))


def test_a_class_gets_the_configured_hint_tiers_and_self_learners_every_tier(public, self_study):
    """The class edition's notebooks are course/'s (the first hint-tiers tiers); the self-study
    edition's have every tier of every hint, as solutions/ writes them."""
    for slug in authoring.assignments():
        solution = nbformat.read(authoring.solution_path(slug), as_version=4)
        written = [cell.source for cell in solution.cells if hints.is_hint(cell)]
        learners = nbformat.read(self_study / "course" / slug / f"{slug}.ipynb", as_version=4)
        assert [cell.source for cell in learners.cells if hints.is_hint(cell)] == written, slug
        classes = nbformat.read(public / "course" / slug / f"{slug}.ipynb", as_version=4)
        most = max((t for cell in classes.cells for t in hints.tiers(cell.source)), default=0)
        assert most <= hints.class_tiers(authoring.ROOT), slug


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


@pytest.mark.slow  # `autograder publish` in processes of its own: seconds
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


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` with its bytes (None: a folder)."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))}


def _refused(out: Path, root: Path = authoring.ROOT, self_study: bool = False, kept: Path | None = None) -> str:
    """publish.build's one-line refusal; nothing under `kept` (`out`'s parent) changed."""
    kept = kept or out.parent
    before = _snapshot(kept)
    with pytest.raises(publish.PublishError) as refusal:
        publish.build(out, root, self_study=self_study)
    assert _snapshot(kept) == before
    message = str(refusal.value)
    assert "\n" not in message, message
    return message


def _private_course(folder: Path) -> Path:
    """A clone of an instructor's private course, as `make` left it: its environment, solutions,
    gradebook, submissions and grading secret, with the package's own pyproject.toml."""
    for name, text in (("nbgrader_config.py", "c = get_config()\n"), ("solutions/03/03.ipynb", "{}"),
                       ("gradebook.db", "SQLite"), ("submitted/alice/03/03.ipynb", "{}"),
                       (".autograder/secret", "ab" * 32), (".venv/bin/python", "#!"), ("course/03/03.ipynb", "{}")):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    shutil.copy(authoring.ROOT / "pyproject.toml", folder)
    return folder


def test_autograder_publish_dot_in_a_course_refuses_in_one_line_and_loses_nothing(tmp_path):
    """`cd COURSE && autograder publish .` once deleted the working tree, its .venv included."""
    course = _private_course(tmp_path / "course")
    before = _snapshot(course)
    result = subprocess.run([str(Path(sys.executable).with_name("autograder")), "publish", "."], cwd=course,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "a course's own files" in lines[0] and "nbgrader_config.py" in lines[0], lines
    assert "Traceback" not in result.stderr and _snapshot(course) == before


@pytest.mark.parametrize("what", ["nbgrader_config.py", "solutions", "gradebook.db", "submitted", ".autograder"])
def test_publish_never_writes_where_a_course_keeps_its_own_files(tmp_path, what):
    """Even in a folder an earlier publish wrote: a course's folder is never the public repository."""
    out = publish.build(tmp_path / "public")
    target = out / what / "secret" if what == ".autograder" else out / what
    target.parent.mkdir(exist_ok=True)
    target.write_text("the instructor's")
    assert f"a course's own files ({what})" in _refused(out)


def test_publish_refuses_the_course_root_and_every_folder_above_it(tmp_path):
    root = _private_course(tmp_path / "courses" / "autograd")
    (root / "nbgrader_config.py").unlink()  # even without its own files, the root is the root
    assert "is the course root" in _refused(root, root)
    for above in (root.parent, tmp_path):
        # what is kept is the test's own folder: above it lie every other test's files
        assert f"a folder above the course root {root}" in _refused(above, root, kept=tmp_path)


def test_publish_refuses_a_folder_it_did_not_write_and_says_what_is_there(tmp_path):
    out = tmp_path / "notes"
    (out / "drafts").mkdir(parents=True)
    (out / "plan.md").write_text("week 1")
    line = _refused(out)
    assert "did not write it" in line and "drafts, plan.md" in line, line


def test_publish_replaces_what_it_wrote_before_and_nothing_else(tmp_path):
    """A folder publish wrote, with a file of the instructor's beside (a CI workflow), a file
    only an earlier build wrote (a notebook since removed), and one the build would replace
    that it did not write."""
    out = publish.build(tmp_path / "public")
    workflow = out / ".github" / "workflows" / "check.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text("the instructor's")
    marker = json.loads((out / publish.MARKER).read_text())
    (out / "course" / "99_removed").mkdir()
    (out / "course" / "99_removed" / "99_removed.ipynb").write_text("{}")
    marker["files"].append("course/99_removed/99_removed.ipynb")
    (out / publish.MARKER).write_text(json.dumps(marker))
    (out / "README.md").write_text("edited after publishing")  # publish's own file: written again
    publish.build(out)
    assert workflow.read_text() == "the instructor's" and not (out / "course" / "99_removed").exists()
    assert (out / "README.md").read_text().startswith("# Autograd, from the inside")
    assert ".github/workflows/check.yml" not in json.loads((out / publish.MARKER).read_text())["files"]
    marker = json.loads((out / publish.MARKER).read_text())
    marker["files"].remove("README.md")  # a README.md of the instructor's, which publish would replace
    (out / publish.MARKER).write_text(json.dumps(marker))
    line = _refused(out)
    assert "holds README.md, which `autograder publish` did not write" in line, line


def test_a_clone_of_the_public_repository_is_published_into(tmp_path):
    """The marker is committed with the content, so a fresh clone of the public repository is
    publish's own folder."""
    def git(*args: str, cwd: Path) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=cwd, check=True,
                       capture_output=True)

    first = _clone_of(tmp_path / "first", authoring.student_repository())
    publish.build(first)
    git("add", "-A", cwd=first)
    git("commit", "-qm", "published", cwd=first)
    git("clone", "-q", str(first), str(tmp_path / "second"), cwd=tmp_path)
    publish.build(tmp_path / "second")
    published = {name: data for name, data in _snapshot(first).items() if not name.startswith(".git/")}
    assert {name: data for name, data in _snapshot(tmp_path / "second").items()
            if not name.startswith(".git/")} == published
