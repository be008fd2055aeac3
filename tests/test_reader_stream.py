"""The replication reader against real PostgreSQL 15 and 18: what lands in the segments.

Each test runs a workload, then the reader (in this process) until everything up to the
workload's end is sealed, and checks the staged rows — against ``test_decoding`` reading the same
WAL from a copy of the slot, or against what PostgreSQL's replica identity rules say."""

from __future__ import annotations

import functools
import os
from collections import Counter

import pyarrow.parquet as pq
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.reader import protocol, stream
from lakeslot.reader.metrics import Metrics
from lakeslot.staging import segments
from lakeslot.staging.store import Staging
from tests.support.odd_names import ODD_COLUMNS, create_odd_tables
from tests.support.reader_support import (
    confirmed_flush,
    copy_slot,
    current_lsn,
    decoded_by_test_decoding,
    new_tuple,
    prepare,
    read_until,
    relation_of,
    slot_health,
    staged,
    start_in_background,
    transactions,
)
from tests.support.waiting import wait_for

DEFAULT = TableName("public", "t_default")
FULL = TableName("public", "t_full")
INDEX = TableName("public", "t_index")
ODD_PUBLICATION = 'pub, "with" quotes'


def _create(conn) -> list[TableName]:
    conn.execute("CREATE TABLE t_default (id int PRIMARY KEY, v text, n int)")
    conn.execute("CREATE TABLE t_full (id int PRIMARY KEY, v text, n int)")
    conn.execute("ALTER TABLE t_full REPLICA IDENTITY FULL")
    conn.execute("CREATE TABLE t_index (a int NOT NULL, b int NOT NULL, v text, n int)")
    conn.execute("CREATE UNIQUE INDEX t_index_ab ON t_index (a, b)")
    conn.execute("ALTER TABLE t_index REPLICA IDENTITY USING INDEX t_index_ab")
    conn.execute("CREATE TABLE t_unpublished (id int PRIMARY KEY, v text)")
    return [DEFAULT, FULL, INDEX]


def _staging(tmp_path) -> str:
    return (tmp_path / "staging").as_uri()


def test_segments_reproduce_every_change_in_commit_order(pgdb, tmp_path, monkeypatch):
    # Small batches, so that one transaction spans several row groups of a segment.
    monkeypatch.setattr(stream, "BATCH_ROWS", 97)
    with pgdb.connect() as conn:
        odd = create_odd_tables(conn)
        plain = _create(conn)
        prepare(conn, odd + plain, publication=ODD_PUBLICATION)
        copy_slot(conn, "s", "td", "test_decoding")
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in ODD_COLUMNS)
        for i, table in enumerate(odd):
            conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES (%s, %s, %s, %s, %s), "
                                 "(%s, NULL, '', %s, 'ñ')").format(table.sql(), cols),
                         (1, "O'Brien", 'say "hi"\nline two', "tab\there", "ü" * i, 2, "\\"))
        with conn.transaction():
            conn.execute("INSERT INTO t_default SELECT g, 'v' || g, g FROM generate_series(1, 300) g")
            conn.execute("INSERT INTO t_unpublished VALUES (1, 'not published')")
            conn.execute("SELECT pg_logical_emit_message(true, 'lakeslot-test', 'in a transaction')")
        conn.execute("SELECT pg_logical_emit_message(false, 'lakeslot-test', 'on its own')")
        # Interleaved: the transaction that begins first commits last (segments: commit order).
        with pgdb.connect(autocommit=False) as first, pgdb.connect(autocommit=False) as second:
            first.execute("INSERT INTO t_full VALUES (100, 'begun first', 1)")
            second.execute("INSERT INTO t_full VALUES (200, 'begun second', 2)")
            first.execute("INSERT INTO t_full VALUES (101, 'begun first', 1)")
            second.commit()
            first.commit()
        conn.execute("INSERT INTO t_unpublished VALUES (2, 'an unpublished-only transaction')")
        with conn.transaction():
            conn.execute("UPDATE t_default SET v = NULL, n = -n WHERE id <= 5")
            conn.execute("UPDATE t_default SET id = id + 1000 WHERE id = 6")  # key change
            conn.execute("DELETE FROM t_default WHERE id BETWEEN 7 AND 9")
            conn.execute(sql.SQL("UPDATE {} SET {} = 'changed' WHERE id = 1").format(
                odd[0].sql(), sql.Identifier("Mixed Case")))
            conn.execute(sql.SQL("DELETE FROM {} WHERE id = 2").format(odd[1].sql()))
        conn.execute("INSERT INTO t_full SELECT g, NULL, g FROM generate_series(1, 4) g")
        conn.execute("UPDATE t_full SET v = 'x' WHERE id = 1")
        conn.execute("DELETE FROM t_full WHERE id = 2")
        conn.execute("INSERT INTO t_index SELECT g, g * 10, 'v', g FROM generate_series(1, 4) g")
        conn.execute("UPDATE t_index SET n = 0 WHERE a = 1")
        conn.execute("UPDATE t_index SET b = 99 WHERE a = 2")
        conn.execute("DELETE FROM t_index WHERE a = 3")
        conn.execute("TRUNCATE t_full")
        conn.execute("TRUNCATE t_index, t_default")
        conn.execute("INSERT INTO t_default VALUES (1, 'after truncate', 1)")
        end = current_lsn(conn)
        # Small segments: many seals, each between transactions, each chaining to the last.
        read_until(pgdb, _staging(tmp_path), end, publication=ODD_PUBLICATION,
                   segment_max_bytes=256)
        published = {(t.schema, t.name) for t in odd + plain}
        expected = decoded_by_test_decoding(conn, "td", end, published)

    names, rows = staged(_staging(tmp_path))
    assert transactions(rows) == expected
    assert sum(len(changes) for _, changes in expected) > 300
    # Whole transactions, in commit order, each row numbered within its transaction.
    commits = [r for r in rows if r.op == "C"]
    ends = [c.end_lsn for c in commits if c.end_lsn is not None]
    assert len(ends) == len(commits), "every commit has its end_lsn"
    assert ends == sorted(ends)
    assert all(c.commit_lsn < end and c.commit_time is not None and c.xid
               for c, end in zip(commits, ends, strict=True))
    by_txn: dict[int, list[int]] = {}
    for r in rows:
        by_txn.setdefault(r.commit_lsn, []).append(r.seq)
    assert all(seqs == list(range(len(seqs))) for seqs in by_txn.values())
    assert {(r.relation.schema, r.relation.table) for r in rows if r.relation} == published
    assert len(names) > 5, names
    row_groups = [pq.ParquetFile(tmp_path / "staging" / n.filename).num_row_groups for n in names]
    assert max(row_groups) > 1


def _stage(pgdb, tmp_path, statements: list[str]) -> list[segments.Row]:
    """Run ``statements`` (each its own transaction) on the plain tables, read them all, and
    check that the metrics count what was staged."""
    metrics = Metrics()
    with pgdb.connect() as conn:
        prepare(conn, _create(conn))
        for statement in statements:
            conn.execute(statement)
        durable = read_until(pgdb, _staging(tmp_path), current_lsn(conn), metrics,
                             segment_max_bytes=256)
    names, rows = staged(_staging(tmp_path))
    sample = metrics.registry.get_sample_value
    ops = Counter(r.op for r in rows)
    assert {op: sample("lakeslot_reader_changes_total", {"op": op}) or 0 for op in "IUDT"} == {
        op: ops[op] for op in "IUDT"}
    assert sample("lakeslot_reader_transactions_total") == ops["C"] > 0
    assert sample("lakeslot_reader_segments_sealed_total") == len(names) > 1
    assert sample("lakeslot_reader_durable_lsn") == names[-1].end == durable
    received = sample("lakeslot_reader_received_lsn")
    assert received is not None and received >= durable
    return rows


def test_replica_identity_default_full_and_index(pgdb, tmp_path):
    rows = _stage(pgdb, tmp_path, [
        *(statement.format(t=t) for t in ("t_default", "t_full") for statement in (
            "INSERT INTO {t} VALUES (1, 'a', NULL), (2, 'b', 2)",
            "UPDATE {t} SET v = 'a2' WHERE id = 1",
            "UPDATE {t} SET id = 3 WHERE id = 2",
            "DELETE FROM {t} WHERE id = 3")),
        "INSERT INTO t_index VALUES (1, 10, 'a', NULL)",
        "UPDATE t_index SET v = 'a2' WHERE a = 1",
        "UPDATE t_index SET b = 11 WHERE a = 1",
        "DELETE FROM t_index WHERE a = 1",
    ])
    changes: dict[str, list[tuple[str, dict | None, dict | None]]] = {}
    for r in rows:
        if r.relation is not None and r.op in "UD":
            changes.setdefault(r.relation.table, []).append((r.op, r.old, r.new))
    absent = segments.NOT_IN_KEY
    assert changes["t_default"] == [
        ("U", None, {"id": "1", "v": "a2", "n": None}),  # key unchanged: no old tuple
        ("U", {"id": "2", "v": absent, "n": absent}, {"id": "3", "v": "b", "n": "2"}),
        ("D", {"id": "3", "v": absent, "n": absent}, None),  # key only, not NULLs
    ]
    assert changes["t_full"] == [
        ("U", {"id": "1", "v": "a", "n": None}, {"id": "1", "v": "a2", "n": None}),
        ("U", {"id": "2", "v": "b", "n": "2"}, {"id": "3", "v": "b", "n": "2"}),
        ("D", {"id": "3", "v": "b", "n": "2"}, None),
    ]
    assert changes["t_index"] == [
        ("U", None, {"a": "1", "b": "10", "v": "a2", "n": None}),
        ("U", {"a": "1", "b": "10", "v": absent, "n": absent},
         {"a": "1", "b": "11", "v": "a2", "n": None}),
        ("D", {"a": "1", "b": "11", "v": absent, "n": absent}, None),
    ]
    identities = {r.relation.table: (r.relation.replica_identity,
                                     [c.name for c in r.relation.columns if c.key])
                  for r in rows if r.relation}
    assert identities == {"t_default": ("default", ["id"]),
                          "t_full": ("full", ["id", "v", "n"]),
                          "t_index": ("index", ["a", "b"])}


def test_unchanged_toast_values_are_marked(pgdb, tmp_path):
    big = os.urandom(20_000).hex()  # incompressible: stored out of line
    with pgdb.connect() as conn:
        prepare(conn, _create(conn))
        for t in ("t_default", "t_full"):
            conn.execute(f"INSERT INTO {t} VALUES (1, %s, 1)", (big,))
            conn.execute(f"UPDATE {t} SET n = 2 WHERE id = 1")
        read_until(pgdb, _staging(tmp_path), current_lsn(conn))

    _, rows = staged(_staging(tmp_path))
    updates = {relation_of(r).table: r for r in rows if r.op == "U"}
    inserts = {relation_of(r).table: r for r in rows if r.op == "I"}
    assert new_tuple(inserts["t_default"])["v"] == big
    assert updates["t_default"].new == {"id": "1", "v": segments.UNCHANGED_TOAST, "n": "2"}
    assert updates["t_default"].old is None
    # REPLICA IDENTITY FULL: the old tuple carries the value, the new one still does not.
    assert updates["t_full"].old == {"id": "1", "v": big, "n": "1"}
    assert new_tuple(updates["t_full"])["v"] is segments.UNCHANGED_TOAST
    table = Staging(_staging(tmp_path))
    kinds = [r["new_kinds"] for name in table.list()
             for r in table.read(name).table.to_pylist() if r["op"] == "U"]
    assert kinds == ["tut", "tut"]


def test_truncate_and_column_changes_yield_new_relation_descriptions(pgdb, tmp_path):
    rows = _stage(pgdb, tmp_path, [
        "INSERT INTO t_default VALUES (1, 'a', 1)",
        "ALTER TABLE t_default ADD COLUMN added numeric(10, 2)",
        "INSERT INTO t_default VALUES (2, 'b', 2, 3.5)",
        # DDL inside a transaction, between two changes (one statement string: one transaction)
        "UPDATE t_default SET added = 1 WHERE id = 1; ALTER TABLE t_default DROP COLUMN v;"
        " INSERT INTO t_default VALUES (3, 3, 4.25)",
        "TRUNCATE t_default",
        "INSERT INTO t_default VALUES (4, 4, NULL)",
    ])
    seen = [(r.op, [c.name for c in r.relation.columns], r.new) for r in rows if r.relation]
    assert seen == [
        ("I", ["id", "v", "n"], {"id": "1", "v": "a", "n": "1"}),
        ("I", ["id", "v", "n", "added"], {"id": "2", "v": "b", "n": "2", "added": "3.50"}),
        ("U", ["id", "v", "n", "added"], {"id": "1", "v": "a", "n": "1", "added": "1.00"}),
        ("I", ["id", "n", "added"], {"id": "3", "n": "3", "added": "4.25"}),
        ("T", ["id", "n", "added"], None),
        ("I", ["id", "n", "added"], {"id": "4", "n": "4", "added": None}),
    ]
    added = next(c for r in rows if r.relation for c in r.relation.columns if c.name == "added")
    assert (added.type_oid, added.type_name, added.type_modifier) == (1700, "numeric",
                                                                      (10 << 16 | 2) + 4)
    # Descriptions are stored once per segment and version; rows point at theirs.
    store = Staging(_staging(tmp_path))
    described = [r for name in store.list() for r in store.metadata(name).relations]
    assert len({tuple(c.name for c in r.columns) for r in described}) == 3


def test_idle_database_with_unpublished_writes_advances_the_slot(pgdb, tmp_path):
    with pgdb.connect() as conn:
        prepare(conn, _create(conn))
        start = confirmed_flush(conn)
        background = start_in_background(pgdb, _staging(tmp_path), segment_max_seconds=0.2)
        try:
            for i in range(20):
                conn.execute("INSERT INTO t_unpublished VALUES (%s, 'x')", (i,))
            target = current_lsn(conn)
            wait_for(lambda: confirmed_flush(conn) >= target,
                     "confirmed_flush_lsn to pass the unpublished writes")
        finally:
            durable = background.finish()
        assert confirmed_flush(conn) == durable > start

    names, rows = staged(_staging(tmp_path))
    assert rows == []  # nothing published happened, yet staging records the progress
    assert names[0].start == start and names[-1].end == durable


def test_an_idle_stream_waits_for_the_server_instead_of_spinning(pgdb, tmp_path, monkeypatch):
    """Between its ticks an idle stream waits on the server's socket. A seal time that passed
    with nothing to seal is no deadline: it was, and every wait of an idle stream returned at
    once after its first seal period — the reader spent a core on a quiet source (half of one
    while a benchmark's 1,000 tables were being copied)."""
    waits: list[float] = []
    wait_readable = protocol.ReplicationConnection.wait_readable

    def counted(self, timeout: float) -> None:
        waits.append(timeout)
        wait_readable(self, timeout)

    monkeypatch.setattr(protocol.ReplicationConnection, "wait_readable", counted)
    with pgdb.connect() as conn:
        prepare(conn, _create(conn))
        background = start_in_background(pgdb, _staging(tmp_path), segment_max_seconds=0.2)
        try:  # (20 waits: ten seal periods of an idle source)
            wait_for(lambda: len(waits) >= 20, "the idle stream to wait 20 times")
        finally:
            background.finish()
    assert [t for t in waits[:20] if t <= 0] == [], waits[:20]


def test_the_same_range_always_decodes_to_the_same_segment(pgdb, tmp_path):
    """A zombie reader writing the same segment name writes the same bytes (DESIGN.md rule 5)."""
    with pgdb.connect() as conn:
        prepare(conn, _create(conn))
        copy_slot(conn, "s", "s2")
        copy_slot(conn, "s", "td", "test_decoding")
        conn.execute("INSERT INTO t_default SELECT g, 'v' || g, g FROM generate_series(1, 500) g")
        conn.execute("ALTER TABLE t_default ADD COLUMN extra text")
        conn.execute("UPDATE t_full SET v = 'none'")
        conn.execute("INSERT INTO t_full VALUES (1, 'a', 1)")
        conn.execute("DELETE FROM t_default WHERE id % 7 = 0")
        end = conn.execute("SELECT max((lsn - '0/0')::int8) FROM pg_logical_slot_peek_changes("
                           "'td', NULL, NULL) WHERE data LIKE 'COMMIT%'").fetchone()[0]
        first, second = tmp_path / "first", tmp_path / "second"
        read_until(pgdb, first.as_uri(), end)
        read_until(pgdb, second.as_uri(), end, slot="s2")
    names = [p.name for p in sorted(first.iterdir())]
    assert names == [p.name for p in sorted(second.iterdir())]
    assert len(names) == 1 and names[0].endswith(f"-{end:016X}.parquet")
    assert (first / names[0]).read_bytes() == (second / names[0]).read_bytes()


def test_a_terminated_backend_is_transient_and_nothing_is_lost_or_repeated(pgdb, tmp_path):
    with pgdb.connect() as conn:
        prepare(conn, _create(conn))
        background = start_in_background(pgdb, _staging(tmp_path), segment_max_seconds=0.2)
        terminated: int | None = None

        def holds_again() -> bool:  # a new session, not the terminated one letting go
            return slot_health(conn).active_pid not in (None, terminated)

        def confirmed_up_to(lsn: int) -> bool:
            return confirmed_flush(conn) >= lsn

        try:
            for i in range(3):
                wait_for(holds_again, "the reader to hold the slot")
                conn.execute("INSERT INTO t_default SELECT g, 'x', %s FROM generate_series(1, 50) g"
                             " ON CONFLICT (id) DO UPDATE SET n = excluded.n", (i,))
                target = current_lsn(conn)
                wait_for(functools.partial(confirmed_up_to, target),
                         "the changes to be sealed and confirmed")
                terminated = conn.execute(
                    "SELECT active_pid FROM pg_replication_slots"
                    " WHERE slot_name = 's' AND pg_terminate_backend(active_pid)").fetchone()[0]
            wait_for(holds_again, "the reader to reconnect")
        finally:
            background.finish()
        reconnects = background.metrics.registry.get_sample_value("lakeslot_reader_reconnects_total")
        assert reconnects is not None and reconnects >= 3

    _, rows = staged(_staging(tmp_path))
    assert [(r.op, new_tuple(r)["n"]) for r in rows if r.op != "C"] == (
        [("I", "0")] * 50 + [("U", "1")] * 50 + [("U", "2")] * 50)


def test_types_origins_and_text_form_do_not_depend_on_the_database_defaults(pgdb, tmp_path):
    """User-defined types are named by pgoutput's Type messages (a domain by its base type),
    built-in ones by the catalog; a replayed transaction carries its replication origin; values
    are in the reader's pinned text form (UTC, ISO) whatever the database's defaults say."""
    with pgdb.connect() as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET TimeZone = 'Asia/Kolkata'").format(
            sql.Identifier(pgdb.name)))
        conn.execute(sql.SQL("ALTER DATABASE {} SET DateStyle = 'SQL, DMY'").format(
            sql.Identifier(pgdb.name)))
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
        conn.execute("CREATE DOMAIN positive AS int CHECK (VALUE > 0)")
        conn.execute("CREATE TABLE typed (id int PRIMARY KEY, m mood, p positive, a int[],"
                     " ms mood[], j jsonb, ts timestamptz, d date)")
        prepare(conn, [TableName("public", "typed")])
        conn.execute("INSERT INTO typed VALUES (1, 'happy', 7, '{1,NULL,3}', '{sad}',"
                     " '{\"k\": [1, 2]}', '2024-01-02 03:04:05.5+00', '2024-12-31')")
        conn.execute("SELECT pg_replication_origin_create('upstream')")
    with pgdb.connect() as replayer:  # a session replaying another node's changes
        replayer.execute("SELECT pg_replication_origin_session_setup('upstream')")
        replayer.execute("INSERT INTO typed (id, m) VALUES (2, 'sad')")
    with pgdb.connect() as conn:
        read_until(pgdb, _staging(tmp_path), current_lsn(conn))

    _, rows = staged(_staging(tmp_path))
    inserts = [r for r in rows if r.op == "I"]
    assert inserts[0].new == {"id": "1", "m": "happy", "p": "7", "a": "{1,NULL,3}",
                              "ms": "{sad}", "j": '{"k": [1, 2]}',
                              "ts": "2024-01-02 03:04:05.5+00", "d": "2024-12-31"}
    types = {c.name: (c.type_schema, c.type_name) for c in relation_of(inserts[0]).columns}
    assert types == {"id": ("pg_catalog", "int4"), "m": ("public", "mood"),
                     "p": ("pg_catalog", "int4"), "a": ("pg_catalog", "_int4"),
                     "ms": ("public", "_mood"), "j": ("pg_catalog", "jsonb"),
                     "ts": ("pg_catalog", "timestamptz"), "d": ("pg_catalog", "date")}
    assert [r.origin for r in rows if r.op == "C"] == [None, "upstream"]
