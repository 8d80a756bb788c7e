"""How the test workers' units of work are ordered (tests/scheduling.py): longest first, by
tests/costs.json, and every unit runs, whether costs.json knows it or not."""
from __future__ import annotations

import json
import random

import cost
from scheduling import longest_first

# Two graded notebooks (shared set-ups, 5 s a test) and a long lone test, as costs.json has them.
COSTS = {"04_gradient_patterns": 400, "browser": 50, "03_function_basics": 200,
         "tests/test_x.py::test_slow": 100}
TESTS = {"03_function_basics": 40, "tests/test_x.py::test_slow": 1, "browser": 10, "04_gradient_patterns": 80}
SHARED = {"03_function_basics", "browser", "04_gradient_patterns"}


def test_known_units_start_longest_first():
    assert longest_first(TESTS, SHARED, COSTS) == [
        "04_gradient_patterns", "03_function_basics", "tests/test_x.py::test_slow", "browser"]


def test_a_new_graded_notebook_starts_among_the_long_units_and_new_lone_tests_still_run():
    """A unit costs.json lacks (from a branch merged since it was written) is estimated: a new
    shared set-up at the median seconds a test of the known ones (5 s: its 60 tests, 300 s),
    not a second a test, which would start it last, with the workers otherwise done."""
    tests = {"tests/test_new.py::test_a": 1, **TESTS, "06_views_and_inplace": 60, "tests/test_new.py::test_b": 1}
    order = longest_first(tests, SHARED | {"06_views_and_inplace"}, COSTS)
    assert order == ["04_gradient_patterns", "06_views_and_inplace", "03_function_basics",
                     "tests/test_x.py::test_slow", "browser", "tests/test_new.py::test_a", "tests/test_new.py::test_b"]


def test_the_order_is_the_same_whatever_order_costs_json_lists_units_in_or_which_it_no_longer_has():
    """pytest-xdist runs a collection only where every worker ordered it the same: the order
    depends on the collection and the costs alone; ties keep the collection's order."""
    tests = {f"tests/test_t.py::test_{i}": 1 for i in range(20)} | TESTS
    expected = longest_first(tests, SHARED, COSTS)
    shuffled = list(COSTS.items()) + [("a unit since renamed", 1000)]
    random.Random(20261128).shuffle(shuffled)
    assert longest_first(tests, SHARED, dict(shuffled)) == expected
    assert expected[4:] == [f"tests/test_t.py::test_{i}" for i in range(20)]


def test_without_costs_every_unit_counts_a_second_a_test():
    assert longest_first(TESTS, SHARED, {}) == [
        "04_gradient_patterns", "03_function_basics", "browser", "tests/test_x.py::test_slow"]


def test_costs_json_sums_each_units_phases_over_the_workers_and_keeps_units_of_five_seconds(tmp_path):
    """tests/cost.py --write-costs: a unit's set-up, calls and teardowns in every process
    summed; units under 5 s left out (they count as new ones); ties in name order."""
    def phase(process, unit, wall):
        return json.dumps({"process": process, "test": f"{unit}::t", "unit": unit, "when": "call",
                           "start": 0.0, "wall": wall, "cpu": wall, "children": 0.0})
    (tmp_path / "gw0.jsonl").write_text("\n".join([phase("gw0", "b", 4.0), phase("gw0", "a", 3.0)]) + "\n")
    (tmp_path / "gw1.jsonl").write_text("\n".join([phase("gw1", "b", 3.0), phase("gw1", "c", 4.9),
                                                   phase("gw1", "a", 4.0)]) + "\n")
    assert list(cost.unit_costs(tmp_path).items()) == [("a", 7), ("b", 7)]


def test_the_machines_busy_time_is_shared_by_the_tests_running_then():
    """tests/cost.py: between two readings of the machine's counter, the busy seconds go in
    equal parts to the phases running then, a sandbox's work (no phase's own CPU) included."""
    a = {"test": "a", "start": 0.0, "wall": 10.0, "machine": [100.0, 118.0]}  # 18 s busy in its 10 s
    b = {"test": "b", "start": 5.0, "wall": 10.0, "machine": [106.0, 120.0]}
    shares = cost.machine_shares([a, b])
    # 0–5 s: a alone (6 s busy); 5–10 s: both (12 s, 6 each); 10–15 s: b alone (2 s)
    assert shares == {0: 12.0, 1: 8.0}
    assert cost.machine_shares([dict(a, machine=[None, None])]) == {}
