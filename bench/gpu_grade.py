"""gpu-check, part 3: a class batch graded by the real grader (`autograder grade`, sandbox on,
the GPU passed in), then graded again with CUDA hidden, and the two compared.

The GPU machine has no nbgrader, IPython, typer or rich, and reaches no package registry.
`make gpu-wheels` downloads their wheels (the list: bench/gpu_wheels.txt, pinned by
constraints.txt, for CPython 3.12 on x86-64 Linux) into build/gpu-check/wheels, an ignored
folder carried with the working tree; here they are installed offline in a throwaway virtual
environment that also sees the machine's own torch and numpy. Without them this part is
skipped, with the reason.

    python3 bench/gpu_grade.py --download [--python-version 3.12]   # make gpu-wheels
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEELS = REPO / "build" / "gpu-check" / "wheels"
PACKAGES = Path(__file__).with_name("gpu_wheels.txt")
SLUG = "03_function_basics"  # quick to grade, with device bugs of every kind
MAX_MIB = 56  # of wheels: the GPU machine receives 64 MiB with the working tree (about 3)
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def download(python_version: str) -> None:
    """The wheels of bench/gpu_wheels.txt (no dependencies beyond it) for CPython `python_version`."""
    shutil.rmtree(WHEELS, ignore_errors=True)
    WHEELS.mkdir(parents=True)
    tag = python_version.replace(".", "")
    platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    f"--python-version={python_version}", "--implementation=cp", f"--abi=cp{tag}", "--abi=abi3",
                    "--abi=none", *platforms, "-c", str(REPO / "constraints.txt"), "-r", str(PACKAGES),
                    "-d", str(WHEELS)], check=True)
    (WHEELS / "python-version").write_text(python_version + "\n")
    mib = sum(p.stat().st_size for p in WHEELS.iterdir()) / 2**20
    print(f"{len(list(WHEELS.glob('*.whl')))} wheels, {mib:.1f} MiB, in {WHEELS.relative_to(REPO)}")
    if mib > MAX_MIB:
        raise SystemExit(f"error: more than {MAX_MIB} MiB: too large to carry to the GPU machine")


def compare(out: Path, cuda: bool) -> dict:
    """Grade the batch on the GPU and on the CPU; {"table", "problems", ...} or {"skipped": why}."""
    wanted = (WHEELS / "python-version").read_text().strip() if (WHEELS / "python-version").exists() else None
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if wanted is None:
        return {"skipped": f"the grader's dependencies were not carried (no wheels in "
                           f"{WHEELS.relative_to(REPO)}: run `make gpu-wheels` where PyPI is reached, and carry it)"}
    if wanted != here:
        return {"skipped": f"the wheels carried are for Python {wanted}, this is Python {here}"}
    if shutil.which("bwrap") is None:
        return {"skipped": "bubblewrap (bwrap) is not installed here, so the sandbox cannot be on"}
    work = Path(tempfile.mkdtemp(prefix="gpu-grade-"))
    try:
        python, why = _environment(work / "venv")
        if python is None:
            return {"skipped": why}
        done = subprocess.run([python, __file__, "--inside", str(work / "course"), str(cuda)],
                              capture_output=True, text=True, timeout=400)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            return {"skipped": f"grading failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}",
                    "problems": ["the class batch could not be graded"]}
        graded = json.loads(lines[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "grading.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "grading.json").write_text(json.dumps(graded, indent=1) + "\n")
    return _judged(graded, cuda)


def _environment(venv: Path) -> tuple[str | None, str]:
    """A virtual environment with the carried wheels and this repository, over the machine's
    own packages (torch, numpy); (its python, "") or (None, why not)."""
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True,
                          text=True)
    if made.returncode != 0:  # no ensurepip: the machine's own pip installs into it
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip"] if made.returncode == 0 else [sys.executable, "-m", "pip", "--python", python]
    wheels = sorted(glob.glob(str(WHEELS / "*.whl")))
    installed = subprocess.run([*pip, "install", "--quiet", "--no-index", "--no-deps", *wheels],
                               capture_output=True, text=True)
    if installed.returncode != 0:
        return None, f"the carried wheels did not install: {installed.stderr.strip()[-500:]}"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "autograd_course.pth").write_text(str(REPO) + "\n")  # this checkout, as an editable install
    return python, ""


def _judged(graded: dict, cuda: bool) -> dict:
    """The table, and what disagrees with the answers' expectations."""
    problems = []
    rows = ["| student | carries | GPU run | CPU run | expected |", "|---|---|---|---|---|"]
    for student, sub in graded["students"].items():
        for exercise, (on_gpu, on_cpu, total) in sub["exercises"].items():
            answer = sub["answers"].get(exercise)
            if answer is None and student != "correct":
                continue
            kind, device = (answer or {}).get("kind", "model"), (answer or {}).get("device")
            # A wrong answer loses its points in every run, except a device bug only CUDA catches, without CUDA.
            full_gpu, full_cpu = (kind != "wrong" or (device == "cuda" and not visible) for visible in (cuda, False))
            expected = f"{'full' if full_gpu else 'less'} / {'full' if full_cpu else 'less'}"
            got = [on_gpu == total, on_cpu == total]
            if got != [full_gpu, full_cpu]:
                problems.append(f"class batch: {student} {exercise}: {on_gpu:g} (GPU) / {on_cpu:g} (CPU) of {total:g}, "
                                f"expected {expected}")
            label = (answer or {}).get("label", "model answer")
            rows.append(f"| {student} | {exercise}: {label}{f' ({device})' if device else ''} | {on_gpu:g}/{total:g} | "
                        f"{on_cpu:g}/{total:g} | {expected} |")
    head = (f"{graded['slug']}, {len(graded['students'])} submissions; GPU run: {graded['gpu']['isolation']} "
            f"({graded['gpu']['seconds']:.0f} s); CPU run (CUDA hidden): {graded['cpu']['isolation']} "
            f"({graded['cpu']['seconds']:.0f} s).")
    return {"table": head + "\n\n" + "\n".join(rows), "problems": problems}


def inside(root: Path, cuda: bool) -> None:
    """In the virtual environment: the batch, graded twice; prints the scores as JSON."""
    import time

    sys.path[:0] = [str(REPO / "tests"), str(REPO / "bench")]
    import nbformat

    import gpu_check
    from answers import for_notebook
    from autograder import authoring
    from grading import Course, exercises

    root.mkdir(parents=True)
    course = Course(root, [SLUG])
    found = exercises(nbformat.read(authoring.solution_path(SLUG), as_version=4))
    model = {e.answer_id: e.solution for e in found}
    known = for_notebook(SLUG)
    device = [a for a in known.MUTANTS if a.device]
    batch = {"correct": []}
    batch.update(gpu_check.packed("device", device))
    batch.update(gpu_check.packed("wrong", [a for a in known.MUTANTS if not a.device])[:1])  # one of each exercise
    batch.update(gpu_check.packed("right", known.VARIANTS)[:1])
    for student, answers in batch.items():
        course.submit(student, SLUG, {**model, **{a.exercise: a.apply(model[a.exercise]) for a in answers}})
    runs = {}
    for name, env in (("gpu", {}), ("cpu", CPU_ONLY)):
        command = [sys.executable, "-c", "from autograder.cli import app; app()", "grade", SLUG, "--force"]
        started = time.monotonic()
        done = subprocess.run(command + (["--gpu"] if cuda and name == "gpu" else []), cwd=root,
                              capture_output=True, text=True, timeout=180, env={**os.environ, **env})
        if done.returncode != 0:
            raise SystemExit(f"autograder grade ({name}) failed: {done.stderr[-2000:]}")
        said = " ".join(line.strip(" │") for line in done.stderr.splitlines())  # the summary, unwrapped
        isolation = re.search(r"(bubblewrap sandbox|NO SANDBOX)[^()]*(\([^)]*\))?", said)
        runs[name] = {"seconds": time.monotonic() - started, "isolation": isolation[0] if isolation else "?",
                      "scores": {s: course.scores(SLUG, s) for s in batch}}
    students = {}
    for student, answers in batch.items():
        carried = {a.exercise: {"label": a.label, "device": a.device,
                                "kind": "wrong" if student.startswith(("device",
                                                                       "wrong")) else "right"} for a in answers}
        students[student] = {"answers": carried, "exercises": {
            e.answer_id: [sum(runs[r]["scores"][student][g][0] for g in e.graded) for r in ("gpu", "cpu")]
            + [sum(runs["gpu"]["scores"][student][g][1] for g in e.graded)] for e in found}}
    print(json.dumps({"slug": SLUG, "students": students, **{r: {k: v for k, v in runs[r].items() if k != "scores"}
                                                             for r in runs}}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--download", action="store_true", help="download the wheels (make gpu-wheels)")
    parser.add_argument("--python-version", default="3.12", help="of the GPU machine's python3")
    parser.add_argument("--inside", nargs=2, metavar=("ROOT", "CUDA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(Path(args.inside[0]), args.inside[1] == "True")
    elif args.download:
        download(args.python_version)
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
