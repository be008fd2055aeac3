"""Benchmark: many busy tables — ``lakeslot run`` over N tables, commit in PostgreSQL → visible in
Iceberg, and what a pass costs per table it touches.

    .venv/bin/python -m bench.many_tables [--tables 200] [--rows 1000] [--rate 100]
                                          [--skew uniform|zipf] [--seconds 60] [--pg 15|18]
                                          [--table-parallelism N] [--no-reference] [--no-floor]

One round starts a throwaway PostgreSQL (``lakeslot.local.pgcluster``) with schema ``app`` holding
``--tables`` tables of ``--rows`` rows each (``id int PRIMARY KEY, v int, note text,
at timestamptz``), then ``lakeslot run`` in this process (continuous, whole-schema selection,
``apply.triggerIntervalSeconds: 1``, local[2] Spark) — the snapshot of every table, the reader,
the apply job — and, once every mirror has its snapshot:

- a writer process: ``--rate`` transactions per second for ``--seconds``, each one ``UPDATE`` of a
  random row of a table drawn uniformly or by Zipf's law (s = 1.1) over the tables; it records
  each transaction's table, ``pg_current_wal_lsn()`` taken inside it and its commit time;
- an observer reading every table's ``lakeslot.lsn`` from its Iceberg metadata as the spec lays
  it out (:func:`visible_lsn`: the hadoop catalog's ``version-hint.text``, and the metadata file
  only when that changed; no lakeslot code, in its own process, 8 threads, the tables with
  changes not yet seen first, a pause of :data:`OBSERVER_PAUSE_S` between cycles).

A transaction counts as visible when its table's observed ``lakeslot.lsn`` reaches the LSN taken
inside it (its commit LSN is above it; a pass commits ``batch end - 1`` ≥ every commit it holds,
so the measure is exact up to the observer's cycle). Printed: the snapshot (whole, and per table),
achieved rate, latency p50/p90/p99/max, the p50 and p99 of the first and the last third (lag
bounded or not), the first 20 s after the snapshot against the rest, what a pass costs (its wall
time averaged over the passes and over those of the last third of the writes, per change, and
the seconds of each step with the threads' times added up), the time to drain, and whether
every mirror equals its source at the end (every column of every row, pyiceberg). With the
reference round (default), the same rate into ONE table holding the same total rows runs first:
the ratios against it are the issue's targets (pass wall time for the changes of many tables
≤ 3× one table's, snapshot ≤ 4×). Last, the physical limit of a pass (:mod:`bench.commit_floor`,
unless ``--no-floor``): Iceberg's own commit of the smallest row delta to as many tables as a
pass touched, ``apply.tableParallelism`` at a time, in a warm JVM of its own. Numbers, not
assertions.
"""

from __future__ import annotations

import argparse
import bisect
import io
import json
import multiprocessing
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench import commit_floor, common
from lakeslot import workloads
from lakeslot.api.models import GROUP, VERSION, ApplySpec
from lakeslot.api.naming import TableName
from lakeslot.local import config
from lakeslot.local import run as local_run
from lakeslot.mirror.catalog import load_hadoop_table
from lakeslot.source.connection import one_row
from lakeslot.staging.store import Staging

SCHEMA = "app"
ZIPF_S = 1.1
EARLY_S = 20.0  # "the first seconds after the snapshot" of the issue
# between two of the observer's cycles: reading every table's metadata in a loop without a pause
# took a core from the apply job it measures (hundreds of tables lag: every cycle reads them all)
OBSERVER_PAUSE_S = 0.25


def table_names(count: int) -> list[str]:
    return [f"t{i:04d}" for i in range(count)]


def create_source(cluster, tables: int, rows: int) -> None:
    cluster.create_database("bench")
    with cluster.connect("bench") as conn:
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        for name in table_names(tables):
            conn.execute(f"CREATE TABLE {SCHEMA}.{name} (id int PRIMARY KEY, v int, note text, "
                         "at timestamptz)")
            conn.execute(f"INSERT INTO {SCHEMA}.{name} SELECT g, g %% 100, md5(g::text), now() "
                         "FROM generate_series(1, %s) g", (rows,))
        conn.execute("ANALYZE")
        conn.commit()


def weights(tables: int, skew: str) -> list[float]:
    """Cumulative probabilities of drawing each table."""
    raw = [1.0 / (i + 1) ** ZIPF_S if skew == "zipf" else 1.0 for i in range(tables)]
    total, running, cumulative = sum(raw), 0.0, []
    for w in raw:
        running += w / total
        cumulative.append(running)
    return cumulative


def writer(dsn: str, tables: int, rows: int, skew: str, rate: float, seconds: float,
           out) -> None:
    import psycopg

    names, cumulative = table_names(tables), weights(tables, skew)
    rng, records = random.Random(42), []
    with psycopg.connect(dsn, autocommit=True) as conn:
        start, i = time.time(), 0
        while time.time() - start < seconds:
            pause = start + i / rate - time.time()
            if pause > 0:
                time.sleep(pause)
            t = min(bisect.bisect_left(cumulative, rng.random()), tables - 1)
            lsn = one_row(conn.execute(
                f"UPDATE {SCHEMA}.{names[t]} SET v = v + 1, at = now() WHERE id = %s "
                "RETURNING (pg_current_wal_lsn() - '0/0')::int8", (rng.randint(1, rows),)))[0]
            records.append((t, lsn, time.time()))
            i += 1
    out.send(records)


@dataclass
class Observer:
    """Each table's ``lakeslot.lsn`` as pyiceberg reads it, with when it was first seen."""

    warehouse: str
    tables: list[TableName]
    seen: list[list[tuple[float, int]]] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.seen = [[] for _ in self.tables]
        self.wanted = [0] * len(self.tables)  # the highest LSN a transaction needs, per table
        self.versions: dict[int, int] = {}  # the metadata version last read, per table

    def read(self, t: int) -> None:
        metadata = Path(self.warehouse.removeprefix("file://")) / "bench" / \
            f"app__{self.tables[t].name}" / "metadata"
        try:
            version = int((metadata / "version-hint.text").read_text())
            if version == self.versions.get(t):
                return
            lsn = visible_lsn(json.loads((metadata / f"v{version}.metadata.json").read_bytes()))
        except (FileNotFoundError, ValueError):  # the hadoop catalog replaces version-hint.text
            return  # while committing (delete, then write): looked at again in the next cycle
        self.versions[t] = version
        if lsn is not None and (not self.seen[t] or lsn > self.seen[t][-1][1]):
            self.seen[t].append((time.time(), lsn))

    def run(self) -> None:
        with ThreadPoolExecutor(8) as pool:
            while not self.stopping.is_set():
                behind = [t for t in range(len(self.tables))
                          if not self.seen[t] or self.seen[t][-1][1] < self.wanted[t]]
                order = behind or range(len(self.tables))
                list(pool.map(self.read, order))
                time.sleep(OBSERVER_PAUSE_S)

    def current(self) -> bool:
        return all(self.seen[t] and self.seen[t][-1][1] >= w for t, w in enumerate(self.wanted))


def visible_lsn(metadata: dict) -> int | None:
    """The ``lakeslot.lsn`` an Iceberg table's metadata (its JSON) shows: its current snapshot's,
    or, through ``replace`` snapshots without one (compactions), their first ancestor's."""
    snapshots = {s["snapshot-id"]: s for s in metadata.get("snapshots", [])}
    snapshot = snapshots.get(metadata.get("current-snapshot-id"))
    while snapshot is not None and "lakeslot.lsn" not in snapshot["summary"] \
            and snapshot["summary"].get("operation") == "replace":
        snapshot = snapshots.get(snapshot.get("parent-snapshot-id"))
    return int(snapshot["summary"]["lakeslot.lsn"]) \
        if snapshot is not None and "lakeslot.lsn" in snapshot["summary"] else None


def observe(warehouse: str, tables: list[TableName], conn) -> None:
    """The observer in its own process (its pyiceberg reads took the apply job's interpreter
    lock when it ran in a thread of the run's process). Over ``conn``: it sends ("snapshotted",
    when) once every mirror exists; receives the wanted LSNs per table; sends ("current", when)
    once every table reached them, then ("seen", every table's observations)."""
    observer = Observer(warehouse, tables)
    threading.Thread(target=observer.run, daemon=True).start()
    while not all(observer.seen):
        time.sleep(0.2)
    conn.send(("snapshotted", time.time()))
    observer.wanted = conn.recv()
    while not observer.current():
        time.sleep(0.1)
    conn.send(("current", time.time()))
    observer.stopping.set()
    conn.send(("seen", observer.seen))


@dataclass
class Round:
    tables: int
    rows: int
    snapshot_s: float
    latencies: list[float]
    early: list[float]  # of the transactions committed in the first EARLY_S s
    rate: float
    drained_s: float
    pass_s: float  # a pass's wall time, averaged over the passes
    pass_last_s: float  # ... over the passes of the last third of the writes
    pass_steps: dict[str, float]  # seconds per step (threads added up), averaged over the passes
    touched: int  # tables that had changes applied (the apply job's totals)
    passes: int
    equal: bool


def one_round(args, tables: int, rows: int) -> Round:
    """``lakeslot run`` in this thread (its signal handling needs the main thread); the writer,
    the observer and the measures in another, which stops the run with SIGTERM as a user would."""
    work = Path(tempfile.mkdtemp(prefix="many-tables-"))
    staging, warehouse = (work / "staging").as_uri(), (work / "warehouse").as_uri()
    with common.cluster(args.pg) as cluster:
        create_source(cluster, tables, rows)
        document = {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PostgresIngestion",
            "metadata": {"name": "bench", "namespace": "default"},
            "spec": {"source": {"host": "127.0.0.1", "port": cluster.port, "database": "bench",
                                "user": cluster.superuser, "schemas": [SCHEMA]},
                     "sink": {"catalog": {"type": "hadoop", "warehouse": warehouse},
                              "namespace": "bench"},
                     "staging": {"uri": staging},
                     "apply": {"triggerIntervalSeconds": 1,
                               **({"tableParallelism": args.table_parallelism}
                                  if args.table_parallelism else {})}}}
        path = work / "ingestion.yaml"
        path.write_text(yaml.safe_dump(document))
        local = config.load(str(path), state_dir=str(work / "state"),
                            environ={workloads.PASSWORD_ENV: cluster.password})
        names = [TableName(SCHEMA, n) for n in table_names(tables)]
        measured: list[Round] = []
        failure: list[BaseException] = []
        started = time.time()

        def measure() -> None:
            try:
                measured.append(_measure(args, cluster, staging, warehouse, names, rows, started))
            except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
                failure.append(e)
            finally:
                os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=measure, daemon=True).start()
        local_run.configure_logging(local, interactive=True)  # into run.log of the state directory
        print(f"  (lakeslot run's log: {local.path('run.log')})")
        result = local_run.run(local, local_run.Options(once=False, out=io.StringIO(),
                                                        interactive=False, master="local[2]"))
        if failure:
            raise failure[0]
        if not measured:
            raise SystemExit(f"lakeslot run ended first: {result.message}")
        return measured[0]


def _measure(args, cluster, staging: str, warehouse: str, names: list[TableName], rows: int,
             started: float) -> Round:
    # (spawned: this process runs a JVM and threads, which a fork would copy mid-flight)
    mine, theirs = multiprocessing.Pipe()
    watcher = multiprocessing.get_context("spawn").Process(
        target=observe, args=(warehouse, names, theirs), daemon=True)
    watcher.start()
    snapshot_s = _expect(mine, "snapshotted") - started  # every mirror has its snapshot
    receive, send = multiprocessing.Pipe(duplex=False)
    process = multiprocessing.Process(target=writer, args=(
        cluster.dsn("bench"), len(names), rows, args.skew, args.rate, args.seconds, send))
    process.start()
    marks: list[dict] = []  # the apply job's totals when the last third of the writes begins
    mark = threading.Timer(args.seconds * 2 / 3, lambda: marks.append(_totals(staging)))
    mark.start()
    records = receive.recv()
    process.join()
    writer_done = time.time()
    mark.join()
    marks.append(_totals(staging))  # ... and when they end
    wanted = [0] * len(names)
    for t, lsn, _ in records:
        wanted[t] = max(wanted[t], lsn)
    mine.send(wanted)
    drained = _expect(mine, "current") - writer_done
    seen = _expect(mine, "seen")
    watcher.join()
    time.sleep(3)  # the pass that made the last change visible writes its status after its commits
    totals = _totals(staging)
    passes = max(1, int(totals.get("passes", 1)))
    steps = {k: v / passes for k, v in totals.get("seconds", {}).items()}
    wall = totals.get("wallSeconds", 0.0) / passes
    before, after = marks if len(marks) == 2 else ({}, totals)
    last = (after.get("wallSeconds", 0.0) - before.get("wallSeconds", 0.0)) / max(
        1, int(after.get("passes", 0)) - int(before.get("passes", 0)))
    touched = sum(len(ops) > 0 for ops in totals.get("changes", {}).values())
    equal = all(_equal(cluster, warehouse, t) for t in names)
    latencies, early = [], []
    for t, lsn, committed in records:
        visible = next(at for at, reached in seen[t] if reached >= lsn)
        latencies.append(visible - committed)
        if committed - records[0][2] <= EARLY_S:
            early.append(visible - committed)
    duration = records[-1][2] - records[0][2]
    return Round(len(names), rows, snapshot_s, latencies, early, len(records) / duration, drained,
                 wall, last, steps, touched, passes, equal)


def _totals(staging: str) -> dict:
    """The apply job's totals (passes, their wall time and steps) from its status document."""
    return (Staging(staging).read_apply_status() or {}).get("totals", {})


def _expect(conn, what: str):
    """The observer's next message, which must be ``what``."""
    kind, value = conn.recv()
    if kind != what:
        raise RuntimeError(f"the observer sent {kind}, not {what}")
    return value


def _equal(cluster, warehouse: str, table: TableName) -> bool:
    columns = ["id", "v", "note", "at"]
    mirror = load_hadoop_table(warehouse, ("bench", f"app__{table.name}"))
    assert mirror is not None
    mirrored = mirror.scan(selected_fields=tuple(columns)).to_arrow().sort_by("id").to_pylist()
    with cluster.connect("bench") as conn:
        rows = conn.execute(f"SELECT {', '.join(columns)} FROM {SCHEMA}.{table.name} ORDER BY id"
                            ).fetchall()
    return mirrored == [dict(zip(columns, r, strict=True)) for r in rows]


def report(label: str, r: Round) -> None:
    q = statistics.quantiles(r.latencies, n=100)
    third = len(r.latencies) // 3
    first, last = r.latencies[:third], r.latencies[-third:]
    print(f"{label}: {r.tables} table(s) × {r.rows} rows; snapshot {r.snapshot_s:.1f} s "
          f"({r.snapshot_s / r.tables:.3f} s per table, Spark start included)")
    print(f"  {len(r.latencies)} transactions at {r.rate:.0f} txn/s; commit→visible p50 "
          f"{q[49]:.2f} s  p90 {q[89]:.2f} s  p99 {q[98]:.2f} s  max {max(r.latencies):.2f} s")
    print(f"  first third p50 {statistics.median(first):.2f} s p99 "
          f"{statistics.quantiles(first, n=100)[98]:.2f} s; last third p50 "
          f"{statistics.median(last):.2f} s p99 {statistics.quantiles(last, n=100)[98]:.2f} s "
          f"(bounded: {'yes' if statistics.median(last) <= 1.5 * statistics.median(first) else 'NO'})")
    if len(r.early) > 1:
        print(f"  first {EARLY_S:.0f} s after the snapshot: p99 "
              f"{statistics.quantiles(r.early, n=100)[98]:.2f} s (steady state p99 {q[98]:.2f} s)")
    per_pass = len(r.latencies) / r.passes  # changes a pass carried, on average
    print(f"  a pass: {r.pass_s:.3f} s on average over {r.passes} passes, ≈{per_pass:.0f} changes "
          f"each into ≤ {min(r.touched, per_pass):.0f} tables ({r.pass_s / max(per_pass, 1):.4f} s "
          f"per change); its steps (the threads' times added up): "
          + ", ".join(f"{k} {v:.3f}" for k, v in r.pass_steps.items()))
    print(f"  a pass of the last third of the writes: {r.pass_last_s:.3f} s on average")
    print(f"  drained {r.drained_s:.1f} s after the writer stopped; every mirror equal to its "
          f"source (pyiceberg, every column of every row): {r.equal}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.many_tables",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--skew", choices=("uniform", "zipf"), default="uniform")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pg", choices=("15", "18"), default="18")
    parser.add_argument("--table-parallelism", type=int, default=None,
                        help="apply.tableParallelism: tables applied at once in a pass "
                        "(default: the spec's default)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the one-table round")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip the commit floor (bench.commit_floor) at the end")
    args = parser.parse_args()
    print(f"PostgreSQL {args.pg}, {args.skew} over the tables, {args.seconds:.0f} s of writes")
    reference = None if args.no_reference else one_round(args, 1, args.tables * args.rows)
    many = one_round(args, args.tables, args.rows)
    if reference is not None:
        report("reference", reference)
    report("many", many)
    if reference is not None:
        print(f"ratios many ÷ one table: snapshot {many.snapshot_s / reference.snapshot_s:.2f} "
              f"(target ≤ 4), pass {many.pass_s / max(reference.pass_s, 1e-9):.2f} (target ≤ 3; the "
              f"last third's {many.pass_last_s / max(reference.pass_last_s, 1e-9):.2f}), p50 "
              f"{statistics.median(many.latencies) / statistics.median(reference.latencies):.2f}")
    if not args.no_floor:
        touched = round(min(many.touched, len(many.latencies) / many.passes))
        floor = commit_floor.measure(touched, args.table_parallelism or ApplySpec().table_parallelism)
        print(f"the floor: Iceberg's own commit of the smallest row delta to {touched} tables "
              f"(bench.commit_floor, warm JVM) {floor.many_s:.3f} s, to one {floor.one_s:.3f} s; "
              f"a pass of the last third {many.pass_last_s / floor.many_s:.2f}× the floor"
              + (f"; the floor alone {floor.many_s / reference.pass_last_s:.2f}× the one-table "
                 f"pass" if reference is not None else ""))


if __name__ == "__main__":
    main()
