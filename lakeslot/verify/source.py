"""The source side of a check: the rows of a source table as its mirror should hold them.

Invariants:

- Each value is read as PostgreSQL's text form (``<output function>(column)::text``) and
  converted by the column's mapping (:mod:`lakeslot.mirror.typemap`), the path a streamed change takes,
  so the rows compare with the mirror's cast to the same Arrow types. The session must have
  lakeslot's settings (UTC, ISO dates, full float precision: :func:`lakeslot.source.connection.connect`).
- The rows are the table's own (``FROM ONLY``), as its mirror holds them: an inheritance
  parent's children are tables of their own (:mod:`lakeslot.source.publication`,
  "Inheritance"); a partitioned table's rows are those of its partitions.
- Rows are streamed through a server-side cursor, :data:`FETCH_ROWS` at a time, into Arrow (the
  result of one table is held whole).
- Selected keys (:func:`source_rows`) travel as their text forms in one JSON document, turned
  into the key columns' types by the server (``json_populate_recordset`` over the table's row
  type): the same comparison PostgreSQL makes for the key, whatever its type.
- :func:`fingerprint` reads the catalog as the session's snapshot sees it; two fingerprints
  differ after DDL, TRUNCATE or a rewrite of the table or one of its partitions.

Failure modes: a source value that has no mapping raises :class:`lakeslot.mirror.typemap.UnmappableValue`
(the snapshot would have failed that table too); connection errors propagate (``psycopg.Error``).
"""

from __future__ import annotations

import json

import psycopg
import pyarrow as pa
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.mirror import typemap
from lakeslot.verify.inflight import ChangedKey

FETCH_ROWS = 50_000


def expected(conn, table: TableName, columns: tuple[typemap.ColumnMapping, ...],
             where: sql.Composable | None = None, params: tuple = ()) -> pa.Table:
    """The source rows as the mirror should hold them (text form → the one mapping), all of
    them or those ``where`` selects."""
    select = sql.SQL(", ").join(
        sql.SQL("{}({})::text").format(sql.Identifier(*c.pg.output), sql.Identifier(c.name))
        for c in columns)
    texts: list[list[str | None]] = [[] for _ in columns]
    with conn.cursor(name="lakeslot_verify") as cursor:
        cursor.itersize = FETCH_ROWS
        cursor.execute(sql.SQL("SELECT {} FROM {} {}").format(select, _own_rows(conn, table),
                                                              where or sql.SQL("")), params)
        for row in cursor:
            for i, value in enumerate(row):
                texts[i].append(value)
    return pa.table({c.name: c.from_text(pa.array(values, pa.string()))
                     for c, values in zip(columns, texts, strict=True)})


def _own_rows(conn, table: TableName) -> sql.Composable:
    """``ONLY <table>`` but for a partitioned table, whose rows are in its partitions."""
    kind = conn.execute(
        "SELECT c.relkind::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (table.schema, table.name)).fetchone()
    if kind is not None and kind[0] == "p":
        return table.sql()
    return sql.SQL("ONLY {}").format(table.sql())


def source_rows(conn: psycopg.Connection, table: TableName,
                columns: tuple[typemap.ColumnMapping, ...],
                keys: dict[str, ChangedKey] | None) -> pa.Table:
    """All rows, or those with the given keys (text forms, turned into the key columns' types by
    the server: ``json_populate_recordset`` over the table's row type)."""
    if keys is None:
        return expected(conn, table, columns)
    names = [c.name for c in columns if c.required]
    if not keys:
        return expected(conn, table, columns, sql.SQL("WHERE false"))
    where = sql.SQL("WHERE ({}) IN (SELECT {} FROM json_populate_recordset(NULL::{}, %s::json) AS k)"
                    ).format(sql.SQL(", ").join(sql.Identifier(n) for n in names),
                             sql.SQL(", ").join(sql.Identifier("k", n) for n in names),
                             table.sql())
    document = json.dumps([dict(zip(names, k.texts, strict=True)) for k in keys.values()])
    return expected(conn, table, columns, where, (document,))


_FINGERPRINT = """
WITH RECURSIVE tree(relid) AS (
    SELECT %(oid)s::oid
    UNION ALL
    SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)
SELECT (SELECT array_agg(c.oid::int8 || ':' || c.relfilenode::int8 || ':' || c.relkind::text
                         ORDER BY c.oid)
          FROM tree JOIN pg_class c ON c.oid = tree.relid),
       (SELECT array_agg(a.attname || ':' || a.atttypid::int8 || ':' || a.atttypmod
                         ORDER BY a.attnum)
          FROM pg_attribute a
         WHERE a.attrelid = %(oid)s::oid AND a.attnum > 0 AND NOT a.attisdropped)
"""


def fingerprint(conn: psycopg.Connection, oid: int) -> tuple:
    """The table's definition and storage (partitions, relfilenodes, columns) as the session's
    snapshot sees the catalog: it differs after DDL, TRUNCATE or a rewrite (which would also
    hide rows from an older snapshot: rewrites are not MVCC-safe)."""
    row = conn.execute(_FINGERPRINT, {"oid": oid}).fetchone()
    return tuple(row) if row is not None else ()
