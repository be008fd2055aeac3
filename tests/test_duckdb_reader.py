"""DuckDB reads the mirrors exactly (docs/reading-mirrors.md): the Iceberg extension from PyPI
(pinned in pyproject's test extras, loaded from the packages: no network), compared with the
source row by row.

One pipeline in the hadoop layout (the tests' Spark session, the event trigger installed): a table
of every mapped type (tests/test_typemap.py's columns) and a partitioned table
(``bucket``/``days``), snapshotted, then changed by the stream — inserts, updates and deletes
that the apply job's merge-on-read MERGE leaves as position deletes — and by DDL applied in place:
a renamed column, an added column with a default, a widened column (Iceberg promotion). DuckDB's
``iceberg_scan`` of each table directory must give the source's rows. The REST catalog (OAuth2,
data on S3) is read by DuckDB in tests/test_object_storage.py, on the mirrors that test builds.

DuckDB 1.5.5 reads every type lakeslot maps exactly (docs/reading-mirrors.md says so): the test
collects every value it reads differently and asserts there is none, so a DuckDB that starts to
differ fails here with the columns and values, and the docs' list is to be written from them.
"""

from __future__ import annotations

import datetime as dt

import pytest
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.source import ddl_capture
from tests.support import duckdb_reader
from tests.support.apply_support import Pipeline
from tests.test_typemap import T, _columns, _create, _equal

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

E = TableName("public", "Evolving Ñ")
AT = "Created At"
START = dt.datetime(2026, 3, 1, 10, 30, tzinfo=dt.UTC)


def _create_evolving(conn) -> None:
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, {} timestamptz NOT NULL, "
                         "region text, qty int4, old text)").format(E.sql(), sql.Identifier(AT)))
    _insert(conn, range(1, 41))


def _insert(conn, ids) -> None:
    with conn.cursor() as cursor:
        cursor.executemany(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s)").format(E.sql()),
                           [(i, START + dt.timedelta(hours=7 * i), "xyz"[i % 3] if i % 5 else None,
                             i * 10, f"row {i}") for i in ids])


def _stream(conn, columns) -> None:
    """Every-type rows 3 (row 1's values) and 4 (NULLs), row 2 turned into row 1; the evolving
    table changed around a rename, an added column and a widening."""
    names = sql.SQL(", ").join(sql.Identifier(c[0]) for c in columns)
    conn.execute(sql.SQL("INSERT INTO {} (id, {}) SELECT id + 2, {} FROM {} WHERE id IN (1, 2)")
                 .format(T.sql(), names, names, T.sql()))
    conn.execute(sql.SQL("UPDATE {} t SET ({}) = (SELECT {} FROM {} WHERE id = 1) WHERE t.id = 2")
                 .format(T.sql(), names, names, T.sql()))
    _insert(conn, range(41, 51))
    conn.execute(sql.SQL("UPDATE {} SET {} = {} + interval '3 days', qty = -qty WHERE id % 4 = 0")
                 .format(E.sql(), sql.Identifier(AT), sql.Identifier(AT)))
    conn.execute(sql.SQL("UPDATE {} SET id = id + 1000 WHERE id IN (3, 7)").format(E.sql()))
    conn.execute(sql.SQL("DELETE FROM {} WHERE id IN (5, 6, 45)").format(E.sql()))
    conn.execute(sql.SQL("ALTER TABLE {} RENAME COLUMN old TO renamed").format(E.sql()))
    conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN extra text DEFAULT 'given'").format(E.sql()))
    conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN qty TYPE int8").format(E.sql()))
    conn.execute(sql.SQL("UPDATE {} SET qty = 5000000000 + id, renamed = 'r', extra = NULL "
                         "WHERE id % 3 = 0").format(E.sql()))
    _insert_evolved(conn)


def _insert_evolved(conn) -> None:
    conn.execute(sql.SQL("INSERT INTO {} (id, {}, region, qty, renamed, extra) VALUES "
                         "(60, %s, 'y', 9000000000, 'new', 'set')").format(E.sql(), sql.Identifier(AT)),
                 (START,))


@pytest.mark.slow
def test_duckdb_reads_every_type_position_deletes_partitions_and_evolved_columns_exactly(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    connection = duckdb_reader.connect()
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    columns = _columns(pgdb)
    with pgdb.connect(autocommit=True) as conn:
        assert ddl_capture.ensure(conn, "Auto").mode == "EventTrigger"
        _create(conn, columns)
        _create_evolving(conn)
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), [T, E],
                               table_options={E: {"partitionBy": ["bucket(4, id)", f'days("{AT}")']}})
    pipeline.start_slot()
    pipeline.snapshot()
    with pgdb.connect() as conn:
        _stream(conn, columns)
    pipeline.seal()
    outcome = {t.source: t for t in pipeline.apply().tables}
    assert {t: o.state for t, o in outcome.items()} == {T: "applied", E: "applied"}, outcome
    assert len(outcome[E].ddl) == 3, outcome[E].ddl  # the rename, the column, the widening: in place

    names = pipeline.job_input().names
    directories = {t: spark_warehouse.joinpath(*names.mirror_identifier(t)) for t in (T, E)}
    for table in (T, E):  # merge-on-read: the streamed updates and deletes are position deletes
        deletes = connection.execute("SELECT count(*) FROM iceberg_metadata(?) WHERE content = 'POSITION_DELETES'",
                                     [str(directories[table])]).fetchone()
        assert deletes is not None and deletes[0] > 0, table

    names_e, source_e = duckdb_reader.source_rows(pgdb, E)
    assert "renamed" in names_e and "extra" in names_e
    duckdb_reader.assert_rows_equal(source_e, duckdb_reader.hadoop_rows(connection, directories[E], names_e), E)

    read = duckdb_reader.hadoop_rows(connection, directories[T], ["id", *(c[0] for c in columns)])
    rows = {row[0]: row[1:] for row in read}
    assert sorted(rows) == [1, 2, 3, 4]
    different = {}
    for i, (name, type_, _literal, expected) in enumerate(columns):
        for key in (1, 2, 3):
            if not _equal(rows[key][i], expected):
                different[name] = f"{type_}: {rows[key][i]!r}"
        assert rows[4][i] is None, (name, type_)
    assert different == {}, different  # (docs/reading-mirrors.md: no exception to document)
