"""A simulated Colab: a fresh virtualenv that has only torch (as Colab has it preinstalled)
and a fake `google.colab` module runs a released notebook: the setup cell installs the
student package (built locally by `make publish`'s code, in place of the public
repository), the checks run — one passes, one fails with its message — and hand_in()
writes and "downloads" the submission."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from autograder import authoring, publish
from engine_course import solutions

pytestmark = pytest.mark.slow
SLUG = "03_function_basics"
# Only torch and what torch needs (this environment's own, linked: no second install of
# torch), shared read-only by each test's fresh virtualenv through a .pth file, as Colab's
# preinstalled packages are.
BASE = authoring.ROOT / ".venv" / "colab-torch"
WRONG_BIAS = ("grad_bias = grad_output.sum(0)", "grad_bias = grad_output.mean(0)")

# Colab's kernel imports google.colab at start; ours is a stand-in with the two calls
# hand_in() makes. Cells run in one namespace, in order, until one raises.
RUNNER = textwrap.dedent('''
    import json, sys, types, traceback
    nb = json.load(open(sys.argv[1]))
    nb["metadata"]["colab"] = {"name": "03_function_basics.ipynb"}  # Colab names the notebook there
    google = types.ModuleType("google"); colab = types.ModuleType("google.colab")
    downloads = []
    colab._message = types.SimpleNamespace(blocking_request=lambda kind, timeout_sec: {"ipynb": nb})
    colab.files = types.SimpleNamespace(download=downloads.append)
    google.colab = colab
    sys.modules["google"], sys.modules["google.colab"] = google, colab
    namespace = {"__name__": "__main__"}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        print("=== cell", cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", ""), flush=True)
        try:
            exec(compile(source, "<cell>", "exec"), namespace)
        except Exception as error:
            print(f"{type(error).__name__}: {error}", flush=True)
            break
    exec("from autograder.student.handin import hand_in\\nhand_in('colab_student')", namespace)
    print("DOWNLOADS", json.dumps(downloads))
''')


def _base() -> Path:
    if not (BASE / ".linked").exists():  # (an older BASE, a venv with torch installed, is replaced)
        shutil.rmtree(BASE, ignore_errors=True)
        BASE.mkdir()
        for dist in _needed("torch"):
            for top in {Path(f).parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
                if not (BASE / top).exists():  # its packages, modules and metadata
                    (BASE / top).symlink_to(dist.locate_file(top))
        (BASE / ".linked").touch()
    return BASE


def _needed(name: str) -> list[metadata.Distribution]:
    """The distribution `name` and those it requires (no extras), transitively."""
    found: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        dist = metadata.distribution(todo.pop())
        key = canonicalize_name(dist.metadata["Name"])
        if key in found:
            continue
        found[key] = dist
        for line in dist.requires or ():
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(found.values())


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    site = next((path / "lib").glob("python3*/site-packages"))
    (site / "colab_preinstalled.pth").write_text(str(_base()) + "\n")
    return path / "bin" / "python"


def test_a_fresh_torch_only_colab_installs_the_student_package_runs_checks_and_hands_in(tmp_path):
    wheels = tmp_path / "wheels"
    built = publish.build(tmp_path / "public")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w",
                    str(wheels), str(built)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("autograd_course_student-*.whl")
    python = _venv(tmp_path / "colab")
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                            check=True)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "torch" in names and not names & {"torchviz", "graphviz", "autograd-course-student", "ipython", "numpy"}

    nb = nbformat.read(authoring.ROOT / "course" / SLUG / f"{SLUG}.ipynb", as_version=4)
    model = solutions(SLUG)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id == "setup":  # the public repository, here a local build of it
            remote = f"git+{authoring.student_repository()}"
            assert remote in cell.source
            cell.source = cell.source.replace(remote, wheel.as_uri())
        elif grade_id == "clipped_relu":
            cell.source = model["clipped_relu"]
        elif grade_id == "linear":
            cell.source = model["linear"].replace(*WRONG_BIAS)
    notebook = tmp_path / "work" / f"{SLUG}.ipynb"
    notebook.parent.mkdir()
    nbformat.write(nb, notebook)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    done = subprocess.run([str(python), "-c", RUNNER, str(notebook)], cwd=notebook.parent, env=env,
                          capture_output=True, text=True, timeout=900)
    printed = done.stdout
    assert done.returncode == 0, printed + done.stderr
    assert "torch 2.13.0" in printed and "checks run on cpu" in printed  # the setup cell, after the install
    assert "✔ ClippedReLU" in printed
    assert "CheckFailed: Linear: wrong gradient for `bias`" in printed and "Likely cause" in printed
    assert "restart" not in printed + done.stderr and "ModuleNotFoundError" not in printed
    assert "Failed to initialize NumPy" not in printed + done.stderr  # numpy comes with the student package
    # Only the student side was installed: no grader, and no `autograder` command.
    site = next((tmp_path / "colab" / "lib").glob("python3*/site-packages"))
    assert (site / "autograder" / "student" / "handin.py").is_file()
    assert not (site / "autograder" / "grader").exists() and not (tmp_path / "colab" / "bin" / "autograder").exists()
    assert (site / "torchviz").is_dir() and (site / "graphviz").is_dir()  # what notebook 07 draws with
    downloads = json.loads(printed.split("DOWNLOADS ", 1)[1])
    assert downloads == [str(notebook.parent / f"colab_student__{SLUG}.zip")]
    names = zipfile.ZipFile(downloads[0]).namelist()
    assert f"colab_student/{SLUG}/{SLUG}.ipynb" in names
