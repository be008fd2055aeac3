"""Smoke tests of the Spark + Iceberg runtime: jars, session, catalog, commit properties.

What they prove, on the shared session: an Iceberg v2 table can be created, appended to and
MERGEd into through Spark; the ``lakeslot.lsn`` snapshot summary property (DESIGN invariant 1) can
be set on an append (write option) and on a SQL MERGE (``with_commit_properties``); and pyiceberg,
reading the metadata files independently of Spark, sees the same rows and the same property.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from lakeslot.spark.session import with_commit_properties
from tests.support.fixtures_spark import static_table

UTC = dt.UTC
SCHEMA = "id bigint, amount decimal(10,2), note string, at timestamp"
ROWS = [
    (1, Decimal("10.50"), "first", dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
    (2, Decimal("-0.01"), None, dt.datetime(1999, 12, 31, 23, 59, 59, 123456, tzinfo=UTC)),
    (3, Decimal("99999999.99"), "ünïcode", dt.datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC)),
]


def create_table(spark, table: str) -> None:
    spark.sql(f"CREATE TABLE {table} ({SCHEMA}) USING iceberg TBLPROPERTIES ('format-version'='2')")


def append(spark, table: str, rows, lsn: int | None = None) -> None:
    writer = spark.createDataFrame(rows, SCHEMA).writeTo(table)
    if lsn is not None:
        writer = writer.option("snapshot-property.lakeslot.lsn", str(lsn))
    writer.append()


def snapshots(spark, table: str) -> list[tuple[str, str | None]]:
    """(operation, lakeslot.lsn) of every snapshot, oldest first."""
    rows = spark.sql(
        f"SELECT operation, summary['lakeslot.lsn'] AS lsn FROM {table}.snapshots ORDER BY committed_at"
    ).collect()
    return [(r.operation, r.lsn) for r in rows]


def pyiceberg_rows(spark_warehouse, table: str) -> list[tuple]:
    arrow = static_table(spark_warehouse, table).scan().to_arrow().sort_by("id")
    return [tuple(row.values()) for row in arrow.to_pylist()]


def test_append_with_lsn_property_is_seen_by_spark_and_pyiceberg(spark, spark_warehouse, iceberg_namespace):
    table = f"{iceberg_namespace}.orders"
    create_table(spark, table)
    append(spark, table, ROWS, lsn=0x16B3748)

    assert snapshots(spark, table) == [("append", str(0x16B3748))]
    # Rendered by Spark in the session time zone, which must be UTC.
    spark_rows = spark.sql(f"SELECT id, amount, note, CAST(at AS STRING) AS at FROM {table} ORDER BY id").collect()
    assert [tuple(r) for r in spark_rows] == [
        (1, Decimal("10.50"), "first", "2024-01-02 03:04:05"),
        (2, Decimal("-0.01"), None, "1999-12-31 23:59:59.123456"),
        (3, Decimal("99999999.99"), "ünïcode", "2038-01-19 03:14:08"),
    ]

    pyiceberg_table = static_table(spark_warehouse, table)
    assert pyiceberg_table.metadata.format_version == 2
    assert pyiceberg_table.current_snapshot().summary["lakeslot.lsn"] == str(0x16B3748)
    assert pyiceberg_rows(spark_warehouse, table) == ROWS


def test_merge_commit_carries_lsn_property(spark, spark_warehouse, iceberg_namespace):
    table = f"{iceberg_namespace}.orders"
    create_table(spark, table)
    append(spark, table, ROWS, lsn=100)
    changes = [  # one row per key, as MERGE requires
        (1, Decimal("11.00"), "updated", dt.datetime(2024, 2, 1, tzinfo=UTC), "U"),
        (2, None, None, None, "D"),
        (4, Decimal("4.00"), "inserted", dt.datetime(2024, 2, 2, tzinfo=UTC), "I"),
    ]
    spark.createDataFrame(changes, f"{SCHEMA}, op string").createOrReplaceTempView("changes")
    merge = f"""
        MERGE INTO {table} t USING changes c ON t.id = c.id
        WHEN MATCHED AND c.op = 'D' THEN DELETE
        WHEN MATCHED THEN UPDATE SET amount = c.amount, note = c.note, at = c.at
        WHEN NOT MATCHED AND c.op <> 'D' THEN INSERT (id, amount, note, at) VALUES (c.id, c.amount, c.note, c.at)
    """
    with_commit_properties(spark, {"lakeslot.lsn": "200"}, lambda: spark.sql(merge))
    # The thread-local properties must not leak into later commits.
    append(spark, table, [(5, Decimal("5.00"), "untagged", dt.datetime(2024, 3, 1, tzinfo=UTC))])

    assert snapshots(spark, table) == [("append", "100"), ("overwrite", "200"), ("append", None)]
    expected = [
        (1, Decimal("11.00"), "updated", dt.datetime(2024, 2, 1, tzinfo=UTC)),
        ROWS[2],
        (4, Decimal("4.00"), "inserted", dt.datetime(2024, 2, 2, tzinfo=UTC)),
        (5, Decimal("5.00"), "untagged", dt.datetime(2024, 3, 1, tzinfo=UTC)),
    ]
    assert pyiceberg_rows(spark_warehouse, table) == expected
    assert [s.summary["lakeslot.lsn"] for s in static_table(spark_warehouse, table).snapshots()] == ["100", "200", None]


def test_commit_properties_reraise_action_error_and_are_cleared(spark, iceberg_namespace):
    table = f"{iceberg_namespace}.orders"
    create_table(spark, table)

    def failing_action():
        append(spark, table, ROWS[:1])  # commits inside the tagged scope, then fails
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        with_commit_properties(spark, {"lakeslot.lsn": "300"}, failing_action)
    append(spark, table, ROWS[1:2])

    assert snapshots(spark, table) == [("append", "300"), ("append", None)]
