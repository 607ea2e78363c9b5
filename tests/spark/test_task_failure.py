"""A failed Spark job cut down to one line and one traceback, whichever way its text reached the driver."""

from __future__ import annotations

from fanout_sink.spark.task_failure import task_failure

_TASK = (
    "Traceback (most recent call last):\n"
    '  File "/venv/pyspark/worker.py", line 3386, in main\n'
    "    process()\n"
    '  File "/work/fanout_sink/transform/processor.py", line 169, in __call__\n'
    "    raise RecordError(...)\n"
    "fanout_sink.errors.RecordError: record t[1]@11 failed at decode: invalid JSON\n"
    "  the sink stopped: nothing at or after offset 11 of t[1] was committed\n"
    "  fix: correct the producer\n"
)

# What a streaming query's end hands its listener: the foreachBatch's Python traceback first, whose
# exception (py4j's) carries the Java job's text with the task's traceback inside it.
_QUERY_END = (
    "Traceback (most recent call last):\n"
    '  File "/venv/pyspark/sql/utils.py", line 120, in call\n'
    "    raise e\n"
    "py4j.protocol.Py4JJavaError: An error occurred while calling z:PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Lost task 1.0 (TID 3): "
    "org.apache.spark.api.python.PythonException: " + _TASK + "\n"
    "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:645)\n"
)


def test_the_task_traceback_inside_a_query_end_is_the_one_kept() -> None:
    failure = task_failure(_QUERY_END)
    assert failure.traceback is not None and failure.traceback.startswith("Traceback")
    assert "processor.py" in failure.traceback and "utils.py" not in failure.traceback
    assert failure.summary.startswith("fanout_sink.errors.RecordError: record t[1]@11 failed at decode")
    assert "Py4JJavaError" not in failure.summary and "File " not in failure.summary


def test_a_job_error_keeps_its_task_traceback_and_summary() -> None:
    text = "An error occurred while calling o1.collect.\n: org.apache.spark.SparkException: " + _TASK
    failure = task_failure(text + "\n\tat org.apache.spark.Foo(Foo.scala:1)\n")
    assert failure.traceback == _TASK.rstrip()
    assert failure.summary.startswith("fanout_sink.errors.RecordError: record t[1]@11")
