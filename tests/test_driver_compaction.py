"""A small table's compaction on the driver (lakeslot.spark.driver_compaction), with real Spark
and Iceberg, the tables read back with pyiceberg: one data file with the rows a reader saw —
across added, renamed and widened columns and position deletes —, no delete file, the position
kept; what the driver does not cover takes Spark's action; a commit between the read and the
rewrite fails it and changes nothing."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lakeslot.api.models import MaintenanceSpec
from lakeslot.mirror.contract import LSN_PROPERTY, MAINTENANCE_SUMMARY
from lakeslot.spark import driver_compaction, row_delta
from lakeslot.spark.maintenance import Maintainer
from lakeslot.spark.session import with_commit_properties
from tests.support.fixtures_spark import static_table

SPEC = MaintenanceSpec()
MERGE_ON_READ = ("TBLPROPERTIES ('format-version' = '2', 'write.delete.mode' = 'merge-on-read', "
                 "'write.update.mode' = 'merge-on-read')")


def _java(spark, table: str):
    return spark._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
        spark._jsparkSession, table)


def _rows(warehouse, table: str) -> list[dict]:
    read = static_table(warehouse, table).scan().to_arrow()
    return sorted(read.to_pylist(), key=lambda r: r["id"])


def _current(warehouse, table: str):
    loaded = static_table(warehouse, table)
    return loaded.current_snapshot()


def _evolved(spark, table: str) -> None:
    """A table whose files predate a rename, a widening and an added column, with position
    deletes on several of them, its last commit at ``lakeslot.lsn`` 42."""
    spark.sql(f"CREATE TABLE {table} (id bigint, v string, n int) USING iceberg {MERGE_ON_READ}")
    spark.sql(f"INSERT INTO {table} SELECT id, concat('v', id), CAST(id AS int) FROM range(40)")
    spark.sql(f"INSERT INTO {table} SELECT id, NULL, -1 FROM range(40, 60)")
    spark.sql(f"DELETE FROM {table} WHERE id % 7 = 0")
    spark.sql(f"ALTER TABLE {table} RENAME COLUMN v TO w")
    spark.sql(f"ALTER TABLE {table} ALTER COLUMN n TYPE bigint")
    spark.sql(f"ALTER TABLE {table} ADD COLUMN tags array<string>")
    spark.sql(f"INSERT INTO {table} VALUES (100, 'new', 5000000000, array('a', 'b')), "
              "(101, 'x', NULL, NULL)")
    spark.sql(f"UPDATE {table} SET w = 'changed' WHERE id IN (3, 41, 100)")
    with_commit_properties(spark, {LSN_PROPERTY: "42"},
                           lambda: spark.sql(f"DELETE FROM {table} WHERE id IN (5, 45, 101)"))


def test_a_small_table_is_compacted_on_the_driver_into_one_file_of_the_same_rows(
        spark, spark_warehouse, iceberg_namespace):
    table = f"{iceberg_namespace}.evolved"
    _evolved(spark, table)
    before = _rows(spark_warehouse, table)
    assert len(before) == 60 - 9 + 2 - 3 and int(
        _current(spark_warehouse, table).summary["total-delete-files"]) >= 2
    positions = row_delta.Positions()
    outcome = Maintainer(spark, SPEC, positions).maintain(_java(spark, table), table, idle=True)
    assert outcome is not None and "on the driver" in outcome, outcome
    assert _rows(spark_warehouse, table) == before  # every column of every row, pyiceberg's
    current = _current(spark_warehouse, table)
    summary = current.summary
    assert summary.operation.value == "replace"
    assert summary.get(MAINTENANCE_SUMMARY) == "compaction" and summary.get(LSN_PROPERTY) == "42"
    assert (summary["total-data-files"], summary["total-delete-files"]) == ("1", "0")
    # what the compaction told the planning is what a fresh read of the manifests finds
    java_table = _java(spark, table)
    described = row_delta.describe(spark._jvm, java_table)
    told = positions.files(spark._jvm, java_table, described)
    read = row_delta.Positions().files(spark._jvm, java_table, described)
    columns = ["file_path", "content", "sequence", "referenced"]
    assert told.select(columns).to_pylist() == read.select(columns).to_pylist()
    assert told.num_rows == 1


def test_a_table_whose_rows_are_all_deleted_is_left_without_files(
        spark, spark_warehouse, iceberg_namespace):
    table = f"{iceberg_namespace}.emptied"
    spark.sql(f"CREATE TABLE {table} (id bigint, v string) USING iceberg {MERGE_ON_READ}")
    spark.sql(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
    # every row deleted by position (Spark's DELETE drops a file all of whose rows go: the
    # driver's row delta deletes them as a pass would)
    java_table, positions = _java(spark, table), row_delta.Positions()
    found = positions.find(spark._jvm, java_table, row_delta.describe(spark._jvm, java_table),
                           [(1, "id")], pa.table({"1": pa.array([1, 2], pa.int64())}))
    row_delta.commit(spark._jvm, java_table, positions, found, found.deletes(), None,
                     [(1, "id")], 7, "zstd")
    assert _current(spark_warehouse, table).summary["total-delete-files"] != "0"
    assert _rows(spark_warehouse, table) == []
    outcome = Maintainer(spark, SPEC, positions).maintain(java_table, table, idle=True)
    assert outcome is not None and "rewritten into 0" in outcome and "on the driver" in outcome
    summary = _current(spark_warehouse, table).summary
    assert (summary["total-data-files"], summary["total-delete-files"]) == ("0", "0")
    assert summary.get(LSN_PROPERTY) == "7" and _rows(spark_warehouse, table) == []


@pytest.mark.parametrize("case", ["partitioned", "too big"])
def test_a_table_the_driver_does_not_cover_is_compacted_by_spark(
        spark, spark_warehouse, iceberg_namespace, monkeypatch, case):
    table = f"{iceberg_namespace}.other_{case.replace(' ', '_')}"
    partitioned = "PARTITIONED BY (bucket(2, id))" if case == "partitioned" else ""
    if case == "too big":
        monkeypatch.setattr(driver_compaction, "LIMIT_BYTES", 1)
    spark.sql(f"CREATE TABLE {table} (id bigint, v string) USING iceberg {partitioned} "
              f"{MERGE_ON_READ}")
    spark.sql(f"INSERT INTO {table} SELECT id, 'x' FROM range(50)")
    spark.sql(f"DELETE FROM {table} WHERE id < 10")
    before = _rows(spark_warehouse, table)
    outcome = Maintainer(spark, SPEC, row_delta.Positions()).maintain(
        _java(spark, table), table, idle=True)
    assert outcome is not None and "compacted (" in outcome and "on the driver" not in outcome
    assert _current(spark_warehouse, table).summary["total-delete-files"] == "0"
    assert _rows(spark_warehouse, table) == before


def test_a_commit_between_the_read_and_the_rewrite_fails_it_and_changes_nothing(
        spark, spark_warehouse, iceberg_namespace, monkeypatch):
    """Another writer's delete lands after the rows were read, before the commit: Iceberg's
    validation fails the rewrite, which would have brought the deleted rows back."""
    table = f"{iceberg_namespace}.raced"
    spark.sql(f"CREATE TABLE {table} (id bigint, v string) USING iceberg {MERGE_ON_READ}")
    spark.sql(f"INSERT INTO {table} SELECT id, 'x' FROM range(20)")
    spark.sql(f"DELETE FROM {table} WHERE id < 5")
    real_write = row_delta.write

    def racing(files, path, rows: pa.Table, compression: str) -> bytes:
        spark.sql(f"DELETE FROM {table} WHERE id = 10")  # (between the read and the commit)
        return real_write(files, path, rows, compression)

    monkeypatch.setattr(row_delta, "write", racing)
    with pytest.raises(row_delta.Conflict):
        Maintainer(spark, SPEC, row_delta.Positions()).maintain(
            _java(spark, table), table, idle=True)
    assert [r["id"] for r in _rows(spark_warehouse, table)] == \
        [i for i in range(5, 20) if i != 10]
    assert _current(spark_warehouse, table).summary.operation.value != "replace"
