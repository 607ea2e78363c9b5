"""Entry point for ``spark-submit``: the same app as ``fanout-sink run``, with the master from submit.

entry=$(python -c 'import fanout_sink.submit as m; print(m.__file__)')
spark-submit --jars "$(fanout-sink jars --comma)" "$entry" --config sink.yaml
"""

from __future__ import annotations

import sys

from fanout_sink.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
