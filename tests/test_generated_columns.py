"""Generated columns on PostgreSQL 15 and 18: never a NULL the source does not hold.

pgoutput sends stored generated columns only from PostgreSQL 18 on, with the publication option
``publish_generated_columns = stored`` (which lakeslot's publication sets), and virtual ones (18)
never. So on 18 stored generated columns are mirrored and stream like any other column; before 18
— and virtual ones always — they are left out of the mirror by the snapshot and the apply job
alike, and preflight notes it on the table's status with the way to get them. The end-to-end test
compares the mirror (read with pyiceberg) with the source row by row after streamed inserts,
updates and deletes."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from psycopg import sql

from lakeslot.api.models import PostgresIngestion, PostgresIngestionStatus
from lakeslot.api.naming import TableName
from lakeslot.control import steps
from lakeslot.observability.status_report import Report
from lakeslot.snapshot import job as snapshot_job
from lakeslot.source import preflight, publication, slot
from lakeslot.source.columns import ColumnOptions, DescribeError, describe
from lakeslot.source.tables import existing
from tests.support.apply_support import Pipeline
from tests.support.operator_env import ingestion_document
from tests.support.snapshot_helpers import mirror, mirror_rows

T = TableName("public", "gen")
OWNER = "tests/generated"


def _major(conn) -> int:
    return conn.info.server_version // 10000


def _create(conn) -> None:
    """id, a, b, then s and t stored generated; on 18 also v, virtual."""
    virtual = ", v int GENERATED ALWAYS AS (a + 1) VIRTUAL" if _major(conn) >= 18 else ""
    conn.execute(f"CREATE TABLE {T.name} (id int PRIMARY KEY, a int, b text, "
                 "s int GENERATED ALWAYS AS (a * 2) STORED, "
                 f"t text GENERATED ALWAYS AS (upper(b) || '!') STORED{virtual})")


def _mirrored(conn) -> list[str]:
    """The columns the mirror must hold on this server (what logical replication carries)."""
    return ["id", "a", "b", "s", "t"] if _major(conn) >= 18 else ["id", "a", "b"]


def test_describe_mirrors_exactly_the_generated_columns_the_stream_carries(pgdb):
    with pgdb.connect() as conn:
        _create(conn)
        oid = existing(conn, [T])[T]
        assert [c.name for c in describe(conn, oid)] == _mirrored(conn)
        assert [c.name for c in describe(conn, oid, ColumnOptions(exclude_columns=("b",)))] == [
            c for c in _mirrored(conn) if c != "b"]
        left_out = "v" if _major(conn) >= 18 else "s"
        with pytest.raises(DescribeError, match=f"key columns \\['{left_out}'\\] are generated"):
            describe(conn, oid, ColumnOptions(key_columns=(left_out,)))


def test_preflight_notes_the_left_out_columns_and_how_to_get_them(pgdb):
    with pgdb.connect() as conn:
        _create(conn)
        major = _major(conn)
        [finding] = [f for f in preflight.run(conn, [T]) if f.check == "generated_columns"]
        assert finding.ok and finding.note and finding.table == T
        if major >= 18:
            expected = ("virtual generated columns ['v'] are left out of the mirror: logical "
                        "replication never sends them")
        else:
            expected = ("stored generated columns ['s', 't'] are left out of the mirror: "
                        f"PostgreSQL {major} does not send them in logical replication (18 does)")
        assert finding.message == expected
        assert ("upgrade to PostgreSQL 18" in finding.fix) == (major < 18)
        assert preflight.notes([finding]) == [finding] and not preflight.failures([finding])

        excluded = {T: ColumnOptions(exclude_columns=("v",) if major >= 18 else ("s", "t"))}
        [quiet] = [f for f in preflight.run(conn, [T], options=excluded)
                   if f.check == "generated_columns"]
        assert quiet.ok and not quiet.note

        key = {T: ColumnOptions(key_columns=("v",) if major >= 18 else ("s",))}
        [failed] = [f for f in preflight.run(conn, [T], options=key)
                    if f.check == "generated_columns"]
        assert not failed.ok and "are generated columns" in failed.message


def test_the_note_is_the_tables_status_message_until_the_columns_are_gone(pgdb, tmp_path):
    with pgdb.connect() as conn:
        _create(conn)
    ingestion = PostgresIngestion.model_validate(ingestion_document(
        "gen", pgdb, [T], warehouse=str(tmp_path / "w"), staging=(tmp_path / "s").as_uri()))
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    report = Report(PostgresIngestionStatus(), 1, now)
    with pgdb.connect(autocommit=True) as conn:
        assert steps.check_source(conn, ingestion, report) == [T]
        [row] = report.status.tables
        assert row.state == "Pending" and row.message.startswith("note: ")
        assert "left out of the mirror" in row.message

        conn.execute(f"ALTER TABLE {T.name} DROP COLUMN s, DROP COLUMN t")
        if _major(conn) >= 18:
            conn.execute(f"ALTER TABLE {T.name} DROP COLUMN v")
        again = Report(report.status, 1, now)
        assert steps.check_source(conn, ingestion, again) == [T]
        assert again.status.tables[0].message == ""


def _pubgencols(conn, name: str) -> str | None:
    if _major(conn) < 18:
        return None
    row = conn.execute("SELECT pubgencols::text FROM pg_publication WHERE pubname = %s",
                       (name,)).fetchone()
    assert row is not None, f"publication {name} exists"
    return row[0]


def test_the_managed_publication_publishes_stored_generated_columns_from_18_on(pgdb):
    with pgdb.connect(autocommit=True) as conn:
        _create(conn)
        streams = "s" if _major(conn) >= 18 else None
        report = publication.sync(conn, "ours", [T], owner=OWNER)
        assert report.ok and report.created, report.errors
        assert _pubgencols(conn, "ours") == streams

        # an existing publication of ours without the option gets it
        conn.execute("CREATE PUBLICATION older")
        conn.execute(sql.SQL("COMMENT ON PUBLICATION older IS {}").format(
            sql.Literal(publication.MARKER + OWNER)))
        assert publication.sync(conn, "older", [T], owner=OWNER).ok
        assert _pubgencols(conn, "older") == streams

        # one we do not own is reported with the fix, when a table has a stored generated column
        conn.execute(sql.SQL("CREATE PUBLICATION foreign_pub FOR TABLE {}").format(T.sql()))
        verified = publication.sync(conn, "foreign_pub", [T], owner=OWNER)
        assert verified.ok, verified.errors
        if _major(conn) >= 18:  # the table fails alone
            assert verified.failed == {T: (
                "publication foreign_pub (not managed by lakeslot) does not publish its stored "
                "generated columns ['s', 't'], which the mirror holds: ALTER PUBLICATION "
                '"foreign_pub" SET (publish_generated_columns = stored); — or list them in '
                "excludeColumns")}
            # a column list naming them sends them without the option
            conn.execute(sql.SQL("CREATE PUBLICATION listed FOR TABLE {} (id, a, b, s, t)").format(
                T.sql()))
            assert publication.sync(conn, "listed", [T], owner=OWNER).failed == {}
        else:
            assert verified.failed == {}  # nothing to send before 18: the columns are left out
        conn.execute("CREATE TABLE plain (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION foreign_plain FOR TABLE plain")
        assert publication.sync(conn, "foreign_plain", [TableName("public", "plain")],
                                owner=OWNER).ok


@pytest.mark.slow
def test_streamed_changes_never_leave_a_null_the_source_does_not_hold(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    with pgdb.connect(autocommit=True) as conn:
        _create(conn)
        conn.execute(f"INSERT INTO {T.name} (id, a, b) VALUES (1, 1, 'one'), (2, 2, 'two'), "
                     "(3, NULL, NULL)")
        columns = _mirrored(conn)
        # the reader streams publication "p" of slot "s": lakeslot's own publication
        assert publication.sync(conn, "p", [T], owner=OWNER).ok
        slot.ensure(conn, "s")
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), [T])
    assert snapshot_job.run(spark, pipeline.job_input()).ok
    target = pipeline.job_input().names.mirror_table(T)

    def assert_equal() -> None:
        with pgdb.connect() as conn:
            expected = [dict(zip(columns, row, strict=True)) for row in conn.execute(
                sql.SQL("SELECT {} FROM {} ORDER BY id").format(
                    sql.SQL(", ").join(map(sql.Identifier, columns)), T.sql())).fetchall()]
        rows = mirror_rows(Path(spark_warehouse), iceberg_namespace, target)
        assert [{k: v for k, v in r.items() if k != "_lakeslot_lsn"} for r in rows] == expected
        schema = mirror(spark_warehouse, iceberg_namespace, target).schema()
        assert [f.name for f in schema.fields] == [*columns, "_lakeslot_lsn"]

    assert_equal()
    with pgdb.connect(autocommit=True) as conn:
        conn.execute(f"INSERT INTO {T.name} (id, a, b) VALUES (4, 4, 'four'), (5, 5, 'five')")
        conn.execute(f"UPDATE {T.name} SET a = 10 WHERE id = 1")  # s changes, t does not
        conn.execute(f"UPDATE {T.name} SET b = 'deux' WHERE id = 2")  # t changes, s does not
        conn.execute(f"UPDATE {T.name} SET a = 3, b = 'three' WHERE id = 3")  # from NULL
        conn.execute(f"DELETE FROM {T.name} WHERE id = 5")
        conn.execute(f"UPDATE {T.name} SET id = 6 WHERE id = 4")  # a key update
    pipeline.seal()
    [outcome] = pipeline.apply().tables
    assert outcome.state == "applied", outcome.error
    assert_equal()
    rows = mirror_rows(Path(spark_warehouse), iceberg_namespace, target)
    if "s" in columns:  # 18: the streamed values are there, not NULL
        assert [(r["id"], r["s"], r["t"]) for r in rows] == [
            (1, 20, "ONE!"), (2, 4, "DEUX!"), (3, 6, "THREE!"), (6, 8, "FOUR!")]
    else:  # before 18: no such columns at all, rather than NULLs
        assert [r["id"] for r in rows] == [1, 2, 3, 6]
        assert not {"s", "t"} & set(rows[0])
