"""No silent divergence (DESIGN.md invariant 8), without lakeslot's event trigger: DDL and
maintenance that logical decoding does not show stop the table for a re-snapshot with the reason,
the decision copies exactly those tables again (alone, online), and afterwards every table equals
its source — read back with pyiceberg, independently of the apply code. PostgreSQL 15 and 18.

The pure parts (:func:`lakeslot.source.facts.divergence`, :func:`lakeslot.control.resnapshot.decide`)
are table-driven below; the scenario runs the real reader, snapshot and apply job.
"""

from __future__ import annotations

import threading

import pytest
from psycopg import sql

from lakeslot.api.models import PoliciesSpec
from lakeslot.api.naming import TableName
from lakeslot.control import resnapshot
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.mirror.progress import MirrorProgress
from lakeslot.snapshot import job as snapshot_job
from lakeslot.source import facts, slot
from lakeslot.source.facts import TableFacts
from tests.support.apply_support import Pipeline, assert_mirror_equals_source
from tests.support.local_support import BackgroundWriter

# -- the pure decisions -------------------------------------------------------------------------

RECORDED = TableFacts(10, {"id": 1, "a": 2, "b": 3}, ((20, 200), (21, 210)),
                      {"id": 23, "a": 25, "b": 23})


@pytest.mark.parametrize(("current", "mirrored", "expected"), [
    (RECORDED, ["id", "a", "b"], None),
    (None, ["id"], "no longer exists"),
    (TableFacts(11, RECORDED.columns, RECORDED.partitions), ["id"], "dropped and created again"),
    (TableFacts(10, {"id": 1, "x": 2, "b": 3}, RECORDED.partitions), ["id", "a", "b"],
     "'a' was renamed to 'x'"),
    (TableFacts(10, {"id": 1, "a": 4, "b": 3}, RECORDED.partitions), ["id", "a", "b"],
     "'a' was dropped and added again"),
    (TableFacts(10, {"id": 1, "b": 3}, RECORDED.partitions), ["id", "a", "b"], None),  # dropped
    (TableFacts(10, {"id": 1, "a": 2, "b": 3, "c": 5}, RECORDED.partitions), ["id", "a", "b"],
     None),  # added: the stream shows it
    (TableFacts(10, {"id": 1, "a": 2}, RECORDED.partitions), ["id", "a"], None),  # b not mirrored
    (TableFacts(10, RECORDED.columns, RECORDED.partitions, {**RECORDED.types, "b": 20}),
     ["id", "a", "b"], "'b' changed type"),
    (TableFacts(10, RECORDED.columns, RECORDED.partitions, {}), ["id", "a", "b"], None),
    (TableFacts(10, RECORDED.columns, ((20, 201), (21, 210))), ["id"], "1 truncated"),
    (TableFacts(10, RECORDED.columns, ((20, 200),)), ["id"], "1 detached or dropped"),
    (TableFacts(10, RECORDED.columns, (*RECORDED.partitions, (22, 220))), ["id"], "1 attached"),
])
def test_what_the_stream_does_not_show_is_a_divergence(current, mirrored, expected):
    reason = facts.divergence(RECORDED, current, mirrored)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason


def test_facts_survive_their_property_and_learn_added_columns():
    assert TableFacts.from_json(RECORDED.to_json()) == RECORDED
    now = TableFacts(10, {**RECORDED.columns, "c": 7}, RECORDED.partitions,
                     {**RECORDED.types, "c": 16})
    learned = RECORDED.with_columns(now, ["c", "gone"])
    assert learned.columns == {"id": 1, "a": 2, "b": 3, "c": 7} and learned.types["c"] == 16


T1, T2, T3 = TableName("s", "one"), TableName("s", "two"), TableName("s", "three")


def _p(lsn, *, error=None, automatic=False, recent=0, snapshot_lsn=None) -> MirrorProgress:
    return MirrorProgress(lsn, 1, 1, error, error is not None, snapshot_lsn, automatic, recent)


@pytest.mark.parametrize(("progress", "policies", "requested", "copy", "held"), [
    ({T1: _p(100), T2: _p(None)}, {}, {}, {}, []),
    ({T1: _p(100, error="renamed", automatic=True)}, {}, {}, {T1: 101}, []),
    ({T1: _p(100, error="truncated and onTruncate is Error")}, {}, {}, {}, []),
    ({T1: _p(100, error="x", automatic=True, recent=3)}, {}, {}, {}, [T1]),
    ({T1: _p(100, error="x", automatic=True, recent=3)}, {"maxResnapshotsPerHour": 4}, {},
     {T1: 101}, []),
    ({T1: _p(100, error="x", automatic=True)}, {"maxResnapshotsPerHour": 0}, {}, {}, [T1]),
    ({T1: _p(100), T3: _p(50, snapshot_lsn=41)}, {}, {T1: 101, T3: 41}, {T1: 101}, []),  # T3 served
    ({T1: _p(100, error="x", automatic=True, recent=9)}, {}, {T1: 101}, {T1: 101}, []),
    ({T1: _p(None)}, {}, {T1: 5}, {}, []),
])
def test_which_tables_are_copied_again(progress, policies, requested, copy, held):
    decision = resnapshot.decide(progress, PoliciesSpec.model_validate(policies), requested)
    assert decision.copy == copy and sorted(decision.held) == held
    assert decision.min_snapshot_lsn == max(copy.values(), default=0)
    assert decision.requested == frozenset(set(requested) & set(copy))


# -- the scenario -------------------------------------------------------------------------------

PLAIN, ADDED = TableName("public", "plain"), TableName("public", "added")
RENAMED, READDED = TableName("public", "renamed"), TableName("public", "readded")
RECREATED, USING = TableName("public", "recreated"), TableName("public", "retyped")
VOLATILE, REWRITTEN = TableName("public", "volatile"), TableName("public", "rewritten")
PARTS = TableName("public", "parts")
TABLES = [PLAIN, ADDED, RENAMED, READDED, RECREATED, USING, VOLATILE, REWRITTEN, PARTS]
DIVERGING = {RENAMED: "renamed to 'b'", READDED: "'z' was dropped and added again",
             RECREATED: "dropped and created again", USING: "'n' changed type",
             VOLATILE: "wrote into every existing row",
             REWRITTEN: "wrote into every existing row", PARTS: "partitions changed"}

SETUP = """
CREATE TABLE plain (id int PRIMARY KEY, v text);
CREATE TABLE added (id int PRIMARY KEY, v text);
CREATE TABLE renamed (id int PRIMARY KEY, a text);
CREATE TABLE readded (id int PRIMARY KEY, v text, z int);
CREATE TABLE recreated (id int PRIMARY KEY, v text);
CREATE TABLE retyped (id int PRIMARY KEY, n int);
CREATE TABLE volatile (id int PRIMARY KEY, v text);
CREATE TABLE rewritten (id int PRIMARY KEY, v text);
CREATE TABLE parts (id int, region text, v text, PRIMARY KEY (id, region))
  PARTITION BY LIST (region);
CREATE TABLE parts_eu PARTITION OF parts FOR VALUES IN ('eu');
CREATE TABLE parts_us PARTITION OF parts FOR VALUES IN ('us');
INSERT INTO plain SELECT g, 'p' || g FROM generate_series(1, 50) g;
INSERT INTO added SELECT g, 'a' || g FROM generate_series(1, 50) g;
INSERT INTO renamed SELECT g, 'r' || g FROM generate_series(1, 50) g;
INSERT INTO readded SELECT g, 'x' || g, g FROM generate_series(1, 50) g;
INSERT INTO recreated SELECT g, 'old' || g FROM generate_series(1, 50) g;
INSERT INTO retyped SELECT g, g FROM generate_series(1, 50) g;
INSERT INTO volatile SELECT g, 'v' || g FROM generate_series(1, 50) g;
INSERT INTO rewritten SELECT g, 'w' || g FROM generate_series(1, 50) g;
INSERT INTO parts SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 'q' || g
  FROM generate_series(1, 50) g;
"""

MIGRATIONS = """
UPDATE plain SET v = 'changed' WHERE id <= 10; DELETE FROM plain WHERE id > 45;
ALTER TABLE added ADD COLUMN c int DEFAULT 5; UPDATE added SET v = 'u' WHERE id = 1;
ALTER TABLE renamed RENAME COLUMN a TO b; UPDATE renamed SET b = 'after' WHERE id = 1;
ALTER TABLE readded DROP COLUMN z; ALTER TABLE readded ADD COLUMN z int;
DROP TABLE recreated; CREATE TABLE recreated (id int PRIMARY KEY, v text, w int);
INSERT INTO recreated SELECT g, 'new' || g, g FROM generate_series(1, 20) g;
ALTER TABLE retyped ALTER COLUMN n TYPE bigint USING n * 10;
ALTER TABLE volatile ADD COLUMN u uuid DEFAULT gen_random_uuid();
ALTER TABLE rewritten ADD COLUMN d int NOT NULL DEFAULT 7; VACUUM FULL rewritten;
TRUNCATE parts_eu;
"""


def _create_publication(conn) -> None:
    conn.execute(sql.SQL("CREATE PUBLICATION p FOR TABLE {} WITH (publish_via_partition_root = true)")
                 .format(sql.SQL(", ").join(t.sql() for t in TABLES)))
    slot.ensure(conn, "s")


class _Inserts(BackgroundWriter):
    """The application during a re-snapshot: new keys into ``table`` and into PLAIN."""

    def __init__(self, db, table: TableName) -> None:
        self.table = table
        super().__init__(db, seed=1, pause=0.05)

    def write(self, conn, rng, next_id: int) -> None:
        conn.execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(self.table.sql()), (next_id,))
        conn.execute("INSERT INTO plain VALUES (%s, 'during')", (next_id,))


class _OnlineWatch:
    """While a table is copied again: an application keeps inserting into it (and into
    PLAIN), and a pyiceberg reader keeps reading the mirror. The copy is online when no read
    ever sees fewer rows than the source had before (``floor``: inserts only, so the source
    never had fewer) — never an empty or half-copied mirror."""

    def __init__(self, pipeline: Pipeline, warehouse, table: TableName, floor: int) -> None:
        self.pipeline, self.warehouse, self.table, self.floor = pipeline, warehouse, table, floor
        self.stop = threading.Event()
        self.counts: list[int] = []
        self.reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        ident = self.pipeline.job_input().names.mirror_identifier(self.table)
        while not self.stop.is_set():
            loaded = load_hadoop_table(self.warehouse.as_uri(), ident)
            assert loaded is not None
            self.counts.append(loaded.scan(selected_fields=("id",)).to_arrow().num_rows)

    def __enter__(self) -> _OnlineWatch:
        self.inserts = _Inserts(self.pipeline.pgdb, self.table)
        self.reader.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.reader.join(60)
        inserted = self.inserts.stop()
        assert self.counts and inserted, "the watch saw nothing"
        assert min(self.counts) >= self.floor, self.counts


@pytest.mark.slow
def test_migrations_the_stream_does_not_show_are_copied_again_and_then_equal(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    with pgdb.connect() as conn:
        conn.execute(SETUP)
        _create_publication(conn)
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), TABLES)
    pipeline.snapshot()
    with pgdb.connect() as conn:
        for statement in filter(None, (s.strip() for s in MIGRATIONS.split(";"))):
            conn.execute(statement)  # one by one: VACUUM FULL runs outside a transaction
        # the re-created table is a new table: the operator's publication sync adds it back
        conn.execute("ALTER PUBLICATION p ADD TABLE recreated")
    pipeline.seal()

    outcome = {t.source: t for t in pipeline.apply().tables}
    for table, reason in DIVERGING.items():
        assert outcome[table].state == "failed", (table, outcome[table])
        error = outcome[table].error
        assert error is not None and reason in error, (table, error)
        assert "copied again on its own" in error
    for table in (PLAIN, ADDED):
        assert outcome[table].state == "applied"
        assert_mirror_equals_source(pipeline, spark_warehouse, table)

    progress = mirror_progress.read(pipeline.ingestion, TABLES)
    decision = resnapshot.decide(progress, pipeline.ingestion.spec.policies)
    assert set(decision.copy) == set(DIVERGING) and not decision.held
    assert all(progress[t].resnapshot_automatic for t in DIVERGING)
    job_input = pipeline.job_input()
    with _OnlineWatch(pipeline, spark_warehouse, RENAMED, floor=50):
        copied = snapshot_job.run(
            spark, type(job_input)(job_input.ingestion, tuple(sorted(decision.copy))),
            min_snapshot_lsn=decision.min_snapshot_lsn)
    assert {t.source: t.state for t in copied.tables} == dict.fromkeys(DIVERGING, "committed")

    with pgdb.connect() as conn:  # the application goes on; so does every table
        for table in TABLES:
            conn.execute(sql.SQL("DELETE FROM {} WHERE id = 3").format(table.sql()))
        conn.execute("UPDATE renamed SET b = 'later' WHERE id = 2")
        conn.execute("INSERT INTO parts VALUES (100, 'eu', 'back')")
    pipeline.seal()
    result = pipeline.apply()
    assert result.ok, result.tables
    for table in TABLES:
        assert_mirror_equals_source(pipeline, spark_warehouse, table)
    again = mirror_progress.read(pipeline.ingestion, TABLES)
    assert {t for t, p in again.items() if p.resnapshots_last_hour} == set(DIVERGING)
    assert not resnapshot.decide(again, pipeline.ingestion.spec.policies).copy


def test_rows_from_before_an_added_column_get_its_default_when_both_are_in_one_batch(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    """A row inserted (or updated) before ``ADD COLUMN … DEFAULT`` holds the default in the
    source, though its change, applied in the same pass as the ALTER, does not carry it."""
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE plain (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO plain SELECT g, 'p' || g FROM generate_series(1, 5) g")
        conn.execute("CREATE PUBLICATION p FOR TABLE plain")
        slot.ensure(conn, "s")
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), [PLAIN])
    pipeline.snapshot()
    with pgdb.connect() as conn:
        conn.execute("INSERT INTO plain VALUES (6, 'before')")
        conn.execute("UPDATE plain SET v = 'touched' WHERE id = 2")
        conn.execute("ALTER TABLE plain ADD COLUMN c int DEFAULT 5")
        conn.execute("INSERT INTO plain VALUES (7, 'after', 9)")
    pipeline.seal()
    assert pipeline.apply().ok
    assert_mirror_equals_source(pipeline, spark_warehouse, PLAIN)
