"""Source tables: which tables a selection covers, and what PostgreSQL's catalog says about them
(names are :class:`lakeslot.api.naming.TableName`).

Catalog lookups compare names with ``=`` on ``pg_namespace.nspname`` / ``pg_class.relname``,
never by parsing a qualified string, so no name can be misread.
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from lakeslot.api.models import SourceSpec
from lakeslot.api.naming import TableName


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
