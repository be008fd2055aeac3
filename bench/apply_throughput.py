"""Benchmark: the apply job catching up a backlog, against the reader and a bare MERGE.

    .venv/bin/python -m bench.apply_throughput [--rows 1000000] [--changes 100000] [--pg 15|18]
                                              [--merge-mode copy-on-write|merge-on-read]

One run starts a throwaway PostgreSQL (``lakeslot.local.pgcluster``), a table ``bench`` (bigint key,
int, numeric, text, timestamptz) with ``--rows`` rows, the publication and the slot, snapshots it
with the real snapshot job (local[2] Spark, hadoop catalog), then writes a backlog of about
``--changes`` row changes spread uniformly over the table — 70% updates of random rows, 20%
inserts, 10% deletes, in transactions of 1,000 changes — and measures, in the same run:

- the reader: the real ``lakeslot reader`` process from the slot until everything is sealed
  (changes/s of the reader on this backlog, the limit upstream of the apply job);
- the apply job: ``lakeslot.apply.job.run(once=True)`` in the session the snapshot and three
  apply passes warmed up (a small batch, one above ``spread.ONE_TASK_LATEST_CHANGES`` and one above
  ``spread.SERIAL_CHANGES``, replicated: each path a batch may take on this machine),
  until every sealed change is applied and the maintenance it triggered is done (changes/s),
  and until the last pass had committed (every change visible to readers), with the driver's
  peak RSS (Python process) and the JVM's (local mode: the executors live in it too);
- a bare MERGE: the same keys' final rows (read from PostgreSQL, written to Parquet, read by
  Spark) MERGEd into the mirror with the statement shape the apply job uses — no lakeslot code,
  the engine's limit on this machine (the rows are already equal by then, so the MERGE rewrites
  the same files with the same values: the same work) — once copy-on-write, which leaves the
  table as clean as the apply job's pass and compaction do, then merge-on-read, which leaves
  its position deletes behind.

Before the bare MERGE, the mirror is compared with the source, every column of every row
(pyiceberg, independent of the apply code). Printed: the figures and the ratios apply ÷ reader and
apply ÷ bare MERGE (the faster of the two modes; also until the last change was visible, and
against copy-on-write alone).
Numbers, not assertions (targets in docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench import common
from lakeslot.apply import job as apply_job
from lakeslot.apply import spread
from lakeslot.snapshot import job as snapshot_job
from lakeslot.source.connection import one_row
from lakeslot.staging.store import Staging


def backlog(conn, rows: int, changes: int, rng: random.Random) -> tuple[int, set[int]]:
    """Write about ``changes`` changes; returns how many and the keys they touched."""
    written, next_id = 0, one_row(conn.execute("SELECT max(id) + 1 FROM bench"))[0]
    touched: set[int] = set()
    while written < changes:
        updates = [rng.randint(1, rows) for _ in range(700)]
        deletes = [rng.randint(1, rows) for _ in range(100)]
        with conn.transaction():
            written += conn.execute(
                "UPDATE bench SET qty = qty + 1, note = md5(id::text || clock_timestamp()::text)"
                " WHERE id = ANY(%s)", (updates,)).rowcount
            written += conn.execute(
                "INSERT INTO bench SELECT g, g %% 100, g / 100.0, 'new ' || g, now()"
                " FROM generate_series(%s::int8, %s::int8) g", (next_id, next_id + 199)).rowcount
            written += conn.execute("DELETE FROM bench WHERE id = ANY(%s)", (deletes,)).rowcount
        touched.update(updates, deletes, range(next_id, next_id + 200))
        next_id += 200
    return written, touched


def jvm_peak_rss(spark) -> int:
    pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.apply_throughput",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--pg", choices=("15", "18"), default="18")
    parser.add_argument("--merge-mode", default=None,
                        help="write.merge.mode of the mirror (default: lakeslot's table default)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="apply-throughput-"))
    staging, warehouse = (work / "staging").as_uri(), str(work / "warehouse")
    with common.cluster(args.pg) as cluster:
        properties = {"write.merge.mode": args.merge_mode} if args.merge_mode else {}
        job, spark = common.apply_setup(cluster, args.rows, staging, warehouse,
                                        "apply-throughput", {"tableProperties": properties})
        started = time.monotonic()
        snapshot_job.run(spark, job)
        snapshot_s = time.monotonic() - started

        env = {**os.environ, "LAKESLOT_SOURCE_PASSWORD": cluster.password}
        rng = random.Random(1)

        def stage(changes: int) -> tuple[int, set[int], float, float]:
            """Write a backlog, then run the reader until it is sealed."""
            with cluster.connect("bench", autocommit=True) as conn:
                started = time.monotonic()
                written, touched = backlog(conn, args.rows, changes, rng)
                backlog_s = time.monotonic() - started
                end_lsn = one_row(conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::int8"))[0]
            started = time.monotonic()
            with open(work / "reader.log", "ab") as reader_log:
                reader = subprocess.Popen(common.reader_command(cluster, staging, 0.5), env=env,
                                          stderr=reader_log)
            store = Staging(staging)
            while (point := store.resume_point()) is None or point.end < end_lsn:
                time.sleep(0.05)
            reader_s = time.monotonic() - started
            reader.terminate()
            reader.wait(30)
            return written, touched, backlog_s, reader_s

        # warm-up: a long-running apply job is warm (workers, plans, JIT) on each of its paths —
        # a small batch folded by one task, a bigger one reduced by one task's latest-change
        # steps, and a large one by those steps replicated over the cores or, on more cores, by
        # the parallel latest-change path (measured: that path's first 100k-change batch in a
        # JVM took 3.8 s to reduce, the next 1.8 s); the last warm-up batch is smaller than
        # spread.REPLICATED_CHANGES, which it lowers for that batch only
        replicated = spread.REPLICATED_CHANGES
        for changes in (1000, spread.ONE_TASK_LATEST_CHANGES + 3000, spread.SERIAL_CHANGES + 10_000):
            stage(changes)
            spread.REPLICATED_CHANGES = min(replicated, changes)
            assert apply_job.run(spark, job, once=True).ok
            spread.REPLICATED_CHANGES = replicated
        written, touched, backlog_s, reader_s = stage(args.changes)

        python_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        committed: list[float] = []  # when each pass had committed its tables (before maintenance)

        def point(name: str, _table) -> None:
            if name == "after-tables":
                committed.append(time.monotonic())

        started = time.monotonic()
        result = apply_job.run(spark, job, once=True, hooks=apply_job.Hooks(point))
        apply_s = time.monotonic() - started
        visible_s = committed[-1] - started
        python_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        assert result.ok, result.tables
        # before the bare MERGE below, which writes the source's values into the same rows
        equal = common.mirror_equals_source(cluster, warehouse)

        keys = sorted(touched)
        final = common.source_table(cluster, "WHERE id = ANY(%s)", (keys,))
        present = set(final["id"].to_pylist())
        deleted = pa.table({"id": pa.array([k for k in keys if k not in present], pa.int64())})
        path = work / "bare.parquet"
        pq.write_table(pa.concat_tables([
            final.append_column("op", pa.array(["U"] * len(final))),
            deleted.append_column("op", pa.array(["D"] * len(deleted)))], promote_options="default"),
            path)
        spark.read.parquet(str(path)).selectExpr("*", "0L AS _lakeslot_lsn"
                                                 ).createOrReplaceTempView("bare")
        every = [*common.COLUMNS, "_lakeslot_lsn"]
        sets = ", ".join(f"t.{c} = s.{c}" for c in every[1:])
        mirror = "lakeslot.bench.public__bench"
        bare: dict[str, float] = {}
        own = spark.sql(f"SHOW TBLPROPERTIES {mirror} ('write.merge.mode')").collect()[0][1]
        for mode in ("copy-on-write", "merge-on-read"):  # (the first leaves the table clean)
            spark.sql(f"ALTER TABLE {mirror} SET TBLPROPERTIES ('write.merge.mode' = '{mode}')")
            started = time.monotonic()
            spark.sql(f"MERGE INTO {mirror} t USING bare s ON t.id = s.id "
                      "WHEN MATCHED AND s.op = 'D' THEN DELETE "
                      f"WHEN MATCHED THEN UPDATE SET {sets} "
                      f"WHEN NOT MATCHED AND s.op <> 'D' THEN INSERT ({', '.join(every)}) "
                      f"VALUES ({', '.join('s.' + c for c in every)})")
            bare[mode] = time.monotonic() - started
        spark.sql(f"ALTER TABLE {mirror} SET TBLPROPERTIES ('write.merge.mode' = '{own}')")
        jvm_peak = jvm_peak_rss(spark)

        spark.stop()

    print(f"PostgreSQL {args.pg}, table {args.rows:,} rows, backlog {written:,} changes "
          f"({backlog_s:.1f} s to write), snapshot {snapshot_s:.1f} s, merge mode "
          f"{args.merge_mode or 'table default'}")
    print(f"reader  {reader_s:6.1f} s  {written / reader_s:9,.0f} changes/s (process start "
          "included)")
    print(f"apply   {apply_s:6.1f} s  {written / apply_s:9,.0f} changes/s  ({result.passes} "
          f"passes; driver peak RSS {python_peak / 2**20:,.0f} MiB, was {python_before / 2**20:,.0f}"
          f" before; JVM peak RSS {jvm_peak / 2**20:,.0f} MiB)")
    print(f"        {visible_s:6.1f} s  {written / visible_s:9,.0f} changes/s  until the last change "
          "was visible (the rest: maintenance the passes triggered)")
    print("apply steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in getattr(result, "steps", {}).items()))
    print(f"bare MERGE {bare['copy-on-write']:6.1f} s copy-on-write (no delete file left: the end "
          f"state of a compacted table), {bare['merge-on-read']:.1f} s merge-on-read (its position "
          f"deletes left behind), for {len(keys):,} keys")
    best = min(bare.values())
    print(f"apply ÷ reader {reader_s / apply_s:.2f}   apply ÷ bare MERGE {best / apply_s:.2f} "
          f"({best / visible_s:.2f} until visible), against the faster of the two; against "
          f"copy-on-write {bare['copy-on-write'] / apply_s:.2f}   mirror equal to source: {equal}")


if __name__ == "__main__":
    main()
