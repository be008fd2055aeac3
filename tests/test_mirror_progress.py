"""Reading each mirror table's lakeslot.lsn from Iceberg (pyiceberg, no Spark) — the source of
truth for snapshot and apply progress (DESIGN.md invariant 1)."""

from __future__ import annotations

from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.mirror import progress as mirror_progress


def test_progress_is_the_current_snapshots_lakeslot_lsn(spark, spark_warehouse, iceberg_namespace):
    namespace = iceberg_namespace.split(".", 1)[1]
    ingestion = PostgresIngestion.model_validate({
        "apiVersion": "lakeslot.io/v1alpha1", "kind": "PostgresIngestion",
        "metadata": {"name": "progress"},
        "spec": {"source": {"host": "db", "database": "app", "user": "u", "schemas": ["public"]},
                 "sink": {"catalog": {"type": "hadoop", "warehouse": spark_warehouse.as_uri()},
                          "namespace": namespace},
                 "staging": {"uri": "file:///tmp/unused"}}})
    names = IngestionNames.of(ingestion)
    done, plain, absent = (TableName("Sales", "Order Lines"), TableName("public", "plain"),
                           TableName("public", "absent"))
    assert names.mirror_identifier(done) == (namespace, "sales__order_lines_c2765b86")
    for table in (done, plain):
        spark.sql(f"CREATE TABLE lakeslot.{'.'.join(names.mirror_identifier(table))} (id bigint)"
                  " USING iceberg")
    df = spark.createDataFrame([(1,), (2,), (3,)], "id bigint")
    df.writeTo(f"lakeslot.{namespace}.sales__order_lines_c2765b86").option(
        "snapshot-property.lakeslot.lsn", str(0x16B3748)).append()
    df.writeTo(f"lakeslot.{namespace}.public__plain").append()

    progress = mirror_progress.read(ingestion, [done, plain, absent])
    assert progress[done].lsn == 0x16B3748 and progress[done].rows == 3
    assert progress[done].committed_at_ms is not None
    assert progress[plain].lsn is None and progress[plain].rows == 3  # not written by lakeslot
    assert progress[absent] == mirror_progress.MirrorProgress(None, None, None)


def test_live_rows_are_data_records_minus_position_deletes():
    live = mirror_progress.live_rows
    assert live({"total-records": "1001208", "total-position-deletes": "1208",
                 "total-equality-deletes": "0"}) == 1_000_000
    assert live({"total-records": "55", "total-position-deletes": "5"}) == 50
    assert live({"total-records": "7"}) == 7  # no delete totals: nothing deleted
    # Unknowable from the summary: equality deletes (one may delete any number of rows), a
    # missing total, more deletes than rows (dangling ones someone else's compaction left).
    assert live({"total-records": "10", "total-position-deletes": "0",
                 "total-equality-deletes": "1"}) is None
    assert live({"total-position-deletes": "1"}) is None
    assert live({"total-records": "3", "total-position-deletes": "4"}) is None
