"""The mirror tables: the contract between the Spark jobs that write them and everything that
reads them or their progress. Spark-free (the Spark side is :mod:`lakeslot.spark.tables`).

- :mod:`.contract` — every table property, snapshot summary property and column name lakeslot
  uses, and the defaults of the tables it creates. The one definition; nothing else spells them.
- :mod:`.typemap` — how PostgreSQL column types land in Iceberg: the one mapping, for the
  snapshot's COPY and the apply job's text values alike.
- :mod:`.catalogs` — ``sink.catalog`` translated, side by side, for Spark (``spark.sql.catalog.*``)
  and for pyiceberg (tables loaded without Spark), both with the Secret-backed properties.
- :mod:`.progress` — how far each table got (``lakeslot.lsn``, its recorded definite error),
  read with pyiceberg: the operator and local mode report it.
- :mod:`.maintenance_policy` — what maintenance a table is due, and when (pure; Spark runs it:
  :mod:`lakeslot.spark.maintenance`).
- :mod:`.cuts` — consistent reads across mirror tables: the snapshots of one source LSN.
"""
