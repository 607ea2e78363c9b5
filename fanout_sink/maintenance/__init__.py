"""Table maintenance without Spark: what each step should do to a table, decided from its metadata
(``decisions``), and what a run did (``report``). ``spark/maintenance.py`` carries the decisions
out with Iceberg's Spark procedures; keeping them apart lets ``tests/test_architecture.py`` hold the
decisions to never importing pyspark."""
