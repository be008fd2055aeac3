"""The permanent slot against real PostgreSQL 15 and 18: ensure (also concurrently), health,
loss, stale-holder eviction, drop and cleanup."""

from __future__ import annotations

import os
import subprocess
import threading

import psycopg
import pytest
from psycopg import pq

from lakeslot.api.naming import TableName
from lakeslot.source import cleanup, connection, publication, slot
from tests.support.fixtures_pg import connection_settings
from tests.support.waiting import wait_for

OWNER = "default/orders"
READER = connection.application_name("reader", OWNER, "orders-reader-5d8f-abcde")


def _connect(pgdb, app="lakeslot-test"):
    return connection.connect(connection_settings(pgdb), app, long_running=True)


def _health(conn: psycopg.Connection, name: str) -> slot.SlotHealth:
    """The health of a slot that must exist."""
    health = slot.health(conn, name)
    assert health is not None, f"slot {name} does not exist"
    return health


def test_ensure_is_idempotent_under_concurrent_callers(pgdb):
    barrier = threading.Barrier(3)
    results, failures = [], []

    def caller():
        try:
            with _connect(pgdb) as conn:
                barrier.wait()
                results.append(slot.ensure(conn, "s_concurrent"))
        except Exception as e:  # noqa: BLE001 - surfaced by the assertion below
            failures.append(e)

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert sorted(r.created for r in results) == [False, False, True]
    created = next(r for r in results if r.created)
    with _connect(pgdb) as conn:
        health = _health(conn, "s_concurrent")
        assert health.plugin == "pgoutput" and health.database == pgdb.name
        assert created.creation_lsn == health.confirmed_flush_lsn
        assert slot.ensure(conn, "s_concurrent").created is False


def test_an_incompatible_slot_is_never_reused(pgdb):
    with _connect(pgdb) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('s_other', 'test_decoding')")
        with pytest.raises(slot.SlotError, match=r"for plugin 'test_decoding'.*choose another slot"):
            slot.ensure(conn, "s_other")


def test_failover_slots_need_postgres_17(pgdb):
    with _connect(pgdb) as conn:
        if conn.info.server_version < 170000:
            with pytest.raises(slot.SlotError, match="PostgreSQL 17"):
                slot.ensure(conn, "s_failover", failover=True)
            assert slot.health(conn, "s_failover") is None
        else:
            assert slot.ensure(conn, "s_failover", failover=True).created
            assert _health(conn, "s_failover").failover is True


def test_health_reports_position_retention_and_lag(pgdb):
    with _connect(pgdb) as conn:
        slot.ensure(conn, "s_health")
        conn.execute("CREATE TABLE t AS SELECT g AS id, repeat('x', 100) AS v"
                     " FROM generate_series(1, 5000) g")
        health = _health(conn, "s_health")
    assert health.active is False and health.active_pid is None and health.holder is None
    assert health.wal_status in ("reserved", "extended")
    assert health.restart_lsn is not None and health.confirmed_flush_lsn is not None
    assert health.restart_lsn <= health.confirmed_flush_lsn
    assert health.lag_bytes is not None and health.retained_bytes is not None
    assert health.lag_bytes > 500_000  # the table's WAL is behind the slot's position
    assert health.retained_bytes >= health.lag_bytes
    assert slot.lost_reason(health) is None


def _hold_with_pg_recvlogical(pgdb, slot_name: str, app: str) -> subprocess.Popen:
    """A second process holding the slot; the password travels in the environment only."""
    dsn = (f"host=127.0.0.1 port={pgdb.cluster.port} dbname={pgdb.name} user=postgres"
           f" application_name='{app}'")
    return subprocess.Popen(
        [str(pgdb.cluster.tool("pg_recvlogical")), "-d", dsn, "--slot", slot_name, "--start",
         "--no-loop", "-o", "proto_version=1", "-o", "publication_names=p", "-f", "/dev/null"],
        env={**os.environ, "PGPASSWORD": pgdb.cluster.password},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _start_replication(pgdb, slot_name: str, app: str) -> psycopg.Connection:
    repl = connection.connect(connection_settings(pgdb), app, replication=True)
    repl.pgconn.send_query(f"START_REPLICATION SLOT {slot_name} LOGICAL 0/0"
                           " (proto_version '1', publication_names 'p')".encode())
    result = repl.pgconn.get_result()
    assert result is not None and result.status == pq.ExecStatus.COPY_BOTH, repl.pgconn.get_error_message()
    return repl


def test_a_stale_holder_is_evicted_and_the_slot_becomes_usable(pgdb):
    with _connect(pgdb) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        publication.sync(conn, "p", [TableName("public", "t")], owner=OWNER)
        slot.ensure(conn, "s_evict")
        holder = _hold_with_pg_recvlogical(pgdb, "s_evict", "zombie reader")
        try:
            wait_for(lambda: _health(conn, "s_evict").active, "pg_recvlogical to hold the slot")
            evicted = slot.evict_stale_holders(conn, "s_evict", READER)
            assert [(e.application_name, e.terminated) for e in evicted] == [("zombie reader", True)]
            assert holder.wait(timeout=30) != 0
            assert holder.stderr is not None and b"terminat" in holder.stderr.read()
        finally:
            holder.kill()
        # The legitimate reader can now take the slot (after the backend has let go) ...
        wait_for(lambda: not _health(conn, "s_evict").active, "the slot to be released")
        repl = _start_replication(pgdb, "s_evict", READER)
        try:
            wait_for(lambda: _health(conn, "s_evict").holder == READER, "the reader to hold it")
            # ... and is never evicted itself.
            assert slot.evict_stale_holders(conn, "s_evict", READER) == []
            assert _health(conn, "s_evict").holder == READER
        finally:
            repl.close()


def test_drop_and_cleanup_are_idempotent_even_while_held(pgdb):
    with _connect(pgdb) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        publication.sync(conn, "p", [TableName("public", "t")], owner=OWNER)
        slot.ensure(conn, "s_drop")
        assert cleanup.cleanup(conn, slot_name="s_drop", publication_name="p", owner=OWNER,
                               deletion_policy="Retain") == {"slot": "retained",
                                                             "publication": "retained"}
        assert slot.health(conn, "s_drop") is not None
        repl = _start_replication(pgdb, "s_drop", READER)
        try:
            wait_for(lambda: _health(conn, "s_drop").active, "the reader to hold the slot")
            assert cleanup.cleanup(conn, slot_name="s_drop", publication_name="p", owner=OWNER,
                                   deletion_policy="Delete") == {"slot": "dropped",
                                                                 "publication": "dropped"}
        finally:
            repl.close()
        assert cleanup.cleanup(conn, slot_name="s_drop", publication_name="p", owner=OWNER,
                               deletion_policy="Delete") == {"slot": "absent",
                                                             "publication": "absent"}
        assert slot.health(conn, "s_drop") is None


def test_a_slot_in_an_oddly_named_database(pg):
    name = 'odd "db" ü'
    pg.create_database(name)
    try:
        settings = connection.ConnectionSettings("127.0.0.1", pg.port, name, pg.superuser,
                                                 pg.password)
        with connection.connect(settings, "lakeslot-test") as conn:
            assert slot.ensure(conn, "s_odd").created
            assert _health(conn, "s_odd").database == name
            assert slot.drop(conn, "s_odd") == "dropped"
    finally:
        pg.drop_database(name)


@pytest.mark.parametrize("version", ["pg15", "pg18"])
def test_a_lost_slot_is_detected_and_can_be_recreated(pg_cluster_factory, version):
    cluster = pg_cluster_factory.get(version, max_slot_wal_keep_size="1MB", min_wal_size="32MB",
                                     max_wal_size="64MB")
    settings = connection.ConnectionSettings("127.0.0.1", cluster.port, "postgres",
                                             cluster.superuser, cluster.password)
    with connection.connect(settings, "lakeslot-test", long_running=True) as conn:
        slot.ensure(conn, "s_lost")
        conn.execute("CREATE TABLE IF NOT EXISTS filler (v text)")
        for _ in range(6):  # push the slot's restart_lsn out of the 1 MB it may keep
            conn.execute("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 3000)")
            conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
        health = _health(conn, "s_lost")
        reason = slot.lost_reason(health)
        assert health.wal_status == "lost", health
        assert reason is not None and "s_lost" in reason
        fresh = slot.recreate(conn, "s_lost")
        assert fresh.created and slot.lost_reason(_health(conn, "s_lost")) is None
        slot.drop(conn, "s_lost")
