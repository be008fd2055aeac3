"""``lakeslot run``: one ingestion on this machine, without Kubernetes.

The same steps as the operator's reconcile, in order, with the same conditions and messages
(:mod:`lakeslot.observability.status_report`): preflight and publication sync, the permanent slot (created before any
snapshot, DESIGN.md rule 2; a holder other than this run's reader is evicted), then

1. the reader, a child process (:mod:`.reader_process`), streaming the slot into staging from the
   start, so WAL is released while the snapshot runs;
2. the snapshot (:mod:`lakeslot.snapshot.job`) in a Spark ``local[*]`` session of this process,
   for every table whose mirror lacks a snapshot of the current ``resnapshotGeneration`` (a run
   killed mid-snapshot resumes with the tables not yet committed) — under ``snapshot.mode:
   never`` only for tables that have a mirror (a re-snapshot or a cut-off still copies them):
   the others start empty, created by the apply job, and stream what changed after the slot was
   created, as under the operator;
3. the apply job (:mod:`lakeslot.apply.job`) in the same session, MERGEing sealed segments into the
   mirror tables, until stopped. A streaming run warms it up (:mod:`lakeslot.apply.warmup`) in a
   thread of its own while the snapshot runs, so the first passes after the snapshot are warm.

This module is the order of those steps; the run's collaborators do the rest, each with its
invariants and failure modes:

- :mod:`.processes`: the reader child (restarted while it makes progress in between), the Spark
  session and the job threads; everything they started stops with the run.
- :mod:`.selection`: the selection, watched every ``Options.selection_interval`` seconds while
  streaming (``--once`` resolves it only at start); a table without a usable replica identity is
  ``Failed`` with its fix and left out of the publication until fixed.
- :mod:`.schedule`: what the apply job handles and what is copied, online, while the other tables
  stream — a table that joins, one that joins again with a mirror, one the user or the apply job
  asks to copy again — by the operator's decisions (:mod:`lakeslot.control.scheduling`,
  :mod:`lakeslot.control.resnapshot`). A table that leaves keeps its mirror as it was (never
  deleted by lakeslot); its row says ``Removed``.
- :mod:`.apply_loop`: the apply job, restarted when its tables change or after a transient error.
- :mod:`.live_status`: the status every supervision tick (every ``Options.interval`` seconds;
  less often when computing it takes more than a tenth of that: :data:`.live_status.STATUS_SHARE`),
  shown and, with ``--metrics-port`` (:attr:`Options.metrics_port`), served on ``/metrics``; a port
  that cannot be bound fails the run before anything starts (exit 2).

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

Outages: staging or the catalog unreachable at the start (staging opened, the source steps'
``StagingUnreachable``, the mirrors' progress read before and after the snapshot) is waited for
with backoff — 1 s doubling, at most a minute —, each attempt a line ``waiting for staging
(spec.staging.uri …): <why>; retrying in N s``, until it is back (the run goes on) or the run is
stopped (exit 0); ``--once`` waits too. Once streaming, the reader and the apply job retry on
their own (their modules say how).

Exit codes: 0 stopped cleanly or caught up (``--once``); 1 failed (connection, Spark, the
reader kept failing, the apply job failed), retrying later may help; 2 bad input (file, secrets;
nothing was started); 3 a definite error that needs a human (the message and ``lakeslot status``
say what to do).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO, TypeVar

from lakeslot import lsn_text
from lakeslot.api.models import PostgresIngestionStatus
from lakeslot.api.naming import TableName
from lakeslot.control import steps
from lakeslot.exits import EXIT_DEFINITE, EXIT_FAILED, EXIT_OK
from lakeslot.local import observe, state
from lakeslot.local.apply_loop import ApplyLoop
from lakeslot.local.config import Local
from lakeslot.local.live_status import LiveStatus
from lakeslot.local.outages import OUTAGE_REASONS, Outages
from lakeslot.local.processes import Processes, RunFailed, Worker, stopper
from lakeslot.local.schedule import Schedule
from lakeslot.local.selection import Selection, log_events
from lakeslot.observability import status_report
from lakeslot.source import connection

if TYPE_CHECKING:  # pyspark is imported only once a run needs Spark
    from pyspark.sql import SparkSession

    from lakeslot.snapshot.job import TableOutcome as SnapshotOutcome

log = logging.getLogger("lakeslot.local")
T = TypeVar("T")



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
    handler.addFilter(quiet_py4j_retries)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    for noisy in ("py4j", "pyiceberg"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def quiet_py4j_retries(record: logging.LogRecord) -> bool:
    """False for py4j's note that it sends a command again over a new connection (the JVM closed
    the old one; the retry then succeeds): py4j logs it at INFO on the root logger, with a
    "Connection reset by peer" traceback that reads like a failure. A send that fails for good
    is logged at ERROR and kept."""
    return not (record.name == "root" and record.levelno < logging.WARNING
                and f"{os.sep}py4j{os.sep}" in record.pathname)


def run(local: Local, options: Options) -> Result:
    """Run until stopped (or caught up with ``--once``). Raises :class:`state.AlreadyRunning`."""
    lock = state.RunLock(local.state_dir)
    lock.acquire()
    os.environ.update(local.environ)  # the children and Spark's workers read their secrets here
    stop, woken = threading.Event(), threading.Event()
    previous = (_on_signals(stop, woken) if threading.current_thread() is threading.main_thread()
                else {})
    try:
        staged = Outages(local, options.out, stop).retrying(
            "staging", lambda: observe.StagedCounter(local.ingestion.spec.staging.uri))
        if staged is None:
            return Result(EXIT_OK, "stopped")
        session = _Session(local, options, stop, woken, staged)
        try:
            session.execute()
            code, message = EXIT_OK, "caught up" if session.caught_up else "stopped"
        except RunFailed as e:
            code, message = e.code, str(e)
        finally:
            session.shutdown()
        return Result(code, message, session.caught_up, session.live.last,
                      session.processes.target, session.timings)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        lock.release()


def _on_signals(stop: threading.Event, woken: threading.Event) -> dict:
    handler = stopper(stop, woken)
    return {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}


class _Session:
    """One run: the steps in order (see the module docstring) over its collaborators."""

    def __init__(self, local: Local, options: Options, stop: threading.Event,
                 woken: threading.Event, staged: observe.StagedCounter) -> None:
        self.local, self.options, self.stop = local, options, stop
        self.outages = Outages(local, options.out, stop)
        self.processes = Processes(local, stop, woken, staged.staging, master=options.master,
                                   spark=options.spark)
        self.live = LiveStatus(local, staged, out=options.out, interactive=options.interactive)
        self.selection = Selection(local, options.selection_interval)
        self.schedule = Schedule(local, self.selection)
        self.apply = ApplyLoop(local, self.processes, self.schedule, self._supervise, self.outages)
        self.snapshot_failed: dict[TableName, SnapshotOutcome] = {}  # by the snapshot phase
        self.caught_up = False
        self.timings: dict[str, float] = {}

    def execute(self) -> None:
        if self.options.metrics_port is not None:
            self.live.serve_metrics(self.options.metrics_port, self.options.metrics_host)
        controlled = self._control()
        if controlled is None:  # stopped while waiting for an outage to end
            return
        tables, below = controlled
        self.processes.stop_orphaned_reader()
        self.processes.start_reader()
        self.processes.start_spark(tables)
        if self.stop.is_set():
            return
        if not self.options.once:  # warm the apply job up while the snapshot runs
            self.processes.start("warm-up", self._warm_up)
        self._phase("snapshot", lambda: self._snapshot(tables, below))
        if self.stop.is_set():
            return
        spark = self.processes.spark
        assert spark is not None  # started above
        streaming = self.outages.retrying("catalog", lambda: self.schedule.streaming_tables(spark, tables))
        if streaming is None:  # stopped while waiting
            return
        if not streaming:
            raise _not_caught_up("no table has a snapshot to stream into",
                                 self._snapshot_failures(tables), [])
        self._phase("apply", lambda: self._apply(streaming))
        self.caught_up = self.options.once and not self.stop.is_set()

    def _warm_up(self) -> None:
        from lakeslot.apply import warmup

        assert self.processes.spark is not None  # started before
        warmup.warm_up(self.processes.spark)

    def _control(self) -> tuple[list[TableName], int] | None:
        """The source steps (:func:`lakeslot.control.steps.take_control`): the usable tables and
        the LSN below which snapshots are void; None when stopped while waiting for staging."""
        attempt = 0
        while True:
            report = status_report.Report(PostgresIngestionStatus(tables=state.read_tables(self.local.state_dir)),
                                          0, datetime.now(UTC))
            job = self.local.job
            if not self.options.once:  # before the steps: a table created meanwhile is seen later
                self.selection.take_fingerprint()
            source = steps.take_control(
                job.source(self.local.environ), self.local.ingestion, report, component="local",
                reader=connection.application_name("reader", job.names.owner, self.processes.pod))
            log_events(report)
            failed = [c for c in report.status.conditions if c.status == "False"]
            if source is not None:
                break
            outage = next((c for c in failed if c.reason in OUTAGE_REASONS), None)
            if outage is None:
                code = (EXIT_FAILED if any(c.reason == "ConnectionFailed" for c in failed)
                        else EXIT_DEFINITE)
                raise RunFailed(code, "\n".join(f"{c.type}: {c.reason}: {c.message}" for c in failed))
            attempt += 1
            if not self.outages.wait("staging", f"{outage.type}: {outage.message}", attempt):
                return None
        tables = source.tables
        self.selection.adopt(report, tables)
        self.processes.target = source.current_lsn if self.options.once else None
        below = report.status.resnapshot_below_lsn
        return tables, state.resnapshot_below(self.local.state_dir,
                                              lsn_text.parse(below) if below else 0)

    def _snapshot(self, tables: list[TableName], below: int) -> None:
        from lakeslot.snapshot import job as snapshot_job

        copies = self.outages.retrying("catalog", lambda: self.schedule.start_copies(tables))
        if not copies:  # nothing to copy (snapshot.mode: never), or stopped while waiting
            return
        tables = copies
        job_input = self.local.with_tables(tables)
        progress = observe.snapshot_location(self.local)
        worker = self.processes.start("snapshot", lambda: snapshot_job.run(
            self.processes.spark, job_input, progress=progress, min_snapshot_lsn=below))
        self._supervise(lambda: not worker.alive)
        if worker.alive:  # stopping: cancel its Spark jobs until it gives up
            self.processes.end(worker)
            return
        result = worker.outcome()
        for table in result.tables:
            if table.error:
                log.warning("snapshot of %s failed: %s", table.source, table.error)
        self.snapshot_failed = {t.source: t for t in result.tables if t.state == "failed"}

    def _snapshot_failures(self, tables: list[TableName]) -> list[tuple[TableName, str, bool]]:
        """(table, why, transient) of each table whose snapshot failed and that has no mirror."""
        return [(t, f"snapshot failed: {failure.error}", failure.transient) for t in tables
                if t not in self.schedule.mirrored
                and (failure := self.snapshot_failed.get(t)) is not None]

    def _apply(self, tables: list[TableName]) -> None:
        if not self.options.once:
            self.apply.stream(self._tick)
            return
        result = self.apply.until_caught_up(tables, self._copy_again)
        applied = [(t.source, f"apply {t.state}: {t.error}", t.state == "retrying")
                   for t in result.tables if t.state in ("failed", "retrying")] if result else []
        unsnapshotted = self._snapshot_failures(self.selection.tables)
        if (applied or unsnapshotted) and not self.stop.is_set():
            raise _not_caught_up("not caught up", unsnapshotted, applied)

    # supervision -------------------------------------------------------------------------

    def _phase(self, name: str, action: Callable[[], None]) -> None:
        started = time.monotonic()
        try:
            action()
        finally:
            self.timings[name] = time.monotonic() - started

    def _supervise(self, done: Callable[[], bool], tick: Callable[[], object] | None = None) -> None:
        """Tick until ``done()`` or stopped: watch the reader, refresh the status when due (its
        share of the time), ``tick()``. A job thread's end or a stop is seen at once, not at the
        next tick, and the run goes on at once: no status is computed then (at 1,000 mirrors on
        a network catalog one took 20 s, which the apply job's start after the snapshot waited
        for); the next phase's first tick shows it when due, the run's end always."""
        while not self.stop.is_set() and not done():
            self.processes.check_reader()
            if tick is not None:
                tick()
            if self.live.due():
                self._refresh()
            self.processes.pause(self.options.interval)

    def _tick(self) -> None:
        last = self.live.last
        change = self.selection.watch(last.conditions if last else [])
        if change is not None:
            self.schedule.join(self.processes.spark, *change)
        self._copy_again()

    def _copy_again(self) -> Worker | None:
        """Start the copy the schedule wants now (:meth:`.schedule.Schedule.next_copy`), unless
        one is running: its worker, or None."""
        if self.processes.running("snapshot"):
            return None
        copy = self.schedule.next_copy(self.apply.passes)
        if copy is None:
            return None
        return self.processes.start("snapshot", functools.partial(
            self.schedule.copy, self.processes.spark, copy))

    def _refresh(self) -> None:
        status = self.live.refresh(self.processes.activity(), self.processes.target,
                                   self.apply.seconds, self.schedule.progress_read(self.apply.passes))
        if status is not None:
            self.selection.remember_positions(status)

    def shutdown(self) -> None:
        self.stop.set()
        self.apply.halt()
        self.selection.close()
        self.processes.shutdown()
        with contextlib.suppress(Exception):
            self.live.refresh_final(self.processes.final_activity(), self.processes.target,
                                    self.apply.seconds)
        self.live.close()


def _not_caught_up(what: str, *failures: list[tuple[TableName, str, bool]]) -> RunFailed:
    """The run's failure naming each table that did not get there, with why: exit 3 (a human
    must act) when every cause is definite, 1 when a transient one may pass on a rerun."""
    listed = [f for group in failures for f in group]
    code = EXIT_FAILED if any(transient for *_, transient in listed) else EXIT_DEFINITE
    return RunFailed(code, f"{what}: " + "; ".join(f"{t} {why}" for t, why, _ in listed) + (
        " (lakeslot status shows each table's state)"))
