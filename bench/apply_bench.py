"""Benchmark: commit in PostgreSQL → visible in Iceberg, with the reader and the apply job running.

    .venv/bin/python -m bench.apply_bench [--rate 600] [--seconds 60] [--pg 15|18]
                                          [--segment-seconds 0.5] [--plot FILE.svg|FILE.png]
                                          [--object-store [--latency-ms 30]]

One run starts a throwaway PostgreSQL (``lakeslot.local.pgcluster``), a table ``bench`` (bigint key,
int, numeric, text, timestamptz), a publication and the slot, then runs at the same time:

- a writer process: ``--rate`` transactions per second, paced, for ``--seconds`` (each an
  INSERT of a new row; every fourth also UPDATEs an earlier row), one connection in autocommit.
  Each transaction returns ``pg_current_wal_lsn()`` taken inside it and records the wall time
  after its commit returned;
- the real reader (``lakeslot reader`` process, segments sealed every ``--segment-seconds``);
- the apply job in this process (``lakeslot.apply.job.run``, long-running, local[2] Spark,
  ``triggerIntervalSeconds: 1``, snapshot mode ``never``);
- an observer polling the mirror's ``lakeslot.lsn`` with pyiceberg every 50 ms (an independent
  reader of the Iceberg metadata).

Transaction i counts as visible at the first observed ``lakeslot.lsn`` ≥ the LSN returned by
transaction i+1 (taken after i committed, so above i's commit LSN): a conservative latency, high
by at most one transaction interval. Printed: achieved write rate, latency p50/p90/p99/max, the
p50 of the first and the last third (lag bounded: the last third must not be far above the
first), the time to drain after the writer stops, whether the mirror equals the source at the
end (every column of every row, read with pyiceberg), where an apply pass spends its time
(seconds per step, averaged over the passes) and the three slowest passes while the writer ran
(when they ended, their steps: what the tail is made of), and how the passes line up with the
seals (:mod:`lakeslot.cadence`: the median time after a point of the seal grid of the segment
files' times and of the passes' starts). The apply job warms up before its first pass
(:mod:`lakeslot.apply.warmup`); the writer starts once the mirror exists, i.e. after it.
With ``--object-store`` staging is on S3 and the mirror in an Iceberg REST catalog (``weed mini``),
each behind :mod:`bench.latency_proxy` adding ``--latency-ms`` to every request; the observer
reads the table's metadata from the catalog directly (the Iceberg REST protocol), and the
requests around each commit are counted (:func:`bench.latency_proxy.commit_trips`) and one
commit's printed request by request.
Numbers, not assertions (targets: p50 ≤ 2 s, p99 ≤ 5 s, never above p50 5 s / p99 15 s; lag
bounded). ``--plot`` also draws the latency distribution and the lag over time (:mod:`bench.plots`,
needs the ``plots`` extra: matplotlib).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import common, latency_proxy
from lakeslot import cadence, workloads
from lakeslot.apply import job as apply_job
from lakeslot.mirror import progress as mirror_progress
from lakeslot.source.connection import one_row
from lakeslot.spark.session import job_session
from lakeslot.staging.store import Staging

TABLE = common.TABLE


def writer(dsn: str, rate: float, seconds: float, out) -> None:
    import psycopg

    records = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        insert = ("INSERT INTO bench VALUES (%s, %s, %s, 'row ' || %s, now()) "
                  "RETURNING (pg_current_wal_lsn() - '0/0')::int8")
        start = time.time()
        i = 0
        while time.time() - start < seconds:
            due = start + i / rate
            pause = due - time.time()
            if pause > 0:
                time.sleep(pause)
            lsn = one_row(conn.execute(insert, (i, i % 100, i / 100, i)))[0]
            records.append((lsn, time.time()))
            if i % 4 == 3:
                conn.execute("UPDATE bench SET qty = qty + 1 WHERE id = %s", (i // 2,))
            i += 1
    out.send(records)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.apply_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=600.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pg", choices=("15", "18"), default="15")
    parser.add_argument("--segment-seconds", type=float, default=0.5)
    parser.add_argument("--object-store", action="store_true",
                        help="S3 staging and an Iceberg REST catalog (weed mini), each behind a "
                        "proxy adding --latency-ms to every request")
    parser.add_argument("--latency-ms", type=float, default=30.0,
                        help="with --object-store: milliseconds added to each request (default 30)")
    parser.add_argument("--plot", type=Path, metavar="FILE",
                        help="also write the latency distribution and the lag over time (.svg or .png; "
                             "needs matplotlib: pip install -e '.[plots]')")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="apply-bench-"))
    staging, warehouse = (work / "staging").as_uri(), str(work / "warehouse")
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(common.cluster(args.pg))
        net = stack.enter_context(common.network(work / "object-store", args.latency_ms / 1000)) \
            if args.object_store else None
        common.create_source(cluster)
        network_spec: dict[str, Any] = {} if net is None else {
            "sink": {"catalog": net.catalog_document()},
            "secretEnv": net.secret_env()}
        staging = staging if net is None else net.staging
        ingestion = common.ingestion(cluster, staging, warehouse, snapshot={"mode": "never"},
                                     **network_spec)
        answered = None if net is None else net.rest.follow()  # on object storage
        positions: list[int] = []  # ... the mirror's, as the catalog answered its commits

        def visible() -> int | None:
            """The mirror's ``lakeslot.lsn``: through lakeslot's progress reader on local disk,
            on object storage from the REST catalog's answers to the commits (as
            :mod:`bench.many_tables` sees them, without loading the table in a loop)."""
            if answered is None:
                return mirror_progress.read(ingestion, [TABLE])[TABLE].lsn
            positions.extend(lsn for _, table, lsn in answered() if table.endswith(".public__bench"))
            return max(positions, default=None)
        os.environ[workloads.PASSWORD_ENV] = cluster.password
        env = {**os.environ, "LAKESLOT_SOURCE_PASSWORD": cluster.password}
        with open(work / "reader.log", "wb") as reader_log:  # the reader keeps its own descriptor
            reader = subprocess.Popen(common.reader_command(cluster, staging, args.segment_seconds),
                                      env=env, stderr=reader_log)
        job = workloads.JobInput(ingestion, (TABLE,))
        spark = job_session(job, "apply-bench", master="local[2]")
        stop = threading.Event()
        outcome: list[apply_job.ApplyResult] = []
        ended: list[tuple[float, dict[str, float]]] = []  # each pass: when it ended, its steps

        def on_pass(result: apply_job.PassResult) -> None:
            ended.append((time.time(), dict(result.steps)))

        applier = threading.Thread(
            target=lambda: outcome.append(apply_job.run(spark, job, once=False, stop=stop,
                                                        on_pass=on_pass)),
            daemon=True)
        applier.start()

        seen: list[tuple[float, int]] = []
        observing = threading.Event()

        def observe() -> None:
            while not observing.is_set():
                lsn = visible()
                if lsn is not None and (not seen or lsn > seen[-1][1]):
                    seen.append((time.time(), lsn))
                time.sleep(0.05)

        observer = threading.Thread(target=observe, daemon=True)
        observer.start()
        while visible() is None:
            time.sleep(0.2)  # the mirror exists: the apply job is up
        if net is not None:
            net.s3.recording.set()
            net.rest.recording.set()
        receive, send = multiprocessing.Pipe(duplex=False)
        process = multiprocessing.Process(target=writer, args=(cluster.dsn("bench"), args.rate,
                                                               args.seconds, send))
        process.start()
        records = receive.recv()
        process.join()
        writer_done = time.time()
        final = records[-1][0]
        with cluster.connect("bench") as conn:
            end_lsn = one_row(conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::int8"))[0]
        while not seen or seen[-1][1] < end_lsn - 1:
            time.sleep(0.05)
        drained = seen[-1][0] - writer_done
        observing.set()
        if net is not None:
            net.s3.recording.clear()
            net.rest.recording.clear()
        stop.set()
        applier.join(120)
        reader.terminate()
        reader.wait(30)

        bounds = [r[0] for r in records[1:]] + [final + 1]
        latencies, j = [], 0
        for (_, committed), bound in zip(records, bounds, strict=True):
            while seen[j][1] < bound - 1 and j < len(seen) - 1:
                j += 1
            latencies.append(seen[j][0] - committed)
        rows = spark.sql(f"SELECT count(*) FROM {ingestion.spec.sink.catalog.name}.bench."
                         "public__bench").collect()[0][0]
        with cluster.connect("bench") as conn:
            source = one_row(conn.execute("SELECT count(*) FROM bench"))[0]
        equal = common.mirror_equals_source(cluster, warehouse,
                                            None if net is None else net.pyiceberg_catalog())
        trips = None if net is None else latency_proxy.commit_trips(
            net.s3.requests, net.rest.requests,
            lambda path: "bench" if path.startswith("/lake/") and "public__bench" in path else None,
            lambda path: "bench" if "public__bench" in path else None)
        staged = None if net is None else latency_proxy.reads(net.s3.requests, "/stage/")
        spark.stop()
        sealed = [t for _, t in Staging(staging).listing() if t is not None]

    duration = records[-1][1] - records[0][1]
    q = statistics.quantiles(latencies, n=100)
    third = len(latencies) // 3
    print(f"PostgreSQL {args.pg}, {len(records)} transactions in {duration:.1f} s = "
          f"{len(records) / duration:.0f} txn/s (+1 UPDATE per 4), segments every "
          f"{args.segment_seconds} s, trigger 1 s, {len(seen)} Iceberg positions observed")
    print(f"latency commit→visible: p50 {q[49]:.2f} s  p90 {q[89]:.2f} s  p99 {q[98]:.2f} s  "
          f"max {max(latencies):.2f} s")
    print(f"p50 first third {statistics.median(latencies[:third]):.2f} s, last third "
          f"{statistics.median(latencies[-third:]):.2f} s; drained {drained:.2f} s after the "
          f"writer stopped; rows mirror {rows} / source {source}; mirror equal to the source "
          f"(every column of every row, pyiceberg): {equal}")
    if outcome:
        passes = outcome[0].passes
        print(f"a pass, on average over {passes}: " + ", ".join(
            f"{step} {seconds / passes:.3f} s" for step, seconds in outcome[0].steps.items()))
    during = [(at, steps) for at, steps in ended if records[0][1] <= at <= writer_done + drained]
    slowest = sorted(during, key=lambda p: -sum(p[1].values()))[:3]
    print("slowest passes while writing: " + "; ".join(
        f"at {at - records[0][1]:.1f} s {sum(steps.values()):.2f} s (" + ", ".join(
            f"{step} {seconds:.2f}" for step, seconds in steps.items() if seconds >= 0.05) + ")"
        for at, steps in slowest))
    def median_after_grid(times: list[float]) -> str:
        """The median time after the seal grid's last point (lakeslot.cadence), in ms."""
        phases = [cadence.after_grid(t, args.segment_seconds) for t in times]
        return f"{statistics.median(phases) * 1000:.0f} ms" if phases else "-"

    print(f"alignment (lakeslot.cadence): seals' file times {median_after_grid(sealed)} after a grid "
          f"point of {args.segment_seconds} s (median), passes started "
          f"{median_after_grid([at - sum(steps.values()) for at, steps in during])} after one")
    if trips is not None and trips.commits:
        print(f"on the network ({args.latency_ms:.0f} ms added to each request): {trips.commits} "
              f"commits, each (median) {trips.s3:.0f} S3 and {trips.rest:.0f} catalog requests up "
              f"to its answer, {trips.sequential:.0f} of them one after the other "
              f"({trips.sequential * args.latency_ms / 1000:.2f} s of added latency; the floor "
              f"{latency_proxy.MIN_COMMIT_TRIPS} × {args.latency_ms:.0f} ms = "
              f"{latency_proxy.MIN_COMMIT_TRIPS * args.latency_ms / 1000:.2f} s), then "
              f"{trips.s3_after:.0f} S3 and {trips.rest_after:.0f} catalog requests after it")
        print("one commit's requests (offset from the first):")
        for line in trips.example:
            print(f"  {line}")
        print(f"staging: {staged.line(args.latency_ms / 1000) if staged else '-'}")
    if args.rate <= 600:
        floor = q[49] <= 5 and q[98] <= 15 and equal
        target = q[49] <= 2 and q[98] <= 5 and equal
        print(f"issue 20's targets p50 ≤ 2 s, p99 ≤ 5 s, mirror equal: "
              f"{'met' if target else 'NOT met'}; the floor p50 ≤ 5 s, p99 ≤ 15 s: "
              f"{'held' if floor else 'CROSSED'}")
    else:  # above the rate the latency targets are for: the lag must stay bounded
        bounded = statistics.median(latencies[-third:]) <= statistics.median(latencies[:third])
        print(f"lag bounded (last third's p50 not above the first third's): "
              f"{'yes' if bounded else 'NO'}; mirror equal: {equal}")
    if args.plot:
        from bench import plots

        title = (f"apply latency, PostgreSQL {args.pg}, {len(records) / duration:.0f} txn/s for "
                 f"{duration:.0f} s (p50 {q[49]:.2f} s, p99 {q[98]:.2f} s)")
        print(f"wrote {plots.latency_figure(args.plot, [r[1] for r in records], latencies, title)}")


if __name__ == "__main__":
    main()
