"""Moving over from the Iceberg Kafka Connect sink, in four modules, one job each:

- ``translator``: the connector's config as a sink YAML, every key not carried listed with its reason
  (offline: contacts nothing);
- ``credentials``: the connector's secrets and Connect config-provider values as ``${VAR}``
  references the command names, and its JDBC URI with the user and password beside it;
- ``takeover``: starts each source partition exactly where the connector's tables end, once the
  connector is stopped and its last commit completed (online: the broker and the catalog);
- ``events``: the Java sink's own records the takeover reads, its control-topic events and the
  control offsets its coordinator records in snapshot summaries.
"""
