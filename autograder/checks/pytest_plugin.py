"""A pytest plugin: the course's checks of a project's own Functions, one line each in its tests.

    def test_swish(function_check):
        function_check(Swish, torch.randn(8, 3), reference=lambda x: x * torch.sigmoid(x))

`function_check` is :func:`autograder.checks.anyfunction.check_function`. A test that fails
through it shows the course's message (the input, the expected and actual values, the likely
cause) instead of a traceback through the checks. Installed with the package (the `pytest11`
entry point); a test that does not ask for the fixture is left alone, and nothing heavy is
imported until one does.
"""
from __future__ import annotations

from typing import Any

import pytest

_USED = pytest.StashKey[bool]()


@pytest.fixture
def function_check(request: pytest.FixtureRequest) -> Any:
    """`function_check(MyFn, inputs, reference=None, **options)`: autograder's check_function."""
    from .anyfunction import check_function

    request.node.stash[_USED] = True
    return check_function


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if call.excinfo is not None and item.stash.get(_USED, False):
        from ..student.report import CheckFailed  # (imported by the fixture already)

        if call.excinfo.errisinstance(CheckFailed):
            report.longrepr = f"CheckFailed: {call.excinfo.value}"
    return report
