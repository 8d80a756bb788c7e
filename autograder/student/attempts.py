"""What a notebook's code does that earns it nothing, yet is worth a person's look: a trace
or profile function installed (which would see, and could change, what the grader's
probes compute); the interpreter's frames or objects reached (`sys._getframe`,
`inspect.stack`, a traceback's or generator's frame, `gc.get_objects`); C called through
ctypes; a signal handler installed (Python hands it the interpreter's frames); a process
still running when the grader's checks begin (it could compute a gradient out of the
watch's sight: it is ended then).

Watched in a grading child from before the first cell with an audit hook, which nothing
can remove (PEP 578), and reported before each test cell is judged; a trace or profile
function or a signal handler found then is removed. Only what the notebook's own code does
counts — code compiled from its cells or by it (`exec`, a file it wrote) — whether it
does it itself or through the ways the standard library offers to the same thing
(`inspect.stack`, `logging.currentframe`, a thread pool that calls them); not what a
library does for its own reasons (printing, formatting or logging a traceback, a
warning, a debugger's post-mortem, IPython's error display, typing's and enum's look at
their caller's module). Best effort: the notebook's code shares the process.
"""
from __future__ import annotations

import glob
import inspect
import logging
import os
import signal
import sys
import sysconfig
import threading
import traceback
from types import CodeType, FrameType
from typing import Any

CELL_FILES = "<ipython-input-"  # the file name IPython gives a cell's code
FRAMES = {"sys._getframe": "sys._getframe", "sys._current_frames": "sys._current_frames"}
FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}
OBJECTS = {"gc.get_objects", "gc.get_referrers", "gc.get_referents"}
TRACING = {"sys.settrace": "installs a trace function", "sys.setprofile": "installs a profile function"}
STARTS = {"os.fork", "os.forkpty", "os.posix_spawn", "os.system", "os.exec", "subprocess.Popen", "pty.spawn"}
# The standard library's functions that hand the interpreter's frames to their caller: the
# notebook's code calling one reaches frames as surely as with sys._getframe. (The
# traceback module's printing and formatting only read an exception's own frames.)
GIVERS: dict[CodeType, str] = {f.__code__: name for f, name in (
    (inspect.currentframe, "inspect.currentframe"), (inspect.stack, "inspect.stack"), (inspect.trace, "inspect.trace"),
    (inspect.getinnerframes, "inspect.getinnerframes"), (traceback.walk_stack, "traceback.walk_stack"),
    (traceback.walk_tb, "traceback.walk_tb"), (logging.currentframe, "logging.currentframe"))}
# Modules that only pass on what they are asked to call (a thread, a pool, a partial), and
# those through which the notebook reaches C or starts a process.
FORWARDERS = ("threading", "concurrent.futures", "functools", "contextlib")
THROUGH = {"ctypes": ("ctypes",), "process": ("subprocess", "multiprocessing", "os", "pty", "concurrent.futures")}
COURSE = "autograder.student."  # the course's own tracers live here
_PR_SET_CHILD_SUBREAPER = 36

_seen: dict[str, None] = {}
_watching = False  # in a grading child (watch() was called)
_started = 0  # processes the notebook's code started, ever (introspect.AutogradWatch reads it)
_handlers: dict[int, Any] = {}  # each signal's handler when the watch began
_library_roots: tuple[str, ...] = ()
_library: dict[str, bool] = {}  # file name -> whether it is a library's (not the notebook's)
_busy = threading.local()  # a thread inside the hook: what the hook itself does is not seen


def _hook(event: str, args: tuple[Any, ...]) -> None:
    global _started
    if event in FRAMES:
        kind, what = "frames", f"reaches the interpreter's frames with {FRAMES[event]}"
    elif event == "object.__getattr__" and len(args) == 2 and args[1] in FRAME_ATTRIBUTES:
        kind, what = "frames", f"reaches the interpreter's frames through .{args[1]}"
    elif event in OBJECTS:
        kind, what = "objects", f"reaches the interpreter's objects with {event}"
    elif event.startswith("ctypes."):
        kind, what = "ctypes", "calls C functions with ctypes"
    elif event in STARTS:
        kind, what = "process", ""
    elif event in TRACING and not _stopping_the_courses_tracer(event):
        kind, what = "tracing", TRACING[event]
    else:
        return
    if getattr(_busy, "inside", False):
        return
    _busy.inside = True
    try:
        found = _asker(sys._getframe(1), kind)  # the frame that made the audited call
        if found is None:
            return
        where, via = found
        if kind == "process":
            _started += 1
        else:
            what = f"reaches the interpreter's frames with {via}" if via else what
            _seen[f"the notebook's code {what} ({where})"] = None
    finally:
        _busy.inside = False


def _asker(frame: FrameType | None, kind: str) -> tuple[str, str] | None:
    """Where the notebook's code asked for what `frame` does, and through which of the
    standard library's frame functions; None if a library does it for its own reasons."""
    via = ""
    while frame is not None and _is_library(frame.f_code.co_filename):
        module = str(frame.f_globals.get("__name__", ""))
        if kind == "frames" and frame.f_code in GIVERS:
            via = GIVERS[frame.f_code]
        elif not _within(module, FORWARDERS + THROUGH.get(kind, ())):
            return None
        frame = frame.f_back
    if frame is None:
        return "in a thread of its own", via
    return _place(frame), via


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _place(frame: FrameType) -> str:
    name = frame.f_code.co_filename
    if name.startswith(CELL_FILES):
        return f"In [{name[len(CELL_FILES):].split('-')[0]}], line {frame.f_lineno}"
    shown = name[:60] if name.startswith("<") else os.path.basename(name)[:60]
    return f"in code it compiled as {shown!r}, line {frame.f_lineno}"


def _is_library(filename: str) -> bool:
    """Code of Python, of an installed package or of the course (read-only when grading),
    not code compiled from the notebook or by it."""
    known = _library.get(filename)
    if known is None:
        known = _library[filename] = filename.startswith("<frozen ") or (
            not filename.startswith("<") and os.path.realpath(filename).startswith(_library_roots))
    return known


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
    global _library_roots, _watching
    paths = sysconfig.get_paths()
    course = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _library_roots = tuple(os.path.realpath(p) + os.sep for p in {
        paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"], course})
    _handlers.update({s: signal.getsignal(s) for s in _catchable()})
    if sys.platform.startswith("linux"):  # the notebook's orphans become this process's children
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _watching = True
    sys.addaudithook(_hook)


def started() -> int:
    """How many processes the notebook's code has started so far (only while watching)."""
    return _started


def take() -> list[str]:
    """What was seen since the last call, and what is installed or running now that the
    grader's probes must not meet: trace and profile functions, signal handlers, processes
    (removed, put back, ended)."""
    found = []
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
    end_processes()
    found = [*_seen, *found, *_restore_handlers()]
    _seen.clear()
    return found


def _catchable() -> list[signal.Signals]:
    return [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


def _restore_handlers() -> list[str]:
    """Put back each signal's handler as it was when the watch began (a handler is handed
    the frame it interrupts), and cancel the timers that would raise those signals."""
    found = []
    for number, before in _handlers.items():
        now = signal.getsignal(number)
        if callable(now) and now is not before and before is not None:
            signal.signal(number, before)
            found.append(f"a handler for {signal.Signals(number).name} was installed "
                         f"({getattr(now, '__qualname__', type(now).__name__)}): Python hands it the "
                         "interpreter's frames")
    if found:
        for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
            signal.setitimer(timer, 0)
    return found


def running() -> int:
    """How many processes the notebook has running now (only while watching)."""
    return sum(_name(pid) is not None for pid in _descendants(os.getpid())) if _watching else 0


def end_processes() -> None:
    """End every process the notebook left running (only while watching: in a grading
    child, where all of them are the notebook's), to be reported by `take`."""
    if not _watching:
        return
    running = [(pid, _name(pid)) for pid in _descendants(os.getpid())]
    running = [(pid, name) for pid, name in running if name is not None]
    for pid, _ in running:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid, _ in running:  # children first: their children are this process's once they die
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    for _, name in running:
        _seen[f"a process it started was still running when the grader's checks began ({name}): ended"] = None


def _descendants(pid: int) -> list[int]:
    """Every living process below `pid`, children before their children."""
    found: list[int] = []
    level = [pid]
    while level:
        level = [int(child) for parent in level for tasks in glob.glob(f"/proc/{parent}/task/*/children")
                 for child in _read(tasks).split()]
        found += level
    return found


def _name(pid: int) -> str | None:
    """A running process's command name; None for one that has ended (a zombie, or gone)."""
    stat = _read(f"/proc/{pid}/stat")
    name, _, rest = stat.rpartition(")")
    return None if not stat or rest.split()[:1] == ["Z"] else name.partition("(")[2]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
