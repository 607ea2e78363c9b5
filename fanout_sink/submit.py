"""Entry point for ``spark-submit``: the same app as ``fanout-sink run``, with the master from submit.

On a cluster the executors need the project and its Python dependencies: ``fanout-sink pack`` builds
them as one archive (see :mod:`fanout_sink.spark.shipping`), handed over with ``--archives`` the way
PySpark documents it; in client mode the driver runs this machine's Python, so the command says which.
The whole command is in docs/production.md (a test runs it verbatim); ``fanout-sink run --master
spark://host:7077`` does the same by itself, from the cached pack.
"""

from __future__ import annotations

import sys

from fanout_sink.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
