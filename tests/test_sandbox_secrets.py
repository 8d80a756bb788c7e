"""Nothing secret is visible where student code runs while grading.

A submission searches every file it can see from inside the sandbox (bubblewrap,
Landlock, its own user), binary files included, for the distinctive lines of every
hidden test (quiz keys among them), every model solution, and the checks' own code
(references, judges). It finds none — but a line of the student package, added to the
lines it looks for, so the search is seen to work.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autograder import authoring
from autograder.isolation import sandbox
from engine_course import grade, notebook, solutions, submit_notebook, with_answers
from grading import Course
from instructor_material import SHORTEST, instructor_lines, released_text

pytestmark = pytest.mark.slow
SLUG = "03_function_basics"
PACKAGE = Path(sandbox.__file__).resolve().parents[1]


def _distinctive() -> set[str]:
    """Lines only the instructor's material has: hidden tests and solutions (not in the
    released notebooks), and the code of the checks (not in the student side)."""
    released = released_text()
    found = set(instructor_lines())
    visible = "\n".join(p.read_text() for name in sandbox.VISIBLE for p in (PACKAGE / name).rglob("*.py")
                        if (PACKAGE / name).is_dir()) + (PACKAGE / "__init__.py").read_text()
    for path in sandbox.hidden_paths():
        for module in [Path(path)] if path.endswith(".py") else Path(path).rglob("*.py"):
            found.update(line.strip() for line in module.read_text().splitlines()
                         if not line.strip().startswith(("#", "from ", "import ")))
    return {line for line in found if len(line) >= SHORTEST and line not in released and line not in visible}


# Searches the files under `roots` (minus `pruned`) for the lines in patterns.txt, binary
# files too where they are small (.pyc, databases); prints the files that have any, and how
# many files it saw, counting those under `public` (what this machine has anyway: searched
# here for what is public, so a line found there is no pattern). Run inside the sandbox by a
# submission, and here, over what this machine has anyway.
SEARCH = """
import os, subprocess

def find(roots, pruned):
    found = set()
    for root in roots:
        command = ["find", root, "("]
        for path in pruned:
            command += ["-path", path, "-o"]
        listed = subprocess.run([*command[:-1], ")", "-prune", "-o", "-type", "f", "-print0"], capture_output=True)
        found.update(p for p in listed.stdout.split(bytes(1)) if p)
    return found

files = find([r for r in roots if not any(r == p or r.startswith(p + "/") for p in public)], [*pruned, *public])
sizes = {}
for path in files:
    try:
        sizes[path] = os.path.getsize(path)
    except OSError:
        pass
for option, chosen in (("-a", [p for p, n in sizes.items() if n < 4 << 20]),
                       ("-I", [p for p, n in sizes.items() if n >= 4 << 20])):
    with open("files.txt", "wb") as listed:
        listed.write(bytes(1).join(sorted(chosen)))
    done = subprocess.run(["bash", "-c", "xargs -0 -r grep -lF " + option + " -f patterns.txt < files.txt"],
                          capture_output=True, text=True)
    for path in done.stdout.splitlines():
        print("LEAK", path)
print("SEEN", len(files | find([p for p in public if os.path.exists(p)], pruned)))
"""
# Debian's own files: nothing of a course is ever there (Python's own directories, even
# under /usr, are searched from sys.path).
SYSTEM = ["/usr/bin", "/usr/sbin", "/usr/lib", "/usr/libexec", "/usr/share", "/usr/include", "/usr/src"]
# What the submission adds: the patterns, and every place it can think of to look.
SUBMISSION = """
SYSTEM, public = {system!r}, {public!r}
import os, sys
import autograder
with open("patterns.txt", "w") as f:
    f.write({patterns!r})
# Landlock lets a process read only what it allows: `find /` sees nothing beneath a
# directory it may not list (this package's own, whose parts it may read), so start also
# from every place this process knows of: the folder of every module it has.
package = os.path.dirname(autograder.__file__)
modules = [os.path.dirname(f) for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)]
roots = sorted({{os.path.realpath(p) for p in ["/", "/usr", "/etc", "/tmp", "/var", "/opt", "/home", "/root", "/work",
                sys.prefix, sys.base_prefix, *sys.path, package, os.path.dirname(package), *modules]
                if p and os.path.exists(p)}})
pruned = ["/proc", "/sys", "/dev", os.getcwd(), *SYSTEM]
exec({search!r})
"""


def _public_roots() -> list[str]:
    """Where this machine's own files are, outside the course and this package (torch's
    code, the system's): nothing of the repository but its virtual environment (pytest puts
    tests/ and the root on sys.path: the known answers there hold solutions' and keys' lines)."""
    repository, environment = authoring.ROOT.resolve(), Path(sys.prefix).resolve()

    def public(path: Path) -> bool:
        return path.is_dir() and (not path.is_relative_to(repository) or path.is_relative_to(environment))

    return sorted({str(Path(r).resolve()) for r in ["/etc", "/usr/local", sys.prefix, sys.base_prefix, *sys.path]
                   if r and public(Path(r).resolve())})


def _public(patterns: set[str], tmp_path: Path) -> set[str]:
    """Those of `patterns` that this machine has anyway, under _public_roots(), searched as
    the submission searches, Debian's own files left out as it leaves them out. The
    submission searches there no more (bubblewrap shows it the same files): it counts them."""
    (tmp_path / "patterns.txt").write_text("\n".join(sorted(patterns)))
    pruned = [str(PACKAGE), str(authoring.ROOT / "solutions"), str(tmp_path), *SYSTEM]
    done = subprocess.run([sys.executable, "-c", f"roots, pruned, public = {_public_roots()!r}, {pruned!r}, []\n"
                           + SEARCH], capture_output=True, text=True, cwd=tmp_path)
    leaked = [line.removeprefix("LEAK ") for line in done.stdout.splitlines() if line.startswith("LEAK ")]
    # No pattern spans lines, so the lines grep prints hold every one these files have
    # (looking for each of thousands of patterns in the whole files took minutes).
    lines = subprocess.run(["xargs", "-0", "-r", "grep", "-hF", "-a", "-f", "patterns.txt"],
                           input="\0".join(leaked).encode(),
                           capture_output=True, cwd=tmp_path).stdout.decode("utf-8", "replace")
    return {p for p in patterns if p in lines}


def test_no_hidden_test_solution_key_or_reference_is_visible_in_the_sandbox(tmp_path):
    patterns = _distinctive()
    patterns -= _public(patterns, tmp_path)
    assert len(patterns) > 200  # every notebook's hidden tests and solutions, and the checks
    planted = PACKAGE / "student" / "report.py"  # visible by design: the search must find it
    canary = max(planted.read_text().splitlines(), key=len).strip()
    (tmp_path / "course").mkdir()
    course = Course(tmp_path / "course", [SLUG])
    model = solutions(SLUG)
    search = SUBMISSION.format(patterns="\n".join(sorted(patterns | {canary})), search=SEARCH, system=SYSTEM,
                               public=_public_roots())
    submit_notebook(course, "searcher", SLUG,
                    with_answers(course, SLUG, {**model, "clipped_relu": model["clipped_relu"] + "\n" + search}))
    result = grade(course, SLUG, "--timeout", "300")
    assert result.returncode == 0, result.stderr
    printed = "".join(o.get("text", "") for cell in notebook(course, "autograded", "searcher", SLUG).cells
                      if cell.metadata.get("nbgrader", {}).get("grade_id") == "clipped_relu" for o in cell.outputs)
    leaks = [line.removeprefix("LEAK ") for line in printed.splitlines() if line.startswith("LEAK ")]
    found = {Path(leak).resolve() for leak in leaks}  # the planted file, and its compiled copy if there is one
    assert planted.resolve() in found and all(f.name.startswith("report.") and f.parent.resolve() in
                                              (planted.parent.resolve(), (planted.parent / "__pycache__").resolve())
                                              for f in found), printed
    seen = int(printed.split("SEEN ")[1].split()[0])
    assert seen > 10_000, printed  # the search did look at the system and the Python installation
