"""Nothing a student receives reveals a hidden input.

Every student's hidden checks draw the same inputs (from the course's secret), so one
student's feedback must not show them to another, nor to next term's class. For each
notebook's graded class batch (every known answer, tests/conftest.py's `class_batches`),
the hidden test cells are judged again here, in this process, with the model solution
and the seeds the batch recorded, and every tensor the grader sent to the student's
process is kept: those are the hidden inputs (the inputs, grad_outputs, directions,
tangents...). No two neighbouring entries of any of them appear, as any message would
render them (`show`, `.tolist()`, torch's repr, an f-string), in `feedback/` or in the
outputs of the autograded notebooks. (One value at the first entry that differs is what
a hidden check may show.) `autograder replay` still shows the instructor everything.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
import torch

from autograder import authoring
from autograder.checks import explain, inputs
from autograder.checks.remote import loopback
from autograder.grader.verdicts import Judge, is_hidden
from autograder.student import probe, report
from grading import namespace

pytestmark = pytest.mark.slow
SLUGS = authoring.assignments()
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
# How a message may render a number: report.show (4 digits), `:g` (6), torch's repr (4 decimals), repr.
FORMATS = (".4g", "g", ".4f", "r")


def _rendered(value: float, spec: str) -> str:
    return repr(value) if spec == "r" else format(value, spec)


def _distinctive(text: str) -> bool:
    """A rendering no other number shares by chance: four significant digits or more (so not
    a special point such as 0, 1000 or -0.5)."""
    digits = re.sub(r"\D", "", text.split("e")[0]).lstrip("0")
    return len(digits.rstrip("0")) >= 4


def _sent(slug: str, seeds: dict[str, int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every floating-point tensor the hidden test cells of `slug` send the student's
    process, and every one the visible cells send, for the model solution, judged with the
    batch's recorded `seeds`."""
    cells = nbformat.read(authoring.solution_path(slug), as_version=4).cells
    hidden: list[torch.Tensor] = []
    visible: list[torch.Tensor] = []
    transport = loopback(namespace(slug))
    judge = Judge.of(cells, lambda grade_id: int(seeds[grade_id]))
    for index, cell in judge.tests.items():  # all, in order: a visible check cell imports what hidden ones call

        def recording(request: dict[str, Any], found: list = hidden if is_hidden(cell) else visible) -> Any:
            _collect(request, found)
            return transport(request)

        verdict = judge.judge(index, recording)
        assert verdict.score == verdict.max_score, verdict.report
    return hidden, visible


def _pairs(t: torch.Tensor, spec: str) -> set[tuple[str, str]]:
    """Two neighbouring entries of `t` as a message would render them, where both are distinctive."""
    values = t[:4096].tolist()
    pairs = {(_rendered(a, spec), _rendered(b, spec)) for a, b in zip(values, values[1:])}
    return {p for p in pairs if _distinctive(p[0]) and _distinctive(p[1])}


def _collect(value: Any, found: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.device.type != "meta" and value.numel() > 1:
            found.append(value.detach().cpu().double().reshape(-1))
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, found)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, found)


def _neighbours(text: str) -> set[tuple[str, str]]:
    """Every two numbers of `text` written one after the other with a comma between."""
    found = set()
    for line in text.splitlines():
        tokens = [(m.group(), m.start(), m.end()) for m in NUMBER.finditer(line)]
        for (a, _, end), (b, start, _) in zip(tokens, tokens[1:]):
            if re.fullmatch(r",\s*", line[end:start]):
                found.add((a, b))
    return found


def _received(root: Path, slug: str) -> dict[str, str]:
    """What the class receives: each feedback file, and the outputs of each autograded notebook."""
    found = {str(p.relative_to(root)): p.read_text() for p in (root / "feedback").rglob("*.html")}
    for path in (root / "autograded").rglob(f"{slug}.ipynb"):
        nb = nbformat.read(path, as_version=4)
        found[str(path.relative_to(root))] = "\n".join(
            "".join(o.get("text", "")) + o.get("evalue", "") + "\n".join(o.get("traceback", []))
            + str(o.get("data", {}).get("text/plain", "")) for c in nb.cells for o in c.get("outputs", []))
    return found


@pytest.fixture(scope="module", params=SLUGS)
def graded(request, class_batches):
    batch = class_batches(request.param)
    assert batch.result.returncode == 0, batch.result.stderr
    return batch


def test_no_hidden_input_reaches_what_the_class_receives(graded):
    root, slug = graded.course.root, graded.slug
    seeds = nbformat.read(root / "autograded" / "correct" / slug / f"{slug}.ipynb",
                          as_version=4).metadata["autograder"]["seeds"]
    sent, visible = _sent(slug, seeds)
    assert sent, "the hidden checks sent nothing to the student's process"
    received = _received(root, slug)
    assert len(received) > len(graded.submissions)  # feedback and autograded notebooks of every student
    shown = {name: _neighbours(text) for name, text in received.items()}
    leaks = []
    for spec in FORMATS:
        # what a visible check sends too (a fixed case such as 09's slices near ±1000) is shown there: no secret
        public = set().union(*(_pairs(t, spec) for t in visible))
        for t in sent:
            pairs = _pairs(t, spec) - public
            leaks += [(name, pair) for name, found in shown.items() for pair in pairs & found]
    assert not leaks, f"{len(leaks)} hidden inputs shown to students, e.g. {leaks[:5]}"


def test_a_hidden_check_describes_tensors_without_their_values():
    x = torch.tensor([0.31274, -1.48201, 0.5])
    with report.hidden():
        assert report.show(x) == "a float32 tensor of shape (3,)"
        with pytest.raises(report.CheckFailed) as failed:
            report.fail("wrong", f"x = {report.show(x)}")
    assert "0.3127" not in str(failed.value) and report.HIDDEN in str(failed.value)
    assert report.show(x) == "tensor([0.3127, -1.482, 0.5])"


def test_special_points_sit_at_random_places_in_every_draw():
    """An answer cannot tell a check's input by where its special points are (nor be right
    only there): every draw puts them elsewhere, and each is there once."""
    places = set()
    for seed in range(20):
        x = inputs.including(torch.ones(12, dtype=torch.float64), [0.0, 1e3], inputs.generator(seed))
        assert sorted(x.tolist()).count(0.0) == 1 and x.tolist().count(1e3) == 1
        places.add((x.tolist().index(0.0), x.tolist().index(1e3)))
    assert len(places) > 10


def test_an_error_the_students_code_raises_shows_no_value_in_a_hidden_check():
    """An honest assert may print its input: in a hidden check its decimal numbers are masked
    (the shapes and counts in torch's own messages stay)."""
    raised = ValueError("x must be positive, got tensor([-0.3127, 1.5e-3]) of shape (2, 3)")
    with report.hidden():
        said = probe.ProbeError.of("forward", raised).message
    assert said == "x must be positive, got tensor([…, …]) of shape (2, 3)"
    assert probe.ProbeError.of("forward", raised).message == str(raised)
    with report.hidden():
        assert explain.differ(torch.tensor([0.25, 0.5]), torch.tensor([0.25, 0.75])) == [
            "expected a float32 tensor of shape (2,), actual a float32 tensor of shape (2,)",
            "1 of 2 entries differ; first at index (1,): expected 0.5, got 0.75 (difference 0.25)"]


# Runs cells in a real IPython shell, as a kernel does (stock `nbgrader autograde` runs the
# test cells there): what each printed and raised, as one JSON line per cell.
KERNEL = '''
import contextlib, io, json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
for source in json.loads(sys.stdin.read()):
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        result = shell.run_cell(source)
    print(json.dumps(printed.getvalue() + str(result.error_in_exec or "")))
'''
WRONG_FORWARD = '''
import torch

class ClippedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clip):
        ctx.save_for_backward(x)
        ctx.clip = clip
        return 1.5 * x.clamp(0, clip)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * ((x > 0) & (x < ctx.clip)), None
'''


def test_a_hidden_cell_run_in_a_kernel_shows_no_value():
    """Stock nbgrader runs the test cells in the student's kernel, where the grader's
    `report.hidden` does not reach: the setup cell's hook hides the values of a cell holding
    hidden tests all the same (the same cell without its markers shows them)."""
    (cell,) = [c for c in nbformat.read(authoring.solution_path("03_function_basics"), as_version=4).cells
               if c.metadata.get("nbgrader", {}).get("grade_id") == "check_clipped_relu_hidden"]
    unmarked = "\n".join(line for line in cell.source.splitlines() if "HIDDEN TESTS" not in line)
    cells = ["from autograder.student import setup\nsetup()", WRONG_FORWARD,
             "from autograder.exercises.function_basics import check_clipped_relu", cell.source, unmarked]
    done = subprocess.run([sys.executable, "-c", KERNEL], input=json.dumps(cells), capture_output=True, text=True,
                          timeout=300, check=True)
    *_, hidden, shown = map(json.loads, done.stdout.strip().splitlines())
    assert "CheckFailed" in hidden and "wrong forward values" in hidden, hidden
    assert report.HIDDEN in hidden and "tensor([" not in hidden, hidden
    assert report.HIDDEN not in shown and "tensor([" in shown, shown
