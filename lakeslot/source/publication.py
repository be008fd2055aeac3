"""The publication: make it publish exactly the ingestion's tables, or verify one we do not own.

Ownership: a publication lakeslot creates carries the comment ``managed by lakeslot: <owner>``
(``owner`` = the ingestion's identity). Who manages it is decided explicitly, never guessed from
an error (:func:`plan`, ``spec.source.publicationManagement``): ``Lakeslot`` — lakeslot creates
and changes it; ``External`` — a DBA or the tables' owner created it, and lakeslot only verifies
it (no CREATE on the database, no ownership of the tables needed); ``Auto`` — ``Lakeslot`` when the
publication does not exist yet or carries our comment, else ``External``. Only a publication we
own (our comment), and not declared ``External``, is ever dropped.

Verifying an external publication (:func:`_verify`) reports every difference with the SQL that
fixes it: a publication that does not exist or does not publish insert, update, delete and
truncate fails the whole ingestion (``errors``: a TRUNCATE it does not send would leave rows in the
mirror that the source no longer holds); a selected table it does not publish (by table, ``FOR
TABLES IN SCHEMA`` or ``FOR ALL TABLES``: ``pg_publication_tables`` resolves all three), whose column
list leaves out a column the mirror holds (the key and every column not excluded), or that is
partitioned while ``publish_via_partition_root`` is off fails that table alone (``failed``, each
message carrying :data:`NOT_MANAGED`); the others stream. Once the DBA fixes it, the table is
copied from a snapshot taken after that (:mod:`lakeslot.control.steps`).

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
  publication we do not own that does not send a table's stored generated column (neither that
  option nor a column list naming it) fails that table with the ``ALTER PUBLICATION`` to run
  (otherwise the snapshot would copy values the stream then leaves out).
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import psycopg
from psycopg import errors, sql

from lakeslot.api.naming import TableName, quote_ident
from lakeslot.mirror.typemap import MappingError
from lakeslot.source.columns import (
    NO_OPTIONS,
    PUBLISH_GENERATED_VERSION,
    ColumnOptions,
    DescribeError,
    describe,
    generated_columns,
)
from lakeslot.source.connection import render_sql
from lakeslot.source.keys import replica_identity_key
from lakeslot.source.tables import existing

MARKER = "managed by lakeslot: "
PUBLISH = ("insert", "update", "delete", "truncate")
NOT_MANAGED = "(not managed by lakeslot)"  # in every message about a publication lakeslot verifies
Management = Literal["Auto", "Lakeslot", "External"]
COLUMN_LISTS_VERSION = 150000  # publication column lists, pg_publication_tables.attnames


@dataclass
class SyncReport:
    """``errors``: what stops every table; ``failed``: what stops one table (an external
    publication that does not publish it as its mirror needs), with the fix."""

    name: str
    managed: bool
    created: bool = False
    added: list[TableName] = field(default_factory=list)
    removed: list[TableName] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed: dict[TableName, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class _Publication:
    comment: str | None
    all_tables: bool
    publishes: tuple[str, ...]
    generated: str | None = None  # pubgencols (PostgreSQL ≥ 18): 's' stored, 'n' none
    via_root: bool = True


def _lookup(conn: psycopg.Connection, name: str) -> _Publication | None:
    generated = sql.SQL("pubgencols::text" if _generated_option(conn) else "NULL::text")
    row = conn.execute(sql.SQL(
        """SELECT obj_description(oid, 'pg_publication'), puballtables, {}, pubviaroot,
                  pubinsert, pubupdate, pubdelete, pubtruncate
             FROM pg_publication WHERE pubname = %s""").format(generated), (name,)).fetchone()
    if row is None:
        return None
    publishes = tuple(op for op, on in zip(PUBLISH, row[4:], strict=True) if on)
    return _Publication(row[0], row[1], publishes, row[2], row[3])


@dataclass(frozen=True)
class Plan:
    """Whether lakeslot manages the publication (``managed``) and whether it exists now."""

    managed: bool
    exists: bool

    @property
    def managed_by(self) -> Literal["Lakeslot", "External"]:
        return "Lakeslot" if self.managed else "External"


def plan(conn: psycopg.Connection, name: str, *, owner: str, setting: Management) -> Plan:
    """Who manages publication ``name`` under ``setting`` (module docstring)."""
    publication = _lookup(conn, name)
    exists = publication is not None
    if setting == "Auto":
        return Plan(publication is None or publication.comment == MARKER + owner, exists)
    return Plan(setting == "Lakeslot", exists)


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
         manage: bool | None = None,
         options: Mapping[TableName, ColumnOptions] | None = None) -> SyncReport:
    """Make publication ``name`` match ``tables``, or verify it.

    ``manage``: None = change it only if lakeslot (``owner``) created it, True = always manage,
    False = only verify (and never create; reads only). ``options``: the tables' column options,
    for the column lists of a verified publication (none: a table's defaults)."""
    publication = _lookup(conn, name)
    if publication is None:
        if manage is False:
            return SyncReport(name, managed=False, errors=[
                f"publication {quote_ident(name)} does not exist and lakeslot does not manage it "
                "(publicationManagement: External): a DBA or the tables' owner creates it: "
                + _create_statement(conn, name, tables, options or {})])
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
        _verify(conn, name, publication, tables, report, options or {})
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
            tables: Sequence[TableName], report: SyncReport,
            options: Mapping[TableName, ColumnOptions]) -> None:
    ident = sql.Identifier(name)
    if publication.publishes != PUBLISH:
        report.errors.append(
            f"publication {quote_ident(name)} {NOT_MANAGED} publishes only "
            f"{', '.join(publication.publishes) or 'nothing'}; lakeslot needs insert, update, "
            "delete and truncate (a TRUNCATE it does not send would leave the mirrors holding rows "
            "the source no longer has): "
            + render_sql(conn, "ALTER PUBLICATION {} SET (publish = {});", ident,
                         sql.Literal(", ".join(PUBLISH))))
    oids = existing(conn, tables)
    published = _published_columns(conn, name)
    shapes = _shapes(conn, list(oids.values()))
    for table in tables:
        oid = oids.get(table)
        if oid is None or oid not in shapes:
            continue  # preflight reports it
        own = options.get(table, NO_OPTIONS)
        partitioned, columns = shapes[oid]
        if partitioned and not publication.via_root:
            report.failed[table] = (
                f"partitioned, and publication {quote_ident(name)} {NOT_MANAGED} publishes its "
                "partitions' changes under each partition instead of this table (its mirror): "
                + render_sql(conn, "ALTER PUBLICATION {} SET (publish_via_partition_root = true);",
                             ident))
        elif table not in published:
            report.failed[table] = (
                f"not in publication {quote_ident(name)} {NOT_MANAGED}, so none of its changes "
                "are sent: " + render_sql(conn, "ALTER PUBLICATION {} ADD TABLE {};", ident,
                                          _with_columns(conn, table, oid, own)))
        elif (sent := published[table]) is not None and not columns <= sent:
            # a column list: the mirror's columns must be in it (those it sends, every column,
            # need no look at the mirror's)
            missing = _unpublished_columns(conn, oid, own, sent)
            stored = {c for c, kind in generated_columns(conn, oid).items() if kind == "s"}
            if missing and set(missing) <= stored:
                report.failed[table] = (
                    f"publication {quote_ident(name)} {NOT_MANAGED} does not publish its stored "
                    f"generated columns {missing}, which the mirror holds: "
                    + render_sql(conn, "ALTER PUBLICATION {} SET (publish_generated_columns = "
                                 "stored);", ident) + " — or list them in excludeColumns")
            elif missing:
                report.failed[table] = (
                    f"publication {quote_ident(name)} {NOT_MANAGED} leaves out its columns "
                    f"{missing}, which the mirror holds: "
                    + render_sql(conn, "BEGIN; ALTER PUBLICATION {i} DROP TABLE ONLY {t}; "
                                 "ALTER PUBLICATION {i} ADD TABLE {c}; COMMIT;", i=ident,
                                 t=table.sql(), c=_with_columns(conn, table, oid, own))
                    + " — or list them in excludeColumns")


def _published_columns(conn: psycopg.Connection, name: str) -> dict[TableName, set[str] | None]:
    """The tables publication ``name`` publishes (by table, schema or all tables), each with the
    columns it sends (None before PostgreSQL 15: no column lists, every column)."""
    columns = "attnames" if conn.info.server_version >= COLUMN_LISTS_VERSION else "NULL::name[]"
    return {TableName(s, t): None if a is None else set(a) for s, t, a in conn.execute(
        sql.SQL("SELECT schemaname, tablename, {} FROM pg_publication_tables WHERE pubname = %s"
                ).format(sql.SQL(columns)), (name,))}


def _mirrored(conn: psycopg.Connection, oid: int, options: ColumnOptions) -> list[str] | None:
    """The columns the mirror of table ``oid`` holds; None when it cannot be described (preflight
    reports why)."""
    try:
        return [c.name for c in describe(conn, oid, options)]
    except (DescribeError, MappingError):
        return None


def _unpublished_columns(conn: psycopg.Connection, oid: int, options: ColumnOptions,
                         sent: set[str]) -> list[str]:
    """The mirror's columns the publication does not send (``attnames`` has a stored generated
    column on PostgreSQL 18 when the column list names it or the publication sets
    ``publish_generated_columns = stored``)."""
    mirrored = _mirrored(conn, oid, options)
    if mirrored is None:
        return []
    return [c for c in mirrored if c not in sent]


def _with_columns(conn: psycopg.Connection, table: TableName, oid: int,
                  options: ColumnOptions) -> sql.Composed:
    """``ONLY t``, with the mirror's columns as its column list when some are excluded (what a
    least-privilege publication sends: nothing the mirror does not hold)."""
    only = sql.SQL("ONLY {}").format(table.sql())
    mirrored = _mirrored(conn, oid, options)
    if (not options.exclude_columns or mirrored is None
            or conn.info.server_version < COLUMN_LISTS_VERSION):
        return only
    return sql.SQL("{} ({})").format(only, sql.SQL(", ").join(map(sql.Identifier, mirrored)))


def _create_statement(conn: psycopg.Connection, name: str, tables: Sequence[TableName],
                      options: Mapping[TableName, ColumnOptions]) -> str:
    """What a DBA runs to create the publication lakeslot verifies."""
    oids = existing(conn, tables)
    members = sql.SQL(", ").join(
        _with_columns(conn, t, oids[t], options.get(t, NO_OPTIONS)) if t in oids
        else sql.SQL("ONLY {}").format(t.sql()) for t in tables)
    settings = "publish_via_partition_root = true"
    if _generated_option(conn):
        settings += ", publish_generated_columns = stored"
    return render_sql(conn, "CREATE PUBLICATION {} FOR TABLE {} WITH ({});", sql.Identifier(name),
                      members, sql.SQL(settings))


def _shapes(conn: psycopg.Connection, oids: list[int]) -> dict[int, tuple[bool, set[str]]]:
    """Each table's (partitioned, its columns), in one query for every table verified (a query
    or more per table was 2.3 s on every reconcile of 1,000 tables)."""
    return {oid: (partitioned, set(names)) for oid, partitioned, names in conn.execute(
        """SELECT c.oid::int8, c.relkind = 'p', array_agg(a.attname::text)
             FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
                                           AND NOT a.attisdropped
            WHERE c.oid = ANY(%s::oid[]) GROUP BY c.oid, c.relkind""", (oids,))}


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


def drop(conn: psycopg.Connection, name: str, *, owner: str,
         setting: Management = "Auto") -> str:
    """Drop the publication if lakeslot (``owner``) created it and ``setting``
    (``publicationManagement``) is not ``External``. Returns what happened."""
    publication = _lookup(conn, name)
    if publication is None:
        return "absent"
    if setting == "External":
        return "kept (publicationManagement: External)"
    if publication.comment != MARKER + owner:
        return "kept (not created by this ingestion)"
    conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
    return "dropped"
