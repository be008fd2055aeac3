"""Publication sync against real PostgreSQL 15 and 18."""

from __future__ import annotations

from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.source import connection, publication
from tests.support.fixtures_pg import connection_settings
from tests.support.odd_names import ODD_TABLES, create_odd_tables

OWNER = "default/orders"
APP = connection.application_name("test", OWNER)
PUB = 'lakeslot "pub" ü'


def _connect(pgdb):
    return connection.connect(connection_settings(pgdb), APP)


def test_create_then_repair_drift_with_odd_identifiers(pgdb):
    with _connect(pgdb) as conn:
        tables = create_odd_tables(conn)
        report = publication.sync(conn, PUB, tables, owner=OWNER)
        assert report.ok and report.created and report.managed
        assert sorted(report.added) == sorted(tables)
        assert publication.members(conn, PUB) == set(tables)

        # Drift by hand: one table removed, a foreign table added.
        conn.execute("CREATE TABLE intruder (id int PRIMARY KEY)")
        conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
            sql.Identifier(PUB), tables[0].sql()))
        conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE intruder").format(sql.Identifier(PUB)))
        conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish = 'insert')").format(
            sql.Identifier(PUB)))

        report = publication.sync(conn, PUB, tables, owner=OWNER)
        assert report.ok and not report.created
        assert report.added == [tables[0]]
        assert report.removed == [TableName("public", "intruder")]
        assert publication.members(conn, PUB) == set(tables)
        assert conn.execute("SELECT pubinsert AND pubupdate AND pubdelete AND pubtruncate"
                            " FROM pg_publication WHERE pubname = %s", (PUB,)).fetchone() == (True,)

        # Idempotent: nothing left to do.
        again = publication.sync(conn, PUB, tables, owner=OWNER)
        assert (again.ok, again.added, again.removed) == (True, [], [])


def test_errors_are_collected_and_the_rest_is_applied(pgdb):
    with _connect(pgdb) as conn:
        conn.execute("CREATE TABLE good (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE keyless (a int)")
        wanted = [TableName("public", "good"), TableName("public", "missing"),
                  TableName("public", "keyless")]
        report = publication.sync(conn, "p", wanted, owner=OWNER)
        assert report.added == [TableName("public", "good")]
        assert len(report.errors) == 2
        assert report.errors[0] == "cannot add public.missing: the table does not exist"
        assert "refusing to add public.keyless" in report.errors[1]
        # The keyless table stayed out, so the application can still update and delete there.
        conn.execute("INSERT INTO keyless VALUES (1)")
        conn.execute("UPDATE keyless SET a = 2")
        conn.execute("DELETE FROM keyless")


def test_a_foreign_publication_is_only_verified(pgdb):
    with _connect(pgdb) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE b (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION theirs FOR TABLE a WITH (publish = 'insert, update')")
        wanted = [TableName("public", "a"), TableName("public", "b")]
        report = publication.sync(conn, "theirs", wanted, owner=OWNER)
        assert not report.managed and not report.ok
        assert publication.members(conn, "theirs") == {TableName("public", "a")}
        text = "\n".join(report.errors)
        assert """ALTER PUBLICATION "theirs" SET (publish = 'insert, update, delete, truncate');""" in text
        assert 'ALTER PUBLICATION "theirs" ADD TABLE ONLY "public"."b";' in text
        # Asked to manage it, lakeslot repairs it; but never drops it.
        report = publication.sync(conn, "theirs", wanted, owner=OWNER, manage=True)
        assert report.ok and report.added == [TableName("public", "b")]
        assert publication.drop(conn, "theirs", owner=OWNER).startswith("kept")


def test_verify_only_never_creates(pgdb):
    with _connect(pgdb) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
        report = publication.sync(conn, "absent", [TableName("public", "a")], owner=OWNER,
                                  manage=False)
        assert not report.ok
        assert 'CREATE PUBLICATION "absent" FOR TABLE ONLY "public"."a";' in report.errors[0]
        assert conn.execute("SELECT count(*) FROM pg_publication WHERE pubname = 'absent'"
                            ).fetchone() == (0,)


def test_drop_is_idempotent_and_owner_scoped(pgdb):
    with _connect(pgdb) as conn:
        create_odd_tables(conn)
        publication.sync(conn, PUB, ODD_TABLES, owner=OWNER)
        assert publication.drop(conn, PUB, owner="other/ingestion").startswith("kept")
        assert publication.drop(conn, PUB, owner=OWNER) == "dropped"
        assert publication.drop(conn, PUB, owner=OWNER) == "absent"


def test_inheritance_parents_and_children_join_each_on_its_own(pgdb):
    """A child sorts before its parent (tables are added in name order): the parent must still
    join, and each table must publish only its own rows (earlier versions added the child with
    its parent's descendants first, then lost the parent to "already member", silently)."""
    with _connect(pgdb) as conn:
        conn.execute("CREATE TABLE b_parent (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE a_child (PRIMARY KEY (id)) INHERITS (b_parent)")
        conn.execute("CREATE TABLE a_grandchild (PRIMARY KEY (id)) INHERITS (a_child)")
        parent, child, grandchild = (TableName("public", n)
                                     for n in ("b_parent", "a_child", "a_grandchild"))

        report = publication.sync(conn, PUB, [child, parent], owner=OWNER)
        assert report.ok and sorted(report.added) == sorted([child, parent])
        assert publication.members(conn, PUB) == {child, parent}  # the grandchild was not asked for

        # Dropping the child leaves its descendants and its parent where they are.
        publication.sync(conn, PUB, [child, grandchild, parent], owner=OWNER)
        report = publication.sync(conn, PUB, [grandchild, parent], owner=OWNER)
        assert report.ok and report.removed == [child]
        assert publication.members(conn, PUB) == {grandchild, parent}

        # A child without a replica identity is never published with its parent: the
        # application's UPDATE and DELETE through the parent (which reach the child) still work.
        conn.execute("CREATE TABLE a_keyless () INHERITS (b_parent)")
        conn.execute("INSERT INTO a_keyless VALUES (1, 'k')")
        publication.sync(conn, PUB, [grandchild, parent], owner=OWNER)
        assert publication.members(conn, PUB) == {grandchild, parent}
        conn.execute("UPDATE b_parent SET v = 'through the parent'")
        conn.execute("DELETE FROM b_parent")

        # A publication left by earlier versions (the child in, the parent not) is repaired.
        conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE ONLY {}").format(
            sql.Identifier(PUB), parent.sql()))
        report = publication.sync(conn, PUB, [grandchild, parent], owner=OWNER)
        assert report.ok and report.added == [parent]
        assert publication.members(conn, PUB) == {grandchild, parent}
