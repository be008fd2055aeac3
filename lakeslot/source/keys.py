"""A table's key: which columns it is (:func:`table_key`, the one rule), and configured key
columns checked on the data — they must identify every row of the snapshot.

The mirror keys its rows by ``keyColumns`` (Iceberg identifier fields, the MERGE condition of the
apply job). If two source rows share a key value, or a key column holds NULL, the mirror collapses
rows or updates the wrong one — silently. So a table with configured key columns is checked when
it is snapshotted (and re-snapshotted), in the transaction that imported the exported snapshot,
i.e. on exactly the rows being copied; and while streaming, the apply job checks every insert
(and key change) of such a table against the batch and the mirror (:func:`duplicate_error`).
Whether a table is such a table is decided once, by :func:`must_check`.

Invariants:

- No check is run when the database already guarantees it: a valid unique index, neither partial
  nor on expressions, whose key columns are all among ``keyColumns``, with every ``keyColumns``
  column NOT NULL (a validated constraint: PostgreSQL 18's ``NOT NULL … NOT VALID`` does not
  count). Tables keyed by their replica identity (primary key or identity index) are never
  checked: PostgreSQL guarantees those.
- Otherwise one query finds a counterexample or proves there is none::

      SELECT k, n, count(*) FROM (SELECT ROW(<key>)::text AS k, <any key column IS NULL> AS n
                                    FROM <table>) s
       GROUP BY k, n HAVING count(*) > 1 OR n LIMIT 1

  grouping by the key's text form (every type has one, so types without an equality operator
  such as ``json`` work too; distinct values have distinct text forms, which is also how the
  mirror tells them apart). It reads the whole table once, inside PostgreSQL (rows never leave
  the server). Identifiers are quoted with ``psycopg.sql``.

Failure modes: :class:`KeyColumnsError` — a duplicate key (naming the key value and how many rows share
it) or a NULL in a key column (naming the row's key) — is a definite error of that table with the
fix: choose columns that are unique and never NULL, or add a primary key or unique index (on NOT
NULL columns) and use it as the replica identity. Errors of the query itself propagate
(:class:`psycopg.Error`).
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from lakeslot.api.naming import TableName, quote_ident
from lakeslot.source.connection import one_row, render_sql

MAX_SHOWN = 200  # characters of a key value quoted in a message


def replica_identity_key(conn: psycopg.Connection, oid: int) -> tuple[str, list[str]]:
    """``(relreplident, key columns)`` where the key comes from the primary key (DEFAULT or
    FULL) or from the replica identity index (USING INDEX); empty when there is none."""
    return replica_identity_keys(conn, [oid])[oid]


def replica_identity_keys(conn: psycopg.Connection, oids: Sequence[int]) -> dict[int, tuple[str, list[str]]]:
    """:func:`replica_identity_key` of many tables in one query (a table that does not exist is
    left out)."""
    found: dict[int, tuple[str, list[str]]] = {}
    for oid, identity, name in conn.execute(
            """SELECT c.oid::int8, c.relreplident::text, a.attname
                 FROM pg_class c
                 LEFT JOIN pg_index i ON i.indrelid = c.oid AND CASE WHEN c.relreplident = 'i'
                                         THEN i.indisreplident ELSE i.indisprimary END
                 LEFT JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true
                 LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                WHERE c.oid = ANY(%s::oid[]) ORDER BY c.oid, k.n""", (list(oids),)):
        key = found.setdefault(oid, (identity, []))[1]
        if name is not None:
            key.append(name)
    return found


def table_key(conn: psycopg.Connection, oid: int, key_columns: Sequence[str]) -> list[str]:
    """The key of table ``oid`` (:func:`key_of`; its replica identity's key read only when no
    ``keyColumns`` are configured)."""
    return key_of(key_columns, [] if key_columns else replica_identity_key(conn, oid)[1])


def key_of(key_columns: Sequence[str], identity_key: Sequence[str]) -> list[str]:
    """The one rule for a table's key: the configured ``keyColumns`` when there are any, else
    its replica identity's key (:func:`replica_identity_key`; empty when none)."""
    return list(key_columns or identity_key)


class KeyColumnsError(ValueError):
    """The configured key columns do not identify the rows; the message says which and what to do."""


def guaranteed(conn: psycopg.Connection, oid: int, key: Sequence[str]) -> bool:
    """Whether PostgreSQL guarantees that ``key`` is unique and never NULL in table ``oid``."""
    return bool(one_row(conn.execute(
        """SELECT NOT EXISTS (
                      SELECT 1 FROM pg_catalog.pg_attribute a
                       WHERE a.attrelid = %(oid)s::oid AND a.attname = ANY(%(key)s::text[])
                         AND (NOT a.attnotnull OR EXISTS (
                              SELECT 1 FROM pg_catalog.pg_constraint c
                               WHERE c.conrelid = a.attrelid AND c.contype = 'n'
                                 AND NOT c.convalidated AND a.attnum = ANY(c.conkey))))
                  AND EXISTS (
                      SELECT 1 FROM pg_catalog.pg_index i
                       WHERE i.indrelid = %(oid)s::oid AND i.indisunique AND i.indisvalid
                         AND i.indpred IS NULL AND i.indexprs IS NULL
                         AND (SELECT array_agg(a.attname::text)
                                FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
                                JOIN pg_catalog.pg_attribute a
                                  ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                               WHERE k.n <= i.indnkeyatts) <@ %(key)s::text[])""",
        {"oid": oid, "key": list(key)}))[0])


def must_check(conn: psycopg.Connection, oid: int, key_columns: Sequence[str],
               key: Sequence[str] | None = None) -> bool:
    """Whether the data must show that the key identifies the rows of table ``oid`` — the one
    rule for the snapshot (:func:`check`) and the stream (the apply job checks every insert,
    :func:`duplicate_error`): key columns are configured (``key_columns``) and PostgreSQL does not
    guarantee them (:func:`guaranteed`; ``key``: the key as the mirror has it, by default
    ``key_columns``). No query when none are configured."""
    return bool(key_columns) and not guaranteed(conn, oid, key_columns if key is None else key)


def check(conn: psycopg.Connection, table: TableName, oid: int, key: Sequence[str]) -> None:
    """Raise :class:`KeyColumnsError` when the configured key columns ``key`` do not identify
    every row of ``table`` (``conn`` inside the snapshot's transaction); nothing when none are
    configured or PostgreSQL already guarantees it (:func:`must_check`)."""
    if not must_check(conn, oid, key):
        return
    columns = [sql.Identifier(c) for c in key]
    kind = one_row(conn.execute("SELECT relkind::text FROM pg_catalog.pg_class WHERE oid = %s::oid",
                                (oid,)))[0]
    source = table.sql() if kind == "p" else sql.SQL("ONLY {}").format(table.sql())
    row = conn.execute(sql.SQL(
        "SELECT k, n, count(*) FROM (SELECT ROW({columns})::text AS k, {nulls} AS n FROM {source}) s"
        " GROUP BY k, n HAVING count(*) > 1 OR n LIMIT 1").format(
            columns=sql.SQL(", ").join(columns),
            nulls=sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(c) for c in columns),
            source=source)).fetchone()
    if row is None:
        return
    value, has_null, count = row
    shown = value if len(value) <= MAX_SHOWN else value[:MAX_SHOWN] + "…"
    names = ", ".join(quote_ident(c) for c in key)
    if has_null:
        what = (f"a row has a NULL in key columns ({names}) = {shown}, and a NULL cannot "
                "identify a row (updates and deletes could not find it in the mirror)")
    else:
        what = (f"keyColumns ({names}) are not unique: {count} rows have ({names}) = {shown}, "
                "and the mirror would collapse them into one or update the wrong one")
    raise KeyColumnsError(f"{what}; fix: {_fix(conn, table)}")


def _fix(conn: psycopg.Connection, table: TableName) -> str:
    return ("choose keyColumns that are unique and never NULL, or give the table a primary key ("
            + render_sql(conn, "ALTER TABLE {} ADD PRIMARY KEY (…);", table.sql())
            + ") or a unique index on NOT NULL columns as its replica identity ("
            + render_sql(conn, "ALTER TABLE {} REPLICA IDENTITY USING INDEX <index>;", table.sql())
            + ") and remove keyColumns; then snapshot the table again")


def duplicate_error(conn: psycopg.Connection, table: TableName, key: Sequence[str],
                    value: Sequence[object], where: str) -> str:
    """The message for a row inserted while streaming whose key another row already has."""
    names = ", ".join(quote_ident(c) for c in key)
    shown = repr(tuple(value))
    shown = shown if len(shown) <= MAX_SHOWN else shown[:MAX_SHOWN] + "…"
    return (f"keyColumns ({names}) are not unique: a row with ({names}) = {shown} was inserted "
            f"{where} while another row has that key, and the mirror would collapse them into "
            f"one; fix: {_fix(conn, table)}")
