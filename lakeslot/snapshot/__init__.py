"""The consistent parallel snapshot: every table copied into its Iceberg mirror exactly as of one
LSN (DESIGN.md invariants 1 and 2).

Modules, and the roles they play:

- :mod:`.job` — :func:`lakeslot.snapshot.job.run`, the job itself (what ``spark_jobs/snapshot.py``
  and local mode call): which tables to copy, then everything below.
- the leader (Spark driver), :mod:`lakeslot.source.exported_snapshot`: a replication connection
  opens ``BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ``, creates a *temporary* logical slot
  ``USE_SNAPSHOT`` (its consistent point minus one is the snapshot LSN ``s``) and exports the
  snapshot. That transaction stays open until every table has committed (the leader commits
  last); the slot dies with it.
- :mod:`.plan`: in a session importing the snapshot, reads what the catalog said *as of s* (columns,
  types and key through :mod:`lakeslot.source.columns`, leaf partitions, ``relfilenode``) and
  splits each heap into ctid page ranges by ``pg_class.relpages`` (an estimate: the last range of
  every heap is open-ended); :mod:`lakeslot.source.keys` checks configured key columns on the
  snapshot's rows (unique, never NULL) before anything is copied.
- :mod:`.follower` (Spark tasks, one range per task): imports the snapshot, reads its range through
  the ADBC driver (binary COPY → Arrow), converts with :mod:`lakeslot.mirror.typemap` and writes
  Parquet data files for the mirror table. It returns the files; it never commits.
- the driver commits through :mod:`lakeslot.spark.tables`: it creates or replaces the Iceberg
  table in one transaction holding all of a table's files, with ``lakeslot.lsn = s`` in the
  snapshot summary.
- :mod:`.progress`: the machine-readable progress document the operator and local mode read.

Why the copy equals the source as of ``s``: every follower reads under the exported snapshot, and
the ranges of a heap are disjoint and cover it ([0, ∞) split at page boundaries), so each row
visible in the snapshot is read exactly once. A heap rewritten after the export (TRUNCATE,
VACUUM FULL, CLUSTER, a rewriting ALTER TABLE) would break that (rows move, or look absent to an
old snapshot); followers detect it by comparing ``pg_relation_filenode`` with the planned
``relfilenode`` and fail the table. Files of a failed or retried attempt are never committed, so a
retried range cannot duplicate rows.
"""
