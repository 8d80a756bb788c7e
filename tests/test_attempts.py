"""What the notebook's code is seen doing while it runs (student/attempts.py) and what the
static scan reads in it (grader/scan.py): honest work — printing, formatting and logging
a traceback, warnings, signatures, help, a debugger's post-mortem, IPython's error display
and %debug, torch's anomaly mode — is never flagged; each route to the interpreter's frames
and objects is, wherever the notebook's code takes it (compiled by `exec`, through
`logging` or a thread pool).

The cells run in a fresh interpreter with the grading kernel (runner/kernel.py), as a
grading child runs them: the audit hook cannot be removed once added.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from autograder.grader.scan import scan

HONEST = {
    "traceback.print_exc": "import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc()",
    "traceback.format_exc": "import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.format_exc()",
    "traceback.print_exception": "import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError as e:\n"
                                 "    traceback.print_exception(e)",
    "traceback.print_stack": "import traceback\ntraceback.print_stack()",
    "sys.exc_info": "import sys\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    sys.exc_info()",
    "logging.exception": "import logging\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n"
                         "    logging.exception('caught')",
    "logging.warning": "import logging\nlogging.getLogger('mine').warning('note')",
    "warnings.warn": "import warnings\nwarnings.warn('careful')",
    "inspect.signature": "import inspect\ninspect.signature(lambda a, b=1: a)",
    "help()": "help(len)",
    "pdb.post_mortem": "import pdb, sys\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n"
                       "    pdb.post_mortem(sys.exc_info()[2])",
    "IPython's error display": "raise ValueError('shown by IPython')",
    "%debug": "%debug",
    "torch.autograd.detect_anomaly": "import torch\nx = torch.ones(2, requires_grad=True)\n"
                                     "with torch.autograd.detect_anomaly(check_nan=False):\n"
                                     "    (x * 2).sum().backward()",
    "namedtuple, TypeVar, Enum": "import collections, enum, typing\ncollections.namedtuple('P', 'a b')\n"
                                 "typing.TypeVar('T')\nenum.Enum('E', 'a b')",
    "a program that ended": "import subprocess\nsubprocess.run(['true'])",
}
ROUTES = {  # name: (the cell, what the flag says)
    "sys._getframe": ("import sys\nsys._getframe()", "frames with sys._getframe (In ["),
    "inspect.stack": ("import inspect\ninspect.stack()", "frames with inspect.stack (In ["),
    "inspect.currentframe": ("import inspect\ninspect.currentframe()", "frames with inspect.currentframe (In ["),
    "inspect.trace": ("import inspect\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    inspect.trace()",
                      "frames with inspect.trace (In ["),
    "traceback.walk_stack": ("import traceback\nlist(traceback.walk_stack(None))",
                             "frames with traceback.walk_stack (In ["),
    "logging.currentframe": ("import logging\nlogging.currentframe()", "frames with logging.currentframe (In ["),
    "a traceback's frame": ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    e.__traceback__.tb_frame",
                            "frames through .tb_frame (In ["),
    "a generator's frame": ("def g():\n    yield\ng().gi_frame", "frames through .gi_frame (In ["),
    "code compiled by exec": ("exec(compile('import sys\\nsys._getframe()', '<mine>', 'exec'))",
                              "frames with sys._getframe (in code it compiled as '<mine>', line 2)"),
    "a thread pool": ("import inspect\nfrom concurrent.futures import ThreadPoolExecutor\n"
                      "ThreadPoolExecutor(1).submit(inspect.stack).result()",
                      "frames with inspect.stack (in a thread of its own)"),
    "gc": ("import gc\ngc.get_referrers(gc)", "objects with gc.get_referrers (In ["),
    "ctypes": ("import ctypes\nctypes.CDLL(None).getpid()", "calls C functions with ctypes (In ["),
    "a signal handler": ("import signal\nsignal.signal(signal.SIGUSR1, lambda number, frame: None)",
                         "a handler for SIGUSR1 was installed"),
    "a process left running": ("import os, time\nif os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)",
                               "a process it started was still running when the grader's checks began"),
}
RUN = textwrap.dedent('''
    import json, sys, tempfile
    from autograder.runner import kernel
    from autograder.student import attempts
    shell = kernel.make_shell()
    kernel.start(tempfile.mkdtemp(), 1 << 20)
    attempts.watch()
    seen = {}
    for name, code in json.loads(sys.argv[1]).items():
        kernel.execute(shell, code)
        seen[name] = attempts.take()
    with open(sys.argv[2], "w") as f:
        json.dump(seen, f)
''')


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    """What each cell was seen doing, in one interpreter (honest cells first: the routes'
    flags are what `take` reports after each)."""
    out = tmp_path_factory.mktemp("attempts") / "seen.json"
    cells = {**HONEST, **{name: cell for name, (cell, _) in ROUTES.items()}}
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(cells), str(out)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("pattern", list(HONEST))
def test_honest_work_is_never_flagged(seen, pattern):
    assert seen[pattern] == []


@pytest.mark.parametrize("route", list(ROUTES))
def test_each_route_to_the_interpreters_frames_and_objects_is_flagged(seen, route):
    assert any(ROUTES[route][1] in flag for flag in seen[route]), seen[route]


def _cells(*sources: str) -> list[dict]:
    return [{"cell_type": "code", "source": source, "metadata": {}} for source in sources]


def test_the_scan_reads_no_honest_pattern_as_an_attempt():
    """(A program run from the notebook's code is one: "controls processes or signals".)"""
    assert scan(_cells(*(code for name, code in HONEST.items() if name != "a program that ended")), []) == []


BACKWARD = '''
class Clipped(torch.autograd.Function):
    @staticmethod
    def backward(ctx, grad_output):
        {line}
        return grad_output, None
'''


@pytest.mark.parametrize(("line", "reason"), [
    ("node = y.grad_fn(grad_output)", "asks autograd for the gradient inside backward"),
    ("y.grad_fn.next_functions[0][0](grad_output)", "asks autograd for the gradient inside backward"),
    ("torch._C._autograd._disable_profiler()", "meddles with the profiler inside backward"),
    ("torch._C._autograd._toggle_collection_dynamic(False, set())", "meddles with the profiler inside backward"),
])
def test_the_scan_reads_a_node_called_or_the_profiler_stopped_in_backward(line, reason):
    (found,) = scan(_cells(BACKWARD.format(line=line)), [])
    assert found.reason.endswith(reason)


def test_the_scan_leaves_a_profiler_span_in_backward_alone():
    line = "with torch.autograd.profiler.record_function('my backward'): pass"
    assert scan(_cells(BACKWARD.format(line=line)), []) == []
