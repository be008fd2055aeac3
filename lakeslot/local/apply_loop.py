"""The apply job of a local run, in the run's Spark session: until it has applied everything
sealed (``--once``), or streaming until the run stops.

Invariants:

- Streaming, the job handles the tables the schedule says (:meth:`.schedule.Schedule.apply_list`)
  and is restarted whenever they change: the pass it is in finishes first, commits included.
- A transient error that escapes the job's own retries (PostgreSQL restarted under its
  connection, an executor lost) restarts it after a backoff (1 s doubling, at most 30 s) while
  the run keeps supervising; it resumes from each table's ``lakeslot.lsn`` (DESIGN.md rule 3).
  Only failures in a row without a finished pass count. Staging or the catalog unreachable
  (:mod:`lakeslot.local.outages`) is waited out however long it lasts, each restart announced
  with what the run waits for: it never counts towards giving up.
- ``--once``: passes follow each other (:data:`ONCE_POLL_S` apart) until one starts after the
  reader sealed everything up to the target — that one as soon as supervision sees the reader
  done, without waiting out the pause; then, while a table is to be copied again
  (:meth:`.schedule.Schedule.next_copy`), it is copied and the passes start over.
- Every finished pass is counted and timed from reading its batch to the last table's commit
  (:meth:`ApplyLoop.point`, the job's hook): the schedule decides once per pass, the display shows
  the time.

Failure modes (:class:`~.processes.RunFailed`, exit 1): :data:`APPLY_RESTARTS` transient failures
(other than outages) in a row without a finished pass, any other error, the Spark JVM gone (a session cannot be
revived in this process), or the streaming job ending by itself — a supervisor's restart of the
run resumes it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

from lakeslot.api.naming import TableName
from lakeslot.exits import EXIT_FAILED
from lakeslot.local import outages
from lakeslot.local.config import Local
from lakeslot.local.outages import OUTAGE_ERRORS, Outages
from lakeslot.local.processes import FailureStreak, Processes, RunFailed, Worker
from lakeslot.local.schedule import Schedule
from lakeslot.observability import status_report

log = logging.getLogger("lakeslot.local")

ONCE_POLL_S = 1.0
APPLY_RESTARTS = 5  # transient apply-job failures in a row, no pass finished in between → give up
APPLY_BACKOFF_S, APPLY_BACKOFF_MAX_S = 1.0, 30.0

# The run's supervision loop: tick until done() or stopped (watch the reader, refresh the status,
# call tick).
Supervise = Callable[..., None]


class ApplyLoop:
    """The apply job, supervised (see the module docstring)."""

    def __init__(self, local: Local, processes: Processes, schedule: Schedule,
                 supervise: Supervise, outages: Outages) -> None:
        self.local, self.processes, self.schedule = local, processes, schedule
        self.supervise, self.outages = supervise, outages
        self.outage_attempts = 0  # the streaming job's outage restarts since it last finished a pass
        self.stop = processes.stop  # the run's
        self.apply_stop = threading.Event()  # the running job's
        # --once: everything is sealed or the job is halted: its next pass starts at once
        self.next_pass = threading.Event()
        self.passes = 0  # passes the apply job finished (a table is marked only by a pass)
        self.seconds: float | None = None  # the last pass: batch read → committed
        self._batch_started: float | None = None

    def point(self, name: str, table) -> None:
        """Counts the apply passes and times each from reading its batch to the last table's commit."""
        if name == "batch-read":
            self._batch_started = time.monotonic()
        elif name == "after-tables":
            self.passes += 1
            if self._batch_started is not None:
                self.seconds = time.monotonic() - self._batch_started

    def halt(self) -> None:
        """The running job finishes the commit it is making or stops before the next."""
        self.apply_stop.set()
        self.next_pass.set()

    def until_caught_up(self, tables: list[TableName], copy_again: Callable[[], Worker | None]):
        """``--once``: the job's result once everything sealed is applied and nothing is to be
        copied again (``copy_again`` starts a copy: its worker, or None); None when stopped."""
        from lakeslot.apply import job as apply_job

        job_input = self.local.with_tables(tables)
        hooks = apply_job.Hooks(point=self.point)
        self.schedule.apply_tables = tuple(tables)

        def until_sealed():
            while not self.apply_stop.is_set():
                sealed = self.processes.reader_done.is_set()
                result = apply_job.run(self.processes.spark, job_input, once=True,
                                       stop=self.apply_stop, hooks=hooks)
                if sealed:
                    return result
                self.next_pass.wait(ONCE_POLL_S)
            return None

        def sealed() -> None:  # (supervision watches the reader: reader_done is set there)
            if self.processes.reader_done.is_set():
                self.next_pass.set()

        while True:  # caught up, unless a table must be copied again: then once more
            worker = self.processes.start("apply", until_sealed)
            self.supervise(worker.finished, tick=sealed)
            result = None if worker.alive else worker.outcome()
            copying = None if self.stop.is_set() else copy_again()
            if copying is None:
                return result
            self.supervise(copying.finished)
            copying.outcome()

    def stream(self, tick: Callable[[], object]) -> None:
        """The apply job until stopped, restarted whenever the tables it must handle change: the
        pass it is in finishes first, commits included. ``tick``: each supervision tick's work."""
        from lakeslot.apply import job as apply_job

        hooks = apply_job.Hooks(point=self.point)
        failures = FailureStreak(APPLY_RESTARTS)
        while not self.stop.is_set():
            tables = self.schedule.apply_list()
            stop = threading.Event()
            self.apply_stop, self.schedule.apply_tables = stop, tables
            passes = self.passes
            worker = self.processes.start("apply", functools.partial(
                apply_job.run, self.processes.spark, self.local.with_tables(list(tables)),
                once=False, stop=stop, hooks=hooks))
            # (the lambda is called only within this iteration)
            self.supervise(lambda: not worker.alive or self.schedule.apply_list() != tables,  # noqa: B023
                           tick=tick)
            if self.stop.is_set():
                return
            if not worker.alive:
                self._ended(worker, failures, progressed=self.passes > passes)
                continue
            now = self.schedule.apply_list()
            changes = [f"{sign} {', '.join(map(str, sorted(which)))}" for sign, which in
                       (("+", set(now) - set(tables)), ("-", set(tables) - set(now))) if which]
            log.info("the apply job's tables change (%s): restarting it after its current pass",
                     "; ".join(changes))
            stop.set()
            self.supervise(worker.finished)
            if not worker.alive:
                worker.outcome()

    def _ended(self, worker: Worker, failures: FailureStreak, *, progressed: bool) -> None:
        """The streaming apply job ended by itself: restarted after a backoff when the error is
        transient, else the run ends (see the module docstring)."""
        from lakeslot.errors import transient_in_spark

        error = worker.error
        if error is None:
            raise RunFailed(EXIT_FAILED, "the apply job ended although no stop was requested")
        if self.processes.spark_exited():
            raise RunFailed(EXIT_FAILED, "the Spark JVM exited (killed?): lakeslot run resumes "
                            f"where the mirrors say when started again; last error: "
                            f"{type(error).__name__}: {status_report.first_line(error)}")
        what = f"{type(error).__name__}: {status_report.first_line(error)}"
        if isinstance(error, OUTAGE_ERRORS):
            self.outage_attempts = 1 if progressed else self.outage_attempts + 1
            delay = self.outages.announce(outages.kind(error), what, self.outage_attempts)
        elif not isinstance(error, transient_in_spark()) or failures.add(what, progressed=progressed):
            worker.outcome()  # raises RunFailed with the error
        else:
            delay = min(APPLY_BACKOFF_MAX_S, APPLY_BACKOFF_S * 2 ** (failures.count - 1))
            log.warning("the apply job failed transiently (%s); restarting it in %.0f s (failure "
                        "%d in a row without a finished pass)", what, delay, failures.count)
        until = time.monotonic() + delay
        self.supervise(lambda: time.monotonic() >= until)
