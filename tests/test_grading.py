"""The notebooks' own tests, graded end to end with stock `nbgrader autograde`.

For every notebook: the model solution gets full points; the released notebook,
submitted untouched, gets zero on every graded cell and grading completes; every known
wrong answer (tests/answers) loses its exercise's points; every unusual correct answer
keeps them. Answers of different exercises share submissions (submission k carries the
k-th wrong answer of each exercise), so each exercise must be graded independently.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import nbformat
import pytest

from answers import Answer, for_notebook
from autograder import authoring
from grading import Course, exercises

SLUGS = authoring.assignments()


@dataclass
class Submission:
    student: str
    answers: dict[str, Answer] = field(default_factory=dict)  # exercise -> the answer it carries
    wrong: bool = False  # the answers it carries are wrong ones


@dataclass
class Graded:
    slug: str
    course: Course
    exercises: list
    submissions: dict[str, Submission]
    log: str

    def points(self, student: str, exercise) -> tuple[float, float]:
        scores = self.course.scores(self.slug, student)
        return (sum(scores[g][0] for g in exercise.graded), sum(scores[g][1] for g in exercise.graded))


def _packed(kind: str, answers: list[Answer], wrong: bool) -> list[Submission]:
    by_exercise: dict[str, list[Answer]] = {}
    for answer in answers:
        by_exercise.setdefault(answer.exercise, []).append(answer)
    rows = itertools.zip_longest(*by_exercise.values())
    return [
        Submission(f"{kind}{k}", {a.exercise: a for a in row if a is not None}, wrong)
        for k, row in enumerate(rows)
    ]


@pytest.fixture(scope="module", params=SLUGS)
def graded(request, tmp_path_factory) -> Graded:
    slug = request.param
    module = for_notebook(slug)
    course = Course(tmp_path_factory.mktemp(slug), [slug])
    found = exercises(_solution(slug))
    solutions = {e.answer_id: e.solution for e in found}
    submissions = [
        Submission("correct"), *_packed("wrong", module.MUTANTS, True), *_packed("right", module.VARIANTS, False),
    ]
    for sub in submissions:
        sources = dict(solutions)
        sources.update({ex: a.apply(solutions[ex]) for ex, a in sub.answers.items()})
        course.submit(sub.student, slug, sources)
    course.submit("released", slug, None)
    result = course.autograde(slug)
    assert result.returncode == 0, f"nbgrader autograde failed:\n{result.stdout}\n{result.stderr}"
    return Graded(slug, course, found, {s.student: s for s in submissions}, result.stderr)


def _solution(slug: str) -> nbformat.NotebookNode:
    return nbformat.read(authoring.solution_path(slug), as_version=4)


def test_model_solution_gets_full_points(graded):
    for exercise in graded.exercises:
        score, total = graded.points("correct", exercise)
        assert score == total > 0, f"{graded.slug} {exercise.answer_id}: {score}/{total}"


def test_released_notebook_gets_zero_everywhere(graded):
    scores = graded.course.scores(graded.slug, "released")
    assert scores and all(score == 0 for score, _ in scores.values()), scores


def test_every_wrong_answer_loses_its_points(graded):
    kept = []
    for sub in graded.submissions.values():
        for exercise in graded.exercises:
            answer = sub.answers.get(exercise.answer_id)
            score, total = graded.points(sub.student, exercise)
            if answer is not None and sub.wrong and score >= total:
                kept.append(f"{exercise.answer_id}: '{answer.label}' kept {score}/{total}")
    assert not kept, "wrong answers that kept their points:\n" + "\n".join(kept)


def test_every_other_exercise_keeps_full_points(graded):
    """Unusual right answers, and model solutions beside wrong answers, keep every point."""
    lost = []
    for sub in graded.submissions.values():
        for exercise in graded.exercises:
            answer = sub.answers.get(exercise.answer_id)
            if answer is not None and sub.wrong:
                continue
            score, total = graded.points(sub.student, exercise)
            if score < total:
                what = f"'{answer.label}'" if answer else "model solution"
                lost.append(f"{sub.student} {exercise.answer_id}: {what} got {score}/{total}")
    assert not lost, "right answers that lost points:\n" + "\n".join(lost)


@pytest.mark.parametrize("slug", SLUGS)
def test_each_exercise_has_three_wrong_answers_and_an_unusual_right_one(slug):
    module = for_notebook(slug)
    for exercise in exercises(_solution(slug)):
        wrong = [a for a in module.MUTANTS if a.exercise == exercise.answer_id]
        right = [a for a in module.VARIANTS if a.exercise == exercise.answer_id]
        assert len(wrong) >= 3 and right, f"{slug} {exercise.answer_id}: {len(wrong)} wrong, {len(right)} right"
        for answer in wrong + right:
            assert answer.apply(exercise.solution) != exercise.solution, answer.label
