"""Every notebook's time estimate counts what a student does: reading the text (about 200 words
a minute) and the given code (about 100: code is read slowly, and run), and the exercises
(their own estimates, ★★☆ and ★★★ scaled up as the README says). Each notebook's
introduction states it, and so does the README's table of notebooks."""
from __future__ import annotations

import re

import nbformat
import pytest

from autograder import authoring

SLUGS = authoring.assignments()
PROSE_PER_MINUTE = 200  # words of markdown: text, hints, formulas
CODE_PER_MINUTE = 100  # words of the given code, read and run
SITTING = 150  # minutes: a notebook past about 2½ h says how to take it in sittings

EXERCISE = re.compile(r"^## Exercise \d+\.\d+ .*~(\d+) min\)", re.M)
# The introduction's paragraph "**Time:** about 1¾ h — 23 min to read the text and run the
# examples, 85 min for the exercises." (other wordings of the same three numbers are read too).
PARAGRAPH = re.compile(r"\*\*Time:\*\*(.*?)(?:\n\n|$)", re.S)
DURATION = r"\d+ h(?: \d+(?: min)?)?|[\d¼½¾]+ h|\d+ min"
TOTAL = re.compile(rf"about ({DURATION})(?: in all| —)")
READING = re.compile(r"(\d+) min (?:to read|of reading)")
EXERCISES = re.compile(r"(\d+) min (?:for the exercises|of exercises)")
WORDS = re.compile(r"([\d,]+) words of prose .*?([\d,]+) of code", re.S)  # the counts it reads at those rates
SITTINGS = re.compile(r"Take it in\s+(two|three)\s+sittings")
FRACTIONS = {"¼": 0.25, "½": 0.5, "¾": 0.75}


def minutes(stated: str) -> float:
    """`~1¾ h`, `2 h`, `¾ h`, `2 h 20 min`, `2 h 50` or `50 min`, in minutes."""
    words = stated.strip().lstrip("~").split()
    if words[-1] == "min" and len(words) == 2:
        return float(words[0])
    whole, fraction = words[0].rstrip("¼½¾"), FRACTIONS.get(words[0][-1], 0.0)
    extra = float(words[2]) if len(words) > 2 else 0.0
    return 60 * ((float(whole) if whole else 0.0) + fraction) + extra


def stated_times(nb: nbformat.NotebookNode) -> tuple[float, int, int] | None:
    """(total, reading, exercises) minutes as the introduction states them, or None."""
    paragraph = PARAGRAPH.search(nb.cells[0].source)
    found = paragraph and [p.search(paragraph.group(1)) for p in (TOTAL, READING, EXERCISES)]
    if not found or not all(found):
        return None
    total, reading, exercises = (m.group(1) for m in found)
    return minutes(total), int(reading), int(exercises)


def released(slug: str) -> nbformat.NotebookNode:
    return nbformat.read(authoring.ROOT / "course" / slug / f"{slug}.ipynb", as_version=4)


def prose_words(nb: nbformat.NotebookNode) -> int:
    return sum(len(cell.source.split()) for cell in nb.cells if cell.cell_type == "markdown")


def code_words(nb: nbformat.NotebookNode) -> int:
    """Words of the given code: not the answer cells, not the setup cell."""
    return sum(len(cell.source.split()) for cell in nb.cells if cell.cell_type == "code"
               and not (cell.metadata.get("nbgrader", {}).get("solution")
                        or cell.metadata.get("nbgrader", {}).get("grade_id") == "setup"))


def reading_minutes(nb: nbformat.NotebookNode) -> float:
    return prose_words(nb) / PROSE_PER_MINUTE + code_words(nb) / CODE_PER_MINUTE


def exercise_minutes(nb: nbformat.NotebookNode) -> int:
    return sum(int(m) for cell in nb.cells if cell.cell_type == "markdown" for m in EXERCISE.findall(cell.source))


def within(stated: float, computed: float, *, least: float, share: float) -> bool:
    return abs(stated - computed) <= max(least, share * computed)


def readme_times() -> dict[str, str]:
    """{slug: the time column} of the README's table of notebooks."""
    text = (authoring.ROOT / "README.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| # | notebook |"))
    column = [c.strip() for c in header.strip("|").split("|")].index("time")
    found = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > column and re.fullmatch(r"`\d\d_\w+`", cells[1]):
            found[cells[1].strip("`")] = cells[column]
    return found


@pytest.mark.parametrize("slug", SLUGS)
def test_the_introduction_states_reading_and_exercise_time(slug):
    nb = released(slug)
    found = stated_times(nb)
    assert found, f"{slug}: the introduction must say '**Time:** about … — N min to read the text and run the " \
                  f"examples, M min for the exercises.'"
    total, stated_reading, stated_exercises = found
    reading, exercises = reading_minutes(nb), exercise_minutes(nb)
    assert stated_exercises == exercises, f"{slug}: the exercises' own estimates add up to {exercises} min"
    assert within(stated_reading, reading, least=5, share=0.2), f"{slug}: reading takes about {reading:.0f} min"
    assert within(total, reading + exercises, least=10, share=0.1), (
        f"{slug}: about {reading + exercises:.0f} min in all")


@pytest.mark.parametrize("slug", SLUGS)
def test_the_introductions_table_gives_each_exercise_its_own_estimate(slug):
    nb = released(slug)
    headings = {m.group(1): m.group(2) for cell in nb.cells if cell.cell_type == "markdown"
                for m in re.finditer(r"^## Exercise (\d+\.\d+) .*~(\d+) min\)$", cell.source, re.M)}
    table = dict(re.findall(r"^\| (\d+\.\d+) \|.*?\| ★[★☆]{2} \| (\d+) min \|", nb.cells[0].source, re.M))
    assert table == headings


def test_a_stated_word_count_is_the_notebooks_own():
    stale = {}
    for slug in SLUGS:
        nb = released(slug)
        paragraph = PARAGRAPH.search(nb.cells[0].source)
        stated = paragraph and WORDS.search(paragraph.group(1))
        counted = (prose_words(nb), code_words(nb))
        if stated and not all(within(int(said.replace(",", "")), words, least=100, share=0.03)
                              for said, words in zip(stated.groups(), counted)):
            stale[slug] = f"says {stated.group(1)} words of prose and {stated.group(2)} of code, has {counted}"
    assert stale == {}


@pytest.mark.parametrize("slug", SLUGS)
def test_the_readme_table_states_the_whole_time(slug):
    nb = released(slug)
    total = reading_minutes(nb) + exercise_minutes(nb)
    stated = readme_times()[slug]
    assert within(minutes(stated), total, least=10, share=0.1), f"{slug}: README says {stated}, about {total:.0f} min"


@pytest.mark.parametrize("slug", SLUGS)
def test_a_sitting_takes_at_most_about_two_and_a_half_hours(slug):
    """A notebook past about 2½ h says in how many sittings to take it (at most three: past
    that it is split into parts, as 08 and 11 are)."""
    nb = released(slug)
    total = reading_minutes(nb) + exercise_minutes(nb)
    said = SITTINGS.search(PARAGRAPH.search(nb.cells[0].source).group(1))
    sittings = {"two": 2, "three": 3}[said.group(1)] if said else 1
    assert total <= SITTING * 1.1 * sittings, f"{slug}: about {total:.0f} min in {sittings} sitting(s)"


def test_the_readme_lists_every_notebook():
    assert sorted(readme_times()) == SLUGS


@pytest.mark.parametrize("stated, expected", [("~1¾ h", 105), ("2 h", 120), ("¾ h", 45), ("50 min", 50), ("~2½ h", 150),
                                               ("2 h 20 min", 140), ("2 h 50", 170)])
def test_stated_times_are_read_as_minutes(stated, expected):
    assert minutes(stated) == expected


@pytest.mark.parametrize("paragraph, expected", [
    ("**Time:** about 1¾ h — 23 min to read the text and run the examples, 85 min for the exercises.", (105, 23, 85)),
    ("**Time:** about 47 min of reading (9,300 words, at about 200 a\nminute) and 120 min of exercises: about 2 h 50 "
     "in all.", (170, 47, 120)),
    ("**Time:** 85 min for the exercises.", None),
])
def test_the_introductions_wordings_are_read(paragraph, expected):
    assert stated_times(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        f"# x\n\n{paragraph}\n\nMore.")])) == expected


def test_the_readme_states_the_course_total():
    stated = re.search(r"The course takes about (\d+) hours in all", (authoring.ROOT / "README.md").read_text())
    total = sum(reading_minutes(released(slug)) + exercise_minutes(released(slug)) for slug in SLUGS) / 60
    assert stated and within(int(stated.group(1)), total, least=1, share=0.05), f"about {total:.0f} hours"
