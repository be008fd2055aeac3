"""The chaos suite's parts: ``lakeslot run`` under a supervisor, a seeded concurrent workload, and
the faults injected into them.

- :class:`Supervisor` keeps one ``lakeslot run`` (a real process) running the way systemd or
  Kubernetes would: whenever it exits it is started again. Every exit is recorded; a run may
  exit by itself only where the fault says so (exit 1 after its Spark JVM was killed: a session
  cannot be revived in-process) — any other exit fails the test, since every other fault here is
  one the run must ride out, and none destroys data or changes the source's shape. A thread
  records every process below the run while it lives, so that the test can check that none of
  them outlives it — not even after ``kill -9``.
- :class:`Writer` runs :class:`ChaosWorkload` in a thread: the apply tests' workload (a TOASTed
  table with an odd name, key updates, a keyless ``REPLICA IDENTITY FULL`` table) plus
  transactions rolled back whole or to a savepoint, and large transactions on ``accounts``. A
  fault that breaks its connection (a restart, the source down) makes it reconnect and go on; the
  transaction in flight is lost to the source as well, so the source stays the truth.
- :data:`FAULTS` by name (:func:`inject`). A fault's timing and length come from the seeded
  random: the delay before it, and for outages how long they last. Those are the faults' own
  parameters, not waits for the system to settle; every wait *for* something polls its condition
  with a deadline.

A seed reproduces the workload's choices, the order of faults and their timing parameters; the
interleaving with the pipeline's own timing (where in a pass a kill lands) varies from run to run.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import Rollback, sql

from lakeslot.api.naming import TableName
from lakeslot.local import pgcluster, state
from lakeslot.local.tree import alive, descendants
from lakeslot.mirror import progress as mirror_progress
from lakeslot.staging import apply_status
from lakeslot.staging.store import Staging
from tests.support import apply_workload, local_support
from tests.support.fixtures_pg import Database
from tests.support.waiting import wait_for

ACCOUNTS_ROWS = 5_000
LARGE_TRANSACTION_ROWS = 3_000  # rows one large transaction changes (many segments' worth)
STOP_DEADLINE_S = 180  # a SIGTERMed run stops within this (it finishes an apply pass first)
SPARK_JVM = b"org.apache.spark.deploy.SparkSubmit"
PACE_S = 0.05  # between two units of work: the writer leaves the 2 cores to the pipeline too


class ChaosWorkload(apply_workload.Workload):
    """The apply tests' workload plus rollbacks, savepoints and large transactions."""

    def rolled_back(self) -> None:
        """A transaction that changes rows and is rolled back whole: nothing of it is streamed."""
        with self.conn.transaction():
            self.transaction(self.rng.randint(1, 3))
            raise Rollback

    def savepoints(self) -> None:
        """Changes, a savepoint whose changes are rolled back, more changes, committed."""
        with self.conn.transaction():
            self.update_small()
            with self.conn.transaction():  # a savepoint
                self.insert()
                self.update_key()
                raise Rollback  # to the savepoint only
            self.update_keyless()
            self.insert()

    def large(self) -> None:
        """One transaction changing thousands of accounts rows (and a TOASTed row)."""
        start = self.rng.randint(1, ACCOUNTS_ROWS - LARGE_TRANSACTION_ROWS)
        with self.conn.transaction():
            self.conn.execute("UPDATE accounts SET balance = balance + 1, changed = now() "
                              "WHERE id BETWEEN %s AND %s",
                              (start, start + LARGE_TRANSACTION_ROWS - 1))
            self.update_big()

    def step(self) -> None:
        """One random unit of work."""
        roll = self.rng.random()
        if roll < 0.01:
            self.large()
        elif roll < 0.10:
            self.rolled_back()
        elif roll < 0.18:
            self.savepoints()
        else:
            self.transaction(self.rng.randint(1, 4))


def create_tables(conn) -> None:
    apply_workload.create_tables(conn, rows=200)
    local_support.create_accounts(conn, ACCOUNTS_ROWS)


# The many-tables round's small tables: a pass commits to each one it has changes for, table
# after table, so a fault often strikes between two tables' commits of one pass; a transaction
# of ManyTablesWorkload changes several of them at once.
MANY_TABLES = [TableName("public", f"many {i:02d}")
               for i in range(int(os.environ.get("LAKESLOT_CHAOS_MANY_TABLES", "12")))]
MANY_ROWS = 50


def create_many_tables(conn) -> None:
    for table in MANY_TABLES:
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int NOT NULL)").format(table.sql()))
        conn.execute(sql.SQL("INSERT INTO {} SELECT g, 0 FROM generate_series(1, %s) g").format(table.sql()),
                     (MANY_ROWS,))


class ManyTablesWorkload(ChaosWorkload):
    """:class:`ChaosWorkload`, and every other unit a transaction updating a row in each of up
    to three of :data:`MANY_TABLES`."""

    def step(self) -> None:
        super().step()
        if MANY_TABLES and self.rng.random() < 0.5:
            with self.conn.transaction():
                for table in self.rng.sample(MANY_TABLES, min(3, len(MANY_TABLES))):
                    self.conn.execute(sql.SQL("UPDATE {} SET v = v + 1 WHERE id = %s").format(table.sql()),
                                      (self.rng.randint(1, MANY_ROWS),))


class Writer:
    """:class:`ChaosWorkload` (or ``workload``, a lighter kind of it) in a thread until
    :meth:`stop` (which re-raises its error)."""

    def __init__(self, db, seed: int, workload: type[ChaosWorkload] = ChaosWorkload) -> None:
        self.db, self.rng, self.workload = db, random.Random(seed), workload
        self.stopping = threading.Event()
        self.done = self.lost = 0  # units committed (or rolled back on purpose); lost to faults
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="chaos-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        workload: ChaosWorkload | None = None
        try:
            while not self.stopping.is_set():
                try:
                    if workload is None:
                        workload = self.workload(self.db.connect(), self.rng)
                    workload.step()
                    self.done += 1
                    self.stopping.wait(PACE_S)
                except (psycopg.OperationalError, psycopg.Rollback) as e:
                    # the source restarts or is down: reconnect (a Rollback to a savepoint
                    # escapes when the connection broke while rolling back: the unit is lost)
                    if isinstance(e, psycopg.Rollback) and (workload is None or not workload.conn.broken):
                        raise
                    self.lost += 1
                    if workload is not None:
                        with contextlib.suppress(psycopg.Error):
                            workload.conn.close()
                    workload = None
                    self.stopping.wait(0.2)  # the pace of reconnection attempts
        except BaseException as e:  # noqa: BLE001 - re-raised by stop()
            self.error = e
        finally:
            if workload is not None:
                workload.conn.close()

    def stop(self) -> int:
        self.stopping.set()
        self.thread.join(120)
        assert not self.thread.is_alive(), "the writer did not stop"
        if self.error is not None:
            raise self.error
        return self.done


@dataclass
class Supervisor:
    """One ``lakeslot run`` kept running (see the module docstring)."""

    path: Path
    db: Database
    state_dir: Path
    log: Path
    environ: dict[str, str] = field(default_factory=dict)  # further variables of every run
    process: subprocess.Popen | None = None
    exits: Counter = field(default_factory=Counter)  # exit code → how often
    expected: set[int] = field(default_factory=set)  # exit codes the current fault may cause
    seen: set[int] = field(default_factory=set)  # every process ever seen below a run
    _sampling: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.process = local_support.spawn_run(self.path, self.db, self.state_dir, self.log, environ=self.environ)
        if not hasattr(self, "_sampler"):
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()

    def _sample(self) -> None:
        while not self._sampling.wait(0.3):
            process = self.process
            if process is not None and process.poll() is None:
                self.seen |= descendants(process.pid)

    @property
    def run(self) -> subprocess.Popen:
        assert self.process is not None
        return self.process

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def ensure_running(self) -> bool:
        """Start the run again if it exited (recording how); True (for use in wait_for)."""
        code = self.run.poll()
        if code is not None:
            self._exited(code)
            self.start()
        return True

    def _exited(self, code: int) -> None:
        """The run exited by itself: only as the current fault says it may (a dead Spark JVM:
        exit 1, for a supervisor to start it again); anything else is a failure."""
        self.exits[code] += 1
        assert code in self.expected, f"lakeslot run exited {code} by itself:\n{self.tail()}"
        self.expected.discard(code)

    def replace(self, stop: Callable[[subprocess.Popen], int]) -> int:
        """Stop the run with ``stop`` (returns its exit code), record it, start a new one."""
        self.seen |= descendants(self.run.pid)
        code = stop(self.run)
        self.exits[code] += 1
        self.start()
        return code

    def finish(self, signum: int = signal.SIGTERM) -> None:
        """SIGTERM the run (or ``signum``: SIGINT is Ctrl-C): it must exit 0."""
        if self.run.poll() is None:
            self.seen |= descendants(self.run.pid)
            self.run.send_signal(signum)
            assert self.run.wait(STOP_DEADLINE_S) == 0, self.tail()

    def once(self, deadline: float) -> int:
        """``lakeslot run --once`` (catch up, then exit), its processes sampled too."""
        self.process = local_support.spawn_run(self.path, self.db, self.state_dir, self.log, "--once",
                                               environ=self.environ)
        try:
            return self.process.wait(deadline)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"lakeslot run --once did not finish:\n{self.tail()}") from None

    def close(self) -> None:
        """Stop sampling (after the last run)."""
        self._sampling.set()

    @contextlib.contextmanager
    def abandoned_on_failure(self) -> Iterator[None]:
        """On a failure inside: SIGKILL every process a run started that is still alive (else a
        failed test leaves a run streaming, holding its slot and loading the machine for the
        tests after it — seen after a soak's failed round), then let the failure through."""
        try:
            yield
        except BaseException:
            self.close()
            pids = set(self.seen)
            if self.process is not None:
                pids |= {self.process.pid} | descendants(self.process.pid)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise

    def current_reader(self) -> int:
        """The pid of this run's reader once it runs (0 until then)."""
        info = state.read_run(self.state_dir)
        pid = info.get("readerPid")
        if info.get("pid") == self.run.pid and isinstance(pid, int) and alive({pid}):
            return pid
        return 0

    def spark_jvm(self) -> int:
        """The pid of this run's Spark JVM once it runs (0 until then)."""
        for pid in sorted(descendants(self.run.pid)):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if SPARK_JVM in f.read():
                        return pid
            except OSError:
                continue
        return 0


def applied_past(local, tables, position: int, secrets: dict[str, str] | None = None) -> bool:
    """Every mirror of ``tables`` has committed and reflects ``position`` or later: its
    ``lakeslot.lsn``, or the apply job's status document says it is covered that far
    (:mod:`lakeslot.apply.coverage`); False while unreadable. ``secrets``: the catalog's."""
    try:
        covered = apply_status.covered(Staging(local.ingestion.spec.staging.uri).read_apply_status())
        progress = mirror_progress.read(local.ingestion, tables, secrets=secrets, covered=covered)
    except Exception:  # noqa: BLE001 - no mirror yet, a commit in flight or a fault: read again later
        return False
    return all(p.lsn is not None and p.lsn >= position for p in progress.values())


# the faults ---------------------------------------------------------------------------------

@dataclass
class Context:
    supervisor: Supervisor
    cluster: pgcluster.Cluster
    slot: str
    staging: Path  # a tmpfs mount (:func:`staging_on_tmpfs`) when staging_full may strike
    warehouse: Path  # local mode's hadoop catalog: tables' metadata and data under it
    wal_sender_timeout_s: float
    rng: random.Random


def _sigkill(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGKILL)
    return process.wait()


def _sigterm(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGTERM)
    code = process.wait(STOP_DEADLINE_S)
    assert code == 0, f"a SIGTERMed run must stop cleanly (exit 0), got {code}"
    return code


def kill_run(c: Context) -> str:
    c.supervisor.replace(_sigkill)
    return "SIGKILL of lakeslot run"


def sigterm_run(c: Context) -> str:
    c.supervisor.replace(_sigterm)
    return "SIGTERM of lakeslot run"


def kill_reader(c: Context) -> str:
    pid = wait_for(c.supervisor.current_reader, "the run's reader", deadline=120)
    os.kill(pid, signal.SIGKILL)
    return f"SIGKILL of the reader (pid {pid})"


def kill_spark_jvm(c: Context) -> str:
    pid = wait_for(c.supervisor.spark_jvm, "the run's Spark JVM", deadline=120)
    c.supervisor.expected = {1}  # the run cannot revive its session: it exits 1
    os.kill(pid, signal.SIGKILL)
    return f"SIGKILL of the Spark JVM (pid {pid})"


def terminate_walsender(c: Context) -> str:
    def holder() -> int:
        with c.cluster.connect() as conn:
            row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                               (c.slot,)).fetchone()
        return row[0] if row and row[0] else 0

    pid = wait_for(holder, "the walsender holding the slot", deadline=120)
    with c.cluster.connect() as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return f"pg_terminate_backend of the walsender (pid {pid})"


def restart_fast(c: Context) -> str:
    c.cluster.restart("fast")
    return "PostgreSQL fast restart"


def restart_immediate(c: Context) -> str:
    c.cluster.restart("immediate")
    return "PostgreSQL immediate restart (crash recovery)"


def source_down(c: Context) -> str:
    """The source stopped for longer than wal_sender_timeout."""
    seconds = c.rng.uniform(1.2, 2.5) * c.wal_sender_timeout_s
    c.cluster.stop("fast")
    try:
        time.sleep(seconds)  # the outage's length (a fault parameter)
    finally:
        c.cluster.resume()
    return f"source down for {seconds:.1f} s"


def reader_frozen(c: Context) -> str:
    """The reader stops answering (a network partition, seen from PostgreSQL): SIGSTOP until the
    walsender gave up on it after wal_sender_timeout, then SIGCONT."""
    pid = wait_for(c.supervisor.current_reader, "the run's reader", deadline=120)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _slot_released(c), "the walsender to time out on the frozen reader",
                 deadline=c.wal_sender_timeout_s * 6)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    return f"reader frozen (SIGSTOP) past wal_sender_timeout (pid {pid})"


def _slot_released(c: Context) -> bool:
    with c.cluster.connect() as conn:
        row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                           (c.slot,)).fetchone()
    return row is not None and not row[0]


@contextlib.contextmanager
def immutable(*paths: Path) -> Iterator[None]:
    """``paths`` immutable (``chattr +i``: even root cannot create, rename or delete in a
    directory so marked; reading goes on) while the block runs."""
    subprocess.run(["chattr", "+i", *map(str, paths)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True)


def staging_unwritable(c: Context) -> str:
    """The staging directory immutable (:func:`immutable`) for a while: seals and retention
    fail, reads go on."""
    seconds = c.rng.uniform(3, 10)
    with immutable(c.staging):
        time.sleep(seconds)  # the outage's length (a fault parameter)
    return f"staging unwritable for {seconds:.1f} s"


def staging_full(c: Context) -> str:
    """The staging filesystem full for a while: the tmpfs under staging shrunk to what it holds
    (writes fail with ENOSPC; renames, reads and deletes go on), then given its size back. It
    lasts its seeded length and at least until the run noticed it (:func:`_until_noticed`); while
    it waits, it is shrunk again to what is left (retention deletes applied segments, and the
    space they free would otherwise let the reader's writes succeed: no attempt ever failed, in
    one CI run, for 300 s)."""
    assert os.path.ismount(c.staging), f"{c.staging} is not a tmpfs (see staging_on_tmpfs)"
    seconds = c.rng.uniform(3, 10)
    marks = _log_sizes(c)
    full = wait_for(lambda: shrink_to_used(c.staging), "the staging tmpfs to be made full")
    try:
        noticed = _until_noticed(c, marks, seconds, hold=lambda: shrink_to_used(c.staging))
    finally:
        restore_size(c.staging)
    return f"staging full (ENOSPC, {full >> 10} KiB used) for {noticed:.1f} s"


def shrink_to_used(mount: Path) -> int:
    """Remount ``mount`` at the size it uses (0 when a write raced it and the remount failed)."""
    stat = os.statvfs(mount)
    used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
    return used if _remount(mount, f"size={max(used, stat.f_frsize)}", check=False) else 0


def _remount(mount: Path, size: str, check: bool = True) -> bool:
    done = subprocess.run(["mount", "-o", f"remount,{size}", str(mount)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0 or not check, f"remounting {mount} {size}: {done.stderr}"
    return done.returncode == 0


STAGING_TMPFS = "1g"  # the staging tmpfs's size outside the fault (it holds unapplied segments)


def restore_size(mount: Path) -> None:
    """The staging tmpfs back at its size outside the fault (writes succeed again)."""
    _remount(mount, f"size={STAGING_TMPFS}")


@contextlib.contextmanager
def staging_on_tmpfs(staging: Path) -> Iterator[None]:
    """Staging on a tmpfs of its own (staging_full needs a filesystem that can be made full);
    fails with mount's message where mounting is impossible (it needs CAP_SYS_ADMIN)."""
    staging.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STAGING_TMPFS}", "tmpfs",
                           str(staging)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"staging_full needs a tmpfs for staging: {done.stderr}"
    try:
        yield
    finally:
        subprocess.run(["umount", "--lazy", str(staging)], check=True)


def catalog_down(c: Context) -> str:
    """The Iceberg catalog unavailable for a while. Local mode's catalog is a hadoop catalog: the
    warehouse directory, each table's metadata (``metadata/``: the versions' JSON files and the
    version hint) beneath it. The warehouse and every ``metadata`` directory are made immutable
    (``chattr +i``: even root cannot create, rename or delete in them), so every commit and every
    table creation fails; reading the committed tables goes on. The outage lasts its seeded
    length and at least until the run noticed it (:func:`_until_noticed`)."""
    seconds = c.rng.uniform(5, 15)
    frozen = [c.warehouse, *sorted(p for p in c.warehouse.rglob("metadata") if p.is_dir())]
    marks = _log_sizes(c)
    with immutable(*frozen):
        noticed = _until_noticed(c, marks, seconds)
    return f"Iceberg catalog unavailable (metadata immutable) for {noticed:.1f} s"


NOTICE_DEADLINE_S = 300  # an outage must be noticed within this (an apply pass takes up to ~1 min)


def _log_sizes(c: Context) -> dict[Path, int]:
    """Where the run's and its reader's logs end now (see :func:`_until_noticed`)."""
    logs = [c.supervisor.log, c.supervisor.state_dir / "reader.log"]
    return {log: log.stat().st_size if log.exists() else 0 for log in logs}


def _until_noticed(c: Context, marks: dict[Path, int], seconds: float,
                   hold: Callable[[], object] | None = None) -> float:
    """Hold an outage for ``seconds`` (its seeded length), and then until the run's or its
    reader's log has a warning or error past ``marks`` (an attempt failed on it: a fault that
    struck between two attempts would test nothing); how long it lasted. ``hold``, when given,
    runs before every look (to keep the outage in force while waiting)."""
    started = time.monotonic()
    time.sleep(seconds)  # the outage's length (a fault parameter)

    def noticed() -> bool:
        if hold is not None:
            hold()
        for log, mark in marks.items():
            with open(log, "rb") as f:
                f.seek(mark)
                if any(word in line for line in f for word in NOTICED):
                    return True
        return False

    wait_for(noticed, "the run or its reader to notice the outage (a warning in a log)",
             deadline=NOTICE_DEADLINE_S, interval=0.5)
    return time.monotonic() - started


NOTICED = (b" WARNING ", b" ERROR ", b'"level": "warning"', b'"level": "error"')


FAULTS: dict[str, Callable[[Context], str]] = {f.__name__: f for f in (
    kill_run, kill_reader, kill_spark_jvm, sigterm_run, terminate_walsender, restart_fast,
    restart_immediate, source_down, reader_frozen, staging_unwritable, staging_full,
    catalog_down)}


def schedule(rng: random.Random, rounds: int, offset: int,
             only: list[str] | None = None) -> list[str]:
    """The fault of each round: every kind (of ``only``, default all) once per that many rounds,
    in a seeded order, starting at ``offset`` (so two short runs with offsets 0 and len/2 cover
    every kind)."""
    kinds = sorted(only or FAULTS)
    assert set(kinds) <= set(FAULTS), f"unknown faults: {set(kinds) - set(FAULTS)}"
    return cycle(rng, kinds, rounds, offset)


def cycle(rng: random.Random, kinds, rounds: int, offset: int = 0) -> list[str]:
    """``rounds`` of ``kinds``, each once per that many rounds, in a seeded order from ``offset``."""
    order = sorted(kinds)
    rng.shuffle(order)
    return [order[(offset + i) % len(order)] for i in range(rounds)]

