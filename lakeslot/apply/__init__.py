"""The apply job: sealed change segments → Iceberg mirror tables (and changelog tables).

It reads staging through :mod:`lakeslot.staging` and writes through :mod:`lakeslot.spark.tables`
(positions, empty commits, schema updates, error marks).

- :mod:`.changes` — reading the segment chain and reducing each table's changes (pure Python).
- :mod:`.columns` — value parsing by the mirror's types, schema-change planning (pure Python).
- :mod:`.merge` — the reduced changes as a Spark source and the MERGE/append SQL.
- :mod:`.job` — :func:`lakeslot.apply.job.run`, the job itself (what ``spark_jobs/apply.py`` and
  local mode call), wiring its collaborators:

  - :mod:`.passes` — how a pass schedules its tables (the pass loop, listing to status);
  - :mod:`.table_pass` — what happens to one table in a pass (prepare, plan, apply), with
    :mod:`.evolution` (its source's definition followed), :mod:`.changelog` (its history) and
    :mod:`.source_tables` (what a pass reads from the source);
  - :mod:`.reduction` — the batch reduced for every table at once, narrowed down on failure;
  - :mod:`.failures`, :mod:`.upkeep`, :mod:`.outcomes` — failure handling, table upkeep and
    retention, what a pass reports.
"""
