"""Configured key columns are checked on the snapshot's rows (PostgreSQL 15 and 18): a duplicate
key value or a NULL in a key column fails that table with the value and the fix, before anything
is copied; a key PostgreSQL guarantees (a unique index on NOT NULL columns) is not queried; the
check sees exactly the exported snapshot (a duplicate committed after it does not count). One
Spark test runs the whole snapshot job: the bad table fails, the other one is mirrored exactly;
another streams duplicates into tables whose keys PostgreSQL does not keep unique."""

from __future__ import annotations

import pytest

from lakeslot.api.naming import TableName
from lakeslot.snapshot import job as snapshot_job
from lakeslot.snapshot import plan
from lakeslot.snapshot.plan import TableRequest
from lakeslot.source import keys
from lakeslot.source.columns import ColumnOptions
from lakeslot.source.connection import connect
from lakeslot.source.exported_snapshot import exported_snapshot, import_statements
from lakeslot.source.tables import existing
from tests.support.apply_support import Pipeline, assert_mirror_equals_source
from tests.support.fixtures_pg import Database, connection_settings
from tests.support.snapshot_helpers import make_job, mirror_rows, source_rows, target_name, without_lsn

T = TableName("public", "keyed")
FIX = "choose keyColumns that are unique and never NULL"


def _create(pgdb: Database, ddl: str, rows: str) -> None:
    with pgdb.connect() as conn:
        conn.execute(ddl)
        conn.execute(f"INSERT INTO {T.name} VALUES {rows}")
        conn.execute(f"ALTER TABLE {T.name} REPLICA IDENTITY FULL")


def _plan(pgdb: Database, *requests: TableRequest, after_export=None):
    settings = connection_settings(pgdb)
    with exported_snapshot(settings, "lakeslot-test") as snapshot:
        if after_export is not None:
            after_export()
        with connect(settings, "lakeslot-test-plan") as conn:
            for statement in import_statements(snapshot.name):
                conn.execute(statement)
            plans = plan.inspect(conn, list(requests), target_range_bytes=1 << 30)
            conn.execute("COMMIT")
    return plans


def _failure(pgdb: Database, key: tuple[str, ...], table: TableName = T) -> str:
    (result,) = _plan(pgdb, TableRequest(table, "t", ColumnOptions(key_columns=key)))
    assert isinstance(result, plan.TableFailure), result
    return result.message


def test_a_duplicate_key_value_fails_the_table_naming_the_value_and_the_fix(pgdb):
    _create(pgdb, f"CREATE TABLE {T.name} (a int, b text, c text)",
            "(1, 'x', 'one'), (2, 'x', 'two'), (1, 'y', 'three'), (1, 'x', 'four')")
    message = _failure(pgdb, ("a", "b"))
    assert "keyColumns (a, b) are not unique: 2 rows have (a, b) = (1,x)" in message
    assert message.startswith(f"table {T}: ") and FIX in message
    assert "REPLICA IDENTITY USING INDEX" in message and "PRIMARY KEY" in message
    # unique columns pass
    (ok,) = _plan(pgdb, TableRequest(T, "t", ColumnOptions(key_columns=("c",))))
    assert isinstance(ok, plan.TablePlan) and [c.name for c in ok.columns if c.required] == ["c"]


def test_a_null_in_a_key_column_fails_the_table(pgdb):
    _create(pgdb, f"CREATE TABLE {T.name} (a int, b text, c text)",
            "(1, 'x', 'one'), (2, NULL, 'two')")
    message = _failure(pgdb, ("a", "b"))
    assert "a row has a NULL in key columns (a, b) = (2,)" in message and FIX in message
    # a unique index does not help while the column may hold NULL: the data is still checked
    with pgdb.connect() as conn:
        conn.execute(f"CREATE UNIQUE INDEX keyed_ab ON {T.name} (a, b)")
    assert "a row has a NULL" in _failure(pgdb, ("a", "b"))


def test_types_without_equality_and_odd_identifiers_are_checked_by_their_text_form(pgdb):
    table = TableName("Odd Schema", 'we"ird')
    with pgdb.connect() as conn:
        conn.execute('CREATE SCHEMA "Odd Schema"')
        conn.execute(f'CREATE TABLE {table.sql().as_string(conn)} ("k ey" json, v int)')
        conn.execute(f"""INSERT INTO {table.sql().as_string(conn)} VALUES
                         ('{{"a": 1}}', 1), ('{{"a": 2}}', 2), ('{{"a": 1}}', 3)""")
    message = _failure(pgdb, ("k ey",), table)
    assert 'keyColumns ("k ey") are not unique: 2 rows have ("k ey") = ("{""a"": 1}")' in message
    assert 'ALTER TABLE "Odd Schema"."we""ird" REPLICA IDENTITY' in message


def test_duplicates_across_partitions_are_found(pgdb):
    with pgdb.connect() as conn:
        conn.execute(f"CREATE TABLE {T.name} (a int, part int) PARTITION BY LIST (part)")
        conn.execute(f"CREATE TABLE keyed_1 PARTITION OF {T.name} FOR VALUES IN (1)")
        conn.execute(f"CREATE TABLE keyed_2 PARTITION OF {T.name} FOR VALUES IN (2)")
        conn.execute(f"INSERT INTO {T.name} VALUES (7, 1), (8, 1), (7, 2)")
    assert "2 rows have (a) = (7)" in _failure(pgdb, ("a",))


def test_the_check_sees_the_exported_snapshot_only(pgdb):
    _create(pgdb, f"CREATE TABLE {T.name} (a int, b text)", "(1, 'x'), (2, 'y')")

    def add_duplicate() -> None:
        with pgdb.connect() as conn:
            conn.execute(f"INSERT INTO {T.name} VALUES (1, 'later')")

    (result,) = _plan(pgdb, TableRequest(T, "t", ColumnOptions(key_columns=("a",))), after_export=add_duplicate)
    assert isinstance(result, plan.TablePlan)
    assert "2 rows have (a) = (1)" in _failure(pgdb, ("a",))  # the next snapshot sees it


def test_a_unique_index_on_not_null_columns_is_trusted_without_reading_the_table(pgdb):
    _create(pgdb, f"CREATE TABLE {T.name} (a int NOT NULL, b text NOT NULL, c text)",
            "(1, 'x', 'one'), (2, 'x', 'two')")
    with pgdb.connect() as conn:
        oid = existing(conn, [T])[T]
        assert not keys.guaranteed(conn, oid, ["a", "b"])
        conn.execute(f"CREATE UNIQUE INDEX keyed_a_partial ON {T.name} (a) WHERE c <> 'x'")
        conn.execute(f"CREATE UNIQUE INDEX keyed_lower ON {T.name} ((a + 0))")
        assert not keys.guaranteed(conn, oid, ["a", "b"])  # partial / expression: no guarantee
        conn.execute(f"CREATE UNIQUE INDEX keyed_a ON {T.name} (a) INCLUDE (c)")
        assert keys.guaranteed(conn, oid, ["a", "b"])  # a unique ⇒ (a, b) unique
        assert keys.guaranteed(conn, oid, ["a"])
        assert not keys.guaranteed(conn, oid, ["b"])
        assert not keys.guaranteed(conn, oid, ["a", "c"])  # c may be NULL
        keys.check(conn, T, oid, ["a", "b"])  # guaranteed: returns without a query


def test_the_data_is_checked_only_for_configured_keys_postgresql_does_not_keep_unique(pgdb):
    _create(pgdb, f"CREATE TABLE {T.name} (a int NOT NULL, b text)", "(1, 'x')")
    with pgdb.connect() as conn:
        oid = existing(conn, [T])[T]
        assert not keys.must_check(conn, oid, [])  # the replica identity's key: PostgreSQL's
        assert keys.must_check(conn, oid, ["a"])
        conn.execute(f"CREATE UNIQUE INDEX keyed_a ON {T.name} (a)")
        assert not keys.must_check(conn, oid, ["a"])
        assert keys.must_check(conn, oid, ["b"])
        assert not keys.must_check(conn, oid, ["b"], ["a"])  # the key the mirror has decides


def test_a_not_valid_not_null_constraint_is_no_guarantee(pg_cluster_factory):
    """PostgreSQL 18 sets attnotnull for ``NOT NULL … NOT VALID`` while old rows may be NULL."""
    cluster = pg_cluster_factory.get("pg18")
    name = "t_keys_not_valid"
    cluster.create_database(name)
    try:
        db = Database(cluster, name)
        with db.connect() as conn:
            conn.execute(f"CREATE TABLE {T.name} (a int)")
            conn.execute(f"INSERT INTO {T.name} VALUES (1), (NULL)")
            conn.execute(f"ALTER TABLE {T.name} ADD CONSTRAINT a_nn NOT NULL a NOT VALID")
            conn.execute(f"CREATE UNIQUE INDEX keyed_a ON {T.name} (a)")
            oid = existing(conn, [T])[T]
            assert conn.execute("SELECT attnotnull FROM pg_attribute WHERE attrelid = %s "
                                "AND attname = 'a'", (oid,)).fetchone() == (True,)
            assert not keys.guaranteed(conn, oid, ["a"])
        assert "a row has a NULL in key columns (a) = ()" in _failure(db, ("a",))
    finally:
        cluster.drop_database(name)


@pytest.mark.slow
def test_the_snapshot_job_fails_the_table_with_duplicate_keys_and_copies_the_others(
        spark, spark_warehouse, iceberg_namespace, pgdb):
    good = TableName("public", "good")
    _create(pgdb, f"CREATE TABLE {T.name} (a int, b text)", "(1, 'x'), (1, 'x'), (2, 'y')")
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE good (a int, b text)")
        conn.execute("INSERT INTO good SELECT g, 'v' || g FROM generate_series(1, 500) g")
        conn.execute("ALTER TABLE good REPLICA IDENTITY FULL")
    job = make_job(pgdb, iceberg_namespace, [
        TableRequest(T, target_name(T), ColumnOptions(key_columns=("a",))),
        TableRequest(good, target_name(good), ColumnOptions(key_columns=("a",)))])
    result = snapshot_job.copy(spark, job)
    outcome = {t.source: t for t in result.tables}
    error = outcome[T].error
    assert outcome[T].state == "failed" and error is not None and "2 rows have (a) = (1)" in error
    assert outcome[good].state == "committed"
    with pgdb.connect() as conn:
        expected = source_rows(conn, good, "a")
    assert without_lsn(mirror_rows(spark_warehouse, iceberg_namespace, good, "a")) == expected
    tables = {r.tableName for r in spark.sql(f"SHOW TABLES IN {iceberg_namespace}").collect()}
    assert target_name(good) in tables and target_name(T) not in tables  # nothing of it written


# -- while streaming ---------------------------------------------------------------------------

LOOSE, BATCH, STRICT = (TableName("public", n) for n in ("loose", "batch_dup", "strict"))


@pytest.mark.slow
def test_a_duplicate_key_inserted_while_streaming_stops_the_table_and_collapses_nothing(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    """keyColumns without a unique index: an insert of a key the mirror holds, and two inserts
    of one key in a batch, stop their tables with the key and the fix, the mirror as it was;
    re-inserting a deleted key and a unique index are fine."""
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    tables = [LOOSE, BATCH, STRICT]
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE loose (code text NOT NULL, v int)")
        conn.execute("CREATE TABLE batch_dup (code text NOT NULL, v int)")
        conn.execute("CREATE TABLE strict (code text NOT NULL UNIQUE, v int)")
        for table in tables:
            conn.execute(f"ALTER TABLE {table.name} REPLICA IDENTITY FULL")
            conn.execute(f"INSERT INTO {table.name} SELECT 'k' || g, g FROM generate_series(1, 5) g")
    options = {t: {"keyColumns": ["code"]} for t in tables}
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), tables, options)
    pipeline.start_slot()
    pipeline.snapshot()
    with pgdb.connect() as conn:
        for table in tables:  # legitimate: delete and insert the same key again, new keys
            conn.execute(f"DELETE FROM {table.name} WHERE code = 'k1'")
            conn.execute(f"INSERT INTO {table.name} VALUES ('k1', 10), ('k9', 9)")
        conn.execute("INSERT INTO loose VALUES ('k2', 20)")  # the mirror holds k2
        conn.execute("INSERT INTO batch_dup VALUES ('k7', 1), ('k7', 2)")
    pipeline.seal()
    outcome = {t.source: t for t in pipeline.apply().tables}
    assert outcome[STRICT].state == "applied"
    assert_mirror_equals_source(pipeline, spark_warehouse, STRICT)
    for table, key in ((LOOSE, "('k2',)"), (BATCH, "('k7',)")):
        assert outcome[table].state == "failed", outcome[table]
        error = outcome[table].error or ""
        assert f"(code) = {key}" in error and FIX in error, error
        assert sorted(pipeline.mirror_rows(table, ["code", "v"], key="code")) == [
            (f"k{g}", g) for g in range(1, 6)]  # as snapshotted: nothing applied, nothing lost
