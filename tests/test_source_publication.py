"""Publication sync against real PostgreSQL 15 and 18."""

from __future__ import annotations

from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.source import connection, publication
from lakeslot.source.columns import ColumnOptions
from tests.support.fixtures_pg import connection_settings
from tests.support.odd_names import ODD_TABLES, create_odd_tables
from tests.support.queries import counted

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
        assert report.failed[TableName("public", "b")].endswith(
            'ALTER PUBLICATION "theirs" ADD TABLE ONLY "public"."b";')
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
        assert ('CREATE PUBLICATION "absent" FOR TABLE ONLY "public"."a" WITH '
                "(publish_via_partition_root = true") in report.errors[0]
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


def test_an_external_publication_is_verified_table_by_table_and_never_changed(pgdb):
    """A publication the tables' owner created (by table with a column list, by schema, for all
    tables), verified by a role that owns nothing: each selected table it does not publish as its
    mirror needs fails alone with the statement for the DBA; nothing is changed, nothing dropped."""
    a, b, c, p = (TableName("app", n) for n in ("a", "b", "c", "p"))
    with _connect(pgdb) as conn:
        conn.execute("CREATE SCHEMA app; CREATE SCHEMA other")
        conn.execute("CREATE TABLE app.a (id int PRIMARY KEY, name text, pii text)")
        conn.execute("CREATE TABLE app.b (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE app.c (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE app.p (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE app.p1 PARTITION OF app.p FOR VALUES FROM (0) TO (10)")
        conn.execute("CREATE TABLE other.t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION lake_pub FOR TABLE app.a (id, name), app.b, app.p")
        conn.execute("CREATE ROLE lake_r LOGIN REPLICATION")
        try:
            conn.execute("GRANT USAGE ON SCHEMA app TO lake_r")
            conn.execute("GRANT SELECT (id, name) ON app.a TO lake_r")
            conn.execute("GRANT SELECT ON app.b, app.c, app.p TO lake_r")
            conn.execute("SET ROLE lake_r")
            plan = publication.plan(conn, "lake_pub", owner=OWNER, setting="Auto")
            assert (plan.managed, plan.exists, plan.managed_by) == (False, True, "External")
            assert publication.plan(conn, "new_pub", owner=OWNER, setting="Auto").managed
            assert not publication.plan(conn, "new_pub", owner=OWNER, setting="External").managed
            before = _publication_state(conn, "lake_pub")

            options = {a: ColumnOptions(exclude_columns=("pii",))}
            report = publication.sync(conn, "lake_pub", [a, b, c, p], owner=OWNER, manage=False,
                                      options=options)
            assert report.ok and not report.managed, report.errors
            assert set(report.failed) == {c, p}
            assert report.failed[c] == (
                "not in publication lake_pub (not managed by lakeslot), so none of its changes are "
                'sent: ALTER PUBLICATION "lake_pub" ADD TABLE ONLY "app"."c";')
            assert report.failed[p].endswith(
                'ALTER PUBLICATION "lake_pub" SET (publish_via_partition_root = true);')
            # without the exclusion, the column list leaves out a mirrored column
            report = publication.sync(conn, "lake_pub", [a], owner=OWNER, manage=False)
            if conn.info.server_version >= publication.COLUMN_LISTS_VERSION:
                assert report.failed[a] == (
                    "publication lake_pub (not managed by lakeslot) leaves out its columns "
                    "['pii'], which the mirror holds: BEGIN; ALTER PUBLICATION \"lake_pub\" DROP "
                    'TABLE ONLY "app"."a"; ALTER PUBLICATION "lake_pub" ADD TABLE ONLY "app"."a"; '
                    "COMMIT; — or list them in excludeColumns")
            assert _publication_state(conn, "lake_pub") == before
            assert publication.drop(conn, "lake_pub", owner=OWNER) == (
                "kept (not created by this ingestion)")
            conn.execute("RESET ROLE")

            # the DBA's fixes, each from the messages; then every table passes
            conn.execute("ALTER PUBLICATION lake_pub ADD TABLE ONLY app.c")
            conn.execute("ALTER PUBLICATION lake_pub SET (publish_via_partition_root = true)")
            conn.execute("SET ROLE lake_r")
            report = publication.sync(conn, "lake_pub", [a, b, c, p], owner=OWNER, manage=False,
                                      options=options)
            assert (report.ok, report.failed) == (True, {}), report
            conn.execute("RESET ROLE")

            # by schema and for all tables: the same verification
            conn.execute("CREATE PUBLICATION by_schema FOR TABLES IN SCHEMA app"
                         " WITH (publish_via_partition_root = true)")
            conn.execute("CREATE PUBLICATION everything FOR ALL TABLES"
                         " WITH (publish = 'insert, update, delete')")
            conn.execute("SET ROLE lake_r")
            assert publication.sync(conn, "by_schema", [a, b, c, p, TableName("other", "t")],
                                    owner=OWNER, manage=False, options=options).failed.keys() == {
                TableName("other", "t")}
            everything = publication.sync(conn, "everything", [b], owner=OWNER, manage=False)
            assert everything.errors == [
                "publication everything (not managed by lakeslot) publishes only insert, update, "
                "delete; lakeslot needs insert, update, delete and truncate (a TRUNCATE it does "
                "not send would leave the mirrors holding rows the source no longer has): "
                "ALTER PUBLICATION \"everything\" SET (publish = 'insert, update, delete, "
                "truncate');"]
            # declared External, even a publication lakeslot created is never dropped
            conn.execute("RESET ROLE")
            publication.sync(conn, "ours", [b], owner=OWNER)
            assert publication.drop(conn, "ours", owner=OWNER, setting="External") == (
                "kept (publicationManagement: External)")
            assert publication.drop(conn, "ours", owner=OWNER) == "dropped"
        finally:
            conn.execute("RESET ROLE")
            for statement in ("DROP PUBLICATION IF EXISTS lake_pub, by_schema, everything",
                              "DROP OWNED BY lake_r", "DROP ROLE lake_r"):
                conn.execute(statement)


def test_verifying_fifty_tables_costs_the_queries_of_one(pgdb):
    # Every reconcile verifies a publication a DBA manages: a query or more per table was 2.3 s
    # a reconcile of 1,000 tables. A table whose columns the publication sends costs nothing of
    # its own (one with a column list is described, to compare it with the mirror's columns).
    tables = [TableName("fifty", f"t{i}") for i in range(50)]
    with _connect(pgdb) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS fifty")
        for table in tables:
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY, v text)").format(
                table.sql()))
        conn.execute(sql.SQL("CREATE PUBLICATION fifty_pub FOR TABLE {} WITH "
                             "(publish_via_partition_root = true)").format(
            sql.SQL(", ").join(t.sql() for t in tables)))
        queries = counted(conn)
        one = publication.sync(conn, "fifty_pub", tables[:1], owner=OWNER, manage=False)
        for_one = len(queries)
        queries.clear()
        fifty = publication.sync(conn, "fifty_pub", tables, owner=OWNER, manage=False)
    assert one.ok and fifty.ok and not one.managed and not fifty.failed
    assert len(queries) == for_one


def _publication_state(conn, name: str) -> tuple:
    return tuple(conn.execute(
        "SELECT p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, p.pubviaroot,"
        " (SELECT array_agg(to_jsonb(t)::text ORDER BY 1) FROM pg_publication_tables t"
        "   WHERE t.pubname = p.pubname) FROM pg_publication p WHERE p.pubname = %s",
        (name,)).fetchall())
