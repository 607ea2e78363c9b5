"""Start-up recovery over a long control-topic history: the whole history read (as before) against
the bounded tail (``protocol.control_tail.read_tail``).

``PYTHONPATH=tests python -m bench.control_tail --rounds 1000 [--bootstrap-servers HOST:PORT]``
(without a broker address it starts one in a scratch folder). The history is written as the
sink writes it, round by round: a ``StartCommit``, then one transaction of a ``DataWritten`` per
table (one data file with ten columns' statistics) and a ``DataComplete`` per source partition, then
the round's ``CommitToTable`` per table and its ``CommitComplete`` (``delivered``, ``reports_below``,
``low_watermark``). Then the recovery the planner runs when the sink group's offsets are gone is
timed both ways; both must find the same positions.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import channel, control_tail
from fanout_sink.protocol import events as ev


@dataclass(frozen=True)
class Plan:
    rounds: int
    tables: int
    partitions: int


def _file(table: int, round_no: int) -> ev.DataFileRecord:
    columns = range(1, 11)
    return ev.DataFileRecord(
        file_path=f"/warehouse/t{table}/data/{round_no}-{uuid.uuid4().hex}.parquet",
        file_format="PARQUET",
        spec_id=0,
        record_count=1000,
        file_size_in_bytes=65536,
        column_sizes={c: 6000 for c in columns},
        value_counts={c: 1000 for c in columns},
        null_value_counts={c: 0 for c in columns},
        lower_bounds={c: b"\x00" * 8 for c in columns},
        upper_bounds={c: b"\xff" * 8 for c in columns},
    )


def write_history(sink: channel.SinkChannel, plan: Plan) -> int:
    """``plan.rounds`` rounds on the sink's control topic; returns the events written."""
    channel.ensure_control_topic(sink)
    producer = TransactionalProducer(sink.clients, f"bench-{sink.sink}", "fenced")
    reader = channel.ControlReader(sink)
    topic, written = "src", 0
    tables = [
        ev.TableRef(namespace=("bench",), name=f"t{t}", uuid=str(uuid.uuid4())) for t in range(plan.tables)
    ]

    def publish(payloads: Sequence[ev.Payload]) -> None:
        nonlocal written
        with producer.transaction():
            for payload in payloads:
                channel.produce_event(producer, sink.control_topic, sink.sink, payload)
        written += len(payloads)

    for round_no in range(plan.rounds):
        commit_id, position = str(uuid.uuid4()), 100 * (round_no + 1)
        publish([ev.StartCommit(commit_id=commit_id)])
        publish(
            [
                ev.DataWritten(
                    table=t,
                    files=(_file(i, round_no),),
                    topic=topic,
                    partition=i % plan.partitions,
                    next_offset=position,
                )
                for i, t in enumerate(tables)
            ]
            + [
                ev.DataComplete(topic=topic, partition=p, next_offset=position)
                for p in range(plan.partitions)
            ]
        )
        round_end = reader.end_offset()
        delivered = ev.delivered_map({(topic, p): position for p in range(plan.partitions)})
        publish(
            [ev.CommitToTable(commit_id=commit_id, table=t, control_offset=round_end) for t in tables]
            + [
                ev.CommitComplete(
                    commit_id=commit_id, reports_below=round_end, low_watermark=round_end, delivered=delivered
                )
            ]
        )
    reader.close()
    producer.flush()
    return written


def timed_read(sink: channel.SinkChannel, window: int) -> tuple[float, control_tail.ControlTail]:
    control_tail.TAIL_WINDOW = window
    start = time.perf_counter()
    tail = control_tail.read_tail(sink)
    return time.perf_counter() - start, tail


def run(plan: Plan, bootstrap: str) -> None:
    sink = channel.SinkChannel(f"bench{uuid.uuid4().hex[:6]}", {"bootstrap.servers": bootstrap}, "")
    sink = channel.SinkChannel(sink.sink, sink.kafka, f"{sink.sink}-control")
    started = time.perf_counter()
    written = write_history(sink, plan)
    print(f"history: {plan.rounds} rounds, {written} events written in {time.perf_counter() - started:.1f} s")
    tail_window = control_tail.TAIL_WINDOW
    before_s, before = timed_read(sink, 1 << 62)  # one window from the log start: the old full read
    after_s, after = timed_read(sink, tail_window)
    assert before.positions.offsets == after.positions.offsets and before.complete and after.complete
    print("| read | events read | from offset | seconds |")
    print("|---|---:|---:|---:|")
    print(f"| whole history (before) | {before.events} | {before.read_from} | {before_s:.2f} |")
    print(f"| tail (after) | {after.events} | {after.read_from} | {after_s:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--bootstrap-servers")
    args = parser.parse_args()
    plan = Plan(args.rounds, args.tables, args.partitions)
    if args.bootstrap_servers:
        run(plan, args.bootstrap_servers)
        return
    with tempfile.TemporaryDirectory() as scratch:
        broker = KafkaBroker(Path(scratch) / "kafka")
        broker.start()
        try:
            run(plan, broker.bootstrap_servers)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
