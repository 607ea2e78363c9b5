"""The app's start: its broker part (the sink's topics, the source's partitions, the fencing, the
coordinator) runs while the driver JVM starts, not before it.

Real: the app on a sink from the sink factory (the shared broker, an embedded catalog), its pre-flight,
its control topic and its coordinator. The one substitution is the Spark session: a stand-in that
fails the start once it has been entered, so no JVM runs; the partitions' listing is wrapped to note
whether the session's start had begun when it ran.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from support.sink_factory import SinkFactory

from fanout_sink.spark import app as app_module
from fanout_sink.spark import planning
from fanout_sink.spark.app import RunOptions, SinkApp

_GUARD_S = 20.0
"""How long the listing waits for the session's start at most: a guard against a start that lists
the partitions only before the session (it would wait for ever), not a measured time."""


def _wait_for_leaders(admin: AdminClient, partitions: dict[str, int]) -> None:
    """Until every partition of the just created topics has a leader: the pre-flight checks, run in
    this process moments after the creation, would find a topic without one missing."""
    for _ in range(100):
        topics = admin.list_topics(timeout=30).topics
        if all(
            name in topics
            and len(topics[name].partitions) == count
            and all(p.leader >= 0 for p in topics[name].partitions.values())
            for name, count in partitions.items()
        ):
            return
        threading.Event().wait(0.1)
    raise AssertionError(f"the topics {sorted(partitions)} got no leaders")


class _NoSpark(Exception):
    """The session stand-in's end of the start."""


def test_the_partitions_are_listed_and_the_coordinator_started_while_the_driver_jvm_starts(
    sink_factory: SinkFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = sink_factory()
    admin = AdminClient({"bootstrap.servers": sink.bootstrap})
    _wait_for_leaders(admin, sink.partitions)
    session_starting = threading.Event()
    while_starting: list[bool] = []
    list_partitions = planning.source_partitions

    def listing(*args: Any, **kwargs: Any) -> dict[str, int]:
        while_starting.append(session_starting.wait(_GUARD_S))
        return list_partitions(*args, **kwargs)

    def session(*args: Any, **kwargs: Any) -> Any:
        session_starting.set()
        raise _NoSpark("the session's stand-in ends the start")

    monkeypatch.setattr(planning, "source_partitions", listing)
    monkeypatch.setattr(app_module, "build_spark_session", session)
    app = SinkApp(sink.config, RunOptions(master="local[1]"))

    with pytest.raises(_NoSpark):
        app.run()

    assert while_starting == [True], "the partitions were listed before the session's start began"
    topics = admin.list_topics(timeout=30).topics
    assert app.channel.control_topic in topics
    # The coordinator the broker part started was stopped with the failed start.
    assert not [t for t in threading.enumerate() if t.name.startswith("fanout-sink-coordinator")]
