"""`autograder` as an instructor meets it: help that reads right, and one clear line, with the
exit code it documents, for every wrong invocation and unready course — at once, before torch,
nbgrader or any worker loads."""
from __future__ import annotations

import os
import resource
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import autograder
from autograder import authoring, cli

AUTOGRADER = str(Path(sys.executable).with_name("autograder"))
# A refusal comes at once: before torch, nbgrader or a worker loads. Counted in the command's
# CPU seconds (imports included), which a busy shared machine does not stretch as it does wall time.
QUICK = 2.0


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([AUTOGRADER, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def refused(cwd: Path, *args: str, code: int = 2, command: str = "grade") -> str:
    """The one line `autograder COMMAND ARGS` prints, after checking it came at once, with `code`
    and without a traceback; nothing of the course changed."""
    before = sorted(p.relative_to(cwd) for p in cwd.rglob("*"))
    started = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run(command, *args, cwd=cwd)
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert ended.ru_utime + ended.ru_stime - started.ru_utime - started.ru_stime < QUICK
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    after = sorted(p.relative_to(cwd) for p in cwd.rglob("*") if ".autograder" not in p.parts)
    assert after == before
    return lines[0]


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """A course with two released assignments and two students' submissions (never graded here)."""
    from grading import Course

    root = tmp_path_factory.mktemp("course")
    course = Course(root, ["03_function_basics", "05_gradcheck"])
    for student in ("alice", "bob"):
        course.submit(student, "03_function_basics", None)
    return root


def test_help_explains_every_option_and_the_exit_codes():
    result = run("grade", "--help")
    assert result.returncode == 0
    for words in ("--student", "--force", "--jobs", "--timeout", "--memory", "--no-sandbox", "--db", "--course",
                  "--feedback", "submitted/STUDENT/ASSIGNMENT", "generate_feedback", "flagged", "Exit codes"):
        assert words in result.stdout, words
    assert "release" in run("--help").stdout and "grade" in run("--help").stdout


def test_help_lists_every_command_whole_shows_no_type_after_a_flag_and_a_version():
    shown = subprocess.run([AUTOGRADER, "--help"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "COLUMNS": "80"})
    commands = shown.stdout.split("Commands:")[1].splitlines()[1:]
    listed = [line for line in commands if line.startswith("  ") and not line.startswith("   ")]
    assert len(listed) == len(cli.app.registered_commands) and not [line for line in commands
                                                                    if line.endswith("...")], commands
    assert any(line.split()[:3] == ["exercise", "Show", "one"] for line in commands), commands
    grade = run("grade", "--help").stdout
    assert "<bool>" not in grade and "  --force  " in grade, grade
    assert run("--version").stdout == f"autograder {autograder.__version__}\n"


NEVER_RICH = """
import atexit, sys
atexit.register(lambda: print("rich_utils loaded:", "typer.rich_utils" in sys.modules))
from autograder import cli, registry
for args in (["--help"], ["grade", "--help"], ["grade", "--bogus"]):
    try:
        cli.app(args)
    except SystemExit:
        pass
registry.named = lambda grade_id: 1 / 0  # a failure nobody foresaw, inside a command
cli.app(["exercise", "conv2d"])
"""


def test_help_errors_and_tracebacks_never_load_typers_rich_formatting():
    """typer imports its rich_utils when it formats help, a usage error or a traceback with
    rich; a publish that had deleted .venv under the running command ended in `ImportError:
    cannot import name 'rich_utils' from 'typer'`. Plain help, errors and tracebacks need no
    import at that moment."""
    shown = subprocess.run([sys.executable, "-c", NEVER_RICH], capture_output=True, text=True, timeout=120)
    assert "rich_utils loaded: False" in shown.stdout, shown.stdout
    assert "No such option: --bogus" in shown.stderr and "ZeroDivisionError" in shown.stderr, shown.stderr


def test_a_flag_given_a_value_is_named(released):
    """`grade --force true` is the flag, then an assignment named "true"."""
    line = refused(released, "--force", "true")
    assert "'true' is not an assignment" in line and "take no value" in line, line


def test_replay_names_a_wrong_cell_at_once_with_the_valid_ones(released):
    line = refused(released, "03_function_basics", "alice", "check_lineaar", command="replay")
    assert "no test cell 'check_lineaar' (did you mean check_linear?)" in line, line
    assert "check_clipped_relu, check_clipped_relu_hidden, check_linear," in line, line
    assert "no submissions from 'carol'" in refused(released, "03_function_basics", "carol", "check_linear",
                                                    command="replay")


def test_an_unknown_exercise_is_named_at_once_with_the_known_ones(tmp_path):
    assert "(did you mean linear, linear_relu" in refused(tmp_path, "linea", command="exercise")
    line = refused(tmp_path, "nosuch", command="exercise")
    assert "no exercise 'nosuch'; the exercises: basic_ops, more_ops," in line and "conv2d" in line, line


def test_scheduler_without_dask_names_the_extra_that_has_it(released, monkeypatch):
    import importlib.util

    from autograder.grader import preflight
    from autograder.grader.records import Options

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "distributed" else
                        found(name, *a))
    with pytest.raises(preflight.GradingError, match=r"'\.\[lab,grading\]'"):
        preflight.check(Options(root=released), scheduler="tcp://localhost:8786")


def test_rotating_the_secret_keeps_the_one_it_replaces(tmp_path):
    from autograder.grader import secret

    (tmp_path / "nbgrader_config.py").write_text("")
    first, _ = secret.load(tmp_path)
    said = run("secret", "--rotate", "--course", str(tmp_path))
    assert said.returncode == 0 and "the secret it replaced is kept as" in said.stdout, said.stdout + said.stderr
    (kept,) = secret.path(tmp_path).parent.glob("secret.replaced-*")
    assert bytes.fromhex(kept.read_text()) == first != secret.load(tmp_path)[0]


def test_release_refuses_to_delete_a_file_put_in_course_by_hand(tmp_path):
    """nbgrader replaces course/SLUG/ whole: a file there that solutions/ lacks would be lost."""
    for folder in ("solutions", "course"):
        (tmp_path / folder / "01_x").mkdir(parents=True)
        (tmp_path / folder / "01_x" / "01_x.ipynb").write_text("{}")
    (tmp_path / "course" / "01_x" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "course" / "01_x" / ".ipynb_checkpoints" / "01_x-checkpoint.ipynb").write_text("{}")
    assert authoring.hand_made(["01_x"], tmp_path) == []
    (tmp_path / "course" / "01_x" / "data.csv").write_text("1,2")
    assert authoring.hand_made(["01_x"], tmp_path) == ["course/01_x/data.csv"]


def test_a_folder_that_is_not_a_course(tmp_path):
    assert "is not an nbgrader course root" in refused(tmp_path)


def test_a_course_without_submissions(tmp_path):
    shutil.copy(authoring.ROOT / "nbgrader_config.py", tmp_path)
    line = refused(tmp_path)
    assert "no submissions yet" in line and "zip_collect" in line


def test_a_fresh_course_says_what_to_run_first_and_makes_no_gradebook(tmp_path):
    shutil.copy(authoring.ROOT / "nbgrader_config.py", tmp_path)
    (tmp_path / "submitted" / "alice" / "ps1").mkdir(parents=True)
    line = refused(tmp_path)
    assert "no gradebook yet" in line and "autograder release" in line
    assert not (tmp_path / "gradebook.db").exists()


@pytest.mark.parametrize("option, value", [("--timeout", "-1"), ("--timeout", "0"), ("--memory", "0"), ("--jobs", "0"),
                                           ("--jobs", "-3")])
def test_limits_must_be_positive(released, option, value):
    assert f"{option} must be positive" in refused(released, option, value, "--force", "-s", "alice")


def test_an_unknown_assignment_is_named_with_the_known_ones(released):
    line = refused(released, "03_function_basic")
    assert "no assignment '03_function_basic'" in line and "03_function_basics, 05_gradcheck" in line


def test_an_unknown_student_is_named_with_those_who_handed_in(released):
    line = refused(released, "-s", "carol")
    assert "no submissions from 'carol'" in line and "alice, bob" in line


def test_a_database_without_its_driver(released):
    line = refused(released, "--db", "mysql://grader@localhost/course")
    assert "driver 'MySQLdb'" in line and "not installed" in line


def test_a_database_url_that_is_none(released):
    assert "not a database URL" in refused(released, "--db", "not a url")


def test_a_locked_gradebook_is_one_line_and_loses_nothing(released):
    """formgrader (or anything else) holding the gradebook: the run stops with one line,
    exit code 4, and the gradebook is as it was."""
    db = sqlite3.connect(released / "gradebook.db", timeout=0)
    db.execute("BEGIN EXCLUSIVE")
    try:
        result = run("grade", "-s", "alice", "--timeout", "30", cwd=released)
    finally:
        db.rollback()
        db.close()
    assert result.returncode == 4, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "gradebook could not be used" in errors[0] and "Traceback" not in result.stderr
    assert not (released / "autograded").exists()


def test_a_read_only_course_folder(released, tmp_path):
    """As root, file modes stop nothing: the course is mounted read-only in a namespace of its own."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    course = tmp_path / "course"
    shutil.copytree(released, course)
    shutil.rmtree(course / ".autograder", ignore_errors=True)
    script = f"mount --bind -o ro {course} {course} && exec {AUTOGRADER} grade -s alice"
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=course,
                            capture_output=True, text=True, timeout=120)
    if "mount:" in result.stderr:
        pytest.skip(f"no read-only bind mount here: {result.stderr.strip()}")
    assert result.returncode == 4, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write in the course folder" in lines[0]


def test_the_estimate_left_is_bounded_by_the_time_limit():
    """A hanging notebook counts at most until its limit; queued ones at the median so far."""
    from autograder.grader.progress import Estimate

    estimate = Estimate(total=10, workers=2, limit=60.0)
    assert estimate.left([5.0]) is None  # nothing finished yet: no basis for an estimate
    for seconds in (1.0, 1.0, 3.0):
        estimate.finished(seconds)
    # 3 done (median 1 s), 5 queued, 2 running: one half-way, one slow (as long again), one
    # hanging 59 s of its 60 (1 s left at most), one past its limit (it ends now)
    assert estimate.left([0.5, 4.0]) == (5 * 1.0 + 0.5 + 4.0) / 2
    assert estimate.left([0.5, 59.0]) == (5 * 1.0 + 0.5 + 1.0) / 2
    assert estimate.left([0.5, 300.0]) == (5 * 1.0 + 0.5 + 0.0) / 2


FULL_DISK = """
set -e
mount -t tmpfs -o size=8m tmpfs {disk}
cp -a {course} {disk}/course
cd {disk}/course
dd if=/dev/zero of=filler bs=64k 2>/dev/null || true
truncate -s -100k filler
set +e
{autograder} grade 03_function_basics --timeout 60 --jobs 1 2>first.err >/dev/null
echo "first $?"
ls autograded > saved.txt 2>/dev/null
stat -c '%n %Y' autograded/*/*/*.ipynb > before.txt 2>/dev/null
rm filler
{autograder} grade 03_function_basics --timeout 60 --jobs 1 >/dev/null 2>&1
echo "rerun $?"
stat -c '%n %Y' autograded/*/*/*.ipynb > after.txt
cp first.err saved.txt before.txt after.txt {out}
"""


def test_a_full_disk_is_one_line_and_a_rerun_after_freeing_it_finishes_the_rest(released, tmp_path):
    """The course on a disk with ~100 KiB left (a tmpfs in a mount namespace of its own):
    the run stops at the save that does not fit with one line and exit code 4, what was
    saved before stays, and once space is freed a rerun grades only the rest."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    (tmp_path / "disk").mkdir()
    script = FULL_DISK.format(disk=tmp_path / "disk", course=released, autograder=AUTOGRADER, out=tmp_path)
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            capture_output=True, text=True, timeout=300)
    if "mount:" in result.stderr:
        pytest.skip(f"no tmpfs mount here: {result.stderr.strip()}")
    codes = dict(line.split() for line in result.stdout.splitlines())
    assert codes == {"first": "4", "rerun": "0"}, (result.stdout, result.stderr)
    printed = (tmp_path / "first.err").read_text()
    errors = [line for line in printed.splitlines() if line.startswith("error: ")]  # the rest is progress
    assert len(errors) == 1 and "No space left on device" in errors[0] and "Traceback" not in printed, printed
    before = (tmp_path / "before.txt").read_text().splitlines()
    after = (tmp_path / "after.txt").read_text().splitlines()
    assert len(after) == 2 and set(before) <= set(after)  # everyone graded, nobody saved before graded again
