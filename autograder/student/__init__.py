"""What the first cell of every notebook calls."""
from __future__ import annotations

import torch

from . import devices, report, summary


def setup(seed: int = 0) -> None:
    """Seed the examples, and say where the checks will run."""
    torch.manual_seed(seed)
    # Checks run many tiny operations; with several threads each one waits on the thread
    # pool, which made them 10-40x slower on a busy 2-core machine.
    torch.set_num_threads(1)
    report.name_errors_in_one_line(summary.is_check_cell)  # a check of an answer not run says so in one line
    report.hidden_cells_in_kernel()  # a hidden test cell run here shows no hidden input either
    print(f"torch {torch.__version__}; {devices.where()}.")
