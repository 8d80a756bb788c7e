"""Stock `nbgrader autograde` against `autograder grade`, on the same submissions, in one run.

Builds a throwaway course with notebooks 01-03 (those that exist in solutions/) and at
least 60 submissions: model solutions, every known wrong and unusual right answer
(tests/answers), crashes (os._exit, an exception), and hangs (a loop that ignores SIGINT;
a loop inside a function the checks call, e.g. backward). Two identical copies are graded,
one by each tool, in two phases: the honest and crashing submissions, then the hanging
ones. The honest phase gets a generous time budget (nobody should reach it), the hanging
phase the budget under test. The engine grades each phase twice, just before and just after
stock, because a shared machine's speed drifts during stock's minutes: each engine run is
compared with the same stock run. Prints a markdown table and writes it to bench/results/.

    .venv/bin/python bench/stock_vs_engine.py [--submissions 60] [--timeout 10] [--jobs N]
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil

from publish import publish  # noqa: E402  (bench/ is the script's own folder)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from answers import for_notebook  # noqa: E402
from autograder import authoring  # noqa: E402
from engine_course import clone, solutions  # noqa: E402
from grading import Course  # noqa: E402
from nbgrader.api import Gradebook  # noqa: E402

BIN = Path(sys.executable).parent
HANGS = ("hang_sigint", "hang_in_function")


@dataclass
class Measured:
    wall: float = 0.0
    cpu: float = 0.0  # user + system of every process the command started
    peak_pss: float = 0.0  # MiB, whole process tree (shared pages counted once)
    peak_rss: float = 0.0  # MiB, whole process tree (shared pages counted per process)


@dataclass
class EngineRun:
    """One `autograder grade` run, with what the engine recorded per student (last-run.csv)."""

    measured: Measured
    code: dict[str, tuple[float, float, float]]  # student -> (seconds fork to exit, seconds in cells, CPU s in cells)
    graded_at: dict[str, float]  # student -> when the engine saved it


def _engine_run(command: list[str], root: Path) -> EngineRun:
    measured_run = measured(command, root)
    code, graded_at = {}, {}
    for status in (root / "reports").glob("*/last-run.csv"):
        with open(status) as f:
            for row in csv.DictReader(f):
                code[row["student"]] = (float(row["seconds"]), float(row["code_seconds"]), float(row["code_cpu"]))
                graded_at[row["student"]] = datetime.fromisoformat(row["graded_at"]).timestamp()
    return EngineRun(measured_run, code, graded_at)


def _loop_in_first_function(source: str) -> str | None:
    lines = source.splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)def \w+\(.*\)\s*(->.*)?:\s*$", line)
        if match:
            return "\n".join([*lines[: i + 1], match.group(1) + "    while True:", match.group(1) + "        pass", *lines[i + 1 :]])
    return None


def submissions(slug: str, count: int) -> dict[str, tuple[str, dict[str, str]]]:
    """{student: (kind, answers)} for one notebook: every known answer, crashes, hangs, model solutions."""
    model = solutions(slug)
    first = next(iter(model))
    answers = for_notebook(slug)
    found: dict[str, tuple[str, dict[str, str]]] = {}
    for k, a in enumerate(answers.MUTANTS):
        found[f"wrong{k:02d}"] = ("wrong", {**model, a.exercise: a.apply(model[a.exercise])})
    for k, a in enumerate(answers.VARIANTS):
        found[f"right{k:02d}"] = ("right", {**model, a.exercise: a.apply(model[a.exercise])})
    found["crash_exception"] = ("crash_exception", {**model, first: "raise RuntimeError('my code breaks')\n" + model[first]})
    found["crash_exit"] = ("crash_exit", {**model, first: model[first] + "\nimport os\nos._exit(1)"})
    found["hang_sigint"] = ("hang_sigint", {**model, first: "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"})
    looping = next(((ex, s) for ex, src in model.items() if "def backward(" in src
                    for s in [src.replace("def backward(ctx, grad_output):", "def backward(ctx, grad_output):\n        while True:\n            pass", 1)]
                    if s != src), None)
    if looping is None:
        looping = next((ex, s) for ex, src in model.items() if (s := _loop_in_first_function(src)))
    found["hang_in_function"] = ("hang_in_function", {**model, looping[0]: looping[1]})
    k = 0
    while len(found) < count:
        found[f"correct{k:02d}"] = ("correct", model)
        k += 1
    return {f"{slug[:2]}_{student}": entry for student, entry in found.items()}


def measured(command: list[str], cwd: Path) -> Measured:
    """Run a command; its wall time, CPU time and peak memory, whole process tree.

    CPU is the larger of two measurements: the kernel's account of waited-for descendants
    (exact for nbgrader and its kernels, but bubblewrap with a PID namespace does not pass
    its sandbox's CPU time up) and 10 Hz sampling of every process in the tree, where a
    warm worker's time includes the notebook children it has reaped.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    log = open(cwd / "bench.log", "a")
    process = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=log)
    peak = Measured()
    cpu: dict[int, float] = {}
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(process.pid)
        ticks = 0
        while not done.wait(0.1):
            ticks += 1
            memory = ticks % 10 == 0  # reading smaps (PSS) of big processes is not free: 1 Hz
            pss = rss = 0
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            workers = {p.pid for p in tree if _is_worker(p)}
            for p in tree:
                try:
                    if memory:
                        info = p.memory_full_info()
                        pss, rss = pss + info.pss, rss + info.rss
                    times = p.cpu_times()
                    if p.ppid() in workers:
                        continue  # a notebook's child: counted in its worker once reaped
                    own = times.user + times.system
                    if p.pid in workers:
                        own += times.children_user + times.children_system
                    cpu[p.pid] = max(cpu.get(p.pid, 0.0), own)
                except psutil.Error:
                    pass
            if memory:
                peak.peak_pss, peak.peak_rss = max(peak.peak_pss, pss / 2**20), max(peak.peak_rss, rss / 2**20)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    process.wait()
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak.wall = time.monotonic() - started
    accounted = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peak.cpu = max(accounted, sum(cpu.values()))
    log.close()
    return peak


def _is_worker(p: psutil.Process) -> bool:
    try:
        command = p.cmdline()
    except psutil.Error:
        return False
    return bool(command) and "autograder.engine.zygote" in command and not command[0].endswith("bwrap")


def _stock_seconds_per_notebook(log: Path, students: set[str]) -> float:
    """From nbgrader's log: the time between consecutive notebooks' starts, per invocation."""
    starts: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        found = re.match(r"^(\d+\.\d+) Autograding .*/autograded/([^/]+)/([^/]+)/", line)
        if found and found.group(2) in students:
            starts.setdefault(found.group(3), []).append(float(found.group(1)))
    spans = [(max(t) - min(t), len(t) - 1) for t in starts.values() if len(t) > 1]
    return sum(span for span, _ in spans) / sum(n for _, n in spans)


def scores(course: Course) -> dict[tuple[str, str], float | None]:
    with Gradebook(course.db_url) as gb:
        return {(sub.student.id, g.name): g.auto_score
                for a in gb.assignments for sub in a.submissions for nb in sub.notebooks for g in nb.grades}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=60, help="at least this many submissions in all")
    parser.add_argument("--timeout", type=int, default=10,
                        help="time budget of the hanging phase: per cell for nbgrader, per notebook for the engine")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--keep", action="store_true", help="keep the generated courses (and their logs)")
    args = parser.parse_args()

    slugs = [s for s in authoring.assignments() if s[:2] in ("01", "02", "03")]
    work = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    print(f"building {args.submissions}+ submissions of {', '.join(slugs)} in {work}", file=sys.stderr)
    (work / "course").mkdir()
    course = Course(work / "course", slugs)
    kinds = {}
    for slug in slugs:
        for student, (kind, answers) in submissions(slug, math.ceil(args.submissions / len(slugs))).items():
            course.submit(student, slug, answers)
            kinds[student] = kind
    honest = [s for s, k in kinds.items() if k not in HANGS]
    hanging = [s for s, k in kinds.items() if k in HANGS]
    stock, engine = clone(course, work / "stock"), clone(course, work / "engine")
    load = os.getloadavg()

    phases = {}
    for phase, students, budget in (("honest and crashing", honest, max(60, args.timeout)), ("hanging", hanging, args.timeout)):
        print(f"{phase}: {len(students)} submissions", file=sys.stderr)
        chosen = [a for s in students for a in ("--student", s)]
        grade = [str(BIN / "autograder"), "grade", *slugs, *chosen, "--force", "--jobs", str(args.jobs), "--timeout", str(budget)]
        before = _engine_run(grade, engine.root)
        stock_runs = []
        for slug in slugs:  # nbgrader autograde takes one assignment; the other phase's students are excluded
            others = ",".join(s for s in kinds if s not in students)
            stock_runs.append(measured([str(BIN / "nbgrader"), "autograde", slug, "--force", f"--Execute.timeout={budget}",
                                        f"--CourseDirectory.student_id_exclude={others}",
                                        "--Application.log_format=%(created)f %(message)s"], stock.root))
        after = _engine_run(grade, engine.root)
        theirs = Measured(sum(r.wall for r in stock_runs), sum(r.cpu for r in stock_runs),
                          max(r.peak_pss for r in stock_runs), max(r.peak_rss for r in stock_runs))
        phases[phase] = (students, theirs, {"before stock": before, "after stock": after})

    expected, got = scores(stock), scores(engine)
    compared = [key for key in expected if key[0] in honest and kinds[key[0]] != "crash_exit"]
    same = sum(expected[k] == got.get(k) for k in compared)
    differing = sorted({k[0] for k in compared if expected[k] != got.get(k)})

    from autograder.engine import sandbox

    isolation = sandbox.probe(True, engine.root).summary()
    lines = [
        f"# Grading benchmark, {datetime.now():%Y-%m-%d %H:%M}",
        "",
        f"{len(kinds)} submissions of {', '.join(slugs)} ({len(honest)} honest or crashing, {len(hanging)} hanging); "
        f"{os.cpu_count()} cores; load average before: {load[0]:.1f}; engine: --jobs {args.jobs}, {isolation}.",
        f"Time budget of the hanging phase {args.timeout} s (honest phase {max(60, args.timeout)} s): stock nbgrader "
        f"`--Execute.timeout` (per cell, then SIGINT, then kill), engine `--timeout` (whole notebook, then SIGKILL). "
        "Stock runs `nbgrader autograde` once per assignment (all its students in one call, as an instructor would); "
        "both write the gradebook and autograded/ "
        "(the engine also grades.csv and plots; feedback is nbgrader's own step in both, not timed).",
        "",
        "| phase | tool | wall s | notebooks/min | speed-up | CPU s | cores busy | CPU s per notebook beyond its cells | peak PSS MiB | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for phase, (students, theirs, ours) in phases.items():
        # The students' own code, warm (as the engine measured it, both runs averaged).
        cells = sum(run.code.get(s, (0, 0, 0))[2] for run in ours.values() for s in students) / len(ours)
        for tool, m in [("stock nbgrader", theirs), *((f"autograder grade, {when}", run.measured) for when, run in ours.items())]:
            lines.append(
                f"| {phase} ({len(students)}) | {tool} | {m.wall:.1f} | {60 * len(students) / m.wall:.1f} | "
                f"{theirs.wall / m.wall:.1f}× | {m.cpu:.1f} | {m.cpu / m.wall:.2f} | {(m.cpu - cells) / len(students):.3f} | "
                f"{m.peak_pss:.0f} | {m.peak_rss:.0f} |"
            )
    steady_stock = _stock_seconds_per_notebook(stock.root / "bench.log", set(honest))
    total_stock = sum(t.wall for _, t, _ in phases.values())
    lines.append("")
    for when in ("before stock", "after stock"):
        run = phases["honest and crashing"][2][when]
        times = sorted(run.graded_at[s] for s in honest if s in run.graded_at)
        steady_engine = (times[-1] - times[0]) / (len(times) - 1)
        total_engine = sum(ours[when].measured.wall for _, _, ours in phases.values())
        runs = [run.code[s] for s in honest if s in run.code and kinds[s] not in ("crash_exit",)]
        per = max(len(runs), 1)
        lines.append(
            f"- Engine {when}: steady state of the honest phase (time between consecutive notebooks, start-up "
            f"excluded) {steady_engine:.3f} s per notebook against stock's {steady_stock:.2f} s: "
            f"**{steady_stock / steady_engine:.1f}× the throughput**; all {len(kinds)} submissions "
            f"{total_stock:.1f} s / {total_engine:.1f} s = {total_stock / total_engine:.1f}×. Worker overhead per notebook "
            f"(fork to exit, minus its cells) {1000 * sum(w - c for w, c, _ in runs) / per:.0f} ms; cells themselves "
            f"{1000 * sum(c for _, c, _ in runs) / per:.0f} ms wall, {1000 * sum(c for _, _, c in runs) / per:.0f} ms CPU."
        )
    lines += [
        f"- Honest scores identical: {same}/{len(compared)} graded cells "
        f"({len({k[0] for k in compared})} submissions; os._exit and hangs excluded)"
        + (f"; differing: {', '.join(differing)}" if differing else "") + ".",
        f"- Load average after: {os.getloadavg()[0]:.1f}.",
    ]
    publish("\n".join(lines), "grading")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
