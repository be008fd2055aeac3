"""``spec.source.schemas`` while ``lakeslot run`` streams: a table created in a selected schema
reaches the mirror without a restart — it joins the publication, the apply job waits for it, and
it is copied alone and online from a snapshot taken after it joined, then streamed — while the
other tables keep streaming under writes; a table without a key is reported and breaks nothing; a
dropped table is ``Removed`` with its mirror kept. Real PostgreSQL 15 and 18, the reader as a
child process, Spark + Iceberg on the tests' shared session; afterwards the mirrors are compared
with the source row by row through pyiceberg, not through the code under test.

The pure parts (rows of tables that left the selection, the fingerprint that tells when to look
again) are tested on their own below."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from psycopg import sql

from lakeslot import workloads
from lakeslot.api.models import PostgresIngestionStatus, SourceSpec, TableState, TableStatus
from lakeslot.api.naming import TableName
from lakeslot.control import steps
from lakeslot.local import config, observe, state
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.observability import status_report
from lakeslot.snapshot import job as snapshot_job
from lakeslot.staging import apply_status
from lakeslot.staging.store import Staging
from tests.support import local_support, operator_env
from tests.support.apply_support import normal
from tests.support.reader_support import current_lsn
from tests.support.waiting import wait_for

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

DEADLINE_S = 300
SCHEMA = "app"
STEADY, LATE = TableName(SCHEMA, "steady"), TableName(SCHEMA, "late")
KEYLESS, DOOMED = TableName(SCHEMA, "keyless"), TableName(SCHEMA, "doomed")
MOVED = TableName(SCHEMA, "moved")


# the pure parts ------------------------------------------------------------------------------

def _row(table: TableName, state_: TableState = "Streaming", **fields: Any) -> TableStatus:
    return TableStatus(schema_name=table.schema, name=table.name, state=state_, **fields)


def _report(*rows: TableStatus) -> status_report.Report:
    return status_report.Report(PostgresIngestionStatus(tables=list(rows)), 1, datetime.now(UTC))


def test_a_table_that_left_the_selection_stays_removed_until_it_comes_back():
    a, b, c = TableName("s", "a"), TableName("s", "b"), TableName("s", "c")
    report = _report(_row(a, applied_lsn="0/10"), _row(b, applied_lsn="0/20"))
    status_report.table_rows(report, [a], {}, removed={b: "dropped"})
    assert [(r.name, r.state, r.message, r.applied_lsn) for r in report.status.tables] == [
        ("a", "Streaming", "", "0/10"), ("b", "Removed", "dropped", "0/20")]
    assert report.status.table_count == 1

    kept = _report(*report.status.tables)  # the next reconcile: still removed, nothing new
    status_report.table_rows(kept, [a], {})
    assert [(r.name, r.state) for r in kept.status.tables] == [("a", "Streaming"), ("b", "Removed")]

    back = _report(*kept.status.tables)  # selected again: it starts afresh
    status_report.table_rows(back, [a, b, c], {})
    assert [(r.name, r.state, r.applied_lsn) for r in back.status.tables] == [
        ("a", "Streaming", "0/10"), ("b", "Pending", None), ("c", "Pending", None)]


def test_only_the_latest_removed_rows_are_kept():
    many = [TableName("s", f"t{i:02}") for i in range(status_report.REMOVED_ROWS + 5)]
    report = _report(*[_row(t) for t in many])
    status_report.table_rows(report, [], {}, removed=dict.fromkeys(many, "gone"))
    assert [r.name for r in report.status.tables] == [t.name for t in many[-status_report.REMOVED_ROWS:]]
    assert {r.state for r in report.status.tables} == {"Removed"}


def test_the_fingerprint_changes_with_the_selection_and_identities_only(pgdb):
    source = SourceSpec.model_validate({"host": "h", "database": "d", "user": "u",
                                        "schemas": [SCHEMA], "tables": [{"name": "listed"}]})
    with pgdb.connect() as conn:
        conn.execute("CREATE SCHEMA app; CREATE SCHEMA other")
        conn.execute("CREATE TABLE app.t (id int PRIMARY KEY)")
        before = steps.selection_fingerprint(conn, source)
        for unrelated in ("INSERT INTO app.t VALUES (1)", "ALTER TABLE app.t ADD COLUMN v text",
                          "CREATE TABLE other.t (id int)", "CREATE TABLE public.unlisted (id int)"):
            conn.execute(unrelated)  # row changes, columns, other schemas: not the selection
            assert steps.selection_fingerprint(conn, source) == before, unrelated
        conn.execute("CREATE TABLE app.parts (id int) PARTITION BY RANGE (id)")
        before = steps.selection_fingerprint(conn, source)
        conn.execute("CREATE TABLE app.parts_1 PARTITION OF app.parts FOR VALUES FROM (0) TO (9)")
        assert steps.selection_fingerprint(conn, source) == before  # published via the root
        for change in ("CREATE TABLE app.n (a int)", "ALTER TABLE app.n REPLICA IDENTITY FULL",
                       "ALTER TABLE app.n ADD PRIMARY KEY (a)", "ALTER TABLE app.n RENAME TO m",
                       "CREATE TABLE public.listed (id int)", "DROP TABLE app.m"):
            conn.execute(change)
            after = steps.selection_fingerprint(conn, source)
            assert after != before, change
            before = after


# lakeslot run, end to end --------------------------------------------------------------------

class _SteadyWriter(local_support.BackgroundWriter):
    """The application on the existing table: inserts, updates and deletes, until stopped."""

    def __init__(self, db) -> None:
        super().__init__(db, seed=8, pause=0.02)

    def write(self, conn, rng: random.Random, next_id: int) -> None:
        conn.execute("INSERT INTO app.steady VALUES (%s, 'new')", (next_id,))
        conn.execute("UPDATE app.steady SET v = %s WHERE id = %s",
                     (f"u{rng.randint(0, 10**6)}", rng.randint(1, 2000)))
        conn.execute("DELETE FROM app.steady WHERE id = %s", (rng.randint(1, 2000),))


def _write_ingestion(path, db, tmp_path, warehouse) -> None:
    document = operator_env.ingestion_document(
        "schemas-test", db, [], warehouse=warehouse.as_uri(),
        staging=(tmp_path / "staging").as_uri(),
        snapshot={"parallelism": 2, "targetRangeBytes": 1 << 20},
        apply={"triggerIntervalSeconds": 1})
    document["spec"]["source"]["schemas"] = [SCHEMA]
    document["spec"]["staging"]["retentionSeconds"] = 0  # segments go as soon as applied
    path.write_text(yaml.safe_dump(document, allow_unicode=True))


def _rows_of_source(db, table: TableName) -> tuple[list[str], list[tuple]]:
    with db.connect() as conn:
        cursor = conn.execute(sql.SQL("SELECT * FROM {}").format(table.sql()))
        assert cursor.description is not None
        names = [d.name for d in cursor.description]
        return names, sorted(tuple(normal(v) for v in row) for row in cursor.fetchall())


def _rows_of_mirror(local, warehouse, table: TableName, names: list[str]) -> list[tuple]:
    loaded = load_hadoop_table(warehouse.as_uri(), local.job.names.mirror_identifier(table))
    assert loaded is not None, f"no mirror of {table}"
    data = loaded.scan(selected_fields=tuple(names)).to_arrow().select(names)
    return sorted(tuple(normal(v) for v in row.values()) for row in data.to_pylist())


@pytest.mark.slow
def test_a_table_created_while_the_run_streams_reaches_the_mirror_without_a_restart(
        pgdb, tmp_path, spark, spark_warehouse, monkeypatch):
    with pgdb.connect() as conn:
        conn.execute("CREATE SCHEMA app; CREATE SCHEMA elsewhere")
        conn.execute("CREATE TABLE app.steady (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO app.steady SELECT g, 's' || g FROM generate_series(1, 2000) g")
        conn.execute("CREATE TABLE app.doomed (id int PRIMARY KEY)")
        conn.execute("INSERT INTO app.doomed SELECT generate_series(1, 10)")
        conn.execute("CREATE TABLE app.moved (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO app.moved SELECT g, 'm' || g FROM generate_series(1, 100) g")
    path, state_dir = tmp_path / "ingestion.yaml", tmp_path / "state"
    _write_ingestion(path, pgdb, tmp_path, spark_warehouse)
    local = local_support.local(path, pgdb, state_dir)
    ingestion = config.load_ingestion(str(path))
    publication = local.job.names.publication
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)  # run.run exports it

    def position(table: TableName) -> int | None:  # (as lakeslot status shows it: an idle
        # table's advance is kept in memory, its covered position in the apply status document)
        covered = apply_status.covered(Staging(ingestion.spec.staging.uri).read_apply_status())
        return mirror_progress.read(ingestion, [table], covered=covered)[table].lsn

    def snapshot_lsn(table: TableName) -> int:
        return mirror_progress.read(ingestion, [table])[table].snapshot_lsn or 0

    def published() -> set[TableName]:
        with pgdb.connect() as conn:
            return {TableName(*r) for r in conn.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (publication,))}

    def removed() -> set[TableName]:
        return {TableName(r.schema_name, r.name) for r in state.read_tables(state_dir)
                if r.state == "Removed"}

    # While app.late is copied, its exported snapshot is held until app.steady's mirror has
    # committed changes made after it (the other tables keep streaming), and rows written to
    # app.late meanwhile are after the snapshot: only the stream can bring them.
    copies: list[tuple[TableName, ...]] = []  # the tables of each copy
    held: list[str] = []  # app.moved's mirror error when its copy starts
    real_run = snapshot_job.run

    def observed_run(spark_, job, **kwargs):
        def on_exported(snapshot) -> None:
            copies.append(job.tables)
            if MOVED in job.tables:  # stopped until this copy: nothing applied on a stale base
                held.append(mirror_progress.read(ingestion, [MOVED])[MOVED].error or "")
            if LATE not in job.tables:
                return
            with pgdb.connect() as conn:
                conn.execute("INSERT INTO app.late SELECT g, 'during the copy', g "
                             "FROM generate_series(5001, 5200) g")
                conn.execute("UPDATE app.late SET v = 'changed during the copy' WHERE id <= 20")
            wait_for(lambda: (position(STEADY) or 0) > snapshot.lsn,
                     "app.steady to stream while app.late is copied", deadline=DEADLINE_S, interval=1)
        return real_run(spark_, job, hooks=snapshot_job.Hooks(on_exported=on_exported), **kwargs)

    monkeypatch.setattr(snapshot_job, "run", observed_run)
    writer = _SteadyWriter(pgdb)

    def during() -> PostgresIngestionStatus:
        wait_for(lambda: all(position(t) is not None for t in (STEADY, DOOMED, MOVED)),
                 "the first snapshot", deadline=DEADLINE_S, interval=1)
        with pgdb.connect() as conn:  # rows written before the table joins the publication
            conn.execute("CREATE TABLE app.late (id int PRIMARY KEY, v text NOT NULL, n numeric(10,2))")
            conn.execute("INSERT INTO app.late SELECT g, 'before', g * 1.5 FROM generate_series(1, 3000) g")
            conn.execute("CREATE TABLE app.keyless (a int)")
            conn.execute("INSERT INTO app.keyless VALUES (1)")
            conn.execute("DROP TABLE app.doomed")
            conn.execute("ALTER TABLE app.moved SET SCHEMA elsewhere")
            conn.execute("UPDATE elsewhere.moved SET v = 'while out' WHERE id <= 50")  # in no stream
        wait_for(lambda: LATE in published(), "the run to pick app.late up", deadline=DEADLINE_S,
                 interval=0.5)
        assert KEYLESS not in published()
        with pgdb.connect() as conn:  # picked up, its copy not (necessarily) started yet
            conn.execute("INSERT INTO app.late SELECT g, 'joined', g FROM generate_series(3001, 4000) g")
            conn.execute("UPDATE app.late SET v = 'updated', n = NULL WHERE id % 7 = 0")
            conn.execute("DELETE FROM app.late WHERE id % 11 = 0")
            conn.execute("UPDATE app.keyless SET a = 2")  # the application is not broken
        wait_for(lambda: position(LATE) is not None, "app.late's mirror", deadline=DEADLINE_S,
                 interval=1)
        with pgdb.connect() as conn:  # streamed
            conn.execute("INSERT INTO app.late SELECT g, 'streamed', g FROM generate_series(4001, 4500) g")
            conn.execute("UPDATE app.late SET v = 'streamed update' WHERE id BETWEEN 21 AND 120")
            conn.execute("DELETE FROM app.late WHERE id BETWEEN 121 AND 170")
        wait_for(lambda: {DOOMED, MOVED} <= removed(), "the run to take app.doomed and app.moved out",
                 deadline=DEADLINE_S, interval=0.5)
        seen = observe.observe(local, observe.activity(local))  # what lakeslot status shows

        # Both come back: app.doomed created again, app.moved moved back (the same table: its
        # catalog facts match its mirror, which misses the updates made while it was out).
        # Each is copied again from a snapshot taken after it joined the publication again.
        with pgdb.connect() as conn:
            back = current_lsn(conn)
            conn.execute("CREATE TABLE app.doomed (id int PRIMARY KEY, w text)")
            conn.execute("INSERT INTO app.doomed SELECT g, 'again' FROM generate_series(1, 30) g")
            conn.execute("ALTER TABLE elsewhere.moved SET SCHEMA app")
        wait_for(lambda: snapshot_lsn(DOOMED) > back and snapshot_lsn(MOVED) > back,
                 "app.doomed and app.moved to be copied again", deadline=DEADLINE_S, interval=1)
        with pgdb.connect() as conn:
            conn.execute("UPDATE app.doomed SET w = 'streamed' WHERE id <= 5")
            conn.execute("UPDATE app.moved SET v = 'back' WHERE id > 90")
        assert writer.stop() > 0
        with pgdb.connect() as conn:
            target = current_lsn(conn)
        wait_for(lambda: all((position(t) or 0) >= target - 1 for t in (STEADY, LATE, DOOMED, MOVED)),
                 "the mirrors to catch up", deadline=DEADLINE_S, interval=1)
        return seen

    _, status = local_support.run_in_process(local, spark, once=False, during=during, interval=1.0,
                                             selection_interval=1.0)
    assert [c for c in copies if LATE in c] == [(LATE,)]  # app.late was copied once, alone
    # The first copy is the initial one. app.moved's second copy starts with the table stopped at
    # its position by whichever came first: the apply job replaying the rename (SET SCHEMA), or
    # the selection check seeing it join the publication again; either way nothing was applied
    # on its stale base, and the copy says why.
    assert len(held) == 2 and held[1].startswith("app.moved") and "copied again" in held[1], held
    assert status is not None
    rows = {TableName(r.schema_name, r.name): r for r in status.tables}
    assert rows[LATE].state == rows[STEADY].state == "Streaming"
    assert rows[KEYLESS].state == "Failed" and "no primary key" in rows[KEYLESS].message
    assert rows[DOOMED].state == rows[MOVED].state == "Removed"
    assert "no longer in schema app" in rows[MOVED].message and "is kept" in rows[MOVED].message
    assert status.table_count == 3

    for table in (STEADY, LATE, DOOMED, MOVED):
        names, expected = _rows_of_source(pgdb, table)
        assert _rows_of_mirror(local, spark_warehouse, table, names) == expected, table

    after = observe.observe(local, observe.activity(local))  # lakeslot status, after the run
    states = {TableName(r.schema_name, r.name): r.state for r in after.tables}
    assert states == {STEADY: "Streaming", LATE: "Streaming", KEYLESS: "Failed", DOOMED: "Streaming",
                      MOVED: "Streaming"}
