"""The quiet-source check (:func:`compare`, used by the demo and tests after a run has caught up
and stopped): one ``REPEATABLE READ`` transaction and the mirror's current state, compared by
row counts and full-content checksums (SHA-256 of each row's Python values in key order); the
first differing key is reported.

Invariants: both sides are read as the exact check reads them (:mod:`.source`, :mod:`.mirror`),
every table of the list in the same source transaction; the key is the table's key columns, or
every column when it has none.

Limits: only meaningful when the source no longer changes (a change between the transaction and
the mirror's read is a false difference); each whole table is held in memory, one at a time.
The mirror is read through :func:`lakeslot.mirror.catalogs.load_table`, so any catalog type.

Failure modes: a missing mirror table counts as 0 rows; a table that does
not exist or cannot be mirrored as configured raise ``ValueError``; a source value that has no
mapping raises :class:`lakeslot.mirror.typemap.UnmappableValue`; connection, catalog and storage errors
propagate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.mirror import typemap
from lakeslot.source.columns import ColumnOptions, DescribeError, describe
from lakeslot.source.connection import ConnectionSettings, application_name, connect
from lakeslot.source.tables import existing
from lakeslot.verify.mirror import current_rows
from lakeslot.verify.source import FETCH_ROWS, expected
from lakeslot.workloads import JobInput


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


def compare(ingestion: PostgresIngestion, settings: ConnectionSettings,
            tables: list[TableName], *,
            secrets: Mapping[str, str] | None = None) -> list[TableCheck]:
    """Check each of ``tables`` on a quiet source; ``secrets``: the catalog's Secret-backed
    properties."""
    job = JobInput(ingestion, tuple(tables))
    checks = []
    owner = job.names.owner
    with connect(settings, application_name("verify", owner), long_running=True,
                 autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        oids = existing(conn, tables)
        for table in tables:
            oid = oids.get(table)
            if oid is None:
                raise ValueError(f"table {table} does not exist (dropped, renamed, or not a table)")
            try:
                columns = describe(conn, oid, ColumnOptions.of(job.table_spec(table)))
            except (typemap.MappingError, DescribeError) as e:
                raise ValueError(f"table {table}: {e}") from None
            keys = [c.name for c in columns if c.required] or [c.name for c in columns]
            source = expected(conn, table, columns)
            copy = current_rows(job, table, columns, secrets)
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
