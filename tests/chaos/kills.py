"""The ways a chaos cycle breaks the sink, each one a real event a production sink lives through.

A few seconds of chaos, then the app's crashes:

- ``driver``: SIGKILL of the driver's whole process group at a random moment (a lost machine);
- ``python-worker``: SIGKILL of one busy PySpark Python worker (an executor's task dies mid-slice);
- ``broker``: the broker stops, stays away for a while, and starts again on the same ports and data;
- ``catalog-commit``: the next table commit to the catalog fails (an injected fault, the app lives on);
- ``coordinator``: SIGKILL of the driver at one of the coordinator's steps of a table commit
  (``COORDINATOR_POINTS``, seeded): right after a change table's position deletes were resolved,
  right before a table's catalog commit, or right after it and before the next table's. With change
  traffic on, the first two land inside a change table's resolution and commit.
- ``catalog-stall``: one Python worker's catalog call hangs ``CATALOG_STALL_S`` (the ``worker.table-check``
  fault point, armed with ``sleep``: the catalog load of the table re-check after the slice's files
  are written, before their age check and transaction), longer than the orphan age; while it hangs,
  orphan cleanup (``fanout_sink.protocol.orphans``, what ``fanout-sink maintain``'s orphan step runs,
  without its JVM) runs on every sink table once the stalled worker's files are past the age, and
  really deletes them (landed: it removed files). The worker must write the slice again rather than
  commit files that are gone. Simulated: the hang is a sleep, not a slow catalog, and the ages:
  a run with this kind configures ``maintenance.orphan-older-than`` to ``CATALOG_STALL_ORPHAN_AGE``
  (a real sink keeps hours or days), which is also the file-age limit of every worker of the run:
  a slice whose files are older than half of it (``CATALOG_STALL_ORPHAN_AGE`` / 2) at its
  transaction is written again in every cycle, not only in this one.

A month of production, compressed (``maintenance`` does what the other parties do):

- ``offset-expiry``: the broker really runs with ``offsets.retention.minutes=1`` and a 5 s
  ``offsets.retention.check.interval.ms`` (for the whole run, see ``BROKER_PROPERTIES``); the app is
  stopped (SIGKILL or SIGTERM, seeded) and stays down until the broker has really deleted every
  offset of the sink group, then restarts. Simulated: only the duration (1 minute for 7 days).
  The compression holds for the whole run: a Spark restart (30-60 s) then lasts "most of a week",
  so any partition's offset may expire during any restart, not only in this kind's cycles, and the
  coordinator group's low watermark expires with the sink group's offsets.
- ``control-retention``: the control topic's records below the coordinator group's committed low
  watermark are really deleted (``AdminClient.delete_records``, what time-based retention does on a
  healthy sink), then the driver is SIGKILLed; the restart finds log start > 0. Simulated: that
  retention strikes exactly at the watermark instead of at some age.
- ``snapshot-expiry``: the driver is SIGKILLed right after a table commit (the ``coordinator``
  fault point); while it is down, another writer appends zero rows to the table the sink committed
  last, and ``expire_snapshots`` removes every snapshot but that writer's. The restart re-reads the
  round and has only what survives expiry to find its floor. Real: the PyIceberg commits and expiry.
- ``partition-evolution``: while the app runs, the table's partition spec gains a field (identity
  or bucket on an existing column) through PyIceberg; workers that cached the table keep writing
  files under the old spec, which the coordinator commits after the change.
- ``table-recreate``: while the app runs, a table is renamed to ``<name>_old_<n>`` and an empty
  table with the same schema is created under the name (a user's table swap) in the real catalog.
  Append tables only: a swapped change table would split each key's history between two tables at
  a point no one recorded (the new table holds only later changes), so no per-key verdict is exact.
- ``topic-recreate``: a source topic is deleted and created again under the same name, with as
  many partitions (a new topic id; its offsets start over at 0), as an operator does: traffic pauses,
  the sink delivers the topic to its end, the topic is recreated, traffic resumes into the new one.
  Spark's query stops on the offsets going back (``failOnDataLoss``) or a worker stops the batch;
  the restart reads the new topic from its beginning (``source.recreated-topic-offsets: earliest``).
  The verdict expects the rows of both generations (the old one's records are read before the
  deletion). Real: the broker's deletion (it drops the sink group's offsets) and the restart.
- ``dead-letter-flood``: 3 x ``FLOOD_QUEUE`` malformed records land in one partition at once, plus
  one malformed record of ``OVERSIZED_BYTES``. Simulated: the flood's size; the app's ``kafka:``
  section lowers ``queue.buffering.max.messages`` to ``FLOOD_QUEUE`` for the whole run, so that a
  burst of thousands floods the producer queue as 100,000 would with the default. The oversized
  dead letter is real: larger than the producer's and the broker's default maximum message size.
- ``maintain``: while the app runs, ``fanout-sink maintain`` runs as a second process on the sink's
  tables (the YAML's ``maintenance:`` section, ``scenario.MAINTENANCE``): compactions, expiries and
  orphan removal commit between the coordinator's appends. Real: the whole run and its commits.
  Simulated: the ages (a minute of snapshots, minutes of orphans, for days).
- ``registry-lag``: a producer registers a new writer schema on another registry node and writes
  ``registry_lag.RECORDS`` Avro records (Confluent wire format) with it; the node the sink asks
  answers 404 for the new id until ``registry_lag.LAG_S`` after a worker first asked (real HTTP
  404s to the real client in the app's Python workers; the failed batch is retried, nothing is
  dead-lettered). One sink reads one format, so these records have their own topic and sink (the
  run's Kafka, catalog and settings, its own names), run as a second process
  (``--available-now``) in the cycle beside the JSON app. Simulated: the lag is the stand-in's
  (``support.registry``), hiding the id until the runner reveals it; the new version changes the
  schema's text only (a new id, the same fields). The verdict counts those records exactly in
  ``registry_lag.TABLE`` and expects no dead letter of them.

A deploy:

- ``layout-change``: a second app of the sink starts with another partition-group count while a
  worker of the first holds its transaction open; the first must stop, superseded, and no range may
  land twice (``layout_change``).

The fault-point kinds are armed through ``FANOUT_SINK_FAULTS=<point>=when:<file>:<action>``: the app
is started with the points configured, and the runner creates the file when the cycle's moment comes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from chaos import layout_change
from fanout_sink.devtools.stack.spark_cluster import children, cmdline, descendants

CRASHES = ("driver", "python-worker", "broker", "catalog-commit", "coordinator", "catalog-stall")
MONTH = (
    "offset-expiry",
    "control-retention",
    "snapshot-expiry",
    "partition-evolution",
    "table-recreate",
    "topic-recreate",
    "dead-letter-flood",
    "maintain",
    "registry-lag",
)
DEPLOYS = ("layout-change",)
KINDS = CRASHES + MONTH + DEPLOYS
BROKER_PROPERTIES = {"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "5000"}
"""Server properties of a run with ``offset-expiry``: offsets expire a minute after their last commit."""
FLOOD_QUEUE = 1000
"""``queue.buffering.max.messages`` of the app in a run with ``dead-letter-flood``."""
OVERSIZED_BYTES = 1_200_000
"""The oversized bad record: above librdkafka's and the broker's default maximum (about 1 MB)."""


COORDINATOR_POINTS = (
    "coordinator.after-resolve",
    "coordinator.before-table-commit",
    "coordinator.after-table-commit",
)
"""Where the ``coordinator`` kind kills the driver; ``after-resolve`` is passed by change tables only."""


CATALOG_STALL_ORPHAN_AGE = "40s"
"""``maintenance.orphan-older-than`` of a run with ``catalog-stall``: short enough for a short cycle,
and its half (the workers' file-age limit) above what a slice takes on a loaded box."""
CATALOG_STALL_S = 55.0
"""How long the stalled catalog call hangs: longer than the orphan age plus cleanup's clock-skew
margin (a tenth of it) and the cleanup itself."""


def fault_spec(arm_dir: Path) -> str:
    """The ``FANOUT_SINK_FAULTS`` value every app start gets: inert until a file is armed. The commit
    failure and a coordinator kill share the point before a table commit, each with its own file;
    ``layout-change`` holds a worker before its commit until the runner releases it."""
    return ",".join(
        [
            f"coordinator.before-table-commit=when:{arm_dir / 'catalog-commit'}:raise",
            *(f"{point}=when:{arm_dir / point}:kill" for point in COORDINATOR_POINTS),
            f"worker.table-check=when:{arm_dir / 'catalog-stall'}:sleep:{CATALOG_STALL_S:g}",
            f"worker.before-commit=when:{arm_dir / 'layout-change'}:wait:{arm_dir / layout_change.RELEASE}",
        ]
    )


def arm(arm_dir: Path, kind: str) -> Path:
    path = arm_dir / kind
    path.touch()
    return path


def cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])  # utime + stime


def python_workers(app_pid: int) -> list[int]:
    """PySpark's forked Python workers under the app (children of a ``pyspark.daemon``)."""
    daemons = [p for p in descendants(app_pid) if "pyspark.daemon" in cmdline(p)]
    forked = [c for d in daemons for c in children(d) if "pyspark" in cmdline(c)]
    return forked or [p for p in descendants(app_pid) if "pyspark.worker" in cmdline(p)]


def kill_busy_python_worker(app_pid: int, timeout_s: float = 60.0) -> int | None:
    """SIGKILL a Python worker that is using CPU (one in the middle of a slice); the pid, or None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = python_workers(app_pid)
        before = {pid: cpu_ticks(pid) for pid in workers}
        time.sleep(0.2)
        busy = [pid for pid in workers if cpu_ticks(pid) > before[pid]]
        if busy:
            try:
                os.kill(busy[0], signal.SIGKILL)
            except ProcessLookupError:
                continue
            return busy[0]
    return None
