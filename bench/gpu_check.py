"""`make gpu-check`: the course's CUDA path, checked on a GPU machine that has only python3 and torch.

In one command, within a time budget, most valuable first, it
1. runs every notebook top to bottom with the model answers, cells in order in one
   interpreter (bench/notebook_run.py: no Jupyter), and reports each cell's status;
2. grades the device bugs only CUDA catches (tests/answers/devices.py), with CUDA;
3. grades a small class batch with the real grader, sandbox on, the GPU passed in, and
   compares its scores with a CPU run of the same batch (bench/gpu_grade.py: the grader's
   dependencies and bubblewrap carried in build/gpu-check, from `make gpu-wheels`);
4. then the rest: the other device bugs, every device bug again with CUDA hidden (which tells
   the run that catches each: meta, CUDA or both), each notebook's checks timed with CUDA
   hidden, and every other known answer (tests/answers: a wrong one must lose its exercise's
   points, a right one keep them).
Each finished task prints one line, and OUT/report.json and OUT/report.md are rewritten after
it: a run stopped at any moment leaves what it finished, marked incomplete. No task starts
that its estimate says cannot end within the budget, and one still running at the budget's
end is stopped; the report lists what was left out for time. Without CUDA it runs what it can
and lists what it skipped. Exit status 1 when something is wrong (skips are not), 2 when it
cannot start (one line says why).

    python3 bench/gpu_check.py OUT [--budget SECONDS] [--jobs N] [--notebooks SLUG ...]
                                   [--no-class-batch] [--quick]

--quick: notebook 03 only, its device bugs only, no class batch (what `make test` runs).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import gpu_grade
import notebook_run

REPO = notebook_run.REPO
sys.path.insert(0, str(REPO / "tests"))

from answers import for_notebook  # noqa: E402  (tests/answers: plain Python, no test dependencies)

QUICK = ["03_function_basics"]
RUN_TIMEOUT = 120  # seconds one notebook may take (the grader's default); then its unfinished cells score 0
BUDGET = 540  # seconds of work by default: the GPU machine stops a command at 600
MARGIN = 1.25  # a task's estimate: the slowest run of its notebook so far, times this
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}  # torch then sees no GPU: the checks run on the CPU (and meta)
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one core per task, as the grader's workers
PARTS = ("model answers", "device bugs only CUDA catches", "class batch", "the rest")
CHILDREN: set[int] = set()  # the process groups of the tasks running: ended when this run is stopped


@dataclass
class Task:
    slug: str
    name: str  # model, model-cpu, class-batch, or the submission: wrong0, right0, device0, ...
    part: int  # index in PARTS: the order of value
    answers: list = field(default_factory=list)  # answers.Answer carried, one per exercise at most
    cpu_only: bool = False
    result: dict | None = None
    error: str = ""
    ended: bool = False  # it ran, to its end or until stopped
    stopped_for_time: bool = False  # by the budget's end: it counts as not run
    seconds: float = 0.0
    cpu_seconds: float | None = None

    @property
    def label(self) -> str:
        return f"{self.slug} {self.name}"

    @property
    def finished(self) -> bool:
        return self.ended and not self.stopped_for_time


@dataclass
class Finished:
    """A child process's end: its output, its exit status, and the CPU that it and the
    processes it waited for used."""

    stdout: str
    stderr: str
    returncode: int
    cpu_seconds: float
    timed_out: bool


def run_process(argv: list[str], timeout: float, env: dict[str, str]) -> Finished:
    """`argv` in a process group of its own, stopped with all of it after `timeout` seconds
    (SIGTERM, then SIGKILL), and anything it left behind ended as well."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(argv, stdout=out, stderr=err, env=env, start_new_session=True)
        CHILDREN.add(child.pid)
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            _signal_group(child.pid, signal.SIGTERM)
            time.sleep(3)
            _signal_group(child.pid, signal.SIGKILL)

        timer = threading.Timer(max(timeout, 0.0), stop)
        timer.start()
        _, status, usage = os.wait4(child.pid, 0)  # wait4, not Popen.wait: its CPU comes with it
        timer.cancel()
        child.returncode = os.waitstatus_to_exitcode(status)
        _signal_group(child.pid, signal.SIGKILL)  # what it started and left running
        CHILDREN.discard(child.pid)
        out.seek(0)
        err.seek(0)
        return Finished(out.read(), err.read(), child.returncode, usage.ru_utime + usage.ru_stime, stopped.is_set())


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def packed(name: str, answers: list, start: int = 0) -> list[tuple[str, list]]:
    """Submission k carries the k-th answer of each exercise (as tests/grading.py packs them)."""
    by_exercise: dict[str, list] = {}
    for answer in answers:
        by_exercise.setdefault(answer.exercise, []).append(answer)
    rows = itertools.zip_longest(*by_exercise.values())
    return [(f"{name}{k}", [a for a in row if a is not None]) for k, row in enumerate(rows, start)]


def tasks(slugs: list[str], cuda: bool, quick: bool, class_batch: bool) -> list[Task]:
    """Everything to run, most valuable first: each part in turn; within the rest, the device
    story, then the timings, then the other answers, notebook by notebook in turn."""
    models, only_cuda, device_rest, timings, others = [], [], [], [], []
    for slug in slugs:
        models.append(Task(slug, "model", 0))
        if cuda:
            timings.append(Task(slug, "model-cpu", 3, cpu_only=True))
        known = for_notebook(slug)
        cuda_bugs = packed("device", [a for a in known.MUTANTS if a.device == "cuda"])
        other_bugs = packed("device", [a for a in known.MUTANTS if a.device in ("cpu", "meta")], len(cuda_bugs))
        for name, carried in cuda_bugs + other_bugs:
            if cuda and all(a.device == "cuda" for a in carried):
                only_cuda.append(Task(slug, name, 1, carried))
            else:
                device_rest.append(Task(slug, name, 3, carried))
            if cuda:
                device_rest.append(Task(slug, name + "-cpu", 3, carried, cpu_only=True))
        if not quick:
            submissions = packed("wrong", [a for a in known.MUTANTS if not a.device]) + packed("right", known.VARIANTS)
            others.append([Task(slug, name, 3, carried) for name, carried in submissions])
    batch = [Task(gpu_grade.SLUG, "class-batch", 2)] if class_batch else []
    in_turn = [t for row in itertools.zip_longest(*others) for t in row if t is not None]
    return models + only_cuda + batch + device_rest + timings + in_turn


def run(task: Task, models: dict[str, dict[str, str]], out: Path, cuda: bool, deadline: float) -> Task:
    """One task: a notebook in a fresh interpreter (no state passes between submissions), or the class batch."""
    timeout = deadline - time.monotonic()
    env = {**os.environ, **ONE_THREAD, **(CPU_ONLY if task.cpu_only else {})}
    started = time.monotonic()
    if task.name == "class-batch":
        with tempfile.TemporaryDirectory(prefix="gpu-grade-", ignore_cleanup_errors=True) as work:
            done = run_process([sys.executable, gpu_grade.__file__, "--batch", str(out), work]
                               + (["--cuda"] if cuda else []), timeout, env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        task.result = json.loads(lines[-1]) if lines and not done.timed_out else None
        task.error = "" if task.result else f"exit {done.returncode}: {done.stderr.strip()[-1500:]}"
    else:
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            model = models[task.slug]
            json.dump({a.exercise: a.apply(model[a.exercise]) for a in task.answers}, f)
            f.flush()
            done = run_process([sys.executable, notebook_run.__file__, task.slug, f.name],
                               min(RUN_TIMEOUT, timeout), env)
        task.error = f"exit {done.returncode}: {done.stderr.strip()[-600:]}" if done.returncode else ""
        if done.timed_out and timeout >= RUN_TIMEOUT:
            task.error = f"stopped after {RUN_TIMEOUT} s: the cells it did not finish score 0"
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if lines:
            task.result = {**lines[0], "cells": [line["cell"] for line in lines[1:] if "cell" in line]}
    task.stopped_for_time = done.timed_out and (task.name == "class-batch" or timeout < RUN_TIMEOUT)
    task.ended = True
    task.seconds = time.monotonic() - started
    task.cpu_seconds = done.cpu_seconds
    return task


def estimate(task: Task, done: list[Task]) -> float:
    """Seconds `task` should take: the slowest finished run of its notebook so far (before one,
    of any notebook), with a margin, and the class batch as many as gpu_grade.RUNS of them;
    before any run nothing is known, and the first tasks start."""
    runs = [t for t in done if t.finished and t.name != "class-batch"]
    if not runs:
        return 0.0
    slowest = max(t.seconds for t in [t for t in runs if t.slug == task.slug] or runs)
    return gpu_grade.RUNS * slowest if task.name == "class-batch" else min(RUN_TIMEOUT, MARGIN * slowest)


@functools.cache
def notebook(slug: str) -> tuple[list[notebook_run.Exercise], dict[str, float]]:
    """A notebook's exercises, and the points of each graded cell (read once: the report is judged after every task)."""
    cells = notebook_run.cells(slug)
    return notebook_run.exercises(cells), {c.grade_id: c.points for c in cells if c.points}


def scores(task: Task, exercise: notebook_run.Exercise) -> tuple[float, float, list[str]]:
    """(score, total, the errors of its failed graded cells) of one exercise in a run; a cell
    the run did not reach scores 0."""
    assert task.result is not None
    ran = {c["grade_id"]: c for c in task.result["cells"]}
    points = {g: p for g, p in notebook(task.slug)[1].items() if g in exercise.graded}
    got = {g: ran[g]["score"] if g in ran else 0.0 for g in points}
    failed = [ran[g]["error"] if g in ran else f"not run: {task.error}" for g in points if got[g] < points[g]]
    return sum(got.values()), sum(points.values()), failed


def caught_by(errors: list[str], cuda: bool) -> str:
    """Which run of the checks a failure message comes from: the meta device's, CUDA's (where
    CUDA was visible) or the CPU's."""
    text = " ".join(errors)
    if "(meta" in text or "device meta" in text:
        return "meta"
    return "cuda" if cuda and "cuda" in text.lower() else "cpu"


def judge(found: list[Task], cuda: bool) -> dict:
    """Everything the report says, from the tasks finished so far."""
    by = {(t.slug, t.name): t for t in found if t.finished}
    notebooks, answers, devices, problems = [], [], [], []
    for slug in dict.fromkeys(t.slug for t in found if t.name != "class-batch"):
        exercises = notebook(slug)[0]
        model, model_cpu = by.get((slug, "model")), by.get((slug, "model-cpu"))
        if model is not None:
            if model.error or model.result is None:
                problems.append(f"{slug}: the notebook did not run to its end ({model.error or 'no output'})")
            if model.result is not None:
                notebooks.append(_notebook_row(slug, model, model_cpu, cuda, problems))
        counts = {"wrong": [0, 0], "right": [0, 0]}
        for task in (t for t in found if t.slug == slug and t.answers and t.finished and not t.cpu_only):
            if task.result is None:
                problems.append(f"{slug} {task.name}: did not run ({task.error})")
                continue
            for answer in task.answers:
                exercise = next(e for e in exercises if e.answer_id == answer.exercise)
                score, total, errors = scores(task, exercise)
                if task.name.startswith("device"):
                    row = _device_row(slug, answer, score < total, errors, by.get((slug, task.name + "-cpu")),
                                      exercise, cuda)
                    devices.append(row)
                    if row["verdict"] != "ok" and not row["verdict"].startswith(("skipped", "pending")):
                        problems.append(f"{slug} {answer.exercise} '{answer.label}': {row['verdict']}")
                    continue
                kind = "right" if task.name.startswith("right") else "wrong"
                good = score == total if kind == "right" else score < total
                counts[kind][0] += good
                counts[kind][1] += 1
                if not good:
                    what = "lost points" if kind == "right" else "kept its points"
                    problems.append(f"{slug} {answer.exercise} '{answer.label}' ({kind}) {what}: {score}/{total}"
                                    + (f": {errors[0][:200]}" if errors else ""))
        if any(counts["wrong"]) or any(counts["right"]):
            answers.append({"notebook": slug, "wrong_losing": counts["wrong"], "right_keeping": counts["right"]})
    batch = next((t for t in found if t.name == "class-batch" and t.finished), None)
    grading: dict = {}
    if batch is not None:
        grading = batch.result or {"skipped": f"grading failed: {batch.error}",
                                   "problems": ["the class batch could not be graded"]}
        problems += grading.get("problems", [])
    return {"notebooks": notebooks, "answers": answers, "devices": devices, "grading": grading, "problems": problems}


def _notebook_row(slug: str, model: Task, model_cpu: Task | None, cuda: bool, problems: list[str]) -> dict:
    assert model.result is not None
    cells = model.result["cells"]
    for c in cells:
        if c["status"] == "failed":
            problems.append(f"{slug} cell {c['index']} ({c['kind']} {c['grade_id']}): {c['error'][:300]}")
        elif c["points"] and c["score"] < c["points"]:
            problems.append(f"{slug} {c['grade_id']}: the model answer got {c['score']}/{c['points']}: "
                            f"{c['error'][:300]}")
    return {
        "notebook": slug,
        "cells": len(cells),
        "ok": sum(c["status"] == "ok" for c in cells),
        "failed": sum(c["status"] == "failed" for c in cells),
        "skipped": [f"cell {c['index']}: {c['error']}" for c in cells if c["status"] == "skipped"],
        "model_points": [sum(c["score"] for c in cells), sum(c["points"] for c in cells)],
        "checks_s_cpu_only": _check_seconds(model_cpu if cuda else model),
        "checks_s_with_cuda": _check_seconds(model) if cuda else None,
        "meta_not_checked": sorted({c["grade_id"] for c in cells if "meta device: not checked" in c["output"]}),
    }


def _check_seconds(task: Task | None) -> float | None:
    if task is None or task.result is None:
        return None
    return round(sum(c["seconds"] for c in task.result["cells"] if c["kind"] in ("check", "hidden", "summary")), 2)


def _device_row(slug: str, answer, lost: bool, errors: list[str], cpu_run: Task | None,
                exercise: notebook_run.Exercise, cuda: bool) -> dict:
    """Where a device bug was caught, against where tests/answers/devices.py says it is."""
    row = {"notebook": slug, "exercise": answer.exercise, "bug": answer.label, "expected": answer.device}
    if cuda:
        row["cuda_run"] = caught_by(errors, cuda=True) if lost else "kept its points"
        if cpu_run is None:
            row.update(cpu_only_run="not run yet", caught="cuda" if lost else "nowhere")
            row["verdict"] = ("pending: its run with CUDA hidden" if lost or answer.device == "cuda"
                              else f"kept its points with CUDA, expected {answer.device}")
            return row
        if cpu_run.result is None:
            row["cpu_only_run"] = f"did not run ({cpu_run.error})"
            cpu_lost = None
        else:
            score, total, cpu_errors = scores(cpu_run, exercise)
            cpu_lost = score < total
            row["cpu_only_run"] = caught_by(cpu_errors, cuda=False) if cpu_lost else "kept its points"
        row["caught"] = ("both" if cpu_lost else "cuda") if lost else ("cpu only" if cpu_lost else "nowhere")
        expected = {"cuda": "cuda", "meta": "both", "cpu": "both"}[answer.device]
        row["verdict"] = "ok" if row["caught"] == expected else f"caught {row['caught']}, expected {answer.device}"
    else:
        row["cpu_only_run"] = caught_by(errors, cuda=False) if lost else "kept its points"
        row["cuda_run"] = "skipped: no CUDA"
        if answer.device == "cuda":
            row["caught"] = "needs CUDA"
            row["verdict"] = ("skipped: only a GPU run catches it" if not lost else
                              f"caught on the CPU ({row['cpu_only_run']}): mark it '{row['cpu_only_run']}', not 'cuda'")
        else:
            row["caught"] = row["cpu_only_run"] if lost else "nowhere"
            row["verdict"] = ("ok" if row["caught"] == answer.device
                              else f"caught {row['caught']}, expected {answer.device}")
    return row


def sizing(found: list[Task]) -> list[dict]:
    """Per part: tasks finished of those planned, their wall seconds and CPU seconds."""
    rows = []
    for number, name in enumerate(PARTS):
        own = [t for t in found if t.part == number]
        done = [t for t in own if t.finished]
        rows.append({"part": name, "tasks": [len(done), len(own)], "seconds": round(sum(t.seconds for t in done), 1),
                     "cpu_seconds": round(sum(t.cpu_seconds or 0.0 for t in done), 1)})
    return rows


def environment() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "device": torch.cuda.get_device_name() if cuda else "no CUDA device",
        "cores": len(os.sched_getaffinity(0)),
    }


def markdown(report: dict) -> str:
    env = report["environment"]
    if report["complete"]:
        state = "complete"
    elif not report["final"]:
        state = f"INCOMPLETE: written while {report['running']} task(s) ran, {len(report['not_run'])} to come"
    else:
        state = f"INCOMPLETE: {len(report['not_run'])} task(s) left out for time"
    lines = [
        f"# gpu-check, {report['date']}: {state}",
        "",
        f"python {env['python']}, torch {env['torch']}, {env['device']}"
        + (f" (CUDA {env['cuda']})" if env["cuda"] else "") + f", {env['cores']} cores, {report['jobs']} jobs; "
        f"{report['seconds']:.0f} s of a {report['budget']:.0f} s budget.",
        "",
        "| part | tasks finished | seconds (the tasks' own, summed) | CPU seconds |",
        "|---|---|---|---|",
    ]
    lines += [f"| {p['part']} | {p['tasks'][0]}/{p['tasks'][1]} | {p['seconds']:.0f} | {p['cpu_seconds']:.0f} |"
              for p in report["parts"]]
    lines += ["", "| notebook | cells ok | failed | skipped | model points | checks s, CPU only | "
              "checks s, CPU + CUDA | meta not checked |", "|---|---|---|---|---|---|---|---|"]
    for n in report["notebooks"]:
        cpu = "not run yet" if n["checks_s_cpu_only"] is None else n["checks_s_cpu_only"]
        cuda = "skipped: no CUDA" if not env["cuda"] else n["checks_s_with_cuda"]
        lines.append(f"| {n['notebook']} | {n['ok']}/{n['cells']} | {n['failed']} | {len(n['skipped'])} | "
                     f"{n['model_points'][0]:g}/{n['model_points'][1]:g} | {cpu} | {cuda} | "
                     f"{', '.join(n['meta_not_checked']) or '-'} |")
    if report["answers"]:
        lines += ["", "| notebook | wrong answers losing points | right answers keeping them |", "|---|---|---|"]
        lines += [f"| {a['notebook']} | {a['wrong_losing'][0]}/{a['wrong_losing'][1]} | "
                  f"{a['right_keeping'][0]}/{a['right_keeping'][1]} |" for a in report["answers"]]
    if report["devices"]:
        lines += ["", "| notebook | exercise | device bug | caught by (expected) | CPU-only run | CUDA run | verdict |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {d['notebook']} | {d['exercise']} | {d['bug']} | {d['caught']} ({d['expected']}) | "
                  f"{d['cpu_only_run']} | {d['cuda_run']} | {d['verdict']} |" for d in report["devices"]]
    grading = report["grading"]
    not_run = "left out for time" if report["final"] else "not run yet"
    lines += ["", "## Class batch with the real grader", "",
              grading.get("table") or f"Skipped: {grading.get('skipped', not_run)}"]
    lines += ["", "## Not run" + (": left out for time" if report["final"] else " yet"), ""]
    lines += _by_notebook(report["not_run"]) or ["- nothing"]
    lines += ["", "## Skipped", ""] + ([f"- {s}" for s in report["skipped"]] or ["- nothing"])
    lines += ["", "## Problems", ""] + ([f"- {p}" for p in report["problems"]] or ["- none"])
    return "\n".join(lines) + "\n"


def _by_notebook(labels: list[str]) -> list[str]:
    """'- SLUG: name, name, ...' per notebook."""
    by_slug: dict[str, list[str]] = {}
    for label in labels:
        slug, name = label.split(" ", 1)
        by_slug.setdefault(slug, []).append(name)
    return [f"- {slug}: {', '.join(names)}" for slug, names in sorted(by_slug.items())]


def refusal(args: argparse.Namespace) -> str | None:
    """Why this run cannot start (one line), or None."""
    for module in ("torch", "numpy"):
        if importlib.util.find_spec(module) is None:
            return (f"{sys.executable} has no {module}: run this with a Python that has torch and numpy "
                    f"(here: make gpu-check PYTHON=.venv/bin/python; on the GPU machine: its python3)")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=args.out):
            pass
    except OSError as error:
        return f"cannot write the report to {args.out}: {error.strerror}"
    if args.class_batch:
        missing = gpu_grade.missing()
        if missing:
            return f"{missing}; or pass --no-class-batch to run without it"
    return None


class Report:
    """OUT/report.json and OUT/report.md, rewritten whole (never half written) after every task."""

    def __init__(self, args: argparse.Namespace, env: dict, todo: list[Task], started: float):
        self.args, self.env, self.todo, self.started = args, env, todo, started
        self.date = time.strftime("%Y-%m-%d %H:%M")

    def write(self, running: int, not_run: list[Task], final: bool = False) -> dict:
        """The report so far; complete when final and nothing was left out."""
        cuda = self.env["cuda"] is not None
        report = {"date": self.date, "final": final, "complete": final and not not_run, "budget": self.args.budget,
                  "jobs": self.args.jobs, "environment": self.env, "seconds": time.monotonic() - self.started,
                  "running": running, "not_run": [t.label for t in not_run], "parts": sizing(self.todo),
                  **judge(self.todo, cuda)}
        skipped = [] if cuda else ["every CUDA run (no CUDA device): the checks ran on the CPU and the meta device "
                                   "only; device bugs that only a GPU catches were not graded"]
        if self.args.quick:
            skipped.append("--quick: the other notebooks, the answers that are not device bugs, the class batch")
        if not self.args.class_batch:
            report["grading"] = {"skipped": "--quick" if self.args.quick else "--no-class-batch"}
        skipped += [f"{n['notebook']} {s}" for n in report["notebooks"] for s in n["skipped"]]
        if "skipped" in report["grading"]:
            skipped.append(f"the class batch with the real grader: {report['grading']['skipped']}")
        report["skipped"] = skipped
        for name, text in (("report.json", json.dumps(report, indent=1) + "\n"), ("report.md", markdown(report))):
            partial = self.args.out / f".{name}.partial"
            partial.write_text(text)
            partial.replace(self.args.out / name)
        return report


def schedule(todo: list[Task], args: argparse.Namespace, models: dict, cuda: bool, report: Report) -> dict:
    """Run `todo` in its order, `args.jobs` at a time, each task started only while its estimate
    fits before the budget's end; one line per finished task, the report after each."""
    deadline = report.started + args.budget
    pending, done, running = list(todo), [], {}
    with ThreadPoolExecutor(args.jobs) as pool, _ending_children():
        while pending or running:
            while len(running) < args.jobs:
                now = time.monotonic()
                task = next((t for t in pending if now + estimate(t, done) <= deadline), None)
                if task is None:
                    break
                pending.remove(task)
                running[pool.submit(run, task, models, args.out, cuda, deadline)] = task
            if not running:
                break  # nothing left fits
            finished: set[Future] = wait(running, return_when=FIRST_COMPLETED)[0]
            for future in finished:
                task = future.result()
                del running[future]
                done.append(task)
                print(_progress(task, report.started, cuda), flush=True)
                report.write(len(running), pending + [t for t in done if t.stopped_for_time])
    return report.write(0, pending + [t for t in done if t.stopped_for_time], final=True)


@contextlib.contextmanager
def _ending_children() -> Iterator[None]:
    """Where this run is stopped (SIGTERM, ^C), the tasks it runs end too; its report stays as last written."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        yield
    finally:
        for pid in list(CHILDREN):
            _signal_group(pid, signal.SIGKILL)


def _progress(task: Task, started: float, cuda: bool) -> str:
    where = "CUDA hidden" if task.cpu_only else "with CUDA" if cuda else "CPU"
    if task.stopped_for_time:
        status = "stopped: the budget ended"
    elif task.error:
        status = task.error.splitlines()[0][:160]
    else:
        status = "ok"
    cpu = f", {task.cpu_seconds:.1f} CPU-s" if task.cpu_seconds is not None else ""
    return (f"[{time.monotonic() - started:5.0f} s] {task.slug} {task.name} ({where}): {status} "
            f"({task.seconds:.1f} s{cpu})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for report.json and report.md")
    parser.add_argument("--budget", type=float, default=BUDGET, help=f"seconds of work at most (default {BUDGET})")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="tasks run at once (default: the cores)")
    parser.add_argument("--notebooks", nargs="*", help="slugs (default: all; --quick: 03_function_basics)")
    parser.add_argument("--no-class-batch", dest="class_batch", action="store_false",
                        help="without the class batch graded by the real grader")
    parser.add_argument("--quick", action="store_true", help="one notebook, its device bugs only, no class batch")
    args = parser.parse_args()
    args.class_batch = args.class_batch and not args.quick
    why_not = refusal(args)
    if why_not:
        print(f"error: {why_not}", file=sys.stderr)
        return 2
    started = time.monotonic()
    env = environment()
    cuda = env["cuda"] is not None
    slugs = args.notebooks or (QUICK if args.quick else notebook_run.slugs())
    models = {slug: {c.grade_id: notebook_run.model_solution(c.source) for c in notebook_run.cells(slug)
                     if c.kind == "answer"} for slug in slugs}
    todo = tasks(slugs, cuda, args.quick, args.class_batch)
    print(f"gpu-check: {len(todo)} tasks, {args.jobs} at a time, a {args.budget:.0f} s budget; {env['device']}; "
          f"the report: {args.out / 'report.md'}", flush=True)
    report = schedule(todo, args, models, cuda, Report(args, env, todo, started))
    state = "complete" if report["complete"] else f"{len(report['not_run'])} task(s) left out for time"
    print(f"gpu-check: {state}; {len(report['problems'])} problem(s); {report['seconds']:.0f} s", flush=True)
    for problem in report["problems"]:
        print(f"  - {problem}", flush=True)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
