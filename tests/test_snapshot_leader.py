"""The leader against real PostgreSQL 15 and 18: the exported snapshot shows exactly the
transactions committed at or below ``s``, followers can import it while the leader holds it, and
the temporary slot is gone after success, after an exception, and after the process is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import psycopg
import pytest

from lakeslot.source import exported_snapshot
from tests.support.fixtures_pg import connection_settings
from tests.support.snapshot_helpers import snapshot_slots
from tests.support.waiting import wait_for


def test_snapshot_shows_exactly_what_committed_up_to_its_lsn(pgdb):
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'before')")
        with exported_snapshot.exported_snapshot(connection_settings(pgdb), "lakeslot-test") as snapshot:
            assert snapshot_slots(pgdb) == [snapshot.slot]
            before = conn.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()[0]
            conn.execute("UPDATE t SET v = 'after' WHERE id = 1")
            conn.execute("INSERT INTO t VALUES (2, 'after')")
            assert snapshot.lsn < before  # every later commit is above s
            with pgdb.connect() as follower:
                for statement in exported_snapshot.import_statements(snapshot.name):
                    follower.execute(statement)
                assert follower.execute("SELECT id, v FROM t ORDER BY id").fetchall() == [(1, "before")]
                assert follower.execute("SELECT current_setting('transaction_isolation')").fetchone() == (
                    "repeatable read",)
        assert snapshot_slots(pgdb) == []
        begin, import_snapshot = exported_snapshot.import_statements(snapshot.name)
        with pgdb.connect() as late:
            late.execute(begin)
            with pytest.raises(psycopg.Error, match="snapshot"):
                late.execute(import_snapshot)


def test_slot_is_gone_after_an_exception(pgdb):
    with pytest.raises(RuntimeError, match="boom"), exported_snapshot.exported_snapshot(connection_settings(pgdb),
                                                                                        "lakeslot-test"):
        raise RuntimeError("boom")
    assert snapshot_slots(pgdb) == []


def test_slot_is_gone_after_the_leader_process_is_killed(pgdb, tmp_path):
    settings = connection_settings(pgdb)
    assert settings.password is not None
    ready = tmp_path / "ready"
    script = textwrap.dedent(f"""
        import json, pathlib, time
        from lakeslot.source import exported_snapshot as leader
        from lakeslot.source.connection import ConnectionSettings
        settings = ConnectionSettings(**json.loads({json.dumps(json.dumps(
            {"host": settings.host, "port": settings.port, "dbname": settings.dbname,
             "user": settings.user}))}), password=__import__("os").environ["PGPASSWORD"])
        with leader.exported_snapshot(settings, "lakeslot-test-killed") as snapshot:
            pathlib.Path({str(ready)!r}).write_text(snapshot.slot)
            time.sleep(600)
    """)
    process = subprocess.Popen([sys.executable, "-c", script],
                               env={**os.environ, "PGPASSWORD": settings.password})
    try:
        wait_for(lambda: ready.exists() or process.poll() is not None, "the leader")
        assert snapshot_slots(pgdb) == [ready.read_text()]
        process.send_signal(signal.SIGKILL)
        process.wait()
        wait_for(lambda: not snapshot_slots(pgdb), "the temporary slot to go")
    finally:
        process.kill()


def test_import_statements_refuse_anything_but_a_snapshot_id():
    statements = exported_snapshot.import_statements("00000003-0000001A-1")
    assert statements[1] == "SET TRANSACTION SNAPSHOT '00000003-0000001A-1'"
    with pytest.raises(ValueError, match="not an exported snapshot identifier"):
        exported_snapshot.import_statements("x'; DROP TABLE t; --")
