"""One lock for what a check computes with torch state that is global to the process.

The grader judges several notebooks at once, a thread for each worker. Forward-mode AD has
one level for the whole process (a second thread's `dual_level()` raises "Nested forward
mode AD is not supported"), and the default random generator is one for all threads (a
reference drawn after `torch.manual_seed(s)` would take numbers another thread draws too).
Such a computation runs under `process_wide` — never a request to the student's process,
which would hold the lock while the student's code runs.
"""
from __future__ import annotations

import threading

process_wide = threading.Lock()
