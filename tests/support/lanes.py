"""``--lane K/N``: the whole suite split into N pytest processes that take about as long as each other.

The full run is several pytest processes at once (``python3 -m fanout_sink.bootstrap test``): one
process leaves the machine's cores idle while it waits on commit intervals and restarts. Splitting it
by marker left one lane twelve minutes longer than the others, and every new slow test moved the
balance. Here every lane collects the same tests, puts them into units that must stay in one process,
and deals the units out longest first to the lane with the least time so far, by the seconds each test
took in an earlier run (``tests/durations.json``). A unit is a test module (its module fixtures are
built once), except that the tests on the shared storage servers or on the Spark cluster are one unit
each: those session fixtures cost minutes of JVM start-up in every process that builds them; and the
modules that take the shared Spark session or the TLS broker are one unit each (seconds of start-up).

With ``--lane-claims DIR`` (what the bootstrap passes) the lanes do not deal the units out in
advance: each lane takes the longest unit no lane has taken yet, runs it, then takes the next, by
creating the unit's file in ``DIR`` (``O_EXCL``: one lane wins). A test's seconds differ from one run
to the next by half and more on a loaded machine (what else runs beside it), so a deal made in advance
from an earlier run's seconds had ended its lanes up to three minutes apart (1,072-1,241 s in one
clean-clone run): the run lasts as long as its longest lane. Taken as they come, the lanes end within
about one short unit of each other, and the longest units start first instead of last in one lane.

``--durations-out PATH`` writes the seconds this process's tests took (set-up, call and tear-down
together), which the bootstrap merges into ``.pytest-lanes/durations.json`` for the next rebalance.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
"""Seconds per test id from an earlier full run: the lanes' weights."""

_GUESS_BY_MARKER = (
    ("chaos", 300.0),
    ("cluster", 60.0),
    ("own_spark", 60.0),
    ("stores", 20.0),
    ("kafka", 8.0),
)
"""A test not in ``DURATIONS`` yet (new, or renamed) weighs what its kind usually takes."""
_GUESS_OTHERWISE = 0.5

_SHARED_SERVERS = (
    ("cluster", ("spark_cluster", "executor_pack")),
    ("stores", ("object_store_process", "rest_catalog_process", "postgres_process")),
)
"""Unit name -> the session fixtures whose tests stay in one process."""

_SHARED_SESSIONS = (
    ("spark session", ("spark",)),
    ("tls broker", ("tls_broker",)),
)
"""Unit name -> session fixtures whose test modules (whole) go to one process: every process that
builds one pays its start-up again (the Spark session 10 CPU s, the TLS broker 6.5, measured), and the
modules using them, dealt one by one, had put the Spark session in all three lanes and the TLS broker
in two."""

CLAIMED_AT_COLLECTION = ("expiring_broker", "expired")
"""Fixtures that a plugin starts in the background once the tests are collected, when
``session.items`` holds a test taking one (tests/support/expiry_fixtures.py: a broker and a minute of
offset expiry). With ``--lane-claims`` one lane takes every unit holding such a test at collection and
the others drop them from their ``session.items``, or every lane would start it."""

_PLAN = pytest.StashKey[str]()
_CLAIMS = pytest.StashKey["_Claims"]()
_LANE = re.compile(r"^([1-9][0-9]*)/([1-9][0-9]*)$")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lanes")
    group.addoption("--lane", default=None, help="K/N: only the K-th of N balanced lanes of the selection")
    group.addoption(
        "--lane-claims",
        default=None,
        help="DIR shared by the N lanes: each takes the longest unit not yet taken, as it goes (with --lane)",
    )
    group.addoption("--durations-out", default=None, help="write each test's seconds to this JSON file")


def parse_lane(text: str) -> tuple[int, int]:
    """``"2/5"`` -> ``(2, 5)``; anything else is a usage error naming the form."""
    match = _LANE.match(text)
    if match is None or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise pytest.UsageError(f"--lane {text!r}: give K/N with 1 <= K <= N, e.g. --lane 2/5")
    return int(match.group(1)), int(match.group(2))


def unit_of(item: pytest.Item) -> str:
    """The unit ``item`` is dealt out with: its shared servers' name, else its module."""
    names = set(getattr(item, "fixturenames", ()))
    for unit, fixtures in _SHARED_SERVERS:
        if names.intersection(fixtures):
            return unit
    return _module(item)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def units_of(items: list[pytest.Item]) -> list[str]:
    """Each item's unit: ``unit_of``, then every module with a test on a ``_SHARED_SESSIONS`` fixture
    (and not on the shared servers) joins that session's unit with all its tests."""
    units = [unit_of(item) for item in items]
    for name, fixtures in _SHARED_SESSIONS:
        modules = {
            unit
            for item, unit in zip(items, units, strict=True)
            if unit == _module(item) and set(fixtures) & set(getattr(item, "fixturenames", ()))
        }
        units = [name if unit in modules else unit for unit in units]
    return units


def weight_of(item: pytest.Item, known: dict[str, float]) -> float:
    if item.nodeid in known:
        return known[item.nodeid]
    return next(
        (seconds for marker, seconds in _GUESS_BY_MARKER if item.get_closest_marker(marker) is not None),
        _GUESS_OTHERWISE,
    )


def deal(units: dict[str, float], lanes: int) -> dict[str, int]:
    """Unit -> lane index (0-based): longest unit first to the lane with the least so far (ties: the
    lower index, units by name), so every process computes the same split from the same collection."""
    totals = [0.0] * lanes
    chosen: dict[str, int] = {}
    for unit, seconds in sorted(units.items(), key=lambda pair: (-pair[1], pair[0])):
        lane = min(range(lanes), key=lambda index: (totals[index], index))
        chosen[unit] = lane
        totals[lane] += seconds
    return chosen


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    return {str(k): float(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After ``-m`` and the opt-in markers have selected (``trylast``), keep this lane's units only."""
    option = config.getoption("--lane")
    if option is None:
        return
    index, count = parse_lane(str(option))
    known = load_durations()
    unit_by_item = units_of(items)
    units: dict[str, float] = {}
    for item, unit in zip(items, unit_by_item, strict=True):
        units[unit] = units.get(unit, 0.0) + weight_of(item, known)
    claims = config.getoption("--lane-claims")
    if claims is not None:
        order = sorted(units, key=lambda unit: (-units[unit], unit))
        members: dict[str, list[pytest.Item]] = {unit: [] for unit in order}
        for item, unit in zip(items, unit_by_item, strict=True):
            members[unit].append(item)
        taking = _Claims(Path(claims), index, [(unit, members[unit]) for unit in order])
        early = {
            unit
            for unit in order
            if any(
                set(CLAIMED_AT_COLLECTION) & set(getattr(item, "fixturenames", ())) for item in members[unit]
            )
        }
        if early and taking.create("the units claimed at collection"):
            taking.reserved |= early
        elif early:
            dropped = [item for unit in early for item in members[unit]]
            config.hook.pytest_deselected(items=dropped)
            kept = set(items) - set(dropped)
            items[:] = [item for item in items if item in kept]
            taking.units = [(unit, tests) for unit, tests in taking.units if unit not in early]
        config.stash[_CLAIMS] = taking
        config.stash[_PLAN] = (
            f"lane {index}/{count}: takes units longest first as it goes, from {claims} "
            f"({len(order)} units, {sum(units.values()):.0f} s in all by {DURATIONS.name})"
        )
        return
    chosen = deal(units, count)
    mine = sorted((unit for unit, lane in chosen.items() if lane == index - 1), key=lambda u: -units[u])
    config.stash[_PLAN] = (
        f"lane {index}/{count}: {sum(units[u] for u in mine):.0f} s by {DURATIONS.name} "
        f"(longest units: {', '.join(f'{u} {units[u]:.0f} s' for u in mine[:4])})"
    )
    here = [chosen[unit] == index - 1 for unit in unit_by_item]
    elsewhere = [item for item, kept in zip(items, here, strict=True) if not kept]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item, kept in zip(items, here, strict=True) if kept]


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    """The lane's expected seconds and its longest units, first in its log."""
    return config.stash.get(_PLAN, None)


class _Claims:
    """The units in the order lanes take them, and the ones this lane took."""

    def __init__(self, folder: Path, lane: int, units: list[tuple[str, list[pytest.Item]]]) -> None:
        self.folder, self.lane, self.units = folder, lane, units
        self.reserved: set[str] = set()  # taken at collection (``CLAIMED_AT_COLLECTION``)
        self.taken: list[str] = []

    def create(self, name: str) -> bool:
        """Whether this lane is the first to take ``name`` (its file created here, ``O_EXCL``)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / hashlib.sha256(name.encode()).hexdigest()[:16]
        try:
            handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(handle, "w") as out:
            out.write(f"lane {self.lane}: {name}\n")
        return True

    def take(self, unit: str) -> bool:
        if unit in self.reserved or self.create(unit):
            self.taken.append(unit)
            return True
        return False

    def items(self) -> Iterator[tuple[pytest.Item, pytest.Item | None]]:
        """Each test of the units this lane takes, with the next test of its unit (None after the
        last): a unit is taken only once the one before it ran, by the lane that is free first."""
        for unit, members in self.units:
            if members and self.take(unit):
                yield from zip(members, [*members[1:], None], strict=True)


class _Boundary:
    """The next test as the last test of a unit tears down: only the session stays (its broker and
    Spark session serve whatever unit the lane takes next); the module's and the folders' fixtures go."""

    def __init__(self, session: pytest.Session) -> None:
        self.session = session

    def listchain(self) -> list[pytest.Session]:
        return [self.session]


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """With ``--lane-claims``: pytest's loop over the tests of the units this lane takes as it goes."""
    claims = session.config.stash.get(_CLAIMS, None)
    if claims is None or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} errors during collection")
    boundary = _Boundary(session)
    for item, following in claims.items():
        nextitem = boundary if following is None else following
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
    return True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Which units this lane took, in order: where a test ran, for a failure that depends on it."""
    claims = config.stash.get(_CLAIMS, None)
    if claims is not None:
        terminalreporter.write_line(f"lane {claims.lane} took: {', '.join(claims.taken) or 'no unit'}")


class _Timer:
    """Sums each test's set-up, call and tear-down seconds and writes them at the session's end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    @pytest.hookimpl
    def pytest_sessionfinish(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({k: round(v, 1) for k, v in self.seconds.items()}) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    out = config.getoption("--durations-out")
    if out is not None:
        config.pluginmanager.register(_Timer(Path(out)), "lane-durations")
