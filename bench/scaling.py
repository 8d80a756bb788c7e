"""What grading costs per notebook, for planning a large course (README: "A large course").

Three measurements on this machine, each written to bench/results/scaling-DATE.md:

1. Each notebook's costs (every notebook in solutions/, --per-notebook model answers
   each, one worker), in the steady state (the notebooks after the first): the worker's
   wall time per notebook (fork to exit, the test cells judged included), the notebook's
   own CPU, the checks' CPU, and the CPU the one grading process spends on it (preparing,
   saving, the rest of its loop: what a single writer pays per notebook, whatever runs the
   notebooks); and the first notebook's wall time, which also waits for the worker's
   preloading (once per worker and run).
2. The cluster path against the local path, in the same run: one class batch of
   03_function_basics graded --rounds times each way, alternating — locally with 2 workers,
   and on a Dask cluster started here (a scheduler and 2 workers of one thread each, on
   127.0.0.1), so both run 2 notebooks at once. The grading phase only (start-up apart):
   seconds per notebook, and the grading process's CPU per notebook.
3. PostgreSQL against SQLite (a server started here, Unix socket only): the same batch
   graded --rounds times on each, alternating.

The graders run in this process (the grading phase is timed inside it); the Dask
processes and PostgreSQL are started and stopped here.

    .venv/bin/python bench/scaling.py [--students 16] [--rounds 2] [--per-notebook 4] [--skip costs,cluster,postgres]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from autograder import authoring  # noqa: E402
from autograder.authoring import use_this_environment  # noqa: E402
from engine_course import clone, solutions  # noqa: E402
from grading import Course  # noqa: E402

SLUG = "03_function_basics"
DASK = str(Path(sys.executable).with_name("dask"))


class Phase:
    """The grading phase of in-process runs: wall time, and CPU of the grading loop's thread
    and of the whole process, from the first submission prepared to the last saved."""

    def __init__(self) -> None:
        from autograder.grader import course

        self.runs: list[dict] = []
        original = course._grade_all

        def timed(todo, *args, **kwargs):
            wall, thread, process = time.monotonic(), time.thread_time(), time.process_time()
            try:
                return original(todo, *args, **kwargs)
            finally:
                self.runs.append({"notebooks": len(todo), "wall": time.monotonic() - wall,
                                  "thread_cpu": time.thread_time() - thread,
                                  "process_cpu": time.process_time() - process})

        course._grade_all = timed

    def grade(self, root: Path, scheduler: str | None = None, jobs: int = 2, db: str | None = None) -> dict:
        from rich.console import Console

        from autograder.grader.grade import run as grade
        from autograder.grader.records import Options

        options = Options(root=root, force=True, jobs=jobs, db_url=db)
        started = time.monotonic()
        with open(os.devnull, "w") as quiet:
            grade(options, Console(file=quiet), scheduler=scheduler)
        run = {**self.runs[-1], "whole": time.monotonic() - started}
        rows = _rows(root)
        run["worker_seconds"] = statistics.mean(float(r["seconds"]) for r in rows)
        stamps = sorted(datetime.fromisoformat(r["graded_at"]).timestamp() for r in rows)
        run["steady"] = (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1)  # between saves, warm-up apart
        return run


def _rows(root: Path) -> list[dict]:
    found = []
    for path in (root / "reports").glob("*/last-run.csv"):
        with open(path, newline="") as f:
            found += list(csv.DictReader(f))
    return found


def _batch(root: Path, students: int) -> Course:
    root.mkdir()
    course = Course(root, [SLUG])
    model = solutions(SLUG)
    wrong = {1: {"linear": "raise NotImplementedError"},
             2: {"clipped_relu": model["clipped_relu"].replace("(x > 0) & (x < ctx.clip)", "x > 0")}}
    for k in range(students):
        course.submit(f"s{k:03d}", SLUG, {**model, **wrong.get(k % 3, {})})
    return course


def costs(phase: Phase, work: Path, per_notebook: int) -> list[dict]:
    """Per notebook: model answers graded by one worker."""
    found = []
    for slug in authoring.assignments(REPO):
        root = work / f"costs-{slug}"
        root.mkdir()
        try:
            course = Course(root, [slug])
        except Exception as error:  # a notebook being written that does not release yet
            print(f"{slug}: not measured ({type(error).__name__}: {error})", file=sys.stderr)
            continue
        model = solutions(slug)
        for k in range(per_notebook):
            course.submit(f"m{k}", slug, model)
        run = phase.grade(root, jobs=1)
        rows = sorted(_rows(root), key=lambda r: r["graded_at"])
        first, steady = rows[0], rows[1:] or rows
        found.append({
            "slug": slug, "n": len(rows),
            "first_seconds": float(first["seconds"]),
            "worker_seconds": statistics.mean(float(r["seconds"]) for r in steady),
            "code_cpu": statistics.mean(float(r["code_cpu"]) for r in steady),
            "checks_cpu": statistics.mean(float(r["checks_cpu"]) for r in steady),
            "grader_cpu": run["thread_cpu"] / run["notebooks"],
            "scores": sorted({r["status"] for r in rows}),
        })
        print(json.dumps(found[-1]), file=sys.stderr)
    return found


class Cluster:
    def __init__(self, folder: Path) -> None:
        self.folder, self.processes, self.address = folder, [], ""

    def start(self, workers: int) -> None:
        scheduler_file = self.folder / "scheduler.json"
        self._spawn("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                    "--scheduler-file", str(scheduler_file))
        while not scheduler_file.exists():
            time.sleep(0.1)
        self.address = json.loads(scheduler_file.read_text())["address"]
        for k in range(workers):
            self._spawn(f"worker-{k}", "worker", self.address, "--nthreads", "1", "--host", "127.0.0.1",
                        "--no-dashboard", "--local-directory", str(self.folder / f"w{k}"))
        from distributed import Client

        with Client(self.address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(workers, timeout=180)

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.folder / f"{name}.log", "w")
        self.processes.append(subprocess.Popen([DASK, *args], cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def compare(phase: Phase, first: tuple[str, Path, dict], second: tuple[str, Path, dict], rounds: int) -> dict:
    """Alternating rounds of two ways to grade the same batch (each its own copy)."""
    found: dict[str, list[dict]] = {first[0]: [], second[0]: []}
    for k in range(rounds):
        for name, root, kwargs in (first, second) if k % 2 == 0 else (second, first):
            found[name].append(phase.grade(root, **kwargs))
            print(name, json.dumps(found[name][-1]), file=sys.stderr)
    return found


def _mean(runs: list[dict], key: str, per_notebook: bool = True) -> float:
    return statistics.mean(r[key] / (r["notebooks"] if per_notebook else 1) for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--per-notebook", type=int, default=4)
    parser.add_argument("--skip", default="", help="comma-separated: costs, cluster, postgres")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    use_this_environment()
    work = Path(tempfile.mkdtemp(prefix="scaling-"))
    phase = Phase()
    load = os.getloadavg()[0]
    lines = [f"# Scaling benchmark, {datetime.now():%Y-%m-%d %H:%M}", "",
             f"{os.cpu_count()} cores, load average before {load:.1f}; sandboxed workers (bubblewrap). "
             "Grading phase only (from the first submission prepared to the last saved), in the grading "
             "process; start-up apart.", ""]
    if "costs" not in skip:
        found = costs(phase, work, args.per_notebook)
        lines += ["## Per notebook (model answers, one worker)", "",
                  "| notebook | notebooks | worker s/notebook | notebook CPU s | checks CPU s | grading process CPU ms "
                  "| first notebook s | status |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in found:
            lines.append(f"| {c['slug']} | {c['n']} | {c['worker_seconds']:.2f} | {c['code_cpu']:.2f} | "
                         f"{c['checks_cpu']:.2f} | {c['grader_cpu'] * 1000:.0f} | {c['first_seconds']:.2f} | "
                         f"{', '.join(c['scores'])} |")
        if found:
            lines += [f"| **all {len(found)}, per student** | | {sum(c['worker_seconds'] for c in found):.2f} | "
                      f"{sum(c['code_cpu'] for c in found):.2f} | {sum(c['checks_cpu'] for c in found):.2f} | "
                      f"{sum(c['grader_cpu'] for c in found) * 1000:.0f} | | |", ""]
    if "cluster" not in skip or "postgres" not in skip:
        base = _batch(work / "batch", args.students)
    if "cluster" not in skip:
        cluster = Cluster(work / "dask")
        (work / "dask").mkdir()
        try:
            cluster.start(workers=2)
            local, remote = clone(base, work / "local"), clone(base, work / "remote")
            found = compare(phase, ("local", local.root, {"jobs": 2}),
                            ("cluster", remote.root, {"scheduler": cluster.address}), args.rounds)
        finally:
            cluster.stop()
        lines += ["## Cluster path against local path (same batch, same run, 2 notebooks at a time)", "",
                  f"{args.students} submissions of {SLUG}, {args.rounds} rounds each, alternating; local: `--jobs 2`; "
                  "cluster: a Dask scheduler and 2 Dask workers of 1 thread on 127.0.0.1.", "",
                  "| path | s per notebook, steady state (between saves) | s per notebook (grading "
                  "phase) | worker s per notebook | grading loop CPU ms/notebook | grading process CPU "
                  "ms/notebook | whole run s |",
                  "|---|---|---|---|---|---|---|"]
        for name, runs in found.items():
            lines.append(f"| {name} | {_mean(runs, 'steady', False):.3f} | {_mean(runs, 'wall'):.3f} | "
                         f"{statistics.mean(r['worker_seconds'] for r in runs):.3f} "
                         f"| {_mean(runs, 'thread_cpu') * 1000:.0f} | {_mean(runs, 'process_cpu') * 1000:.0f} | "
                         f"{_mean(runs, 'whole', False):.1f} |")
        overhead = _mean(found["cluster"], "steady", False) - _mean(found["local"], "steady", False)
        phase_overhead = _mean(found["cluster"], "wall") - _mean(found["local"], "wall")
        lines += ["", f"Overhead of the cluster path: {overhead * 1000:+.0f} ms per notebook in the steady state, "
                  f"{phase_overhead * 1000:+.0f} ms per notebook over the grading phase (the Dask workers' pools warm "
                  "up during it; the local pool warms while the grader starts). The local "
                  "grading process's CPU includes judging the test cells (its own threads); on the cluster the Dask "
                  "workers judge, and the grading process only prepares, sends, receives and saves.", ""]
    if "postgres" not in skip:
        import postgres_server

        with postgres_server.server() as url:
            lite, pg = clone(base, work / "sqlite"), clone(base, work / "pg")
            (pg.root / "gradebook.db").unlink()
            authoring.release(pg.root, db_url=url, slugs=[SLUG])
            found = compare(phase, ("SQLite", lite.root, {"jobs": 2}), ("PostgreSQL", pg.root, {"jobs": 2, "db": url}),
                            args.rounds)
        lines += ["## PostgreSQL against SQLite (same batch, same run, `--jobs 2`)", "",
                  "| gradebook | s per notebook, steady state | s per notebook (grading phase) | grading loop CPU "
                  "ms/notebook | whole run s |", "|---|---|---|---|---|"]
        for name, runs in found.items():
            lines.append(f"| {name} | {_mean(runs, 'steady', False):.3f} | {_mean(runs, 'wall'):.3f} | "
                         f"{_mean(runs, 'thread_cpu') * 1000:.0f} | "
                         f"{_mean(runs, 'whole', False):.1f} |")
        lines.append("")
    lines.append(f"Load average after: {os.getloadavg()[0]:.1f}.")
    text = "\n".join(lines) + "\n"
    print(text)
    out = REPO / "bench" / "results" / f"scaling-{datetime.now():%Y%m%d-%H%M%S}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    print(f"written to {out.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
