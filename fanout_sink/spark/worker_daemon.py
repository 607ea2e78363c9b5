"""The app's PySpark daemon (``spark.python.daemon.module``): a task's imports paid once per executor.

PySpark starts one daemon per executor, which forks a Python worker for every task slot. With its
own daemon (``pyspark.daemon``) each forked worker imports the sink (pyarrow, pyiceberg and the
pandas it pulls in, confluent_kafka, pydantic models) when it unpickles its first task: the same
imports once per slot, about 1.5 CPU seconds each on this machine (docs/benchmarks/cpu.md). This
daemon imports them before it forks, so the workers inherit them, and then runs PySpark's daemon
unchanged. The imports' objects are frozen out of the cyclic garbage collector first: no collection
in a worker walks them, and the pages holding them stay shared with the daemon after the fork.

Only what a module import does happens before the fork: no client, thread or connection exists yet
(each worker builds its own executor state, see :mod:`.task`).
"""

from __future__ import annotations

import gc

from pyspark import daemon

import fanout_sink.spark.task  # noqa: F401  (imported for the forked workers)


def main() -> None:
    gc.collect()
    gc.freeze()
    daemon.manager()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
