"""The snapshot job: decide which tables to copy, hold one exported snapshot, copy every range as
a Spark task, commit each table as soon as its ranges are done, release the snapshot last.

:func:`run` is the whole job, taking a :class:`lakeslot.workloads.JobInput` like
:func:`lakeslot.apply.job.run`: ``spark_jobs/snapshot.py`` calls it, and local mode calls it
in-process with its own SparkSession::

    result = run(spark, job_input, progress=path, min_snapshot_lsn=below)

It derives a :class:`SnapshotJob` from the ingestion (:meth:`SnapshotJob.of`: target names from
``job.names``, settings from ``spec.snapshot``, the password and CA from the environment) and
hands it to :func:`copy`, which tests and benchmarks also call with a SnapshotJob of their own.
Steps:

1. For every requested table, the mirror's state (:meth:`lakeslot.spark.tables.Catalog.state`):
   snapshotted at a generation ≥ ``resnapshot_generation`` and an LSN ≥ ``min_snapshot_lsn`` →
   ``skipped``; an existing table with data that lakeslot did not write, or that another
   ingestion or source table owns (:func:`lakeslot.mirror.contract.ownership_problem`) →
   ``failed``; otherwise it
   is copied (created, or replaced in one commit). When nothing is left, no slot is created at all.
2. The leader exports a snapshot (:mod:`lakeslot.source.exported_snapshot`); the tables are
   planned in a session importing it (:mod:`.plan`); each table opens its Iceberg create/replace
   transaction (:mod:`lakeslot.spark.tables`). The looks of step 1 and these openings are a
   catalog request per table: :data:`CATALOG_THREADS` at once where the catalog is reached over
   a network (:func:`lakeslot.mirror.catalogs.on_network`), in the tables' order on local disk.
3. Ranges run as Spark jobs of exactly one task each (``sc.parallelize([range], 1)``), at most
   ``parallelism`` at a time, from a pool of driver threads. A range that fails transiently is
   retried (after Spark's own task retries) up to ``max_attempts`` times, with backoff, inside the
   same snapshot; a definite error fails its table only. The thread that finishes a table's last
   range commits it with ``lakeslot.lsn = s``.
4. When every table has committed or failed, the leader's transaction ends and its temporary slot
   is dropped (leader commits last).
5. A table with ``partitionBy`` was committed with that spec but unpartitioned files (followers
   do not split by partition): its files are rewritten into the spec on Spark's executors
   (:func:`lakeslot.spark.partitions.lay_out`, a ``replace`` commit keeping ``lakeslot.lsn``).

The exported snapshot lost while copying (the leader's session terminated or its connection
broken): ranges that had imported it finish, the others fail with
:class:`lakeslot.snapshot.follower.SnapshotLost`, and the tables they belong to are copied again,
whole, under a new exported snapshot (up to ``max_attempts`` snapshots; then they fail
``transient``). Their Iceberg transactions never committed, so nothing of the lost attempt is
visible; each table records the snapshot it was committed under.

Resuming: a job that dies after some tables committed is simply run again. Committed tables carry
``lakeslot.snapshot-generation`` and are skipped; the others are copied under a new snapshot (each
table records its own ``s``). Data files of attempts that never committed are unreferenced
(deleted when the failure is seen; a killed process leaves orphans for Iceberg's orphan cleanup).

Password: the driver uses ``job.source.password``; tasks read it from their environment. In local
mode the Python workers do not see variables set after the JVM started, so the driver hands it to
them through ``SparkContext.environment`` (the environment PySpark gives its workers; it is not
part of the Spark conf, argv or logs).

Failure modes: a table's error is in its outcome and the progress document (``transient`` when
only its retries of transient errors ran out, so a rerun may succeed), and the other tables go on;
a failure of the job as a whole (source unreachable, slot cannot be created, catalog unreachable)
raises after recording it in the progress document. Either way the slot is gone.
Nothing to do (no table) or ``max_attempts`` < 1 raises ValueError before anything starts.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from py4j.protocol import Py4JJavaError

from lakeslot.api.models import MiB
from lakeslot.api.naming import TableName
from lakeslot.mirror import catalogs, typemap
from lakeslot.mirror.contract import (
    GENERATION_PROPERTY,
    OWNER_PROPERTY,
    SNAPSHOT_LSN_PROPERTY,
    SOURCE_FACTS_PROPERTY,
    SOURCE_TABLE_PROPERTY,
    ownership,
    ownership_problem,
    table_properties,
)
from lakeslot.snapshot import follower, plan
from lakeslot.snapshot.progress import Progress
from lakeslot.source import exported_snapshot, facts
from lakeslot.source.columns import ColumnOptions
from lakeslot.source.connection import PASSWORD_ENV, ConnectionSettings, application_name, connect
from lakeslot.spark import partitions
from lakeslot.spark.session import on_threads
from lakeslot.spark.tables import Catalog, MirrorState, MirrorWrite
from lakeslot.workloads import JobInput

log = logging.getLogger(__name__)
BACKOFF_CAP_S = 30.0
# Where the catalog is reached over a network, each table's look (does its mirror exist, whose is
# it) and the opening of its create transaction are a request each, tens of milliseconds: at
# 1,000 tables one after the other, minutes before the first range is copied.
CATALOG_THREADS = 16


@dataclass(frozen=True)
class SnapshotJob:
    """Everything :func:`copy` needs, resolved (names, settings, the password)."""

    source: ConnectionSettings
    tables: tuple[plan.TableRequest, ...]
    namespace: str
    catalog: str = "lakeslot"
    ingestion: str = "local"
    table_properties: Mapping[str, str] = field(default_factory=dict)
    parallelism: int = 4
    target_range_bytes: int = 256 * MiB
    statement_timeout_seconds: int = 0
    resnapshot_generation: int = 0
    min_snapshot_lsn: int = 0
    progress: str | None = None
    max_attempts: int = 3
    catalog_threads: int = 1  # the tables' catalog requests in flight at once (CATALOG_THREADS)

    @classmethod
    def of(cls, job: JobInput, *, progress: str | None = None, max_attempts: int = 3,
           min_snapshot_lsn: int = 0, environ: Mapping[str, str] | None = None) -> SnapshotJob:
        """The snapshot of ``job.tables`` that the ingestion asks for: targets and owner from
        ``job.names``, settings from ``spec.snapshot`` and ``spec.sink``, per-table key, excluded
        and text columns from ``spec.source.tables``, the password and CA file from ``environ``
        (default ``os.environ``). ValueError when there is nothing to do or ``max_attempts`` < 1."""
        if not job.tables:
            raise ValueError("no table given: nothing to snapshot")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        spec = job.ingestion.spec

        def request(table: TableName) -> plan.TableRequest:
            options = job.table_spec(table)
            return plan.TableRequest(table, job.names.mirror_table(table), ColumnOptions.of(options),
                                     options.partition_fields() if options else (),
                                     job.names.earlier_mirror_table(table))

        return cls(
            source=job.source(environ), tables=tuple(request(t) for t in job.tables),
            namespace=spec.sink.namespace, catalog=spec.sink.catalog.name,
            ingestion=job.names.owner, table_properties=dict(spec.sink.table_properties),
            parallelism=spec.snapshot.parallelism,
            target_range_bytes=spec.snapshot.target_range_bytes,
            statement_timeout_seconds=spec.snapshot.statement_timeout_seconds,
            resnapshot_generation=spec.snapshot.resnapshot_generation,
            min_snapshot_lsn=min_snapshot_lsn, progress=progress, max_attempts=max_attempts,
            catalog_threads=CATALOG_THREADS if catalogs.on_network(spec.sink.catalog) else 1)


@dataclass(frozen=True)
class Hooks:
    """Observation points for callers (tests use them to act while the snapshot is held)."""

    on_exported: Callable[[exported_snapshot.Snapshot], None] | None = None  # before planning
    before_release: Callable[[exported_snapshot.Snapshot], None] | None = None  # all tables done


@dataclass(frozen=True)
class TableOutcome:
    source: TableName
    target: str
    state: str  # committed | skipped | failed
    rows: int
    lsn: int | None
    error: str | None
    transient: bool = False  # failed: only transient errors, retries exhausted (a rerun may help)


@dataclass(frozen=True)
class JobResult:
    tables: tuple[TableOutcome, ...]
    snapshot_lsn: int | None
    cpu: dict[str, float]  # CPU seconds of the follower processes, by phase

    @property
    def ok(self) -> bool:
        return all(t.state in ("committed", "skipped") for t in self.tables)


def run(spark, job: JobInput, *, progress: str | None = None, max_attempts: int = 3,
        min_snapshot_lsn: int = 0, environ: Mapping[str, str] | None = None,
        hooks: Hooks | None = None) -> JobResult:
    """Snapshot ``job.tables`` as the ingestion asks (see the module docstring). ``progress``:
    where the progress document goes (None: nowhere); ``max_attempts``: attempts per range for
    transient failures; ``min_snapshot_lsn``: tables snapshotted below it are copied again;
    ``environ``: where the password and CA file come from (default ``os.environ``). ValueError
    before anything starts when ``job.tables`` is empty or ``max_attempts`` < 1."""
    return copy(spark, SnapshotJob.of(job, progress=progress, max_attempts=max_attempts,
                                      min_snapshot_lsn=min_snapshot_lsn, environ=environ), hooks)


def copy(spark, job: SnapshotJob, hooks: Hooks | None = None) -> JobResult:
    """Snapshot as ``job`` says, everything already resolved (what :func:`run` does after
    :meth:`SnapshotJob.of`; tests and benchmarks build a SnapshotJob directly)."""
    progress = Progress(job.progress, [(r.source, f"{job.namespace}.{r.target}") for r in job.tables])
    cpu = {"read": 0.0, "convert": 0.0, "write": 0.0}
    try:
        catalog = Catalog(spark, job.catalog)
        catalog.ensure_namespace(job.namespace)
        todo = _to_copy(spark, catalog, job, progress)
        if todo:
            _snapshot(spark, job, catalog, todo, progress, hooks or Hooks(), cpu)
            _lay_out(spark, job, catalog, [request for request, _ in todo], progress)
    except Exception as e:
        progress.finish(error=f"{type(e).__name__}: {e}")
        raise
    progress.finish()
    return JobResult(tuple(TableOutcome(t.source, t.target, t.state, t.rows_staged, t.lsn, t.error,
                                        t.transient)
                           for t in progress.tables.values()), progress.snapshot_lsn, cpu)


def _to_copy(spark, catalog: Catalog, job: SnapshotJob,
             progress: Progress) -> list[tuple[plan.TableRequest, MirrorState]]:
    states = on_threads(spark, job.catalog_threads, job.tables,
                        lambda request: catalog.state(job.namespace, request.target),
                        "snapshot-catalog")
    todo = []
    for request, state in states.items():
        owned = ownership_problem(state.properties, f"{job.namespace}.{request.target}",
                                  job.ingestion, str(request.source))
        earlier = _earlier_mirror(catalog, job, request) if not state.exists else None
        if owned is not None or earlier is not None:
            progress.table(request.source, state="failed", error=owned or earlier)
        elif (state.generation is not None and state.generation >= job.resnapshot_generation
                and (state.snapshot_lsn or 0) >= job.min_snapshot_lsn):
            progress.table(request.source, state="skipped")
        elif state.exists and state.generation is None and state.has_data:
            progress.table(request.source, state="failed", error=(
                f"Iceberg table {job.namespace}.{request.target} exists with data that lakeslot "
                "did not write; drop it or choose another table name"))
        else:
            todo.append((request, state))
    return todo


def _earlier_mirror(catalog: Catalog, job: SnapshotJob, request: plan.TableRequest) -> str | None:
    """Why the table is not copied to its new name: its mirror exists under the name an earlier
    lakeslot gave it (a schema ambiguous at the template's separator), and mirrors are never
    renamed nor duplicated; or None."""
    if request.earlier_target is None:
        return None
    earlier = catalog.state(job.namespace, request.earlier_target)
    recorded = (earlier.properties.get(OWNER_PROPERTY), earlier.properties.get(SOURCE_TABLE_PROPERTY))
    if not earlier.exists or recorded != (job.ingestion, str(request.source)):
        return None
    return (f"its mirror is {job.namespace}.{request.earlier_target}, named before lakeslot gave "
            f"names ambiguous at the template's separator a hash ({job.namespace}.{request.target} "
            f"now): to keep that mirror, set mirrorName: {request.earlier_target} for "
            f"{request.source} in spec.source.tables; or drop it to copy the table again under "
            "the new name")


def _lay_out(spark, job: SnapshotJob, catalog: Catalog, copied: list[plan.TableRequest],
             progress: Progress) -> None:
    """Rewrite the files of each table just committed with a partition spec into that spec (the
    followers wrote them unpartitioned: :mod:`lakeslot.spark.partitions`), after the exported
    snapshot is released. A failure only delays the layout: the data is complete and correct."""
    for request in copied:
        entry = progress.tables[request.source]
        if entry.state != "committed" or not request.partition_by:
            continue
        try:
            table = catalog.java_table(job.namespace, request.target)
            rewritten = partitions.lay_out(spark, table, entry.lsn)
        except Py4JJavaError as e:
            log.warning("%s: the snapshot is committed, but laying its files out by the partition "
                        "spec failed (reads are correct; run Iceberg's rewrite_data_files with "
                        "options map('rewrite-all','true') or re-snapshot to lay them out): %s",
                        request.source, _failure_summary(e))
            continue
        log.info("%s: %d data files laid out by partition spec %s", request.source, rewritten,
                 partitions.spec_text(request.partition_by))


def _snapshot(spark, job: SnapshotJob, catalog: Catalog,
              todo: list[tuple[plan.TableRequest, MirrorState]], progress: Progress, hooks: Hooks,
              cpu: dict[str, float]) -> None:
    """Copy ``todo`` under one exported snapshot; the tables whose snapshot was lost meanwhile
    (the leader's session ended) again under a new one, up to ``max_attempts`` snapshots."""
    sc = spark.sparkContext
    if sc.master.startswith("local") and job.source.password:
        sc.environment[PASSWORD_ENV] = job.source.password
    for attempt in range(1, job.max_attempts + 1):
        lost = _under_one_snapshot(spark, job, catalog, todo, progress, hooks, cpu)
        if not lost:
            return
        todo = [(request, state) for request, state in todo if request.source in lost]
        log.warning("the exported snapshot was lost while copying %s (snapshot %d of %d)%s",
                    ", ".join(map(str, lost)), attempt, job.max_attempts,
                    ": copying again under a new one" if attempt < job.max_attempts else "")


def _under_one_snapshot(spark, job: SnapshotJob, catalog: Catalog,
                        todo: list[tuple[plan.TableRequest, MirrorState]], progress: Progress,
                        hooks: Hooks, cpu: dict[str, float]) -> set[TableName]:
    """Copy ``todo`` under a new exported snapshot; the tables that failed only because that
    snapshot was lost (their entries say so, ``transient``)."""
    app = application_name("snapshot-leader", job.ingestion)
    with exported_snapshot.exported_snapshot(job.source, app) as snapshot:
        progress.snapshot_lsn = snapshot.lsn
        progress.write()
        if hooks.on_exported:
            hooks.on_exported(snapshot)
        plans, table_facts = _plan(job, snapshot, [request for request, _ in todo])
        begun = []
        for number, ((request, state), table_plan) in enumerate(zip(todo, plans, strict=True)):
            recorded = table_facts.get(request.source)
            if isinstance(table_plan, plan.TableFailure) or recorded is None:
                error = (table_plan.message if isinstance(table_plan, plan.TableFailure)
                         else f"table {request.source} does not exist as of the snapshot")
                progress.table(request.source, state="failed", error=error)
                continue
            begun.append(functools.partial(_TableRun.begin, job, catalog, snapshot, table_plan,
                                           state, recorded, number, progress, cpu))
        runs = list(on_threads(spark, job.catalog_threads, begun, lambda begin: begin(),
                               "snapshot-catalog").values())
        _copy(spark, job, runs, progress.job)
        if hooks.before_release:
            hooks.before_release(snapshot)
    return {run.plan.request.source for run in runs if run.snapshot_lost}


def _plan(job: SnapshotJob, snapshot: exported_snapshot.Snapshot, requests: list[plan.TableRequest]
          ) -> tuple[list[plan.TablePlan | plan.TableFailure], dict[TableName, facts.TableFacts | None]]:
    """The plans, and the source facts each mirror records, both as of the snapshot."""
    app = application_name("snapshot-plan", job.ingestion)
    with connect(job.source, app, long_running=True) as conn:
        for statement in exported_snapshot.import_statements(snapshot.name):
            conn.execute(statement)
        plans = plan.inspect(conn, requests, target_range_bytes=job.target_range_bytes)
        table_facts = facts.read(conn, [r.source for r in requests])
        conn.execute("COMMIT")
    return plans, table_facts


class _TableRun:
    """One table being copied: its open Iceberg transaction and the results of its ranges."""

    def __init__(self, table_plan: plan.TablePlan, write: MirrorWrite,
                 tasks: list[follower.RangeTask], lsn: int, progress: Progress,
                 cpu: dict[str, float], *, resnapshot: bool) -> None:
        self.plan, self.write, self.tasks, self.lsn = table_plan, write, tasks, lsn
        self.resnapshot = resnapshot  # it replaces a snapshotted table
        self.progress, self.cpu = progress, cpu
        self.files: list[str] = []
        self.rows = self.done = 0
        self.failed = self.snapshot_lost = False
        self._lock = threading.Lock()

    @classmethod
    def begin(cls, job: SnapshotJob, catalog: Catalog, snapshot: exported_snapshot.Snapshot,
              table_plan: plan.TablePlan, state: MirrorState, recorded: facts.TableFacts,
              number: int, progress: Progress, cpu: dict[str, float]) -> _TableRun:
        request = table_plan.request
        properties = {**table_properties(job.table_properties),
                      GENERATION_PROPERTY: str(job.resnapshot_generation),
                      SNAPSHOT_LSN_PROPERTY: str(snapshot.lsn),
                      SOURCE_FACTS_PROPERTY: recorded.to_json(),
                      **ownership(job.ingestion, str(request.source), recorded.oid)}
        write = catalog.begin(job.namespace, request.target,
                              typemap.mirror_schema(table_plan.columns), properties, state.exists,
                              request.partition_by)
        schema = typemap.arrow_schema(write.schema(), table_plan.columns)
        options = write.write_options()
        settings = follower.without_password(job.source)
        tasks = [follower.RangeTask(
            settings=settings, ingestion=job.ingestion, label=f"t{number}r{i}",
            snapshot=snapshot.name, lsn=snapshot.lsn, table=request.source, heap=heap, range=r,
            columns=table_plan.columns, schema=schema,
            location=write.data_location(f"lakeslot-{progress.job}-t{number}-r{i:05d}"),
            write=options, statement_timeout_ms=job.statement_timeout_seconds * 1000)
            for i, (heap, r) in enumerate(table_plan.ranges)]
        run = cls(table_plan, write, tasks, snapshot.lsn, progress, cpu,
                  resnapshot=state.generation is not None)
        progress.table(request.source, state="copying", rows_estimated=table_plan.rows_estimate,
                       ranges_total=len(tasks), rows_staged=0, ranges_done=0, error=None,
                       transient=False)
        if not tasks:  # a partitioned table without partitions
            run._commit()
        return run

    def add(self, result: follower.RangeResult) -> None:
        with self._lock:
            if self.failed:
                follower.delete_files(result.files)
                return
            self.files += result.files
            self.rows += result.rows
            self.done += 1
            for phase, seconds in result.cpu.items():
                self.cpu[phase] = self.cpu.get(phase, 0.0) + seconds
            self.progress.table(self.plan.request.source, rows_staged=self.rows,
                                ranges_done=self.done)
            if self.done == len(self.tasks):
                self._commit()

    def _commit(self) -> None:
        try:
            self.write.commit(self.files, self.lsn, resnapshot=self.resnapshot)
        except Py4JJavaError as e:
            self._fail_locked(f"committing to Iceberg failed: {_failure_summary(e)}", transient=True)
            return
        self.progress.table(self.plan.request.source, state="committed", lsn=self.lsn)

    def fail(self, error: str, *, transient: bool = False, snapshot_lost: bool = False) -> None:
        """Fail the table (once); ``snapshot_lost``: only because the exported snapshot is gone
        (transient: a new snapshot would do)."""
        with self._lock:
            if not self.failed:
                self.snapshot_lost = snapshot_lost
                self._fail_locked(error, transient=transient or snapshot_lost)

    def _fail_locked(self, error: str, *, transient: bool = False) -> None:
        self.failed = True
        follower.delete_files(self.files)
        self.files = []
        self.progress.table(self.plan.request.source, state="failed", error=error,
                            transient=transient)


def _copy(spark, job: SnapshotJob, runs: list[_TableRun], group: str) -> None:
    with ThreadPoolExecutor(max_workers=job.parallelism, thread_name_prefix="snapshot") as pool:
        futures = [pool.submit(_copy_range, spark, job, run, task, group)
                   for run in runs for task in run.tasks]
        for future in futures:
            future.result()


def _copy_range(spark, job: SnapshotJob, run: _TableRun, task: follower.RangeTask,
                group: str) -> None:
    last_error = ""
    for attempt in range(job.max_attempts):
        if run.failed:
            return
        if attempt:
            time.sleep(min(BACKOFF_CAP_S, 2.0 ** (attempt - 1)))
        try:
            result = _run_task(spark, task, group)
        except Py4JJavaError as e:
            last_error = _failure_summary(e)
            log.warning("range %s of %s failed (attempt %d of %d), retrying: %s", task.label,
                        task.table, attempt + 1, job.max_attempts, last_error)
            continue
        if result.error:
            run.fail(result.error, snapshot_lost=result.snapshot_lost)
        else:
            run.add(result)
        return
    run.fail(f"a range of {task.table} failed {job.max_attempts} times; last error: {last_error}",
             transient=True)


def _run_task(spark, task: follower.RangeTask, group: str) -> follower.RangeResult:
    sc = spark.sparkContext
    sc.setJobGroup(group, f"lakeslot snapshot of {task.table}, range {task.label}",
                   interruptOnCancel=True)
    return sc.parallelize([task], 1).map(follower.run_task).collect()[0]


def _failure_summary(e: Py4JJavaError) -> str:
    """The last meaningful line of a failed Spark job (the Python exception, or Spark's reason)."""
    message = str(e.java_exception.getMessage() or e.java_exception.toString())
    lines = [line.strip() for line in message.splitlines()
             if line.strip() and not line.startswith("\tat ") and line.strip() != "Driver stacktrace:"]
    return lines[-1][:1000] if lines else message[:1000]
