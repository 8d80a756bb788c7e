"""The released notebooks give no answer away in their hints.

test_publish.py searches what students get for the solutions' lines, except those the
released notebooks show: a hint that shows a solution line would go unnoticed there. Here
every hint (the `<details>` cells after an answer cell) of every released notebook is read
as a student reads it: no code in it, fenced or inline, is a solution line or a near copy
of one (a renamed variable, another spacing); the code of an exercise's hints covers no
more than a few of its solution's lines (a skeleton leaves the key lines to the student);
and no hint of a quiz names one of its questions beside its answer.
"""
from __future__ import annotations

import ast
import builtins
import difflib
import keyword
import re
from dataclasses import dataclass
from functools import cache

import nbformat
import pytest

from autograder import authoring

SLUGS = authoring.assignments()
# Notebooks whose hints other changes are still rewriting: (slug, why); empty when none.
PENDING: dict[str, str] = {}

NEAR = 0.9  # a hint line this close to a solution line is a copy of it (difflib's ratio)
LOOSE = 0.75  # ... this close, it gives the line's substance away
COVERED = 1 / 3  # the most of an exercise's solution lines its hints may give away (one line: a half)
SHORTEST = 10  # characters (without spaces): shorter solution lines say too little to count
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
INLINE = re.compile(r"`([^`\n]+)`")
CONTROL = re.compile(r"^(else|try|finally|except\b.*|return(None|True|False)?|pass|break|continue)\W*$")
HEADER = re.compile(r"^(if|elif|while|for)[^(=]*:$")  # a test or a loop over plain names: structure


def normal(line: str) -> str:
    """A line of code without its comment and without any whitespace."""
    quote, kept = None, []
    for char in line:
        if quote is None and char == "#":
            break
        if char in "'\"":
            quote = None if quote == char else quote or char
        kept.append(char)
    return re.sub(r"\s+", "", "".join(kept))


TOKEN = re.compile(r"[A-Za-z_]\w*|\d+\.?\d*(?:e-?\d+)?|\S")
KEPT = {*keyword.kwlist, *dir(builtins), "torch", "F", "np", "math", "ctx", "self"}
FEWEST = 6  # tokens: a shorter line's shape is too common to mean anything


def shape(line: str) -> tuple[str, ...]:
    """The tokens of a normalised line with its own names numbered in order of appearance
    (attributes, keywords, builtins and modules kept): a copy with renamed variables has the
    shape of the original."""
    tokens, names = TOKEN.findall(line), {}
    return tuple(names.setdefault(t, f"v{len(names)}")
                 if (t[0].isalpha() or t[0] == "_") and t not in KEPT and (k == 0 or tokens[k - 1] != ".") else t
                 for k, t in enumerate(tokens))


def copied(hint: str, secret: str) -> bool:
    """`hint` is `secret` (normalised lines of one exercise) up to spacing, the names of its
    variables, or a few characters."""
    return (hint == secret or (len(shape(secret)) >= FEWEST and shape(hint) == shape(secret))
            or (len(secret) >= 2 * SHORTEST and similarity(hint, secret) >= NEAR))


def code_in(markdown: str) -> list[str]:
    """The code of a markdown cell: each line of its fenced blocks, each inline span."""
    fenced = [line for block in FENCE.findall(markdown) for line in block.splitlines()]
    inline = INLINE.findall(FENCE.sub("", markdown))
    return [n for n in map(normal, fenced + inline) if n]


@dataclass
class Exercise:
    answer_id: str
    solution: list[str]  # its solution's lines, as written
    hints: list[str]  # the markdown of its hint cells in the released notebook


def _between(source: str) -> list[str]:
    found, inside = [], False
    for line in source.splitlines():
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif inside:
            found.append(line)
    return found


@cache
def exercises(slug: str) -> tuple[list[Exercise], set[str]]:
    """The exercises of a notebook, and what its released notebook shows outside the hints
    (normalised lines of code and of markdown code): solution lines found there are given."""
    solutions = {c.metadata["nbgrader"]["grade_id"]: _between(c.source)
                 for c in nbformat.read(authoring.solution_path(slug), as_version=4).cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    released = nbformat.read(authoring.ROOT / "course" / slug / f"{slug}.ipynb", as_version=4)
    found: list[Exercise] = []
    shown: set[str] = set()
    for cell in released.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in solutions and cell.metadata["nbgrader"].get("solution"):
            found.append(Exercise(grade_id, solutions[grade_id], []))
        elif cell.cell_type == "markdown" and "<details>" in cell.source and found:
            found[-1].hints.append(cell.source)
        elif cell.cell_type == "markdown":
            shown.update(code_in(cell.source))
        if cell.cell_type == "code":
            shown.update(n for n in map(normal, cell.source.splitlines()) if n)
    return found, shown


def secret_lines(exercise: Exercise, shown: set[str]) -> list[str]:
    """The lines of a solution worth keeping: long enough to say something, not mere
    control flow, and not shown by the released notebook anyway."""
    lines = [normal(line) for line in exercise.solution]
    return [n for n in lines if len(n) >= SHORTEST and not CONTROL.match(n) and not HEADER.match(n) and n not in shown]


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def copies(slug: str) -> list[str]:
    """Every hint line that is a solution line of the notebook, or a near copy of one of its
    exercise's solution lines."""
    found, shown = exercises(slug)
    secrets = {e.answer_id: secret_lines(e, shown) for e in found}
    leaks = []
    for exercise in found:
        for hint in (line for cell in exercise.hints for line in code_in(cell)):
            for owner, lines in secrets.items():
                for secret in lines:
                    if hint == secret or (owner == exercise.answer_id and copied(hint, secret)):
                        leaks.append(f"{exercise.answer_id}'s hint shows {owner}'s solution line {secret!r} "
                                     f"as {hint!r}")
    return leaks


def coverage(exercise: Exercise, shown: set[str]) -> tuple[float, list[str]]:
    """The share of an exercise's solution lines its hints give away (near copies), and those lines."""
    secrets = secret_lines(exercise, shown)
    hints = [line for cell in exercise.hints for line in code_in(cell)]
    given = [s for s in secrets if any(similarity(h, s) >= LOOSE for h in hints)]
    return (len(given) / len(secrets) if secrets else 0.0), given


def skeletons_too_full(slug: str) -> list[str]:
    found, shown = exercises(slug)
    leaks = []
    for exercise in found:
        share, given = coverage(exercise, shown)
        if share > 1 / 2 or (share > COVERED and len(given) > 1):
            leaks.append(f"{exercise.answer_id}: the hints give away {share:.0%} of the solution's lines: {given}")
    return leaks


def quiz_answers(exercise: Exercise) -> dict[str, str]:
    """{question: answer} of a quiz (an answer cell that assigns a dict of strings), else {}."""
    try:
        tree = ast.parse("\n".join(line.strip() for line in exercise.solution if line.strip()))
        value = ast.literal_eval(tree.body[0].value) if len(tree.body) == 1 else None
    except (SyntaxError, ValueError, AttributeError):
        return {}
    return value if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()) else {}


def worked_answers(slug: str) -> list[str]:
    """Hint items (paragraphs, list items) that name a quiz question beside its answer."""
    found, _ = exercises(slug)
    leaks = []
    for exercise in found:
        key = quiz_answers(exercise)
        for cell in exercise.hints:
            for item in re.split(r"\n\s*\n|\n(?=\s*[-*] )", cell):
                for question, answer in key.items():
                    q = re.escape(question)
                    named = re.search(rf"\*\*{q}\.?\*\*|[\"'`]{q}[\"'`]|\b(?:for|case|question)\s+{q}\s*[:.)]", item)
                    said = re.search(rf"(?<![\w.]){re.escape(answer)}(?![\w.])", item)
                    if named and said:
                        leaks.append(f"{exercise.answer_id}'s hint answers question {question} ({answer!r}): "
                                     f"{item.strip()[:120]!r}")
    return leaks


def _marks(slug: str) -> list:
    return [pytest.mark.xfail(reason=PENDING[slug], strict=False)] if slug in PENDING else []


CASES = [pytest.param(slug, marks=_marks(slug), id=slug) for slug in SLUGS]


@pytest.mark.parametrize("slug", CASES)
def test_no_hint_shows_a_solution_line_or_a_near_copy(slug):
    leaks = copies(slug)
    assert not leaks, "\n".join(leaks)


@pytest.mark.parametrize("slug", CASES)
def test_no_hint_code_gives_away_most_of_a_solution(slug):
    leaks = skeletons_too_full(slug)
    assert not leaks, "\n".join(leaks)


@pytest.mark.parametrize("slug", CASES)
def test_no_quiz_hint_works_out_a_question(slug):
    leaks = worked_answers(slug)
    assert not leaks, "\n".join(leaks)


def test_every_exercise_has_hints_and_a_solution_the_test_reads():
    for slug in SLUGS:
        found, shown = exercises(slug)
        assert found, slug
        for exercise in found:
            assert exercise.hints, f"{slug} {exercise.answer_id}: no hint cell found"
            assert secret_lines(exercise, shown) or quiz_answers(exercise), f"{slug} {exercise.answer_id}"


# --- the test's own detectors, on answers given away on purpose -----------------------------

SOLUTION = ["    (y,) = ctx.saved_tensors", "    return grad_output * y * (1 - y)  # σ' = y (1 - y)"]


@pytest.mark.parametrize("hint, leaks", [
    ("<details>`return grad_output * y * (1 - y)`</details>", True),  # the line itself
    ("<details>\n```python\nreturn grad_output*y*(1-y)\n```\n</details>", True),  # another spacing
    ("<details>`return grad * y * (1 - y)`</details>", True),  # a renamed variable
    ("<details>`return grad_output * ...  # the derivative, from y`</details>", False),  # a skeleton
    ("<details>$\\sigma' = y(1 - y)$</details>", False),  # the formula
])
def test_a_copied_or_renamed_solution_line_is_found(hint, leaks, monkeypatch):
    exercise = Exercise("sigmoid", SOLUTION, [hint])
    monkeypatch.setitem(globals(), "exercises", lambda slug: ([exercise], set()))
    assert bool(copies("any")) == leaks


def test_a_quiz_hint_that_works_out_a_question_is_found(monkeypatch):
    solution = ['what = {', '    "a": "error",', '    "b": "correct",', '}']
    worked = "<details>\n\n- **a.** the version check fails: `\"error\"`.\n- the rule for b\n</details>"
    idea = "<details>\n\n- **a.** what does the version check do here?\n- \"correct\" means no error\n</details>"
    for hint, leaks in ((worked, 1), (idea, 0)):
        exercise = Exercise("what", solution, [hint])
        monkeypatch.setitem(globals(), "exercises", lambda slug, exercise=exercise: ([exercise], set()))
        assert len(worked_answers("any")) == leaks
