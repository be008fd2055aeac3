"""``spec.source.tables[].textColumns`` end to end, on PostgreSQL 15 and 18: values the type
mapping cannot hold (``timestamp 'infinity'``, ``numeric 'NaN'``) fail the table — in the snapshot
and in streamed changes — with a message naming the setting; listed as text columns they are
mirrored exactly as PostgreSQL's text form, through the snapshot, streamed inserts, updates and
deletes, and a mirror created without a snapshot (``snapshot.mode: never``). The mirror is read
with pyiceberg and compared row by row with the source's own text output."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pytest
from pyiceberg.types import DateType, StringType

from lakeslot.api.naming import TableName
from lakeslot.snapshot import job as snapshot_job
from tests.support.apply_support import Pipeline
from tests.support.snapshot_helpers import mirror, mirror_rows

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

T = TableName("public", "odd_values")
SETTING = "spec.source.tables[].textColumns"
TEXT = ["ts", "tstz", "n", "tsa"]
# ts/tstz/n/tsa: kept as text when listed; nu (unconstrained numeric) is text anyway; d stays a date
DDL = (f"CREATE TABLE {T.name} (id int PRIMARY KEY, ts timestamp, tstz timestamptz, "
       "n numeric(10,2), nu numeric, d date, tsa timestamp[], note text)")
COLUMNS = "id, ts, tstz, n, nu, d, tsa, note"
ODD = ("'infinity', '-infinity', 'NaN', 'NaN', '2024-02-29', "
       "'{infinity,\"2024-01-01 00:00:00\"}', 'odd'")
FINITE = ("'2024-02-29 12:34:56.789', '2024-02-29 12:34:56.5+02', 12.5, 1.50, '0001-01-01', "
          "'{\"1999-12-31 23:59:59.999999\"}', 'finite'")
NULLS = "NULL, NULL, NULL, NULL, NULL, NULL, NULL"


@pytest.fixture
def make_pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    with pgdb.connect() as conn:
        conn.execute(DDL)

    def make(text_columns: list[str], **spec) -> Pipeline:
        options = {T: {"textColumns": text_columns}} if text_columns else {}
        return Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), [T], table_options=options, **spec)
    return make


def _write(pipeline: Pipeline, *statements: str) -> None:
    with pipeline.pgdb.connect() as conn:
        for statement in statements:
            conn.execute(statement)


def _source(pipeline: Pipeline) -> list[dict]:
    """The source rows, text columns as PostgreSQL prints them (UTC, ISO), others as values."""
    with pipeline.pgdb.connect() as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute("SET DateStyle = 'ISO, YMD'")
        cursor = conn.execute(f"SELECT id, ts::text, tstz::text, n::text, nu::text, d, tsa::text, "
                              f"note FROM {T.name} ORDER BY id")
        names = [d.name for d in cursor.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _warehouse(pipeline: Pipeline) -> Path:
    warehouse = pipeline.ingestion.spec.sink.catalog.warehouse
    assert warehouse is not None
    return Path(warehouse)


def _mirror(pipeline: Pipeline) -> list[dict]:
    """The mirror as pyiceberg reads it (not through lakeslot), without ``_lakeslot_lsn``."""
    target = pipeline.job_input().names.mirror_table(T)
    rows = mirror_rows(_warehouse(pipeline), pipeline.namespace, target)
    return [{k: v for k, v in row.items() if k != "_lakeslot_lsn"} for row in rows]


def _assert_mirrored(pipeline: Pipeline) -> None:
    expected = _source(pipeline)
    assert expected, "the source has rows"
    assert _mirror(pipeline) == expected
    schema = mirror(_warehouse(pipeline), pipeline.namespace,
                    pipeline.job_input().names.mirror_table(T)).schema()
    for name in (*TEXT, "nu"):
        assert schema.find_field(name).field_type == StringType(), name
    assert schema.find_field("d").field_type == DateType()


def test_unmappable_values_fail_the_snapshot_and_the_stream_naming_the_setting(make_pipeline):
    pipeline = make_pipeline([])
    _write(pipeline, f"INSERT INTO {T.name} ({COLUMNS}) VALUES (1, {ODD})")
    pipeline.start_slot()
    result = snapshot_job.run(pipeline.spark, pipeline.job_input())
    [outcome] = result.tables
    assert outcome.state == "failed" and outcome.error is not None
    assert SETTING in outcome.error and "(id)=(1)" in outcome.error

    # the row goes; the snapshot succeeds; a streamed value of the same kind stops the table
    _write(pipeline, f"DELETE FROM {T.name}",
           f"INSERT INTO {T.name} ({COLUMNS}) VALUES (2, {FINITE})")
    assert snapshot_job.run(pipeline.spark, pipeline.job_input()).ok
    _write(pipeline, f"INSERT INTO {T.name} (id, ts) VALUES (3, 'infinity')")
    pipeline.seal()
    [applied] = pipeline.apply().tables
    assert applied.state == "failed" and applied.error is not None
    assert SETTING in applied.error and "'ts'" in applied.error and "infinity" in applied.error
    assert _mirror(pipeline) == [{"id": 2, "ts": dt.datetime(2024, 2, 29, 12, 34, 56, 789000),  # noqa: DTZ001
                                  "tstz": dt.datetime(2024, 2, 29, 10, 34, 56, 500000,
                                                      tzinfo=dt.UTC),
                                  "n": Decimal("12.50"), "nu": "1.50", "d": dt.date(1, 1, 1),
                                  "tsa": [dt.datetime(1999, 12, 31, 23, 59, 59, 999999)],  # noqa: DTZ001
                                  "note": "finite"}]  # nothing of the bad change applied


@pytest.mark.slow
def test_text_columns_mirror_the_values_exactly_through_snapshot_and_stream(make_pipeline):
    pipeline = make_pipeline(TEXT)
    _write(pipeline, f"INSERT INTO {T.name} ({COLUMNS}) VALUES (1, {ODD}), (2, {FINITE}), "
                     f"(3, {NULLS})")
    pipeline.start_slot()
    assert snapshot_job.run(pipeline.spark, pipeline.job_input()).ok
    _assert_mirrored(pipeline)

    _write(pipeline,
           f"INSERT INTO {T.name} ({COLUMNS}) VALUES (4, {ODD}), (5, {FINITE})",
           f"UPDATE {T.name} SET ts = '-infinity', n = 'NaN', tsa = '{{-infinity}}' WHERE id = 2",
           f"UPDATE {T.name} SET ts = '2000-01-01', tstz = '2000-01-01 00:00+05', n = -1.25 "
           "WHERE id = 1",
           f"UPDATE {T.name} SET ts = 'infinity', tstz = 'infinity', note = 'was null' WHERE id = 3",
           f"DELETE FROM {T.name} WHERE id = 5")
    pipeline.seal()
    [outcome] = pipeline.apply().tables
    assert outcome.state == "applied", outcome.error  # text columns are not a type change
    _assert_mirrored(pipeline)
    assert [r["ts"] for r in _mirror(pipeline)] == [
        "2000-01-01 00:00:00", "-infinity", "infinity", "infinity"]


@pytest.mark.slow
def test_a_mirror_created_without_a_snapshot_keeps_text_columns_as_text(make_pipeline):
    pipeline = make_pipeline(TEXT, snapshot={"mode": "never"})
    pipeline.start_slot()
    _write(pipeline, f"INSERT INTO {T.name} ({COLUMNS}) VALUES (1, {ODD}), (2, {FINITE})",
           f"UPDATE {T.name} SET n = 'NaN', ts = 'infinity' WHERE id = 2")
    pipeline.seal()
    [outcome] = pipeline.apply().tables
    assert outcome.state == "applied", outcome.error
    _assert_mirrored(pipeline)
