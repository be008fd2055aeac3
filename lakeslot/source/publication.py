"""The publication: make it publish exactly the ingestion's tables, or verify one we do not own.

Ownership: a publication lakeslot creates carries the comment ``managed by lakeslot: <owner>``
(``owner`` = the ingestion's identity). lakeslot changes a publication only when it carries
that comment or the spec explicitly asks to manage it; anything else is verified and every
difference reported with the SQL that would fix it. Only a publication we own is ever dropped.

Invariants:

- Sync is a computed diff applied change by change; one failing change (a missing table, a
  missing privilege) does not stop the others, and all errors come back together.
- Sync is idempotent and safe under concurrent callers: creation and its ownership comment are
  one transaction, and "already exists"/"already member"/"not a member" races are absorbed.
- A table without a usable replica identity is never added: in a publication that publishes
  updates and deletes it would make the application's own UPDATE and DELETE fail (FACTS.md).
- Managed publications publish insert, update, delete and truncate, and publish changes of
  partitions through their partitioned root (``publish_via_partition_root``), so a partitioned
  table is one mirror table.
- On PostgreSQL ≥ 18 a managed publication sets ``publish_generated_columns = stored`` (on
  creation, and on sync when an existing one of ours lacks it), so stored generated columns stream
  like any other column; :func:`lakeslot.source.columns.describe` mirrors them only there. A
  publication we do not own that lacks it while a table has a stored generated column is
  reported with the ``ALTER PUBLICATION`` to run (otherwise the snapshot would copy values the
  stream then leaves out).
- Every table is added and dropped with ``ONLY``: a table's mirror holds the rows stored in that
  table itself, never its inheritance children's (see "Inheritance" below). The SQL suggested for
  a publication we do not own says ``ONLY`` too.

Inheritance (``INHERITS``, not partitioning). PostgreSQL publishes each row change under the
relation that stores the row: an ``UPDATE parent`` that reaches a child's rows arrives as changes
of the child, whichever table the statement named (``publish_via_partition_root`` applies to
partitions only). lakeslot mirrors that: the parent's mirror holds the parent's own rows (``SELECT
… FROM ONLY parent``, which is also what its snapshot copies), each child's mirror its own, and a
child that is not selected is not published at all. Without ``ONLY``, ``ALTER PUBLICATION … ADD
TABLE parent`` also adds every child, and fails as a whole with "relation child is already member"
when a child was added first (tables are added in name order) — which earlier versions absorbed as
a concurrent caller's duplicate, so the parent silently never joined the publication and its own
rows' changes never reached its mirror. A publication left that way is repaired by the next sync:
the parent joins (``ONLY``) and, as any table that joins, is copied again
(:mod:`lakeslot.control.steps`). Partitioned tables are unaffected: ``ONLY`` on a partitioned table
still publishes its partitions through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import errors, sql

from lakeslot.api.naming import TableName, quote_ident
from lakeslot.source.columns import PUBLISH_GENERATED_VERSION, generated_columns
from lakeslot.source.connection import render_sql
from lakeslot.source.keys import replica_identity_key
from lakeslot.source.tables import existing

MARKER = "managed by lakeslot: "
PUBLISH = ("insert", "update", "delete", "truncate")


@dataclass
class SyncReport:
    name: str
    managed: bool
    created: bool = False
    added: list[TableName] = field(default_factory=list)
    removed: list[TableName] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class _Publication:
    comment: str | None
    all_tables: bool
    publishes: tuple[str, ...]
    generated: str | None = None  # pubgencols (PostgreSQL ≥ 18): 's' stored, 'n' none


def _lookup(conn: psycopg.Connection, name: str) -> _Publication | None:
    generated = sql.SQL("pubgencols::text" if _generated_option(conn) else "NULL::text")
    row = conn.execute(sql.SQL(
        """SELECT obj_description(oid, 'pg_publication'), puballtables, {},
                  pubinsert, pubupdate, pubdelete, pubtruncate
             FROM pg_publication WHERE pubname = %s""").format(generated), (name,)).fetchone()
    if row is None:
        return None
    publishes = tuple(op for op, on in zip(PUBLISH, row[3:], strict=True) if on)
    return _Publication(row[0], row[1], publishes, row[2])


def _generated_option(conn: psycopg.Connection) -> bool:
    """Whether the server has ``publish_generated_columns`` (PostgreSQL ≥ 18)."""
    return conn.info.server_version >= PUBLISH_GENERATED_VERSION


def _publish_generated(name: str) -> sql.Composed:
    return sql.SQL("ALTER PUBLICATION {} SET (publish_generated_columns = stored)").format(
        sql.Identifier(name))


def members(conn: psycopg.Connection, name: str) -> set[TableName]:
    return {TableName(s, t) for s, t in conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (name,))}


def sync(conn: psycopg.Connection, name: str, tables: Sequence[TableName], *, owner: str,
         manage: bool | None = None) -> SyncReport:
    """Make publication ``name`` match ``tables``.

    ``manage``: None = change it only if lakeslot (``owner``) created it, True = always manage,
    False = only verify (and never create)."""
    publication = _lookup(conn, name)
    if publication is None:
        if manage is False:
            return SyncReport(name, managed=False, errors=[
                f"publication {quote_ident(name)} does not exist and lakeslot is configured "
                "not to manage it: " + render_sql(conn, "CREATE PUBLICATION {} FOR TABLE {};",
                                                sql.Identifier(name), _only_list(tables))])
        report = SyncReport(name, managed=True, created=_create(conn, name, owner))
        publication = _lookup(conn, name)
        if publication is None:  # another session dropped it between our CREATE and this lookup
            report.errors.append(f"publication {quote_ident(name)} was dropped right after it was "
                                 "created: find what drops it")
            return report
    else:
        ours = publication.comment == MARKER + owner
        report = SyncReport(name, managed=bool(manage) or (manage is None and ours))

    if report.managed:
        _manage(conn, name, publication, tables, report)
    else:
        _verify(conn, name, publication, tables, report)
    return report


def _create(conn: psycopg.Connection, name: str, owner: str) -> bool:
    options = sql.SQL("publish = {}").format(sql.Literal(", ".join(PUBLISH)))
    if conn.info.server_version >= 130000:
        options = sql.SQL("{}, publish_via_partition_root = true").format(options)
    if _generated_option(conn):
        options = sql.SQL("{}, publish_generated_columns = stored").format(options)
    try:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE PUBLICATION {} WITH ({})").format(
                sql.Identifier(name), options))
            conn.execute(sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(
                sql.Identifier(name), sql.Literal(MARKER + owner)))
    except errors.DuplicateObject:
        return False  # a concurrent caller created it first
    return True


def _manage(conn: psycopg.Connection, name: str, publication: _Publication,
            tables: Sequence[TableName], report: SyncReport) -> None:
    ident = sql.Identifier(name)
    if publication.all_tables:
        report.errors.append(f"publication {quote_ident(name)} is FOR ALL TABLES: lakeslot cannot "
                             "manage its table list; use a publication of its own")
        return
    if publication.publishes != PUBLISH:
        _attempt(conn, report, sql.SQL("ALTER PUBLICATION {} SET (publish = {})").format(
            ident, sql.Literal(", ".join(PUBLISH))))
    if _generated_option(conn) and publication.generated != "s":
        _attempt(conn, report, _publish_generated(name))
    current = members(conn, name)
    oids = existing(conn, tables)
    for table in tables:
        if table in current:
            continue
        if table not in oids:
            report.errors.append(f"cannot add {table}: the table does not exist")
        elif not _usable_identity(conn, oids[table]):
            report.errors.append(
                f"refusing to add {table}: it has no usable replica identity, and in a "
                "publication its UPDATE and DELETE statements would start failing (see preflight)")
        elif _attempt(conn, report, sql.SQL("ALTER PUBLICATION {} ADD TABLE ONLY {}").format(
                ident, table.sql()), absorb=errors.DuplicateObject):
            report.added.append(table)
    for table in sorted(current - set(tables)):
        if _attempt(conn, report, sql.SQL("ALTER PUBLICATION {} DROP TABLE ONLY {}").format(
                ident, table.sql()), absorb=errors.UndefinedObject):
            report.removed.append(table)


def _verify(conn: psycopg.Connection, name: str, publication: _Publication,
            tables: Sequence[TableName], report: SyncReport) -> None:
    ident = sql.Identifier(name)
    if publication.publishes != PUBLISH:
        report.errors.append(
            f"publication {quote_ident(name)} publishes only {', '.join(publication.publishes)}: "
            + render_sql(conn, "ALTER PUBLICATION {} SET (publish = {});", ident,
                      sql.Literal(", ".join(PUBLISH))))
    if _generated_option(conn) and publication.generated != "s":
        with_generated = [t for t, oid in existing(conn, tables).items()
                          if "s" in generated_columns(conn, oid).values()]
        if with_generated:
            report.errors.append(
                f"publication {quote_ident(name)} (not managed by lakeslot) does not publish "
                f"stored generated columns, which {', '.join(map(str, with_generated))} have: "
                + render_sql(conn, "ALTER PUBLICATION {} SET (publish_generated_columns = "
                             "stored);", ident))
    if publication.all_tables:
        return
    missing = [t for t in tables if t not in members(conn, name)]
    if missing:
        report.errors.append(
            f"publication {quote_ident(name)} (not managed by lakeslot) lacks "
            f"{', '.join(map(str, missing))}: "
            + render_sql(conn, "ALTER PUBLICATION {} ADD TABLE {};", ident, _only_list(missing)))


def _only_list(tables: Sequence[TableName]) -> sql.Composed:
    """``ONLY a, ONLY b``: each table without its inheritance children (module docstring)."""
    return sql.SQL(", ").join(sql.SQL("ONLY {}").format(t.sql()) for t in tables)


def _usable_identity(conn: psycopg.Connection, oid: int) -> bool:
    identity, key = replica_identity_key(conn, oid)
    return identity == "f" or (identity in ("d", "i") and bool(key))


def _attempt(conn: psycopg.Connection, report: SyncReport, statement: sql.Composed, *,
             absorb: type[Exception] | None = None) -> bool:
    """Run one change; a failure is recorded, not raised. ``absorb`` = the error a concurrent
    caller doing the same change would cause (counts as done)."""
    try:
        conn.execute(statement)
    except psycopg.Error as e:
        if absorb is not None and isinstance(e, absorb):
            return False
        report.errors.append(f"{statement.as_string(conn)}: {e.diag.message_primary or e}")
        return False
    return True


def drop(conn: psycopg.Connection, name: str, *, owner: str) -> str:
    """Drop the publication if lakeslot (``owner``) created it. Returns what happened."""
    publication = _lookup(conn, name)
    if publication is None:
        return "absent"
    if publication.comment != MARKER + owner:
        return "kept (not created by this ingestion)"
    conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
    return "dropped"
