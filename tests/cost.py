"""`pytest --cost=DIR`: what each test costs, and where a run's time goes.

Each process of the run (every test worker, and the controller) writes JSON lines to
DIR/NAME.jsonl: one per test phase (set-up, call, teardown) with its wall time and the
CPU time of the process and of the processes it started and waited for
(`getrusage(RUSAGE_CHILDREN)`: a server a fixture started counts once it is stopped and
reaped; a daemon that was never a child, as PostgreSQL's, does not count, nor does
anything in a sandbox: bubblewrap's own PID namespace hands no child's time back), the
machine's busy CPU seconds when it began and ended (/proc/stat: everything, sandboxes
included), and one for the whole session. The run ends with a summary: wall and CPU time
(CPU% of wall, counted both ways), each worker's busy time and when it ran out of work, the
slowest tests, and the machine's CPU per test file: each stretch of the machine's busy time
shared equally by the tests running then, an estimate that sees the sandboxes' work.
`python tests/cost.py DIR` prints it again, and with `--write-costs` writes each unit of
work's wall seconds to tests/costs.json, which orders the units of later runs (the longest
first: tests/scheduling.py). A fixture's set-up counts to the first test that uses it.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

from scheduling import COSTS

SLOWEST = 10
RECORDING = "AUTOGRAD_COURSE_COST_RECORDER"  # the pid of the run's main process


def pytest_addoption(parser):
    parser.addoption("--cost", metavar="DIR", help="record each test's wall and CPU time in DIR and summarise the run "
                                                   "(write --cost=DIR: a test worker takes an existing DIR given "
                                                   "apart for a test path)")


def pytest_configure(config):
    folder = config.getoption("--cost")
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    # Only the run's own processes record: not a pytest that a test runs (PYTEST_ADDOPTS
    # passes it --cost too), whose processes count as that test's children already.
    ours = os.environ.get(RECORDING) == str(os.getppid()) if worker != "main" else RECORDING not in os.environ
    if folder and ours:
        os.environ[RECORDING] = str(os.getpid())  # for its test workers, started after this
        # The controller of test workers counts none of its children: they are the workers.
        controller = worker == "main" and config.getoption("dist", "no") != "no"
        config.pluginmanager.register(Recorder(Path(folder), worker, not controller), "cost-recorder")


def _cpu() -> tuple[float, float]:
    """(this process's CPU seconds, its reaped children's)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _machine() -> float | None:
    """The machine's busy CPU seconds since it started (all its processes), if /proc says."""
    try:
        fields = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _names(item: pytest.Item) -> dict[str, str]:
    """The test, and the unit of work it is part of (tests/scheduling.py): its xdist_group, or itself."""
    test = item.nodeid.split("@")[0]
    group = item.get_closest_marker("xdist_group")
    return {"test": test, "unit": group.args[0] if group else test}


class Recorder:
    def __init__(self, folder: Path, name: str, children: bool) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.name, self.children = folder, name, children
        self.out = open(folder / f"{name}.jsonl", "w", buffering=1)
        self.started, self.machine = time.time(), _machine()

    @contextlib.contextmanager
    def measured(self, **record):
        start, (own, children), wall, machine = time.time(), _cpu(), time.monotonic(), _machine()
        try:
            yield
        finally:
            own_after, children_after = _cpu()
            record.update(process=self.name, start=start, wall=time.monotonic() - wall, cpu=own_after - own,
                          children=children_after - children, machine=[machine, _machine()])
            self.out.write(json.dumps(record) + "\n")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        with self.measured(when="setup", **_names(item)):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        with self.measured(when="call", **_names(item)):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item):
        with self.measured(when="teardown", **_names(item)):
            return (yield)

    def pytest_sessionfinish(self):
        own, children = _cpu()
        self.out.write(json.dumps({"process": self.name, "session": True, "start": self.started,
                                   "wall": time.time() - self.started, "cpu": own,
                                   "children": children if self.children else 0.0,
                                   "machine": [self.machine, _machine()]}) + "\n")
        self.out.flush()

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        if self.name == "main":  # the controller (its session recorded: this runs in its sessionfinish)
            terminalreporter.write_sep("-", "cost (tests/cost.py)")
            terminalreporter.write_line(summary(self.folder))


def summary(folder: Path) -> str:
    records = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    sessions = {r["process"]: r for r in records if r.get("session")}
    phases = [r for r in records if not r.get("session")]
    if not sessions:
        return f"no session recorded in {folder}"
    start = min(s["start"] for s in sessions.values())
    wall = max(s["start"] + s["wall"] for s in sessions.values()) - start
    cpu = sum(s["cpu"] + s["children"] for s in sessions.values())
    lines = [f"wall {wall:.0f} s, CPU {cpu:.0f} s ({100 * cpu / wall:.0f}% of wall), in {len(sessions)} processes"]
    main = sessions.get("main", {}).get("machine", [None, None])
    if None not in main:
        busy = main[1] - main[0]
        lines.append(f"the machine's CPUs (sandboxes too): busy {busy:.0f} s, {100 * busy / wall:.0f}% of wall "
                     f"on {os.cpu_count()} cores")
    by_process = collections.defaultdict(list)
    for r in phases:
        by_process[r["process"]].append(r)
    for name, rs in sorted(by_process.items()):
        busy = sum(r["wall"] for r in rs)
        used = sum(r["cpu"] + r["children"] for r in rs)
        done = max(r["start"] + r["wall"] for r in rs) - start
        lines.append(f"  {name}: in tests {busy:.0f} s (CPU {used:.0f} s, {100 * used / max(busy, 1e-9):.0f}%), "
                     f"last test ended at {done:.0f} s")
    shares = machine_shares(phases)
    tests: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for i, r in enumerate(phases):
        for key, table in ((r["test"], tests), (r["test"].split("::")[0], files)):
            table[key][0] += r["wall"]
            table[key][1] += r["cpu"] + r["children"]
            table[key][2] += shares.get(i, 0.0)
    lines.append(f"the {SLOWEST} slowest tests (wall s, CPU s counted, the machine's CPU s shared; "
                 "set-up, call and teardown):")
    for name, (w, c, m) in sorted(tests.items(), key=lambda kv: -kv[1][0])[:SLOWEST]:
        lines.append(f"  {w:7.1f} {c:7.1f} {m:7.1f}  {name}")
    lines.append("the machine's CPU by test file (its share, CPU s counted, wall s):")
    for name, (w, c, m) in sorted(files.items(), key=lambda kv: -kv[1][2]):
        lines.append(f"  {m:7.1f} {c:7.1f} {w:7.1f}  {name}")
    return "\n".join(lines)


def machine_shares(phases: list[dict]) -> dict[int, float]:
    """{phase's index: its share of the machine's busy CPU seconds}: between two readings of
    the machine's counter (any phase's start or end), the busy time is shared equally by the
    phases running then."""
    readings = sorted((t, busy) for r in phases if None not in r.get("machine", [None])
                      for t, busy in zip((r["start"], r["start"] + r["wall"]), r["machine"]))
    events = sorted((t, kind, i) for i, r in enumerate(phases)
                    for t, kind in ((r["start"], 0), (r["start"] + r["wall"], 1)))  # (starts before ends)
    shares: dict[int, float] = collections.defaultdict(float)
    running: set[int] = set()
    k = 0
    for (t0, b0), (t1, b1) in zip(readings, readings[1:]):
        middle = (t0 + t1) / 2
        while k < len(events) and events[k][0] <= middle:
            _, kind, i = events[k]
            (running.discard if kind else running.add)(i)
            k += 1
        for i in running:
            shares[i] += max(b1 - b0, 0.0) / len(running)
    return shares


def unit_costs(folder: Path, least: float = 5.0) -> dict[str, int]:
    """{unit of work: its wall seconds} of a recorded run, for units of `least` seconds or more."""
    found: dict[str, float] = collections.defaultdict(float)
    for path in sorted(folder.glob("*.jsonl")):
        for record in map(json.loads, path.read_text().splitlines()):
            if "unit" in record:
                found[record["unit"]] += record["wall"]
    return {unit: round(wall) for unit, wall in sorted(found.items(), key=lambda kv: (-kv[1], kv[0])) if wall >= least}


if __name__ == "__main__":
    if sys.argv[2:3] == ["--write-costs"]:  # what tests/scheduling.py orders the units by
        COSTS.write_text(json.dumps(unit_costs(Path(sys.argv[1])), indent=1) + "\n")
    print(summary(Path(sys.argv[1])))
