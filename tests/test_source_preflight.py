"""Preflight checks against real PostgreSQL 15 and 18: each failure has its message and fix."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.source import connection, preflight
from lakeslot.source.columns import ColumnOptions
from tests.support.fixtures_pg import connection_settings
from tests.support.odd_names import create_odd_tables
from tests.support.queries import counted

APP = connection.application_name("test", "default/preflight")


def _run(settings, tables, **kwargs):
    with connection.connect(settings, APP) as conn:
        return preflight.run(conn, tables, **kwargs)


def _failure(findings, check, table=None):
    found = [f for f in preflight.failures(findings) if f.check == check and f.table == table]
    assert found, f"no {check} failure for {table} in {[str(f) for f in findings]}"
    return found[0]


@pytest.fixture
def role(pgdb):
    """A fresh login role (no REPLICATION, no SELECT, owns nothing) and its password."""
    name, password = f"r_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with pgdb.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(password)))
    yield name, password
    with pgdb.connect() as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
    with pgdb.cluster.connect() as conn:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_a_healthy_setup_passes_every_check_with_odd_identifiers(pgdb):
    with pgdb.connect() as conn:
        tables = create_odd_tables(conn)
    findings = _run(connection_settings(pgdb), tables, slot_name="s")
    assert preflight.failures(findings) == []
    checked = {(f.check, f.table) for f in findings}
    for table in tables:
        for check in ("select_privilege", "replica_identity", "row_level_security",
                      "column_types", "ownership"):
            assert (check, table) in checked


def test_the_checks_cost_the_same_queries_for_fifty_tables_as_for_one(pgdb):
    # The operator runs them on every reconcile and lakeslot run on every status: one set of
    # queries per table was 12,000 round trips (3.5 s) a reconcile of 1,000 tables. A table that
    # passes costs no query of its own (its failure's fix and partitionBy may).
    with pgdb.connect() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS fifty")
        tables = [TableName("fifty", f"t{i}") for i in range(50)]
        for table in tables:
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY, g int GENERATED "
                                 "ALWAYS AS (id + 1) STORED, v text[])").format(table.sql()))
    with connection.connect(connection_settings(pgdb), APP) as conn:
        queries = counted(conn)
        one = preflight.run(conn, tables[:1], slot_name="s")
        for_one = len(queries)
        queries.clear()
        fifty = preflight.run(conn, tables, slot_name="s")
    assert preflight.failures(one) == preflight.failures(fifty) == []
    assert len(queries) == for_one
    assert {f.check for f in fifty if f.table == tables[-1]} >= {
        "select_privilege", "replica_identity", "excluded_columns", "generated_columns",
        "row_level_security", "column_types", "ownership"}


@pytest.mark.parametrize("version", ["pg15", "pg18"])
def test_wal_level_replica_is_reported_with_the_fix(pg_cluster_factory, version):
    cluster = pg_cluster_factory.get(version, wal_level="replica")
    settings = connection.ConnectionSettings("127.0.0.1", cluster.port, "postgres",
                                             cluster.superuser, cluster.password)
    failure = _failure(_run(settings, []), "wal_level")
    assert "'replica'" in failure.message
    assert "ALTER SYSTEM SET wal_level = logical" in failure.fix


def test_missing_privileges_are_reported_with_grants(pgdb, role):
    user, password = role
    with pgdb.connect() as conn:
        conn.execute('CREATE TABLE "Private" (id int PRIMARY KEY)')
    table = TableName("public", "Private")
    findings = _run(connection_settings(pgdb, user, password), [table])
    assert f'ALTER ROLE "{user}" WITH REPLICATION;' in _failure(findings, "replication_privilege").fix
    select = _failure(findings, "select_privilege", table)
    assert select.message == f"role {user} cannot SELECT from it (no column granted)"
    assert select.fix == f'GRANT SELECT ON "public"."Private" TO "{user}";'
    # The fixes lead with the narrower way out (a publication the DBA creates), and never hand
    # the role the owner's rights or superuser membership.
    ownership = _failure(findings, "ownership", table)
    assert "does not own it (owner: postgres)" in ownership.message
    assert "publicationManagement: External" in ownership.fix and "GRANT" not in ownership.fix
    create = _failure(findings, "create_privilege")
    assert "publicationManagement: External" in create.fix
    assert create.fix.endswith(f'GRANT CREATE ON DATABASE "{pgdb.name}" TO "{user}";')
    # Once fixed, the same checks pass: the messages were right about what was missing.
    with pgdb.connect() as conn:
        conn.execute(sql.SQL("ALTER ROLE {} WITH REPLICATION").format(sql.Identifier(user)))
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(table.sql(), sql.Identifier(user)))
        conn.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(table.sql(), sql.Identifier(user)))
        conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            sql.Identifier(pgdb.name), sql.Identifier(user)))
    assert preflight.failures(_run(connection_settings(pgdb, user, password), [table])) == []


def test_a_least_privileged_role_with_column_grants_passes_when_the_dba_manages_the_publication(
        pgdb, role):
    """LOGIN REPLICATION and SELECT on some columns, owning nothing, no CREATE on the database:
    with the publication managed by a DBA, every check passes once the columns it lacks are
    excluded; a column neither granted nor excluded fails with the narrowest grant."""
    user, password = role
    pii = TableName("app", "people")
    with pgdb.connect() as conn:
        conn.execute("CREATE SCHEMA app")
        conn.execute("CREATE TABLE app.people (id int PRIMARY KEY, name text, ssn text)")
        conn.execute(sql.SQL("ALTER ROLE {} WITH REPLICATION").format(sql.Identifier(user)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA app TO {}").format(sql.Identifier(user)))
        conn.execute(sql.SQL("GRANT SELECT (id, name) ON app.people TO {}").format(
            sql.Identifier(user)))
        conn.execute(sql.SQL("REVOKE CREATE ON DATABASE {} FROM PUBLIC").format(
            sql.Identifier(pgdb.name)))
    settings = connection_settings(pgdb, user, password)
    excluded = {pii: ColumnOptions(exclude_columns=("ssn",))}
    findings = _run(settings, [pii], options=excluded, manage_publication=False)
    assert preflight.failures(findings) == [], [str(f) for f in preflight.failures(findings)]
    assert {f.check for f in findings} >= {"select_privilege", "replica_identity"}
    assert not {f.check for f in findings} & {"create_privilege", "ownership"}
    # Managed by lakeslot, the same role lacks CREATE and ownership: named, nothing else.
    managed = {f.check for f in preflight.failures(_run(settings, [pii], options=excluded))}
    assert managed == {"create_privilege", "ownership"}
    # Managed by lakeslot, publication already there: CREATE is not needed.
    assert {f.check for f in preflight.failures(_run(
        settings, [pii], options=excluded, create_publication=False))} == {"ownership"}
    failure = _failure(_run(settings, [pii], manage_publication=False), "select_privilege", pii)
    assert failure.message == f"role {user} cannot SELECT from it (columns ['ssn'])"
    assert failure.fix == (f'GRANT SELECT ("ssn") ON "app"."people" TO "{user}"; — or list those '
                           "columns in excludeColumns")
    with pgdb.connect() as conn:
        conn.execute("CREATE SCHEMA hidden")
        conn.execute("CREATE TABLE hidden.t (id int PRIMARY KEY)")
    failure = _failure(_run(settings, [TableName("hidden", "t")], manage_publication=False),
                       "select_privilege", TableName("hidden", "t"))
    assert failure.message == (f"role {user} cannot SELECT from it (no column granted; no USAGE "
                               "on schema hidden)")
    assert failure.fix == (f'GRANT USAGE ON SCHEMA "hidden" TO "{user}"; GRANT SELECT ON '
                           f'"hidden"."t" TO "{user}";')


def test_tables_without_a_usable_replica_identity(pgdb):
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE keyless (a int, b text)")
        conn.execute("CREATE TABLE indexed (a int NOT NULL, b text)")
        conn.execute("CREATE UNIQUE INDEX indexed_a ON indexed (a)")
        conn.execute("CREATE TABLE nothing (a int PRIMARY KEY)")
        conn.execute("ALTER TABLE nothing REPLICA IDENTITY NOTHING")
        conn.execute("CREATE TABLE full_keyless (a int, b text)")
        conn.execute("ALTER TABLE full_keyless REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE keyed_default (a int, b text)")
    t = {n: TableName("public", n) for n in
         ("keyless", "indexed", "nothing", "full_keyless", "keyed_default")}
    findings = _run(connection_settings(pgdb), list(t.values()),
                    options={t["full_keyless"]: ColumnOptions(key_columns=("a",)),
                             t["keyed_default"]: ColumnOptions(key_columns=("a",))})

    keyless = _failure(findings, "replica_identity", t["keyless"])
    assert "no primary key" in keyless.message
    assert "ALTER TABLE \"public\".\"keyless\" ADD PRIMARY KEY" in keyless.fix
    assert 'REPLICA IDENTITY FULL' in keyless.fix
    indexed = _failure(findings, "replica_identity", t["indexed"])
    assert indexed.fix == 'ALTER TABLE "public"."indexed" REPLICA IDENTITY USING INDEX "indexed_a";'
    assert "REPLICA IDENTITY NOTHING" in _failure(findings, "replica_identity", t["nothing"]).message
    not_full = _failure(findings, "replica_identity", t["keyed_default"])
    assert "not FULL" in not_full.message
    assert not_full.fix.startswith('ALTER TABLE "public"."keyed_default" REPLICA IDENTITY FULL;')
    # FULL with configured key columns is usable.
    assert not [f for f in preflight.failures(findings) if f.table == t["full_keyless"]]


def test_full_identity_without_key_columns_asks_for_them(pgdb):
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE full_keyless (a int)")
        conn.execute("ALTER TABLE full_keyless REPLICA IDENTITY FULL")
    table = TableName("public", "full_keyless")
    failure = _failure(_run(connection_settings(pgdb), [table]), "replica_identity", table)
    assert "keyColumns" in failure.fix


def test_row_level_security_that_hides_rows(pgdb, role):
    user, password = role
    table = TableName("public", "Secret Rows")
    with pgdb.connect() as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, owner text)").format(table.sql()))
        conn.execute(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table.sql()))
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(table.sql(), sql.Identifier(user)))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'x')").format(table.sql()))
    settings = connection_settings(pgdb, user, password)
    with connection.connect(settings, APP) as conn:  # the danger is real: the row is invisible
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table.sql())).fetchone() == (0,)
    failure = _failure(_run(settings, [table], manage_publication=False), "row_level_security",
                       table)
    assert "silently miss rows" in failure.message
    assert f"ALTER ROLE \"{user}\" BYPASSRLS;" in failure.fix
    # The superuser bypasses RLS: no finding.
    assert not [f for f in preflight.failures(_run(connection_settings(pgdb), [table]))
                if f.check == "row_level_security"]


def test_unsupported_column_type(pgdb):
    table = TableName("public", "catalog refs")
    with pgdb.connect() as conn:
        conn.execute("CREATE DOMAIN class_ref AS regclass")
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, rel class_ref[], r regtype,"
                             " ok int4range)").format(table.sql()))
    findings = _run(connection_settings(pgdb), [table])
    messages = sorted(f.message for f in preflight.failures(findings) if f.check == "column_types")
    assert len(messages) == 2
    assert messages[0].startswith("column r: unsupported type regtype")
    assert messages[1].startswith("column rel: unsupported type regclass")
    assert all("excludeColumns" in f.fix for f in preflight.failures(findings))
    # Excluding the unsupported columns is the documented way out.
    assert preflight.failures(_run(connection_settings(pgdb), [table],
                                   options={table: ColumnOptions(exclude_columns=("rel", "r"))})) == []


def test_excluded_columns_must_exist_and_not_be_keys(pgdb):
    with pgdb.connect() as conn:
        conn.execute('CREATE TABLE t ("Id" int PRIMARY KEY, "Big Blob" bytea)')
    table = TableName("public", "t")
    findings = _run(connection_settings(pgdb), [table], options={table: ColumnOptions(exclude_columns=("Id", "nope"))})
    assert _failure(findings, "excluded_columns", table).message == \
        "excluded columns ['nope'] do not exist"
    findings = _run(connection_settings(pgdb), [table], options={table: ColumnOptions(exclude_columns=("Id",))})
    assert "key columns ['Id'] cannot be excluded" in _failure(findings, "excluded_columns",
                                                               table).message
    ok = _run(connection_settings(pgdb), [table], options={table: ColumnOptions(exclude_columns=("Big Blob",))})
    assert preflight.failures(ok) == []


def test_columns_that_differ_only_in_case_are_refused_only_where_the_catalog_folds_names(pgdb):
    with pgdb.connect() as conn:
        conn.execute('CREATE TABLE cased ("Id" int PRIMARY KEY, id int, "ID" text, note text)')
    table = TableName("public", "cased")
    settings = connection_settings(pgdb)
    assert preflight.failures(_run(settings, [table])) == []  # Spark and Iceberg tell them apart
    failure = _failure(_run(settings, [table], folding_catalog="glue"), "case_folded_columns",
                       table)
    assert "'Id', 'id', 'ID'" in failure.message and "glue" in failure.message
    assert "excludeColumns" in failure.fix
    assert preflight.failures(_run(settings, [table], folding_catalog="glue",
                                   options={table: ColumnOptions(exclude_columns=("id", "ID"))})) == []


def test_missing_table_and_exhausted_slots(pg_cluster_factory):
    cluster = pg_cluster_factory.get("pg15", max_replication_slots="2")
    with cluster.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('occupant', 'pgoutput')")
    try:
        settings = connection.ConnectionSettings("127.0.0.1", cluster.port, "postgres",
                                                 cluster.superuser, cluster.password)
        findings = _run(settings, [TableName("public", "Nope")], slot_name="mine")
        slots = _failure(findings, "replication_slots")
        assert "max_replication_slots=2 with 1 in use leaves 1; lakeslot needs 2" in slots.message
        assert slots.fix.startswith("ALTER SYSTEM SET max_replication_slots = 5")
        assert "does not exist" in _failure(findings, "table_exists", TableName("public", "Nope")).message
    finally:
        with cluster.connect() as conn:
            conn.execute("SELECT pg_drop_replication_slot('occupant')")


def test_wrong_password_names_the_user_not_the_password(pgdb):
    settings = connection_settings(pgdb, "postgres", "not-the-password-42")
    with pytest.raises(psycopg.OperationalError) as caught:
        connection.connect(settings, APP)
    assert 'password authentication failed for user "postgres"' in str(caught.value)
    assert "not-the-password-42" not in str(caught.value)
    assert "not-the-password-42" not in repr(settings)
