"""Inheritance (``INHERITS``) parents and children under ``lakeslot run``: each mirror holds
exactly its own table's rows (``FROM ONLY``), as PostgreSQL's logical replication delivers them,
under inserts, updates and deletes issued through the parent and through the child. Real
PostgreSQL 15 and 18, the reader as a child process, Spark + Iceberg on the tests' shared session;
the mirrors are compared with the source row by row through pyiceberg."""

from __future__ import annotations

import random

import pytest
from psycopg import sql

from lakeslot import workloads
from lakeslot.api.naming import TableName
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.verify import checksums
from tests.support import local_support
from tests.support.apply_support import normal
from tests.support.fixtures_pg import connection_settings

SCHEMA = "app"
PARENT, CHILD, GRANDCHILD = (TableName(SCHEMA, "parent"), TableName(SCHEMA, "child"),
                             TableName(SCHEMA, "grandchild"))


def _own_rows(db, table: TableName) -> tuple[list[str], list[tuple]]:
    """The rows stored in ``table`` itself (not in its children)."""
    with db.connect() as conn:
        cursor = conn.execute(sql.SQL("SELECT * FROM ONLY {}").format(table.sql()))
        assert cursor.description is not None
        names = [d.name for d in cursor.description]
        return names, sorted(tuple(normal(v) for v in row) for row in cursor.fetchall())


def _assert_mirrors_equal(db, local, warehouse, tables) -> None:
    for table in tables:
        names, expected = _own_rows(db, table)
        loaded = load_hadoop_table(warehouse.as_uri(), local.job.names.mirror_identifier(table))
        assert loaded is not None, f"no mirror of {table}"
        data = loaded.scan(selected_fields=tuple(names)).to_arrow().select(names)
        mirrored = sorted(tuple(normal(v) for v in row.values()) for row in data.to_pylist())
        assert len(mirrored) == len(expected), (table, len(mirrored), len(expected))
        assert mirrored == expected, table


class _Writer(local_support.BackgroundWriter):
    """The application, through the parent and through the child, while the run copies and
    streams: each statement through a parent reaches every descendant's rows too."""

    def __init__(self, db) -> None:
        super().__init__(db, seed=32, pause=0.02)

    def write(self, conn, rng: random.Random, next_id: int) -> None:
        conn.execute("INSERT INTO app.parent VALUES (%s, 'w')", (next_id,))
        conn.execute("INSERT INTO app.grandchild VALUES (%s, 'w', 'g')", (next_id,))
        conn.execute("UPDATE app.parent SET v = %s WHERE id = %s",
                     (f"p{rng.randint(0, 10**6)}", rng.randint(1, 60)))
        conn.execute("UPDATE app.child SET extra = %s WHERE id = %s",
                     (f"c{rng.randint(0, 10**6)}", rng.randint(1, 60)))
        conn.execute("DELETE FROM app.child WHERE id = %s", (rng.randint(31, 45),))
        conn.execute("DELETE FROM ONLY app.parent WHERE id = %s", (rng.randint(40, 50),))


@pytest.mark.slow
def test_parent_and_children_are_each_mirrored_with_their_own_rows(
        pgdb, tmp_path, spark, spark_warehouse, monkeypatch):
    with pgdb.connect() as conn:
        conn.execute("CREATE SCHEMA app")
        conn.execute("CREATE TABLE app.parent (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE app.child (extra text, PRIMARY KEY (id)) INHERITS (app.parent)")
        conn.execute("CREATE TABLE app.grandchild (PRIMARY KEY (id)) INHERITS (app.child)")
        conn.execute("INSERT INTO app.parent SELECT g, 'p' || g FROM generate_series(1, 50) g")
        conn.execute("INSERT INTO app.child SELECT g, 'c' || g, 'x' FROM generate_series(1, 40) g")
        conn.execute("INSERT INTO app.grandchild SELECT g, 'g' || g, 'y' "
                     "FROM generate_series(1, 30) g")
    path, state_dir = tmp_path / "ingestion.yaml", tmp_path / "state"
    local_support.write_ingestion(path, pgdb, [], tmp_path, {"tables": [], "schemas": [SCHEMA]},
                                  spark_warehouse)
    local = local_support.local(path, pgdb, state_dir)
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)
    tables = [PARENT, CHILD, GRANDCHILD]

    writer = _Writer(pgdb)  # concurrent with the snapshot and the stream of the first run
    local_support.run_in_process(local, spark, once=True)
    assert writer.stop() > 0
    local_support.run_in_process(local, spark, once=True)  # catches up with what the writer did last
    _assert_mirrors_equal(pgdb, local, spark_warehouse, tables)

    with pgdb.connect() as conn:
        # through the parent: reaches the parent's own rows and every descendant's
        conn.execute("UPDATE app.parent SET v = 'through parent' WHERE id <= 5")
        conn.execute("DELETE FROM app.parent WHERE id BETWEEN 6 AND 8")
        conn.execute("INSERT INTO app.parent VALUES (100, 'new in parent')")
        # through the child: the child's own rows and the grandchild's
        conn.execute("UPDATE app.child SET extra = 'through child' WHERE id BETWEEN 9 AND 12")
        conn.execute("DELETE FROM app.child WHERE id BETWEEN 13 AND 14")
        conn.execute("INSERT INTO app.child VALUES (100, 'new in child', 'z')")
        # only the parent's own rows
        conn.execute("UPDATE ONLY app.parent SET v = 'only parent' WHERE id BETWEEN 20 AND 22")
        conn.execute("DELETE FROM ONLY app.parent WHERE id = 23")
        conn.execute("UPDATE app.grandchild SET v = 'grand' WHERE id >= 25")
    local_support.run_in_process(local, spark, once=True)
    _assert_mirrors_equal(pgdb, local, spark_warehouse, tables)
    _assert_mirrors_equal(pgdb, local, spark_warehouse, tables)

    # DDL on the parent recurses to its children (one event for the parent only): each mirror
    # follows; then a TRUNCATE through the parent empties the parent and what still inherits
    # from it, each in its own mirror.
    with pgdb.connect() as conn:
        conn.execute("ALTER TABLE app.parent RENAME COLUMN v TO w")
        conn.execute("ALTER TABLE app.parent ADD COLUMN n int DEFAULT 7")
        conn.execute("UPDATE app.parent SET w = 'after ddl' WHERE id IN (1, 9, 25)")
        conn.execute("INSERT INTO app.grandchild (id, w, extra, n) VALUES (200, 'g', 'e', 8)")
    local_support.run_in_process(local, spark, once=True)
    _assert_mirrors_equal(pgdb, local, spark_warehouse, tables)
    with pgdb.connect() as conn:
        # detached, the grandchild keeps its rows (and its mirror); the child's statements no
        # longer reach it
        conn.execute("ALTER TABLE app.grandchild NO INHERIT app.child")
        conn.execute("UPDATE app.child SET extra = 'detached' WHERE id >= 25")
        conn.execute("UPDATE app.grandchild SET extra = 'alone' WHERE id = 30")
        conn.execute("TRUNCATE app.parent")  # the parent and the child, not the grandchild
        conn.execute("INSERT INTO app.parent (id, w) VALUES (300, 'after truncate')")
        conn.execute("INSERT INTO app.child (id, w, extra) VALUES (300, 'after truncate', 'c')")
    local_support.run_in_process(local, spark, once=True)
    _assert_mirrors_equal(pgdb, local, spark_warehouse, tables)

    # lakeslot verify compares each table's own rows too (a parent's children are not missing)
    checks = checksums.compare(local.ingestion, connection_settings(pgdb), tables)
    assert [c for c in checks if not c.equal] == [], checksums.render(checks)
    assert all(c.source_rows > 0 for c in checks)


@pytest.mark.slow
@pytest.mark.one_version  # (the catalog comparison; the trigger's path keeps both versions above)
def test_without_the_event_trigger_a_child_altered_through_its_parent_is_copied_again(
        pgdb, tmp_path, spark, spark_warehouse, monkeypatch):
    """ddlCapture: Catalog — the apply job compares each table's own catalog entry: the column
    a rename on the parent renamed in the child too is seen in the child, which is copied again
    (onSchemaChange: Resnapshot, the default), never left with the old column's values."""
    with pgdb.connect() as conn:
        conn.execute("CREATE SCHEMA app")
        conn.execute("CREATE TABLE app.parent (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE app.child (extra text, PRIMARY KEY (id)) INHERITS (app.parent)")
        conn.execute("INSERT INTO app.parent SELECT g, 'p' || g FROM generate_series(1, 20) g")
        conn.execute("INSERT INTO app.child SELECT g, 'c' || g, 'x' FROM generate_series(1, 20) g")
    path, state_dir = tmp_path / "ingestion.yaml", tmp_path / "state"
    local_support.write_ingestion(path, pgdb, [], tmp_path,
                                  {"tables": [], "schemas": [SCHEMA], "ddlCapture": "Catalog"},
                                  spark_warehouse)
    local = local_support.local(path, pgdb, state_dir)
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)
    local_support.run_in_process(local, spark, once=True)
    with pgdb.connect() as conn:
        conn.execute("ALTER TABLE app.parent RENAME COLUMN v TO w")
        conn.execute("UPDATE app.parent SET w = 'after' WHERE id <= 3")
    local_support.run_in_process(local, spark, once=True)
    _assert_mirrors_equal(pgdb, local, spark_warehouse, [PARENT, CHILD])
