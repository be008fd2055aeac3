"""Benchmark: what many merge-on-read apply passes cost readers, with and without maintenance.

    .venv/bin/python -m bench.read_amplification [--rows 200000] [--passes 200]
                                                 [--changes-per-pass 500] [--pg 15|18]

For each setting of ``spec.sink.maintenance`` (off, then on with its defaults), one
run starts a throwaway PostgreSQL (``lakeslot.local.pgcluster``) with the ``bench`` table of ``--rows``
rows, snapshots it with the real snapshot job (local[2] Spark, hadoop catalog), keeps the real
reader streaming, and then makes ``--passes`` apply passes: each writes ``--changes-per-pass``
random changes (80% updates, 10% inserts, 10% deletes, one transaction), waits until they are
sealed, and runs the apply job once (the tables' default write mode, merge-on-read).

Then, in the same session, it times a full scan of the mirror (Spark: every column hashed and
summed; pyiceberg: ``scan().to_arrow()``, the independent reader, best of 3 each) against the
same scans of a freshly written copy (``CREATE TABLE … AS SELECT``: no delete files, no small
files), and prints the ratio — the read amplification the passes left — with the mirror's data
and delete file counts. Before that the mirror is compared with the source, every column of
every row (pyiceberg). With maintenance on, the source then goes quiet: apply passes with
nothing new run until the mirror has no delete file left (a quiet table's are compacted away,
at most 60 s), and the scans are timed again. Numbers, not assertions (the target, ≤ 1.3× with maintenance on, is in
docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path

from bench import common
from lakeslot.apply import job as apply_job
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.snapshot import job as snapshot_job
from lakeslot.source.connection import one_row
from lakeslot.staging.store import Staging

MIRROR = "lakeslot.bench.public__bench"
QUIET_S = 60.0  # at most this long of passes with nothing new, until no delete file is left
FRESH = "lakeslot.bench.fresh_copy"


def changes(conn, rng: random.Random, count: int, next_id: int) -> int:
    """One transaction of ``count`` changes; returns the next free id."""
    with conn.transaction():
        for _ in range(count):
            roll = rng.random()
            if roll < 0.8:
                conn.execute("UPDATE bench SET qty = qty + 1, note = md5(random()::text) "
                             "WHERE id = %s", (rng.randint(1, next_id - 1),))
            elif roll < 0.9:
                conn.execute("INSERT INTO bench VALUES (%s, 1, 1.5, 'new', now())", (next_id,))
                next_id += 1
            else:
                conn.execute("DELETE FROM bench WHERE id = %s", (rng.randint(1, next_id - 1),))
    return next_id


def best_of(runs: int, action) -> float:
    timings = []
    for _ in range(runs):
        started = time.monotonic()
        action()
        timings.append(time.monotonic() - started)
    return min(timings)


def one_setting(args, maintenance: dict) -> dict:
    work = Path(tempfile.mkdtemp(prefix="read-amplification-"))
    staging, warehouse = (work / "staging").as_uri(), str(work / "warehouse")
    with common.cluster(args.pg) as cluster:
        job, spark = common.apply_setup(cluster, args.rows, staging, warehouse,
                                        "read-amplification", {"maintenance": maintenance})
        snapshot_job.run(spark, job)
        env = {**os.environ, "LAKESLOT_SOURCE_PASSWORD": cluster.password}
        with open(work / "reader.log", "ab") as reader_log:
            reader = subprocess.Popen(common.reader_command(cluster, staging, 0.2), env=env,
                                      stderr=reader_log)
        rng, store, next_id = random.Random(7), Staging(staging), args.rows + 1
        started = time.monotonic()
        try:
            with cluster.connect("bench", autocommit=True) as conn:
                for _ in range(args.passes):
                    next_id = changes(conn, rng, args.changes_per_pass, next_id)
                    end = one_row(conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::int8"))[0]
                    while (point := store.resume_point()) is None or point.end < end:
                        time.sleep(0.02)
                    assert apply_job.run(spark, job, once=True).ok
        finally:
            reader.terminate()
            reader.wait(30)
        passes_s = time.monotonic() - started

        equal = common.mirror_equals_source(cluster, warehouse)

        def load(name: str):
            return load_hadoop_table(Path(warehouse).as_uri(), ("bench", name))

        mirror = load("public__bench")
        current = mirror.current_snapshot() if mirror is not None else None
        assert mirror is not None and current is not None and current.summary is not None
        summary = current.summary

        spark.sql(f"CREATE TABLE {FRESH} AS SELECT * FROM {MIRROR}")
        fresh = load("fresh_copy")
        assert fresh is not None

        def spark_scan(name: str):
            return lambda: spark.sql(f"SELECT sum(hash(*)) FROM {name}").collect()

        def amplification(mirror) -> tuple[float, float]:
            """(Spark, pyiceberg): a full scan of the mirror ÷ the same scan of the copy."""
            return (best_of(3, spark_scan(MIRROR)) / best_of(3, spark_scan(FRESH)),
                    best_of(3, lambda: mirror.scan().to_arrow())
                    / best_of(3, lambda: fresh.scan().to_arrow()))

        figures = {
            "at end": amplification(mirror),
            "data files": summary.get("total-data-files"),
            "delete files": summary.get("total-delete-files"),
            "compactions": sum(1 for s in mirror.snapshots() if s.summary is not None
                               and s.summary.get("lakeslot.maintenance") == "compaction"),
            "passes s": passes_s, "equal": equal}
        if maintenance["enabled"]:  # the source goes quiet: passes find nothing new
            def delete_files(mirror) -> str | None:
                snapshot = mirror.current_snapshot()
                return snapshot.summary.get("total-delete-files") if snapshot and snapshot.summary \
                    else None

            deadline, quiet = time.monotonic() + QUIET_S, time.monotonic()
            while time.monotonic() < deadline and delete_files(mirror) != "0":
                assert apply_job.run(spark, job, once=True).ok
                mirror = load("public__bench")
            figures["quiet"] = amplification(mirror)
            figures["quiet s"] = time.monotonic() - quiet
        spark.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.read_amplification",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--changes-per-pass", type=int, default=500)
    parser.add_argument("--pg", choices=("15", "18"), default="18")
    args = parser.parse_args()
    print(f"PostgreSQL {args.pg}, table {args.rows:,} rows, {args.passes} apply passes of "
          f"{args.changes_per_pass} changes (merge-on-read)", flush=True)
    for setting, enabled in (("off", False), ("on", True)):
        r = one_setting(args, {"enabled": enabled})
        print(f"maintenance {setting:3}: full scan ÷ fresh copy after the last pass: Spark "
              f"{r['at end'][0]:.2f}, pyiceberg {r['at end'][1]:.2f}; {r['data files']} data files, "
              f"{r['delete files']} delete files, {r['compactions']} compactions; passes took "
              f"{r['passes s']:.0f} s; mirror equal to source: {r['equal']}", flush=True)
        if "quiet" in r:
            print(f"                 once the source is quiet (passes with nothing new, "
                  f"{r['quiet s']:.1f} s): Spark {r['quiet'][0]:.2f}, pyiceberg {r['quiet'][1]:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
