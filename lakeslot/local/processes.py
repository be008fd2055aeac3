"""What a local run starts and must stop: the reader child, the Spark session, and the threads
that run the jobs in that session.

Invariants:

- Two readers never fight over the slot: the reader an earlier run left behind (named in the
  state directory, :mod:`.reader_process`) is stopped before this run's first one starts, and
  ``run.json`` names the current one (with the ``--once`` target).
- The reader is restarted whenever it ends without a definite error (crash, retries exhausted,
  killed). Only failures *in a row without progress* count — progress meaning that staging's
  sealed end moved during that reader's life —, and after :data:`READER_RESTARTS` of them the run
  gives up naming the last failure (its status file's reason, or the signal that killed it). A
  reader that dies now and then but streams in between is restarted for ever. With ``--once``, a
  reader that exits 0 has sealed everything up to the target (:attr:`Processes.reader_done`).
- The Spark session is the caller's (left running at the end) or the run's own, started after
  the reader (so WAL is released while the JVM starts), with Spark's own log in ``spark.log`` of
  the state directory. SIGINT stays the run's (PySpark takes it for itself otherwise).
- A job runs in a thread (:class:`Worker`) with the session active in it; its exception is kept
  and raised as :class:`RunFailed` by :meth:`Worker.outcome`.
- Nothing outlives :meth:`Processes.shutdown`: the reader gets SIGTERM (it confirms only what is
  sealed, then releases the slot); each job thread is waited for, a running snapshot's Spark
  jobs cancelled until it gives up (its temporary slot goes with its transaction); the run's own
  JVM is stopped, and every process started since the run began is waited for
  (:data:`STOP_TIMEOUT_S`), then terminated.

Failure modes: :class:`RunFailed` — exit 3 when the reader stopped with a definite error, exit 1
when it kept failing without progress or a job thread failed. Staging that cannot be listed
counts as no progress (a warning says so).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.exits import EXIT_DEFINITE, EXIT_FAILED
from lakeslot.local import observe, reader_process, state, tree
from lakeslot.local.config import Local
from lakeslot.observability import status_report
from lakeslot.staging.store import Staging

if TYPE_CHECKING:  # pyspark is imported only once a run needs Spark
    from pyspark.sql import SparkSession

log = logging.getLogger("lakeslot.local")

READER_RESTARTS = 5  # reader failures in a row, nothing sealed in between → give up
STOP_TIMEOUT_S = 60.0


class RunFailed(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


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


def stopper(stop: threading.Event, woken: threading.Event) -> Callable[[int, object], None]:
    """A signal handler that sets ``stop``, and ``woken`` so that supervision sees it at once."""
    def handler(signum: int, _frame: object) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()
        woken.set()
    return handler


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


class Processes:
    """The reader child, the Spark session and the job threads of one run (see the module
    docstring). ``spark``: the caller's session (None: the run starts and stops its own)."""

    def __init__(self, local: Local, stop: threading.Event, woken: threading.Event,
                 staging: Staging, *, master: str, spark: SparkSession | None = None) -> None:
        self.local, self.stop, self.woken, self.staging = local, stop, woken, staging
        self.master = master
        self.given = spark
        self.spark: SparkSession | None = None  # once started (start_spark)
        self.pod = reader_process.pod_identity()
        self.reader: reader_process.ReaderProcess | None = None
        self.reader_failures = FailureStreak(READER_RESTARTS)
        self.reader_from: int | None = None  # where staging ended when the reader started
        self.reader_done = threading.Event()  # --once: everything up to the target is sealed
        self.target: int | None = None  # --once: where the reader stops
        self.workers: dict[str, Worker] = {}
        self.before = tree.descendants(os.getpid())

    # the reader ----------------------------------------------------------------------------

    def stop_orphaned_reader(self) -> None:
        """The reader an earlier run left behind, if it still runs (see
        :mod:`.reader_process`); called before the first reader of this run starts."""
        earlier = state.read_run(self.local.state_dir)
        pid, pod = earlier.get("readerPid"), earlier.get("pod")
        if isinstance(pid, int) and isinstance(pod, str) and pid != os.getpid() \
                and reader_process.stop_orphan(pid, pod):
            log.warning("the reader of an earlier run (pid %d) outlived it: stopped it", pid)

    def start_reader(self) -> None:
        self.reader_from = self.sealed_end()
        self.reader = reader_process.spawn(self.local, pod=self.pod, stop_at=self.target)
        state.write_run(self.local.state_dir, readerPid=self.reader.pid, pod=self.pod,
                        onceTarget=None if self.target is None else lsn_text.format(self.target))
        log.info("reader started (pid %d)%s", self.reader.pid,
                 f", stopping at {lsn_text.format(self.target)}" if self.target is not None else "")
        if hasattr(os, "waitid"):  # (not on macOS before Python 3.13: the next tick sees it)
            threading.Thread(target=self._wake_on_exit, args=(self.reader.pid,),
                             name="lakeslot-reader-exit", daemon=True).start()

    def _wake_on_exit(self, pid: int) -> None:
        """Wakes supervision (:attr:`woken`) when the reader ``pid`` exits: waits without reaping
        it (its ``Popen`` does); ECHILD when that was quicker."""
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        self.woken.set()

    def check_reader(self) -> None:
        """Restart a reader that ended (see the module docstring), or give up."""
        reader = self.reader
        assert reader is not None  # the run starts the reader before anything is supervised
        code = reader.poll()
        if code is None:
            return
        if code == 0 and self.target is not None:
            if not self.reader_done.is_set():
                log.info("the reader sealed everything up to %s", lsn_text.format(self.target))
                self.reader_done.set()
            return
        outcome = reader.outcome()
        if code == EXIT_DEFINITE:
            raise RunFailed(EXIT_DEFINITE, f"the reader stopped with a definite error "
                            f"({outcome.get('reason')}): {outcome.get('message')}")
        what = reader_process.describe_exit(code, outcome)
        end = self.sealed_end()
        progressed = end is not None and self.reader_from is not None and end > self.reader_from
        if self.reader_failures.add(what, progressed=progressed):
            raise RunFailed(EXIT_FAILED, f"the reader failed {self.reader_failures.count} times "
                            f"in a row without sealing anything in between; last: {what} "
                            f"(log: {reader.log_file})")
        log.warning("the reader ended (%s)%s; restarting it (it resumes from staging)", what,
                    "" if progressed else f", failure {self.reader_failures.count} in a row "
                    "without progress")
        self.start_reader()

    def sealed_end(self) -> int | None:
        """Where durable data ends in staging (the furthest sealed segment's end; 0 when empty),
        None when staging cannot be read now. The reader seals at least every
        ``segment_max_seconds`` while WAL moves, idle or not, so a streaming reader moves it."""
        try:
            last = self.staging.resume_point()
        except OSError as e:
            log.warning("cannot list staging now: %s", status_report.first_line(e))
            return None
        return 0 if last is None else last.end

    # Spark and the job threads ------------------------------------------------------------------

    def start_spark(self, tables: list[TableName]) -> None:
        self.spark = self.given or spark_session(self.local, tables, master=self.master)
        if self.given is None and threading.current_thread() is threading.main_thread():
            # PySpark's SparkContext takes SIGINT for itself (cancel jobs, KeyboardInterrupt in
            # whatever the main thread does): Ctrl-C must stop the run in order instead.
            signal.signal(signal.SIGINT, stopper(self.stop, self.woken))

    def start(self, name: str, target: Callable[[], object]) -> Worker:
        """Run ``target`` in a thread with the run's session active (one worker per name)."""
        spark = self.spark
        assert spark is not None  # the run starts the session before any job

        def in_session() -> object:
            # SQL conf (the Iceberg catalog) is the JVM thread's active session's: a new
            # thread has none until it is set.
            from lakeslot.spark.session import make_active

            make_active(spark)
            return target()

        worker = Worker(name, in_session, on_end=self.woken.set)
        self.workers[name] = worker
        return worker

    def pause(self, seconds: float) -> None:
        """Supervision's wait between two ticks: ``seconds``, or less when something it waits for
        may have happened (:attr:`woken`: a job thread or the reader ended, the run is
        stopping)."""
        self.woken.wait(seconds)
        self.woken.clear()

    def running(self, name: str) -> bool:
        worker = self.workers.get(name)
        return worker is not None and worker.alive

    def end(self, worker: Worker) -> None:
        """Wait for ``worker`` to end; a snapshot's Spark jobs are cancelled until it gives up."""
        while worker.alive:
            if self.spark is not None and worker.name == "snapshot":
                self.spark.sparkContext.cancelAllJobs()
            worker.join(1.0)

    def spark_exited(self) -> bool:
        """True when this run's own Spark JVM has exited (a caller's session is not watched)."""
        if self.spark is None or self.given is not None:
            return False
        process = getattr(self.spark.sparkContext._gateway, "proc", None)
        return process is not None and process.poll() is not None

    # what runs, for the status ------------------------------------------------------------------

    def activity(self) -> observe.Activity:
        apply = self.workers.get("apply")
        return observe.Activity(
            run_active=True, reader_pod=self.pod,
            reader_running=self.reader is not None and (self.reader.poll() is None
                                                        or self.reader_done.is_set()),
            reader_outcome=self.reader.outcome() if self.reader else {},
            apply_problem=None if apply is not None and apply.alive else
            "the apply job has not started yet" if apply is None else "the apply job finished")

    def final_activity(self) -> observe.Activity:
        return observe.Activity(run_active=False, reader_outcome=self.reader.outcome()
                                if self.reader else {})

    def shutdown(self) -> None:
        """Stop everything this run started (see the module docstring); the stop event is set."""
        if self.reader is not None:
            code = self.reader.stop()
            log.info("reader stopped (exit %s)", code)
        for worker in self.workers.values():
            self.end(worker)
        if self.spark is not None and self.given is None:
            stop_spark(self.spark)
            # Spark's Python workers die with its JVM, a moment later: wait for everything this
            # run started (a caller's own session and processes are left alone).
            left = tree.wait_gone(tree.descendants(os.getpid()) - self.before, STOP_TIMEOUT_S)
            if left:
                log.warning("processes %s did not exit by themselves and were terminated",
                            sorted(left))


class Worker:
    """A thread whose exception is re-raised (as :class:`RunFailed`) by :meth:`outcome`.
    ``on_end`` is called once its outcome is kept and it counts as ended (:attr:`alive` false),
    so whoever it wakes sees the end."""

    def __init__(self, name: str, target: Callable[[], object],
                 on_end: Callable[[], object]) -> None:
        self.name = name
        self._result: dict = {}
        self._ended = threading.Event()

        def body() -> None:
            try:
                self._result["value"] = target()
            except BaseException as e:
                log.exception("%s failed", name)
                self._result["error"] = e
            finally:
                self._ended.set()
                on_end()

        self._thread = threading.Thread(target=body, name=f"lakeslot-{name}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return not self._ended.is_set()

    def finished(self) -> bool:
        return self._ended.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def error(self) -> BaseException | None:
        return self._result.get("error")

    def outcome(self):
        if "error" in self._result:
            error = self._result["error"]
            raise RunFailed(EXIT_FAILED, f"{self.name} failed: {type(error).__name__}: "
                            f"{status_report.first_line(error)}") from error
        return self._result.get("value")
