"""Planning: ctid ranges (pure) and what the catalog says as of the snapshot (PostgreSQL 15, 18)."""

from __future__ import annotations

import pytest

from lakeslot.api.naming import TableName
from lakeslot.mirror import typemap
from lakeslot.snapshot import plan
from lakeslot.snapshot.plan import PageRange, TableRequest
from lakeslot.source import exported_snapshot
from lakeslot.source.columns import ColumnOptions
from tests.support.fixtures_pg import connection_settings


def test_ranges_are_disjoint_cover_every_page_and_end_open():
    assert plan.page_ranges(0, 10) == [PageRange(0, None)]
    assert plan.page_ranges(25, 10) == [PageRange(0, 10), PageRange(10, 20), PageRange(20, None)]
    assert plan.page_ranges(20, 10) == [PageRange(0, 10), PageRange(10, None)]
    assert plan.page_ranges(1000, 10, tid_range_scan=False) == [PageRange(0, None)]


def _predicate_sql(page_range: PageRange) -> str:
    predicate = page_range.predicate()
    assert predicate is not None, f"{page_range} has no predicate"
    return predicate.as_string(None)


def test_range_predicates():
    assert PageRange(0, None).predicate() is None
    assert _predicate_sql(PageRange(0, 10)) == "ctid < '(10,0)'::tid"
    assert _predicate_sql(PageRange(10, None)) == "ctid >= '(10,0)'::tid"
    assert _predicate_sql(PageRange(10, 20)) == "ctid >= '(10,0)'::tid AND ctid < '(20,0)'::tid"


def _inspect(pgdb, requests, target_range_bytes=1 << 30):
    settings = connection_settings(pgdb)
    with exported_snapshot.exported_snapshot(settings, "lakeslot-test") as snapshot, pgdb.connect() as conn:
        for statement in exported_snapshot.import_statements(snapshot.name):
            conn.execute(statement)
        return plan.inspect(conn, requests, target_range_bytes=target_range_bytes)


def test_plan_reads_types_keys_and_partitions(pgdb):
    with pgdb.connect() as conn:
        conn.execute("CREATE DOMAIN money2 AS numeric(8,2)")
        conn.execute("CREATE TABLE plain (a int, b money2[], c text, d int NOT NULL, PRIMARY KEY (d, a))")
        conn.execute("INSERT INTO plain SELECT g, NULL, repeat('x', 500), g FROM generate_series(1, 200) g")
        conn.execute("ANALYZE plain")
        conn.execute("CREATE TABLE parted (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)")
        conn.execute("CREATE TABLE parted_2 PARTITION OF parted FOR VALUES FROM (100) TO (200) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE parted_2a PARTITION OF parted_2 FOR VALUES FROM (100) TO (200)")
        conn.execute("CREATE TABLE empty_parted (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        pages = conn.execute("SELECT relpages FROM pg_class WHERE relname = 'plain'").fetchone()[0]
    plain, parted, empty = _inspect(pgdb, [
        TableRequest(TableName("public", "plain"), "p", ColumnOptions(exclude_columns=("c",))),
        TableRequest(TableName("public", "parted"), "q"),
        TableRequest(TableName("public", "empty_parted"), "r")], target_range_bytes=8192 * 4)
    assert [(m.name, str(m.pg), m.required) for m in plain.columns] == [
        ("a", "int4", True), ("b", "numeric(8,2)[]", False), ("d", "int4", True)]
    assert plain.rows_estimate == 200
    assert len(plain.ranges) == -(-pages // 4) and plain.ranges[-1][1].end is None
    assert sorted(h.name.name for h, _ in parted.ranges) == ["parted_1", "parted_2a"]
    assert empty.ranges == () and [m.name for m in empty.columns] == ["id"]


@pytest.mark.parametrize(("setup", "request_", "message"), [
    ("", TableRequest(TableName("public", "missing"), "x"), "does not exist"),
    ("CREATE TABLE nokey (a int)", TableRequest(TableName("public", "nokey"), "x"), "no key"),
    ("CREATE TABLE t (a int PRIMARY KEY, r regclass)", TableRequest(TableName("public", "t"), "x"),
     "unsupported type regclass"),
    ("CREATE TABLE t (a int PRIMARY KEY)", TableRequest(TableName("public", "t"), "x",
                                                        ColumnOptions(key_columns=("b",))),
     "key columns ['b'] do not exist"),
    ("CREATE TABLE t (a int PRIMARY KEY)", TableRequest(TableName("public", "t"), "x",
                                                        ColumnOptions(exclude_columns=("a",))),
     "cannot be excluded"),
    ("CREATE TABLE t (a float8 PRIMARY KEY)", TableRequest(TableName("public", "t"), "x"), "identifier field"),
])
def test_plan_failures_are_definite_per_table(pgdb, setup, request_, message):
    if setup:
        with pgdb.connect() as conn:
            conn.execute(setup)
    (failure,) = _inspect(pgdb, [request_])
    assert isinstance(failure, plan.TableFailure) and message in failure.message


def test_a_user_type_named_like_a_builtin_is_text(pgdb):
    with pgdb.connect() as conn:
        conn.execute('CREATE TYPE public."uuid" AS ENUM (\'x\')')
        conn.execute('CREATE TABLE t (a int PRIMARY KEY, u public."uuid")')
    (table_plan,) = _inspect(pgdb, [TableRequest(TableName("public", "t"), "x")])
    assert table_plan.columns[1].pg.name == "public.uuid"
    assert table_plan.columns[1].read is typemap.ReadMode.TEXT
