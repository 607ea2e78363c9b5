"""fanout_sink itself in the side-by-side benchmark: ``run --available-now`` and a continuous run.

Both start ``python -m fanout_sink.cli run`` as a child, so Spark's start-up counts. The steady
state comes from the app's batch log lines: from the first batch's start (its end minus its
duration) to the last batch's end, over the batches that carried records.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench.context import RunContext, SystemRun
from bench.landed import landed
from bench.proctree import TreeUsage, run_child
from bench.workload import NAMESPACE, ROUTE_FIELD
from fanout_sink.catalog import CatalogSettings

TRIGGER_INTERVAL = "2s"
CONTINUOUS = "fanout_sink continuous"
_TIMED_BATCH_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO fanout_sink\.app: batch \d+: (\d+) records in"
    r".*\((\d+\.\d+)s, \d+ slices, peak worker RSS (\d+) MB\)",
    re.MULTILINE,
)
_COMMIT_JOB = re.compile(r"commit \S+: (\d+) tables in \d+ Spark task\(s\), (\d+\.\d) s")
_GROUPS_LINE = re.compile(r"packing source partitions into (\d+) partition group")


def sink_config(ctx: RunContext, name: str) -> dict[str, Any]:
    """The sink's YAML for this run: one static rule per table on the route field."""
    tables = {
        table: {"when": f"{ROUTE_FIELD} == '{table.rsplit('.', 1)[1]}'"}
        for table in ctx.variant.table_names()
    }
    config = app_config(
        name, ctx.bootstrap, ctx.topic, ctx.commit_interval_s, ctx.settings, ctx.master, ctx.folder, tables
    )
    if ctx.maintenance:
        config["maintenance"] = dict(ctx.maintenance)
    if ctx.spark:
        config["spark"].update(ctx.spark)
    return config


def app_config(
    name: str,
    bootstrap: str,
    topic: str,
    commit_interval_s: float,
    settings: CatalogSettings,
    master: str,
    folder: Path,
    tables: dict[str, Any],
) -> dict[str, Any]:
    """A benchmark sink's YAML: JSON from ``topic`` into ``tables``, checkpoints under ``folder``."""
    return {
        "name": name,
        "kafka": {"bootstrap.servers": bootstrap},
        "source": {"topics": [topic], "format": "json"},
        "control": {"topic": f"{name}-control", "commit-interval": f"{commit_interval_s:g}s"},
        "catalog": settings.model_dump(),
        "spark": {"master": master, "checkpoint-location": str(folder / "checkpoints")},
        "tables": tables,
    }


def dynamic_command(
    ctx: RunContext,
    name: str,
    trigger_interval: str,
    routes: dict[str, Any] | None = None,
    dynamic_commit_interval_s: float | None = None,
) -> list[str]:
    """The command of sink ``name`` routing dynamically by the record's route field (which holds the
    whole table name) into the existing tables of ``ctx``, in continuous micro-batches of at most
    ``ctx.max_offsets_per_trigger`` records every ``trigger_interval``: how a sink carries hundreds of
    tables (the backlog and the wide app benchmarks). ``routes``: tables declared under ``tables:``
    besides; ``dynamic_commit_interval_s``: ``dynamic.commit-interval`` (the wide app's cadence)."""
    config = app_config(
        name,
        ctx.bootstrap,
        ctx.topic,
        ctx.commit_interval_s,
        ctx.settings,
        ctx.master,
        ctx.folder,
        routes or {},
    )
    config["dynamic"] = {"table": ROUTE_FIELD, "allow": rf"^{NAMESPACE}\.t[0-9]+$", "applies-to": "all"}
    if dynamic_commit_interval_s is not None:
        config["dynamic"]["commit-interval"] = f"{dynamic_commit_interval_s:g}s"
    path = ctx.folder / "sink.yaml"
    path.write_text(yaml.safe_dump(config))
    return app_command(
        path, ctx.master, ctx.max_offsets_per_trigger, ["--trigger-interval", trigger_interval]
    )


def timed_batches(log: str) -> list[tuple[float, int, float]]:
    """(end as epoch seconds, records, seconds) of every record-carrying batch the app logged."""
    return [
        (datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp(), int(records), float(seconds))
        for stamp, records, seconds, _ in _TIMED_BATCH_LINE.findall(log)
        if int(records) > 0
    ]


def commit_jobs(log: str) -> list[tuple[int, float]]:
    """(tables, seconds) of every table-commit Spark job the app logged (rounds committed on executors)."""
    return [(int(tables), float(seconds)) for tables, seconds in _COMMIT_JOB.findall(log)]


def partition_groups(log: str) -> int | None:
    """The partition groups the app packed its source partitions into (Spark tasks per batch at most)."""
    found = _GROUPS_LINE.search(log)
    return int(found.group(1)) if found else None


def steady_seconds(log: str) -> tuple[float | None, int]:
    """(seconds from the first record-carrying batch's start to the last one's end, records in them)."""
    batches = timed_batches(log)
    if not batches:
        return None, 0
    first_start = batches[0][0] - batches[0][2]
    return max(batches[-1][0] - first_start, 1e-3), sum(b[1] for b in batches)


def first_batch_started(log: str) -> float | None:
    """When the first record-carrying batch started (epoch seconds): the app's start-up ends there."""
    batches = timed_batches(log)
    return batches[0][0] - batches[0][2] if batches else None


def app_command(
    config: Path,
    master: str,
    max_offsets_per_trigger: int | None,
    extra: list[str],
    module: str = "fanout_sink.cli",
) -> list[str]:
    """``fanout-sink run`` on ``config`` as a child command line (this interpreter, this checkout);
    ``module`` another entry point with the same ``run`` options (the planner prototype's); no
    ``max_offsets_per_trigger``: the sink sizes its batches itself."""
    limit = ["--max-offsets-per-trigger", str(max_offsets_per_trigger)] if max_offsets_per_trigger else []
    return [
        sys.executable, "-m", module, "run", "--config", str(config), "--master", master, *limit, *extra,
    ]  # fmt: skip


def run_app(
    ctx: RunContext,
    system: str,
    extra: list[str],
    continuous: bool,
    module: str = "fanout_sink.cli",
    usage: TreeUsage | None = None,
    until: Callable[[], float] | None = None,
) -> SystemRun:
    """One measured run of the app (``module``'s ``run``) on this run's sink YAML; ``usage`` (the soak
    mode's) fills as it runs. A continuous run stops once ``until()`` rows (default ``ctx.records``)
    are visible."""
    catalog = ctx.prepare()
    name = ctx.unique_name(system)
    config = ctx.folder / "sink.yaml"
    config.write_text(yaml.safe_dump(sink_config(ctx, name)))
    command = app_command(config, ctx.master, ctx.max_offsets_per_trigger, extra, module)
    visible = ctx.visible()
    run = run_child(
        command,
        env=ctx.child_env(),
        log=ctx.folder / "app.log",
        done=(lambda: visible.total() >= (until() if until else ctx.records)) if continuous else None,
        timeout_s=ctx.timeout_s,
        cpus=ctx.taskset,
        usage=usage,
    )
    # A stopped app exits 0 on SIGTERM; anything else is a failed run, not a slow one.
    if run.returncode != 0 and not (continuous and run.returncode in (-15, 143)):
        raise run.failure(system, ctx.folder / "app.log")
    steady, _ = steady_seconds(run.stderr)
    return SystemRun.of_child(system, run, landed(catalog, ctx.variant.table_names()), steady_s=steady)


def available_now(ctx: RunContext) -> SystemRun:
    return run_app(ctx, "fanout_sink available-now", ["--available-now"], continuous=False)


def continuous(
    ctx: RunContext, usage: TreeUsage | None = None, until: Callable[[], float] | None = None
) -> SystemRun:
    """The app running until every record is visible; the soak mode's ``usage`` fills as it runs and
    its ``until`` is the count produced, known once producing ends."""
    args = ["--trigger-interval", TRIGGER_INTERVAL]
    return run_app(ctx, CONTINUOUS, args, continuous=True, usage=usage, until=until)


def sink_name(ctx: RunContext) -> str:
    """The continuous run's sink name, hence its sink-managed group (the soak mode reads its lag)."""
    return ctx.unique_name(CONTINUOUS)
