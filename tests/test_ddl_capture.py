"""DDL in the stream (lakeslot's event trigger, PostgreSQL 15 and 18): the trigger's messages
arrive in staging at their place among the row changes; renames, added columns (with no row
change after them, and with a rewrite that cleared PostgreSQL's missing value), widened types and
new empty partitions are applied in place, values kept; what may change values re-snapshots that
table alone; afterwards every table equals its source — read with pyiceberg, independently of
the apply code. Also: the mode is reported, an ordinary role can neither read the capture key
nor fake a message. The fallback without the trigger is tests/test_divergence.py."""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.source import ddl_capture, slot
from lakeslot.staging.store import Staging
from tests.support.apply_support import Pipeline, assert_mirror_equals_source
from tests.support.local_support import LAKESLOT


def test_the_mode_is_reported_and_nobody_else_can_write_a_message(pgdb):
    role = sql.Identifier(app_role := f"app_{pgdb.name}")  # roles are per cluster, shared by tests
    with pgdb.connect(autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'app-pw' REPLICATION").format(role))
        conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            sql.Identifier(pgdb.name), role))
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(role))
    with pgdb.connect(user=app_role, password="app-pw", autocommit=True) as app:
        fallback = ddl_capture.ensure(app, "Auto")
        assert fallback.mode == "Catalog" and "ddl-capture-sql --grant-to" in fallback.message
        with pytest.raises(ddl_capture.CaptureUnavailable, match="superuser"):
            ddl_capture.ensure(app, "EventTrigger", read_only=True)
        assert ddl_capture.ensure(app, "Catalog").mode == "Catalog"
    with pgdb.connect(autocommit=True) as conn:
        installed = ddl_capture.ensure(conn, "Auto")
        assert installed.mode == "EventTrigger"
        capture = ddl_capture.state(conn)
        assert capture is not None
        assert ddl_capture.install(conn).key == capture.key  # repairing keeps the key
        conn.execute("SELECT pg_create_logical_replication_slot('watch', 'test_decoding')")
    with pgdb.connect(user=app_role, password="app-pw", autocommit=True) as app:
        assert ddl_capture.state(app) is None  # no access to the key: not for this role
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("SELECT key FROM _lakeslot.capture")
        app.execute("CREATE TABLE mine (id int PRIMARY KEY)")  # the trigger fires for anyone
        app.execute("""SELECT pg_logical_emit_message(true, 'lakeslot',
                       '{"v": 1, "key": "guess", "event": "drop", "oid": 1, "tag": "x"}')""")
    with pgdb.connect(autocommit=True) as conn:
        rows = [r[0] for r in conn.execute(
            "SELECT data FROM pg_logical_slot_get_changes('watch', NULL, NULL)"
            " WHERE data LIKE 'message:%'").fetchall()]
        conn.execute("SELECT pg_drop_replication_slot('watch')")
    contents = [r.split("content:", 1)[1].encode() for r in rows]
    events = [ddl_capture.parse(1, i, c, capture.key) for i, c in enumerate(contents)]
    assert len(events) == 2 and events[1] is None  # the forged one is ignored
    assert events[0] is not None and events[0].name == "mine" and events[0].tag == "CREATE TABLE"
    assert [c.name for c in events[0].columns] == ["id"]



def test_a_dba_installs_the_capture_with_the_printed_script_and_removes_it(pgdb):
    role = sql.Identifier(app_role := f"dba_{pgdb.name}")
    with pgdb.connect(autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'app-pw' REPLICATION").format(role))

    def psql(*args: str) -> None:
        printed = subprocess.run([LAKESLOT, "ddl-capture-sql", *args], capture_output=True,
                                 text=True, check=True).stdout
        subprocess.run([str(pgdb.cluster.tool("psql")), "-X", "-v", "ON_ERROR_STOP=1", "-q",
                        pgdb.dsn()], input=printed, text=True, check=True,
                       env={**os.environ, "PGPASSWORD": pgdb.cluster.password})

    psql("--grant-to", app_role)
    with pgdb.connect(user=app_role, password="app-pw", autocommit=True) as app:
        assert ddl_capture.state(app) is not None  # the role may read the key it was granted
        assert ddl_capture.ensure(app, "EventTrigger", read_only=True).mode == "EventTrigger"
    psql("--uninstall")
    with pgdb.connect(autocommit=True) as conn:
        assert ddl_capture.state(conn) is None
        assert conn.execute("SELECT count(*) FROM pg_event_trigger").fetchone()[0] == 0


PLAIN, RENAMED, SWAPPED = (TableName("public", n) for n in ("plain", "renamed", "swapped"))
IDLE, CLEARED, WIDENED = (TableName("public", n) for n in ("idle", "cleared", "widened"))
USING, VOLATILE, RECREATED = (TableName("public", n) for n in ("retyped", "volatile", "recreated"))
PARTS, DETACHED = TableName("public", "parts"), TableName("public", "detached")
TABLES = [PLAIN, RENAMED, SWAPPED, IDLE, CLEARED, WIDENED, USING, VOLATILE, RECREATED, PARTS,
          DETACHED]
IN_PLACE = {RENAMED: "'a' renamed to 'b'", SWAPPED: "'tmp' renamed to 'y'",
            IDLE: "'c' added", CLEARED: "'d' added", WIDENED: "widened",
            PARTS: "new empty partition"}
RESNAPSHOT = {USING: "USING expression", VOLATILE: "'u' was added with values",
              RECREATED: "dropped", DETACHED: "detached"}

SETUP = """
CREATE TABLE plain (id int PRIMARY KEY, v text);
CREATE TABLE renamed (id int PRIMARY KEY, a text);
CREATE TABLE swapped (id int PRIMARY KEY, x text, y text);
CREATE TABLE idle (id int PRIMARY KEY, v text);
CREATE TABLE cleared (id int PRIMARY KEY, v text);
CREATE TABLE widened (id int PRIMARY KEY, n int, m numeric(6,2));
CREATE TABLE retyped (id int PRIMARY KEY, n int);
CREATE TABLE volatile (id int PRIMARY KEY, v text);
CREATE TABLE recreated (id int PRIMARY KEY, v text);
CREATE TABLE parts (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE parts_eu PARTITION OF parts FOR VALUES IN ('eu');
CREATE TABLE detached (id int, region text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE detached_eu PARTITION OF detached FOR VALUES IN ('eu');
CREATE TABLE detached_us PARTITION OF detached FOR VALUES IN ('us');
INSERT INTO plain SELECT g, 'p' || g FROM generate_series(1, 40) g;
INSERT INTO renamed SELECT g, 'r' || g FROM generate_series(1, 40) g;
INSERT INTO swapped SELECT g, 'x' || g, 'y' || g FROM generate_series(1, 40) g;
INSERT INTO idle SELECT g, 'i' || g FROM generate_series(1, 40) g;
INSERT INTO cleared SELECT g, 'c' || g FROM generate_series(1, 40) g;
INSERT INTO widened SELECT g, g, g / 3.0 FROM generate_series(1, 40) g;
INSERT INTO retyped SELECT g, g FROM generate_series(1, 40) g;
INSERT INTO volatile SELECT g, 'v' || g FROM generate_series(1, 40) g;
INSERT INTO recreated SELECT g, 'old' || g FROM generate_series(1, 40) g;
INSERT INTO parts SELECT g, 'eu', 'q' || g FROM generate_series(1, 40) g;
INSERT INTO detached SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END FROM generate_series(1, 40) g;
"""

# one statement per execute (VACUUM FULL runs outside a transaction); BEGIN…COMMIT blocks whole
MIGRATIONS = [
    "UPDATE plain SET v = 'changed' WHERE id <= 10",
    """BEGIN; UPDATE renamed SET a = 'before' WHERE id = 1;
       ALTER TABLE renamed RENAME COLUMN a TO b;
       UPDATE renamed SET b = 'after' WHERE id = 2; COMMIT""",
    """BEGIN; UPDATE swapped SET x = 'x-before' WHERE id = 1;
       ALTER TABLE swapped RENAME COLUMN x TO tmp; ALTER TABLE swapped RENAME COLUMN y TO x;
       ALTER TABLE swapped RENAME COLUMN tmp TO y; COMMIT""",
    "UPDATE swapped SET x = 'x-after' WHERE id = 2",
    "ALTER TABLE idle ADD COLUMN c int NOT NULL DEFAULT 7",
    "ALTER TABLE cleared ADD COLUMN d int NOT NULL DEFAULT 9",
    "VACUUM FULL cleared",
    "UPDATE cleared SET v = 'u' WHERE id = 1",
    "ALTER TABLE widened ALTER COLUMN n TYPE bigint",
    "ALTER TABLE widened ALTER COLUMN m TYPE numeric(12,2)",
    "INSERT INTO widened VALUES (100, 5000000000, 1234567890.12)",
    "ALTER TABLE retyped ALTER COLUMN n TYPE bigint USING n * 10",
    "ALTER TABLE volatile ADD COLUMN u uuid DEFAULT gen_random_uuid()",
    "DROP TABLE recreated",
    "CREATE TABLE recreated (id int PRIMARY KEY, v text, w int)",
    "INSERT INTO recreated SELECT g, 'new' || g, g FROM generate_series(1, 20) g",
    "ALTER PUBLICATION p ADD TABLE recreated",  # the operator's publication sync does this
    "CREATE TABLE parts_us PARTITION OF parts FOR VALUES IN ('us')",
    "INSERT INTO parts VALUES (100, 'us', 'new partition')",
    "ALTER TABLE detached DETACH PARTITION detached_us",
]


@pytest.mark.slow
def test_ddl_in_the_stream_is_applied_in_place_or_copied_again_and_then_equal(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    with pgdb.connect(autocommit=True) as conn:
        assert ddl_capture.ensure(conn, "Auto").mode == "EventTrigger"
        conn.execute(SETUP)
        conn.execute(sql.SQL("CREATE PUBLICATION p FOR TABLE {} WITH "
                             "(publish_via_partition_root = true)")
                     .format(sql.SQL(", ").join(t.sql() for t in TABLES)))
        slot.ensure(conn, "s")
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), TABLES)
    pipeline.snapshot()
    with pgdb.connect(autocommit=True) as conn:
        for statement in MIGRATIONS:
            conn.execute(statement)
    pipeline.seal()
    staged = [r for rows in pipeline.staged.values() for r in rows if r.op == "M"]
    assert len(staged) >= len(IN_PLACE) + len(RESNAPSHOT), "the DDL messages were not staged"

    outcome = {t.source: t for t in pipeline.apply().tables}
    for table, applied in IN_PLACE.items():
        assert outcome[table].state in ("applied", "advanced"), (table, outcome[table])
        assert any(applied in d for d in outcome[table].ddl), (table, outcome[table].ddl)
    for table, reason in RESNAPSHOT.items():
        assert outcome[table].state == "failed", (table, outcome[table])
        assert reason in (outcome[table].error or ""), (table, outcome[table].error)
    for table in [PLAIN, *IN_PLACE]:
        assert_mirror_equals_source(pipeline, spark_warehouse, table)
    status = Staging(pipeline.staging).read_apply_status() or {}
    documented = {TableName(t["schema"], t["name"]): t["schemaChanges"] for t in status["tables"]}
    assert any("renamed to 'b'" in d for d in documented[RENAMED])
    progress = mirror_progress.read(pipeline.ingestion, TABLES)
    assert "renamed to 'b'" in (progress[RENAMED].schema_change or "")
    # the renamed column kept its Iceberg field: values were not copied again
    mirror = load_hadoop_table(spark_warehouse.as_uri(),
                               pipeline.job_input().names.mirror_identifier(RENAMED))
    assert mirror is not None and mirror.schema().find_field("b").field_id == 2

    assert pipeline.copy_again() == dict.fromkeys(RESNAPSHOT, "committed")
    with pgdb.connect(autocommit=True) as conn:  # the application goes on, DDL too
        for table in TABLES:
            conn.execute(sql.SQL("DELETE FROM {} WHERE id = 3").format(table.sql()))
        conn.execute("ALTER TABLE renamed RENAME COLUMN b TO c")
        conn.execute("UPDATE renamed SET c = 'later' WHERE id = 4")
        conn.execute("ALTER TABLE retyped RENAME COLUMN n TO k")
    pipeline.seal()
    result = pipeline.apply()
    assert result.ok, result.tables
    for table in TABLES:
        assert_mirror_equals_source(pipeline, spark_warehouse, table)
    again = mirror_progress.read(pipeline.ingestion, TABLES)
    assert {t for t, p in again.items() if p.resnapshots_last_hour} == set(RESNAPSHOT)


def test_an_older_function_is_replaced_in_place_and_children_of_an_altered_parent_are_described(
        pgdb):
    """An older capture function (before inheritance children were described) does not count as
    installed; ``ensure`` replaces it without touching the triggers (mirrors recorded their
    OIDs); then ALTER TABLE on a parent writes a message for the parent and for each inheritance
    descendant, and none for a partition of a partitioned table."""
    with pgdb.connect(autocommit=True) as conn:
        assert ddl_capture.ensure(conn, "Auto").mode == "EventTrigger"
        capture = ddl_capture.state(conn)
        assert capture is not None
        older = ddl_capture._FUNCTION.replace(ddl_capture.VERSION_MARK, "an older version")
        conn.execute(sql.SQL(older.strip()))  # (as an earlier lakeslot installed it)
        assert ddl_capture.state(conn) is None
        report = ddl_capture.ensure(conn, "Auto", read_only=True)  # lakeslot status: no change
        assert report.mode == "Catalog" and "older version" in report.message
        assert ddl_capture.state(conn) is None
        role = sql.Identifier(app_role := f"old_{pgdb.name}")  # roles are per cluster
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'app-pw'").format(role))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA _lakeslot TO {}").format(role))
        conn.execute(sql.SQL("GRANT SELECT ON _lakeslot.capture TO {}").format(role))
    with pgdb.connect(user=app_role, password="app-pw", autocommit=True) as app:
        report = ddl_capture.ensure(app, "Auto")  # may not replace it: the catalog is compared
        assert report.mode == "Catalog" and "may not replace it" in report.message
    with pgdb.connect(autocommit=True) as conn:
        assert ddl_capture.state(conn) is None
        assert ddl_capture.ensure(conn, "Auto").mode == "EventTrigger"
        assert ddl_capture.state(conn) == capture  # same triggers, same key

        conn.execute("CREATE TABLE parent (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE child (PRIMARY KEY (id)) INHERITS (parent)")
        conn.execute("CREATE TABLE grandchild (PRIMARY KEY (id)) INHERITS (child)")
        conn.execute("CREATE TABLE parts (id int, v text) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (10)")
        conn.execute("SELECT pg_create_logical_replication_slot('watch', 'test_decoding')")
        conn.execute("ALTER TABLE parent RENAME COLUMN v TO w")
        conn.execute("ALTER TABLE parts ADD COLUMN n int")
        rows = [r[0] for r in conn.execute(
            "SELECT data FROM pg_logical_slot_get_changes('watch', NULL, NULL)"
            " WHERE data LIKE 'message:%'").fetchall()]
        conn.execute("SELECT pg_drop_replication_slot('watch')")
    events = [ddl_capture.parse(0, 0, row.split("content:", 1)[1].encode(), capture.key)
              for row in rows]
    described = {(e.name, tuple(c.name for c in e.columns)) for e in events if e is not None}
    assert described == {("parent", ("id", "w")), ("child", ("id", "w")),
                         ("grandchild", ("id", "w")), ("parts", ("id", "v", "n"))}
