"""`make gpu-check`: the course's CUDA path, checked on a GPU machine that has only python3 and torch.

In one command (about 6 minutes on one H100 and 16 cores) it
1. runs every notebook top to bottom with the model answers, cells in order in one
   interpreter (bench/notebook_run.py: no Jupyter), and reports each cell's status;
2. grades every known answer of every exercise the same way (tests/answers, the device bugs
   of tests/answers/devices.py included): a wrong answer must lose its exercise's points, a
   right one keep them; device bugs run with CUDA and with CUDA hidden, which tells the run
   that catches each (meta, CUDA or both);
3. grades a small class batch with the real grader, sandbox on, the GPU passed in, and
   compares its scores with a CPU run of the same batch (bench/gpu_grade.py), where the
   grader's dependencies were carried (`make gpu-wheels`); else it says why it skipped that;
4. times each notebook's checks with CUDA hidden (CPU only) and with CUDA (CPU + CUDA).
Without CUDA it runs what it can and lists what it skipped. The report: OUT/report.json and
OUT/report.md. Exit status 1 when something is wrong (skips are not).

    python3 bench/gpu_check.py OUT [--notebooks SLUG ...] [--quick] [--jobs N]

--quick: notebook 03 only, its device bugs only, no class batch (what `make test` runs).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import notebook_run

REPO = notebook_run.REPO
sys.path.insert(0, str(REPO / "tests"))

from answers import for_notebook  # noqa: E402  (tests/answers: plain Python, no test dependencies)

QUICK = ["03_function_basics"]
RUN_TIMEOUT = 120  # seconds one notebook may take (the grader's default); then its unfinished cells score 0
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}  # torch then sees no GPU: the checks run on the CPU (and meta)


@dataclass
class Task:
    slug: str
    name: str  # model, model-cpu, or the submission: wrong0, right0, device0, ...
    answers: list = field(default_factory=list)  # answers.Answer carried, one per exercise at most
    cpu_only: bool = False
    result: dict | None = None
    error: str = ""


def packed(name: str, answers: list) -> list[tuple[str, list]]:
    """Submission k carries the k-th answer of each exercise (as tests/grading.py packs them)."""
    by_exercise: dict[str, list] = {}
    for answer in answers:
        by_exercise.setdefault(answer.exercise, []).append(answer)
    rows = itertools.zip_longest(*by_exercise.values())
    return [(f"{name}{k}", [a for a in row if a is not None]) for k, row in enumerate(rows)]


def tasks(slugs: list[str], cuda: bool, quick: bool) -> list[Task]:
    found = []
    for slug in slugs:
        found.append(Task(slug, "model"))
        if cuda:
            found.append(Task(slug, "model-cpu", cpu_only=True))
        known = for_notebook(slug)
        device = [a for a in known.MUTANTS if a.device]
        groups = [("device", device)]
        if not quick:
            groups += [("wrong", [a for a in known.MUTANTS if not a.device]), ("right", known.VARIANTS)]
        for kind, answers in groups:
            for name, carried in packed(kind, answers):
                found.append(Task(slug, name, carried))
                if kind == "device" and cuda:
                    found.append(Task(slug, name + "-cpu", carried, cpu_only=True))
    return found


def run(task: Task, models: dict[str, dict[str, str]]) -> Task:
    """One notebook in a fresh interpreter (no state passes between submissions)."""
    env = {**os.environ, **(CPU_ONLY if task.cpu_only else {})}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        model = models[task.slug]
        json.dump({a.exercise: a.apply(model[a.exercise]) for a in task.answers}, f)
        f.flush()
        try:
            done = subprocess.run([sys.executable, str(Path(notebook_run.__file__)), task.slug, f.name],
                                  capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
            stdout = done.stdout
            problem = f"exit {done.returncode}: {done.stderr.strip()[-600:]}" if done.returncode else ""
        except subprocess.TimeoutExpired as stopped:
            stdout = stopped.stdout.decode() if isinstance(stopped.stdout, bytes) else stopped.stdout or ""
            problem = f"stopped after {RUN_TIMEOUT} s: the cells it did not finish score 0"
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    task.error = problem
    if lines:
        task.result = {**lines[0], "cells": [line["cell"] for line in lines[1:] if "cell" in line]}
    return task


def scores(task: Task, exercise: notebook_run.Exercise) -> tuple[float, float, list[str]]:
    """(score, total, the errors of its failed graded cells) of one exercise in a run; a cell
    the run did not reach scores 0."""
    ran = {c["grade_id"]: c for c in task.result["cells"]}
    points = {c.grade_id: c.points for c in notebook_run.cells(task.slug) if c.grade_id in exercise.graded}
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
    """Everything the report says, from the runs."""
    by = {(t.slug, t.name): t for t in found}
    notebooks, answers, devices, problems = [], [], [], []
    for slug in dict.fromkeys(t.slug for t in found):
        exercises = notebook_run.exercises(notebook_run.cells(slug))
        model, model_cpu = by[(slug, "model")], by.get((slug, "model-cpu"))
        if model.error or model.result is None:
            problems.append(f"{slug}: the notebook did not run to its end ({model.error or 'no output'})")
        if model.result is None:
            continue
        cells = model.result["cells"]
        for c in cells:
            if c["status"] == "failed":
                problems.append(f"{slug} cell {c['index']} ({c['kind']} {c['grade_id']}): {c['error'][:300]}")
            elif c["points"] and c["score"] < c["points"]:
                problems.append(f"{slug} {c['grade_id']}: the model answer got {c['score']}/{c['points']}: "
                                f"{c['error'][:300]}")
        notebooks.append({
            "notebook": slug,
            "cells": len(cells),
            "ok": sum(c["status"] == "ok" for c in cells),
            "failed": sum(c["status"] == "failed" for c in cells),
            "skipped": [f"cell {c['index']}: {c['error']}" for c in cells if c["status"] == "skipped"],
            "model_points": [sum(c["score"] for c in cells), sum(c["points"] for c in cells)],
            "checks_s_cpu_only": _check_seconds(model_cpu if cuda else model),
            "checks_s_with_cuda": _check_seconds(model) if cuda else None,
            "meta_not_checked": sorted({c["grade_id"] for c in cells if "meta device: not checked" in c["output"]}),
        })
        counts = {"wrong": [0, 0], "right": [0, 0]}
        for task in (t for t in found if t.slug == slug and t.answers and not t.name.endswith("-cpu")):
            if task.result is None:
                problems.append(f"{slug} {task.name}: did not run ({task.error})")
                continue
            for answer in task.answers:
                exercise = next(e for e in exercises if e.answer_id == answer.exercise)
                score, total, errors = scores(task, exercise)
                if task.name.startswith("device"):
                    cpu_run = by.get((slug, task.name + "-cpu"))
                    row = _device_row(slug, answer, score < total, errors, cpu_run, exercise, cuda)
                    devices.append(row)
                    if row["verdict"] != "ok" and not row["verdict"].startswith("skipped"):
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
        answers.append({"notebook": slug, "wrong_losing": counts["wrong"], "right_keeping": counts["right"]})
    return {"notebooks": notebooks, "answers": answers, "devices": devices, "problems": problems}


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
        if cpu_run is None or cpu_run.result is None:
            row["cpu_only_run"] = f"did not run ({cpu_run.error if cpu_run else 'missing'})"
            cpu_lost, cpu_errors = None, []
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


def environment() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "device": torch.cuda.get_device_name() if cuda else "no CUDA device",
        "cores": os.cpu_count(),
    }


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"# gpu-check, {report['date']}",
        "",
        f"python {env['python']}, torch {env['torch']}, {env['device']}"
        + (f" (CUDA {env['cuda']})" if env["cuda"] else "") + f", {env['cores']} cores; "
                                                              f"{report['seconds']:.0f} s in all.",
        "",
        "| notebook | cells ok | failed | skipped | model points | checks s, CPU only | checks s, CPU + CUDA | "
        "meta not checked |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in report["notebooks"]:
        cuda = "skipped: no CUDA" if n["checks_s_with_cuda"] is None else f"{n['checks_s_with_cuda']:.2f}"
        lines.append(f"| {n['notebook']} | {n['ok']}/{n['cells']} | {n['failed']} | {len(n['skipped'])} | "
                     f"{n['model_points'][0]:g}/{n['model_points'][1]:g} | {n['checks_s_cpu_only']} | {cuda} | "
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
    lines += ["", "## Class batch with the real grader", "", grading.get("table") or f"Skipped: {grading['skipped']}"]
    lines += ["", "## Skipped", ""] + ([f"- {s}" for s in report["skipped"]] or ["- nothing"])
    lines += ["", "## Problems", ""] + ([f"- {p}" for p in report["problems"]] or ["- none"])
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for report.json and report.md")
    parser.add_argument("--notebooks", nargs="*", help="slugs (default: all; --quick: 03_function_basics)")
    parser.add_argument("--quick", action="store_true", help="one notebook, its device bugs only, no class batch")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="notebooks run at once")
    args = parser.parse_args()
    started = time.monotonic()
    env = environment()
    cuda = env["cuda"] is not None
    slugs = args.notebooks or (QUICK if args.quick else notebook_run.slugs())
    models = {slug: {c.grade_id: notebook_run.model_solution(c.source) for c in notebook_run.cells(slug)
                     if c.kind == "answer"} for slug in slugs}
    todo = tasks(slugs, cuda, args.quick)
    with ThreadPoolExecutor(args.jobs) as pool:
        found = list(pool.map(lambda task: run(task, models), todo))
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "environment": env, **judge(found, cuda)}
    skipped = [] if cuda else ["every CUDA run (no CUDA device): the checks ran on the CPU and the meta device only; "
                               "device bugs that only a GPU catches were not graded"]
    if args.quick:
        skipped.append("--quick: the other notebooks, the answers that are not device bugs, the class batch")
    skipped += [f"{n['notebook']} {s}" for n in report["notebooks"] for s in n["skipped"]]
    if args.quick:
        report["grading"] = {"skipped": "--quick"}
    else:
        import gpu_grade

        report["grading"] = gpu_grade.compare(args.out, cuda)
    if "skipped" in report["grading"]:
        skipped.append(f"the class batch with the real grader: {report['grading']['skipped']}")
    report["problems"] += report["grading"].get("problems", [])
    report["skipped"] = skipped
    report["seconds"] = time.monotonic() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "report.md").write_text(markdown(report))
    print(markdown(report))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
