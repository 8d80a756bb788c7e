"""What a notebook's code does that earns it nothing, yet is worth a person's look: a trace
or profile function installed (which would see, and could change, what the grader's
probes compute), the interpreter's frames reached (`sys._getframe`, `inspect.stack`, a
traceback's or generator's frame).

Watched in a grading child from before the first cell with an audit hook, which nothing
can remove (PEP 578), and reported before each test cell is judged; a trace or profile
function found then is removed. Only calls made by the notebook's own cells count (the
code IPython compiled from them), not those of torch or IPython. Best effort: the
notebook's code shares the process.
"""
from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any

CELL_FILES = "<ipython-input-"  # the file name IPython gives a cell's code
FRAMES = {"sys._getframe": "sys._getframe (or inspect's frame functions)", "sys._current_frames": "sys._current_frames"}
FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}
TRACING = {"sys.settrace": "installs a trace function", "sys.setprofile": "installs a profile function"}
HELPERS = {"inspect", "traceback", "threading"}
COURSE = "autograder.student."  # the course's own tracers live here  # the standard library's ways to the same calls

_seen: dict[str, None] = {}
_busy = threading.local()  # a thread inside the hook: what the hook itself does is not seen


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event in FRAMES:
        what = f"reaches the interpreter's frames with {FRAMES[event]}"
    elif event == "object.__getattr__" and len(args) == 2 and args[1] in FRAME_ATTRIBUTES:
        what = f"reaches the interpreter's frames through .{args[1]}"
    elif event in TRACING and not _stopping_the_courses_tracer(event):
        what = TRACING[event]
    else:
        return
    if getattr(_busy, "inside", False):
        return
    _busy.inside = True
    try:
        caller: FrameType | None = sys._getframe(1)
        while caller is not None and caller.f_globals.get("__name__") in HELPERS:
            caller = caller.f_back  # inspect.stack() and the like: who called them
        if caller is not None and caller.f_code.co_filename.startswith(CELL_FILES):
            cell = caller.f_code.co_filename[len(CELL_FILES):].split("-")[0]
            _seen[f"the notebook's code {what} (In [{cell}], line {caller.f_lineno})"] = None
    finally:
        _busy.inside = False


def _stopping_the_courses_tracer(event: str) -> bool:
    """Python switches off a trace function that raised with an audited settrace, in the
    frame it was tracing: the course's recursion watch stopping a student's recursion
    (student/tape.py) is not the notebook's doing. (Code that removes that watch is named
    by the watch itself.)"""
    current = sys.gettrace() if event == "sys.settrace" else sys.getprofile()
    owner = getattr(current, "__self__", None)
    return owner is not None and type(owner).__module__.startswith(COURSE)


def watch() -> None:
    """Start watching (in a grading child, before any of the notebook's code runs)."""
    sys.addaudithook(_hook)


def take() -> list[str]:
    """What was seen since the last call, and the trace and profile functions installed now
    (removed: the grader's probes run next)."""
    found = list(_seen)
    _seen.clear()
    for kind, installed, remove in (("trace", sys.gettrace(), sys.settrace),
                                    ("profile", sys.getprofile(), sys.setprofile),
                                    ("thread trace", threading._trace_hook,  # type: ignore[attr-defined]
                                     threading.settrace),
                                    ("thread profile", threading._profile_hook,
                                     threading.setprofile)):
        if installed is not None:
            found.append(f"a {kind} function was installed "
                         f"({getattr(installed, '__qualname__', type(installed).__name__)})")
            remove(None)
    return found
