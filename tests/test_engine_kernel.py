"""Cells run in the engine's children behave as in Jupyter, and score as in nbgrader."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import nbformat
import pytest
from nbgrader.utils import determine_grade

from autograder.grader import verdicts
from autograder.grader.pool import Pool
from autograder.grader.prepare import compiles
from autograder.grader.records import Program, Run
from autograder.grader.scan import imported
from autograder.isolation import sandbox
from autograder.isolation.limits import Limits

pytestmark = pytest.mark.slow

CELLS = {
    "print": "print('out'); import sys; print('err', file=sys.stderr)",
    "fd_stderr": "import os; os.write(2, b'native\\n'); os.write(1, b'native out\\n');",
    "warning": "import warnings; warnings.warn('careful')",
    "result": "0.25",
    "html": "from IPython.display import HTML, display; display(HTML('<b>bold</b>'))",
    "figure": "import matplotlib.pyplot as plt; plt.plot([1, 2, 3]);",
    "magics": "%time x = 1\n!echo shell",
    "cell_magic": "%%capture captured\nprint('hidden')",
    "error": "1 / 0",
    "check_failed": "from autograder.student.report import fail\nfail('wrong gradient', 'x = 1', cause='a reason')",
    "silenced": "get_ipython().set_custom_exc((Exception,), lambda *a, **k: None)\nraise ValueError('swallowed')",
    "state": "x = 41",
    "uses_state": "x + 1",
    "file": "open('data.txt').read()",
    "graph": "import graphviz\nsvg = graphviz.Digraph(node_attr={'fontname': 'Helvetica'})\nsvg.edge('a', 'b')\n"
             "len(svg.pipe(format='svg')) > 100",
    "program": "import subprocess, sys\n"
               "subprocess.run([sys.executable, '-c', 'sum(range(10**7))'], check=True).returncode",
}


@pytest.fixture(scope="module")
def ran():
    root = Path(__file__).resolve().parent.parent
    program = Program([(i, name, source) for i, (name, source) in enumerate(CELLS.items())], {"data.txt": b"beside"})
    fresh = Program([(0, "fresh", "x")])
    small = Program([(0, "loud", "print('x' * 5000)\nimport sys; print('late', file=sys.stderr)\n0.5")])
    with Pool(1, sandbox.detect(True, root), root, Limits(timeout=60)) as pool:
        pool.submit("main", [program])
        pool.submit("fresh", [fresh])
        runs = dict(pool.result() for _ in range(2))
        small_run = pool.workers[0].run(small, Limits(timeout=60, output=1000))
    outputs = {name: runs["main"][0].cells[i].outputs for i, name in enumerate(CELLS)}
    return outputs, runs["fresh"][0], small_run, runs["main"][0]


def _grade(outputs) -> float:
    cell = nbformat.v4.new_code_cell("", outputs=[nbformat.from_dict(o) for o in outputs])
    cell.metadata.nbgrader = {"grade": True, "solution": False, "locked": True, "points": 2, "grade_id": "t",
                              "schema_version": 3}
    return determine_grade(cell)[0]


def test_streams_python_and_native(ran):
    outputs = ran[0]
    assert [(o["name"], o["text"]) for o in outputs["print"]] == [("stdout", "out\n"), ("stderr", "err\n")]
    assert {o["name"]: o["text"] for o in outputs["fd_stderr"]} == {"stderr": "native\n", "stdout": "native out\n"}
    assert _grade(outputs["fd_stderr"]) == 0 and _grade(outputs["warning"]) == 0  # stderr scores 0, as in nbgrader


def test_results_and_partial_credit(ran):
    outputs = ran[0]
    assert outputs["result"][0]["output_type"] == "execute_result" and _grade(outputs["result"]) == 0.25
    assert outputs["uses_state"][0]["data"]["text/plain"] == "42"
    assert outputs["file"][0]["data"]["text/plain"] == "'beside'"


def test_rich_outputs(ran):
    outputs = ran[0]
    assert outputs["html"][0]["data"]["text/html"] == "<b>bold</b>"
    assert "image/png" in outputs["figure"][-1]["data"]


def test_magics(ran):
    outputs = ran[0]
    text = "".join(o.get("text", "") for o in outputs["magics"])
    assert "Wall time" in text and "shell" in text
    assert outputs["cell_magic"] == []


def test_errors_are_error_outputs_even_when_silenced(ran):
    outputs = ran[0]
    (error,) = outputs["error"]
    traceback = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))
    assert error["ename"] == "ZeroDivisionError" and "1 / 0" in traceback
    assert [o["ename"] for o in outputs["silenced"] if o["output_type"] == "error"] == ["ValueError"]
    assert _grade(outputs["silenced"]) == 0


def test_a_failed_check_shows_its_message_alone(ran):
    """No frames: the checks' internals say nothing to a student, and a hidden test's
    source must not be quoted."""
    (error,) = ran[0]["check_failed"]
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))
    assert text == "CheckFailed: wrong gradient\n  x = 1\nLikely cause: a reason"
    assert _grade(ran[0]["check_failed"]) == 0


def test_every_notebook_starts_fresh(ran):
    fresh = ran[1]
    assert fresh.cells[0].outputs[0]["ename"] == "NameError"


def test_a_cells_cpu_counts_the_programs_it_ran(ran):
    """A program a cell runs and waits for (dot, for a graph) is the cell's work, not the engine's."""
    cells = ran[3].cells
    assert ran[0]["program"][0]["data"]["text/plain"] == "0"
    assert cells[list(CELLS).index("program")].cpu >= 0.1  # the program alone burns about 0.2 CPU-s
    assert cells[list(CELLS).index("state")].cpu < 0.05


def test_cut_output_keeps_what_scores(ran):
    small = ran[2]
    outputs = small.cells[0].outputs
    assert "truncated" in outputs[0]["text"] and len(outputs[0]["text"]) < 1200
    assert [o["name"] for o in outputs if o["output_type"] == "stream"] == ["stdout", "stderr"]
    assert _grade(outputs) == 0  # the stderr line still counts


def test_workers_preload_what_the_notebooks_import_and_stay_single_threaded(monkeypatch):
    """Preloaded once in the warm worker, a module is already there for every notebook (with
    what a module of the course names in PRELOAD), and so is the compiler's machinery from the
    first notebook that compiles on (not before it, unless the first notebooks compile: a
    second pool), when the grader also warms up for the compiler. The worker, which forks,
    still runs one thread after importing what all of the course's notebooks import and
    compiling. (The marker of compiling: a module of the compiler that no notebook imports
    itself.)"""
    root = Path(__file__).resolve().parent.parent
    modules = list(dict.fromkeys(
        name for notebook in sorted((root / "course").glob("*/*.ipynb"))
        for cell in nbformat.read(notebook, as_version=4).cells if cell.cell_type == "code"
        for name in imported(cell.source)
    ))
    assert "matplotlib.pyplot" in modules and "torchviz" in modules
    probe = Program([(0, "probe",
                      "import os, sys\n('matplotlib.pyplot' in sys.modules, "
                      "'torch._inductor.scheduler' in sys.modules, "
                      "len(os.listdir(f'/proc/{os.getppid()}/task')))")])
    monkeypatch.setattr(verdicts, "warmth", verdicts.Warmth())  # (the grader warms up for the compiler too)
    with Pool(1, sandbox.detect(True, root), root, Limits(timeout=60)) as pool:
        before = _run(pool, probe)
        pool.preload(["autograder.student.gradient_patterns"])  # whose pictures import pyplot when drawn
        named = _run(pool, probe)
        pool.preload(modules)
        imported_only = _run(pool, probe)
        assert verdicts.warm_compiler not in verdicts.warmth.paid
        compiled = _run(pool, dataclasses.replace(probe, compiles=True))
        assert verdicts.warm_compiler in verdicts.warmth.paid
        after = _run(pool, probe)
    monkeypatch.setattr(verdicts, "warmth", verdicts.Warmth())
    with Pool(1, sandbox.detect(True, root), root, Limits(timeout=60)) as pool:
        pool.preload([], first_compile=True)
        assert verdicts.warm_compiler in verdicts.warmth.paid
        at_once = _run(pool, probe)
        compiling = _run(pool, Program([(0, "compile", (
            "import torch, torch._dynamo.guards as guards\n"
            "f = torch.compile(lambda t: (t * 2).sum(), backend='aot_eager', fullgraph=True)\n"
            "(float(f(torch.ones(3))), guards.profile_guard_manager(None, None, 1))"))]))
    assert before.cells[0].outputs[0]["data"]["text/plain"] == "(False, False, 1)"
    assert named.cells[0].outputs[0]["data"]["text/plain"] == "(True, False, 1)"
    assert imported_only.cells[0].outputs[0]["data"]["text/plain"] == "(True, False, 1)"
    assert compiled.cells[0].outputs[0]["data"]["text/plain"] == "(True, True, 1)"
    assert after.cells[0].outputs[0]["data"]["text/plain"] == "(True, True, 1)"
    assert at_once.cells[0].outputs[0]["data"]["text/plain"] == "(False, True, 1)"
    # A child compiles as usual, without timing each graph's guards (a metric nothing reads).
    assert compiling.cells[0].outputs[0]["data"]["text/plain"] == "(6.0, 0.0)", compiling.cells[0].outputs



def _run(pool: Pool, program: Program) -> Run:
    """Run through the pool's own thread (which owns the worker while it warms up)."""
    pool.submit("one", [program])
    _, (run,) = pool.result()
    return run

def test_the_workers_compile_once_for_the_notebooks_that_compile():
    root = Path(__file__).resolve().parent.parent
    calling = {notebook.stem for notebook in (root / "course").glob("*/*.ipynb")
               if compiles(nbformat.read(notebook, as_version=4).cells)}
    assert calling == {"10_modern_api", "11_capstone"}


def test_imported_names_the_modules_a_cell_imports():
    source = ("%matplotlib inline\nimport os.path, torch as t\nfrom a.b import c\nfrom . import d\ndef f():\n"
              "    import json")
    assert imported(source) == ["os.path", "torch", "a.b", "json"]
    assert imported("this is not python") == []


def test_the_scan_leaves_the_student_sides_public_helpers_alone():
    from autograder.grader.scan import _findings

    public = ["from autograder.student.handin import hand_in", "from autograder.student import setup",
              "from autograder.student import graphs", "from autograder.student.saved import show_saved"]
    assert not [f for line in public for f in _findings("c", line)]
    for line in ("from autograder.student.saved import record", "import autograder.student.serve as s",
                 "from autograder.exercises.gradcheck import check_softmax"):
        assert [f.reason for f in _findings("c", line)] == ["reaches into the course's grading code"], line


def test_graphs_render_without_fontconfig_noise(ran):
    """dot, run by the notebook's own user in the sandbox, finds its fonts: nothing on stderr."""
    outputs = ran[0]
    assert outputs["graph"] == [{"output_type": "execute_result",
                                 "execution_count": outputs["graph"][0]["execution_count"],
                                 "data": {"text/plain": "True"}, "metadata": {}}], outputs["graph"]
