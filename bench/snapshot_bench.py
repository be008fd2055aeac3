"""Benchmark: the snapshot job against raw parallel ``psql \\copy … to /dev/null``, same run, same
parallelism, same table.

    .venv/bin/python -m bench.snapshot_bench [--rows 5000000] [--parallelism 2] [--repeat 3]
                                             [--pg 15|18]

It starts a throwaway PostgreSQL (``lakeslot.local.pgcluster``), builds the reference table (``--rows``
rows of mixed types, ≈135 bytes of data per row: bigint, int, numeric(12,2), float8, bool,
timestamptz, date, text, varchar, text, uuid), reads it once to warm the page cache, starts a
``local[N]`` Spark session with an Iceberg hadoop catalog in a temp dir and one idle Python task
(so the Python daemon's start is not timed), then alternates, ``--repeat`` times:

- raw: ``--parallelism`` ``psql \\copy (SELECT * FROM ref WHERE ctid …) to /dev/null`` processes
  on equal ctid page ranges, in parallel;
- snapshot: ``lakeslot.snapshot.job.copy`` with ranges of the same size (the job plans exactly
  ``--parallelism`` ranges), into a fresh namespace.

It prints, per run and as the median: rows/s; client CPU seconds per million rows (the driver
Python process, its JVM and every Python worker: the process tree under this process, sampled
from /proc; for raw, the psql processes); PostgreSQL server CPU per million rows (the postmaster
tree); the ratio of the rates; and where the client CPU goes (JVM, driver, workers; inside the
workers: ADBC read, conversion, Parquet write). The first run is cold (Iceberg classes loaded
and compiled in the JVM, lakeslot imported in each Python worker: ≈5 s of CPU once per job
process); later runs show the steady state. Exits 0: numbers, not assertions (a shared 2-core
machine is noisy, compare ratios within one run).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from lakeslot.api.naming import TableName
from lakeslot.local import pgcluster
from lakeslot.snapshot import job as snapshot_job
from lakeslot.snapshot.plan import TableRequest
from lakeslot.source.connection import ConnectionSettings, one_row

REFERENCE = """
CREATE TABLE ref (id bigint PRIMARY KEY, qty int NOT NULL, amount numeric(12,2), price float8,
                  flag bool, created timestamptz, day date, name text, code varchar(8), note text,
                  u uuid);
INSERT INTO ref SELECT g, g % 1000, (g % 10000000) / 100.0, g * 1.5, g % 2 = 0,
       timestamptz '2020-01-01' + g * interval '1 second', date '2020-01-01' + (g % 3000),
       'name-' || lpad(g::text, 15, '0'), 'C' || (g % 1000000), md5(g::text), md5(g::text)::uuid
  FROM generate_series(1, {rows}) g;
VACUUM ANALYZE ref;
"""
TICKS = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for t in tasks for c in (t / "children").read_text().split()]
    except OSError:
        return []


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        todo += _children(current)
    return pids


def _cpu(pid: int) -> tuple[str, float]:
    """(command, CPU seconds the process itself has used so far)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", 0.0
    command = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    return command, (int(fields[11]) + int(fields[12])) / TICKS


class TreeCpu:
    """CPU used by a process tree while the ``with`` block runs, sampled every 50 ms so that
    processes starting and ending in between (tasks, backends) are counted (each loses at most
    one interval). By kind: the root, ``java`` processes, everything else."""

    def __init__(self, root: int) -> None:
        self._root, self._stop = root, threading.Event()
        self._seen: dict[int, tuple[str, float]] = {}

    def _sample(self) -> dict[int, tuple[str, float]]:
        return {pid: _cpu(pid) for pid in _tree(self._root)}

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._seen.update({pid: v for pid, v in self._sample().items() if v[0]})

    def __enter__(self) -> TreeCpu:
        self._before = self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._seen.update({pid: v for pid, v in self._sample().items() if v[0]})
        self.by_kind = {"driver": 0.0, "jvm": 0.0, "other": 0.0}
        for pid, (command, seconds) in self._seen.items():
            kind = "driver" if pid == self._root else "jvm" if command == "java" else "other"
            self.by_kind[kind] += seconds - self._before.get(pid, ("", 0.0))[1]
        self.total = sum(self.by_kind.values())


def postmaster_pid(cluster: pgcluster.Cluster) -> int:
    return int((cluster.datadir / "postmaster.pid").read_text().split()[0])


def raw_copy(cluster: pgcluster.Cluster, dbname: str, pages: int, parallelism: int) -> float:
    """Wall seconds of parallel psql \\copy to /dev/null (CPU is measured by the caller)."""
    step = math.ceil(pages / parallelism)
    queries = []
    for i in range(parallelism):
        lower = f"ctid >= '({i * step},0)'::tid" if i else "true"
        upper = f" AND ctid < '({(i + 1) * step},0)'::tid" if i < parallelism - 1 else ""
        queries.append(f"\\copy (SELECT * FROM ref WHERE {lower}{upper}) to /dev/null")
    env = {**os.environ, "PGPASSWORD": cluster.password}
    started = time.perf_counter()
    processes = [subprocess.Popen([str(cluster.tool("psql")), "-X", "-q", "-h", "127.0.0.1", "-p",
                                   str(cluster.port), "-U", cluster.superuser, "-d", dbname, "-c", q],
                                  env=env) for q in queries]
    for p in processes:
        if p.wait():
            raise SystemExit(f"psql failed with {p.returncode}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshot_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pg", choices=("15", "18"), default="15")
    args = parser.parse_args()
    install = pgcluster.debian_install(15) if args.pg == "15" else pgcluster.embedded_install()
    if install is None:
        raise SystemExit(f"PostgreSQL {args.pg} is not installed")

    from lakeslot.spark.session import build_session

    with pgcluster.Cluster(install) as cluster, tempfile.TemporaryDirectory() as warehouse:
        cluster.create_database("bench")
        started = time.perf_counter()
        with cluster.connect("bench") as conn:
            for statement in REFERENCE.format(rows=args.rows).split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            pages, heap = one_row(conn.execute(
                "SELECT relpages, pg_relation_size('ref') FROM pg_class WHERE relname = 'ref'"))
            data = one_row(conn.execute("SELECT avg(pg_column_size(ref.*)) FROM ref"))[0]
            conn.execute("SELECT count(*) FROM ref")  # warm the page cache
        print(f"reference table: {args.rows} rows, {heap / 2**20:.0f} MiB heap, {pages} pages, "
              f"{float(data):.0f} B/row with tuple header; built in {time.perf_counter() - started:.0f} s "
              f"(PostgreSQL {cluster.major})", flush=True)

        spark = build_session(warehouse, app_name="lakeslot-bench", master=f"local[{args.parallelism}]")
        spark.sparkContext.parallelize([0], 1).map(lambda x: x).collect()  # start the Python daemon
        settings = ConnectionSettings("127.0.0.1", cluster.port, "bench", cluster.superuser,
                                      cluster.password)
        root, server = os.getpid(), postmaster_pid(cluster)
        million = args.rows / 1e6
        runs = []
        for i in range(args.repeat):
            with TreeCpu(root) as raw_client, TreeCpu(server) as raw_server:
                raw_wall = raw_copy(cluster, "bench", pages, args.parallelism)

            job = snapshot_job.SnapshotJob(
                source=settings, tables=(TableRequest(TableName("public", "ref"), "ref"),),
                namespace=f"bench{i}", parallelism=args.parallelism,
                target_range_bytes=math.ceil(pages / args.parallelism) * 8192, ingestion="bench")
            with TreeCpu(root) as client, TreeCpu(server) as server_cpu:
                started = time.perf_counter()
                result = snapshot_job.copy(spark, job)
                wall = time.perf_counter() - started
            assert result.ok and result.tables[0].rows == args.rows, result
            run = {"rate": args.rows / wall, "raw_rate": args.rows / raw_wall,
                   "cpu": client.total / million, "raw_cpu": raw_client.by_kind["other"] / million,
                   "server": server_cpu.total / million, "raw_server": raw_server.total / million,
                   "driver": client.by_kind["driver"] / million, "jvm": client.by_kind["jvm"] / million,
                   "workers": client.by_kind["other"] / million,
                   **{f"task_{k}": v / million for k, v in result.cpu.items()}}
            run["ratio"] = run["rate"] / run["raw_rate"]
            runs.append(run)
            print(f"run {i + 1}: snapshot {run['rate']:,.0f} rows/s, {run['cpu']:.2f} client CPU-s/M "
                  f"(server {run['server']:.2f}) | raw COPY {run['raw_rate']:,.0f} rows/s, "
                  f"{run['raw_cpu']:.2f} client CPU-s/M (server {run['raw_server']:.2f}) | "
                  f"ratio {run['ratio']:.0%} | client by process: workers {run['workers']:.2f}, "
                  f"JVM {run['jvm']:.2f}, driver {run['driver']:.2f}", flush=True)
        spark.stop()

    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"\nmedian of {len(runs)} at parallelism {args.parallelism}:")
    print(f"  snapshot job : {median['rate']:>12,.0f} rows/s  {median['cpu']:.2f} client CPU-s per million rows"
          f"  (server {median['server']:.2f})")
    print(f"  raw \\copy    : {median['raw_rate']:>12,.0f} rows/s  "
          f"{median['raw_cpu']:.2f} client CPU-s per million rows"
          f"  (server {median['raw_server']:.2f})")
    print(f"  ratio        : {median['ratio']:.0%} of the raw parallel COPY rate")
    print("  client CPU-s per million rows by process: "
          f"workers {median['workers']:.2f}, JVM {median['jvm']:.2f}, driver {median['driver']:.2f}")
    print("  inside the workers: "
          f"ADBC read {median['task_read']:.2f}, convert {median['task_convert']:.2f}, "
          f"Parquet write {median['task_write']:.2f}, other (task start, pickling, Spark) "
          f"{median['workers'] - median['task_read'] - median['task_convert'] - median['task_write']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
