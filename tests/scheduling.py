"""How the test workers share a run (pytest-xdist, `--dist loadgroup`).

A unit of work runs in one worker. Tests that share a set-up made once per module (a
module-scoped fixture: a graded course, a server, a browser), a notebook's class batch
(conftest's `class_batches`) or an `xdist_group` form one unit, so that set-up is made once
in the run, not once by each worker that happens to run one of them. Every other test is a
unit of its own.

The units start longest first (as `--no-loadscope-reorder` keeps them), so that no long
unit starts when the others are nearly done and leaves the other workers idle. How long
each is comes from tests/costs.json, the seconds each took in a run measured with
`pytest --cost=DIR` (tests/cost.py writes it, units of 5 s or more). A unit it does not know
(a new test, or one under 5 s) still runs: alone, it counts a second a test; sharing a
set-up, the median seconds a test of the shared units it knows (a new graded notebook starts
among the long ones: a long unit started last is what leaves workers idle). Every worker
orders the same collection the same way (pytest-xdist requires it): ties keep the
collection's order.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

COSTS = Path(__file__).with_name("costs.json")
SHARED_SCOPES = ("module", "class", "package")


def shared_setups(item: pytest.Item) -> set[str]:
    """What `item` shares with other tests: each module-scoped fixture it uses (one per
    parameter), the notebook whose class batch it reads, the xdist_group it names."""
    found = {f"group {mark.args[0]}" for mark in item.iter_markers("xdist_group")}
    params = item.callspec.params if hasattr(item, "callspec") else {}
    # pytest keeps the fixtures an item uses (their definitions) in its private _fixtureinfo.
    for name, definitions in item._fixtureinfo.name2fixturedefs.items():
        if definitions[-1].scope in SHARED_SCOPES:
            found.add(f"fixture {item.path.name}::{name}[{params.get(name, '')}]")
    if "class_batches" in item.fixturenames:
        slug = params.get("graded") or params.get("slug")
        if slug:
            found.add(f"notebook {slug}")
    return found


def units(items: list[pytest.Item]) -> dict[str, list[pytest.Item]]:
    """{unit name: its tests, in collection order}: the tests linked by shared set-ups, each
    other test alone (its node id). A unit with an xdist_group is named after it, one with a
    class batch after its notebook, else after its test file."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    shared = {item: sorted(shared_setups(item)) for item in items}
    for keys in shared.values():
        for key in keys:
            parent[root(key)] = root(keys[0])
    members: dict[str, set[str]] = {}
    for key in list(parent):
        members.setdefault(root(key), set()).add(key)
    found: dict[str, list[pytest.Item]] = {}
    for item, keys in shared.items():
        found.setdefault(_name(members[root(keys[0])], item) if keys else item.nodeid, []).append(item)
    return found


def _name(keys: set[str], item: pytest.Item) -> str:
    for kind in ("group ", "notebook "):
        named = sorted(k.removeprefix(kind) for k in keys if k.startswith(kind))
        if named:
            return named[0]
    fixtures = sorted({k.split("::")[1].split("[")[0] for k in keys})
    return f"{item.path.name}::{','.join(fixtures)}"


def schedule(items: list[pytest.Item], ordered: bool) -> None:
    """Mark each shared unit as one xdist_group, and slow: what is set up once per module is
    a graded course, a server or a browser (`make check` runs none). `ordered`: put the
    units longest first."""
    costs = json.loads(COSTS.read_text()) if COSTS.exists() else {}
    found = units(items)
    shared = {name for name, tests in found.items() if name != tests[0].nodeid}
    for name in shared:
        for item in found[name]:
            item.add_marker(pytest.mark.xdist_group(name))
            item.add_marker(pytest.mark.slow)
    if ordered:
        order = longest_first({name: len(tests) for name, tests in found.items()}, shared, costs)
        items[:] = [item for name in order for item in found[name]]


def longest_first(tests: dict[str, int], shared: set[str], costs: dict[str, float]) -> list[str]:
    """The units (`tests`: each one's number of tests, in collection order), longest first by
    their seconds in `costs`; a unit `costs` lacks is estimated as the module says."""
    rates = [costs[name] / tests[name] for name in shared if name in costs]
    rate = statistics.median(rates) if rates else 1.0

    def seconds(name: str) -> float:
        return costs.get(name, tests[name] * (rate if name in shared else 1.0))

    return sorted(tests, key=lambda name: -seconds(name))  # stable: ties in collection order
