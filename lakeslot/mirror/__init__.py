"""The mirror tables: the contract between the Spark jobs that write them and everything that
reads their progress.

- :mod:`.contract` — every table property, snapshot summary property and column name lakeslot
  uses, and the defaults of the tables it creates. The one definition; nothing else spells them.
- :mod:`.catalogs` — ``sink.catalog`` translated, side by side, for Spark (``spark.sql.catalog.*``)
  and for pyiceberg (tables read without Spark), both with the Secret-backed properties.
- :mod:`.progress` — how far each table got (``lakeslot.lsn``, its recorded definite error),
  read with pyiceberg: the operator and local mode report it.
- :mod:`.catalog` — creating, replacing, evolving and committing to mirror tables through the
  Spark session's Iceberg catalog: the snapshot and apply jobs write with it.
"""
