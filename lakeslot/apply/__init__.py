"""The apply job: sealed change segments → Iceberg mirror tables (and changelog tables).

It reads staging through :mod:`lakeslot.staging` and writes through :mod:`lakeslot.spark.tables`
(positions, empty commits, schema updates, error marks).

- :mod:`.job` — :func:`lakeslot.apply.job.run`, the job itself (what ``spark_jobs/apply.py`` and
  local mode call), wiring its collaborators; :mod:`.warmup` runs before a long-running job's
  first pass.
- :mod:`.passes` — how a pass schedules its tables (the pass loop, listing to status);
  :mod:`.slots` — how many at once, on the CPU and waiting on the network.
- :mod:`.table_pass` — what happens to one table in a pass (prepare, plan, apply), with
  :mod:`.evolution` (its source's definition followed; :mod:`.ddl` replays captured DDL, pure),
  :mod:`.changelog` (its history) and :mod:`.source_tables` (what a pass reads from the source).
- The data path: :mod:`.segment_cache` — the driver's staging: each segment of a pass fetched
  whole once, read from memory; :mod:`.spread` — the batch planned from segment footers and
  reduced on the executors; :mod:`.changes` — the segment chain and each table's changes folded change by change
  (pure Python); :mod:`.latest` — a large batch's latest change per key, vectorised;
  :mod:`.reduction` — every table reduced at once, narrowed down on failure.
- Writing: :mod:`.columns` — value parsing by the mirror's types, schema-change planning (pure
  Python); :mod:`.merge` — the reduced changes as a Spark source and the MERGE/append SQL;
  :mod:`.small_batches` — a small batch committed from the driver as one row delta, no MERGE.
- Failures: :mod:`.isolation` — the rules (one table's failure never stalls another);
  :mod:`.failures` — their handling (retries, backoff, escalation, lifting an error).
- After a pass: :mod:`.upkeep` — expiry, compaction, staging's retention; :mod:`.coverage` — an
  idle table's advance kept in memory until due; :mod:`.cut_record` — the pass's cut, in the
  cuts record (one commit per pass); :mod:`.outcomes` — what a pass reports.
"""
