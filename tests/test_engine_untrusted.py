"""What lands in submitted/ is untrusted: links, pipes, devices, directories and giant files
are refused for that submission, with the reason and a flag; nothing from outside a
submission's folder is followed, read, or copied into the sandbox or autograded/; odd
student ids are graded, not skipped; everyone else is graded as usual."""
from __future__ import annotations

import csv
import os

import pytest

from engine_course import flagged, grade, notebook, solutions, submit_notebook, with_answers
from grading import Course, points

pytestmark = pytest.mark.slow
SLUG = "03_function_basics"
ODD = ["o'brien $(touch pwned); rm -rf ~", "élise ü 学生", "two  spaces", "x" * 200, ".hidden", "-s"]
# The model solution, and a look around its folder for what a link could have brought in.
LOOK = """
import csv
import os
print("BESIDE", sorted(os.listdir(".")))
for name in ("gradebook.db", "key.txt", "data/answers.txt"):
    try:
        print("READ", name, open(name, "rb").read()[:16])
    except OSError as error:
        print("NOT THERE", name, type(error).__name__)
"""


def _scores(course: Course, student: str) -> dict[str, float]:
    return {k: v[0] for k, v in course.scores(SLUG, student).items()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = Course(tmp_path_factory.mktemp("untrusted"), [SLUG])
    model = solutions(SLUG)
    submitted = course.root / "submitted"
    for student in ["alice", *ODD]:
        submit_notebook(course, student, SLUG, with_answers(course, SLUG, model))
    solution = course.root / "solutions" / SLUG / f"{SLUG}.ipynb"

    def folder(student: str):
        path = submitted / student / SLUG
        path.mkdir(parents=True)
        return path

    (folder("linker") / f"{SLUG}.ipynb").symlink_to(solution)
    (submitted / "copycat").symlink_to(submitted / "alice")
    (folder("zero") / f"{SLUG}.ipynb").symlink_to("/dev/zero")
    os.mkfifo(folder("fifo") / f"{SLUG}.ipynb")
    (folder("directory") / f"{SLUG}.ipynb").mkdir()
    with open(folder("huge") / f"{SLUG}.ipynb", "wb") as f:
        f.truncate(60 << 20)
    leaker = submit_notebook(course, "leaker", SLUG,
                             with_answers(course, SLUG, {**model, "clipped_relu": model["clipped_relu"] + LOOK}))
    (leaker.parent / "gradebook.db").symlink_to(course.root / "gradebook.db")
    (leaker.parent / "key.txt").symlink_to(solution)
    (leaker.parent / "data").mkdir()
    (leaker.parent / "data" / "answers.txt").symlink_to(solution)
    (leaker.parent / "notes.txt").write_text("my own notes")
    result = grade(course, SLUG, "--timeout", "60")
    return course, result


def test_the_run_completes_and_honest_students_get_full_marks(graded):
    course, result = graded
    assert result.returncode == 0, result.stderr
    full = _scores(course, "alice")
    assert sum(full.values()) == points(SLUG) and not flagged(course, SLUG, "alice")[0]


@pytest.mark.parametrize("student", ODD)
def test_odd_student_ids_are_graded(graded, student):
    course, _ = graded
    assert _scores(course, student) == _scores(course, "alice")
    assert not any(p.name == "pwned" for p in course.root.rglob("pwned"))


@pytest.mark.parametrize("student, reason", [
    ("linker", "is a symbolic link"),
    ("copycat", "the student's folder 'copycat' is a symbolic link"),
    ("zero", "is a symbolic link"),
    ("fifo", "is a named pipe (FIFO)"),
    ("directory", "is a directory"),
    ("huge", "larger than 50 MiB"),
])
def test_a_notebook_that_is_not_a_regular_file_is_refused_and_flagged(graded, student, reason):
    course, result = graded
    scores = _scores(course, student)
    assert scores and all(score == 0 for score in scores.values()), scores
    assert flagged(course, SLUG, student)[0]
    assert reason in _problems(course)[student]


def _problems(course: Course) -> dict[str, str]:
    """What the run's status file says of each submission."""
    with open(course.root / "reports" / SLUG / "last-run.csv", newline="") as f:
        return {row["student"]: row["problems"] for row in csv.DictReader(f)}


def test_links_beside_a_notebook_are_never_followed(graded):
    course, _ = graded
    nb = notebook(course, "autograded", "leaker", SLUG)
    printed = "".join(o.get("text",
                            "") for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "clipped_relu"
                      for o in c.outputs)
    assert ("READ gradebook.db" not in printed and "READ key.txt" not in printed
            and "READ data/answers.txt" not in printed)
    assert "NOT THERE key.txt" in printed and "notes.txt" in printed  # the student's own file did arrive
    kept = sorted(str(p.relative_to(course.root / "autograded" / "leaker" / SLUG))
                  for p in (course.root / "autograded" / "leaker" / SLUG).rglob("*") if p.is_file())
    assert kept == [f"{SLUG}.ipynb", "notes.txt"], kept
    assert sum(_scores(course, "leaker").values()) == points(SLUG)  # graded: only the links were refused
    note = nb.cells[0].source
    assert flagged(course, SLUG,
                   "leaker")[0] and "'key.txt' is a symbolic link" in note and "'data/answers.txt'" in note
