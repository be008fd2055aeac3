"""``lakeslot run`` under the faults production brings, one at a time (the randomized mix is in
``tests/chaos/``): real PostgreSQL, the reader as a real child process, Spark + Iceberg.

- A table whose snapshot failed with a definite error makes ``--once`` exit 3 naming it, and
  ``lakeslot status`` shows it ``Failed`` with the error (not ``Pending`` without a word).
- A reader that dies now and then but streams in between is restarted for ever; only failures in
  a row without anything sealed in between stop the run, naming the last one.
- A reader that outlived its run (kill -9 of the run) is stopped by the next run before that one
  starts its own reader: two readers never fight over the slot.
- A PostgreSQL restart under a streaming run's apply job: the job is restarted, the run goes on.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading

import pytest

from lakeslot.api.naming import TableName
from lakeslot.exits import EXIT_DEFINITE
from lakeslot.local import apply_loop, observe, processes, reader_process, run, state
from lakeslot.local.tree import alive
from lakeslot.mirror import progress as mirror_progress
from lakeslot.staging.store import Staging
from tests.support import local_support
from tests.support.apply_support import lsn_now
from tests.support.waiting import wait_for

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

KEYLESS = TableName("public", "keyless")
DEADLINE_S = 300


def _ingestion(db, tmp_path, warehouse, *, keyless: bool = False):
    path = tmp_path / "ingestion.yaml"
    tables = [local_support.ACCOUNTS, *([KEYLESS] if keyless else [])]
    source = {"tables": [{"schema": "public", "name": "accounts"}, *(
        [{"schema": "public", "name": "keyless", "keyColumns": ["k"]}] if keyless else [])]}
    local_support.write_ingestion(path, db, tables, tmp_path, source=source, warehouse=warehouse)
    return local_support.local(path, db, tmp_path / "state")


def _run(local, spark, *, once: bool) -> run.Result:
    """``lakeslot run`` in this process on the tests' Spark session, whatever its exit code."""
    return run.run(local, run.Options(once=once, spark=spark, out=io.StringIO(), interactive=False))


def _sealed_end(local) -> int:
    last = Staging(local.ingestion.spec.staging.uri).resume_point()
    return 0 if last is None else last.end


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)
def test_once_exits_3_and_status_says_why_when_a_snapshot_failed_definitely(
        pgdb, tmp_path, spark, spark_warehouse):
    with pgdb.connect() as conn:
        local_support.create_accounts(conn, 200)
        conn.execute("CREATE TABLE keyless (k int NOT NULL, v text)")
        conn.execute("ALTER TABLE keyless REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO keyless VALUES (1, 'a'), (1, 'b'), (2, 'c')")  # k not unique
    local = _ingestion(pgdb, tmp_path, spark_warehouse, keyless=True)

    result = _run(local, spark, once=True)

    assert result.code == EXIT_DEFINITE, result.message
    assert "public.keyless snapshot failed" in result.message and "not unique" in result.message
    assert "public.accounts" not in result.message  # it caught up
    status = observe.observe(local, observe.activity(local))
    rows = {TableName(r.schema_name, r.name): r for r in status.tables}
    assert rows[KEYLESS].state == "Failed"
    assert "snapshot failed" in rows[KEYLESS].message and "not unique" in rows[KEYLESS].message
    assert rows[local_support.ACCOUNTS].state == "Streaming"


def test_only_failures_without_progress_in_between_stop_the_reader():
    streak = processes.FailureStreak(processes.READER_RESTARTS)
    for _ in range(3 * processes.READER_RESTARTS):  # each after progress: never given up
        assert not streak.add("killed by SIGKILL", progressed=True)
    assert streak.count == 1
    for _ in range(processes.READER_RESTARTS - 1):
        assert not streak.add("killed by SIGKILL", progressed=False)
    assert streak.add("exit 1, Crashed: OSError: disk full", progressed=False)
    assert streak.count == processes.READER_RESTARTS + 1
    assert streak.last == "exit 1, Crashed: OSError: disk full"
    assert reader_process.describe_exit(-9, {}) == "killed by SIGKILL"
    assert reader_process.describe_exit(1, {}) == "exit 1 without a status file (see its log)"
    assert reader_process.describe_exit(1, {"reason": "RetriesExhausted", "message": "m"}) \
        == "exit 1, RetriesExhausted: m"


@pytest.mark.slow
@pytest.mark.parametrize("pg", ["pg18"], indirect=True)
def test_a_reader_killed_more_often_than_the_restart_limit_streams_on(
        pgdb, tmp_path, spark, spark_warehouse):
    with pgdb.connect() as conn:
        local_support.create_accounts(conn, 200)
    local = _ingestion(pgdb, tmp_path, spark_warehouse)
    workload = local_support.Workload(pgdb, [local_support.ACCOUNTS], {local_support.ACCOUNTS: "balance"})
    killed: list[int] = []

    def during() -> list[int]:
        for _ in range(processes.READER_RESTARTS + 2):  # one more than the limit, each after progress
            pid = wait_for(lambda: _new_reader(local, killed), "the reader (re)started",
                           deadline=DEADLINE_S)
            assert pid > 0, "the run gave up restarting its reader"
            start = _sealed_end(local)
            wait_for(lambda: _sealed_end(local) > start, "the reader to seal a segment",  # noqa: B023
                     deadline=DEADLINE_S)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return [wait_for(lambda: _new_reader(local, killed), "the reader restarted once more",
                         deadline=DEADLINE_S)]

    try:
        result, last = local_support.run_in_process(local, spark, once=False, during=during)
    finally:
        workload.stop()
    assert result.code == 0 and last and last[0] not in killed
    assert alive(set(killed)) == set()


def _new_reader(local, killed: list[int]) -> int:
    """The pid of a running reader not yet killed (0: none now); -1 once the run has ended."""
    if not state.run_active(local.state_dir):
        return -1
    pid = state.read_run(local.state_dir).get("readerPid")
    return pid if isinstance(pid, int) and pid not in killed and alive({pid}) else 0


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)
def test_the_next_run_stops_a_reader_that_outlived_its_run(pgdb, tmp_path, spark, spark_warehouse):
    with pgdb.connect() as conn:
        local_support.create_accounts(conn, 200)
    local = _ingestion(pgdb, tmp_path, spark_warehouse)
    assert _run(local, spark, once=True).code == 0  # the slot, the mirror, staging
    # What a killed run leaves when its reader did not die with it: a reader process not armed
    # with the parent-death signal, named in the state directory.
    pod = "local-earlier-run"
    argv = reader_process.reader_argv(local, pod=pod, status_file=tmp_path / "orphan.json",
                                      stop_at=None)
    with open(tmp_path / "orphan.log", "ab") as out:
        orphan = subprocess.Popen([sys.executable, "-m", "lakeslot.cli", "reader", *argv],
                                  env=local_support.run_env(pgdb), stdout=out, stderr=out,
                                  start_new_session=True)
    try:
        state.write_run(local.state_dir, readerPid=orphan.pid, pod=pod)
        wait_for(lambda: orphan.poll() is not None or _slot_holder(pgdb) is not None,
                 "the orphaned reader to hold the slot")
        assert orphan.poll() is None, (tmp_path / "orphan.log").read_text()

        result = _run(local, spark, once=True)

        assert result.code == 0, result.message
        assert orphan.poll() == 0, "the orphan was not stopped (SIGTERM: a clean stop, exit 0)"
    finally:
        if orphan.poll() is None:
            orphan.kill()
        orphan.wait()
    assert _slot_holder(pgdb) is None


def _slot_holder(db) -> int | None:
    with db.connect() as conn:
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE NOT temporary"
                           ).fetchone()
    return row[0] if row else None


@pytest.mark.slow
@pytest.mark.parametrize("restartable_pgdb", ["pg18"], indirect=True)
def test_a_streaming_run_rides_out_a_postgresql_restart(restartable_pgdb, tmp_path, spark,
                                                        spark_warehouse, monkeypatch):
    """A fast restart between two apply passes breaks the apply job's source connection, which
    its next pass with changes uses first outside its per-table retries (found by the chaos suite:
    the run exited 1 with ``apply failed: AdminShutdown``); the run restarts its apply job and
    streams on. The restart is made at the end of a pass (the apply job's hook), so that it
    lands there every time."""
    db = restartable_pgdb
    with db.connect() as conn:
        local_support.create_accounts(conn, 200)
    local = _ingestion(db, tmp_path, spark_warehouse)
    requested, restarted = threading.Event(), threading.Event()
    original = apply_loop.ApplyLoop.point

    def point(loop, name: str, table) -> None:
        original(loop, name, table)
        if name == "after-retention" and requested.is_set() and not restarted.is_set():
            db.cluster.restart("fast")
            restarted.set()

    monkeypatch.setattr(apply_loop.ApplyLoop, "point", point)

    def applied_past(position: int) -> bool:
        if not state.run_active(local.state_dir):
            pytest.fail("the run ended")
        lsn = mirror_progress.read(local.ingestion, [local_support.ACCOUNTS])[local_support.ACCOUNTS].lsn
        return lsn is not None and lsn >= position

    def written() -> int:
        """A change committed now; the WAL position after it."""
        with db.connect() as conn:
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        return lsn_now(db)

    def during() -> None:
        before = written()
        wait_for(lambda: applied_past(before), "streaming before the restart", deadline=DEADLINE_S)
        requested.set()
        wait_for(restarted.is_set, "the restart after an apply pass", deadline=DEADLINE_S)
        after = written()
        wait_for(lambda: applied_past(after), "streaming after the restart", deadline=DEADLINE_S)

    local_support.run_in_process(local, spark, once=False, during=during)
