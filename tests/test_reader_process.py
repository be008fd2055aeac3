"""``lakeslot reader`` against PostgreSQL 15 and 18, mostly as a real process: kill and restart,
stale holders, definite errors with their exit code and status file, graceful SIGTERM, metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.exits import EXIT_DEFINITE, EXIT_FAILED, EXIT_OK
from lakeslot.local.pgcluster import free_port
from lakeslot.reader import reader
from lakeslot.reader.metrics import Metrics
from lakeslot.reader.writer import SegmentWriter
from lakeslot.source import slot
from lakeslot.staging import segments
from lakeslot.staging.segments import SourceIdentity
from lakeslot.staging.store import TEMP_PREFIX, Staging
from tests.support.fixtures_pg import Database
from tests.support.reader_support import (
    APP_NAME,
    LAKESLOT,
    config,
    confirmed_flush,
    current_lsn,
    holder,
    new_tuple,
    prepare,
    read_until,
    slot_health,
    spawn,
    staged,
)
from tests.support.waiting import wait_for
from tests.test_source_slot import _hold_with_pg_recvlogical

T = TableName("public", "t")


def _setup(conn) -> int:
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    return prepare(conn, [T])


def _status(path) -> dict:
    return json.loads(path.read_text())


def _temporaries(directory) -> list:
    return [p for p in directory.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_sigkill_mid_transaction_then_restart_leaves_no_gap_or_duplicate(pgdb, tmp_path):
    directory = tmp_path / "staging"
    staging = directory.as_uri()
    log = tmp_path / "reader.log"
    with pgdb.connect() as conn:
        _setup(conn)
        first = spawn(pgdb, staging, log, "--segment-max-seconds", "0.3")
        try:
            wait_for(lambda: holder(conn) == APP_NAME, "the reader to hold the slot")
            conn.execute("INSERT INTO t VALUES (0, 'before')")
            sealed = current_lsn(conn)
            wait_for(lambda: confirmed_flush(conn) >= sealed,
                     "the first transaction to be sealed and confirmed")
            conn.execute("INSERT INTO t SELECT g, repeat(md5(g::text), 16)"
                         " FROM generate_series(1, 60000) g")
            # Rows of the big transaction stream into the open segment's temporary file.
            wait_for(lambda: any(p.stat().st_size > 1 << 20 for p in _temporaries(directory)),
                     "the big transaction to be half written", interval=0.005)
            # pyarrow.array would have imported pandas (45 MB of memory for nothing).
            assert "pandas" not in Path(f"/proc/{first.pid}/maps").read_text()
            first.kill()
            assert first.wait(timeout=30) == -signal.SIGKILL
        finally:
            first.kill()
        sealed_before_restart = Staging(staging).list()
        before_restart = {n.filename for n in sealed_before_restart}
        assert confirmed_flush(conn) <= max(n.end for n in sealed_before_restart)
        conn.execute("INSERT INTO t VALUES (60001, 'after')")
        end = current_lsn(conn)
        second = spawn(pgdb, staging, log, "--stop-at-lsn", lsn_text.format(end))
        assert second.wait(timeout=180) == EXIT_OK, log.read_text()[-3000:]

    names, rows = staged(staging)  # asserts that the segments chain: no gap, no overlap
    assert before_restart <= {n.filename for n in names}
    ids = [int(new_tuple(r)["id"]) for r in rows if r.op == "I"]
    assert ids == list(range(60002))  # every change once, in commit order
    assert _temporaries(directory) == []  # the killed reader's file was cleaned up


def test_a_stale_holder_is_evicted(pgdb, tmp_path):
    staging = (tmp_path / "staging").as_uri()
    with pgdb.connect() as conn:
        _setup(conn)
        zombie = _hold_with_pg_recvlogical(pgdb, "s", "zombie reader")
        reader_process = None
        try:
            wait_for(lambda: holder(conn) == "zombie reader", "pg_recvlogical to hold the slot")
            reader_process = spawn(pgdb, staging, tmp_path / "reader.log",
                                   "--segment-max-seconds", "0.2")
            wait_for(lambda: holder(conn) == APP_NAME, "the reader to take the slot over")
            assert zombie.wait(timeout=30) != 0
            conn.execute("INSERT INTO t VALUES (1, 'streamed after the eviction')")
            wait_for(lambda: any(r.op == "I" for r in staged(staging)[1]), "the row to be staged")
        finally:
            zombie.kill()
            if reader_process is not None:
                reader_process.terminate()
                assert reader_process.wait(timeout=60) == EXIT_OK


def test_dropped_publication_is_a_definite_error(pgdb, tmp_path):
    status = tmp_path / "status.json"
    with pgdb.connect() as conn:
        _setup(conn)
        # (a health check finds the publication gone: every half second, not every 5 s)
        process = spawn(pgdb, (tmp_path / "staging").as_uri(), tmp_path / "reader.log",
                        "--status-file", str(status), "--health-interval-seconds", "0.5")
        try:
            wait_for(lambda: holder(conn) == APP_NAME, "the reader to hold the slot")
            conn.execute("DROP PUBLICATION p")
            conn.execute("INSERT INTO t VALUES (1, 'x')")
            assert process.wait(timeout=120) == EXIT_DEFINITE
        finally:
            process.kill()
    outcome = _status(status)
    assert (outcome["state"], outcome["definite"], outcome["reason"]) == (
        "failed", True, "PublicationMissing")
    assert "publication p does not exist" in outcome["message"]


def test_slot_advanced_past_staged_data_or_dropped_is_a_definite_error(pgdb, tmp_path):
    staging = (tmp_path / "staging").as_uri()
    log, status = tmp_path / "reader.log", tmp_path / "status.json"
    with pgdb.connect() as conn:
        _setup(conn)
        conn.execute("INSERT INTO t VALUES (1, 'staged')")
        staged_end = current_lsn(conn)
        process = spawn(pgdb, staging, log, "--stop-at-lsn", lsn_text.format(staged_end),
                        "--status-file", str(status))
        assert process.wait(timeout=120) == EXIT_OK
        assert _status(status)["reason"] == "Stopped"
        durable = lsn_text.parse(_status(status)["lsn"])
        conn.execute("INSERT INTO t VALUES (2, 'never staged')")
        conn.execute("SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())")
        process = spawn(pgdb, staging, log, "--status-file", str(status))
        assert process.wait(timeout=120) == EXIT_DEFINITE
        outcome = _status(status)
        assert (outcome["definite"], outcome["reason"]) == (True, "SlotAhead")
        assert outcome["lsn"] == lsn_text.format(durable)
        slot.drop(conn, "s")
        process = spawn(pgdb, staging, log, "--status-file", str(status))
        assert process.wait(timeout=120) == EXIT_DEFINITE
        assert _status(status)["reason"] == "SlotMissing"
    assert [new_tuple(r)["id"] for r in staged(staging)[1] if r.op == "I"] == ["1"]


def test_sigterm_seals_confirms_and_exits_cleanly(pgdb, tmp_path):
    directory = tmp_path / "staging"
    status, port = tmp_path / "status.json", free_port()
    with pgdb.connect() as conn:
        start = _setup(conn)
        # Segments seal only at the SIGTERM: until then nothing is durable. (A health check
        # samples the lag every half second, not every 5 s.)
        process = spawn(pgdb, directory.as_uri(), tmp_path / "reader.log", "--status-file",
                        str(status), "--metrics-port", str(port), "--segment-max-seconds", "3600",
                        "--health-interval-seconds", "0.5")
        try:
            wait_for(lambda: holder(conn) == APP_NAME, "the reader to hold the slot")
            for i in range(10):
                conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
            end = current_lsn(conn)
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: _gauge(url, "lakeslot_reader_received_lsn") >= end,
                     "the reader to receive every transaction")
            # Nothing confirmed yet: the slot holds back at least the WAL of the inserts.
            wait_for(lambda: _gauge(url, "lakeslot_reader_lag_bytes") >= end - start,
                     "a health check to sample the lag")
            with urllib.request.urlopen(f"{url}/healthz") as response:
                assert response.status == 200
            # Nothing is sealed yet, so nothing is confirmed, and the feedback reports exactly that.
            assert slot_health(conn).confirmed_flush_lsn == start
            sent = conn.execute("SELECT (write_lsn - '0/0')::int8, (flush_lsn - '0/0')::int8,"
                                " (replay_lsn - '0/0')::int8 FROM pg_stat_replication"
                                " WHERE application_name = %s", (APP_NAME,)).fetchone()
            assert sent == (start, start, start)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == EXIT_OK
        finally:
            process.kill()
        outcome = _status(status)
        durable = lsn_text.parse(outcome["lsn"])
        assert (outcome["state"], outcome["reason"]) == ("stopped", "Stopped")
        assert durable >= end
        wait_for(lambda: slot_health(conn).confirmed_flush_lsn == durable,
                 "the final feedback to confirm the sealed position")
    names, rows = staged(directory.as_uri())
    assert [new_tuple(r)["id"] for r in rows if r.op == "I"] == [str(i) for i in range(10)]
    assert names[-1].end == durable and _temporaries(directory) == []


def _gauge(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics") as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def test_persistent_transient_errors_exit_1_with_json_logs_and_status(tmp_path):
    status = tmp_path / "status.json"
    result = subprocess.run(
        [LAKESLOT, "reader", "--ingestion", "tests/unreachable", "--slot", "s", "--publication", "p",
         "--staging", (tmp_path / "staging").as_uri(), "--host", "127.0.0.1",
         "--port", str(free_port()), "--max-retry-seconds", "1", "--status-file", str(status)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, reader.PASSWORD_ENV: "never-logged"})
    assert result.returncode == EXIT_FAILED
    outcome = _status(status)
    assert (outcome["state"], outcome["definite"], outcome["reason"]) == (
        "failed", False, "RetriesExhausted")
    logs = [json.loads(line) for line in result.stderr.splitlines()]
    assert {"transient error, retrying"} <= {e["message"][:25] for e in logs}
    assert all({"time", "level", "logger", "message"} <= e.keys() for e in logs)
    assert "never-logged" not in result.stderr + status.read_text()


def test_bad_arguments_exit_2():
    result = subprocess.run([LAKESLOT, "reader", "--slot", "s"], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 2 and "--ingestion" in result.stderr


def test_staging_from_another_timeline_or_system_is_a_definite_error(pgdb, tmp_path):
    with pgdb.connect() as conn:
        start = _setup(conn)
        system_id, timeline = conn.execute(
            "SELECT system_identifier::text, timeline_id FROM pg_control_system(),"
            " pg_control_checkpoint()").fetchone()
        conn.execute("INSERT INTO t VALUES (1, 'x')")
        end = current_lsn(conn)
    cases = {"same": SourceIdentity(system_id, timeline),
             "TimelineChanged": SourceIdentity(system_id, timeline + 1),
             "SystemChanged": SourceIdentity(str(int(system_id) + 1), timeline)}
    for case, recorded in cases.items():
        staging = Staging((tmp_path / case).as_uri())
        SegmentWriter(staging, start, recorded).seal(start)  # as if staged earlier from `recorded`
        if case == "same":
            read_until(pgdb, staging.uri, end)
            continue
        with pytest.raises(reader.ReaderError) as error:
            reader.run(config(pgdb, staging.uri), stop=threading.Event(), metrics=Metrics())
        assert (error.value.reason, error.value.lsn) == (case, start)
        assert staging.list() == [segments.SegmentName(start, start)]  # nothing streamed


@pytest.mark.parametrize("version", ["pg15", "pg18"])
def test_a_slot_that_lost_its_wal_is_a_definite_error(pg_cluster_factory, version, tmp_path):
    # The cluster of test_source_slot's lost-slot test: at most 1 MB of WAL kept for a slot.
    cluster = pg_cluster_factory.get(version, max_slot_wal_keep_size="1MB", min_wal_size="32MB",
                                     max_wal_size="64MB")
    db = Database(cluster, f"t_{uuid.uuid4().hex[:12]}")
    cluster.create_database(db.name)
    status = tmp_path / "status.json"
    try:
        with db.connect() as conn:
            _setup(conn)
            for _ in range(20):  # no reader runs: the slot falls behind until its WAL is gone
                if slot_health(conn).wal_status == "lost":
                    break
                conn.execute("INSERT INTO t SELECT g, repeat('x', 1000)"
                             " FROM generate_series(1, 3000) g ON CONFLICT (id) DO NOTHING")
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
            assert slot_health(conn).wal_status == "lost"
            process = spawn(db, (tmp_path / "staging").as_uri(), tmp_path / "reader.log",
                            "--status-file", str(status))
            assert process.wait(timeout=120) == EXIT_DEFINITE
    finally:
        cluster.drop_database(db.name)
    outcome = _status(status)
    assert (outcome["definite"], outcome["reason"]) == (True, "SlotLost")
    assert "re-snapshot" in outcome["message"]
