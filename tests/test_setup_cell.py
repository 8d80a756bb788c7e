"""The first cell of every notebook, in JupyterLab and in (simulated) Colab."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib

from autograder import authoring

# Runs a cell in a real IPython shell. In "colab" mode a `google.colab` module is present
# (Colab imports it at start-up) and pip only records its arguments ("colab-offline": pip
# fails as it does without a network).
RUNNER = textwrap.dedent('''
    import json, subprocess, sys, types
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    calls = []
    run = subprocess.run
    def fake_run(args, **kwargs):
        if args[:3] != [sys.executable, "-m", "pip"]:
            return run(args, **kwargs)
        calls.append(args[3:])
        if sys.argv[1] == "colab-offline":
            return subprocess.CompletedProcess(args, 1, "", "ERROR: Could not find a version that satisfies the "
                                               "requirement (network is unreachable)")
        return subprocess.CompletedProcess(args, 0, "", "")
    subprocess.run = fake_run
    if sys.argv[1].startswith("colab"):
        sys.modules["google"] = types.ModuleType("google")
        sys.modules["google.colab"] = types.ModuleType("google.colab")
    result = shell.run_cell(sys.stdin.read())
    error = result.error_in_exec
    print(json.dumps({"ok": result.success, "pip": calls,
                      "error": f"{type(error).__name__}: {error}" if error else None}))
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
    assert result == {"ok": True, "pip": [], "error": None}
    assert "checks run on cpu" in printed


def test_in_colab_the_setup_cell_installs_the_student_package_and_keeps_torch():
    result, printed = _run_setup_cell("colab")
    assert result["ok"], (result, printed)
    (args,) = result["pip"]
    # The student package from the public repository (never the instructor's, which holds
    # solutions/); torch is not asked for, so pip keeps Colab's own.
    assert args == ["install", "--quiet", f"autograd-course-student @ git+{authoring.student_repository()}"]
    instructors = tomllib.loads((authoring.ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    assert authoring.student_repository() != instructors
    assert "checks run on cpu" in printed
    # pip runs in a subprocess: IPython's %pip would say "you may need to restart the kernel",
    # which is not needed (the package was never imported before).
    assert "%pip" not in authoring.setup_source() and "restart" not in printed


def test_in_colab_a_failed_install_says_why_and_stops_there():
    result, printed = _run_setup_cell("colab-offline")
    assert not result["ok"]
    assert result["error"].startswith("RuntimeError: Could not install the course's checks")
    assert "network is unreachable" in result["error"] and "online" in result["error"]
    assert "ModuleNotFoundError" not in (result["error"] + printed)
