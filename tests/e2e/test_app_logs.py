"""The app's log as an operator reads it: JSON lines from the driver, the executors and Spark alike, and
a failed task's traceback once, in the file the retried batch's WARNING names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.sink_factory import SinkFactory

pytestmark = pytest.mark.usefixtures("own_spark")

_JVM_NOTICE = "WARNING: Using incubator modules"  # the JVM's own, before any logger: filtered out


def _without_killed_worker_traces(lines: list[str]) -> list[str]:
    """The lines without PySpark's own raw traceback, which its daemon prints when Spark kills the
    Python worker of a sibling task the failed stage cancels: whether the sibling was still running is
    timing (a known limit, docs/design.md). The worker's read of its socket ends in ``EOFError`` or,
    when the peer reset it first, ``ConnectionResetError`` (seen once in a clean-clone run). Only
    exactly that block is dropped."""
    kept: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i] == "Traceback (most recent call last):":
            end = next((j for j in range(i + 1, len(lines)) if not lines[j].startswith(" ")), len(lines))
            block = lines[i : end + 1]
            ended = block[-1] == "EOFError" or block[-1].startswith("ConnectionResetError:")
            if "pyspark/daemon.py" in block[1] and ended:
                i = end + 1
                continue
        kept.append(lines[i])
        i += 1
    return kept


def test_json_log_with_a_failed_task_names_the_file_of_its_traceback(
    tmp_path: Path, sink_factory: SinkFactory
) -> None:
    sink = sink_factory(overrides={"logging": {"format": "json"}})
    sink.produce(200)
    armed = tmp_path / "armed"
    armed.touch()  # the first task to pass the point fails, once; the batch's retry delivers
    log = sink.run(
        "--available-now", env={"FANOUT_SINK_FAULTS": f"worker.after-write-files=when:{armed}:raise"}
    )
    (tmp_path / "app.log").write_text(log)  # kept with the test's folder, for a failure's post-mortem
    sink.assert_exact()

    assert _JVM_NOTICE not in log, "the JVM's start-up notice is dropped (spark/jvm_stderr.py)"
    assert "Failed to cancel job group" not in log and "RoundResult(" not in log
    lines = _without_killed_worker_traces([line for line in log.splitlines() if line.strip()])
    entries: list[dict[str, Any]] = []
    for line in lines:
        entry = json.loads(line)  # every line: the driver's, the executors', Spark's log4j
        assert {"time", "level", "logger", "message"} <= entry.keys(), line
        entries.append(entry)
    # The traceback is in a file the WARNING names (and at DEBUG), not in the log at INFO.
    assert "\n".join(lines).count("Traceback (most recent call last)") == 0, log[-6000:]
    ours = [e for e in entries if e["logger"].startswith("fanout_sink")]
    assert not [e for e in ours if e.get("traceback")]
    (failed,) = [e for e in ours if e["level"] == "WARNING" and "failed:" in e["message"]]
    message, named = failed["message"].split("; traceback in ")
    traceback = Path(named).read_text()
    assert traceback.startswith("Traceback (most recent call last)") and len(message) < 400, message
    spark = [json.dumps(e) for e in entries if not e["logger"].startswith("fanout_sink")]
    assert not [e for e in spark if "InjectedFault" in e], (
        "Spark's repeats of the task's failure are filtered"
    )
    assert failed["logger"] == "fanout_sink.app" and failed["level"] == "WARNING"
    assert failed["batch"] == 0 and failed["attempt"] == 1
    assert "InjectedFault: fault injected at worker.after-write-files" in failed["message"]
    assert "retrying the batch" in failed["message"]
    assert traceback.rstrip().endswith(message.split(": ", 1)[1].split("; retrying")[0])
    # The executors' lines (dynamic tables are created on first write, in the tasks) are JSON too.
    assert any(e["logger"] == "fanout_sink.transform.tables" for e in ours), "executor lines"
    # The Python workers were started while the query planned (spark/worker_warmup.py).
    assert any(e["message"].startswith("Python workers ready in ") for e in ours), "no warm-up line"
    done = [e for e in ours if e["logger"] == "fanout_sink.app" and e["message"].startswith("batch 0: ")]
    assert len(done) == 1 and done[0]["batch"] == 0
    assert not [e for e in ours if e["logger"] == "fanout_sink.librdkafka"], "DEBUG only"
