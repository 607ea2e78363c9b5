"""The one door to PyIceberg's internals: everything of the sink that extends PyIceberg or reaches
into its private names, one concern per module.

PyIceberg 0.12.0 is pinned. What the sink needs beyond PyIceberg's public API (a fast append that
keeps each file's partition spec, position deletes in the same snapshot, a commit without PyIceberg's
rebasing retry, Parquet files written exactly as PyIceberg's append writes them) is built on private
classes, private functions and private attributes, which may change in any release. A PyIceberg
upgrade therefore breaks the sink in this package and nowhere else: ``tests/test_architecture.py``
fails when a module outside it (of the package, its tooling or its tests) imports a private PyIceberg
name, uses a private attribute of one, or subclasses a PyIceberg class. Each module's docstring lists
what it reaches into:

- :mod:`.arrow_writes`: Arrow rows and schemas as PyIceberg's append writes them (typed wrappers of its
  private writer functions).
- :mod:`.manifests`: manifest writers and the manifest-list reader, their Avro layouts built once.
- :mod:`.snapshots`: the snapshot producers, ``SpecPreservingAppend`` and ``RowDelta``.
- :mod:`.metadata_updates`: staged updates applied to table metadata without PyIceberg's deep copy.
- :mod:`.transactions`: the no-retry transaction the sink commits with, its staged metadata cached.
- :mod:`.sql_catalog`: the SQL catalog's fast paths (pointers of many tables in one query, a commit
  against the table as loaded).
- :mod:`.fileio`: ``DurableFileIO``, the FileIO that fsyncs a local warehouse's files.
- :mod:`.hive`: ``ThreadSafeHiveCatalog``, one thrift connection per thread; namespaces created under
  the metastore's lock.

Nothing is re-exported here: callers import the module that holds the concern they use.
"""
