"""How the test workers share a run (pytest-xdist, `--dist loadgroup`).

A unit of work runs in one worker. Tests that share a set-up made once per module (a
module-scoped fixture: a graded course, a server, a browser), a notebook's class batch
(conftest's `class_batches`) or an `xdist_group` form one unit, so that set-up is made once
in the run, not once by each worker that happens to run one of them. Every other test is a
unit of its own.

The units start longest first (as `--no-loadscope-reorder` keeps them), so that no long
unit starts when the others are nearly done and leaves the other workers idle. How long
each is comes from tests/costs.json, the seconds each took in a run measured with
`pytest --cost=DIR` (tests/cost.py writes it); a unit it does not know counts a second a test.
"""
from __future__ import annotations

import json
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
    for name, tests in found.items():
        if name != tests[0].nodeid:
            for item in tests:
                item.add_marker(pytest.mark.xdist_group(name))
                item.add_marker(pytest.mark.slow)
    if ordered:
        longest = sorted(found.items(), key=lambda unit: -costs.get(unit[0], len(unit[1])))
        items[:] = [item for _, tests in longest for item in tests]
