"""Stock `nbgrader autograde` against `autograder grade`: a class batch, both tools, one run.

Builds a throwaway course with every notebook in solutions/ and, for each, at least 20
students (--students): model solutions, known wrong and unusual right answers (tests/answers:
--known of each kind per notebook, spread over its exercises; --all-known for every one,
about an hour of stock nbgrader), crashes (os._exit, an exception) and hangs (a loop that
ignores SIGINT; a loop inside a function the checks call, e.g. backward), mixed in one batch
as a class hands them in. Two identical copies are graded, one by each tool, with the same
time budget (--timeout: per cell for nbgrader, per notebook for the engine). The engine
grades the batch twice, just before and just after stock, because a shared machine's speed
drifts during stock's minutes: each engine run is compared with the same stock run. Prints a
markdown table and writes it to bench/results/.

    .venv/bin/python bench/stock_vs_engine.py [--students 20] [--known 5 | --all-known] [--timeout 10] [--jobs N]
"""
from __future__ import annotations

import argparse
import csv
import os
import random
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
from typing import Any

import nbformat
import psutil

from publish import publish  # noqa: E402  (bench/ is the script's own folder)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from nbgrader.api import Gradebook  # noqa: E402

from answers import for_notebook  # noqa: E402
from autograder import authoring  # noqa: E402
from engine_course import clone, solutions  # noqa: E402
from grading import Course  # noqa: E402

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
    # student -> (s fork to exit, s in cells, CPU s in cells, CPU s in checks)
    code: dict[str, tuple[float, float, float, float]]
    graded_at: dict[str, float]  # student -> when the engine saved it
    started: float  # when the command started (time.time())
    judged: dict[tuple[str, str], Any]  # (student, grade_id) -> (score, the test cell's outputs)


def _engine_run(command: list[str], root: Path) -> EngineRun:
    started = time.time()
    measured_run = measured(command, root)
    code, graded_at = {}, {}
    for status in (root / "reports").glob("*/last-run.csv"):
        with open(status) as f:
            for row in csv.DictReader(f):
                code[row["student"]] = (float(row["seconds"]), float(row["code_seconds"]), float(row["code_cpu"]),
                                        float(row["checks_cpu"]))
                graded_at[row["student"]] = datetime.fromisoformat(row["graded_at"]).timestamp()
    return EngineRun(measured_run, code, graded_at, started, _judged(root))


def _judged(root: Path) -> dict[tuple[str, str], Any]:
    """Every graded cell's score and outputs, as the gradebook and autograded/ hold them."""
    found: dict[tuple[str, str], Any] = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for a in gb.assignments:
            for sub in a.submissions:
                for nb in sub.notebooks:
                    path = root / "autograded" / sub.student.id / a.name / f"{nb.name}.ipynb"
                    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c.get("outputs")
                             for c in nbformat.read(path, as_version=4).cells} if path.exists() else {}
                    for g in nb.grades:
                        found[sub.student.id, g.name] = (g.auto_score, cells.get(g.name))
    return found


def _loop_in_first_function(source: str) -> str | None:
    lines = source.splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)def \w+\(.*\)\s*(->.*)?:\s*$", line)
        if match:
            return "\n".join([*lines[: i + 1], match.group(1) + "    while True:", match.group(1) + "        pass",
                              *lines[i + 1 :]])
    return None


def spread(answers: list, known: int | None) -> list:
    """The first `known` of `answers` (all if None), taken from each exercise in turn."""
    by_exercise: dict[str, list] = {}
    for answer in answers:
        by_exercise.setdefault(answer.exercise, []).append(answer)
    turns = [group[i] for i in range(max(map(len, by_exercise.values()), default=0))
             for group in by_exercise.values() if i < len(group)]
    return turns if known is None else turns[:known]


def submissions(slug: str, count: int, known: int | None,
                honest: bool = False) -> dict[str, tuple[str, dict[str, str]]]:
    """{student: (kind, answers)} for one notebook: known answers, crashes, hangs, model
    solutions (`honest`: model solutions only)."""
    model = solutions(slug)
    first = next(iter(model))
    answers = for_notebook(slug)
    found: dict[str, tuple[str, dict[str, str]]] = {}
    if honest:
        return _in_hand_in_order({f"{slug}_correct{k:02d}": ("correct", model) for k in range(count)})
    for k, a in enumerate(spread(answers.MUTANTS, known)):
        found[f"wrong{k:02d}"] = ("wrong", {**model, a.exercise: a.apply(model[a.exercise])})
    for k, a in enumerate(spread(answers.VARIANTS, known)):
        found[f"right{k:02d}"] = ("right", {**model, a.exercise: a.apply(model[a.exercise])})
    found["crash_exception"] = ("crash_exception",
                                {**model, first: "raise RuntimeError('my code breaks')\n" + model[first]})
    found["crash_exit"] = ("crash_exit", {**model, first: model[first] + "\nimport os\nos._exit(1)"})
    found["hang_sigint"] = ("hang_sigint", {
        **model, first: "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"})
    looping = next(((ex, s) for ex, src in model.items() if "def backward(" in src
                    for s in [src.replace("def backward(ctx, grad_output):",
                                          "def backward(ctx, grad_output):\n        while True:\n            pass", 1)]
                    if s != src), None)
    if looping is None:
        looping = next((ex, s) for ex, src in model.items() if (s := _loop_in_first_function(src)))
    found["hang_in_function"] = ("hang_in_function", {**model, looping[0]: looping[1]})
    k = 0
    while len(found) < count:
        found[f"correct{k:02d}"] = ("correct", model)
        k += 1
    # (named after the whole slug: a student of its own per notebook, also where two share a number)
    return _in_hand_in_order({f"{slug}_{student}": entry for student, entry in found.items()})


def _in_hand_in_order(students: dict) -> dict:
    """Shuffled as a class hands them in (by each name's own seed: the same order every run)."""
    return dict(sorted(students.items(), key=lambda item: random.Random(item[0]).random()))


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
    return bool(command) and "autograder.runner.zygote" in command and not command[0].endswith("bwrap")


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
    parser.add_argument("--students", type=int, default=20, help="students per assignment (at least)")
    parser.add_argument("--known", type=int, default=5,
                        help="known wrong answers, and known right ones, per assignment (spread over its exercises)")
    parser.add_argument("--all-known", action="store_true", help="every known answer (about an hour of stock nbgrader)")
    parser.add_argument("--honest", action="store_true",
                        help="model solutions only: an honest class, no known answers, crashes or hangs")
    parser.add_argument("--timeout", type=int, default=10,
                        help="time budget: per cell for nbgrader, per notebook for the engine")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--keep", action="store_true", help="keep the generated courses (and their logs)")
    parser.add_argument("assignments", nargs="*", help="only these assignments (default: every one in solutions/)")
    args = parser.parse_args()

    slugs = args.assignments or authoring.assignments()
    work = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    print(f"building {args.students}+ submissions of each of {', '.join(slugs)} in {work}", file=sys.stderr)
    (work / "course").mkdir()
    course = Course(work / "course", slugs)
    kinds, assignment = {}, {}
    for slug in slugs:
        for student, (kind, answers) in submissions(slug, args.students, None if args.all_known else args.known,
                                                    args.honest).items():
            course.submit(student, slug, answers)
            kinds[student], assignment[student] = kind, slug
    honest = [s for s, k in kinds.items() if k not in HANGS]
    stock, engine = clone(course, work / "stock"), clone(course, work / "engine")
    load = os.getloadavg()

    grade = [str(BIN / "autograder"), "grade", "--force", "--jobs", str(args.jobs), "--timeout", str(args.timeout)]
    print(f"grading {len(kinds)} notebooks: engine, stock, engine", file=sys.stderr)
    ours = {"before stock": _engine_run(grade, engine.root)}
    stock_runs = [  # nbgrader autograde takes one assignment at a time, every student of it in one call
        # (on purpose: the course's nbgrader_config.py refuses it otherwise)
        measured(["env", "NBGRADER_STOCK_AUTOGRADE=1", str(BIN / "nbgrader"), "autograde", slug, "--force",
                  f"--Execute.timeout={args.timeout}", "--Application.log_format=%(created)f %(message)s"], stock.root)
        for slug in slugs
    ]
    ours["after stock"] = _engine_run(grade, engine.root)
    theirs = Measured(sum(r.wall for r in stock_runs), sum(r.cpu for r in stock_runs),
                      max(r.peak_pss for r in stock_runs), max(r.peak_rss for r in stock_runs))

    expected, got = scores(stock), scores(engine)
    compared = [key for key in expected if key[0] in honest and kinds[key[0]] != "crash_exit"]
    same = sum(expected[k] == got.get(k) for k in compared)
    differing = sorted({k[0] for k in compared if expected[k] != got.get(k)})

    from autograder.isolation import sandbox

    isolation = sandbox.detect(True, engine.root).summary()
    n = len(kinds)
    counts = {kind: sum(k == kind for k in kinds.values()) for kind in sorted(set(kinds.values()))}
    lines = [
        f"# Grading benchmark, {datetime.now():%Y-%m-%d %H:%M}",
        "",
        f"{n} submissions: {len(slugs)} assignments ({', '.join(slugs)}) × {args.students} students "
        f"({', '.join(f'{c} {kind}' for kind, c in counts.items())}); {os.cpu_count()} cores; load average before: "
        f"{load[0]:.1f}; engine: --jobs {args.jobs}, {isolation}. Time budget {args.timeout} s: stock nbgrader "
        "`--Execute.timeout` (per cell, then SIGINT, then kill), engine `--timeout` (whole notebook, then SIGKILL). "
        "Stock runs `nbgrader autograde` once per assignment (all its students in one call, as an instructor would); "
        "both write the gradebook and autograded/ (the engine also grades.csv and plots; feedback is nbgrader's "
        "own step in both, not timed). Whole runs, start-up included.",
        "",
        "| tool | wall s | notebooks/min | speed-up | CPU s | CPU s per notebook | cores busy | peak PSS MiB "
        "| peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for tool, m in [("stock nbgrader", theirs),
                    *((f"autograder grade, {when}", run.measured) for when, run in ours.items())]:
        lines.append(
            f"| {tool} | {m.wall:.1f} | {60 * n / m.wall:.1f} | {theirs.wall / m.wall:.1f}× | {m.cpu:.1f} | "
            f"{m.cpu / n:.3f} | {m.cpu / m.wall:.2f} | {m.peak_pss:.0f} | {m.peak_rss:.0f} |"
        )
    steady_stock = _stock_seconds_per_notebook(stock.root / "bench.log", set(honest))
    lines += ["",
              "| engine run | steady state s/notebook | vs stock | cells CPU ms | checks CPU ms | engine's own CPU ms "
              "| by assignment: cells + checks CPU ms |", "|---|---|---|---|---|---|---|"]
    for when, run in ours.items():
        times = sorted(run.graded_at[s] for s in honest if s in run.graded_at)
        steady = (times[-1] - times[0]) / (len(times) - 1)
        measured_ones = [s for s in honest if s in run.code and kinds[s] != "crash_exit"]
        cells = sum(run.code[s][2] for s in measured_ones) / len(measured_ones)
        checks = sum(run.code[s][3] for s in measured_ones) / len(measured_ones)
        # Everything else the engine spent per notebook, start-up and the end included: the
        # grader, the warm workers, forking, the sandbox, saving.
        own = (run.measured.cpu - sum(run.code[s][2] + run.code[s][3] for s in run.code)) / n
        per_slug = ", ".join(
            f"{slug} {1000 * _mean([run.code[s][2] for s in measured_ones if assignment[s] == slug]):.0f}"
            f" + {1000 * _mean([run.code[s][3] for s in measured_ones if assignment[s] == slug]):.0f}"
            for slug in slugs)
        lines.append(f"| {when} | {steady:.3f} | {steady_stock / steady:.1f}× | {1000 * cells:.0f} | "
                     f"{1000 * checks:.0f} | {1000 * own:.0f} | {per_slug} |")
    lines += [
        "",
        f"- Stock's steady state: {steady_stock:.2f} s per notebook (between consecutive notebooks of one call).",
        f"- Honest scores identical: {same}/{len(compared)} graded cells "
        f"({len({k[0] for k in compared})} submissions; os._exit and hangs excluded)"
        + (f"; differing: {', '.join(differing)}" if differing else "") + ".",
        "- A regrade (`--force`) repeats every score and every test cell's outputs: "
        + ("yes" if ours["before stock"].judged == ours["after stock"].judged else "NO, "
           + ", ".join(sorted({k[0] for k, v in ours["before stock"].judged.items()
                               if ours["after stock"].judged.get(k) != v})[:10]))
        + f" ({len(ours['before stock'].judged)} graded cells).",
        "- The first notebook saved: " + ", ".join(
            f"{min(run.graded_at.values()) - run.started:.1f} s after the command started ({when})"
            for when, run in ours.items() if run.graded_at) + ".",
        f"- Load average after: {os.getloadavg()[0]:.1f}.",
    ]
    publish("\n".join(lines), "grading")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


if __name__ == "__main__":
    main()
