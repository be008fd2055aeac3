"""Source tables: their names, and what the catalog says about them.

A :class:`TableName` is a pair of raw identifiers (no quoting inside): ``schema`` and ``name``
may hold quotes, spaces, upper case, unicode or reserved words. Rendering for SQL goes through
``psycopg.sql.Identifier`` only; rendering for humans (messages, status) quotes like PostgreSQL's
``quote_ident`` so that the text can be pasted into ``psql``.

Catalog lookups compare names with ``=`` on ``pg_namespace.nspname`` / ``pg_class.relname``,
never by parsing a qualified string, so no name can be misread.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

import psycopg
from psycopg import sql

from lakeslot.api.models import SourceSpec

_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]*")


def quote_ident(name: str) -> str:
    """Quote for humans like PostgreSQL's ``quote_ident``: plain lower-case names that are not
    reserved stay bare, everything else is double-quoted with inner quotes doubled. (SQL we run
    never uses this: it uses ``psycopg.sql.Identifier``.)"""
    if _PLAIN_IDENTIFIER.fullmatch(name) and name not in _RESERVED:
        return name
    return '"' + name.replace('"', '""') + '"'


# PostgreSQL's reserved and type/function-name keywords: plain-looking, yet quoted by quote_ident.
_RESERVED = frozenset(
    "all analyse analyze and any array as asc asymmetric authorization binary both case cast "  # noqa: SIM905 - words read best as words
    "check collate collation column concurrently constraint create cross current_catalog "
    "current_date current_role current_schema current_time current_timestamp current_user "
    "default deferrable desc distinct do else end except false fetch for foreign freeze from "
    "full grant group having ilike in initially inner intersect into is isnull join lateral "
    "leading left like limit localtime localtimestamp natural not notnull null offset on only or "
    "order outer overlaps placing primary references returning right select session_user "
    "similar some symmetric system_user table tablesample then to trailing true union unique "
    "user using variadic verbose when where window with".split())


class TableName(NamedTuple):
    schema: str
    name: str

    def sql(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    def __str__(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"


def existing(conn: psycopg.Connection, tables: Iterable[TableName]) -> dict[TableName, int]:
    """The oid of each table that exists as an ordinary or partitioned table."""
    wanted = list(tables)
    if not wanted:
        return {}
    rows = conn.execute(
        """SELECT n.nspname, c.relname, c.oid::int8
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN unnest(%s::text[], %s::text[]) AS w(s, t) ON w.s = n.nspname AND w.t = c.relname
            WHERE c.relkind IN ('r', 'p')""",
        ([t.schema for t in wanted], [t.name for t in wanted]),
    ).fetchall()
    return {TableName(s, t): oid for s, t, oid in rows}


def in_schemas(conn: psycopg.Connection, schemas: Iterable[str]) -> list[TableName]:
    """Every ordinary or partitioned table of the given schemas (not partitions themselves:
    their changes are published through the partitioned parent). An inheritance child
    (``INHERITS``) is a table of its own here, as its parent is: each is mirrored with the rows
    it stores itself (:mod:`lakeslot.source.publication`, "Inheritance")."""
    rows = conn.execute(
        """SELECT n.nspname, c.relname
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') AND NOT c.relispartition
            ORDER BY 1, 2""",
        (list(schemas),),
    ).fetchall()
    return [TableName(s, t) for s, t in rows]


def selected(conn: psycopg.Connection, source: SourceSpec) -> list[TableName]:
    """The tables ``spec.source`` selects right now: the explicit ones (whether or not they
    exist: preflight reports missing ones) and every table currently in ``schemas``. Resolved
    on every reconcile, so tables created later in a selected schema are picked up."""
    explicit = [TableName(t.schema_name, t.name) for t in source.tables]
    found = in_schemas(conn, source.schemas) if source.schemas else []
    return sorted(set(explicit) | set(found))
