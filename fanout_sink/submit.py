"""Entry point for ``spark-submit``: the same app as ``fanout-sink run``, with the master from submit.

On a cluster the executors need the project and its Python dependencies: ``fanout-sink pack`` builds
them as one archive (see :mod:`fanout_sink.spark.shipping`), handed over with ``--archives`` the way
PySpark documents it. In client mode the driver runs this machine's Python, so say which:

    fanout-sink pack --output fanout-sink-env.tar.gz
    entry=$(python -c 'import fanout_sink.submit as m; print(m.__file__)')
    spark-submit --master spark://host:7077 \
      --archives fanout-sink-env.tar.gz#environment \
      --conf spark.pyspark.python=./environment/bin/python \
      --conf spark.pyspark.driver.python="$(command -v python)" \
      --jars "$(fanout-sink jars --comma)" "$entry" --config sink.yaml

A catalog or checkpoint on S3 also needs the object-store jars: ``fanout-sink jars --comma --set
spark-connectors spark-object-store``. (``fanout-sink run --master spark://host:7077`` does all of
this by itself, from the cached pack.)
"""

from __future__ import annotations

import sys

from fanout_sink.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
