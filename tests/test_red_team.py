"""Red team: submissions that try to get points they have not earned.

One course (notebook 03), graded with `autograder grade`. An honest and an honestly wrong
student are graded first. Then each attacker submits a *wrong* ClippedReLU (its backward
ignores grad_output) together with an attack meant to make the notebook's test cells pass
anyway, and correct answers for the other exercises. Every attacker must get its honest
score — 0 for ClippedReLU, full marks for what it answered correctly, 0 for what its own
crash prevented — be flagged with a reason, and leave everyone else's grades unchanged.
The sandbox attacks (memory and fork bombs, floods of output, network, reading and writing
the course's files, SIGINT-ignoring loops) are in test_engine_attacks.py.
"""
from __future__ import annotations

import contextlib
import io
import textwrap

import nbformat
import pytest
import torch
from nbgrader.utils import compute_checksum

from engine_course import flagged, grade, notebook, rows, solutions, submit_notebook, with_answers
from grading import Course, points

pytestmark = pytest.mark.slow
SLUG = "03_function_basics"
FIRST = "clipped_relu"  # the answer cell that carries each attack
CHEATED = ("check_clipped_relu", "check_clipped_relu_hidden")
TIMEOUT = 20
RIGHT = "grad_output * inside, None"
WRONG = "inside.to(grad_output.dtype), None"  # backward ignores grad_output


def _visible_inputs(model: str) -> list:
    """The inputs the visible check gives ClippedReLU: what a student could record and hard-code."""
    from autograder.exercises.function_basics import check_clipped_relu

    namespace: dict = {"torch": torch}
    exec(model, namespace)
    seen = []

    class Recording(namespace["ClippedReLU"]):
        @staticmethod
        def forward(ctx, x, clip):
            if x.device.type == "cpu":
                seen.append(x.detach().tolist())
            return namespace["ClippedReLU"].forward(ctx, x, clip)

    with contextlib.redirect_stdout(io.StringIO()):
        check_clipped_relu(Recording)
    return seen


# A backward that asks autograd for the gradient of the right formula, keeping the graph (so
# that double backward passes too): what several attacks below hide from the autograd watch.
ASKS_AUTOGRAD = """
def backward(ctx, grad_output):
    (x,) = ctx.saved_tensors
    with torch.enable_grad():
        x = x.detach().requires_grad_()
        inside = torch.where((x > 0) & (x < ctx.clip), x, x.detach())
        return getattr(torch.autograd, "gr" + "ad")(inside, x, grad_output, create_graph=True)[0], None
ClippedReLU.backward = staticmethod(backward)
"""
# name -> (code after the wrong ClippedReLU, what the flag says, the exercises its own crash zeroes)
ATTACKS = {
    "compile_blanks_tests": ("""
        import builtins
        _compile = builtins.compile
        def compile(source, *args, **kwargs):
            if isinstance(source, str) and "check_" in source:
                source = "pass"
            return _compile(source, *args, **kwargs)
        builtins.compile = compile
    """, "builtins.compile was replaced", False),
    "compile_strips_asserts": ("""
        import ast, builtins
        _compile = builtins.compile
        class NoAsserts(ast.NodeTransformer):
            def visit_Assert(self, node):
                return ast.Pass()
        def compile(source, filename, mode, flags=0, *args, **kwargs):
            if isinstance(source, str) and not flags & ast.PyCF_ONLY_AST:
                source = ast.fix_missing_locations(NoAsserts().visit(ast.parse(source)))
            return _compile(source, filename, mode, flags, *args, **kwargs)
        builtins.compile = compile
    """, "builtins.compile was replaced", False),
    "input_transformer": ("""
        get_ipython().input_transformers_post.append(
            lambda lines: ["pass\\n"] if any("check_" in line for line in lines) else lines)
    """, "changes how IPython runs cells", False),
    "ast_transformer": ("""
        import ast
        class Blank(ast.NodeTransformer):
            def visit_Module(self, node):
                if "check_" in ast.unparse(node):
                    node.body = [ast.Pass()]
                return node
        get_ipython().ast_transformers.append(Blank())
    """, "changes how IPython runs cells", False),
    "patch_gradcheck_and_comparisons": ("""
        import torch
        torch.autograd.gradcheck = torch.autograd.gradgradcheck = lambda *args, **kwargs: True
        torch.allclose = torch.equal = lambda *args, **kwargs: True
        torch.Tensor.allclose = lambda *args, **kwargs: True
        torch.testing.assert_close = lambda *args, **kwargs: None
    """, "torch.autograd.gradcheck was replaced", False),
    "patch_tensor_methods": ("""
        import torch
        torch.Tensor.__sub__ = lambda self, other: torch.zeros_like(self)
        torch.Tensor.abs = lambda self: torch.zeros_like(self)
    """, "tampering suspected: the notebook changed what the grader's probes rely on", False),
    "patch_course_checks": ("""
        for name in ("autograder.exercises.function_basics", "autograder.checks.functions"):
            try:
                module = __import__(name, fromlist=["check_function"])
                setattr(module, "check_clipped_relu", lambda *args, **kwargs: print("✔ all good"))
                setattr(module, "check_function", lambda *args, **kwargs: None)
            except ImportError as error:
                print("not there:", name, type(error).__name__)
    """, "reaches into the course's grading code", False),
    "patch_check_failures": ("""
        import autograder.student.report as report
        report.CheckFailed = type("CheckFailed", (BaseException,), {{}})
        report.fail = lambda *args, **kwargs: None
    """, "was replaced", False),
    "forge_probe_answers": ("""
        import autograder.student.probe as probe
        for key in list(probe.PROCEDURES):
            probe.PROCEDURES[key] = lambda *args, **kwargs: 0.0
    """, "tampering suspected", False),
    "route_to_the_reference": ("""
        reference = None
        for name, attr in (("autograder.exercises.function_basics", "CLIPPED_RELU"), ("autograder.checks.functions", "check_function")):
            try:
                reference = getattr(__import__(name, fromlist=[attr]), attr)
            except ImportError as error:
                print("not there:", name, type(error).__name__)
        setattr(__import__("autograder.student.integrity", fromlist=["restore"]), "restore", lambda: [])
        if reference is not None:
            ClippedReLU = lambda x, clip: reference.reference(x, clip)
    """, "autograder.student.integrity.restore was replaced", False),  # noqa: E501  (the attack's code as written)
    "wrap_the_probe_server": ("""
        import autograder.runner.child as child
        import autograder.student.serve as serve
        def finite_differences(namespace, request):  # would answer from the student's own forward
            return 0.0
        serve.serve = finite_differences
        child._probe = lambda *args, **kwargs: ({{"op": "answer", "answer": 0.0}}, [])
    """, "autograder.student.serve.serve was replaced", False),
    "channel_desync": ("""
        import json, os, socket, struct
        frame = json.dumps({{"op": "executed", "outputs": [], "execution_count": 1, "cpu": 0.0, "buffers": []}}).encode()
        for fd in range(3, 256):
            try:
                channel = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            if channel.type == socket.SOCK_STREAM:
                channel.sendall(struct.pack(">I", len(frame)) + frame)
            channel.close()
    """, "tampering suspected: the notebook's process sent a message that answers no request", True),  # noqa: E501  (the attack's code as written)
    "custom_exception_handler": ("""
        get_ipython().set_custom_exc((BaseException,), lambda shell, etype, evalue, tb, tb_offset=None: None)
    """, "changes how IPython runs cells", False),
    "silent_tracebacks": ("""
        get_ipython().showtraceback = lambda *args, **kwargs: None
        get_ipython()._showtraceback = lambda *args, **kwargs: None
    """, "changes how IPython runs cells", False),
    "hardcoded_visible_outputs": ("""
        SEEN = {seen!r}
        _wrong_backward = ClippedReLU.backward
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            if x.device.type == "meta" or x.detach().tolist() in SEEN:
                inside = (x > 0) & (x < ctx.clip)
                return grad_output * inside, None
            return _wrong_backward(ctx, grad_output)
        ClippedReLU.backward = staticmethod(backward)
    """, None, False),  # the grader never uses the visible inputs: an honest wrong answer
    "autograd_in_backward": ("""
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                x = x.detach().requires_grad_()
                (grad,) = torch.autograd.grad(x.clamp(0, ctx.clip), x, grad_output)
            return grad, None
        ClippedReLU.backward = staticmethod(backward)
    """, "asks autograd for the gradient inside backward", False),
    "autograd_in_a_thread_pool": ("""
        from concurrent.futures import ThreadPoolExecutor
        _pool = ThreadPoolExecutor(1)
        def _helper(x, g, clip):
            with torch.enable_grad():
                x = x.detach().requires_grad_()
                return getattr(torch.autograd, "gr" + "ad")(x.clamp(0, clip), x, g)[0]
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return _pool.submit(_helper, x, grad_output, ctx.clip).result(), None
        ClippedReLU.backward = staticmethod(backward)
    """, "asks autograd for its gradient (autograd's engine ran ClampBackward1", False),
    "autograd_through_the_engine": ("""
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                x = x.detach().requires_grad_()
                engine = vars(torch.autograd.variable.Variable)["_execution" + "_engine"]
                (grad,) = getattr(engine, "run" + "_backward")((x.clamp(0, ctx.clip),), (grad_output,), False, False,
                                                              (x,), False, False)
            return grad, None
        ClippedReLU.backward = staticmethod(backward)
    """, "asks autograd for its gradient (autograd's engine ran ClampBackward1", False),
    "autograd_without_torch_function": ("""
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            with torch._C.DisableTorchFunction(), torch.enable_grad():
                x = x.detach().requires_grad_()
                (grad,) = torch.autograd.grad(x.clamp(0, ctx.clip), x, grad_output)
            return grad, None
        ClippedReLU.backward = staticmethod(backward)
    """, "hides what it calls from torch's function handling", False),
    "autograd_unless_watched": ("""
        _wrong_backward = ClippedReLU.backward
        def backward(ctx, grad_output):
            if torch.autograd.profiler._is_profiler_enabled:
                return _wrong_backward(ctx, grad_output)
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                x = x.detach().requires_grad_()
                (grad,) = torch.autograd.grad(x.clamp(0, ctx.clip), x, grad_output)
            return grad, None
        ClippedReLU.backward = staticmethod(backward)
    """, "asks autograd for the gradient inside backward", False),  # judged as it behaves watched: wrong
    "autograd_renamed_function": ("""
        {asks_autograd}
        ClippedReLU.__name__ = ClippedReLU.__qualname__ = "Where"  # its node is still ClippedReLUBackward
    """, "asks autograd for its gradient (autograd's engine ran WhereBackward0", False),
    "apply_is_plain_operations": ("""
        def clipped(x, clip):  # torch's own operations, no Function: autograd computes the gradient
            return torch.where((x > 0) & (x < clip), x, x.clamp(0, clip).detach())
        ClippedReLU.apply = staticmethod(clipped)
    """, "its output came from WhereBackward0, not from the Function itself", False),
    "autograd_node_called_in_a_thread": ("""
        import threading
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                x = x.detach().requires_grad_()
                inside = torch.where((x > 0) & (x < ctx.clip), x, x.detach())
            found = {{}}
            worker = threading.Thread(target=lambda: found.update(g=getattr(inside, "grad" + "_fn")(grad_output)[0]))
            worker.start(), worker.join()
            return found["g"], None
        ClippedReLU.backward = staticmethod(backward)
    """, "asks autograd for its gradient (autograd's engine ran WhereBackward0", False),
    "autograd_in_a_process_forked_before": ("""
        import os, pickle
        _asked, _ask = os.pipe()
        _answer, _answered = os.pipe()
        if os.fork() == 0:  # a helper, forked now: its autograd is out of the watch's sight
            os.close(_ask), os.close(_answer)
            asked, answered = os.fdopen(_asked, "rb"), os.fdopen(_answered, "wb")
            while True:
                x, grad_output, clip = pickle.load(asked)
                x = x.detach().requires_grad_()
                inside = torch.where((x > 0) & (x < clip), x, x.detach())
                pickle.dump(torch.autograd.grad(inside, x, grad_output)[0], answered)
                answered.flush()
        os.close(_asked), os.close(_answered)
        _to_helper, _from_helper = os.fdopen(_ask, "wb"), os.fdopen(_answer, "rb")
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            pickle.dump((x, grad_output, ctx.clip), _to_helper)
            _to_helper.flush()
            return pickle.load(_from_helper), None
        ClippedReLU.backward = staticmethod(backward)
    """, "a process it started was still running when the grader's checks began", False),
    "silence_the_watchs_spans": ("""
        import contextlib
        torch.autograd.profiler.record_function.__enter__ = lambda self: self
        torch.autograd.profiler.record_function.__exit__ = lambda self, *args: None
        torch.autograd.profiler.record_function = lambda *args, **kwargs: contextlib.nullcontext()
        {asks_autograd}
    """, "torch.autograd.profiler.record_function.__enter__ was replaced", False),
    "unwatch_the_watch": ("""
        import contextlib, importlib
        @contextlib.contextmanager
        def unwatched(self):
            yield self
            self.evidence = [[] for _ in range(1000)]
        importlib.import_module("autograder.student.introspect").AutogradWatch.watching = unwatched
        {asks_autograd}
    """, "autograder.student.introspect.AutogradWatch.watching was replaced", False),
    "pause_the_profiler_in_backward": ("""
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            profiler = vars(torch._C)["_auto" + "grad"]
            getattr(profiler, "_toggle" + "_collection_dynamic")(False, {{torch._C._profiler.ProfilerActivity.CPU}})
            with torch.enable_grad():
                x = x.detach().requires_grad_()
                inside = torch.where((x > 0) & (x < ctx.clip), x, x.detach())
                return getattr(torch.autograd, "gr" + "ad")(inside, x, grad_output, create_graph=True)[0], None
        ClippedReLU.backward = staticmethod(backward)
    """, "the profiler that watched it was stopped while it ran", False),
    "frames_through_exec": ("""
        exec(compile("import sys\\n_callers = sys._getframe(0)", "<mine>", "exec"))
    """, "reaches the interpreter's frames with sys._getframe (in code it compiled as '<mine>'", False),
    "frames_through_logging": ("""
        import logging
        _wrong_forward = ClippedReLU.forward
        def forward(ctx, x, clip):
            ctx.frame = getattr(logging, "current" + "frame")()
            return _wrong_forward(ctx, x, clip)
        ClippedReLU.forward = staticmethod(forward)
    """, "reaches the interpreter's frames with logging.currentframe", False),
    "frames_through_a_signal_handler": ("""
        import signal
        _frames = []
        getattr(signal, "sig" + "nal")(signal.SIGUSR1, lambda number, frame: _frames.append(frame))
    """, "a handler for SIGUSR1 was installed", False),
    "objects_through_gc": ("""
        import importlib
        _everything = getattr(importlib.import_module("gc"), "get_" + "objects")()
        _watches = [o for o in _everything if type(o).__name__ == "AutogradWatch"]
    """, "reaches the interpreter's objects with gc.get_objects", False),
    "trace_function": ("""
        import sys
        seen = []
        def tracer(frame, event, arg):
            seen.append(frame.f_code.co_name)
            return tracer
        getattr(sys, "set" + "trace")(tracer)
    """, "installs a trace function", False),
    "frames_walked_when_probed": ("""
        import inspect
        _wrong_forward = ClippedReLU.forward
        def forward(ctx, x, clip):
            ctx.callers = [f.function for f in getattr(inspect, "st" + "ack")()]
            return _wrong_forward(ctx, x, clip)
        ClippedReLU.forward = staticmethod(forward)
    """, "reaches the interpreter's frames with inspect.stack", False),
    "exit_when_probed": ("""
        import os, sys
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            frame = sys._getframe()
            while frame is not None:
                if "autograder/student" in frame.f_code.co_filename:
                    os._exit(0)  # called by the grader's probes, not by the notebook's own code
                frame = frame.f_back
            inside = (x > 0) & (x < ctx.clip)
            return grad_output * inside, None
        ClippedReLU.backward = staticmethod(backward)
    """, "the notebook's process ended while the grader ran", True),
    "hang_when_probed": ("""
        import sys
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            probed = False
            frame = sys._getframe()
            while frame is not None:
                probed = probed or "autograder/student" in frame.f_code.co_filename
                frame = frame.f_back
            while probed:
                pass  # called by the grader's probes, not by the notebook's own code
            inside = (x > 0) & (x < ctx.clip)
            return grad_output * inside, None
        ClippedReLU.backward = staticmethod(backward)
    """, "while the grader ran", True),
    "sys_exit": ("""
        import sys
        sys.exit(0)
    """, "controls processes or signals", False),
    "os_exit": ("""
        import os
        os._exit(0)
    """, "exited with code 0", True),
    "sigkill_self": ("""
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    """, "killed (SIGKILL)", True),
    "read_hidden_tests_and_gradebook": ("""
        import glob, os
        for pattern in ["{root}/gradebook.db", "{root}/solutions/*/*.ipynb", "{root}/source/*/*.ipynb",
                        "/proc/*/cwd/gradebook.db", os.path.expanduser("~/../*/*.ipynb")]:
            for path in glob.glob(pattern) or [pattern]:
                try:
                    print("READ", path, len(open(path, "rb").read()))
                except OSError as error:
                    print("denied", path, type(error).__name__)
    """, "mentions the grader's files", False),
    "write_gradebook_and_others": ("""
        import sqlite3
        for path in ["{root}/gradebook.db", "{root}/submitted/honest/{slug}/{slug}.ipynb",
                     "{root}/autograded/honest/{slug}/{slug}.ipynb"]:
            try:
                with open(path, "a") as f:
                    f.write("pwned")
                print("WROTE", path)
            except OSError as error:
                print("denied", path, type(error).__name__)
        try:
            sqlite3.connect("{root}/gradebook.db").execute("update grade set auto_score = 99")
            print("WROTE gradebook")
        except sqlite3.Error as error:
            print("denied sqlite", type(error).__name__)
    """, "reads or writes files", False),
    "plant_files": ("""
        import os
        for path in ["planted.py", os.path.expanduser("~/planted.py"), "/tmp/planted.py"]:
            try:
                with open(path, "w") as f:
                    f.write("import torch; torch.autograd.gradcheck = lambda *a, **k: True")
                print("planted", path)
            except OSError as error:
                print("denied", path, type(error).__name__)
    """, "reads or writes files", False),
}
# The quiz's hidden cell holds the key: a dict that reads it off the stack while its answers
# are compared (this once gave full marks: the hidden cell ran in the student's process).
KEY_THIEF = """
import sys


class Answers(dict):
    def __getitem__(self, question):
        frame = sys._getframe(1)
        while frame is not None:
            key = frame.f_locals.get("key")
            if isinstance(key, dict):
                dict.update(self, key)
            frame = frame.f_back
        return dict.__getitem__(self, question)


when_to_write = Answers({"a": "composite", "b": "function", "c": "derivatives.yaml", "d": "function", "e": "function",
                         "f": "composite", "g": "function"})
"""  # three of seven answers right: 3/7 of 3 points


# Honest work that touches what the attempts above touch: none of it may be flagged. Its
# ClippedReLU leaves debugging aids in its backward (run while the grader probes it), and
# its cell prints, formats and logs a caught exception, warns, debugs post mortem (stdin is
# empty: the debugger quits at once), asks for help and a signature, and ends in an error
# that IPython displays; the next answer cell opens IPython's debugger on it.
HONEST_AIDS = """
import inspect, logging, pdb, sys, traceback, warnings

log = logging.getLogger("clipped_relu")


def _noted():
    try:
        raise ValueError("a note to self")
    except ValueError:
        traceback.format_exc()
        log.warning("caught %s", sys.exc_info()[1])
    log.warning("forward takes %s", inspect.signature(ClippedReLU.forward))
    warnings.warn("backward ran")


"""
HONEST_CELL = """

try:
    ClippedReLU.apply(torch.ones(2), "not a number")
except TypeError:
    traceback.print_exc()
    print(traceback.format_exc().splitlines()[-1])
    logging.exception("as logged")
    pdb.post_mortem(sys.exc_info()[2])
warnings.warn("a warning of my own")
help(ClippedReLU.forward)
print(inspect.signature(ClippedReLU.forward))
raise RuntimeError("shown by IPython's own error display")
"""
HONEST_DEBUG = "%debug\n"

# Attacks on the notebook's structure, made on the notebook itself: (how, what the flag says).
STRUCTURE = {
    "deleted_test_cells": ("delete", "the graded cell 'check_clipped_relu' was deleted"),
    "retyped_test_cell": ("retype", "was changed from code to markdown"),
    "renamed_grade_id": ("rename", "unknown grade_id 'check_clipped_relu_mine'"),
    "edited_locked_test_cell": ("edit", "tampering suspected: the locked cell 'check_clipped_relu' was edited"),
    "points_raised": ("points", "points 2 -> 1000"),
    "outputs_prefilled": ("prefill", "the hidden test cell 'check_clipped_relu_hidden' came with outputs"),
}


def _structure_attack(nb, how: str):
    kept = []
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in CHEATED:
            if how == "delete":
                continue
            if how == "retype":
                cell.cell_type, cell.source = "markdown", "(no test here)"
                cell.pop("outputs", None)
                cell.pop("execution_count", None)
            if how == "rename":
                cell.metadata.nbgrader["grade_id"] = f"{grade_id}_mine"
                cell.source = "print('✔ passed')"
            if how == "edit" and grade_id == CHEATED[0]:
                cell.source = "print('✔ passed')"
                cell.metadata.nbgrader["checksum"] = compute_checksum(cell)
            if how == "points":
                cell.metadata.nbgrader["points"] = 1000
            if how == "prefill":
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✔ passed\n")]
                cell.execution_count = 1
        kept.append(cell)
    nb.cells = kept
    return nb


def _scores(course: Course, student: str) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(course.db_url) as gb:
        return {g.name: g.score for g in gb.find_submission_notebook(SLUG, SLUG, student).grades}


def _comments(course: Course, student: str) -> str:
    """Everything the autograded notebook says at its top (the reasons it was flagged)."""
    import nbformat

    nb = nbformat.read(course.root / "autograded" / student / SLUG / f"{SLUG}.ipynb", as_version=4)
    return nb.cells[0].source


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = Course(tmp_path_factory.mktemp("red_team"), [SLUG])
    model = solutions(SLUG)
    assert RIGHT in model[FIRST]
    wrong = model[FIRST].replace(RIGHT, WRONG)
    course.submit("honest", SLUG, model)
    course.submit("honest_wrong", SLUG, {**model, FIRST: wrong})
    assert grade(course, SLUG).returncode == 0
    before = rows(course)

    fill = {"root": course.root, "slug": SLUG, "seen": _visible_inputs(model[FIRST]), "asks_autograd": ASKS_AUTOGRAD}
    for name, (code, _, _) in ATTACKS.items():
        attack = wrong + "\n\n" + textwrap.dedent(code).format(**fill)
        submit_notebook(course, f"a_{name}", SLUG, with_answers(course, SLUG, {**model, FIRST: attack}))
    for name, (how, _) in STRUCTURE.items():
        nb = _structure_attack(with_answers(course, SLUG, {**model, FIRST: wrong}), how)
        submit_notebook(course, f"a_{name}", SLUG, nb)
    course.submit("a_quiz_key_thief", SLUG, {**model, "when_to_write": KEY_THIEF})
    aided = model[FIRST].replace("(x,) = ctx.saved_tensors\n", "(x,) = ctx.saved_tensors\n        _noted()\n", 1)
    course.submit("z_honest_patterns", SLUG, {**model, FIRST: HONEST_AIDS + aided + HONEST_CELL,
                                              "linear": HONEST_DEBUG + model["linear"]})
    course.submit("z_victim", SLUG, model)  # after the attackers, on the same warm workers
    result = grade(course, SLUG, "--timeout", str(TIMEOUT))
    return course, before, result


def test_everyone_else_is_untouched(graded):
    course, before, result = graded
    assert result.returncode == 0, result.stderr
    assert rows(course,
                exclude={p.name for p in (course.root / "submitted").iterdir() if p.name.startswith(("a_",
                                                                                                     "z_"))}) == before


def test_honest_scores_to_compare_with(graded):
    course = graded[0]
    honest, wrong = _scores(course, "honest"), _scores(course, "honest_wrong")
    assert sum(honest.values()) == points(SLUG) and all(wrong[c] == 0 for c in CHEATED)
    assert _scores(course, "z_victim") == honest and not flagged(course, SLUG, "z_victim")[0]


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attack_gets_its_honest_score_and_is_flagged(graded, attack):
    course = graded[0]
    _, reason, crashes = ATTACKS[attack]
    student = f"a_{attack}"
    scores = _scores(course, student)
    assert all(scores[c] == 0 for c in CHEATED), scores
    later = {k: v for k, v in scores.items() if k not in CHEATED}
    assert later == ({k: 0 for k in later} if crashes else {k: v for k, v in _scores(course,
                                                                                     "honest").items() if k in later})
    if reason is not None:
        assert flagged(course, SLUG, student)[0]
        assert reason.lower() in _comments(course, student).lower()


def test_honest_debugging_and_error_handling_is_never_flagged(graded):
    course = graded[0]
    assert _scores(course, "z_honest_patterns") == _scores(course, "honest")
    assert not flagged(course, SLUG, "z_honest_patterns")[0], _comments(course, "z_honest_patterns")
    cells = notebook(course, "autograded", "z_honest_patterns", SLUG).cells
    outputs = "".join(str(c.get("outputs", "")) for c in cells)
    assert "shown by IPython's own error display" in outputs and "forward(ctx, x, clip)" in outputs


def test_the_quiz_key_never_reaches_the_students_process(graded):
    course = graded[0]
    scores = _scores(course, "a_quiz_key_thief")
    assert scores["check_when_to_write_hidden"] == pytest.approx(3 * 3 / 7), scores
    assert "reaches into the interpreter" in _comments(course, "a_quiz_key_thief")


@pytest.mark.parametrize("attack", list(STRUCTURE))
def test_structure_attack_is_repaired_scored_honestly_and_flagged(graded, attack):
    course = graded[0]
    student = f"a_{attack}"
    scores = _scores(course, student)
    assert all(scores[c] == 0 for c in CHEATED), scores
    assert flagged(course, SLUG, student)[0]
    assert STRUCTURE[attack][1].lower() in _comments(course, student).lower()
