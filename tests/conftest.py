from __future__ import annotations

import pytest
import torch

import scheduling
from answers import Answer, for_notebook
from autograder import authoring, registry
from autograder.authoring import use_this_environment

pytest_plugins = ["cost"]

# nbgrader (in-process and as a subprocess) runs `alembic` by name.
use_this_environment()
# As every notebook's setup cell does: checks run many tiny operations, and a thread pool
# on a busy 2-core machine made them 10-40x slower (the other test worker takes a core).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def seeded():
    """Every test starts torch's default generator from the same recorded seed, so a draw
    without a generator of its own is the same on every run, whatever ran before it."""
    torch.manual_seed(0)


def pytest_addoption(parser):
    parser.addoption("--stock-all", action="store_true",
                     help="compare with stock nbgrader on every known answer, not on a sample (`make compare-stock`)")
    parser.addoption("--classes-all", action="store_true",
                     help="grade every known answer of every notebook end to end, not only grading.GRADED_WHOLE's "
                          "(the others: the first wrong and right answer of each exercise) (`make classes`)")
    parser.addoption("--verdicts-all", action="store_true",
                     help="test_verdicts.py on every known answer, not the first wrong one of each exercise "
                          "(`make verdicts`)")
    parser.addoption("--faults-all", action="store_true",
                     help="test_engine_faults.py kills the grader 21 times, not 5, and test_cluster.py kills a Dask "
                          "worker and the scheduler mid-run (`make faults`)")
    parser.addoption("--integration", action="store_true",
                     help="run the tests marked integration: real servers and browsers (`make integration`)")
    parser.addoption("--fuzz", type=int, default=12,
                     help="mutated notebooks graded by test_fuzz.py (`make fuzz`: 1000)")
    parser.addoption("--fuzz-seed", type=int, default=20261127, help="the seed test_fuzz.py generates them from")
    parser.addoption("--fuzz-replies", type=int, default=40,
                     help="hostile replies judged by test_fuzz.py (`make fuzz`: 500)")


def pytest_configure(config):
    """Every exercise's grade_id is a marker: `pytest -m conv2d` runs the tests of 04's Conv2d."""
    for exercise in registry.exercises():
        config.addinivalue_line("markers", f"{exercise.grade_id}: the tests of {exercise.heading} ({exercise.slug})")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(config, items):
    """A test of an exercise — named by its parameters (a known answer, its label, a
    grade_id) or by the test's own name — carries the exercise's grade_id as a marker. Tests
    sharing a set-up (a notebook's graded class, a module's graded course or server) run in
    one worker, the longest units first (tests/scheduling.py)."""
    labels = _exercises_by_label()
    skip_integration = pytest.mark.skip(reason="real servers and browsers: make integration")
    for item in items:
        if "integration" in item.keywords and not config.getoption("--integration"):
            item.add_marker(skip_integration)
        params = item.callspec.params if hasattr(item, "callspec") else {}
        for grade_id in _exercises_of(params, labels) | _exercises_named(getattr(item, "originalname", item.name)):
            item.add_marker(getattr(pytest.mark, grade_id))
    # pytest-xdist's workers run with dist "no" and loadgroup set; the controller collects nothing.
    scheduling.schedule(items, ordered=getattr(config.option, "loadgroup", False))


def _exercises_by_label() -> dict[str, set[str]]:
    """{a known answer's label: the exercises it answers}."""
    found: dict[str, set[str]] = {}
    for slug in authoring.assignments():
        module = for_notebook(slug)
        for answer in module.MUTANTS + module.VARIANTS:
            found.setdefault(answer.label, set()).add(answer.exercise)
    return found


def _exercises_named(test: str) -> set[str]:
    """The exercises a test's name names (test_conv2d_right: conv2d)."""
    return {e.grade_id for e in registry.exercises() if f"_{e.grade_id}_" in f"_{test}_"}


def _exercises_of(params: dict, labels: dict[str, set[str]]) -> set[str]:
    """The exercises a test's parameters name: a known answer, its label, or a grade_id."""
    found: set[str] = set()
    for name, value in params.items():
        if isinstance(value, Answer):
            found.add(value.exercise)
        elif isinstance(value, str) and name == "label":
            found |= labels.get(value, set())
        elif isinstance(value, str) and registry.named(value):
            found.add(value)
    return found


@pytest.fixture(scope="session")
def class_batches(tmp_path_factory, pytestconfig):
    """slug -> its class batch (the model solution, its known answers — every one or the
    sample: grading.every_answer_graded —, the released notebook), graded once per test
    worker by `autograder grade --feedback`."""
    from grading import ClassBatch, every_answer_graded

    found: dict[str, ClassBatch] = {}

    def batch(slug: str) -> ClassBatch:
        if slug not in found:
            found[slug] = ClassBatch.graded(slug, tmp_path_factory.mktemp(f"batch-{slug}"),
                                            every_answer_graded(slug, pytestconfig))
        return found[slug]

    return batch
