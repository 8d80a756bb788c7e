"""The conda environment, pyproject.toml and the pinned constraints agree, and the test
runner they pin groups a notebook's tests in one worker."""
import re
import subprocess
import sys
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from autograder.authoring import ROOT


def _pyproject() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {Requirement(r).name: str(Requirement(r).specifier) for r in reqs}


def _conda_pip() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    return {Requirement(r).name: str(Requirement(r).specifier) for r in pip if not r.startswith("-e")}


def _constraints() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = (line.split("==") for line in lines if "==" in line)
    return {canonicalize_name(name): version for name, version in pins}


def test_conda_environment_has_the_packages_and_versions_of_pyproject():
    pyproject, conda = _pyproject(), _conda_pip()
    assert set(conda) == set(pyproject)
    for name, spec in pyproject.items():
        if name == "torch":  # a range in pyproject (Colab's torch), the pinned version for conda
            assert Version(conda[name].removeprefix("==")) in Requirement(f"torch{spec}").specifier
        else:
            assert conda[name] == spec, name


def test_pins_match_the_locked_environment():
    locked = _constraints()
    for name, spec in {**_pyproject(), **_conda_pip()}.items():
        version = locked[canonicalize_name(name)]
        if spec.startswith("=="):
            assert version == spec.removeprefix("=="), name
        assert Version(version) in Requirement(f"{name}{spec}").specifier, name


@pytest.mark.slow
def test_the_tests_of_one_graded_notebook_share_a_worker():
    """--dist loadgroup sends the tests of one notebook's class batch to one worker, which
    grades it once (pytest 9.2 with pytest-xdist 3.8 drops the groups silently, and so did a
    conftest hook that ran after xdist's: every batch was graded in both workers, minutes of
    `make test`); so do the tests of one module-scoped fixture (a graded course: before
    tests/scheduling.py, test_red_team.py's was graded by each worker that ran one of its tests)."""
    planned = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "1", "-v", "--setup-plan",
         "tests/test_grading.py", "tests/test_engine_scores.py", "tests/test_red_team.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert planned.returncode == 0, planned.stdout[-2000:]
    ids = [line.strip() for line in planned.stdout.splitlines() if re.match(r"tests/\S+::", line)]
    graded = [i for i in ids if "[" in i and "three_wrong" not in i and "red_team" not in i]
    assert len(graded) > 50
    # test[SLUG]@SLUG, or test[SLUG-exercise-label]@SLUG (a known answer of that batch)
    ungrouped = [i for i in graded if not re.search(r"\[(\d\d_[a-z_]+)\b.*\]@\1(\s|$)", i)]
    assert not ungrouped, ungrouped[:3]
    red_team = {re.sub(r"^\S+@(\S+).*", r"\1", i) for i in ids if i.startswith("tests/test_red_team.py::")}
    assert red_team == {"test_red_team.py::graded"}, red_team
