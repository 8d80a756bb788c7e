"""How the test workers' units of work are ordered (tests/scheduling.py): longest first, by
tests/costs.json, and every unit runs, whether costs.json knows it or not."""
from __future__ import annotations

import random

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
