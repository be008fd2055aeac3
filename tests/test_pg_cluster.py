"""Smoke tests of the PostgreSQL harness: real clusters of both versions, configured for
logical replication, readable through psycopg 3's low-level replication API (FACTS.md)."""

from __future__ import annotations

import select
import struct
import time

import psycopg
import pytest
from psycopg import pq
from psycopg.pq.abc import PGconn

POSTGRES_EPOCH_US = 946_684_800 * 1_000_000


def test_cluster_is_configured_for_logical_replication(pg, request):
    expected_major = {"pg15": 15, "pg18": 18}[request.node.callspec.params["pg"]]
    with pg.connect() as conn:
        assert conn.info.server_version // 10000 == expected_major
        assert conn.execute("SHOW wal_level").fetchone()[0] == "logical"
        assert int(conn.execute("SHOW max_replication_slots").fetchone()[0]) >= 10


def test_tcp_connections_require_the_password(pg):
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(pg.dsn(password="wrong"))


def test_fresh_database_per_test_is_dropped_with_its_slots(pg):
    pg.create_database("odd \"name\" ü")
    with pg.connect("odd \"name\" ü") as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('leftover', 'pgoutput')")
    pg.drop_database("odd \"name\" ü")
    with pg.connect() as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = 'odd \"name\" ü'").fetchone()[0] == 0
        assert conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'leftover'").fetchone()[0] == 0


def _copy_messages(pgconn: PGconn, deadline: float):
    """Yield CopyData payloads of a COPY_BOTH stream until the deadline."""
    while time.monotonic() < deadline:
        nbytes, data = pgconn.get_copy_data(1)
        if nbytes == 0:
            select.select([pgconn.socket], [], [], 0.2)
            pgconn.consume_input()
            continue
        assert nbytes > 0, pgconn.get_error_message()
        yield bytes(data)
    raise AssertionError("deadline passed while reading the replication stream")


def _standby_status(lsn: int) -> bytes:
    now_us = int(time.time() * 1_000_000) - POSTGRES_EPOCH_US
    return b"r" + struct.pack("!QQQqB", lsn, lsn, lsn, now_us, 0)


def _insert_values(msg: bytes) -> list[str | None]:
    """Column values of a pgoutput v1 Insert message ('I' relid 'N' TupleData)."""
    assert msg[:1] == b"I" and msg[5:6] == b"N"
    (ncols,) = struct.unpack_from("!h", msg, 6)
    pos = 8
    values: list[str | None] = []
    for _ in range(ncols):
        kind = msg[pos:pos + 1]
        pos += 1
        if kind == b"t":
            (length,) = struct.unpack_from("!i", msg, pos)
            values.append(msg[pos + 4:pos + 4 + length].decode())
            pos += 4 + length
        else:
            values.append(None)
    return values


def test_logical_slot_streams_a_committed_change(pgdb):
    with pgdb.connect() as conn:
        conn.execute('CREATE TABLE "Odd table" (id int PRIMARY KEY, v text)')
        conn.execute('CREATE PUBLICATION pub FOR TABLE "Odd table"')
    repl = psycopg.connect(pgdb.dsn(replication="database"), autocommit=True, prepare_threshold=None)
    try:  # not `with`: its exit would send COMMIT into the COPY_BOTH stream
        repl.execute("CREATE_REPLICATION_SLOT smoke LOGICAL pgoutput")
        with pgdb.connect() as conn:
            conn.execute("""INSERT INTO "Odd table" VALUES (1, 'hello wörld')""")
        pgconn = repl.pgconn
        pgconn.send_query(
            b"START_REPLICATION SLOT smoke LOGICAL 0/0 (proto_version '1', publication_names 'pub')")
        result = pgconn.get_result()
        assert result is not None and result.status == pq.ExecStatus.COPY_BOTH

        kinds, inserted, commit_end = [], None, None
        for msg in _copy_messages(pgconn, time.monotonic() + 60):
            if msg[:1] != b"w":  # primary keepalive
                continue
            payload = msg[25:]
            kinds.append(payload[:1])
            if payload[:1] == b"I":
                inserted = _insert_values(payload)
            if payload[:1] == b"C":
                (commit_end,) = struct.unpack_from("!Q", payload, 10)
                break
        assert kinds == [b"B", b"R", b"I", b"C"]
        assert inserted == ["1", "hello wörld"]
        assert commit_end is not None

        pgconn.put_copy_data(_standby_status(commit_end))
        pgconn.flush()
        with pgdb.connect() as conn:
            deadline = time.monotonic() + 30
            while conn.execute(
                "SELECT confirmed_flush_lsn < %s::text::pg_lsn FROM pg_replication_slots"
                " WHERE slot_name = 'smoke'",
                (f"{commit_end >> 32:X}/{commit_end & 0xFFFFFFFF:X}",),
            ).fetchone()[0]:
                assert time.monotonic() < deadline, "the slot never confirmed the flushed LSN"
                time.sleep(0.1)
    finally:
        repl.close()
