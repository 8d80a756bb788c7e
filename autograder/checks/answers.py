"""Checks for written answers: multiple choice and matching questions (quizzes).

A quiz has two check cells:

- the visible one, `check_answers(answers, CHOICES, QUESTIONS, quiz="SLUG/name")`, checks
  the form (every question answered with one of the choices);
- the hidden one holds the key and a one-line explanation per answer, and nowhere else:
  `check_answers(answers, CHOICES, QUESTIONS, points=P, key={...}, explain={...})`. When
  grading it scores each answer (partial credit) and its output, which the feedback shows
  after grading, explains every wrong answer.

`explain` maps each question to the explanation of its right answer (a string), or to
{choice: explanation} with a line for the right choice and for any wrong choice worth
naming the misconception of.

Self-study: an edition of the student package may include a generated module
(:data:`KEYS_MODULE`, written by :func:`write_keys_module` from the solution notebooks'
hidden cells). When it is there, the visible check finds its quiz's key by `quiz` and
explains every answer at once. A graded class's package never includes it (and this
repository never holds it), so there the visible check says the answers are graded
when handed in.
"""
from __future__ import annotations

import ast
import importlib
import pprint
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping

from ..student.report import fail, note, passed
from ..student.summary import KEYS_MODULE

KEYS_FILE = "quiz_keys.py"  # in autograder/checks/
RIGHT, WRONG = "✔", "✘"


def _normalise(value: object) -> str:
    return " ".join(str(value).strip().lower().split())


def self_study_key(quiz: str | None) -> dict | None:
    """{"key": ..., "explain": ...} of `quiz` from the self-study keys module, if this
    edition of the package has one."""
    if quiz is None:
        return None
    try:
        module = importlib.import_module(KEYS_MODULE)
    except ImportError:
        return None
    found = getattr(module, "KEYS", {}).get(quiz)
    return found if isinstance(found, dict) and isinstance(found.get("key"), dict) else None


def explanation(explain: Mapping[str, Any] | None, question: str, choice: str | None) -> str | None:
    """The line explaining `choice` for `question` (the right choice's line when `choice`
    is the key, or the question's line when it has one line only)."""
    entry = (explain or {}).get(question)
    if isinstance(entry, str):
        return entry
    if isinstance(entry, Mapping) and choice is not None:
        lines = {_normalise(k): v for k, v in entry.items()}
        return lines.get(_normalise(choice))
    return None


def feedback(question: str, answer: object, key: str, explain: Mapping[str, Any] | None) -> tuple[bool, str]:
    """(right, the line explaining this answer): why the key is right, or what a wrong
    answer mistakes and then why the key is right."""
    right = _normalise(answer) == _normalise(key)
    why_key = explanation(explain, question, key)
    if right:
        return True, f"{RIGHT} {question}: {answer!r}" + (f" — {why_key}" if why_key else "")
    why_not = explanation(explain, question, str(answer))
    if why_not == why_key:  # one line per question: it explains the key
        why_not = None
    parts = [f"{WRONG} {question}: {answer!r} is not right."]
    if why_not:
        parts.append(why_not)
    parts.append(f"The answer is {key!r}" + (f": {why_key}" if why_key else "."))
    return False, " ".join(parts)


def check_answers(
    answers: object,
    choices: Collection[str],
    questions: Collection[str],
    *,
    key: Mapping[str, str] | None = None,
    points: float | None = None,
    explain: Mapping[str, Any] | None = None,
    quiz: str | None = None,
) -> float | None:
    """Check a dict of answers {question: choice}.

    Without `key` only the form is checked (every question answered with one of
    `choices`) — unless this is a self-study edition whose keys module knows `quiz`: then
    every answer is judged and explained. With `key`, each answer is compared and every
    wrong one explained (`explain`); with `points` too the share of correct answers is
    returned (nbgrader gives partial credit for a number as the last expression of a test
    cell), otherwise any wrong answer fails.
    """
    __tracebackhide__ = True
    allowed = {_normalise(c) for c in choices}
    if not isinstance(answers, Mapping):
        fail(f"answers must be a dict {{question: choice}}, got {type(answers).__name__}.")
    missing = [q for q in questions if q not in answers]
    extra = [q for q in answers if q not in questions]
    if missing or extra:
        fail(
            "answers must have exactly the questions " + ", ".join(map(repr, questions)) + ".",
            *(["missing: " + ", ".join(map(repr, missing))] if missing else []),
            *(["unexpected: " + ", ".join(map(repr, extra))] if extra else []),
        )
    invalid = {q: a for q, a in answers.items() if _normalise(a) not in allowed}
    if invalid:
        fail(
            "every answer must be one of " + ", ".join(map(repr, choices)) + ".",
            *(f"{q!r}: {a!r}" for q, a in invalid.items()),
        )
    if key is None:
        found = self_study_key(quiz)
        if found is None:
            passed(f"{len(questions)} answers, each one of the allowed choices. That is all this check looks at: "
                   "whether they are right is graded when you hand in, and your feedback then explains each answer.")
            return None
        key, explain, points = found["key"], found.get("explain"), None
    judged = [feedback(q, answers[q], key[q], explain) for q in questions]
    wrong = [line for right, line in judged if not right]
    if points is None:
        if wrong:
            fail(f"{len(wrong)} of {len(questions)} answers are wrong.", *(line for _, line in judged))
        passed(f"all {len(questions)} answers are right.")
        for _, line in judged:
            note(line)
        return None
    right = len(questions) - len(wrong)
    passed(f"{right} of {len(questions)} answers are right.")
    for line in wrong:
        note(line)
    return round(points * right / len(questions), 6)


# --- keys for a self-study edition ---------------------------------------------------------

def _hidden_calls(source: str) -> Iterable[ast.Call]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and _name(node.func) == "check_answers"
            and any(k.arg == "key" for k in node.keywords)]


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def quiz_keys(nb: Any, slug: str) -> dict[str, dict]:
    """{quiz: {"key": ..., "explain": ...}} of every quiz of one solution notebook, read from
    its hidden check cells (`check_answers(name, ..., key={...}, explain={...})`). A quiz is
    "SLUG/name", `name` being the answers' variable (or the call's own `quiz=`)."""
    found: dict[str, dict] = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or "### BEGIN HIDDEN TESTS" not in cell.source:
            continue
        for call in _hidden_calls(cell.source):
            keywords = {k.arg: k.value for k in call.keywords}
            if "quiz" in keywords:
                quiz = ast.literal_eval(keywords["quiz"])
            elif call.args and isinstance(call.args[0], ast.Name):
                quiz = f"{slug}/{call.args[0].id}"
            else:
                raise ValueError(f"{slug}: a hidden check_answers call whose quiz has no name")
            found[quiz] = {
                "key": ast.literal_eval(keywords["key"]),
                "explain": ast.literal_eval(keywords["explain"]) if "explain" in keywords else {},
            }
    return found


def all_quiz_keys(root: Path | None = None) -> dict[str, dict]:
    """The keys of every quiz of every solution notebook (instructor's side only)."""
    import nbformat

    from .. import authoring  # not in the student package: this runs where solutions/ is

    root = authoring.ROOT if root is None else root
    found: dict[str, dict] = {}
    for slug in authoring.assignments(root):
        found.update(quiz_keys(nbformat.read(authoring.solution_path(slug, root), as_version=4), slug))
    return found


def keys_module_source(keys: Mapping[str, dict]) -> str:
    return (
        '"""Quiz keys and explanations for self-study (generated from the solution notebooks\' hidden\n'
        "cells by autograder.checks.answers.write_keys_module). Never part of a graded class's package.\"\"\"\n\n"
        f"KEYS = {pprint.pformat(dict(keys), width=110, sort_dicts=True)}\n"
    )


def write_keys_module(package: Path, root: Path | None = None) -> Path:
    """Write the self-study keys module into a built student package (`package` is its
    `autograder/` folder). Only for a self-study edition: it gives every quiz's key away."""
    path = Path(package) / "checks" / KEYS_FILE
    path.write_text(keys_module_source(all_quiz_keys(root)))
    return path
