"""The grader's patches of nbgrader (autograder/grader/nbgrader_adapter.py) still patch
what nbgrader does, and still change something: each test fails when nbgrader stops
calling what is replaced, or when the replacement stops making a difference."""
from __future__ import annotations

import inspect

import jsonschema
import nbformat
import pytest
from nbgrader import api
from nbgrader.nbgraderformat import MetadataValidator, common
from nbgrader.preprocessors import latesubmissions, overwritecells, overwritekernelspec, saveautogrades

from autograder.grader import gradebook, nbgrader_adapter, prepare


def test_every_gradebook_builds_its_own_engine_unless_shared():
    assert "create_engine(" in inspect.getsource(api.Gradebook.__init__)
    with nbgrader_adapter.applied():
        assert api.create_engine("sqlite://") is api.create_engine("sqlite://")
    assert api.create_engine("sqlite://") is not api.create_engine("sqlite://")


def test_each_cell_is_checked_against_a_schema_checked_once():
    assert "jsonschema.validate(" in inspect.getsource(common.BaseMetadataValidator.validate_cell)
    cell = nbformat.v4.new_code_cell("x", metadata={"nbgrader": {"grade": True, "grade_id": "a", "locked": True,
                                                                 "schema_version": 3, "solution": False}})
    with nbgrader_adapter.applied():
        assert common.jsonschema.validate is nbgrader_adapter._validate
        MetadataValidator().validate_cell(nbformat.from_dict({**cell, "metadata": {"nbgrader": {
            **cell.metadata.nbgrader, "points": 1}}}))  # valid: no error
        with pytest.raises(jsonschema.ValidationError):  # the same verdicts as nbgrader's own
            MetadataValidator().validate_cell(nbformat.from_dict({**cell, "metadata": {"nbgrader": {
                **cell.metadata.nbgrader, "points": 1, "grade": "yes"}}}))
    assert common.jsonschema is jsonschema


@pytest.mark.parametrize("module", [overwritecells, overwritekernelspec, saveautogrades, latesubmissions],
                         ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_the_preprocessors_open_their_gradebook_by_the_name_that_is_lent(module):
    assert module in (*gradebook._WRITING_MODULES, *prepare.LENT_MODULES)
    assert "Gradebook(" in inspect.getsource(module)
    lender = gradebook._Lent(object())
    with gradebook.lent(lender, (module,)):
        assert module.Gradebook("sqlite://") is lender
    assert module.Gradebook is api.Gradebook
