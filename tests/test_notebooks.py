"""The notebooks: stored in canonical form, released faithfully, and runnable as solved."""
from __future__ import annotations

import copy
import filecmp

import nbformat
import pytest
from nbclient import NotebookClient

from autograder import authoring

SLUGS = authoring.assignments()


def _solution(slug: str) -> nbformat.NotebookNode:
    return nbformat.read(authoring.solution_path(slug), as_version=4)


@pytest.mark.parametrize("slug", SLUGS)
def test_solution_is_stored_in_canonical_form(slug):
    nb = _solution(slug)
    assert authoring.problems(nb) == []
    assert authoring.normalize(copy.deepcopy(nb)) == nb, "run `make release`"


@pytest.fixture(scope="module")
def fresh_release(tmp_path_factory):
    folder = tmp_path_factory.mktemp("release")
    authoring.release(release_dir=folder / "course", db_url=f"sqlite:///{folder / 'gradebook.db'}")
    return folder / "course"


def test_course_is_a_fresh_release_of_the_solutions(fresh_release):
    """course/ is generated: no hand edits, nothing stale, nothing missing."""
    def differences(cmp: filecmp.dircmp) -> list[str]:
        found = ([f"only in course/: {n}" for n in cmp.left_only]
                 + [f"missing from course/: {n}" for n in cmp.right_only])
        found += [f"differs: {n}" for n in cmp.diff_files]
        return found + [d for sub in cmp.subdirs.values() for d in differences(sub)]

    cmp = filecmp.dircmp(authoring.ROOT / "course", fresh_release, ignore=[".ipynb_checkpoints"])
    assert differences(cmp) == [], "course/ is out of date: run `make release`"


@pytest.mark.parametrize("slug", SLUGS)
def test_released_notebook_keeps_skeletons_and_hides_answers(slug):
    released = nbformat.read(authoring.ROOT / "course" / slug / f"{slug}.ipynb", as_version=4)
    text = nbformat.writes(released)
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text
    solution = {c.metadata["nbgrader"]["grade_id"]: c for c in _solution(slug).cells if "nbgrader" in c.metadata}
    for cell in released.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution"):
            kept = [line for line in solution[grade_id].source.splitlines() if line.lstrip().startswith(("class ",
                                                                                                         "def "))]
            outside = _outside_markers(solution[grade_id].source)
            assert all(line in cell.source for line in kept if line in outside), f"{grade_id}: skeleton lost"
            assert "raise NotImplementedError()" in cell.source


def _outside_markers(source: str) -> str:
    inside, kept = False, []
    for line in source.splitlines():
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif not inside:
            kept.append(line)
    return "\n".join(kept)


@pytest.mark.slow
@pytest.mark.parametrize("slug", SLUGS)
def test_solution_runs_top_to_bottom_with_every_check_passing(slug):
    nb = _solution(slug)
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()
    problems = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        name = meta.get("grade_id") or cell.source.splitlines()[0][:60]
        for out in cell.outputs:
            if out.output_type == "error":
                problems.append(f"{name}: {out.ename}: {out.evalue[:200]}")
            if meta.get("grade") and out.output_type == "stream" and out.name == "stderr":
                problems.append(f"{name}: writes to stderr (nbgrader would give 0): {out.text[:200]}")
        if meta.get("grade"):
            printed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            if "✔" not in printed:
                problems.append(f"{name}: no check reported success")
    assert problems == []
