"""The notebooks' own tests, graded end to end: known answers, graded by `autograder grade`.

For every notebook: the model solution gets full points; the released notebook, submitted
untouched, gets zero on every graded cell; every known wrong answer (tests/answers) loses
its exercise's points; every unusual correct answer keeps them; only answers worth a
person's look are flagged. Answers of different exercises share submissions (submission k
carries the k-th wrong answer of each exercise), so each exercise must be graded
independently. `make test` grades every known answer of grading.GRADED_WHOLE's notebooks and
the first wrong and right answer of each other exercise; `make classes` every one of every
notebook. That the engine's scores are stock nbgrader's is test_engine_scores.py's.
"""
from __future__ import annotations

import csv
import html
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from nbgrader.api import Gradebook

from answers import for_notebook
from autograder import authoring
from engine_course import notebook
from grading import COVERING, ClassBatch, every_answer_graded, exercises, written_answers

SLUGS = authoring.assignments()
WRITTEN = {slug: list(found) for slug in SLUGS  # the markdown answers a person grades, by notebook
           if (found := written_answers(nbformat.read(authoring.solution_path(slug), as_version=4)))}


@pytest.fixture(scope="module", params=SLUGS)
def graded(request, class_batches):
    batch = class_batches(request.param)
    assert batch.result.returncode == 0, f"autograder grade failed:\n{batch.result.stdout}\n{batch.result.stderr}"
    return batch


@pytest.mark.slow
def test_model_solution_gets_full_points(graded):
    for exercise in graded.exercises:
        score, total = graded.points("correct", exercise)
        assert score == total > 0, f"{graded.slug} {exercise.answer_id}: {score}/{total}"


@pytest.mark.slow
def test_released_notebook_gets_zero_everywhere(graded):
    scores = graded.course.scores(graded.slug, "released")
    assert scores and all(score == 0 for score, _ in scores.values()), scores


def pytest_generate_tests(metafunc):
    """test_a_known_answer_scores_as_it_should: each known answer the class batches grade in
    this run (grading.every_answer_graded)."""
    if metafunc.definition.originalname == "test_a_known_answer_scores_as_it_should":
        metafunc.parametrize("slug, wrong, answer", list(_known_answers(metafunc.config)))


def _known_answers(config: pytest.Config):
    for slug in SLUGS:
        for sub in ClassBatch.submissions_of(slug, every_answer_graded(slug, config)):
            kind = "wrong" if sub.wrong else "right"
            for answer in sub.answers.values():
                yield pytest.param(slug, sub.wrong, answer, id=f"{slug}-{answer.exercise}-{kind}-{answer.label}")


@pytest.mark.slow
def test_a_known_answer_scores_as_it_should(slug, wrong, answer, class_batches):
    """Each known answer on its own (`pytest -m GRADE_ID` runs those of one exercise): a wrong
    one loses points of its exercise, an unusual right one keeps them all. Device bugs that
    only a GPU run catches (answers/devices.py) are skipped, by name, where there is no CUDA;
    `make gpu-check` grades them on a GPU."""
    batch = class_batches(slug)
    student = next(s.student for s in batch.submissions.values()
                   if s.wrong == wrong and s.answers.get(answer.exercise) == answer)
    exercise = next(e for e in batch.exercises if e.answer_id == answer.exercise)
    score, total = batch.points(student, exercise)
    if not wrong:
        assert score == total, f"'{answer.label}' is right, yet got {score}/{total}"
    elif answer.device == "cuda" and not torch.cuda.is_available():
        assert score == total, f"'{answer.label}' is caught on the CPU ({score}/{total}): not a 'cuda' device bug"
        pytest.skip(f"no CUDA: a device bug that only a GPU run catches ('{answer.label}')")
    else:
        assert score < total, f"'{answer.label}' is wrong, yet kept {score}/{total}"


@pytest.mark.slow
@pytest.mark.parametrize("slug", list(WRITTEN))
def test_a_written_answer_is_left_to_a_person(slug, class_batches):
    """A markdown answer a person grades (11's design write-up) is neither autograded to zero nor
    to full: every submission that wrote one waits for a manual grade, its points counted in the
    maximum; the released notebook's untouched stub scores 0, as stock nbgrader's."""
    batch = class_batches(slug)
    with Gradebook(batch.course.db_url) as gradebook:
        for grade_id in WRITTEN[slug]:
            for student in batch.submissions:
                grade = gradebook.find_grade(grade_id, slug, slug, student)
                assert grade.max_score > 0 and grade.auto_score is None and grade.needs_manual_grade, \
                    (student, grade_id, grade.auto_score, grade.needs_manual_grade)
            untouched = gradebook.find_grade(grade_id, slug, slug, "released")
            assert (untouched.score, untouched.needs_manual_grade) == (0, False), grade_id


@pytest.mark.slow
def test_every_other_exercise_keeps_full_points(graded):
    """The model solutions beside each submission's known answers keep every point."""
    lost = []
    for sub in graded.submissions.values():
        for exercise in graded.exercises:
            if exercise.answer_id in sub.answers:
                continue
            score, total = graded.points(sub.student, exercise)
            if score < total:
                lost.append(f"{sub.student} {exercise.answer_id}: model solution got {score}/{total}")
    assert not lost, "right answers that lost points:\n" + "\n".join(lost)


@pytest.mark.slow
def test_only_answers_worth_a_look_are_flagged(graded):
    """A wrong answer is not flagged for being wrong; an answer that asks autograd inside
    backward (say) is, with the reason at the top of its autograded notebook."""
    flags = {sub.student: [a.flag for a in sub.answers.values() if a.flag] for sub in graded.submissions.values()}
    flags = {student: reasons for student, reasons in flags.items() if reasons}
    with Gradebook(graded.course.db_url) as gb:
        flagged = {sub.student.id for sub in gb.assignment_submissions(graded.slug)
                   for nb in sub.notebooks if nb.flagged}
    assert flagged == set(flags)
    for student, reasons in flags.items():
        top = notebook(graded.course, "autograded", student, graded.slug).cells[0].source.lower()
        assert all("worth a look" in top and reason.lower() in top for reason in reasons), top
    assert ("Flagged for manual review" in graded.result.stderr) == bool(flags)


@pytest.mark.slow
def test_feedback_has_scores_and_no_hidden_tests(graded, pytestconfig):
    """Not in sources, and not quoted by the messages of failing hidden tests either: neither
    in `autograder grade --feedback`'s pages (every submission) nor, for the notebooks stock
    nbgrader runs on (grading.COVERING; all with --stock-all), in stock `nbgrader
    generate_feedback`'s (for wrong0, a wrong answer to every exercise)."""
    course, slug = graded.course, graded.slug
    hidden = _hidden_lines(authoring.solution_path(slug).read_text())
    assert hidden
    _assert_no_hidden(course, slug, hidden)
    if slug not in COVERING and not pytestconfig.getoption("--stock-all"):
        return
    nbgrader = Path(sys.executable).with_name("nbgrader")
    page = course.root / "feedback" / "wrong0" / slug / f"{slug}.html"
    page.unlink()
    stock = subprocess.run([str(nbgrader), "generate_feedback", slug, "--student", "wrong0", "--force"],
                           cwd=course.root, capture_output=True, text=True)
    assert stock.returncode == 0, stock.stderr
    _assert_no_hidden(course, slug, hidden)


def _assert_no_hidden(course, slug: str, hidden: list[str]) -> None:
    pages = list((course.root / "feedback").glob(f"*/{slug}/{slug}.html"))
    assert len(pages) == len(list((course.root / "submitted").iterdir()))
    for page in pages:
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        assert "Score:" in text and "HIDDEN TESTS" not in text, page
        assert not [line for line in hidden if line in text], page


def _hidden_lines(source: str) -> list[str]:
    """The lines between hidden-test markers in a solution notebook (long enough to be telling),
    except those a visible cell also shows, in a line of its own (a hidden test may repeat a
    visible call, and split it over lines differently)."""
    hidden, visible, inside = [], [], False
    for cell in nbformat.reads(source, as_version=4).cells:
        for line in cell.source.splitlines():
            if "BEGIN HIDDEN TESTS" in line or "END HIDDEN TESTS" in line:
                inside = "BEGIN" in line
            elif len(line.strip()) >= 20 and inside:
                hidden.append(line.strip())
            elif not inside:
                visible.append(line)
    shown = "\n".join(visible)
    return [line for line in hidden if line not in shown]


@pytest.mark.slow
def test_nbgrader_export_reads_the_engines_gradebook(graded):
    course = graded.course
    out = course.root / "exported.csv"
    nbgrader = Path(sys.executable).with_name("nbgrader")
    result = subprocess.run([str(nbgrader), "export", "--to", str(out)], cwd=course.root, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    with open(out) as f:
        exported = {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}
    with open(course.root / "grades.csv") as f:
        ours = {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}
    assert exported == ours and exported["correct"] == max(exported.values()) > 0 and exported["released"] == 0


@pytest.mark.slow
def test_report_files(graded):
    assert (graded.course.root / "reports" / graded.slug / "grades.png").stat().st_size > 1000
    assert "Grading summary" in graded.result.stderr


@pytest.mark.parametrize("slug", SLUGS)
def test_each_exercise_has_three_wrong_answers_and_an_unusual_right_one(slug):
    module = for_notebook(slug)
    for exercise in exercises(nbformat.read(authoring.solution_path(slug), as_version=4)):
        wrong = [a for a in module.MUTANTS if a.exercise == exercise.answer_id]
        right = [a for a in module.VARIANTS if a.exercise == exercise.answer_id]
        assert len(wrong) >= 3 and right, f"{slug} {exercise.answer_id}: {len(wrong)} wrong, {len(right)} right"
        for answer in wrong + right:
            assert answer.apply(exercise.solution) != exercise.solution, answer.label


def _claims(nb: nbformat.NotebookNode) -> dict[str, list[str]]:
    """{a graded cell's grade_id: the ✔ lines its check printed, in order}."""
    found = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade"):
            text = "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")
            found[meta["grade_id"]] = [line for line in text.splitlines() if line.startswith("✔")]
    return found


@pytest.mark.slow
def test_every_claim_a_check_prints_is_refuted_by_a_known_wrong_answer(graded):
    """A ✔ line claims what its check established since the line before it. A known wrong
    answer that printed the model's first k ✔ lines of a cell and then lost its points
    refuted claim k + 1. A claim no wrong answer refutes is asserted by nothing that can
    fail: a missing wrong answer or a check that claims more than it checks. (A line is one
    claim here: a line's several clauses share their wrong answers. A check that repeats its
    checks on another input no mistake tells apart folds their lines into a note:
    report.folded.)"""
    if not graded.every:
        pytest.skip(f"{graded.slug}: the claims need every known wrong answer graded (make classes)")
    claims = _claims(notebook(graded.course, "autograded", "correct", graded.slug))
    refuted: dict[str, set[int]] = {cell: set() for cell in claims}
    for student, submission in graded.submissions.items():
        if not submission.wrong:
            continue
        scores = graded.scores(student)
        for cell, printed in _claims(notebook(graded.course, "autograded", student, graded.slug)).items():
            score, most = scores[cell]
            shared = next((k for k, (line, model) in enumerate(zip(printed, claims[cell])) if line != model),
                          min(len(printed), len(claims[cell])))
            if score < most and shared < len(claims[cell]):
                refuted[cell].add(shared)
    unrefuted = [(cell, line) for cell, lines in claims.items() for k, line in enumerate(lines)
                 if k not in refuted[cell]]
    assert unrefuted == [], f"{graded.slug}: claims no known wrong answer fails:\n" + "\n".join(
        f"{cell}: {line}" for cell, line in unrefuted)
