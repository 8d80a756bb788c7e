"""nbgrader's Validate (the Assignment List's button, `nbgrader validate`) on a notebook whose
answer cell raised: the check cell that needs the answer says so in one line, like every
other check message, instead of a NameError's traceback; a NameError in the student's own
code keeps its traceback, which points at their line."""
from __future__ import annotations

import json

import nbformat
import pytest
from nbconvert.filters import strip_ansi
from nbgrader.validator import Validator

from autograder import authoring
from autograder.student import report, summary

pytestmark = pytest.mark.slow  # a kernel runs the notebook
SLUG = "03_function_basics"
TYPO = "import torch\n\n\nclass ClippedReLU(torch.autograd.Functon):  # a typo: the class is never defined\n    pass"
TRY_IT = "y = ClippedReLU.apply(torch.ones(3), 2.0)"  # the student's own cell


def _cell(source: str, **nbgrader) -> nbformat.NotebookNode:
    meta = {"nbgrader": {"schema_version": 3, "grade": False, "solution": False, "locked": False, "task": False,
                         **nbgrader}} if nbgrader else {}
    return nbformat.v4.new_code_cell(source, metadata=meta)


def test_validate_says_in_one_line_that_a_check_cannot_run_without_its_answer(tmp_path):
    (check,) = [c for c in json.loads(summary.resources.files(summary.__package__).joinpath("visible_checks.json")
                                      .read_text())[SLUG] if c["grade_id"] == "check_clipped_relu"]
    assert summary.is_check_cell(check["source"]) and not summary.is_check_cell(TRY_IT)
    nb = nbformat.v4.new_notebook(cells=[
        _cell(authoring.setup_source(), grade_id="setup", locked=True),
        _cell(TYPO, grade_id="clipped_relu", solution=True),
        _cell(TRY_IT),
        _cell(check["source"], grade_id="check_clipped_relu", grade=True, locked=True, points=2),
    ], metadata={"kernelspec": authoring.KERNELSPEC})
    path = tmp_path / f"{SLUG}.ipynb"
    nbformat.write(nb, path)
    results = Validator(validate_all=True).validate(str(path))  # all: the student's own cells too
    failed = {f["source"]: strip_ansi(f["raw_error"]) for f in results["failed"]}
    said = failed[check["source"]]
    assert said == f"NameError: {report.undefined('ClippedReLU')}", said  # one line, saying what to do
    own = failed[TRY_IT]  # a NameError in the student's code: IPython's traceback, at their line
    assert "Traceback" in own and "----> 1 y = ClippedReLU.apply" in own and "is not defined" in own, own
    assert "Functon" in failed[TYPO]  # what they must fix, as Python said it
