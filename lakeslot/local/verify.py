"""Is the mirror equal to the source? Row counts and full-content checksums, table by table.

The expected content of a mirror table is the source table's rows, every replicated column,
each value converted by the one type mapping (:mod:`lakeslot.typemap`) from its PostgreSQL text
form — exactly the path a streamed change takes. The source is read in one ``REPEATABLE READ``
transaction (every table as of one moment) in a session with lakeslot's settings (UTC, ISO
dates, full float precision); the mirror is read with pyiceberg (no Spark) and cast to the same
Arrow types. Both sides are sorted by the table's key (every column when it has none) and hashed
row by row (SHA-256 of each row's Python values in order): equal checksums mean equal content,
not merely equal counts; the first differing key is reported when they differ.

Scope: hadoop catalogs (what local mode and the demo use), read from their metadata files. Run it
when the source is quiet (or compare a source frozen at the LSN the mirror reflects): a source
that keeps changing differs from any mirror by definition.

Failure modes: a missing mirror table counts as 0 rows with checksum ``-``; a source value that
has no mapping raises :class:`lakeslot.typemap.UnmappableValue` (the snapshot would have failed
that table too).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
from psycopg import sql

from lakeslot import typemap
from lakeslot.api.models import PostgresIngestion
from lakeslot.mirror import catalogs
from lakeslot.source.columns import DescribeError, describe
from lakeslot.source.connection import ConnectionSettings, application_name, connect
from lakeslot.source.tables import TableName, existing
from lakeslot.workloads import JobInput

FETCH_ROWS = 50_000


@dataclass(frozen=True)
class TableCheck:
    table: TableName
    source_rows: int
    mirror_rows: int
    source_checksum: str
    mirror_checksum: str
    first_difference: str | None = None

    @property
    def equal(self) -> bool:
        return (self.source_rows, self.source_checksum) == (self.mirror_rows, self.mirror_checksum)


def checksum(table: pa.Table, keys: list[str]) -> str:
    """SHA-256 over the rows sorted by ``keys``, each row as the tuple of its Python values."""
    digest = hashlib.sha256()
    ordered = table.sort_by([(k, "ascending") for k in keys]) if table.num_rows else table
    for batch in ordered.to_batches(FETCH_ROWS):
        for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            digest.update(repr(row).encode())
    return digest.hexdigest()[:16]


def _first_difference(source: pa.Table, copy: pa.Table, keys: list[str]) -> str | None:
    def rows(t: pa.Table) -> dict:
        ordered = t.sort_by([(k, "ascending") for k in keys]) if t.num_rows else t
        return {tuple(r[k] for k in keys): r for r in ordered.to_pylist()}

    left, right = rows(source), rows(copy)
    for key in sorted(set(left) | set(right), key=repr):
        if left.get(key) != right.get(key):
            return f"key {key}: source {left.get(key)} ≠ mirror {right.get(key)}"
    return None


def _expected(conn, table: TableName, columns: tuple[typemap.ColumnMapping, ...]) -> pa.Table:
    """The source rows as the mirror should hold them (text form → the one mapping)."""
    select = sql.SQL(", ").join(
        sql.SQL("{}({})::text").format(sql.Identifier(*c.pg.output), sql.Identifier(c.name))
        for c in columns)
    texts: list[list[str | None]] = [[] for _ in columns]
    with conn.cursor(name="lakeslot_verify") as cursor:
        cursor.itersize = FETCH_ROWS
        cursor.execute(sql.SQL("SELECT {} FROM {}").format(select, table.sql()))
        for row in cursor:
            for i, value in enumerate(row):
                texts[i].append(value)
    return pa.table({c.name: c.from_text(pa.array(values, pa.string()))
                     for c, values in zip(columns, texts, strict=True)})


def _mirror(job: JobInput, table: TableName, columns: tuple[typemap.ColumnMapping, ...],
            secrets: Mapping[str, str] | None) -> pa.Table | None:
    loaded = catalogs.load_table(job.ingestion.spec.sink.catalog,
                                 job.names.mirror_identifier(table), secrets)
    if loaded is None or loaded.current_snapshot() is None:
        return None
    data = loaded.scan(selected_fields=tuple(c.name for c in columns)).to_arrow()
    return pa.table({c.name: data[c.name].cast(c.arrow) for c in columns})


def compare(ingestion: PostgresIngestion, settings: ConnectionSettings,
            tables: list[TableName], *,
            secrets: Mapping[str, str] | None = None) -> list[TableCheck]:
    """Check each of ``tables``; ``secrets``: the catalog's Secret-backed properties."""
    if ingestion.spec.sink.catalog.type != "hadoop":
        raise ValueError("verify reads hadoop catalogs only (sink.catalog.type: hadoop)")
    job = JobInput(ingestion, tuple(tables))
    checks = []
    owner = job.names.owner
    with connect(settings, application_name("verify", owner), long_running=True,
                 autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        oids = existing(conn, tables)
        for table in tables:
            options, oid = job.table_spec(table), oids.get(table)
            if oid is None:
                raise ValueError(f"table {table} does not exist (dropped, renamed, or not a table)")
            try:
                columns = describe(conn, oid,
                                   key_columns=options.key_columns if options else (),
                                   exclude_columns=options.exclude_columns if options else ())
            except (typemap.MappingError, DescribeError) as e:
                raise ValueError(f"table {table}: {e}") from None
            keys = [c.name for c in columns if c.required] or [c.name for c in columns]
            source = _expected(conn, table, columns)
            copy = _mirror(job, table, columns, secrets)
            source_sum = checksum(source, keys)
            if copy is None:
                checks.append(TableCheck(table, source.num_rows, 0, source_sum, "-",
                                         "the mirror table has no snapshot"))
                continue
            mirror_sum = checksum(copy, keys)
            difference = None if (source.num_rows, source_sum) == (copy.num_rows, mirror_sum) \
                else _first_difference(source, copy, keys)
            checks.append(TableCheck(table, source.num_rows, copy.num_rows, source_sum,
                                     mirror_sum, difference))
        conn.rollback()
    return checks


def render(checks: list[TableCheck]) -> list[str]:
    rows = [("table", "source rows", "iceberg rows", "source checksum", "iceberg checksum", "")]
    rows += [(str(c.table), f"{c.source_rows:,}", f"{c.mirror_rows:,}", c.source_checksum,
              c.mirror_checksum, "equal" if c.equal else "DIFFERENT") for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines += [f"  {c.table}: {c.first_difference}" for c in checks if c.first_difference]
    return lines
