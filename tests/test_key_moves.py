"""A table's key moves at the source — the primary key dropped and added on another column, or the
replica identity set to another unique index — and its mirror follows: the apply job stops that
table for an automatic re-snapshot (``onSchemaChange: Resnapshot``, the default) while the other
tables keep streaming, the copy keys the mirror by the new key (its Iceberg identifier fields), and
changes made between the DDL and the copy end in the mirror too. Under ``onSchemaChange: Error``
the table is stopped with the reason and the way out, not copied. Real PostgreSQL 15 and 18, the
reader, the snapshot and apply jobs on the tests' Spark session; mirrors read with pyiceberg.
"""

from __future__ import annotations

import pytest

from lakeslot.api.naming import TableName
from lakeslot.apply.evolution import moved_key
from lakeslot.control import resnapshot
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.staging.relations import Column, Relation
from tests.support.apply_support import Pipeline, assert_mirror_equals_source

MOVED, SWITCHED, STEADY = (TableName("public", n) for n in ("moved", "switched", "steady"))
SETUP = """
CREATE TABLE moved (id int PRIMARY KEY, code text NOT NULL, v text);
CREATE TABLE switched (id int PRIMARY KEY, code text NOT NULL UNIQUE, v text);
CREATE TABLE steady (id int PRIMARY KEY, v text);
INSERT INTO moved SELECT g, 'c' || g, 'm' || g FROM generate_series(1, 30) g;
INSERT INTO switched SELECT g, 'c' || g, 's' || g FROM generate_series(1, 30) g;
INSERT INTO steady SELECT g, 't' || g FROM generate_series(1, 30) g;
"""
MOVES = """
ALTER TABLE moved DROP CONSTRAINT moved_pkey;
ALTER TABLE moved ADD PRIMARY KEY (code);
UPDATE moved SET v = 'after the move' WHERE id <= 5;
DELETE FROM moved WHERE id = 6;
ALTER TABLE switched REPLICA IDENTITY USING INDEX switched_code_key;
UPDATE switched SET v = 'after the switch' WHERE id <= 5;
UPDATE steady SET v = 'streams on' WHERE id <= 5;
"""
MEANWHILE = """
INSERT INTO moved VALUES (100, 'c100', 'meanwhile');
UPDATE moved SET v = 'meanwhile' WHERE code = 'c7';
DELETE FROM switched WHERE code = 'c8';
UPDATE steady SET v = 'meanwhile' WHERE id = 9;
"""


def _identifiers(pipeline: Pipeline, warehouse, table: TableName) -> list[str]:
    mirror = load_hadoop_table(warehouse.as_uri(), pipeline.job_input().names.mirror_identifier(table))
    assert mirror is not None
    return sorted(mirror.schema().identifier_field_names())


def _pipeline(spark, warehouse, namespace, pgdb, tmp_path, monkeypatch, tables: list[TableName],
              **spec) -> Pipeline:
    """:data:`SETUP`'s tables created, ``tables`` of them snapshotted; ``spec``: sections."""
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    with pgdb.connect(autocommit=True) as conn:
        conn.execute(SETUP)
    pipeline = Pipeline.create(spark, pgdb, warehouse, namespace, (tmp_path / "staging").as_uri(),
                               tables, **spec)
    pipeline.start_slot()
    pipeline.snapshot()
    return pipeline


@pytest.mark.slow
def test_a_moved_key_is_followed_by_a_resnapshot_of_that_table_alone(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    pipeline = _pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch,
                         [MOVED, SWITCHED, STEADY])
    assert _identifiers(pipeline, spark_warehouse, MOVED) == ["id"]

    with pgdb.connect(autocommit=True) as conn:
        conn.execute(MOVES)
    pipeline.seal()
    outcome = {t.source: t for t in pipeline.apply().tables}
    assert outcome[STEADY].state == "applied", outcome[STEADY]  # the others keep streaming
    for table, new in ((MOVED, "code"), (SWITCHED, "code")):
        error = outcome[table].error or ""
        assert outcome[table].state == "failed" and outcome[table].resnapshot, outcome[table]
        assert f"key moved from (id) to ({new})" in error and "copied again on its own" in error, error
    assert_mirror_equals_source(pipeline, spark_warehouse, STEADY)

    with pgdb.connect(autocommit=True) as conn:  # between the DDL and the copy
        conn.execute(MEANWHILE)
    # the control plane's next step copies those two again, alone; the other is not copied
    assert pipeline.copy_again() == {MOVED: "committed", SWITCHED: "committed"}
    assert _identifiers(pipeline, spark_warehouse, MOVED) == ["code"]
    assert _identifiers(pipeline, spark_warehouse, SWITCHED) == ["code"]

    with pgdb.connect(autocommit=True) as conn:  # streaming on, keyed by the new key
        conn.execute("UPDATE moved SET code = 'k1', v = 'key changed' WHERE id = 1")
        conn.execute("UPDATE switched SET v = 'later' WHERE code = 'c9'")
        conn.execute("UPDATE steady SET v = 'later' WHERE id = 10")
    pipeline.seal()
    result = pipeline.apply()
    assert result.ok, result.tables
    for table in (MOVED, SWITCHED, STEADY):
        assert_mirror_equals_source(pipeline, spark_warehouse, table)
    again = mirror_progress.read(pipeline.ingestion, [MOVED, SWITCHED, STEADY])
    assert {t: p.resnapshots_last_hour for t, p in again.items()} == {MOVED: 1, SWITCHED: 1, STEADY: 0}


def _relation(identity: str, *keys: str) -> Relation:
    return Relation(1, "public", "t", identity, tuple(
        Column(name, 23, -1, name in keys) for name in ("id", "code", "v")))


def test_which_descriptions_move_the_key():
    assert moved_key(["id"], [_relation("default", "id")], ()) is None
    assert moved_key(["id"], [_relation("default", "id"), _relation("default", "code")], ()) == ["code"]
    assert moved_key(["id"], [_relation("index", "code")], ()) == ["code"]
    assert moved_key(["id"], [_relation("default")], ()) is None  # the key dropped, none yet
    assert moved_key(["id"], [_relation("full", "id", "code", "v")], ()) is None
    # a renamed key column is the same key: described before the rename, named as the mirror is
    assert moved_key(["ident"], [_relation("default", "id")], ((10, 0, "id", "ident"),)) is None


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)  # (the policy does not depend on the version)
def test_under_on_schema_change_error_a_moved_key_stops_the_table_without_a_copy(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    """The same check under ``onSchemaChange: Error``: stopped, the way out named, not copied."""
    pipeline = _pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch,
                         [MOVED, STEADY], policies={"onSchemaChange": "Error"})
    with pgdb.connect(autocommit=True) as conn:
        conn.execute("ALTER TABLE moved DROP CONSTRAINT moved_pkey; ALTER TABLE moved ADD PRIMARY KEY (code)")
        conn.execute("UPDATE moved SET v = 'x' WHERE id = 2; UPDATE steady SET v = 'x' WHERE id = 2")
    pipeline.seal()
    outcome = {t.source: t for t in pipeline.apply().tables}
    assert outcome[STEADY].state == "applied"
    error = outcome[MOVED].error or ""
    assert outcome[MOVED].state == "failed" and outcome[MOVED].resnapshot
    assert "onSchemaChange is Error" in error and "raise the table's resnapshotGeneration" in error
    progress = mirror_progress.read(pipeline.ingestion, [MOVED, STEADY])
    assert resnapshot.decide(progress, pipeline.ingestion.spec.policies).copy == {}
