from __future__ import annotations

import pytest
import torch

from autograder.authoring import use_this_environment

# nbgrader (in-process and as a subprocess) runs `alembic` by name.
use_this_environment()
# As every notebook's setup cell does: checks run many tiny operations, and a thread pool
# on a busy 2-core machine made them 10-40x slower (the other test worker takes a core).
torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption("--stock-all", action="store_true",
                     help="compare with stock nbgrader on every known answer, not on a sample (`make compare-stock`)")
    parser.addoption("--verdicts-all", action="store_true",
                     help="test_verdicts.py on every known answer, not the first of each kind per exercise "
                          "(`make verdicts`)")
    parser.addoption("--fuzz", type=int, default=24,
                     help="mutated notebooks graded by test_fuzz.py (`make fuzz`: 1000)")
    parser.addoption("--fuzz-seed", type=int, default=20261127, help="the seed test_fuzz.py generates them from")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(items):
    """Tests sharing a notebook's graded course run in the same worker (graded once)."""
    for item in items:
        slug = getattr(item, "callspec", None) and item.callspec.params.get("graded")
        if slug:
            item.add_marker(pytest.mark.xdist_group(slug))


@pytest.fixture(scope="session")
def class_batches(tmp_path_factory):
    """slug -> its class batch (the model solution, every known answer, the released
    notebook), graded once per test worker by `autograder grade --feedback`."""
    from grading import ClassBatch

    found: dict[str, ClassBatch] = {}

    def batch(slug: str) -> ClassBatch:
        if slug not in found:
            found[slug] = ClassBatch.graded(slug, tmp_path_factory.mktemp(f"batch-{slug}"))
        return found[slug]

    return batch
