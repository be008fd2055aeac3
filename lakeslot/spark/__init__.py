"""Everything that needs a JVM: Spark sessions with an Iceberg catalog, and the work on mirror
tables that goes through Spark or Iceberg's Java API (py4j).

- :mod:`.session` — Spark sessions with the Iceberg catalog, and commit properties for SQL
  statements; its conf is :mod:`.conf` (pure, no PySpark import: the operator's
  SparkApplications use it too).
- :mod:`.jars` — the Iceberg runtime and its clients provisioned into a local cache;
  :mod:`.helpers` — lakeslot's Java helpers, compiled where a JDK is; :mod:`.daemon` — Spark's
  Python worker daemon, started without pyspark's archives on its path.
- :mod:`.tables` — the mirror tables through the session's catalog: how the snapshot and apply
  jobs create, replace, evolve and commit to them (``lakeslot.lsn`` on every commit that moves a
  position).
- :mod:`.row_delta` — a small change committed from the driver as one Iceberg ``RowDelta``, no
  Spark job; :mod:`.jvm` — Java classes and static members resolved once per JVM.
- :mod:`.partitions` — a mirror's partition spec set from ``partitionBy``, and files laid out in
  it.
- :mod:`.maintenance` — compaction, manifest rewrite and orphan-file removal when
  :mod:`lakeslot.mirror.maintenance_policy` says they are due; :mod:`.driver_compaction` — a small
  table compacted on the driver, no Spark job.
"""
