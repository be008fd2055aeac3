"""Reading each mirror table's lakeslot.lsn from Iceberg (pyiceberg, no Spark) — the source of
truth for snapshot and apply progress (DESIGN.md invariant 1)."""

from __future__ import annotations

import uuid

from lakeslot.api.models import CatalogSpec, PostgresIngestion
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.mirror import catalogs
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.contract import LSN_PROPERTY, RESNAPSHOT_SUMMARY


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


def _aged(spark, catalog: str, namespace: str, name: str) -> None:
    """A table with a history as a mirror has one: a re-snapshot's commit, commits at 20
    positions, a tag, then someone else's compaction (a ``replace`` without ``lakeslot.lsn``:
    its position is its parent's)."""
    qualified = f"{catalog}.{namespace}.{name}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.{namespace}")
    spark.sql(f"CREATE TABLE {qualified} (id bigint) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")
    for lsn in range(10, 31):
        write = spark.createDataFrame([(lsn,)], "id bigint").writeTo(qualified).option(
            f"snapshot-property.{LSN_PROPERTY}", str(lsn))
        if lsn == 10:
            write = write.option(f"snapshot-property.{RESNAPSHOT_SUMMARY}", "true")
        write.append()
        if lsn == 20:
            spark.sql(f"ALTER TABLE {qualified} CREATE TAG `lakeslot-cut-20`")
    spark.sql(f"CALL {catalog}.system.rewrite_data_files(table => '{namespace}.{name}', "
              "options => map('rewrite-all', 'true'))").collect()


def _assert_read_alike(spec: CatalogSpec, ident: tuple[str, str], secrets=None) -> None:
    """The table's progress from its whole metadata and from what the progress readers parse
    are the same, and the latter holds three snapshots: the compaction, the commit it has its
    position from, the re-snapshot."""
    whole, = catalogs.load_tables(spec, [ident], secrets)
    trimmed, = catalogs.load_tables(spec, [ident], secrets, trim=mirror_progress.what_progress_reads)
    assert whole is not None and trimmed is not None
    assert len(whole.snapshots()) == 22 and len(whole.metadata.refs) == 2
    summaries = {s.snapshot_id: s.summary for s in trimmed.snapshots() if s.summary is not None}
    assert summaries[whole.metadata.current_snapshot_id or -1].operation.value == "replace"
    assert sorted(s.get(LSN_PROPERTY) or "-" for s in summaries.values()) == ["-", "10", "30"]
    progress = mirror_progress.progress_of(trimmed)
    assert progress == mirror_progress.progress_of(whole)
    assert (progress.lsn, progress.rows, progress.resnapshots_last_hour) == (30, 21, 1)


def test_the_progress_readers_parse_only_the_history_they_read(spark, spark_warehouse,
                                                               iceberg_namespace):
    """A mirror aged a day lists ≈ 185 snapshots, which pyiceberg parses for every read (8.8 ms
    against 0.4 ms for a fresh one): the progress readers keep only the current snapshot, the
    ``replace`` ancestors its position comes from, and the re-snapshot commits."""
    catalog, namespace = iceberg_namespace.split(".", 1)
    _aged(spark, catalog, namespace, "aged")
    spec = CatalogSpec.model_validate({"type": "hadoop", "name": catalog,
                                       "warehouse": spark_warehouse.as_uri()})
    _assert_read_alike(spec, (namespace, "aged"))


def test_the_progress_readers_parse_only_the_history_they_read_through_a_rest_catalog(
        rest_spark, object_store):
    """The same through the REST catalog: the client's answers are trimmed before pyiceberg
    parses them."""
    spec = CatalogSpec.model_validate(object_store.catalog_document())
    namespace = f"aged_{uuid.uuid4().hex[:8]}"
    _aged(rest_spark, spec.name, namespace, "aged")
    try:
        _assert_read_alike(spec, (namespace, "aged"), object_store.catalog_secrets())
    finally:
        rest_spark.sql(f"DROP TABLE {spec.name}.{namespace}.aged PURGE")
