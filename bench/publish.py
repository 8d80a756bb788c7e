"""Where the benchmarks put their tables: stdout, and a dated file in bench/results/."""
from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def publish(text: str, name: str) -> Path:
    print(text)
    out = RESULTS / f"{name}-{datetime.now():%Y%m%d-%H%M%S}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text + "\n")
    print(f"\nwritten to {out}", file=sys.stderr)
    return out
