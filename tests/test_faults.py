"""Fault points are inert unless named in FANOUT_SINK_FAULTS."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout_sink import faults


def test_fault_points_do_nothing_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.ENV_VAR, raising=False)
    faults.fault_point("worker.before-commit")
    monkeypatch.setenv(faults.ENV_VAR, "other.point=kill, worker.before-commit=raise")
    with pytest.raises(faults.InjectedFault, match=r"worker\.before-commit"):
        faults.fault_point("worker.before-commit")
    monkeypatch.setenv(faults.ENV_VAR, "worker.before-commit=explode")
    with pytest.raises(ValueError, match="unknown fault action"):
        faults.fault_point("worker.before-commit")


def test_registered_callbacks_get_the_context() -> None:
    seen: list[object] = []
    with faults.register("p", lambda **ctx: seen.append(ctx)):
        faults.fault_point("p", table="t")
    faults.fault_point("p", table="after")
    assert seen == [{"table": "t"}]


def test_when_fires_once_per_arming(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    armed = tmp_path / "arm"
    monkeypatch.setenv(faults.ENV_VAR, f"coordinator.before-table-commit=when:{armed}:raise")
    faults.fault_point("coordinator.before-table-commit")  # not armed: nothing happens
    armed.touch()
    with pytest.raises(faults.InjectedFault):
        faults.fault_point("coordinator.before-table-commit")
    assert not armed.exists(), "firing disarms the point"
    faults.fault_point("coordinator.before-table-commit")
    monkeypatch.setenv(faults.ENV_VAR, f"p=when:{armed}:stop")
    with pytest.raises(ValueError, match="when:PATH:kill"):
        faults.fault_point("p")


def test_an_armed_wait_holds_the_point_until_released(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The chaos runner's layout-change: a worker waits in its transaction until a second app started."""
    armed, release = tmp_path / "a:b" / "layout-change", tmp_path / "release"
    armed.parent.mkdir()
    polls: list[float] = []

    def poll(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 3:
            release.touch()

    monkeypatch.setattr(faults.time, "sleep", poll)
    monkeypatch.setenv(faults.ENV_VAR, f"worker.before-commit=when:{armed}:wait:{release}")
    faults.fault_point("worker.before-commit")  # not armed: no wait
    assert polls == []
    armed.touch()
    faults.fault_point("worker.before-commit")
    assert len(polls) == 3 and not armed.exists()


def test_an_armed_sleep_stalls_the_point_once_per_arming(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The chaos runner's catalog-stall: a worker's catalog call hangs once, when the runner arms it
    (a path with a colon in it still names the file)."""
    armed = tmp_path / "a:b" / "catalog-stall"
    armed.parent.mkdir()
    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    monkeypatch.setenv(faults.ENV_VAR, f"worker.table-check=when:{armed}:sleep:2.5")
    faults.fault_point("worker.table-check")  # not armed: no stall
    armed.touch()
    faults.fault_point("worker.table-check")
    assert slept == [2.5] and not armed.exists()
    faults.fault_point("worker.table-check")
    assert slept == [2.5], "once per arming"


def test_a_point_named_twice_runs_each_armed_action(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The chaos runner's commit failure and coordinator kill share the point before a table commit."""
    fail, other = tmp_path / "fail", tmp_path / "other"
    point = "coordinator.before-table-commit"
    monkeypatch.setenv(faults.ENV_VAR, f"{point}=when:{other}:raise,{point}=when:{fail}:raise")
    faults.fault_point(point)  # neither armed
    fail.touch()
    with pytest.raises(faults.InjectedFault):
        faults.fault_point(point)
    assert not fail.exists() and not other.exists()
    other.touch()
    with pytest.raises(faults.InjectedFault):
        faults.fault_point(point)
    assert not other.exists()
