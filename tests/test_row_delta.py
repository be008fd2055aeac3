"""Where the driver's row delta finds the changed keys' rows (lakeslot/spark/row_delta.py), on a
table with several data files and delete files accumulating pass after pass: a long-lived
``Positions`` (its caches applying only what is new) finds exactly the rows Spark's own scan
reports (``_file``, ``_pos``: an independent reader), skips the files whose key bounds exclude
every key, knows the files of the snapshot its own commit made as Iceberg lists them, and the
table read back by pyiceberg equals the model of every change. One round's commit starts from a table
another writer committed to since it was loaded: the catalog refuses that start, Iceberg reloads
and commits on top of the other commit. Real Spark, real Iceberg (hadoop catalog on local disk)."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pyarrow as pa
from pyiceberg.avro.resolver import resolve_reader
from pyiceberg.typedef import Record

from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.spark import row_delta
from lakeslot.spark.tables import Tables

NAMESPACE, NAME = "row_delta", "t"
FID = b"PARQUET:field_id"
KEY = [(1, "id")]
SCHEMA = pa.schema([pa.field("id", pa.int64(), False, {FID: b"1"}),
                    pa.field("v", pa.string(), True, {FID: b"2"}),
                    pa.field("_lakeslot_lsn", pa.int64(), True, {FID: b"3"})])
RANGES = [(1, 250), (251, 500), (501, 750), (751, 1000)]  # one data file each


def _spark_rows(spark, keys: list[int]) -> set[tuple[int, str, int]]:
    listed = ", ".join(map(str, keys))
    return {(r.id, r._file, r._pos) for r in spark.sql(
        f"SELECT id, _file, _pos FROM lakeslot.{NAMESPACE}.{NAME} WHERE id IN ({listed})").collect()}


def _found(found: row_delta.Found) -> set[tuple[int, str, int]]:
    return set(zip(found.rows["1"].to_pylist(), found.rows["file_path"].to_pylist(),
                   found.rows["pos"].to_pylist(), strict=True))


def _listed(files: pa.Table) -> set[tuple]:
    """A snapshot's live files as Positions plans them, with their key bounds (the one bound
    every file has; Iceberg keeps the other columns' too)."""
    return {(f["file_path"], f["content"], f["parquet"], f["sequence"], f["referenced"],
             dict(f["lower"]).get(KEY[0][0] if f["content"] == 0 else row_delta.FILE_PATH_ID),
             dict(f["upper"]).get(KEY[0][0] if f["content"] == 0 else row_delta.FILE_PATH_ID))
            for f in files.to_pylist()}


def _plain(value):
    """A record read from Avro as plain values (pyiceberg's records and lazy maps compare by
    identity)."""
    if isinstance(value, Record):
        return [_plain(value[i]) for i in range(len(value))]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def test_positions_follow_accumulating_deletes_and_skip_files_out_of_range(spark, spark_warehouse):
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lakeslot.{NAMESPACE}")
    spark.sql(f"CREATE OR REPLACE TABLE lakeslot.{NAMESPACE}.{NAME} (id bigint NOT NULL, v string, "
              "_lakeslot_lsn bigint) USING iceberg TBLPROPERTIES ('format-version'='2')")
    for low, high in RANGES:
        spark.sql(f"INSERT INTO lakeslot.{NAMESPACE}.{NAME} SELECT id, CAST(id AS string), 1 "
                  f"FROM range({low}, {high + 1}, 1, 1) AS r(id)")
    model = {i: str(i) for i in range(1, 1001)}
    tables = Tables(spark, "lakeslot", NAMESPACE)
    jvm = spark._jvm
    positions = row_delta.Positions()
    rng = random.Random(7)
    for lsn in range(2, 14):
        # keys from two of the four ranges, some again across rounds (deletes pile up on a file)
        chosen = rng.sample(RANGES, 2)
        keys = sorted({rng.randint(low, min(low + 40, high)) for low, high in chosen for _ in range(5)})
        table = tables.iceberg_table(NAME)
        wanted = pa.table({"1": pa.array(keys, pa.int64())})
        described = row_delta.describe(jvm, table)
        listing = table.currentSnapshot().manifestListLocation()
        assert (described.snapshot, described.listing) == (table.currentSnapshot().snapshotId(), listing)
        # the live files of the snapshot its own last commit made: known without reading it
        # (not after round 7's, made on top of another writer's commit: read)
        assert (positions._cache.get(listing + row_delta.FILES) is not None) == (lsn not in (2, 8))
        found = positions.find(jvm, table, described, KEY, wanted)
        assert _found(found) == _spark_rows(spark, keys)
        fresh = row_delta.Positions()
        assert _found(fresh.find(jvm, table, described, KEY, wanted)) == _found(found)
        assert _listed(found.files) == _listed(fresh._files(jvm, table, listing))
        # only the current snapshot's list is kept: its parent's was superseded
        parent = table.currentSnapshot().parentId()
        if lsn > 2 and parent is not None:
            assert positions._cache.get(table.snapshot(parent).manifestListLocation()
                                        + row_delta.FILES) is None
        # only the files whose key bounds hold one of the keys were read (two of the four
        # files of the first rounds; the files the commits wrote span their own keys)
        files = spark.sql(f"SELECT file_path, readable_metrics.id.lower_bound AS low, "
                          f"readable_metrics.id.upper_bound AS high "
                          f"FROM lakeslot.{NAMESPACE}.{NAME}.data_files").collect()
        assert len(files) >= len(RANGES)
        for file in files:
            holds = any(file.low <= k <= file.high for k in keys)
            assert (fresh._cache.get(file.file_path) is not None) == holds, (file, keys)
        rows = pa.table([pa.array(keys, pa.int64()), pa.array([f"v{lsn}-{k}" for k in keys]),
                         pa.array([lsn] * len(keys), pa.int64())], schema=SCHEMA)
        advanced = None
        if lsn == 7:  # another writer's commit (a table object of its own) since the load
            spark.sql(f"REFRESH TABLE lakeslot.{NAMESPACE}.{NAME}")  # (Spark's cache: a new one)
            writer = Tables(spark, "lakeslot", NAMESPACE)
            writer.advance(NAME, lsn)
            advanced = writer.iceberg_table(NAME).currentSnapshot().snapshotId()
            assert table.currentSnapshot().snapshotId() != advanced  # (stale)
        row_delta.commit(jvm, table, positions, found, found.deletes(), rows, KEY, lsn, "zstd")
        if advanced is not None:  # on top of the other commit: the retry reloaded
            current = table.currentSnapshot()
            assert (current.parentId(), current.summary().get("lakeslot.lsn")) == (advanced, str(lsn))
        model.update({k: f"v{lsn}-{k}" for k in keys})
    mirror = load_hadoop_table(spark_warehouse.as_uri(), (NAMESPACE, NAME))
    assert mirror is not None
    read_back = mirror.scan(selected_fields=("id", "v")).to_arrow()
    assert dict(zip(read_back["id"].to_pylist(), read_back["v"].to_pylist(), strict=True)) == model
    assert read_back.num_rows == len(model)
    spark.sql(f"DROP TABLE lakeslot.{NAMESPACE}.{NAME} PURGE")


def test_manifests_are_read_as_pyicebergs_reader_reads_them_building_a_reader_once(
        spark, iceberg_namespace, monkeypatch):
    """The planning's Avro reads (row_delta._Avro: a reader tree per file schema, built once)
    give pyiceberg's own reader's records, for the manifest list and each manifest; files of
    one schema build one reader (three manifests of one table: one)."""
    from pyiceberg.avro.file import AvroFile
    from pyiceberg.manifest import read_manifest_list

    name = f"{iceberg_namespace}.avro_read"
    spark.sql(f"CREATE TABLE {name} (id bigint NOT NULL, v string) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")
    for low in (1, 11, 21):
        spark.sql(f"INSERT INTO {name} SELECT id, CAST(id AS string) FROM range({low}, {low + 10})")
    catalog, namespace = iceberg_namespace.split(".", 1)
    table = Tables(spark, catalog, namespace).iceberg_table("avro_read")
    listing = table.currentSnapshot().manifestListLocation()
    files = row_delta._JavaIO(spark._jvm, table)
    manifests = list(read_manifest_list(files.new_input(listing)))
    assert len(manifests) == 3
    with row_delta._Avro[row_delta.ManifestFile](files.new_input(listing), row_delta._LISTED,
                                                 row_delta._LISTED_TYPES,
                                                 row_delta._LISTED_ENUMS) as read:
        assert list(read) == manifests
    built = []

    def resolving(*args):
        built.append(args)
        return resolve_reader(*args)

    monkeypatch.setattr(row_delta, "resolve_reader", resolving)
    monkeypatch.setattr(row_delta._Avro, "_built", {})
    for manifest in manifests:
        path, length = manifest.manifest_path, manifest.manifest_length
        with AvroFile[Record](files.new_input(path, length), row_delta._ENTRY) as theirs, \
                row_delta._Avro[Record](files.new_input(path, length), row_delta._ENTRY) as ours:
            assert [_plain(r) for r in ours] == [_plain(r) for r in theirs] != []
    assert len(built) == 1
