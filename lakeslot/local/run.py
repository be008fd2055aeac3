"""``lakeslot run``: one ingestion on this machine, without Kubernetes.

The same steps as the operator's reconcile, in order, with the same conditions and messages
(:mod:`lakeslot.observability.status`): preflight and publication sync, the permanent slot (created before any
snapshot, DESIGN.md rule 2; a holder other than this run's reader is evicted), then

1. the reader, a child process (:mod:`.reader_process`), streaming the slot into staging from the
   start, so WAL is released while the snapshot runs;
2. the snapshot (:mod:`lakeslot.snapshot.job`) in a Spark ``local[*]`` session of this process,
   for every table whose mirror lacks a snapshot of the current ``resnapshotGeneration`` (a run
   killed mid-snapshot resumes with the tables not yet committed);
3. the apply job (:mod:`lakeslot.apply.job`) in the same session, MERGEing sealed segments into the
   mirror tables, until stopped.

While it streams, the selection is watched: every ``Options.selection_interval`` seconds (10)
one catalog query (:func:`lakeslot.control.steps.selection_fingerprint`) on a connection of its own
tells whether the tables of ``spec.source.schemas`` (or the listed ones), or their replica
identities, changed; only then are the source steps (preflight, publication sync) taken again.

- A table that joins (created in a selected schema, or now usable) is added to the publication,
  the apply job is restarted with it (it waits for its snapshot, which holds staging's retention),
  and then it is copied alone, online, with the re-snapshot machinery (:mod:`lakeslot.control.resnapshot`,
  the snapshot job for that subset) from a snapshot taken after it joined: the rows written
  before it joined are in no stream. The other tables keep streaming. A copy that fails is retried
  after a backoff (30 s, doubled per failure, at most an hour); meanwhile the table is Pending.
  A table that joins with a mirror already there (re-created, or selected again) is copied again
  the same way (its ``resnapshotBelowLsn``), as is any table the run's start found added.
- A table without a usable replica identity is ``Failed`` in the status with its fix, as at
  start, and left out of the publication; once fixed it joins.
- A table that is dropped (or renamed, moved, taken out of the spec) leaves the apply job, which
  is restarted without it; its row says ``Removed`` and its mirror is kept as it was (never
  deleted by lakeslot).

``--once`` resolves the selection only at start.

Stopping: SIGINT (Ctrl-C) or SIGTERM sets one stop event. The reader gets SIGTERM (it confirms
only what is sealed, then releases the slot); the apply job finishes the commit it is making or
stops before starting the next; a running snapshot's Spark jobs are cancelled (its temporary slot
goes with its transaction, and the next run copies the tables that did not commit); the Spark
JVM stops with the session. A second signal does not skip any of this: it only repeats the
stop. ``kill -9`` skips everything, and nothing is lost: the reader dies with its parent
(``PR_SET_PDEATHSIG``; should it linger, the next run stops it before starting its own) and
PostgreSQL drops the temporary slot with its session; a restart
resumes exactly where staging and each table's ``lakeslot.lsn`` say (DESIGN.md rules 3 and 6).

``--once``: the source's current WAL LSN is taken when streaming starts (right after the slot
step); the reader stops once everything up to it is sealed (``--stop-at-lsn``), the apply job
applies what is sealed until nothing is left, and the run exits 0 — unless a table did not get
there: its snapshot failed (it has no mirror) or the apply job stopped it. Then the run names each
such table with its error and exits 3 when every error is definite, 1 when one was transient
(retries ran out; a rerun may pass). ``lakeslot status`` shows the same: a table whose snapshot
failed definitely is ``Failed`` with the error, after a transient failure ``Pending`` with it.

The reader child is restarted whenever it ends without a definite error (crash, retries
exhausted, killed). Only failures *in a row without progress* count — progress meaning that
staging's sealed end moved during that reader's life —, and after :data:`READER_RESTARTS` of them
the run gives up (exit 1) naming the last failure (its status file's reason, or the signal that
killed it). A reader that dies now and then but streams in between is restarted for ever.
Likewise the streaming apply job: a transient error that escapes its own retries (PostgreSQL
restarted under its connection, storage unreachable) restarts it after a backoff (1 s doubling,
at most 30 s) while the run keeps supervising; :data:`APPLY_RESTARTS` such failures in a row
without a finished pass, any other error, or the Spark JVM gone (a session cannot be revived in
this process) end the run with exit 1 — a supervisor's restart resumes it.

Metrics (``--metrics-port``, :attr:`Options.metrics_port`): ``/metrics`` serves the operator's
gauges of the ingestion (:mod:`lakeslot.observability.metrics`: slot, lag, freshness, conditions, per
table), labelled with the ingestion file's namespace and name, computed from the status each
supervision tick computes (every ``Options.interval`` seconds) and the jobs' documents — what
``lakeslot status`` prints, in numbers. A tick whose status cannot be computed keeps the last
values; none refreshed for :data:`~lakeslot.observability.metrics.MAX_AGE_S` disappear. The
operator's counters (reconciles, evictions) and the reader's own metrics are not served: a
local run has no reconcile, and its reader runs without a port (two runs would fight over it).
A port that cannot be bound fails the run before anything starts (exit 2).

Exit codes: 0 stopped cleanly or caught up (``--once``); 1 failed (connection, Spark, the
reader kept failing), retrying later may help; 2 bad input (file, secrets; nothing was started);
3 a definite error that needs a human (the message and ``lakeslot status`` say what to do).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

from lakeslot import lsn as lsnlib
from lakeslot.api.models import PostgresIngestionStatus, TableStatus
from lakeslot.api.naming import TableName
from lakeslot.control import resnapshot
from lakeslot.control import steps as control
from lakeslot.exits import EXIT_DEFINITE, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from lakeslot.local import observe, reader_process, state, tree
from lakeslot.local.config import Local
from lakeslot.local.display import Display
from lakeslot.observability import http as metrics_http
from lakeslot.observability import metrics as ingestion_metrics
from lakeslot.observability import status as st
from lakeslot.source import connection

if TYPE_CHECKING:  # pyspark is imported only once a run needs Spark
    from wsgiref.simple_server import WSGIServer

    import psycopg
    from pyspark.sql import SparkSession

    from lakeslot.snapshot.job import TableOutcome as SnapshotOutcome

log = logging.getLogger("lakeslot.local")

READER_RESTARTS = 5  # reader failures in a row, nothing sealed in between → give up
ONCE_POLL_S = 1.0
APPLY_RESTARTS = 5  # transient apply-job failures in a row, no pass finished in between → give up
APPLY_BACKOFF_S, APPLY_BACKOFF_MAX_S = 1.0, 30.0
STOP_TIMEOUT_S = 60.0
COPY_BACKOFF_S = 30.0  # a joined table whose copy failed is tried again after this, doubled
COPY_BACKOFF_MAX_S = 3600.0


class RunFailed(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Options:
    once: bool = False
    interval: float = 2.0  # seconds between supervision ticks (status refresh)
    selection_interval: float = 10.0  # seconds between checks of the selection while streaming
    master: str = "local[*]"
    spark: SparkSession | None = None  # an existing session (kept running at the end)
    out: TextIO | None = None  # where progress goes; default stderr
    interactive: bool | None = None  # redraw in place; default: out is a terminal
    metrics_port: int | None = None  # serve /metrics on this port (0: any free port)
    metrics_host: str = "127.0.0.1"


@dataclass
class Result:
    code: int
    message: str
    caught_up: bool = False  # --once reached its target (not stopped by a signal first)
    status: PostgresIngestionStatus | None = None
    once_target: int | None = None
    timings: dict[str, float] = field(default_factory=dict)


def configure_logging(local: Local, *, interactive: bool) -> None:
    """Plain log lines on stderr; on a terminal they go to ``run.log`` in the state directory
    instead, so they do not tear the live display."""
    local.state_dir.mkdir(parents=True, exist_ok=True)
    handler = (logging.FileHandler(local.path("run.log")) if interactive
               else logging.StreamHandler(sys.stderr))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    for noisy in ("py4j", "pyiceberg"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def spark_session(local: Local, tables: list[TableName], *, master: str = "local[*]") -> SparkSession:
    """The Spark session of a local run: ``sink.catalog`` with its Secret-backed properties,
    Spark's own log in ``spark.log`` of the state directory (the JVM inherits the stderr it is
    started with: it is pointed there while the JVM starts, so Spark's logging never mixes with
    the progress display)."""
    from lakeslot.spark.session import job_session

    local.state_dir.mkdir(parents=True, exist_ok=True)
    with open(local.path("spark.log"), "ab") as spark_log:
        saved = os.dup(2)
        os.dup2(spark_log.fileno(), 2)
        try:
            spark = job_session(local.with_tables(tables), "lakeslot-local", master=master)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_spark(spark) -> None:
    """Stop the session and its JVM. PySpark leaves the JVM running until this process exits
    (it watches its stdin); closing that pipe ends it now, so nothing outlives the run."""
    from pyspark import SparkContext

    gateway = spark.sparkContext._gateway
    process = getattr(gateway, "proc", None)
    spark.stop()
    with SparkContext._lock:
        SparkContext._gateway = SparkContext._jvm = None
    gateway.shutdown()
    if process is not None:
        process.stdin.close()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run(local: Local, options: Options) -> Result:
    """Run until stopped (or caught up with ``--once``). Raises :class:`state.AlreadyRunning`."""
    lock = state.RunLock(local.state_dir)
    lock.acquire()
    os.environ.update(local.environ)  # the children and Spark's workers read their secrets here
    stop = threading.Event()
    previous = _on_signals(stop) if threading.current_thread() is threading.main_thread() else {}
    try:
        session = _Session(local, options, stop)
        try:
            session.execute()
            code, message = EXIT_OK, "caught up" if session.caught_up else "stopped"
        except RunFailed as e:
            code, message = e.code, str(e)
        finally:
            session.shutdown()
        return Result(code, message, session.caught_up, session.final_status(), session.target,
                      session.timings)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        lock.release()


def _stopper(stop: threading.Event) -> Callable[[int, object], None]:
    def handler(signum: int, _frame: object) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()
    return handler


def _on_signals(stop: threading.Event) -> dict:
    handler = _stopper(stop)
    return {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}


class _Session:
    def __init__(self, local: Local, options: Options, stop: threading.Event) -> None:
        self.local, self.options, self.stop = local, options, stop
        self.job = local.job
        self.pod = reader_process.pod_identity()
        self.reader: reader_process.ReaderProcess | None = None
        self.reader_failures = FailureStreak(READER_RESTARTS)
        self.reader_from: int | None = None  # where staging ended when the reader started
        self.snapshot_failed: dict[TableName, SnapshotOutcome] = {}  # by the snapshot phase
        self.reader_done = threading.Event()  # --once: everything up to the target is sealed
        self.target: int | None = None
        self.caught_up = False
        self.spark: SparkSession | None = None
        self.workers: dict[str, _Worker] = {}
        self.apply_stop = threading.Event()
        self.display = Display(local, options.out, interactive=options.interactive)
        self.staged = observe.StagedCounter(local.ingestion.spec.staging.uri)
        self.timings: dict[str, float] = {}
        self.started = time.monotonic()
        self.processes_before = tree.descendants(os.getpid())
        self.last_status: PostgresIngestionStatus | None = None
        self._batch_started: float | None = None
        self.apply_passes = 0  # passes the apply job finished (a table is marked only by a pass)
        self._resnapshot_decided_at = -1  # apply_passes when _resnapshot last read the mirrors
        self.apply_seconds: float | None = None  # the last apply pass: batch read → committed
        # the selection (see the module docstring)
        self.tables: list[TableName] = []  # selected and usable
        self.rows: list[TableStatus] = []  # status.tables as the source steps last left them
        self.mirrored: set[TableName] = set()  # tables known to have a mirror (a snapshot)
        self.joined: set[TableName] = set()  # joined while streaming, without a mirror yet
        self.copy_failures: dict[TableName, tuple[int, float]] = {}  # failures, last (monotonic)
        self.apply_tables: tuple[TableName, ...] = ()  # the running apply job's tables
        self.copying: tuple[TableName, ...] = ()  # the running copy's tables
        self._copied: dict[TableName, str] = {}  # the last copy's outcome per table (its thread)
        self._fingerprint: tuple | None = None
        self._checked_at = time.monotonic()
        self._watch: psycopg.Connection | None = None
        self.gauges: ingestion_metrics.Gauges | None = None
        self.metrics_server: WSGIServer | None = None

    # the steps ---------------------------------------------------------------------------

    def execute(self) -> None:
        if self.options.metrics_port is not None:
            self._serve_metrics(self.options.metrics_port)
        tables, below = self._control()
        self._stop_orphaned_reader()
        self._start_reader()
        self.spark = self.options.spark or self._spark_session(tables)
        if self.options.spark is None and threading.current_thread() is threading.main_thread():
            # PySpark's SparkContext takes SIGINT for itself (cancel jobs, KeyboardInterrupt in
            # whatever the main thread does): Ctrl-C must stop the run in order instead.
            signal.signal(signal.SIGINT, _stopper(self.stop))
        if self.stop.is_set():
            return
        self._phase("snapshot", lambda: self._snapshot(tables, below))
        if self.stop.is_set():
            return
        streaming = self._streaming_tables(tables)
        if not streaming:
            raise _not_caught_up("no table has a snapshot to stream into",
                                 self._snapshot_failures(tables), [])
        self._phase("apply", lambda: self._apply(streaming))
        self.caught_up = self.options.once and not self.stop.is_set()

    def _serve_metrics(self, port: int) -> None:
        from prometheus_client import CollectorRegistry, make_wsgi_app

        self.gauges = ingestion_metrics.Gauges()
        registry = CollectorRegistry()
        registry.register(self.gauges)
        try:
            self.metrics_server = metrics_http.serve(
                make_wsgi_app(registry), port, self.options.metrics_host, "lakeslot-run-metrics")
        except OSError as e:
            raise RunFailed(EXIT_USAGE, f"cannot serve metrics on {self.options.metrics_host}:"
                            f"{port}: {e.strerror or e}") from e
        log.info("metrics on http://%s:%d/metrics", self.options.metrics_host,
                 self.metrics_server.server_port)

    def _export(self, status: PostgresIngestionStatus) -> None:
        """The status (and the jobs' documents) into the served gauges."""
        if self.gauges is None:
            return
        names = self.job.names
        try:
            apply_pass = self.staged.staging.read_apply_status()
        except (OSError, ValueError):  # unreadable now: its series are left out until it is
            apply_pass = None
        self.gauges.set(names.namespace, names.name, ingestion_metrics.samples(
            status, owner=names.owner, suspended=False, apply_pass=apply_pass,
            snapshot=observe.snapshot_document(self.local)))

    def _control(self) -> tuple[list[TableName], int]:
        report = st.Report(PostgresIngestionStatus(tables=state.read_tables(self.local.state_dir)),
                           0, datetime.now(UTC))
        job = self.job
        if not self.options.once:  # before the steps: a table created meanwhile is seen later
            self._fingerprint = self._selection_fingerprint()
        source = control.take_control(
            job.source(self.local.environ), self.local.ingestion, report, component="local",
            reader=connection.application_name("reader", job.names.owner, self.pod))
        self._log(report)
        failed = [c for c in report.status.conditions if c.status == "False"]
        if source is None:
            code = (EXIT_FAILED if any(c.reason == "ConnectionFailed" for c in failed)
                    else EXIT_DEFINITE)
            raise RunFailed(code, "\n".join(f"{c.type}: {c.reason}: {c.message}" for c in failed))
        tables = source.tables
        self._adopt(report, tables, streaming=False)
        self.target = source.current_lsn if self.options.once else None
        below = report.status.resnapshot_below_lsn
        return tables, state.resnapshot_below(self.local.state_dir,
                                              lsnlib.parse(below) if below else 0)

    def _stop_orphaned_reader(self) -> None:
        """The reader an earlier run left behind, if it still runs (see
        :mod:`.reader_process`); called before the first reader of this run starts."""
        earlier = state.read_run(self.local.state_dir)
        pid, pod = earlier.get("readerPid"), earlier.get("pod")
        if isinstance(pid, int) and isinstance(pod, str) and pid != os.getpid() \
                and reader_process.stop_orphan(pid, pod):
            log.warning("the reader of an earlier run (pid %d) outlived it: stopped it", pid)

    def _start_reader(self) -> None:
        self.reader_from = self._sealed_end()
        self.reader = reader_process.spawn(self.local, pod=self.pod, stop_at=self.target)
        state.write_run(self.local.state_dir, readerPid=self.reader.pid, pod=self.pod,
                        onceTarget=None if self.target is None else lsnlib.format(self.target))
        log.info("reader started (pid %d)%s", self.reader.pid,
                 f", stopping at {lsnlib.format(self.target)}" if self.target is not None else "")

    def _spark_session(self, tables: list[TableName]) -> SparkSession:
        return spark_session(self.local, tables, master=self.options.master)

    def _snapshot(self, tables: list[TableName], below: int) -> None:
        from lakeslot.snapshot import job as snapshot_job

        job_input = self.local.with_tables(tables)
        progress = observe.snapshot_location(self.local)
        worker = self._start("snapshot", lambda: snapshot_job.run(
            self.spark, job_input, progress=progress, min_snapshot_lsn=below))
        self._supervise(lambda: not worker.alive)
        if worker.alive:  # stopping: cancel its Spark jobs until it gives up
            assert self.spark is not None  # execute() starts the session before the snapshot
            while worker.alive:
                self.spark.sparkContext.cancelAllJobs()
                worker.join(1.0)
            return
        result = worker.outcome()
        for table in result.tables:
            if table.error:
                log.warning("snapshot of %s failed: %s", table.source, table.error)
        self.snapshot_failed = {t.source: t for t in result.tables if t.state == "failed"}

    def _snapshot_failures(self, tables: list[TableName]) -> list[tuple[TableName, str, bool]]:
        """(table, why, transient) of each table whose snapshot failed and that has no mirror."""
        return [(t, f"snapshot failed: {failure.error}", failure.transient) for t in tables
                if t not in self.mirrored and (failure := self.snapshot_failed.get(t)) is not None]

    def _streaming_tables(self, tables: list[TableName]) -> list[TableName]:
        from lakeslot.mirror import progress as mirror_progress

        progress = mirror_progress.read(self.local.ingestion, tables,
                                        secrets=self.job.catalog_secrets(self.local.environ))
        self.mirrored = {t for t in tables if progress[t].lsn is not None}
        self._hold(self._joined_below(progress), progress)
        return [t for t in tables if progress[t].lsn is not None]

    def _apply(self, tables: list[TableName]) -> None:
        from lakeslot.apply import job as apply_job

        job_input = self.local.with_tables(tables)
        hooks = apply_job.Hooks(point=self._apply_point)
        self.apply_tables = tuple(tables)
        if not self.options.once:
            self._stream(hooks)
            return

        def until_caught_up():
            while not self.apply_stop.is_set():
                sealed = self.reader_done.is_set()
                result = apply_job.run(self.spark, job_input, once=True, stop=self.apply_stop,
                                       hooks=hooks)
                if sealed:
                    return result
                self.apply_stop.wait(ONCE_POLL_S)
            return None

        while True:  # caught up, unless a table must be copied again: then once more
            worker = self._start("apply", until_caught_up)
            self._supervise(worker.finished)
            result = None if worker.alive else worker.outcome()
            copying = None if self.stop.is_set() else self._resnapshot()
            if copying is None:
                break
            self._supervise(copying.finished)
            copying.outcome()
        applied = [(t.source, f"apply {t.state}: {t.error}", t.state == "retrying")
                   for t in result.tables if t.state in ("failed", "retrying")] if result else []
        unsnapshotted = self._snapshot_failures(self.tables)
        if (applied or unsnapshotted) and not self.stop.is_set():
            raise _not_caught_up("not caught up", unsnapshotted, applied)

    def _stream(self, hooks) -> None:
        """The apply job until stopped, restarted whenever the tables it must handle change
        (:meth:`_apply_list`): the pass it is in finishes first, commits included."""
        from lakeslot.apply import job as apply_job

        failures = FailureStreak(APPLY_RESTARTS)
        while not self.stop.is_set():
            tables = self._apply_list()
            stop = threading.Event()
            self.apply_stop, self.apply_tables = stop, tables
            passes = self.apply_passes
            worker = self._start("apply", functools.partial(
                apply_job.run, self.spark, self.local.with_tables(list(tables)), once=False,
                stop=stop, hooks=hooks))
            # (the lambda is called only within this iteration)
            self._supervise(lambda: not worker.alive or self._apply_list() != tables,  # noqa: B023
                            tick=self._tick)
            if self.stop.is_set():
                return
            if not worker.alive:
                self._apply_ended(worker, failures, progressed=self.apply_passes > passes)
                continue
            now = self._apply_list()
            changes = [f"{sign} {', '.join(map(str, sorted(which)))}" for sign, which in
                       (("+", set(now) - set(tables)), ("-", set(tables) - set(now))) if which]
            log.info("the apply job's tables change (%s): restarting it after its current pass",
                     "; ".join(changes))
            stop.set()
            self._supervise(worker.finished)
            if not worker.alive:
                worker.outcome()

    def _apply_ended(self, worker: _Worker, failures: FailureStreak, *, progressed: bool) -> None:
        """The streaming apply job ended by itself. A transient error (PostgreSQL restarted under
        its connection, storage or catalog unreachable for a moment) restarts it after a backoff
        (30 s at most) while the run keeps supervising: it resumes from each table's
        ``lakeslot.lsn``. Anything else, a dead Spark JVM (a session cannot be revived in this
        process), or :data:`APPLY_RESTARTS` failures in a row without a finished pass in between
        end the run (exit 1)."""
        from lakeslot.errors import transient_in_spark

        error = worker.error
        if error is None:
            raise RunFailed(EXIT_FAILED, "the apply job ended although no stop was requested")
        if self._spark_exited():
            raise RunFailed(EXIT_FAILED, "the Spark JVM exited (killed?): lakeslot run resumes "
                            f"where the mirrors say when started again; last error: "
                            f"{type(error).__name__}: {st.first_line(error)}")
        what = f"{type(error).__name__}: {st.first_line(error)}"
        if not isinstance(error, transient_in_spark()) or failures.add(what, progressed=progressed):
            worker.outcome()  # raises RunFailed with the error
        delay = min(APPLY_BACKOFF_MAX_S, APPLY_BACKOFF_S * 2 ** (failures.count - 1))
        log.warning("the apply job failed transiently (%s); restarting it in %.0f s (failure %d "
                    "in a row without a finished pass)", what, delay, failures.count)
        until = time.monotonic() + delay
        self._supervise(lambda: time.monotonic() >= until)

    def _spark_exited(self) -> bool:
        """True when this run's own Spark JVM has exited (a caller's session is not watched)."""
        if self.spark is None or self.options.spark is not None:
            return False
        process = getattr(self.spark.sparkContext._gateway, "proc", None)
        return process is not None and process.poll() is not None

    def _apply_list(self) -> tuple[TableName, ...]:
        """The tables the apply job handles now: the selected ones with a mirror, those being
        copied, and those that joined and are due for a copy (waiting for it, they keep staging's
        retention from deleting changes the copy will need)."""
        return tuple(t for t in self.tables if t in self.mirrored or t in self.copying
                     or (t in self.joined and self._copy_due(t)))

    def _copy_due(self, table: TableName) -> bool:
        failures, at = self.copy_failures.get(table, (0, 0.0))
        delay = min(COPY_BACKOFF_S * 2 ** max(failures - 1, 0), COPY_BACKOFF_MAX_S)
        return not failures or time.monotonic() >= at + delay

    def _apply_point(self, name: str, table) -> None:
        """Counts the apply passes and times each from reading its batch to the last table's commit."""
        if name == "batch-read":
            self._batch_started = time.monotonic()
        elif name == "after-tables":
            self.apply_passes += 1
            if self._batch_started is not None:
                self.apply_seconds = time.monotonic() - self._batch_started

    # supervision -------------------------------------------------------------------------

    def _phase(self, name: str, action: Callable[[], None]) -> None:
        started = time.monotonic()
        try:
            action()
        finally:
            self.timings[name] = time.monotonic() - started

    def _start(self, name: str, target: Callable[[], object]) -> _Worker:
        spark = self.spark
        assert spark is not None  # execute() starts the session before any job

        def in_session() -> object:
            # SQL conf (the Iceberg catalog) is the JVM thread's active session's: a new
            # thread has none until it is set.
            from lakeslot.spark.session import make_active

            make_active(spark)
            return target()

        worker = _Worker(name, in_session)
        self.workers[name] = worker
        return worker

    def _supervise(self, done: Callable[[], bool], tick: Callable[[], object] | None = None) -> None:
        """Tick until ``done()`` or stopped: watch the reader, refresh the status, ``tick()``."""
        while not self.stop.is_set() and not done():
            self._check_reader()
            if tick is not None:
                tick()
            self._refresh()
            self.stop.wait(self.options.interval)
        self._refresh()

    def _tick(self) -> None:
        self._watch_selection()
        self._resnapshot()

    def _resnapshot(self) -> _Worker | None:
        """Start copying, online, the tables :func:`lakeslot.control.resnapshot.decide` wants again and
        the joined tables without a mirror that the apply job already waits for (unless a copy
        is running); the worker, or None when nothing is to be copied. The mirrors are read once
        per finished apply pass, not on every supervision tick: only a pass marks a table, and
        a restarted apply job makes a pass at once (a request is read from the spec once, at
        the first call)."""
        from lakeslot.mirror import progress as mirror_progress
        from lakeslot.snapshot import job as snapshot_job

        running = self.workers.get("snapshot")
        if running is not None and running.alive:
            return None
        if self.copying:
            self._copy_finished()
        if self.apply_passes == self._resnapshot_decided_at:
            return None
        self._resnapshot_decided_at = self.apply_passes
        spec, tables = self.local.ingestion.spec, self.tables
        progress = mirror_progress.read(self.local.ingestion, tables,
                                        secrets=self.job.catalog_secrets(self.local.environ))
        self.mirrored = {t for t in tables if progress[t].lsn is not None}
        self.joined -= self.mirrored
        generations = state.resnapshot_generations(self.local.state_dir)
        requested = {t: (progress[t].lsn or 0) + 1 for t in tables
                     if (options := self.job.table_spec(t)) is not None
                     and options.resnapshot_generation > generations.get(str(t), 0)}
        rejoined = self._joined_below(progress)
        for table, below in rejoined.items():
            requested[table] = max(requested.get(table, 0), below)
        decision = resnapshot.decide(progress, spec.policies, requested)
        for table, why in decision.held.items():
            log.warning("%s: %s", table, why)
        new = {t for t in self.joined if self._copy_due(t)}
        # Only tables the running apply job waits for: it keeps staging's retention from
        # deleting the changes after the copy's snapshot. The others (a table that joined with
        # a mirror, seen just now) are copied after the restart that adds them, at its first pass.
        wanted = sorted(t for t in {*decision.copy, *new} if t in self.apply_tables)
        if not wanted:
            return None
        for table in (t for t in decision.copy if t in wanted):
            why = "requested (resnapshotGeneration)" if table in decision.requested \
                else progress[table].error or "marked for a re-snapshot"
            if table in decision.requested and table in rejoined:
                why = "it joined the publication (its mirror missed what happened meanwhile)"
            log.warning("TableResnapshot: copying %s again, online: %s", table, why)
        for table in sorted(new & set(wanted)):
            log.info("TableAdded: copying %s, online: it joined the publication", table)
        self.copying = tuple(wanted)
        self._copied = {}
        min_snapshot_lsn = max((decision.copy.get(t, 0) for t in wanted), default=0)

        def copy() -> object:
            try:
                result = snapshot_job.run(self.spark, self.local.with_tables(wanted),
                                          progress=observe.snapshot_location(self.local),
                                          min_snapshot_lsn=min_snapshot_lsn)
            except Exception as e:
                self._copied = dict.fromkeys(wanted, f"{type(e).__name__}: {st.first_line(e)}")
                raise
            self._copied = {t.source: t.error or t.state for t in result.tables}
            done = {t.source for t in result.tables if t.state in ("committed", "skipped")}
            state.record_resnapshot_generations(self.local.state_dir, {
                str(t): options.resnapshot_generation for t in decision.requested & done
                if (options := self.job.table_spec(t)) is not None})
            for table in result.tables:
                if table.error:
                    log.warning("re-snapshot of %s failed: %s", table.source, table.error)
            return result

        return self._start("snapshot", copy)

    def _copy_finished(self) -> None:
        """The copy's tables that did not commit wait for their backoff (a joined table leaves the
        apply job meanwhile); a finished copy lets the next apply pass decide again."""
        for table in self.copying:
            if self._copied.get(table) not in ("committed", "skipped"):
                failures, _ = self.copy_failures.get(table, (0, 0.0))
                self.copy_failures[table] = (failures + 1, time.monotonic())
            else:
                self.copy_failures.pop(table, None)
        self.copying = ()

    def _hold(self, rejoined: dict[TableName, int], progress) -> None:
        """Stop each table that joined the publication again with a mirror, before an apply job
        that handles it starts, until its copy moves its position: a definite error at its
        position, which the copy lifts (DESIGN.md invariant 8: its mirror misses what changed
        while it was out, so changes must not be applied on top of it meanwhile)."""
        from lakeslot.spark.tables import Tables

        sink = self.local.ingestion.spec.sink
        mirrors = Tables(self.spark, sink.catalog.name, sink.namespace)
        for table, below in sorted(rejoined.items()):
            if progress[table].error is not None:  # stopped already: its error holds it
                continue
            mirrors.record_error(self.job.names.mirror_table(table), (
                f"{table} joined the publication again at {lsnlib.format(below)}: what changed "
                "while it was out of it is in no stream, so its mirror is copied again (alone, "
                "online) before it streams on"), progress[table].lsn, resnapshot=True)

    def _joined_below(self, progress) -> dict[TableName, int]:
        """Tables that joined the publication with a mirror (re-created, or selected again), each
        with the LSN its copy must reach (``resnapshotBelowLsn``). Served ones are cleared, and so
        are those without a mirror: no copy runs while this is called, so theirs starts later,
        after they joined."""
        below: dict[TableName, int] = {}
        served = False
        for row in self.rows:
            table = TableName(row.schema_name, row.name)
            if row.resnapshot_below_lsn is None or table not in progress:
                continue
            lsn = lsnlib.parse(row.resnapshot_below_lsn)
            if progress[table].lsn is None or (progress[table].snapshot_lsn or 0) >= lsn:
                row.resnapshot_below_lsn, served = None, True
            else:
                below[table] = lsn
        if served:
            state.write_tables(self.local.state_dir, self.rows)
        return below

    # the selection -------------------------------------------------------------------------

    def _selection_fingerprint(self) -> tuple | None:
        """:func:`lakeslot.control.steps.selection_fingerprint` on the run's own connection, opened
        once and again after a failure; None when the source cannot answer now."""
        import psycopg

        try:
            if self._watch is None or self._watch.closed:
                self._watch = connection.connect(
                    self.job.source(self.local.environ),
                    connection.application_name("local", self.job.names.owner))
            return control.selection_fingerprint(self._watch, self.local.ingestion.spec.source)
        except psycopg.Error as e:
            log.warning("cannot check the selection now (again in %.0f s): %s",
                        self.options.selection_interval, st.first_line(e))
            if self._watch is not None:
                self._watch.close()
            self._watch = None
            return None

    def _watch_selection(self) -> None:
        """Every ``selection_interval`` seconds: the source steps again when the selection's
        fingerprint changed (see the module docstring)."""
        import psycopg

        if time.monotonic() - self._checked_at < self.options.selection_interval:
            return
        self._checked_at = time.monotonic()
        fingerprint = self._selection_fingerprint()
        if fingerprint is None or fingerprint == self._fingerprint or self._watch is None:
            return
        report = st.Report(PostgresIngestionStatus(
            tables=self.rows, conditions=self.last_status.conditions if self.last_status else []),
            0, datetime.now(UTC))
        try:
            tables = control.check_source(self._watch, self.local.ingestion, report)
        except psycopg.Error as e:
            log.warning("cannot check the selection now (again in %.0f s): %s",
                        self.options.selection_interval, st.first_line(e))
            self._watch.close()
            return
        self._log(report)
        if tables is None:  # the condition says why; the tables stream on, checked again later
            for c in report.status.conditions:
                if c.status == "False":
                    log.warning("the selection changed but cannot be taken: %s: %s: %s", c.type,
                                c.reason, c.message)
            return
        self._fingerprint = fingerprint
        self._adopt(report, tables, streaming=True)

    def _remember_positions(self, status: PostgresIngestionStatus) -> None:
        """Keep in the rows where each mirror was last seen, so that a table that leaves the
        selection is reported Removed with its mirror's position."""
        seen = {(r.schema_name, r.name): r for r in status.tables if r.state != "Removed"}
        for row in self.rows:
            if row.state != "Removed" and (now := seen.get((row.schema_name, row.name))) is not None:
                row.applied_lsn = now.applied_lsn or row.applied_lsn
                row.snapshot_lsn = now.snapshot_lsn or row.snapshot_lsn

    def _adopt(self, report: st.Report, tables: list[TableName], *, streaming: bool) -> None:
        """Take the source steps' selection: the usable tables and the rows (kept in the state
        directory for ``lakeslot status`` and the next run)."""
        before = set(self.tables)
        self.rows = report.status.tables
        state.write_tables(self.local.state_dir, self.rows)
        for row in self.rows:
            if row.state == "Failed":
                log.warning("%s.%s is skipped: %s", row.schema_name, row.name, row.message)
        if streaming:
            self._join(set(tables) - before)
            self.joined &= set(tables)
            for table in before - set(tables):
                self.copy_failures.pop(table, None)
        self.tables = list(tables)

    def _join(self, joined: set[TableName]) -> None:
        """Tables that joined while streaming: those without a mirror wait for their first copy;
        those with one (created again, or selected again) are stopped until their copy, before
        the apply job that handles them starts (:meth:`_hold`)."""
        from lakeslot.mirror import progress as mirror_progress

        if not joined:
            return
        progress = mirror_progress.read(self.local.ingestion, sorted(joined),
                                        secrets=self.job.catalog_secrets(self.local.environ))
        with_mirror = {t for t in joined if progress[t].lsn is not None}
        self.mirrored |= with_mirror
        self.joined |= joined - with_mirror
        self._hold(self._joined_below(progress), progress)

    def _log(self, report: st.Report) -> None:
        for event in report.events:
            log.log(logging.WARNING if event.type == "Warning" else logging.INFO, "%s: %s",
                    event.reason, event.message)

    def _check_reader(self) -> None:
        reader = self.reader
        assert reader is not None  # execute() starts the reader before anything is supervised
        code = reader.poll()
        if code is None:
            return
        if code == 0 and self.target is not None:
            if not self.reader_done.is_set():
                log.info("the reader sealed everything up to %s", lsnlib.format(self.target))
                self.reader_done.set()
            return
        outcome = reader.outcome()
        if code == EXIT_DEFINITE:
            raise RunFailed(EXIT_DEFINITE, f"the reader stopped with a definite error "
                            f"({outcome.get('reason')}): {outcome.get('message')}")
        what = reader_process.describe_exit(code, outcome)
        end = self._sealed_end()
        progressed = end is not None and self.reader_from is not None and end > self.reader_from
        if self.reader_failures.add(what, progressed=progressed):
            raise RunFailed(EXIT_FAILED, f"the reader failed {self.reader_failures.count} times "
                            f"in a row without sealing anything in between; last: {what} "
                            f"(log: {reader.log_file})")
        log.warning("the reader ended (%s)%s; restarting it (it resumes from staging)", what,
                    "" if progressed else f", failure {self.reader_failures.count} in a row "
                    "without progress")
        self._start_reader()

    def _sealed_end(self) -> int | None:
        """Where durable data ends in staging (the furthest sealed segment's end; 0 when empty),
        None when staging cannot be read now. The reader seals at least every
        ``segment_max_seconds`` while WAL moves, idle or not, so a streaming reader moves it."""
        try:
            last = self.staged.staging.resume_point()
        except OSError as e:
            log.warning("cannot list staging now: %s", st.first_line(e))
            return None
        return 0 if last is None else last.end

    def _activity(self) -> observe.Activity:
        apply = self.workers.get("apply")
        return observe.Activity(
            run_active=True, reader_pod=self.pod,
            reader_running=self.reader is not None and (self.reader.poll() is None
                                                         or self.reader_done.is_set()),
            reader_outcome=self.reader.outcome() if self.reader else {},
            apply_problem=None if apply is not None and apply.alive else
            "the apply job has not started yet" if apply is None else "the apply job finished")

    def _refresh(self) -> None:
        try:
            self.last_status = observe.observe(self.local, self._activity(), staged=self.staged)
        except Exception as e:  # noqa: BLE001 - the display must never stop the pipeline
            log.warning("cannot compute the status: %s", st.first_line(e))
            return
        self._remember_positions(self.last_status)
        self._export(self.last_status)
        self.display.show(self.last_status, time.monotonic() - self.started, self.target,
                          apply_seconds=self.apply_seconds)

    def final_status(self) -> PostgresIngestionStatus | None:
        return self.last_status

    def shutdown(self) -> None:
        self.stop.set()
        self.apply_stop.set()
        if self._watch is not None:
            self._watch.close()
        if self.reader is not None:
            code = self.reader.stop()
            log.info("reader stopped (exit %s)", code)
        for worker in self.workers.values():
            while worker.alive:
                if self.spark is not None and worker.name == "snapshot":
                    self.spark.sparkContext.cancelAllJobs()
                worker.join(1.0)
        if self.spark is not None and self.options.spark is None:
            stop_spark(self.spark)
            # Spark's Python workers die with its JVM, a moment later: wait for everything this
            # run started (a caller's own session and processes are left alone).
            left = tree.wait_gone(tree.descendants(os.getpid()) - self.processes_before,
                                  STOP_TIMEOUT_S)
            if left:
                log.warning("processes %s did not exit by themselves and were terminated",
                            sorted(left))
        with contextlib.suppress(Exception):
            self._refresh_final()
        self.display.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()

    def _refresh_final(self) -> None:
        activity = observe.Activity(run_active=False, reader_outcome=self.reader.outcome()
                                    if self.reader else {})
        self.last_status = observe.observe(self.local, activity, staged=self.staged)
        self.display.show(self.last_status, time.monotonic() - self.started, self.target,
                          apply_seconds=self.apply_seconds, final=True)


@dataclass
class FailureStreak:
    """Failures in a row without progress: one that follows progress starts a new streak, so
    a process that dies now and then but works in between is restarted for ever, and one that
    cannot get anywhere is given up after ``limit`` restarts (with the last failure's text)."""

    limit: int
    count: int = 0
    last: str = ""

    def add(self, what: str, *, progressed: bool) -> bool:
        """Record a failure (``progressed``: something was achieved since the previous one);
        True when the streak is longer than ``limit``."""
        self.count = 1 if progressed else self.count + 1
        self.last = what
        return self.count > self.limit


def _not_caught_up(what: str, *failures: list[tuple[TableName, str, bool]]) -> RunFailed:
    """The run's failure naming each table that did not get there, with why: exit 3 (a human
    must act) when every cause is definite, 1 when a transient one may pass on a rerun."""
    listed = [f for group in failures for f in group]
    code = EXIT_FAILED if any(transient for *_, transient in listed) else EXIT_DEFINITE
    return RunFailed(code, f"{what}: " + "; ".join(f"{t} {why}" for t, why, _ in listed) + (
        " (lakeslot status shows each table's state)"))


class _Worker:
    """A thread whose exception is re-raised (as :class:`RunFailed`) by :meth:`outcome`."""

    def __init__(self, name: str, target: Callable[[], object]) -> None:
        self.name = name
        self._result: dict = {}

        def body() -> None:
            try:
                self._result["value"] = target()
            except BaseException as e:
                log.exception("%s failed", name)
                self._result["error"] = e

        self._thread = threading.Thread(target=body, name=f"lakeslot-{name}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def finished(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def error(self) -> BaseException | None:
        return self._result.get("error")

    def outcome(self):
        if "error" in self._result:
            error = self._result["error"]
            raise RunFailed(EXIT_FAILED, f"{self.name} failed: {type(error).__name__}: "
                            f"{st.first_line(error)}") from error
        return self._result.get("value")
