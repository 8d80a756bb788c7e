"""The first cell of every notebook, in JupyterLab and in (simulated) Colab."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from autograder import authoring

# Runs a cell in a real IPython shell. In "colab" mode a `google.colab` module is present
# (Colab imports it at start-up) and `%pip` only records its arguments.
RUNNER = textwrap.dedent('''
    import json, sys, types
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    calls = []
    shell.register_magic_function(lambda line: calls.append(line), "line", "pip")
    if sys.argv[1] == "colab":
        sys.modules["google"] = types.ModuleType("google")
        sys.modules["google.colab"] = types.ModuleType("google.colab")
    result = shell.run_cell(sys.stdin.read())
    print(json.dumps({"ok": result.success, "pip": calls}))
''')


def _run_setup_cell(mode: str) -> tuple[dict, str]:
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, mode], input=authoring.setup_source(),
        capture_output=True, text=True, timeout=120, check=True,
    )
    *printed, last = done.stdout.strip().splitlines()
    return json.loads(last), "\n".join(printed)


def test_every_notebook_starts_with_the_shared_setup_cell():
    for slug in authoring.assignments():
        nb = json.loads(authoring.solution_path(slug).read_text())
        first_code = next(c for c in nb["cells"] if c["cell_type"] == "code")
        assert "".join(first_code["source"]) == authoring.setup_source(), slug


def test_in_jupyterlab_the_setup_cell_installs_nothing():
    result, printed = _run_setup_cell("lab")
    assert result == {"ok": True, "pip": []}
    assert "checks run on cpu" in printed


def test_in_colab_the_setup_cell_installs_the_course_from_the_repository_and_keeps_torch():
    result, printed = _run_setup_cell("colab")
    assert result["ok"], printed
    (line,) = result["pip"]
    args = line.split()
    assert args[0] == "install" and "--no-deps" in args  # --no-deps: Colab's own torch stays
    assert f'"autograd-course @ git+{authoring.repository_url()}"' in line
    assert not [a for a in args if a.strip('"').startswith("torch") and not a.startswith("torchviz")]
    assert "checks run on cpu" in printed


@pytest.mark.slow
def test_the_package_builds_from_the_repository(tmp_path):
    """What Colab's pip does with the git URL: build the package (without dependencies)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(authoring.ROOT)],
        check=True, capture_output=True, timeout=600,
    )
    (wheel,) = tmp_path.glob("autograd_course-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "autograder/checks/functions.py" in names and "autograder/exercises/tape_autograd.py" in names
