"""gpu-check, part 3: a class batch graded by the real grader (`autograder grade`, sandbox on,
the GPU passed in), then graded again with CUDA hidden, and the two compared.

The GPU machine has no nbgrader, IPython, typer or rich, perhaps no bubblewrap, and reaches
no package registry. `make gpu-wheels` downloads their wheels (the list: bench/gpu_wheels.txt,
pinned by constraints.txt, for CPython 3.12.3 on x86-64 Linux) into build/gpu-check/wheels,
and Debian's bwrap into build/gpu-check/bin: an ignored folder carried with the working tree.
There the wheels are installed offline in a throwaway virtual environment that also has the
machine's own torch and numpy; gpu_check.py refuses to start without them (`missing`).

    python3 bench/gpu_grade.py --download [--python-version 3.12.3]   # make gpu-wheels
    python3 bench/gpu_grade.py --batch OUT WORK [--cuda]              # what gpu_check.py runs
"""
from __future__ import annotations

import argparse
import glob
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CARRIED = REPO / "build" / "gpu-check"  # what `make gpu-wheels` makes, carried to the GPU machine
WHEELS = CARRIED / "wheels"
BWRAP = CARRIED / "bin" / "bwrap"
PACKAGES = Path(__file__).with_name("gpu_wheels.txt")
SLUG = "03_function_basics"  # quick to grade, with device bugs of every kind
MAX_MIB = 56  # of wheels: the GPU machine receives 64 MiB with the working tree (about 3)
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}
# The batch takes about as long as this many runs of its notebook by gpu_check.py (measured on
# 2 busy cores: 339-362 s, against 32-37 s for the slowest of them): it starts only where that fits.
RUNS = 12


def download(python_version: str) -> None:
    """The wheels of bench/gpu_wheels.txt (no dependencies beyond it) for CPython `python_version`."""
    shutil.rmtree(CARRIED, ignore_errors=True)
    WHEELS.mkdir(parents=True)
    major_minor = ".".join(python_version.split(".")[:2])  # a micro version too: some wheels require 3.11.5+
    tag = major_minor.replace(".", "")
    platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    f"--python-version={python_version}", "--implementation=cp", f"--abi=cp{tag}", "--abi=abi3",
                    "--abi=none", *platforms, "-c", str(REPO / "constraints.txt"), "-r", str(PACKAGES),
                    "-d", str(WHEELS)], check=True)
    (WHEELS / "python-version").write_text(major_minor + "\n")
    mib = sum(p.stat().st_size for p in WHEELS.iterdir()) / 2**20
    print(f"{len(list(WHEELS.glob('*.whl')))} wheels, {mib:.1f} MiB, in {WHEELS.relative_to(REPO)}")
    if mib > MAX_MIB:
        raise SystemExit(f"error: more than {MAX_MIB} MiB: too large to carry to the GPU machine")
    _download_bubblewrap()


def _download_bubblewrap() -> None:
    """Debian's bwrap binary (it needs only libc, libcap, libselinux and libpcre2, which any
    Debian or Ubuntu has): the GPU machine may have no bubblewrap, and the batch is sandboxed."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        print("no apt-get here: bubblewrap not carried (the GPU machine must have its own)")
        return
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(["apt-get", "download", "--quiet", "bubblewrap"], cwd=folder, check=True, capture_output=True)
        (deb,) = Path(folder).glob("bubblewrap_*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), folder], check=True)
        BWRAP.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(folder, "usr", "bin", "bwrap"), BWRAP)
        print(f"{BWRAP.relative_to(REPO)}: from {deb.name}")


def bubblewrap() -> tuple[str | None, str]:
    """(the bwrap to sandbox with, "") or (None, why there is none): the one carried
    (build/gpu-check/bin) where it runs here, else the machine's own."""
    carried = ""
    if BWRAP.exists():
        tried = subprocess.run([str(BWRAP), "--version"], capture_output=True, text=True)
        if tried.returncode == 0:
            return str(BWRAP), ""
        carried = f"the one carried does not run ({tried.stderr.strip()[-200:] or tried.returncode}), "
    found = shutil.which("bwrap")
    if found:
        return found, ""
    return None, (f"no bubblewrap (bwrap) here: {carried or f'none carried in {BWRAP.parent.relative_to(REPO)}, '}"
                  f"none installed (make gpu-wheels, on Debian or Ubuntu)")


def missing() -> str | None:
    """What the class batch lacks on this machine (one line), or None."""
    wanted = (WHEELS / "python-version").read_text().strip() if (WHEELS / "python-version").exists() else None
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if wanted is None:
        return (f"no wheels in {WHEELS.relative_to(REPO)} for the class batch: run `make gpu-wheels` where PyPI is "
                f"reached, and carry {CARRIED.relative_to(REPO)}")
    if wanted != here:
        return (f"the wheels in {WHEELS.relative_to(REPO)} are for Python {wanted}, this is Python {here}: "
                f"make gpu-wheels ARGS=\"--python-version {platform.python_version()}\"")
    return bubblewrap()[1] or None


def batch(out: Path, work: Path, cuda: bool) -> dict:
    """Grade the batch on the GPU and on the CPU, in `work` (which the caller removes, also when it
    stops this for time); {"table", "problems", ...}, or {"skipped": why}."""
    started = time.monotonic()
    python, how = _environment(work / "venv")
    if python is None:
        return {"skipped": how, "problems": ["the class batch could not be graded"]}
    prepared = time.monotonic() - started
    path = os.pathsep.join([str(Path(bubblewrap()[0] or "bwrap").parent), os.environ.get("PATH", "")])
    done = subprocess.run([python, __file__, "--inside", str(work / "course"), str(cuda)], capture_output=True,
                          text=True, env={**os.environ, "PATH": path})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"skipped": f"grading failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}",
                "problems": ["the class batch could not be graded"]}
    graded = json.loads(lines[-1])
    graded["environment"] = {"seconds": round(prepared, 1), "torch": how}
    (out / "grading.json").write_text(json.dumps(graded, indent=1) + "\n")
    return _judged(graded, cuda)


def requirements(names: list[str]) -> set[str]:
    """The distributions installed here that `names` need, themselves included (extras aside)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        key = _key(dist.metadata["Name"])
        if key not in seen:
            seen.add(key)
            todo += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in dist.requires or [] if "extra ==" not in r]
    return seen


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _environment(venv: Path) -> tuple[str | None, str]:
    """A virtual environment with the carried wheels and this repository, over the machine's
    own torch and numpy; (its python, how it has torch) or (None, why not)."""
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True,
                          text=True)
    if made.returncode != 0:  # no ensurepip: the machine's own pip installs into it
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip"] if made.returncode == 0 else [sys.executable, "-m", "pip", "--python", python]
    wheels = sorted(glob.glob(str(WHEELS / "*.whl")))
    installed = subprocess.run([*pip, "install", "--quiet", "--no-index", "--no-deps", "--no-compile", *wheels],
                               capture_output=True, text=True)
    if installed.returncode != 0:
        return None, f"the carried wheels did not install: {installed.stderr.strip()[-500:]}"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "autograd_course.pth").write_text(str(REPO) + "\n")  # this checkout, as an editable install
    return python, with_own(["torch", "numpy"], python, site)


def with_own(names: list[str], python: str, site: Path) -> str:
    """This interpreter's `names` in the new environment at `python`, and how. Where this
    interpreter is itself a virtual environment (the GPU machine's python3 is), the new one does
    not see its packages: the distributions it lacks are linked in file by file (hard links, else
    copies), since the sandbox shows the new environment, not this one."""
    if subprocess.run([python, "-c", f"import {', '.join(names)}"], capture_output=True).returncode == 0:
        return "seen through the system's site-packages"
    present = {_key(d.metadata["Name"]) for d in importlib.metadata.distributions(path=[str(site)])}
    linked = copied = 0
    wanted = requirements(names) - present
    for name in sorted(wanted):
        dist = importlib.metadata.distribution(name)
        for file in dist.files or []:
            source, target = Path(str(dist.locate_file(file))), site / file
            if file.parts[0] == ".." or not source.is_file() or target.exists():
                continue  # its scripts; what the wheels brought
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:  # another file system
                shutil.copy2(source, target)
                copied += 1
            linked += 1
    return f"linked in: {linked} files of {len(wanted)} distributions ({copied} copied)"


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
    parser.add_argument("--python-version", default="3.12.3", help="of the GPU machine's python3")
    parser.add_argument("--batch", nargs=2, type=Path, metavar=("OUT", "WORK"),
                        help="grade the batch in the folder WORK; its judgement as JSON")
    parser.add_argument("--cuda", action="store_true", help="with --batch: the GPU run has CUDA")
    parser.add_argument("--inside", nargs=2, metavar=("ROOT", "CUDA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(Path(args.inside[0]), args.inside[1] == "True")
    elif args.batch:
        print(json.dumps(batch(*args.batch, args.cuda)), flush=True)
    elif args.download:
        download(args.python_version)
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
