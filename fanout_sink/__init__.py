"""fanout_sink: exactly-once fan-out of Kafka topics into many Apache Iceberg tables.

Kept free of third-party imports: ``python3 -m fanout_sink.bootstrap`` imports this package with
nothing but the standard library installed.
"""

__version__ = "0.1.0"
