"""Keep the instructor notebooks canonical and generate the student notebooks from them.

`solutions/<slug>/<slug>.ipynb` is the one source; `course/` is nbgrader's release of it.
`normalize` puts a solution notebook in its stored form (no outputs, the shared setup
cell), `problems` lists what breaks the conventions nbgrader and the course rely on, and
`release` runs stock nbgrader's generate_assignment for every notebook.
"""
from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from pathlib import Path

import nbformat
from nbformat import NotebookNode

ROOT = Path(__file__).resolve().parent.parent  # the repository checkout
SOLUTIONS = "solutions"
# The package `make publish` builds (autograder/publish.py), and its self-study edition's (two
# names: pip never takes one edition's install for the other's).
STUDENT_DISTRIBUTION = "autograd-course-student"
SELF_STUDY_DISTRIBUTION = "autograd-course-self-study"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}

SETUP_CELL = '''\
# Setup: run this cell first. It works in JupyterLab, in Google Colab and under nbgrader.
import sys

if "google.colab" in sys.modules:  # Colab: install the course's checks; Colab's own torch stays
    import importlib, subprocess
    course = "{package} @ git+{url}"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", course], capture_output=True, text=True)
    if pip.returncode != 0:
        raise RuntimeError("Could not install the course's checks, so this notebook cannot run. Is the "
                           "runtime online? Then run this cell again. pip said:\\n" + pip.stderr[-2000:])
    importlib.invalidate_caches()
from autograder.student import setup

setup()'''

HAND_IN_TAG = "hand-in"  # the tag of the last cell of every notebook, which `normalize` writes
HAND_IN_CELL = '''\
# Hand in: write your student id between the quotes (as your instructor gave it) and run this
# cell. It saves the notebook and writes YOUR-ID__{slug}.zip beside it (Colab also downloads
# it): upload that file where your instructor asks. On a JupyterHub whose menu has
# Nbgrader → Assignment List, submit there instead.
from autograder.student.handin import hand_in

hand_in("");'''

_NBGRADER_KEYS = {"schema_version", "grade", "solution", "locked", "task", "grade_id", "points", "checksum",
                  "cell_type"}
_GRADE_ID = re.compile(r"^[a-zA-Z0-9_\-]+$")


def student_repository(root: Path = ROOT, self_study: bool = False) -> str:
    """The public repository students install from (`make publish` builds its content):
    `[tool.autograd-course] student-repository` in pyproject.toml, or with `self_study`, the
    self-study edition's own, `self-study-repository`."""
    with open(root / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["tool"]["autograd-course"]
    return table["self-study-repository" if self_study else "student-repository"]


def distribution(self_study: bool = False) -> str:
    """The student package's distribution name: the class edition's, or the self-study edition's."""
    return SELF_STUDY_DISTRIBUTION if self_study else STUDENT_DISTRIBUTION


def setup_source(root: Path = ROOT, self_study: bool = False) -> str:
    """The first code cell of every notebook. In Colab it installs the student package
    (with pip in a subprocess: nothing asks for a restart, and a failure says why) from the
    class edition's repository, or with `self_study` the self-study edition's."""
    return SETUP_CELL.format(package=distribution(self_study), url=student_repository(root, self_study))


def assignments(root: Path = ROOT) -> list[str]:
    """Slugs of the notebooks in solutions/, in course order."""
    return sorted(p.parent.name for p in (root / SOLUTIONS).glob("*/*.ipynb") if p.stem == p.parent.name)


def solution_path(slug: str, root: Path = ROOT) -> Path:
    return root / SOLUTIONS / slug / f"{slug}.ipynb"


def normalize(nb: NotebookNode, root: Path = ROOT) -> NotebookNode:
    """Stored form: no outputs, canonical metadata, the shared setup cell first."""
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    for index, cell in enumerate(nb.cells):
        kept = {k: v for k, v in cell.metadata.items() if k in ("nbgrader", "tags")}
        cell.metadata = kept
        cell.id = kept.get("nbgrader", {}).get("grade_id") or f"cell-{index}"
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    setup = next(c for c in nb.cells if c.cell_type == "code")
    setup.source = setup_source(root)
    setup.metadata["nbgrader"] = {
        "grade": False, "grade_id": "setup", "locked": True, "schema_version": 3, "solution": False, "task": False,
    }
    setup.id = "setup"
    nb.cells = [c for c in nb.cells if HAND_IN_TAG not in c.metadata.get("tags", [])]
    nb.cells.append(hand_in_cell(_slug(nb)))
    return nb


def hand_in_cell(slug: str) -> NotebookNode:
    """The last cell of every notebook: the student hands the notebook in (autograder/student/handin.py)."""
    cell = nbformat.v4.new_code_cell(HAND_IN_CELL.format(slug=slug), metadata={"tags": [HAND_IN_TAG]})
    cell.id = HAND_IN_TAG
    return cell


def _slug(nb: NotebookNode) -> str:
    """The notebook's slug, as its summary cell names it (`summary("SLUG")`)."""
    for cell in nb.cells:
        found = re.search(r'\bsummary\("([^"]+)"\)', cell.source) if cell.cell_type == "code" else None
        if found:
            return found.group(1)
    return "ASSIGNMENT"


def _nbgrader(cell: NotebookNode) -> dict:
    return cell.metadata.get("nbgrader", {})


def _balanced(source: str, begin: str, end: str) -> bool:
    depth = 0
    for line in source.splitlines():
        if begin in line:
            depth += 1
            if depth > 1:
                return False
        elif end in line:
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def problems(nb: NotebookNode, root: Path = ROOT) -> list[str]:
    """Everything that breaks the stored form or the nbgrader conventions of the course."""
    found: list[str] = []
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as error:
        found.append(f"invalid notebook: {error.message}")
    if nb.metadata.get("kernelspec", {}).get("name") != "python3":
        found.append("kernelspec must be python3")
    seen: set[str] = set()
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not code or code[0].source != setup_source(root):
        found.append("the first code cell must be the shared setup cell (run `make release`)")
    if not nb.cells or nb.cells[-1].source != hand_in_cell(_slug(nb)).source:
        found.append("the last cell must be the hand-in cell (run `make release`)")
    for i, cell in enumerate(nb.cells):
        where = f"cell {i}"
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None):
            found.append(f"{where}: outputs must be cleared")
        meta = _nbgrader(cell)
        source = cell.source
        is_solution = bool(meta.get("solution"))
        is_test = bool(meta.get("grade")) and not is_solution
        if meta:
            where = f"cell {i} ({meta.get('grade_id')})"
            if meta.get("schema_version") != 3:
                found.append(f"{where}: nbgrader schema_version must be 3")
            if set(meta) - _NBGRADER_KEYS:
                found.append(f"{where}: unknown nbgrader keys {sorted(set(meta) - _NBGRADER_KEYS)}")
            grade_id = meta.get("grade_id", "")
            if not _GRADE_ID.match(grade_id):
                found.append(f"{where}: grade_id must match [a-zA-Z0-9_-]+")
            if grade_id in seen:
                found.append(f"{where}: duplicate grade_id")
            seen.add(grade_id)
            if meta.get("grade") and not (isinstance(meta.get("points"), (int, float)) and meta["points"] > 0):
                found.append(f"{where}: a graded cell needs points > 0")
        has_solution = "### BEGIN SOLUTION" in source or "### END SOLUTION" in source
        if has_solution and not is_solution:
            found.append(f"{where}: solution markers outside a solution cell")
        if is_solution and cell.cell_type == "code":
            if "### BEGIN SOLUTION" not in source or not _balanced(source, "### BEGIN SOLUTION", "### END SOLUTION"):
                found.append(f"{where}: a solution cell needs balanced BEGIN/END SOLUTION markers")
        has_hidden = "### BEGIN HIDDEN TESTS" in source or "### END HIDDEN TESTS" in source
        if has_hidden and not is_test:
            found.append(f"{where}: hidden tests outside a graded test cell")
        if has_hidden and not _balanced(source, "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"):
            found.append(f"{where}: unbalanced HIDDEN TESTS markers")
    found += _exercise_pattern(nb)
    return found


def _exercise_pattern(nb: NotebookNode) -> list[str]:
    """Every answer cell is followed by a hint, a visible check and a graded hidden check."""
    found = []
    cells = nb.cells
    starts = [i for i, c in enumerate(cells) if c.cell_type == "code" and _nbgrader(c).get("solution")]
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(cells)
        part = cells[start + 1 : end]
        grade_id = _nbgrader(cells[start]).get("grade_id")
        if not any(c.cell_type == "markdown" and "<details>" in c.source for c in part):
            found.append(f"exercise {grade_id}: no hint (<details>) after the answer cell")
        checks = [c for c in part if c.cell_type == "code" and _nbgrader(c).get("locked")]
        if not any("check" in c.source and "### BEGIN HIDDEN TESTS" not in c.source for c in checks):
            found.append(f"exercise {grade_id}: no visible check cell")
        if not any(_nbgrader(c).get("grade") and "### BEGIN HIDDEN TESTS" in c.source for c in checks):
            found.append(f"exercise {grade_id}: no graded hidden check cell")
    return found


def normalize_all(root: Path = ROOT) -> list[str]:
    """Rewrite every solution notebook in its stored form; return the slugs changed."""
    changed = []
    for slug in assignments(root):
        path = solution_path(slug, root)
        before = path.read_text()
        nb = normalize(nbformat.reads(before, as_version=4), root)
        after = nbformat.writes(nb) + "\n"
        if after != before:
            path.write_text(after)
            changed.append(slug)
    return changed


VISIBLE_CHECKS = Path(__file__).resolve().parent / "student" / "visible_checks.json"


def visible_checks(nb: NotebookNode) -> list[dict]:
    """The visible check cells of a solution notebook, in order, as the summary cell runs
    them: the exercise (from the last "## Exercise N.k" heading above), grade id, points
    (0 for a check that scores nothing, such as a quiz's form), source, and the points of
    the hidden check cell that follows it."""
    found: list[dict] = []
    exercise = ""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.startswith("## "):
            heading = re.match(r"## Exercise (\d+\.\d+)", cell.source)
            exercise = heading.group(1) if heading else ""
        meta = _nbgrader(cell)
        if cell.cell_type != "code" or meta.get("solution"):
            continue
        if not (meta.get("grade") or (meta.get("locked") and meta.get("grade_id", "").startswith("check"))):
            continue
        if "### BEGIN HIDDEN TESTS" in cell.source:
            found[-1]["hidden_points"] += meta["points"]
            continue
        found.append({"exercise": exercise, "grade_id": meta["grade_id"],
                      "points": meta.get("points", 0) if meta.get("grade") else 0,
                      "source": cell.source, "hidden_points": 0})
    return found


def visible_checks_json(root: Path = ROOT) -> str:
    """{slug: visible checks} of every notebook: what `write_visible_checks` writes."""
    table = {slug: visible_checks(nbformat.read(solution_path(slug, root), as_version=4)) for slug in assignments(root)}
    return json.dumps(table, indent=1, ensure_ascii=False) + "\n"


def write_visible_checks(root: Path = ROOT) -> None:
    """Write the summary cells' list of visible checks into autograder/student/ (release
    does, as it writes course/): the checks' source stays the notebooks' own."""
    VISIBLE_CHECKS.write_text(visible_checks_json(root))


def use_this_environment() -> None:
    """Put this interpreter's scripts first on PATH: nbgrader runs `alembic` by name."""
    scripts = str(Path(sys.executable).parent)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != scripts:
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")


# What Jupyter and Python leave in any folder (nbgrader's CourseDirectory.ignore): never an instructor's work.
GENERATED = (".ipynb_checkpoints", "__pycache__")


def hand_made(slugs: list[str], root: Path = ROOT) -> list[str]:
    """Files in course/SLUG/ that solutions/SLUG/ does not have (put there by hand), which a
    release would delete (nbgrader replaces course/SLUG/ whole): paths from the root."""
    found = []
    for slug in slugs:
        released, source = root / "course" / slug, root / SOLUTIONS / slug
        for path in sorted(released.rglob("*")):
            inside = path.relative_to(released)
            if path.is_file() and not set(inside.parts) & set(GENERATED) and not (source / inside).exists():
                found.append(str(path.relative_to(root)))
    return found


def release(root: Path = ROOT, release_dir: Path | None = None, db_url: str | None = None,
            slugs: list[str] | None = None) -> None:
    """Run nbgrader's generate_assignment for every notebook, or for `slugs` only (stock
    nbgrader, in-process).

    By default this writes course/ and the gradebook, as `nbgrader generate_assignment`
    from the root would; tests pass another `release_dir` and a throwaway `db_url`.
    """
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    if release_dir is not None:
        config.CourseDirectory.release_directory = str(release_dir)
    if db_url is not None:
        config.CourseDirectory.db_url = db_url
    config.Application.log_level = "WARN"
    use_this_environment()
    for slug in assignments(root) if slugs is None else slugs:
        config.CourseDirectory.assignment_id = slug
        coursedir = CourseDirectory(config=config)
        app = GenerateAssignment(coursedir=coursedir, config=config)
        app.force = True
        app.start()
