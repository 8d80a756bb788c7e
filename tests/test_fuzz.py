"""A submission can only ever affect itself: notebooks mutated at random in structure and
metadata, graded in one batch beside honest students.

Every honest student keeps the exact score, flags and outputs of a clean run; every
mutant is graded, refused or flagged on its own, with a reason and no traceback; the run
saves everything and exits 0. The grader's last-resort reasons ("could not prepare",
"failed on this notebook", "could not be written", "could not be recorded") keep a class
graded if a bug slips through, so finding one here is a failure: each names a class of
notebook that reached code that trusted it.

`make test` grades a small sample; `make fuzz` (`--fuzz 1000`) a thousand or more. The
examples come from a recorded seed (`--fuzz-seed`), so a failure can be replayed.

Replies too: a student's process may answer the grader's requests with tensors of any
shape and dtype (tests/hostile_replies.py), and whatever it sends, the grader's cost stays
bounded (`--fuzz-replies`: a sample in `make test`, more in `make fuzz`).
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

import hostile_replies
from engine_course import grade, rows, solutions, with_answers
from grading import Course
from notebook_mutations import as_bytes, mutants

pytestmark = pytest.mark.slow
SLUG = "02_higher_order_and_fusion"  # the cheapest notebook to run
HONEST = ["honest_a", "honest_b"]
LAST_RESORT = ("could not prepare", "the grader failed", "could not be written", "could not be recorded")


def _generated(base: dict, count: int, at: int) -> list[str]:
    found: list[str] = []

    @seed(at)
    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(mutants(base))
    def collect(text: str) -> None:
        found.append(text)

    collect()
    return found


@pytest.fixture(scope="module")
def fuzzed(request, tmp_path_factory):
    count, at = request.config.getoption("--fuzz"), request.config.getoption("--fuzz-seed")
    course = Course(tmp_path_factory.mktemp("fuzz"), [SLUG])
    model = with_answers(course, SLUG, solutions(SLUG))
    for student in HONEST:
        course.submit(student, SLUG, solutions(SLUG))
    clean = grade(course, SLUG, "--jobs", "2")
    assert clean.returncode == 0, clean.stderr
    before = rows(course)
    texts = _generated(json.loads(json.dumps(model)), count, at)
    for k, text in enumerate(texts):
        folder = course.root / "submitted" / f"f{k:04d}" / SLUG
        folder.mkdir(parents=True)
        (folder / f"{SLUG}.ipynb").write_bytes(as_bytes(text))
    result = grade(course, SLUG, "--jobs", "2", "--timeout", "60", timeout=60 + 3 * count)
    with open(course.root / "reports" / SLUG / "last-run.csv", newline="") as f:
        status = {row["student"]: row for row in csv.DictReader(f)}
    return course, before, texts, result, status


def test_the_run_grades_everyone_and_exits_cleanly(fuzzed):
    course, _, texts, result, status = fuzzed
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    assert set(status) == {f"f{k:04d}" for k in range(len(texts))}  # (the honest were graded before)
    assert all((course.root / "autograded" / student / SLUG).is_dir() for student in status)


def test_honest_students_keep_a_clean_runs_results(fuzzed):
    course, before, _, _, _ = fuzzed
    after = rows(course)
    assert {k: v for k, v in after.items() if k[0] in HONEST or k[0] == "source"} == before


def test_a_notebook_that_reads_is_never_rejected_whole(fuzzed):
    """Cells copied, deleted, retyped or carrying another's metadata are repaired, and the
    notebook is graded as far as it ran: nbgrader 0.9.6's own repair fails on many of them
    (KeyError), which rejected the whole notebook."""
    _, _, texts, _, status = fuzzed
    rejected = {student: row["problems"] for student, row in status.items() if "cannot repair" in row["problems"]}
    examples = {student: texts[int(student[1:])][:400] for student in list(rejected)[:3]}
    assert not rejected, f"{len(rejected)} mutants rejected whole: {rejected}\nexamples: {examples}"


def test_no_mutant_reaches_code_that_trusts_it(fuzzed):
    _, _, texts, _, status = fuzzed
    trusted = {student: row["problems"] for student, row in status.items()
               if any(reason in row["problems"] for reason in LAST_RESORT)}
    examples = {student: texts[int(student[1:])][:400] for student in list(trusted)[:3]}
    assert not trusted, f"{len(trusted)} mutants reached the grader's last resort: {trusted}\nexamples: {examples}"



def test_no_reply_costs_the_grader_more_than_its_bounds(request):
    """Replies with empty, huge (declared or real), broadcastable and stride-0 tensors of any
    dtype, to any request of two of notebook 03's checks, hidden and visible: the grader's
    peak memory stays within 600 MB of an honest check's and each check's CPU within 5 s
    (before every tensor was bounded, one reply of shape (8000000, 0) cost 9.3 CPU-s and
    1.3 GB, one broadcast against the reference 770 MB; measured here), and every check ends
    with a verdict or a refusal that names the problem."""
    count, at = request.config.getoption("--fuzz-replies"), request.config.getoption("--fuzz-seed")
    script = Path(hostile_replies.__file__)
    ran = subprocess.run([sys.executable, str(script), str(count), str(at)], capture_output=True, text=True,
                         timeout=120 + 5 * count)
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found["over_baseline"] <= hostile_replies.MEMORY, found
    assert found["slowest"] <= hostile_replies.CPU, found
    endings = {"passed", "CheckFailed", "RemoteError", "Malformed"}
    assert set(found["ended"]) <= endings, found["ended"]
    assert sum(found["ended"].values()) == count and len(found["ended"]) > 2, found["ended"]
