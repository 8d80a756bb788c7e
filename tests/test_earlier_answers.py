"""Later notebooks import earlier answers from the student package, which holds an answer only
once its notebook is past due (autograder/earlier_answers.py), and a class receives the hint
tiers its instructor chose (autograder/hints.py)."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from autograder import authoring, earlier_answers, hints
from grading import Course
from instructor_material import instructor_lines

IMPORT = re.compile(r"from autograder\.student\.earlier\.(\w+) import")


def _root(tmp_path: Path, config: str) -> Path:
    """A course root with this repository's solutions and `config` in [tool.autograd-course]."""
    (tmp_path / "solutions").symlink_to(authoring.ROOT / "solutions")
    (tmp_path / "pyproject.toml").write_text(f"[tool.autograd-course]\n{config}\n")
    return tmp_path


def test_the_student_package_holds_what_the_release_writes():
    """autograder/student/earlier/ is fresh: `make release` wrote it from solutions/ and past-due."""
    shipped = {p.name: p.read_text() for p in earlier_answers.PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert shipped == earlier_answers.modules(), "run `make release`"


def test_every_import_of_an_earlier_answer_has_its_module():
    """A notebook imports earlier answers only from a module the release writes: one of a notebook
    before it, with cells tagged imported-later."""
    for n, slug in enumerate(authoring.assignments()):
        nb = nbformat.read(authoring.solution_path(slug), as_version=4)
        for topic in {m for cell in nb.cells if cell.cell_type == "code" for m in IMPORT.findall(cell.source)}:
            earlier = [s for s in authoring.assignments()[:n] if earlier_answers.topic(s) == topic]
            assert earlier and earlier_answers.exported(earlier[0]), (slug, topic)


def test_a_module_gives_answers_only_once_its_notebook_is_past_due(tmp_path):
    secrets = set(instructor_lines())
    modules = earlier_answers.modules(_root(tmp_path, 'past-due = ["01_tape_autograd"]'))
    assert set(modules) == {f"{earlier_answers.topic(s)}.py" for s in authoring.assignments()
                            if earlier_answers.exported(s)}
    for name, source in modules.items():
        given = {line.strip() for line in source.splitlines()} & secrets
        assert bool(given) == (name == "tape_autograd.py"), name
        if name != "tape_autograd.py":
            with pytest.raises(ImportError, match=r"once \d\d_\w+ is past due"):
                exec(compile(source, name, "exec"), {})
    namespace: dict = {}
    exec(compile(modules["tape_autograd.py"], "tape_autograd.py", "exec"), namespace)
    assert {"Variable", "record", "grad", "operator_matmul"} <= set(namespace)


@pytest.mark.parametrize("config, error", [
    ("past-due = [\"03_function_basic\"]", earlier_answers.PastDueError),
    ("past-due = \"yes\"", earlier_answers.PastDueError),
    ("hint-tiers = 4", hints.HintConfigError),
    ("hint-tiers = true", hints.HintConfigError),
])
def test_a_wrong_setting_is_refused_in_one_line(tmp_path, config, error):
    root = _root(tmp_path, config)
    with pytest.raises(error) as refused:
        earlier_answers.past_due(root) if error is earlier_answers.PastDueError else hints.class_tiers(root)
    assert "\n" not in str(refused.value) and config.split(" =")[0] in str(refused.value)


def test_a_class_gets_the_tiers_its_instructor_chose(tmp_path):
    """nbgrader's generate_assignment (through the course's nbgrader_config.py) releases the
    first hint-tiers tiers; a hint cell left with nothing goes, the text around tiers stays."""
    (tmp_path / "pyproject.toml").write_text("[tool.autograd-course]\nhint-tiers = 1\n")
    course = Course(tmp_path, ["05_gradcheck"])
    released = course.released("05_gradcheck")
    solution = nbformat.read(authoring.solution_path("05_gradcheck"), as_version=4)
    assert {t for cell in released.cells for t in hints.tiers(cell.source)} == {1}
    assert "Try it: compare with autograd's exact Jacobian" in nbformat.writes(released)
    assert len(released.cells) == len(solution.cells)
    every = hints.every_tier(released, solution)
    assert [c.source for c in every.cells if hints.is_hint(c)] == [c.source for c in solution.cells if hints.is_hint(c)]


def test_a_hint_cell_with_no_tier_left_is_left_out():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("<details><summary><b>Hint 1: the idea</b></summary>\nA\n</details>"),
        nbformat.v4.new_markdown_cell("<details><summary><b>Hint 2: where to look</b></summary>\nB\n</details>"),
        nbformat.v4.new_markdown_cell("<details><summary><b>Hint 3: the steps</b></summary>\nC\n</details>\n\nTry it."),
    ])
    kept = hints.for_class(nbformat.from_dict(nb), 1)
    assert [c.source for c in kept.cells] == [nb.cells[0].source, "Try it."]
