"""Benchmark: many busy tables — ``lakeslot run`` over N tables, commit in PostgreSQL → visible in
Iceberg, and what a pass costs per table it touches.

    .venv/bin/python -m bench.many_tables [--tables 200] [--rows 1000] [--rate 100]
                                          [--skew uniform|zipf] [--seconds 60] [--pg 15|18]
                                          [--table-parallelism N] [--no-reference] [--no-floor]
                                          [--object-store [--latency-ms 30] [--no-local]]

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
  changes not yet seen first, a pause of :data:`OBSERVER_PAUSE_S` between cycles); on a REST
  catalog, the catalog's answers to the commits instead (below).

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

With ``--object-store`` the production configuration runs after the same round on local disk
(``--no-local`` skips that one; no reference round): staging in S3 and the mirrors in an Iceberg
REST catalog with ``S3FileIO`` (``weed mini``, :func:`bench.common.network`), each behind a
:class:`bench.latency_proxy.ProxyProcess` adding ``--latency-ms`` to every HTTP request. There a
change is visible once the catalog answered the commit of a snapshot whose ``lakeslot.lsn``
reaches it (any reader loading the table from then on sees it): the catalog's proxy sees the
answers (:attr:`bench.latency_proxy.LatencyProxy.commits`; no lakeslot code). Loading every
table in a loop instead, as the hadoop observer reads its files, cost the catalog 3.5–5.5 ms of
CPU a load on this machine, hundreds of loads a second, taken from the run it measures. The
mirrors are compared through the catalog with pyiceberg. Printed besides: the requests the
passes made to S3 and to the catalog, a table commit's requests (how many, how many one after
the other: :func:`bench.latency_proxy.commit_trips`; one commit's requests line by line), and the
floor of a pass for that latency — the table commits of a pass, as many in flight as a pass runs
(:func:`lakeslot.apply.slots.threads`), × the round trips a commit cannot avoid
(:data:`bench.latency_proxy.MIN_COMMIT_TRIPS`) × the latency. Every request of both proxies is
saved as JSON lines (the path is printed).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import dataclasses
import io
import json
import math
import multiprocessing
import os
import random
import re
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from bench import commit_floor, common, cpu_use, latency_proxy
from lakeslot import workloads
from lakeslot.api.models import GROUP, VERSION, ApplySpec
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.apply import slots
from lakeslot.local import config, objectstore, processes
from lakeslot.local import run as local_run
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.source.connection import one_row
from lakeslot.staging.store import Staging

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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
    """Each table's ``lakeslot.lsn`` as its metadata shows it, with when it was first seen:
    ``warehouse`` a hadoop catalog's (``file://``), or a REST catalog's commits as its proxy saw
    them (``commits``: :meth:`bench.latency_proxy.ProxyProcess.follow`); last, the cuts
    record's (``record``: its name; its ``lakeslot.lsn`` is the latest cut)."""

    warehouse: str
    tables: list[TableName]
    commits: Callable[[], list[tuple[float, str, int]]] | None = None
    record: str | None = None
    seen: list[list[tuple[float, int]]] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.names = [f"app__{t.name}" for t in self.tables] + ([self.record] if self.record else [])
        self.seen = [[] for _ in self.names]
        self.wanted = [0] * len(self.names)  # the highest LSN a transaction needs, per table
        self.versions: dict[int, int] = {}  # the metadata version last read, per table

    def read(self, t: int) -> None:
        metadata = Path(self.warehouse.removeprefix("file://")) / "bench" / self.names[t] / "metadata"
        try:
            version = int((metadata / "version-hint.text").read_text())
            if version == self.versions.get(t):
                return
            lsn = visible_lsn(json.loads((metadata / f"v{version}.metadata.json").read_bytes()))
        except (FileNotFoundError, ValueError):  # the hadoop catalog replaces
            return  # version-hint.text while committing: looked at in the next cycle
        self.versions[t] = version
        self._saw(t, time.time(), lsn)

    def _saw(self, t: int, at: float, lsn: int | None) -> None:
        if lsn is not None and (not self.seen[t] or lsn > self.seen[t][-1][1]):
            self.seen[t].append((at, lsn))

    def run(self) -> None:
        if self.commits is not None:
            self._follow(self.commits)
            return
        with ThreadPoolExecutor(8) as pool:
            while not self.stopping.is_set():
                behind = [t for t in range(len(self.names))
                          if not self.seen[t] or self.seen[t][-1][1] < self.wanted[t]]
                order = behind or range(len(self.names))
                list(pool.map(self.read, order))
                time.sleep(OBSERVER_PAUSE_S)

    def _follow(self, commits: Callable[[], list[tuple[float, str, int]]]) -> None:
        """The commits' answers as they come (their monotonic times made wall-clock times)."""
        index, wall = {name: t for t, name in enumerate(self.names)}, time.time() - time.monotonic()
        while not self.stopping.is_set():
            for answered, table, lsn in commits():
                if (t := index.get(table.split(".", 1)[-1])) is not None:
                    self._saw(t, answered + wall, lsn)
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


def observe(warehouse: str, tables: list[TableName], conn,
            commits: Callable[[], list[tuple[float, str, int]]] | None = None,
            record: str | None = None) -> None:
    """The observer: in its own process reading a hadoop catalog (its reads took the apply
    job's interpreter lock when it ran in a thread of the run's process), in a thread following a
    REST catalog's ``commits`` (a question to the proxy's process every
    :data:`OBSERVER_PAUSE_S`). Over ``conn``: it sends ("snapshotted", when) once every mirror
    exists; receives the wanted LSNs per table; sends ("current", when) once every table reached
    them, then ("seen", every table's observations)."""
    observer = Observer(warehouse, tables, commits, record)
    threading.Thread(target=observer.run, daemon=True).start()
    while not all(observer.seen[:len(tables)]):
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
    in_cut: list[float]  # commit → part of a cut (the cuts record's lakeslot.lsn reaches it)
    rate: float
    drained_s: float
    pass_s: float  # a pass's wall time, averaged over the passes
    pass_last_s: float  # ... over the passes of the last third of the writes (NaN: none ended)
    pass_steps: dict[str, float]  # seconds per step (threads added up), averaged over the passes
    touched: int  # tables that had changes applied (the apply job's totals)
    passes: int
    equal: bool
    cpu: cpu_use.Summary | None  # the machine's CPU during the writes, per process group
    network: Trips | None = None  # on object storage: the requests of the writes' passes
    cpu_committing: cpu_use.Summary | None = None  # ... while table commits were in flight


@dataclass(frozen=True)
class Trips:
    """What the passes during the writes asked of S3 and of the catalog (the proxies' counts)."""

    delay_s: float
    parallelism: int  # table commits in flight at once (lakeslot.apply.slots.threads)
    passes: int
    s3: int  # requests to S3 (staging and the warehouse)
    rest: int  # requests to the catalog
    commits: latency_proxy.CommitTrips
    staging: latency_proxy.Reads  # the reads of staging (segments, status documents)
    callers: dict[str, int]  # catalog requests by method and client ("GET PyIceberg": n)


def one_round(args, tables: int, rows: int, object_store: bool = False,
              prepare: Callable[[SparkSession, config.Local, list[TableName]], None] | None = None
              ) -> Round:
    """``lakeslot run`` in this thread (its signal handling needs the main thread); the writer,
    the observer and the measures in another, which stops the run with SIGTERM as a user would.
    With ``object_store``: S3 staging and a REST catalog behind :mod:`bench.latency_proxy`.
    With ``prepare``: first ``lakeslot run --once`` (the snapshot, caught up), then ``prepare``
    with its Spark session (the mirrors are the run's to change: nothing else commits), then the
    measured run in the same session (``snapshot_s`` is then the time from its start until the
    observer sees every mirror)."""
    work = Path(tempfile.mkdtemp(prefix="many-tables-"))
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(common.cluster(args.pg))
        net = stack.enter_context(common.network(work / "object-store", args.latency_ms / 1000)) \
            if object_store else None
        create_source(cluster, tables, rows)
        staging, warehouse = (work / "staging").as_uri(), (work / "warehouse").as_uri()
        spec: dict = {"source": {"host": "127.0.0.1", "port": cluster.port, "database": "bench",
                                 "user": cluster.superuser, "schemas": [SCHEMA]},
                      "sink": {"catalog": {"type": "hadoop", "warehouse": warehouse},
                               "namespace": "bench"},
                      "staging": {"uri": staging},
                      "apply": {"triggerIntervalSeconds": 1,
                                **({"tableParallelism": args.table_parallelism}
                                   if args.table_parallelism else {})}}
        environ = {workloads.PASSWORD_ENV: cluster.password}
        if net is not None:
            staging = spec["staging"]["uri"] = net.staging
            spec["sink"]["catalog"] = net.catalog_document()
            spec["secretEnv"] = net.secret_env()
            environ.update(net.environment())
        document = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PostgresIngestion",
                    "metadata": {"name": "bench", "namespace": "default"}, "spec": spec}
        path = work / "ingestion.yaml"
        path.write_text(yaml.safe_dump(document))
        local = config.load(str(path), state_dir=str(work / "state"), environ=environ)
        names = [TableName(SCHEMA, n) for n in table_names(tables)]
        local_run.configure_logging(local, interactive=True)  # into run.log of the state directory
        print(f"  (lakeslot run's log: {local.path('run.log')})")
        session = None
        if prepare is not None:
            session = processes.spark_session(local, names, master="local[2]")
            stack.callback(session.stop)
            first = local_run.run(local, local_run.Options(once=True, out=io.StringIO(),
                                                           interactive=False, spark=session))
            if not first.caught_up:
                raise SystemExit(f"lakeslot run --once did not catch up: {first.message}")
            prepare(session, local, names)
        measured: list[Round] = []
        failure: list[BaseException] = []
        started = time.time()

        def measure() -> None:
            try:
                measured.append(_measure(args, cluster, staging, warehouse, names, rows, started,
                                         net, IngestionNames.of(local.ingestion).cuts_table))
            except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
                failure.append(e)
            finally:
                os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=measure, daemon=True).start()
        result = local_run.run(local, local_run.Options(once=False, out=io.StringIO(),
                                                        interactive=False, master="local[2]",
                                                        spark=session))
        if failure:
            raise failure[0]
        if not measured:
            raise SystemExit(f"lakeslot run ended first: {result.message}")
        return measured[0]


def _measure(args, cluster, staging: str, warehouse: str, names: list[TableName], rows: int,
             started: float, net: common.Network | None, record: str) -> Round:
    # (spawned: this process runs a JVM and threads, which a fork would copy mid-flight)
    mine, theirs = multiprocessing.Pipe()
    watcher: threading.Thread | multiprocessing.process.BaseProcess = \
        multiprocessing.get_context("spawn").Process(
            target=observe, args=(warehouse, names, theirs, None, record), daemon=True) \
        if net is None else threading.Thread(
            target=observe, args=(warehouse, names, theirs, net.rest.follow(), record),
            daemon=True)
    watcher.start()
    snapshot_s = _expect(mine, "snapshotted") - started  # every mirror has its snapshot
    receive, send = multiprocessing.Pipe(duplex=False)
    process = multiprocessing.Process(target=writer, args=(
        cluster.dsn("bench"), len(names), rows, args.skew, args.rate, args.seconds, send))
    begun = _totals(staging)
    if net is not None:
        net.s3.recording.set()
        net.rest.recording.set()
    process.start()
    marks: list[dict] = []  # the apply job's totals when the last third of the writes begins
    mark = threading.Timer(args.seconds * 2 / 3, lambda: marks.append(_totals(staging)))
    mark.start()
    proxies = frozenset() if net is None else frozenset({net.s3.pid, net.rest.pid})
    with cpu_use.CpuUse(_CpuGroups(os.getpid(), process.pid, proxies)) as sampler:
        records = receive.recv()
        process.join()
        writer_done = time.time()
    mark.join()
    marks.append(_totals(staging))  # ... and when they end
    wanted = [0] * len(names)
    for t, lsn, _ in records:
        wanted[t] = max(wanted[t], lsn)
    mine.send([*wanted, max(wanted)])  # (last: the cuts record, a cut holding every change)
    drained = _expect(mine, "current") - writer_done
    if net is not None:  # the requests of the passes that made the writes visible
        net.s3.recording.clear()
        net.rest.recording.clear()
    seen = _expect(mine, "seen")
    watcher.join()
    time.sleep(3)  # the pass that made the last change visible writes its status after its commits
    totals = _totals(staging)
    passes = max(1, int(totals.get("passes", 1)))
    steps = {k: v / passes for k, v in totals.get("seconds", {}).items()}
    wall = totals.get("wallSeconds", 0.0) / passes
    before, after = marks if len(marks) == 2 else ({}, totals)
    ended = int(after.get("passes", 0)) - int(before.get("passes", 0))
    last = ((after.get("wallSeconds", 0.0) - before.get("wallSeconds", 0.0)) / ended if ended
            else math.nan)  # (no pass ended in the last third: long passes)
    touched = sum(len(ops) > 0 for ops in totals.get("changes", {}).values())
    reader = None if net is None else net.pyiceberg_catalog()
    equal = all(_equal(cluster, warehouse, t, reader) for t in names)
    latencies, early, in_cut = [], [], []
    for t, lsn, committed in records:
        visible = next(at for at, reached in seen[t] if reached >= lsn)
        latencies.append(visible - committed)
        in_cut.append(next(at for at, reached in seen[-1] if reached >= lsn) - committed)
        if committed - records[0][2] <= EARLY_S:
            early.append(visible - committed)
    duration = records[-1][2] - records[0][2]
    trips, committing = None, None
    if net is not None:
        committing = sampler.summary((r.start, r.end) for r in net.rest.requests if r.commit)
        _save_requests(net, Path(staging_dir := tempfile.mkdtemp(prefix="many-tables-requests-")))
        print(f"  (the proxies' requests: {staging_dir}/{{s3,rest}}.jsonl)")
        trips = Trips(net.s3.delay_s, slots.threads(args.table_parallelism
                                                    or ApplySpec().table_parallelism, network=True),
                      int(totals.get("passes", 0)) - int(begun.get("passes", 0)),
                      len(net.s3.requests), len(net.rest.requests),
                      latency_proxy.commit_trips(net.s3.requests, net.rest.requests,
                                                 _warehouse_table, _mirror_table),
                      latency_proxy.reads(net.s3.requests, f"/{objectstore.STAGING_BUCKET}/"),
                      dict(collections.Counter(f"{r.method} {r.client}"
                                               for r in net.rest.requests).most_common()))
    return Round(len(names), rows, snapshot_s, latencies, early, in_cut, len(records) / duration,
                 drained,
                 wall, last, steps, touched, passes, equal, sampler.summary(), trips, committing)


@dataclass(frozen=True)
class _CpuGroups:
    """The process groups of :class:`bench.cpu_use.CpuUse`: what a production deployment runs
    elsewhere (the catalog and S3, the proxies standing for the network, PostgreSQL, the
    application writing) apart from lakeslot — ``root``, this process, which runs ``lakeslot
    run`` (the apply driver's Python, the status), and its children: the Spark driver's JVM, and
    the reader with Spark's Python workers."""

    root: int
    writer: int | None
    proxies: frozenset[int | None] = frozenset()

    def __call__(self, pid: int, comm: str, ancestors: list[int]) -> str | None:
        if pid in self.proxies:
            return "the proxies"
        if comm == "weed":
            return "the catalog and S3 (weed)"
        if comm.startswith("postgres"):
            return "PostgreSQL"
        if pid == self.writer:
            return "the writer"
        if pid == self.root:
            return "lakeslot run's Python"
        if self.root in ancestors:
            return "its Spark JVM" if comm == "java" else "its reader (and Spark's workers)"
        return None


def _save_requests(net: common.Network, directory: Path) -> None:
    """Every recorded request of both proxies, one JSON object a line, for a closer look."""
    for name, proxy in (("s3", net.s3), ("rest", net.rest)):
        with open(directory / f"{name}.jsonl", "w") as out:
            for r in proxy.requests:
                out.write(json.dumps(dataclasses.asdict(r)) + "\n")


MIRROR = re.compile(r"app__(t\d+)\b")


def _mirror_table(path: str) -> str | None:
    """The mirror a catalog request is about (its path names it)."""
    found = MIRROR.search(path)
    return found[1] if found else None


def _warehouse_table(path: str) -> str | None:
    """The mirror an S3 request is about: its files are under the warehouse bucket, in a
    directory named for it."""
    return _mirror_table(path) if path.startswith(f"/{objectstore.WAREHOUSE}/") else None


def _totals(staging: str) -> dict:
    """The apply job's totals (passes, their wall time and steps) from its status document."""
    return (Staging(staging).read_apply_status() or {}).get("totals", {})


def _expect(conn, what: str):
    """The observer's next message, which must be ``what``."""
    kind, value = conn.recv()
    if kind != what:
        raise RuntimeError(f"the observer sent {kind}, not {what}")
    return value


def _equal(cluster, warehouse: str, table: TableName, catalog=None) -> bool:
    """The mirror (from ``catalog``, pyiceberg's, else the hadoop ``warehouse``) equals the source."""
    columns = ["id", "v", "note", "at"]
    identifier = ("bench", f"app__{table.name}")
    mirror = catalog.load_table(identifier) if catalog is not None else \
        load_hadoop_table(warehouse, identifier)
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
    c = statistics.quantiles(r.in_cut, n=100)
    print(f"  commit→in a cut (the cuts record's latest cut holds it: the age of the latest cut "
          f"under load) p50 {c[49]:.2f} s  p90 {c[89]:.2f} s  p99 {c[98]:.2f} s  "
          f"max {max(r.in_cut):.2f} s")
    if len(r.early) > 1:
        print(f"  first {EARLY_S:.0f} s after the snapshot: p99 "
              f"{statistics.quantiles(r.early, n=100)[98]:.2f} s (steady state p99 {q[98]:.2f} s)")
    per_pass = len(r.latencies) / r.passes  # changes a pass carried, on average
    print(f"  a pass: {r.pass_s:.3f} s on average over {r.passes} passes, ≈{per_pass:.0f} changes "
          f"each into ≤ {min(r.touched, per_pass):.0f} tables ({r.pass_s / max(per_pass, 1):.4f} s "
          f"per change); its steps (the threads' times added up): "
          + ", ".join(f"{k} {v:.3f}" for k, v in r.pass_steps.items()))
    print("  a pass of the last third of the writes: " + (
        "none ended in it" if math.isnan(r.pass_last_s) else f"{r.pass_last_s:.3f} s on average"))
    print(f"  drained {r.drained_s:.1f} s after the writer stopped; every mirror equal to its "
          f"source (pyiceberg, every column of every row): {r.equal}")
    if r.cpu is not None:
        print(f"  the machine during the writes: {r.cpu.text()}")
    if r.cpu_committing is not None:
        print(f"  ... while table commits were in flight: {r.cpu_committing.text()}")
    if r.network is not None:
        report_network(r, r.network)


def report_network(r: Round, n: Trips) -> None:
    """Where a pass's time goes on the network: requests per pass and per table commit, and the
    floor of a pass for the proxies' delay."""
    c, passes, parallelism = n.commits, max(n.passes, 1), n.parallelism
    print(f"  on the network ({n.delay_s * 1000:.0f} ms added to each request): {n.passes} passes "
          f"during the writes made {n.s3} S3 requests ({n.s3 / passes:.0f} a pass) and {n.rest} "
          f"catalog requests ({n.rest / passes:.0f} a pass)")
    print("  the catalog's requests by method and client: "
          + ", ".join(f"{k} {v}" for k, v in n.callers.items()))
    print(f"  staging: {n.staging.line(n.delay_s)}")
    if c.commits:
        per_pass = c.commits / passes
        floor = math.ceil(per_pass / parallelism) * latency_proxy.MIN_COMMIT_TRIPS * n.delay_s
        print(f"  a table's commit ({c.commits} commits, medians): {c.s3:.0f} S3 requests to its "
              f"files and {c.rest:.0f} to the catalog up to the commit's answer, of which "
              f"{c.sequential:.0f} one after the other ({c.sequential * n.delay_s:.2f} s of added "
              f"latency; {c.seconds:.2f} s from its first request to the commit's answer); then "
              f"{c.s3_after:.0f} S3 and {c.rest_after:.0f} catalog requests after it; besides the "
              f"tables: {c.other_s3} S3 and {c.other_rest} catalog requests in all")
        print("  one table's requests around its commit (offset from the first):")
        for line in c.example:
            print(f"    {line}")
        print(f"  the floor for this latency: {per_pass:.1f} table commits a pass, {parallelism} at "
              f"a time, × {latency_proxy.MIN_COMMIT_TRIPS} round trips a commit cannot avoid × "
              f"{n.delay_s * 1000:.0f} ms = {floor:.2f} s a pass (the passes measured: "
              f"{r.pass_s:.2f} s, {r.pass_s / floor:.1f}× the floor; at today's "
              f"{c.sequential:.0f} sequential round trips a commit: "
              f"{math.ceil(per_pass / parallelism) * c.sequential * n.delay_s:.2f} s)"
              if floor else "  no floor: no delay added")


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
    parser.add_argument("--object-store", action="store_true",
                        help="the production configuration: S3 staging and an Iceberg REST "
                        "catalog (weed mini), each behind a proxy adding --latency-ms to every "
                        "request; the local-disk round runs first (unless --no-local)")
    parser.add_argument("--latency-ms", type=float, default=30.0,
                        help="with --object-store: milliseconds added to each request to S3 "
                        "and to the catalog (default 30; 0: none)")
    parser.add_argument("--no-local", action="store_true",
                        help="with --object-store: skip the local-disk round")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the one-table round (never run with --object-store)")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip the commit floor (bench.commit_floor) at the end")
    args = parser.parse_args()
    print(f"PostgreSQL {args.pg}, {args.skew} over the tables, {args.seconds:.0f} s of writes")
    if args.object_store:
        local = None if args.no_local else one_round(args, args.tables, args.rows)
        remote = one_round(args, args.tables, args.rows, object_store=True)
        if local is not None:
            report("local disk (hadoop catalog)", local)
        report(f"S3 + REST catalog, {args.latency_ms:.0f} ms a request", remote)
        if local is not None:
            p50, p99 = (lambda r: statistics.median(r.latencies),
                        lambda r: statistics.quantiles(r.latencies, n=100)[98])
            print(f"object storage ÷ local disk: snapshot {remote.snapshot_s / local.snapshot_s:.2f}"
                  f" (target ≤ 1.5), p50 {p50(remote) / p50(local):.2f}, p99 "
                  f"{p99(remote) / p99(local):.2f}, pass {remote.pass_s / max(local.pass_s, 1e-9):.2f}")
        return
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
