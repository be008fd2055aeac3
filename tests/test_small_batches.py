"""The driver's path for small batches (:mod:`lakeslot.apply.small_batches`): a table's changes
committed as one Iceberg row delta from the driver, not a Spark MERGE — on real PostgreSQL,
real Spark and Iceberg; every mirror read back independently (pyiceberg or Spark's own scan)
and compared with its source row by row.

Which path committed is told by the snapshot itself: Spark's MERGE records ``spark.app.id`` in
its summary, the driver's row delta does not."""

from __future__ import annotations

import random

import pytest
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.source.columns import describe
from lakeslot.source.tables import existing
from lakeslot.spark import row_delta
from lakeslot.spark.tables import Tables
from tests.support.apply_support import Pipeline, assert_mirror_equals_source, workload_pipeline
from tests.support.apply_workload import IDLE, KEYLESS, MAIN, Workload
from tests.test_apply_job import stream_every_type
from tests.test_typemap import COLUMNS, T, _create_table, _create_types


def _commits(pipeline: Pipeline, table: TableName) -> list[tuple[str, bool]]:
    """(operation, made by Spark) of each snapshot of the table's mirror, oldest first."""
    rows = pipeline.spark.sql(
        f"SELECT operation, summary['spark.app.id'] IS NOT NULL AS spark "
        f"FROM {pipeline.target(table)}.snapshots ORDER BY committed_at").collect()
    return [(r.operation, r.spark) for r in rows]


def _compact(pipeline: Pipeline, table: TableName) -> None:
    """Another writer's compaction of the mirror (every data file rewritten)."""
    catalog = pipeline.namespace.split(".", 1)[0]
    name = pipeline.target(table).split(".", 1)[1].replace("`", "")
    pipeline.spark.sql(f"CALL {catalog}.system.rewrite_data_files(table => '{name}', "
                       "options => map('rewrite-all', 'true'))").collect()


ORDERS = TableName("public", "orders")


def _change_orders(conn, rng: random.Random, count: int) -> None:
    """Random inserts, updates, key changes and deletes of ``orders``, a few per transaction."""
    for _ in range(count):
        with conn.transaction():
            for _ in range(rng.randint(1, 3)):
                keys = [r[0] for r in conn.execute("SELECT id FROM orders")]
                roll = rng.random()
                if roll < 0.35 or not keys:
                    conn.execute("INSERT INTO orders VALUES ((SELECT coalesce(max(id), 0) + 1 "
                                 "FROM orders), %s, %s, now(), %s)",
                                 (rng.choice(["a", None, "ü ' \" `"]), rng.randint(-10**6, 10**6) / 100,
                                  [rng.choice(["x", None, "y z"])]))
                elif roll < 0.75:
                    conn.execute("UPDATE orders SET amount = amount + 1, note = %s WHERE id = %s",
                                 (f"n{rng.randint(0, 99)}", rng.choice(keys)))
                elif roll < 0.85:
                    conn.execute("UPDATE orders SET id = (SELECT max(id) + 1 FROM orders) "
                                 "WHERE id = %s", (rng.choice(keys),))
                else:
                    conn.execute("DELETE FROM orders WHERE id = %s", (rng.choice(keys),))


def _with_orders(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch
                 ) -> Pipeline:
    """The workload's tables and ``orders`` (200 rows), which the driver's path can take."""
    pipeline = workload_pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path,
                                 monkeypatch)
    with pipeline.pgdb.connect() as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, note text, amount numeric(12,2), "
                     "at timestamptz, tags text[])")
        conn.execute("INSERT INTO orders SELECT g, 'n' || g, g / 7.0, now(), ARRAY['t' || g] "
                     "FROM generate_series(1, 200) g")
    return Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace, pipeline.staging,
                           [*pipeline.tables, ORDERS], table_options={KEYLESS: {"keyColumns": ["a"]}})


@pytest.mark.slow
def test_small_batches_are_committed_by_the_driver_and_stay_exact(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    """Random inserts, updates, key changes and deletes in multi-statement transactions, pass
    after pass over the same keys (their positions found in files the driver itself wrote),
    another writer's compaction between passes (the files the driver knew are gone), a TRUNCATE
    (that pass takes the MERGE), alongside the workload's tables in the same passes — one whose
    updates leave TOASTed values unchanged (the driver takes them from the mirror's rows), one
    with keyColumns PostgreSQL does not keep unique (always the MERGE): every table equals its
    source after every pass (pyiceberg), and the plain table's passes were committed by the
    driver."""
    pipeline = _with_orders(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path,
                            monkeypatch)
    pipeline.start_slot()
    pipeline.snapshot()
    rng = random.Random(34)
    main_by_driver = 0
    with pipeline.pgdb.connect(autocommit=True) as conn:
        workload = Workload(conn, rng)
        for phase in range(5):
            main_before = len(_commits(pipeline, MAIN))
            before = len(_commits(pipeline, ORDERS))
            workload.run(10)
            _change_orders(conn, rng, 15)
            if phase == 3:
                conn.execute("TRUNCATE orders")
                _change_orders(conn, rng, 5)
            pipeline.seal()
            result = pipeline.apply()
            assert result.ok, result.tables
            made = _commits(pipeline, ORDERS)[before:]
            assert made and all(spark_made == (phase == 3) for _, spark_made in made), (phase, made)
            main_by_driver += sum(not spark_made for _, spark_made in _commits(pipeline, MAIN)[main_before:])
            for table in (MAIN, KEYLESS, IDLE, ORDERS):
                assert_mirror_equals_source(pipeline, spark_warehouse, table)
            if phase == 1:
                _compact(pipeline, ORDERS)
    assert main_by_driver >= 3, main_by_driver  # (its unchanged TOAST values from the mirror)
    assert any(spark_made for op, spark_made in _commits(pipeline, KEYLESS) if op != "append")


@pytest.mark.slow
def test_a_compaction_between_finding_positions_and_committing_is_refused_and_the_merge_applies(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    """Another writer rewrites the table's files after the driver found its rows' positions and
    before it commits: Iceberg refuses the row delta (nothing of it is committed), the table's
    MERGE applies the batch instead, and the mirror equals its source."""
    pipeline = _with_orders(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path,
                            monkeypatch)
    pipeline.start_slot()
    pipeline.snapshot()
    refused: list[str] = []
    original = row_delta.commit

    def compacted_first(jvm, table, *rest, **named):
        if str(table.name()).endswith(pipeline.job_input().names.mirror_table(ORDERS)):
            _compact(pipeline, ORDERS)
            try:
                return original(jvm, table, *rest, **named)
            except row_delta.Conflict as e:
                refused.append(str(e))
                raise
        return original(jvm, table, *rest, **named)

    monkeypatch.setattr(row_delta, "commit", compacted_first)
    with pipeline.pgdb.connect() as conn:
        _change_orders(conn, random.Random(35), 20)
        pipeline.seal()
        before = len(_commits(pipeline, ORDERS))
        assert pipeline.apply().ok
    assert refused, "the row delta was not refused"
    operations = _commits(pipeline, ORDERS)[before:]
    assert [op for op, _ in operations] == ["replace", "overwrite"] and operations[1][1], operations
    assert_mirror_equals_source(pipeline, spark_warehouse, ORDERS)


def test_without_row_deltas_in_the_jvm_small_batches_take_the_merge(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    """A JVM without lakeslot's RowDeltas (no JDK where it ran: lakeslot.spark.helpers): the same
    small batches are applied by Spark MERGEs, and the mirror equals its source."""
    monkeypatch.setattr(row_delta, "available", lambda jvm: False)
    pipeline = _with_orders(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path,
                            monkeypatch)
    pipeline.start_slot()
    pipeline.snapshot()
    with pipeline.pgdb.connect(autocommit=True) as conn:
        _change_orders(conn, random.Random(36), 15)
    pipeline.seal()
    before = len(_commits(pipeline, ORDERS))
    assert pipeline.apply().ok
    made = _commits(pipeline, ORDERS)[before:]
    assert made and all(spark_made for _, spark_made in made), made
    assert_mirror_equals_source(pipeline, spark_warehouse, ORDERS)


def _eligible_columns(pgdb) -> list[tuple]:
    """The type test's columns whose mirror type the driver's path writes (its types created)."""
    probe = TableName("public", "probe")
    with pgdb.connect() as conn:
        _create_types(conn)
        _create_table(conn, COLUMNS, probe)
        mapped = {m.name: m.iceberg(0) for m in describe(conn, existing(conn, [probe])[probe])}
        conn.execute(sql.SQL("DROP TABLE {}").format(probe.sql()))
    return [c for c in COLUMNS if row_delta.writes(mapped[c[0]])]


def test_every_type_the_driver_writes_streams_value_by_value(spark, spark_warehouse,
                                                             iceberg_namespace, pgdb, tmp_path,
                                                             monkeypatch):
    """The type test's extreme values (NaN, infinities, the widest numerics and timestamps,
    bytea, unicode, lists) through pgoutput text and the driver's row delta, read back value by
    value and type by type (tests/test_apply_job.py's stream_every_type), and counted by
    Spark's own scan."""
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    columns = _eligible_columns(pgdb)
    assert len(columns) >= 20, [c[0] for c in columns]
    with pgdb.connect() as conn:
        _create_table(conn, columns)
    pipeline = stream_every_type(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, columns)
    assert _commits(pipeline, T)[-1] == ("overwrite", False)
    loaded = Tables(spark, *iceberg_namespace.split(".", 1)).iceberg_table(
        pipeline.job_input().names.mirror_table(T))
    assert spark.sql(f"SELECT count(*) FROM {pipeline.target(T)}").collect()[0][0] == 4
    assert loaded.currentSnapshot().summary().get("added-position-delete-files") == "1"
