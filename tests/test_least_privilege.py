"""A least-privilege source, end to end (issue 49): ``lakeslot run`` as a role with ``LOGIN
REPLICATION`` and ``SELECT`` only — on one table only on the columns it mirrors, the third (PII)
excluded — that owns nothing and may create nothing, against a publication with a column list that
the tables' owner created (``publicationManagement: External``). Real PostgreSQL 15 and 18, the
reader as a child process, Spark + Iceberg on the tests' shared session.

While it streams: changes to every table, a column added to one (DDL capture falls back to
comparing the catalog: the role may not install the event trigger), a table the owner adds to the
publication (picked up without a restart, copied from after it joined), a table the publication
lacks and one the role may not read (each ``Failed`` alone with the statement to run, the others
streaming), a mirrored table the owner takes out of the publication and back (``Failed`` while
out, then copied again from after it came back). On 18 a ``VIRTUAL`` generated column (not in
the WAL) is left out of the mirror with a note. Afterwards every mirror is compared with its
source row by row through pyiceberg, and the publication is exactly what its owner made of it:
lakeslot changed nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import yaml
from psycopg import sql

from lakeslot import workloads
from lakeslot.api.conditions import find_condition
from lakeslot.api.models import PostgresIngestion, PostgresIngestionStatus, SourceSpec
from lakeslot.api.naming import TableName
from lakeslot.control import steps
from lakeslot.local import config, observe, state
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.observability.status_report import Report
from lakeslot.source import publication
from lakeslot.staging import apply_status
from lakeslot.staging.store import Staging
from tests.support import local_support
from tests.support.apply_support import normal
from tests.support.operator_env import ingestion_document
from tests.support.reader_support import current_lsn
from tests.support.waiting import wait_for

DEADLINE_S = 300
PUBLICATION = "lake_pub"
PLAIN, PEOPLE, LATE = TableName("app", "plain"), TableName("app", "people"), TableName("app", "late")
MISSING, SECRET = TableName("app", "missing"), TableName("app", "secret")


def _setup(conn, role: str, password: str) -> bool:
    """The owner's tables and publication, and the CDC role's grants; whether the server has
    virtual generated columns (18)."""
    virtual = conn.info.server_version >= 180000
    conn.execute("CREATE SCHEMA app")
    conn.execute("CREATE TABLE app.plain (id int PRIMARY KEY, v text"
                 + (", twice int GENERATED ALWAYS AS (id * 2) VIRTUAL" if virtual else "") + ")")
    conn.execute("INSERT INTO app.plain (id, v) SELECT g, 'p' || g FROM generate_series(1, 500) g")
    conn.execute("CREATE TABLE app.people (id int PRIMARY KEY, name text, ssn text NOT NULL)")
    conn.execute("INSERT INTO app.people SELECT g, 'n' || g, 'ssn-' || g FROM generate_series(1, 300) g")
    for table in ("late", "missing", "secret"):
        conn.execute(sql.SQL("CREATE TABLE app.{} (id int PRIMARY KEY, v text)").format(
            sql.Identifier(table)))
        conn.execute(sql.SQL("INSERT INTO app.{} SELECT g, 'x' || g FROM generate_series(1, 200) g"
                             ).format(sql.Identifier(table)))
    conn.execute("CREATE PUBLICATION lake_pub FOR TABLE app.plain, app.people (id, name), "
                 "app.secret WITH (publish_via_partition_root = true)")
    ident = sql.Identifier(role)
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
        ident, sql.Literal(password)))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA app TO {}").format(ident))
    conn.execute(sql.SQL("GRANT SELECT ON app.plain, app.late, app.missing TO {}").format(ident))
    conn.execute(sql.SQL("GRANT SELECT (id, name) ON app.people TO {}").format(ident))
    return virtual


def _rows_of_source(db, table: TableName, names: list[str] | None = None) -> tuple[list[str], list]:
    with db.connect() as conn:
        columns = sql.SQL(", ").join(map(sql.Identifier, names)) if names else sql.SQL("*")
        cursor = conn.execute(sql.SQL("SELECT {} FROM {}").format(columns, table.sql()))
        assert cursor.description is not None
        return ([d.name for d in cursor.description],
                sorted(tuple(normal(v) for v in row) for row in cursor.fetchall()))


def _mirror(local, warehouse, table: TableName):
    loaded = load_hadoop_table(warehouse.as_uri(), local.job.names.mirror_identifier(table))
    assert loaded is not None, f"no mirror of {table}"
    return loaded


def _rows_of_mirror(local, warehouse, table: TableName, names: list[str]) -> list:
    data = _mirror(local, warehouse, table).scan(selected_fields=tuple(names)).to_arrow().select(names)
    return sorted(tuple(normal(v) for v in row.values()) for row in data.to_pylist())


def _publication(db) -> list[tuple]:
    with db.connect() as conn:
        return conn.execute(
            "SELECT p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, p.pubviaroot,"
            " obj_description(p.oid, 'pg_publication'), t.schemaname, t.tablename, t.attnames"
            " FROM pg_publication p JOIN pg_publication_tables t ON t.pubname = p.pubname"
            " WHERE p.pubname = %s ORDER BY t.schemaname, t.tablename", (PUBLICATION,)).fetchall()


def test_the_fingerprint_sees_what_an_external_publication_publishes(pgdb):
    """``lakeslot run`` takes the source steps again when the DBA changes the publication: a
    table added, a column added to a published table (with a column list it is not sent: the
    check reports it), the options; row changes and unpublished tables change nothing."""
    source = SourceSpec.model_validate({"host": "h", "database": "d", "user": "u",
                                        "schemas": ["app"]})
    with pgdb.connect() as conn:
        conn.execute("CREATE SCHEMA app")
        conn.execute("CREATE TABLE app.a (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE app.b (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION lake_pub FOR TABLE app.a (id)")

        def fingerprint() -> tuple:
            return steps.selection_fingerprint(conn, source, PUBLICATION)

        before = fingerprint()
        for unrelated in ("INSERT INTO app.a VALUES (1, 'x')", "ALTER TABLE app.b ADD COLUMN w text"):
            conn.execute(unrelated)
            assert fingerprint() == before, unrelated
        for change in ("ALTER PUBLICATION lake_pub ADD TABLE app.b",
                       "ALTER TABLE app.a ADD COLUMN w text",
                       "ALTER PUBLICATION lake_pub SET (publish = 'insert, update, delete')",
                       "ALTER PUBLICATION lake_pub SET (publish_via_partition_root = true)"):
            conn.execute(change)
            after = fingerprint()
            assert after != before, change
            before = after
        assert steps.selection_fingerprint(conn, source) != before  # (without the publication)


def test_the_source_steps_say_who_manages_the_publication_and_fail_only_what_it_lacks(
        pgdb, tmp_path):
    """``check_source`` as every reconcile takes it: External with no publication stops with the
    DBA's CREATE (each table's row still says its own findings); Auto over a publication someone
    else created verifies it (``publicationManagedBy: External``), fails alone the table it lacks
    and changes nothing; Lakeslot manages even that one."""
    a, b = TableName("public", "a"), TableName("public", "b")
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE b (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE keyless (v int)")
        generated = ", publish_generated_columns = stored" if conn.info.server_version >= 180000 else ""

    def check(setting: str, tables: list[TableName]) -> tuple[list | None, Report]:
        document = ingestion_document("lp", pgdb, tables, warehouse=str(tmp_path / "w"),
                                      staging=(tmp_path / "s").as_uri())
        document["spec"]["source"].update(publicationName=PUBLICATION,
                                          publicationManagement=setting)
        report = Report(PostgresIngestionStatus(), 1, datetime.now(UTC))
        with pgdb.connect(autocommit=True) as conn:
            return steps.check_source(conn, PostgresIngestion.model_validate(document),
                                      report), report

    keyless = TableName("public", "keyless")
    good, report = check("External", [a, keyless])
    assert good is None and report.status.publication_managed_by == "External"
    out_of_sync = find_condition(report.status.conditions, "SourceReady")
    assert out_of_sync is not None and out_of_sync.reason == "PublicationOutOfSync"
    assert out_of_sync.message.endswith(  # (never the keyless table: see preflight)
        'CREATE PUBLICATION "lake_pub" FOR TABLE ONLY "public"."a" WITH '
        f"(publish_via_partition_root = true{generated});")
    assert {r.name: r.state for r in report.status.tables} == {"a": "Pending", "keyless": "Failed"}
    with pgdb.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)
        conn.execute("CREATE PUBLICATION lake_pub FOR TABLE a")

    good, report = check("Auto", [a, b])
    assert good == [a] and report.status.publication_managed_by == "External"
    rows = {r.name: r for r in report.status.tables}
    assert rows["a"].state == "Pending" and rows["b"].state == "Failed"
    assert rows["b"].message.endswith('ALTER PUBLICATION "lake_pub" ADD TABLE ONLY "public"."b";')
    with pgdb.connect() as conn:
        assert publication.members(conn, PUBLICATION) == {a}

    good, report = check("Lakeslot", [a, b])
    assert good == [a, b] and report.status.publication_managed_by == "Lakeslot"
    with pgdb.connect() as conn:
        assert publication.members(conn, PUBLICATION) == {a, b}


@pytest.mark.slow
def test_a_role_that_owns_nothing_mirrors_through_the_dbas_publication(
        pgdb, tmp_path, spark, spark_warehouse, monkeypatch):
    role, password = f"lake_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with pgdb.connect() as conn:
        virtual = _setup(conn, role, password)
    path, state_dir = tmp_path / "ingestion.yaml", tmp_path / "state"
    tables = [PLAIN, PEOPLE, LATE, MISSING, SECRET]
    document = local_support.write_ingestion(path, pgdb, tables, tmp_path, warehouse=spark_warehouse, source={
        "user": role, "publicationName": PUBLICATION, "publicationManagement": "External"})
    document["spec"]["source"]["tables"][1]["excludeColumns"] = ["ssn"]
    path.write_text(yaml.safe_dump(document))
    local = config.load(str(path), state_dir=str(state_dir),
                        environ={workloads.PASSWORD_ENV: password})
    ingestion = local.ingestion
    monkeypatch.setenv(workloads.PASSWORD_ENV, password)  # run.run exports it

    def position(table: TableName) -> int | None:
        covered = apply_status.covered(Staging(ingestion.spec.staging.uri).read_apply_status())
        return mirror_progress.read(ingestion, [table], covered=covered)[table].lsn

    def state_of(table: TableName) -> str | None:
        return next((r.state for r in state.read_tables(state_dir)
                     if TableName(r.schema_name, r.name) == table), None)

    def published_and_copied(statement: str, table: TableName) -> None:
        """The owner publishes ``table`` (``statement``); lakeslot copies it from after that."""
        with pgdb.connect() as conn:
            before = current_lsn(conn)
            conn.execute(statement)
        wait_for(lambda: (mirror_progress.read(ingestion, [table])[table].snapshot_lsn or 0) > before,
                 f"{table} to be copied after it was published", deadline=DEADLINE_S, interval=1)

    def during() -> PostgresIngestionStatus:
        wait_for(lambda: all(position(t) is not None for t in (PLAIN, PEOPLE)),
                 "the first snapshot", deadline=DEADLINE_S, interval=1)
        seen = observe.observe(local, observe.activity(local))
        with pgdb.connect() as conn:
            conn.execute("UPDATE app.plain SET v = 'u' || id WHERE id % 5 = 0")
            conn.execute("DELETE FROM app.plain WHERE id % 7 = 0")
            conn.execute("INSERT INTO app.plain (id, v) SELECT g, 'new' FROM generate_series(501, 600) g")
            conn.execute("UPDATE app.people SET name = 'renamed', ssn = 'changed' WHERE id % 3 = 0")
            conn.execute("DELETE FROM app.people WHERE id % 11 = 0")
            conn.execute("INSERT INTO app.people SELECT g, 'p' || g, 's' FROM generate_series(301, 350) g")
            conn.execute("UPDATE app.secret SET v = 'unread'")  # published, not readable: held
            # a column added mid-stream, then written
            conn.execute("ALTER TABLE app.plain ADD COLUMN extra text")
            conn.execute("UPDATE app.plain SET extra = 'e' || id WHERE id % 4 = 0")
            conn.execute("INSERT INTO app.plain (id, v, extra) VALUES (1000, 'after', 'ddl')")
            conn.execute("INSERT INTO app.late SELECT g, 'before joining' FROM generate_series(201, 260) g")
        # the owner adds a table to the publication while lakeslot streams
        published_and_copied("ALTER PUBLICATION lake_pub ADD TABLE app.late", LATE)
        with pgdb.connect() as conn:
            conn.execute("UPDATE app.late SET v = 'streamed' WHERE id <= 30")
            conn.execute("DELETE FROM app.late WHERE id BETWEEN 31 AND 40")
            conn.execute("UPDATE app.plain SET extra = 'last' WHERE id <= 10")
            # the owner takes a mirrored table out of the publication, and back: what changed
            # meanwhile is in no stream, so it is copied again (from after it came back)
            conn.execute("ALTER PUBLICATION lake_pub DROP TABLE app.people")
        wait_for(lambda: state_of(PEOPLE) == "Failed", "app.people to fail while out",
                 deadline=DEADLINE_S, interval=0.5)
        with pgdb.connect() as conn:
            conn.execute("UPDATE app.people SET name = 'while out' WHERE id <= 20")
        published_and_copied("ALTER PUBLICATION lake_pub ADD TABLE app.people (id, name)", PEOPLE)
        with pgdb.connect() as conn:
            conn.execute("UPDATE app.people SET name = 'back' WHERE id BETWEEN 21 AND 25")
            target = current_lsn(conn)
        wait_for(lambda: all((position(t) or 0) >= target - 1 for t in (PLAIN, PEOPLE, LATE)),
                 "the mirrors to catch up", deadline=DEADLINE_S, interval=1)
        return seen

    _, first = local_support.run_in_process(local, spark, once=False, during=during, interval=1.0,
                                            selection_interval=1.0)
    assert first is not None
    assert first.publication_managed_by == "External" and first.ddl_capture == "Catalog"
    rows = {TableName(r.schema_name, r.name): r for r in first.tables}
    assert rows[MISSING].state == rows[LATE].state == "Failed"
    assert rows[MISSING].message.endswith(
        'ALTER PUBLICATION "lake_pub" ADD TABLE ONLY "app"."missing";'), rows[MISSING].message
    assert rows[SECRET].state == "Failed"
    assert f'GRANT SELECT ON "app"."secret" TO "{role}";' in rows[SECRET].message
    assert "GRANT \"postgres\"" not in "".join(r.message for r in first.tables)
    if virtual:
        assert "virtual generated columns ['twice'] are left out of the mirror" in rows[PLAIN].message

    after = observe.observe(local, observe.activity(local))  # lakeslot status, after the run
    states = {TableName(r.schema_name, r.name): r.state for r in after.tables}
    assert states == {PLAIN: "Streaming", PEOPLE: "Streaming", LATE: "Streaming",
                      MISSING: "Failed", SECRET: "Failed"}
    assert after.publication_managed_by == "External"

    # every mirror equals its source (people without the excluded column), read by pyiceberg
    for table, wanted in ((PLAIN, ["id", "v", "extra"]), (PEOPLE, ["id", "name"]), (LATE, None)):
        names, expected = _rows_of_source(pgdb, table, wanted)
        assert _rows_of_mirror(local, spark_warehouse, table, names) == expected, table
    assert [f.name for f in _mirror(local, spark_warehouse, PLAIN).schema().fields
            if not f.name.startswith("_lakeslot")] == ["id", "v", "extra"]  # no 'twice'
    assert "ssn" not in {f.name for f in _mirror(local, spark_warehouse, PEOPLE).schema().fields}
    for table in (MISSING, SECRET):
        assert load_hadoop_table(spark_warehouse.as_uri(),
                                 local.job.names.mirror_identifier(table)) is None

    # the publication is what its owner made it: lakeslot created, altered and dropped nothing
    published = _publication(pgdb)
    assert {(r[6], r[7]) for r in published} == {("app", "plain"), ("app", "people"),
                                                 ("app", "late"), ("app", "secret")}
    assert all(r[:6] == (True, True, True, True, True, None) for r in published)
    assert next(r[8] for r in published if r[7] == "people") == ["id", "name"]
    with pgdb.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_event_trigger").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = '_lakeslot'"
                            ).fetchone() == (0,)
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute("DROP PUBLICATION lake_pub")
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
