import pytest

from autograder.authoring import use_this_environment

# nbgrader (in-process and as a subprocess) runs `alembic` by name.
use_this_environment()


def pytest_collection_modifyitems(items):
    """Tests sharing a notebook's graded course run in the same worker (graded once)."""
    for item in items:
        slug = getattr(item, "callspec", None) and item.callspec.params.get("graded")
        if slug:
            item.add_marker(pytest.mark.xdist_group(slug))
