"""Describing a source table for its mirror: its columns mapped to Iceberg/Arrow types and its key.

The snapshot (as of its exported snapshot), the apply job (a mirror created without a snapshot,
and column types pgoutput names only by OID), preflight and ``lakeslot verify`` describe tables
this one way, each table with the options its spec entry gives (:class:`ColumnOptions`), so they
agree on every column.

Invariants: types are read from ``pg_type`` through domains to their base type, keeping the
innermost explicit type modifier; arrays map element-wise with the element type's delimiter;
the key is ``keyColumns`` when configured, else the replica identity (primary key or index);
a ``textColumns`` column maps to ``string`` (its text form) whatever its type. A mirror holds
exactly the columns logical replication sends on this server: generated columns that pgoutput
does not publish (stored ones before PostgreSQL 18, virtual ones always; see
:func:`unpublished_generated_columns`) are left out like excluded
columns, so the snapshot never copies a value the stream would then turn into NULL.

Failure modes: :class:`DescribeError` (no key, a listed column that does not exist, a key column
excluded or a generated column the stream does not carry) and
:class:`lakeslot.mirror.typemap.MappingError` (an unsupported type, or one that cannot be a key) —
definite errors for that table only, with the message to show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from lakeslot.mirror import typemap
from lakeslot.source.connection import one_row
from lakeslot.source.keys import table_key

if TYPE_CHECKING:
    from lakeslot.api.models import TableSpec


class DescribeError(ValueError):
    """The table cannot be mirrored as configured; the message says why."""


@dataclass(frozen=True)
class ColumnOptions:
    """A table's column options, what :func:`describe` takes besides the catalog: its
    ``keyColumns``, ``excludeColumns`` and ``textColumns`` (:meth:`of`, from its entry in
    ``spec.source.tables``; none for a table selected by schema)."""

    key_columns: tuple[str, ...] = ()
    exclude_columns: tuple[str, ...] = ()
    text_columns: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: TableSpec | None) -> ColumnOptions:
        """The options ``spec`` (a table's entry in ``spec.source.tables``, or None) gives."""
        if spec is None:
            return cls()
        return cls(tuple(spec.key_columns), tuple(spec.exclude_columns), tuple(spec.text_columns))


NO_OPTIONS = ColumnOptions()


@dataclass(frozen=True)
class PgTypeRow:
    name: str
    typtype: str
    basetype: int
    typtypmod: int
    elem: int
    category: str
    delimiter: str
    output: tuple[str, str]


class TypeCache:
    """``pg_type`` rows by OID, read once per connection; resolves domains and arrays."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn
        self._types: dict[int, PgTypeRow] = {}

    def get(self, oid: int) -> PgTypeRow:
        if oid not in self._types:
            (name, typtype, basetype, typtypmod, elem, category, delimiter, output_schema,
             output_name) = one_row(self._conn.execute(
                """SELECT CASE WHEN tn.nspname = 'pg_catalog' THEN t.typname
                               ELSE tn.nspname || '.' || t.typname END,
                          t.typtype, t.typbasetype::int8, t.typtypmod, t.typelem::int8,
                          t.typcategory, t.typdelim, pn.nspname, p.proname
                     FROM pg_type t JOIN pg_namespace tn ON tn.oid = t.typnamespace
                     JOIN pg_proc p ON p.oid = t.typoutput
                     JOIN pg_namespace pn ON pn.oid = p.pronamespace
                    WHERE t.oid = %s::oid""", (oid,)))
            self._types[oid] = PgTypeRow(name, typtype, basetype, typtypmod, elem, category, delimiter,
                                         output=(output_schema, output_name))
        return self._types[oid]

    def _resolve(self, oid: int, typmod: int) -> tuple[PgTypeRow, int]:
        """Through domains to the base type, keeping the innermost explicit typmod."""
        t = self.get(oid)
        while t.typtype == "d":
            typmod = typmod if typmod >= 0 else t.typtypmod
            t = self.get(t.basetype)
        return t, typmod

    def pg_type(self, oid: int, typmod: int) -> typemap.PgType:
        output = self.get(oid).output
        base, typmod = self._resolve(oid, typmod)
        if base.category == "A" and base.elem:
            element, typmod = self._resolve(base.elem, typmod)
            return typemap.PgType(element.name, element.typtype, typmod, True, element.delimiter,
                                  output)
        return typemap.PgType(base.name, base.typtype, typmod, output=output)


def describe(conn: psycopg.Connection, oid: int, options: ColumnOptions = NO_OPTIONS, *,
             types: TypeCache | None = None) -> tuple[typemap.ColumnMapping, ...]:
    """The mirror columns of table ``oid``: every column not excluded (by
    ``options.exclude_columns``, or as a generated column the stream does not carry), mapped by
    :mod:`lakeslot.mirror.typemap` (``options.text_columns`` as text), the key flagged
    (``options.key_columns``, else the replica identity)."""
    key_columns, exclude_columns, text_columns = (options.key_columns, options.exclude_columns,
                                                  options.text_columns)
    types = types or TypeCache(conn)
    rows = conn.execute(
        """SELECT attname, atttypid::int8, atttypmod FROM pg_attribute
            WHERE attrelid = %s::oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum""",
        (oid,)).fetchall()
    names = [r[0] for r in rows]
    key = table_key(conn, oid, key_columns)
    if not key:
        raise DescribeError("no key: no primary key or replica identity index, and no key columns "
                            "configured (the mirror needs a key to apply updates and deletes)")
    for what, listed in (("key", key), ("excluded", exclude_columns),
                         ("text", text_columns)):
        missing = [c for c in listed if c not in names]
        if missing:
            raise DescribeError(f"{what} columns {missing} do not exist")
    excluded_keys = [c for c in key if c in exclude_columns]
    if excluded_keys:
        raise DescribeError(f"key columns {excluded_keys} cannot be excluded")
    unpublished = unpublished_generated_columns(conn, oid)
    generated_keys = [c for c in key if c in unpublished]
    if generated_keys:
        raise DescribeError(
            f"key columns {generated_keys} are generated columns, which PostgreSQL "
            f"{conn.info.server_version // 10000} does not send in logical replication; choose "
            "other key columns")
    left_out = set(exclude_columns) | set(unpublished)
    return tuple(
        typemap.map_column(name, types.pg_type(typid, typmod), key=name in key,
                           as_text=name in text_columns)
        for name, typid, typmod in rows if name not in left_out)


PUBLISH_GENERATED_VERSION = 180000  # publish_generated_columns = stored


def generated_columns(conn: psycopg.Connection, oid: int) -> dict[str, str]:
    """The generated columns of table ``oid``: name → ``s`` (stored) or ``v`` (virtual)."""
    return dict(conn.execute(
        "SELECT attname, attgenerated::text FROM pg_catalog.pg_attribute WHERE attrelid = %s::oid"
        " AND attnum > 0 AND NOT attisdropped AND attgenerated <> ''", (oid,)).fetchall())


def publishes_generated(server_version: int, kind: str) -> bool:
    """Whether pgoutput sends a generated column of ``kind`` (``s``/``v``) on that server (with
    ``publish_generated_columns = stored``, which lakeslot's publication sets)."""
    return kind == "s" and server_version >= PUBLISH_GENERATED_VERSION


def unpublished_generated_columns(conn: psycopg.Connection, oid: int) -> dict[str, str]:
    """The generated columns of table ``oid`` that logical replication does not send on this
    server (name → kind): the mirror leaves them out."""
    version = conn.info.server_version
    return {name: kind for name, kind in generated_columns(conn, oid).items()
            if not publishes_generated(version, kind)}
