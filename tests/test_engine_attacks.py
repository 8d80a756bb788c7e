"""Student code against the sandbox: every limit holds, nothing leaks, nobody else is touched.

One course (notebook 03). Honest students are graded first; then attackers, each with
the model solution plus an attack in its first answer cell, and last a victim who looks
for what they left behind, all on one worker (--jobs 1) so they run one after another in
the same warm worker. After each attack, the gradebook must be unchanged for everyone
else.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from engine_course import flagged, grade, notebook, rows, solutions, submit_notebook, survivors, watched, with_answers
from grading import Course

pytestmark = pytest.mark.slow
SLUG = "03_function_basics"
FIRST = "clipped_relu"  # the answer cell that carries each attack
TIMEOUT = 15

ATTACKS = {
    "memory_bomb": """
        hoard = []
        try:
            while True:
                hoard.append(bytearray(256 << 20))
        except MemoryError:
            print("stopped at", len(hoard) * 256, "MiB")
        del hoard
    """,
    "fork_bomb": """
        import os, time
        children = []
        try:
            while True:
                pid = os.fork()
                if pid == 0:
                    time.sleep(600)
                    os._exit(0)
                children.append(pid)
        except OSError as error:
            print("forks:", len(children), type(error).__name__)
    """,
    "sigint_ignoring_loop": """
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            pass
    """,
    "huge_output": """
        import os
        print("x" * (64 << 20))
        os.write(1, b"y" * (96 << 20))
    """,
    "network": """
        import socket
        for kind, address in (("tcp", ("127.0.0.1", {tcp})), ("udp", ("127.0.0.1", {udp}))):
            try:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
                s.settimeout(2)
                s.connect(address) if kind == "tcp" else s.sendto(b"leak", address)
                print(kind, "sent")
            except OSError as error:
                print(kind, "blocked:", type(error).__name__)
    """,
    "read_secrets": """
        for path in ["{root}/gradebook.db", "{root}/solutions/{slug}/{slug}.ipynb",
                     "{root}/submitted/honest/{slug}/{slug}.ipynb", "{root}/autograded/honest/{slug}/{slug}.ipynb",
                     "/etc/shadow", "/proc/1/environ"]:
            try:
                with open(path, "rb") as f:
                    print("READ", path, len(f.read()))
            except OSError as error:
                print("denied", path, type(error).__name__)
    """,
    "write_outside": """
        import os
        for path in ["{root}/PWNED", "{root}/solutions/PWNED", "{root}/gradebook.db", "{marker}",
                     "/tmp/PWNED", "/var/worker/PWNED", os.path.expanduser("~/../PWNED")]:
            try:
                with open(path, "a") as f:
                    f.write("pwned")
                print("WROTE", path)
            except OSError as error:
                print("denied", path, type(error).__name__)
        with open("planted.txt", "w") as f:  # in its own scratch directory: allowed, and wiped after
            f.write("for the next student")
    """,
    "kill_the_grader": """
        import os, signal
        for pid in (1, os.getppid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError as error:
                print("kill", pid, "denied:", type(error).__name__)
    """,
    "exits": """
        import os
        os._exit(0)
    """,
}
BACKWARD_LOOP = "backward_loop"  # an answer whose backward never returns


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    course = Course(tmp_path_factory.mktemp("attacks"), [SLUG])
    model = solutions(SLUG)
    course.submit("honest", SLUG, model)
    course.submit("honest_wrong", SLUG, {**model, FIRST: "raise NotImplementedError"})
    assert grade(course, SLUG).returncode == 0
    before = rows(course)

    tcp = socket.create_server(("127.0.0.1", 0))
    tcp.settimeout(0.1)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.1)
    marker = tmp_path_factory.mktemp("outside") / "PWNED"
    fill = {"root": course.root, "slug": SLUG, "marker": marker, "tcp": tcp.getsockname()[1],
            "udp": udp.getsockname()[1]}
    attackers = []
    for name, code in ATTACKS.items():
        attack = model[FIRST] + "\n\n" + textwrap.dedent(code).format(**fill)
        submit_notebook(course, f"a_{name}", SLUG, with_answers(course, SLUG, {**model, FIRST: attack}))
        attackers.append(f"a_{name}")
    looping = model[FIRST].replace("def backward(ctx, grad_output):",
                                   "def backward(ctx, grad_output):\n        while True:\n            pass", 1)
    assert looping != model[FIRST]
    submit_notebook(course, f"a_{BACKWARD_LOOP}", SLUG, with_answers(course, SLUG, {**model, FIRST: looping}))
    attackers.append(f"a_{BACKWARD_LOOP}")
    victim = model[FIRST] + ("\n\nimport os\nprint('scratch:', sorted(os.listdir('.')))\n"
                             "print('home:', sorted(os.listdir(os.path.expanduser('~'))))")
    submit_notebook(course, "z_victim", SLUG, with_answers(course, SLUG, {**model, FIRST: victim}))

    students = [arg for s in [*attackers, "z_victim"] for arg in ("--student", s)]
    result, processes = watched(course, SLUG, *students, "--jobs", "1", "--timeout", str(TIMEOUT), "--memory", "1024")
    output = result.stdout + result.stderr
    assert "NO SANDBOX" not in output and "ISOLATION IS REDUCED" not in output, \
        f"graded without the sandbox these tests are about:\n{output}"
    received = _received(tcp, udp)
    return course, before, result, received, marker, processes


def _received(tcp: socket.socket, udp: socket.socket) -> list[str]:
    got = []
    try:
        tcp.accept()
        got.append("tcp connection")
    except TimeoutError:
        pass
    try:
        got.append(f"udp {udp.recv(100)!r}")
    except TimeoutError:
        pass
    return got


def _outputs(course: Course, student: str) -> str:
    """All text outputs of the answer cell that carried the attack."""
    nb = notebook(course, "autograded", student, SLUG)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == FIRST)
    return "\n".join(o.get("text", "") + o.get("evalue", "") for o in cell.outputs)


def _scores(course: Course, student: str) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(course.db_url) as gb:
        return {g.name: g.score for g in gb.find_submission_notebook(SLUG, SLUG, student).grades}


def test_grading_completes_and_everyone_else_is_untouched(attacked):
    course, before, result, *_ = attacked
    assert result.returncode == 0, result.stderr
    after = rows(course, exclude={s for s in _students(course) if s.startswith(("a_", "z_"))})
    assert after == before


def _students(course: Course) -> list[str]:
    return [p.name for p in (course.root / "submitted").iterdir()]


def test_memory_bomb_gets_memory_error_and_the_rest_is_graded(attacked):
    course = attacked[0]
    assert "stopped at" in _outputs(course, "a_memory_bomb")
    scores = _scores(course, "a_memory_bomb")
    assert scores["check_linear"] == scores["check_linear_hidden"] == 2  # later exercises still graded


def test_fork_bomb_hits_the_process_limit(attacked):
    course = attacked[0]
    text = _outputs(course, "a_fork_bomb")
    forks = int(text.split("forks:")[1].split()[0])
    assert forks < 64 and "BlockingIOError" in text
    assert _scores(course, "a_fork_bomb")["check_linear"] == 2


@pytest.mark.parametrize("student", ["a_sigint_ignoring_loop", f"a_{BACKWARD_LOOP}"])
def test_endless_loops_are_killed_at_the_time_limit_and_flagged(attacked, student):
    course = attacked[0]
    text = notebook(course, "autograded", student, SLUG).cells[0].source
    assert "time limit" in text and "Flagged" in text
    is_flagged, needs_manual = flagged(course, SLUG, student)
    assert is_flagged and needs_manual and all(needs_manual)
    assert all(score == 0 for name, score in _scores(course, student).items() if "clipped" in name)


def test_huge_output_is_cut(attacked):
    course = attacked[0]
    path = course.root / "autograded" / "a_huge_output" / SLUG / f"{SLUG}.ipynb"
    assert path.stat().st_size < 10 << 20
    assert "output truncated" in _outputs(course, "a_huge_output")
    assert _scores(course, "a_huge_output")["check_clipped_relu"] == 2


def test_no_network(attacked):
    course, _, _, received, *_ = attacked
    text = _outputs(course, "a_network")
    assert "tcp blocked" in text  # a datagram may leave the socket, but it never reaches this machine:
    assert received == []


def test_course_files_cannot_be_read(attacked):
    course = attacked[0]
    text = _outputs(course, "a_read_secrets")
    assert "READ" not in text and text.count("denied") == 6


def test_nothing_is_written_outside_scratch(attacked):
    course, _, _, _, marker, _ = attacked
    text = _outputs(course, "a_write_outside")
    assert "WROTE" not in text and text.count("denied") == 7
    assert (not marker.exists() and not (course.root / "PWNED").exists()
            and not (course.root / "solutions" / "PWNED").exists())


def test_the_grader_cannot_be_killed_from_inside(attacked):
    text = _outputs(attacked[0], "a_kill_the_grader")
    assert text.count("denied") == 2


def test_exit_is_recorded_and_flagged(attacked):
    course = attacked[0]
    text = notebook(course, "autograded", "a_exits", SLUG).cells[0].source
    assert "exited with code 0" in text
    assert flagged(course, SLUG, "a_exits")[0]
    assert sum(_scores(course, "a_exits").values()) == 0


def test_next_student_finds_nothing_left_behind(attacked):
    course = attacked[0]
    text = _outputs(course, "z_victim")
    assert "planted" not in text and "scratch:" in text
    assert sum(_scores(course, "z_victim").values()) == sum(_scores(course, "honest").values()) > 0


def test_no_process_outlives_grading(attacked):
    """Every process the grading started — workers, sandboxes, notebooks and what they
    forked — is gone once it has ended."""
    assert attacked[-1], "no process of the grading was seen"
    assert not survivors(attacked[-1])


REASONS = {  # what the flag of each attacker says
    "memory_bomb": "of its memory limit",
    "fork_bomb": "controls processes or signals",
    "sigint_ignoring_loop": "time limit",
    "huge_output": "was cut",
    "network": "opens network connections",
    "read_secrets": "reads or writes files",
    "write_outside": "reads or writes files",
    "kill_the_grader": "controls processes or signals",
    "exits": "exited with code 0",
    BACKWARD_LOOP: "time limit",
}


@pytest.mark.parametrize("attack", list(REASONS))
def test_every_attacker_is_flagged_with_the_reason(attacked, attack):
    course = attacked[0]
    assert flagged(course, SLUG, f"a_{attack}")[0]
    assert REASONS[attack] in notebook(course, "autograded", f"a_{attack}", SLUG).cells[0].source


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="skipped: bubblewrap is not installed")
def test_python_installed_under_tmp_runs_in_the_sandbox(tmp_path):
    """A checkout under /tmp (as CI makes) must keep the sandbox: its scratch /tmp is an
    empty file system, and the Python inside it is bound on top, nothing else of /tmp."""
    from autograder.isolation import sandbox

    venv = Path(tempfile.mkdtemp(dir="/tmp")) / "venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        readable = sandbox.readable_paths(Path(tempfile.gettempdir()) / "course")
        readable = [p for p in readable if not venv.is_relative_to(p)] + [str(venv)]
        probe = "import json, os, sys; print(json.dumps([sys.prefix, os.listdir('/tmp'), os.stat('/tmp').st_mode]))"
        ran = subprocess.run([*sandbox.bubblewrap_arguments(shutil.which("bwrap"), readable), "--",
                              str(venv / "bin" / "python"), "-I", "-c", probe], capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
        prefix, listed, mode = json.loads(ran.stdout)
        under_tmp = {Path(p).relative_to("/tmp").parts[0] for p in readable if Path(p).is_relative_to("/tmp")}
        assert prefix == str(venv) and set(listed) == under_tmp and mode == 0o41777
    finally:
        shutil.rmtree(venv.parent)
