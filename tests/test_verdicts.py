"""Trusted verdicts (checks judging in the grader, student code answering through the
wire format) agree with the checks run in the student's own kernel, on the model
solutions and on every known wrong and right answer."""
from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from pathlib import Path

import nbformat
import pytest

from answers import for_notebook
from autograder import authoring
from autograder.checks import inputs
from autograder.checks.remote import loopback
from autograder.grader.verdicts import Judge, StudentNames, Warmth, is_test_cell, run_cell, verdicts
from grading import exercises, namespace

SLUGS = authoring.assignments()


def SEEDS(grade_id: str) -> int:
    """Each test cell's seed, the same in both runs: they compare one draw."""
    return inputs.cell_seed(b"test_verdicts", grade_id)


def _local_scores(cells: list, ns: dict) -> dict[str, bool]:
    """Which graded cells pass when run in the student's namespace (as in the kernel)."""
    passed = {}
    for cell in filter(is_test_cell, cells):
        meta = cell.metadata.nbgrader
        try:
            with inputs.seeded(SEEDS(meta["grade_id"])):
                result = run_cell(cell.source, ns)
            ok = not (isinstance(result, (int, float)) and not isinstance(result, bool) and result < meta["points"])
        except Exception:
            ok = False
        if meta.get("grade"):
            passed[meta["grade_id"]] = ok
    return passed


def _trusted_scores(cells: list, ns: dict) -> dict[str, bool]:
    return {v.grade_id: v.score == v.max_score for v in verdicts(cells, loopback(ns), SEEDS)}


def _cases(every: bool):
    """The model solution of each notebook, and the known answers: every wrong and right one
    with `--verdicts-all` (`make verdicts`), else the first wrong answer of each exercise
    (test_grading.py grades the first wrong and the first unusual right one of each exercise
    end to end, and every one with `make classes`)."""
    for slug in SLUGS:
        yield pytest.param(slug, None, id=f"{slug}-model")
        module = for_notebook(slug)
        seen: set[str] = set()
        for answer in module.MUTANTS + (module.VARIANTS if every else []):
            if every or answer.exercise not in seen:
                seen.add(answer.exercise)
                yield pytest.param(slug, answer, id=f"{slug}-{answer.exercise}-{answer.label}")


def pytest_generate_tests(metafunc):
    if {"slug", "answer"} <= set(metafunc.fixturenames):
        metafunc.parametrize("slug, answer", list(_cases(metafunc.config.getoption("--verdicts-all"))))


def test_trusted_verdict_agrees_with_the_kernel(slug, answer):
    nb = nbformat.read(authoring.solution_path(slug), as_version=4)
    found = exercises(nb)
    cells = nb.cells
    if answer is None:
        ns, graded = namespace(slug), None
    else:
        solution = next(e.solution for e in found if e.answer_id == answer.exercise)
        ns = namespace(slug, {answer.exercise: answer.apply(solution)})
        graded = next(e.graded for e in found if e.answer_id == answer.exercise)
        # Only the exercise's own graded cells are judged (and the ungraded test cells, which
        # may define names the graded ones use): the others see the model solution.
        cells = [c for c in cells if not is_test_cell(c) or not c.metadata.nbgrader.get("grade")
                 or c.metadata.nbgrader["grade_id"] in graded]
    trusted = _trusted_scores(cells, ns)
    local = _local_scores(cells, namespace(slug) if answer is None else ns)
    assert trusted == local
    if answer is None:
        assert all(trusted.values()), trusted


def test_names_resolve_to_data_or_proxies():
    ns = {"answers": {"a": "composite"}, "Fn": type("Fn", (), {})}
    names = StudentNames(loopback(ns))
    assert names["answers"] == {"a": "composite"}
    assert repr(names["Fn"]) == "<the student's Fn>"
    with pytest.raises(NameError, match="name .missing. is not defined"):
        names["missing"]


def test_each_cell_is_judged_with_the_students_names_as_they_are_then():
    """A test cell sees what the student's cells defined before it, not after; names the
    test cells define themselves are kept for the next test cell."""
    graded = {"grade": True, "grade_id": "check", "points": 1, "locked": True}
    cells = [
        nbformat.v4.new_code_cell("answer = 1", metadata={"nbgrader": {"solution": True, "grade_id": "a"}}),
        nbformat.v4.new_code_cell("expected = 1\nassert answer == expected", metadata={"nbgrader": graded}),
        nbformat.v4.new_code_cell("assert answer == expected + 1",
                                  metadata={"nbgrader": {**graded, "grade_id": "check2"}}),
    ]
    ns = {"answer": 1}
    judge = Judge.of(cells, SEEDS)
    assert [i for i in range(3) if judge.judges(i)] == [1, 2]
    assert judge.judge(1, loopback(ns)).score == 1
    ns["answer"] = 2  # the student's later cell changes it
    assert judge.judge(2, loopback(ns)).score == 1


def test_warm_pays_the_graders_first_call_costs_before_any_verdict():
    """The check modules the notebooks import load, and the first gradient given
    grad_outputs imports nothing more; for notebooks that compile, neither does the first
    forward-mode derivative (torch._dynamo is loaded), and for others torch._dynamo is not;
    the students' own modules stay out of the grader."""
    code = textwrap.dedent("""
        import sys, torch
        from autograder.grader.verdicts import warm, warm_compiler
        warm(["autograder.exercises.tape_autograd", "matplotlib", "autograder.no_such_module"])
        if COMPILES:
            warm_compiler()
        before = set(sys.modules)
        x = torch.ones(2, requires_grad=True)
        torch.autograd.grad(x.sin().sum(), x, torch.tensor(1.0))
        if COMPILES:
            with torch.autograd.forward_ad.dual_level():
                torch.autograd.forward_ad.make_dual(x.detach(), x.detach()).sin()
        print("autograder.exercises.tape_autograd" in before, "matplotlib" in before, "torch._dynamo" in before,
              sorted(set(sys.modules) - before))
    """)
    for compiles in (False, True):
        done = subprocess.run([sys.executable, "-c", code.replace("COMPILES", str(compiles))], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["True", "False", str(compiles), "[]"]


def test_a_first_call_cost_is_paid_once_and_never_while_a_judge_runs():
    """Paying imports, and imports at the same time as a judge's can deadlock: the payment
    waits for the judge running, and a judge that comes meanwhile waits for the payment. A
    cost that fails stops nothing (the judge that needs it meets its error)."""
    warmth, log = Warmth(), []
    judging, done = threading.Event(), threading.Event()

    def first_judge() -> None:
        with warmth.judging():
            judging.set()
            done.wait(timeout=60)
            log.append("first judge")

    def second_judge() -> None:
        with warmth.judging():
            log.append("second judge")

    def cost() -> None:
        log.append("paid")

    threads = [threading.Thread(target=first_judge)]
    threads[0].start()
    judging.wait(timeout=60)
    threads.append(threading.Thread(target=warmth.pay, args=(cost,)))
    threads[1].start()
    deadline = time.monotonic() + 60
    while not warmth._paying and not log and time.monotonic() < deadline:  # (waiting for the first judge)
        time.sleep(0.001)
    threads.append(threading.Thread(target=second_judge))
    threads[2].start()
    time.sleep(0.05)
    assert log == []
    done.set()
    for thread in threads:
        thread.join(timeout=60)
    warmth.pay(cost)
    assert log == ["first judge", "paid", "second judge"]
    warmth.pay(lambda: 1 / 0)  # a cost that fails fails no run (the judge that needs it meets the error)
    with warmth.judging():
        pass


def test_a_module_the_notebook_imported_is_the_graders_own():
    """`torch` in a test cell is torch (not a proxy of the student's module); a module name
    the grader has not loaded stays the student's."""
    import math
    import types

    import torch

    ns = {"torch": torch, "m": math, "odd": types.ModuleType("antigravity")}
    names = StudentNames(loopback(ns))
    assert names["torch"] is torch and names["m"] is math
    assert repr(names["odd"]) == "<the student's odd>"


def test_every_syntax_tree_of_the_grader_is_built_under_one_lock():
    """CPython 3.11.7 corrupts its syntax-tree recursion counter when two threads build trees
    at once (gh-106905: a right answer once scored 0 with "AST constructor recursion depth
    mismatch"): while the lock is held, another thread's ast.parse — a traceback's — waits."""
    from autograder.grader import syntax

    syntax.guard()
    assert getattr(ast.parse, "guarded", False) == syntax.NEEDED  # guarded exactly where CPython needs it
    if not syntax.NEEDED:
        return
    done = threading.Event()

    def format_a_traceback():
        try:
            1 / 0  # noqa: B018  (raises on purpose)
        except ZeroDivisionError as error:
            traceback.format_exception(error)  # Python 3.11 parses the line it points at
        done.set()

    with syntax._LOCK:
        thread = threading.Thread(target=format_a_traceback)
        thread.start()
        assert not done.wait(0.5)
    thread.join(10)
    assert done.is_set()


GLOBAL_TORCH_STATE = {"dual_level", "fork_rng", "manual_seed",
                      "set_rng_state"}  # forward AD's level, the default generator


def _unguarded_global_state(tree: ast.AST) -> list[int]:
    """Lines that call GLOBAL_TORCH_STATE outside a `with process_wide` block (a Generator
    object's own manual_seed is local: `torch.Generator().manual_seed(...)`, `found.manual_seed`)."""
    found = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.With):
            guarded = guarded or any(isinstance(item.context_expr, ast.Name) and item.context_expr.id == "process_wide"
                                     for item in node.items)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in GLOBAL_TORCH_STATE:
            owner = node.func.value
            on_torch = isinstance(owner, ast.Name) and owner.id in ("torch", "fwAD") or isinstance(owner, ast.Attribute)
            if on_torch and not guarded:
                found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return found


def test_checks_use_torch_state_global_to_the_process_one_thread_at_a_time():
    """The grader judges several notebooks at once, a thread each; forward AD's level and the
    default generator are one for the whole process (a right Swish of 10_modern_api lost its
    hidden points to "Nested forward mode AD is not supported" when two were judged at once).
    Every such use in the grader's checks is under `process_wide`, and four threads computing
    reference tangents at once all succeed."""
    import torch

    from autograder.exercises import modern_api

    root = Path(__file__).resolve().parent.parent / "autograder"
    unguarded = {str(path.relative_to(root)): lines for package in ("checks", "exercises")
                 for path in sorted((root / package).glob("*.py"))
                 if (lines := _unguarded_global_state(ast.parse(path.read_text())))}
    assert not unguarded, f"global torch state used outside `with process_wide` at {unguarded}"
    assert _unguarded_global_state(ast.parse("import torch\nwith torch.random.fork_rng():\n"
                                             "    torch.manual_seed(0)")) == [2, 3]

    x, t = torch.randn(50, dtype=torch.float64), torch.randn(50, dtype=torch.float64)
    want = torch.cos(x) * x * t + torch.sin(x) * t
    failures = []

    def tangents():
        for _ in range(200):
            try:
                (got,) = modern_api._reference_jvp(lambda a: torch.sin(a) * a, (x,), (t,))
                if not torch.allclose(got, want):
                    failures.append("wrong tangent")
            except RuntimeError as error:
                failures.append(str(error))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=tangents) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures, failures[:3]
