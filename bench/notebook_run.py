"""Run a solved notebook top to bottom in this interpreter, as a kernel would, without Jupyter.

The cells run in order in one namespace (a module of its own, as IPython's __main__ is),
with the model answers or the answers given; IPython magics (`%...`, `!...`) are skipped.
Graded cells are scored as nbgrader scores them: full points unless the cell raised or
wrote to stderr, a number as its last expression for partial credit. Needs only Python,
torch and numpy (the GPU machine has no Jupyter), so notebooks are read as JSON.

    python3 bench/notebook_run.py SLUG [ANSWERS.json]

ANSWERS.json: {answer cell grade_id: source} replacing model answers. Prints JSON lines: the
interpreter's versions, then each cell's result as soon as it has run (a notebook stopped
for its time keeps the cells it finished, as the grader's do).
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
KEPT = 4000  # characters of a test cell's output kept for the report


@dataclass
class Cell:
    index: int
    grade_id: str
    kind: str  # setup, demo, answer, check (visible), hidden, summary
    source: str
    points: float = 0.0  # for graded cells


@dataclass
class Exercise:
    answer_id: str
    graded: list[str] = field(default_factory=list)  # grade_ids of the graded cells that check it


@dataclass
class Result:
    index: int
    grade_id: str
    kind: str
    status: str  # ok, failed, skipped (a module this machine lacks)
    seconds: float
    points: float = 0.0
    score: float = 0.0
    error: str = ""  # the error's type and message, or why the cell was skipped
    output: str = ""  # what a test cell printed (the checks' notes), truncated


def solution_path(slug: str) -> Path:
    return REPO / "solutions" / slug / f"{slug}.ipynb"


def slugs() -> list[str]:
    return sorted(p.name for p in (REPO / "solutions").iterdir() if solution_path(p.name).exists())


def cells(slug: str) -> list[Cell]:
    """The code cells of a solved notebook, each with its role."""
    found = []
    for index, cell in enumerate(json.loads(solution_path(slug).read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        meta = cell["metadata"].get("nbgrader", {})
        grade_id, source = meta.get("grade_id", ""), "".join(cell["source"])
        if grade_id == "setup" or grade_id == "summary":
            kind = grade_id
        elif meta.get("solution"):
            kind = "answer"
        elif "BEGIN HIDDEN TESTS" in source:
            kind = "hidden"
        elif meta.get("grade") or grade_id.startswith("check"):
            kind = "check"
        else:
            kind = "demo"
        found.append(Cell(index, grade_id, kind, source, float(meta.get("points", 0)) if meta.get("grade") else 0.0))
    return found


def exercises(found: list[Cell]) -> list[Exercise]:
    """Answer cells in order, each with the graded cells that follow it."""
    result: list[Exercise] = []
    for cell in found:
        if cell.kind == "answer":
            result.append(Exercise(cell.grade_id))
        elif cell.points and result:
            result[-1].graded.append(cell.grade_id)
    return result


def model_solution(source: str) -> str:
    """An answer cell as a student who got it right would leave it (markers removed)."""
    return "\n".join(line for line in source.splitlines() if line.strip() not in SOLUTION_MARKERS)


def without_magics(source: str) -> tuple[str, int]:
    """The cell with IPython's `%magic` and `!shell` lines replaced by `pass`, and how many."""
    lines, skipped = [], 0
    for line in source.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")):
            lines.append(line[: len(line) - len(stripped)] + "pass")
            skipped += 1
        else:
            lines.append(line)
    return "\n".join(lines), skipped


def _execute(code: str, name: str, namespace: dict):
    """Run a cell; return the value of its last line when that is an expression (as a kernel shows it)."""
    tree = ast.parse(code, name)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, name, "exec"), namespace)
    if last is not None:
        return eval(compile(ast.Expression(last.value), name, "eval"), namespace)
    return None


def _missing_module(error: BaseException) -> str | None:
    """The name of a module this machine lacks, when that is what stopped the cell."""
    if isinstance(error, ModuleNotFoundError) and error.name:
        return error.name.split(".")[0]
    return None


def _score(value, points: float) -> float:
    """nbgrader's partial credit: a number as the cell's result, within [0, points]."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= points:
        return float(value)
    return points


def run(slug: str, answers: dict[str, str] | None = None) -> Iterator[Result]:
    """Every code cell of `slug`, in order, in one fresh namespace, each result as it comes."""
    module = types.ModuleType(f"notebook_{slug}")  # torch.compile finds classes through sys.modules
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    namespace["display"] = print  # IPython's builtin, for cells that call it
    for cell in cells(slug):
        source = cell.source
        if cell.kind == "answer":
            source = (answers or {}).get(cell.grade_id, model_solution(source))
        code, magics = without_magics(source)
        out, err = io.StringIO(), io.StringIO()
        started = time.perf_counter()
        value, error = None, None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                value = _execute(code, f"<{slug}:{cell.grade_id or cell.index}>", namespace)
            except BaseException as exc:  # a cell may raise anything, SystemExit included
                error = exc
        result = Result(cell.index, cell.grade_id, cell.kind, "ok", time.perf_counter() - started, cell.points)
        if error is not None:
            missing = _missing_module(error)
            result.status = "skipped" if missing else "failed"
            result.error = f"needs {missing}, not installed here" if missing else _describe(error)
        elif magics:
            result.error = f"{magics} IPython magic line(s) skipped"
        if cell.points:
            wrote = err.getvalue().strip()
            result.score = 0.0 if error is not None or wrote else _score(value, cell.points)
            if error is None and wrote:
                result.error = "wrote to stderr (nbgrader gives 0): " + wrote.splitlines()[-1][:300]
        if cell.kind in ("check", "hidden", "summary"):
            result.output = (out.getvalue() + err.getvalue())[-KEPT:]
        yield result


def _describe(error: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    return text[:KEPT]


def main() -> None:
    slug = sys.argv[1]
    answers = json.loads(Path(sys.argv[2]).read_text()) if len(sys.argv) > 2 else None
    sys.path[:0] = [str(REPO)]
    folder = tempfile.mkdtemp(prefix=f"notebook-{slug}-")
    for path in solution_path(slug).parent.iterdir():  # the files a notebook expects beside it
        if path.is_file() and path.suffix != ".ipynb":
            shutil.copy(path, folder)
    os.chdir(folder)
    import torch

    print(json.dumps({"slug": slug, "torch": torch.__version__,
                      "devices": ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]}), flush=True)
    for result in run(slug, answers):
        print(json.dumps({"cell": asdict(result)}), flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)  # skip torch's teardown


if __name__ == "__main__":
    main()
