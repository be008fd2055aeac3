"""Connections and table resolution against real PostgreSQL 15 and 18."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.source import connection, tables
from tests.support.fixtures_pg import connection_settings
from tests.support.odd_names import ODD_SCHEMA, ODD_TABLES, create_odd_tables


def test_application_name_is_deterministic_bounded_and_unique():
    short = connection.application_name("reader", "ns/orders", "orders-reader-abc")
    assert short == "lakeslot-reader ns/orders orders-reader-abc"
    long_a = connection.application_name("reader", "team-" + "x" * 60 + "/orders", "pod-a")
    long_b = connection.application_name("reader", "team-" + "x" * 60 + "/orders", "pod-b")
    assert len(long_a.encode()) == len(long_b.encode()) == 63
    assert long_a != long_b  # the pod still tells holders apart after shortening
    assert long_a == connection.application_name("reader", "team-" + "x" * 60 + "/orders", "pod-a")
    assert connection.application_name("snapshot", "ns/ünï").isascii()


def test_sessions_identify_themselves_and_long_operations_have_no_timeouts(pgdb):
    with pgdb.connect() as conn:  # a role default that would kill long operations
        conn.execute(sql.SQL("ALTER DATABASE {} SET statement_timeout = '1s'").format(
            sql.Identifier(pgdb.name)))
        conn.execute(sql.SQL("ALTER DATABASE {} SET lock_timeout = '1s'").format(
            sql.Identifier(pgdb.name)))
    settings = connection_settings(pgdb)
    app = connection.application_name("snapshot", "ns/orders")
    with connection.connect(settings, app) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("1s",)
        assert conn.execute("SELECT application_name FROM pg_stat_activity"
                            " WHERE pid = pg_backend_pid()").fetchone() == (app,)
        assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
    with connection.connect(settings, app, long_running=True) as conn:
        for setting in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"):
            assert conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone() == ("0",)
        conn.execute("SELECT pg_sleep(1.5)")  # would have been cancelled at 1 s


def test_replication_connection(pgdb):
    app = connection.application_name("reader", "ns/orders", "pod-1")
    with connection.connect(connection_settings(pgdb), app, replication=True) as repl:
        system = repl.execute("IDENTIFY_SYSTEM").fetchone()
        assert system is not None and system[3] == pgdb.name


def test_sslmode_is_honoured(pgdb):
    settings = dataclasses.replace(connection_settings(pgdb), sslmode="require")
    with pytest.raises(psycopg.OperationalError, match="server does not support SSL"):
        connection.connect(settings, "lakeslot-test")
    assert "password" not in settings.params()


@pytest.mark.parametrize("version", ["pg15", "pg18"])
def test_tls_verify_full(pg_cluster_factory, version, tmp_path):
    cluster = pg_cluster_factory.get(version, tls=True)
    base = connection.ConnectionSettings("127.0.0.1", cluster.port, "postgres", cluster.superuser,
                                         cluster.password)
    verified = dataclasses.replace(base, sslmode="verify-full", sslrootcert=str(cluster.ca_cert))
    with connection.connect(verified, "lakeslot-test") as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                            ).fetchone() == (True,)
    with connection.connect(dataclasses.replace(base, sslmode="disable"), "lakeslot-test") as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                            ).fetchone() == (False,)
    other_ca = tmp_path / "other-ca.crt"  # a CA that did not sign the server's certificate
    other_ca.write_text(pg_cluster_factory.get(version, tls=True, application_name="'other'")
                        .ca_cert.read_text())
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        connection.connect(dataclasses.replace(verified, sslrootcert=str(other_ca)), "lakeslot-test")


def test_tables_are_resolved_by_exact_name(pgdb):
    with pgdb.connect() as conn:
        create_odd_tables(conn)
        conn.execute(sql.SQL("CREATE TABLE {} (id int, at date) PARTITION BY RANGE (at)").format(
            sql.Identifier(ODD_SCHEMA, "Parted")))
        conn.execute(sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ('2024-01-01')"
                             " TO ('2025-01-01')").format(sql.Identifier(ODD_SCHEMA, "Parted 2024"),
                                                          sql.Identifier(ODD_SCHEMA, "Parted")))
        conn.execute("CREATE VIEW a_view AS SELECT 1 AS x")
        found = tables.existing(conn, [*ODD_TABLES, TableName("public", "a_view"),
                                       TableName("public", "order"), TableName("PUBLIC", "SELECT")])
        assert set(found) == set(ODD_TABLES)
        in_schema = tables.in_schemas(conn, [ODD_SCHEMA])
        assert in_schema == sorted([t for t in ODD_TABLES if t.schema == ODD_SCHEMA]
                                   + [TableName(ODD_SCHEMA, "Parted")])


def test_names_render_like_quote_ident(pgdb):
    with pgdb.connect() as conn:
        for table in [*ODD_TABLES, TableName("public", "plain_name"), TableName("s", "user")]:
            expected = conn.execute("SELECT quote_ident(%s) || '.' || quote_ident(%s)",
                                    (table.schema, table.name)).fetchone()[0]
            assert str(table) == expected


def test_settings_and_tables_from_the_spec(pgdb):
    from lakeslot.api.models import SourceSpec

    source = SourceSpec.model_validate({
        "host": "127.0.0.1", "port": pgdb.cluster.port, "database": pgdb.name, "user": "postgres",
        "passwordSecretRef": {"name": "pg", "key": "password"},
        "options": {"connect_timeout": "5"},
        "tables": [{"schema": ODD_SCHEMA, "name": "order"}, {"name": "not yet created"}],
        "schemas": [ODD_SCHEMA]})
    settings = connection.settings_from_spec(source, password=pgdb.cluster.password)
    assert settings.params()["connect_timeout"] == "5"
    with connection.connect(settings, "lakeslot-test") as conn:
        create_odd_tables(conn)
        assert tables.selected(conn, source) == sorted(
            [t for t in ODD_TABLES if t.schema == ODD_SCHEMA] + [TableName("public", "not yet created")])
    with pytest.raises(ValueError, match="caSecretRef"):
        connection.settings_from_spec(source.model_copy(update={
            "ca_secret_ref": source.password_secret_ref}), password=None)
