"""The ``layout-change`` kind: a second app of the sink starts with another partition-group count
while a worker of the first holds its transaction open (issue 47 item 1).

That is a rolling deploy with surge, a driver slow to exit, or a resized cluster (the count follows
the executors' cores). The first app's worker waits at ``worker.before-commit`` (armed
``when:<file>:wait:<release>``, ``kills.fault_spec``) with its events and offsets sent; the runner
starts the second app and releases the worker once the second start has recorded itself and
fenced the first's ids (:func:`wait_recorded`). The worker's commit then meets the fence, its retry
with a new producer under the same old transactional id finds the record naming the newer start
(``StartSupersededError``), and the first app stops; the second delivers its batches. The runner
then stops the second app (SIGTERM) and the operator's restart of the first brings its count back:
a second change of layout. The verdict counts every row exactly, as after any kind.

Real: both apps (two Spark sessions on one checkpoint), the start's record and fencing, the first
app's fenced commit, retried batch and stop. Simulated: the moment (the held worker) and the count:
the first app packs by its ``local[2]`` cores, the second gets ``spark.default.parallelism``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from fanout_sink.config.loading import load_config
from fanout_sink.protocol import group_layout

OTHER_GROUPS = 3
"""The second app's partition-group count (the first's is 2: ``local[2]``)."""
RELEASE = "layout-change-release"
"""The file (in the runner's arm folder) that releases the first app's held worker."""
SUPERSEDED = "was started again"
"""What the first app's refused attempt says (``StartSupersededError``)."""
SUPERSEDED_TIMEOUT_S = 300.0
"""How long the first app may take to stop once superseded: a batch's retries and its stop."""


def second_app(command: list[str]) -> list[str]:
    """The first app's command, with another partition-group count."""
    return [*command, "--conf", f"spark.default.parallelism={OTHER_GROUPS}"]


def recorded_start(config_file: Path) -> str | None:
    """The start id the sink's layout record names now (None: no start recorded one)."""
    return group_layout.channel_in_use(load_config(config_file)).start_id


def _fenced_by_another(config_file: Path, before: str | None) -> bool:
    channel = group_layout.channel_in_use(load_config(config_file))
    record = group_layout.read_record(channel)
    return record is not None and record.start != before and not record.unfenced


def wait_recorded(
    config_file: Path, before: str | None, timeout_s: float, running: Callable[[], bool]
) -> bool:
    """Wait until a start other than ``before`` recorded itself and fenced the earlier layouts' ids
    (its record lists none left to fence); False if the app that should (``running``) died or time
    ran out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and running():
        if _fenced_by_another(config_file, before):
            return True
        time.sleep(0.5)
    return _fenced_by_another(config_file, before)


def said_superseded(log_file: Path) -> bool:
    """Whether the app's latest start (its part of the log after the last start line) logged its
    attempt refused as superseded."""
    text = log_file.read_text(errors="replace")
    return SUPERSEDED in text[text.rfind("===== start") :]
