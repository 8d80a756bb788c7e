"""Run-All time of every notebook, as a student meets it: a fresh kernel runs the solved
notebook top to bottom (setup cell, demonstrations, answers, checks, hidden checks).

Reports the kernel's start, the cells' wall time and the whole, per notebook, against the
course's budget of 30 s on a CPU. Prints a markdown table and writes it to bench/results/.

    .venv/bin/python bench/run_all.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from publish import publish  # noqa: E402  (bench/ is the script's own folder)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autograder import authoring  # noqa: E402

BUDGET = 30.0  # seconds of Run-All per notebook on a CPU (the course's promise)


def run_all(slug: str) -> tuple[float, float, list[str]]:
    """(kernel start s, cells s, errors) of one Run-All of a solved notebook."""
    nb = nbformat.read(authoring.solution_path(slug), as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(authoring.solution_path(slug).parent)}})
    started = time.monotonic()
    with client.setup_kernel():
        ready = time.monotonic()
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        done = time.monotonic()
    errors = [o.get("ename",
                    "") for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    return ready - started, done - ready, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per notebook (the median is reported)")
    args = parser.parse_args()
    lines = [
        f"# Run-All per notebook, {datetime.now():%Y-%m-%d %H:%M}",
        "",
        f"Solved notebooks in a fresh python3 kernel each, median of {args.repeat} runs; budget {BUDGET:g} s.",
        "",
        "| notebook | kernel start s | cells s | Run-All s | within budget |",
        "|---|---|---|---|---|",
    ]
    for slug in authoring.assignments():
        runs = [run_all(slug) for _ in range(args.repeat)]
        errors = sorted({e for _, _, found in runs for e in found})
        start, cells = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        verdict = "yes" if start + cells < BUDGET else "**no**"
        lines.append(f"| {slug} | {start:.2f} | {cells:.1f} | {start + cells:.1f} | {verdict}"
                     + (f" (errors: {', '.join(errors)})" if errors else "") + " |")
        print(lines[-1], file=sys.stderr)
    publish("\n".join(lines), "run-all")


if __name__ == "__main__":
    main()
