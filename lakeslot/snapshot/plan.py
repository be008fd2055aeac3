"""What to copy: the tables as the catalog describes them as of the snapshot, split into ctid ranges.

Invariants:

- The catalog is read in a transaction that imported the exported snapshot, so columns, types,
  key, partitions and ``relfilenode`` are those of the snapshot LSN, not of some later moment.
- The ranges of a heap are ``[0, p₁), [p₁, p₂), …, [pₙ, ∞)`` in pages: disjoint, covering every
  page whatever the heap's size when it is read. ``relpages`` (what VACUUM/ANALYZE last saw) only
  decides how many ranges there are; a heap that grew since is still read whole by the last,
  open-ended range.
- Without Tid Range Scans (PostgreSQL < 14) a ctid predicate would scan the whole heap once per
  range: such a heap is one range with no predicate (one reader per heap).
- A partitioned table is read through its leaf partitions (each its own heap and ranges), into one
  mirror table, as logical replication publishes it through the root.
- Configured key columns (``keyColumns``) are checked on the snapshot's rows (:mod:`lakeslot.source.keys`): a
  duplicate key value or a NULL in a key column fails the table before anything is copied.

Failure modes (a :class:`TableFailure`, a definite error for that table only): the table does not
exist (dropped before the snapshot), a listed key/excluded/text column does not exist, a
``partitionBy`` column is missing or of a type its transform cannot take, the table
has no key, a column type is unsupported or cannot be a key (:class:`lakeslot.mirror.typemap.MappingError`),
the configured key columns do not identify the rows (:class:`lakeslot.source.keys.KeyColumnsError`), a leaf
partition is not an ordinary table (a foreign table cannot be read by ctid).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from lakeslot.api import partitioning
from lakeslot.api.naming import TableName
from lakeslot.api.partitioning import PartitionField
from lakeslot.mirror import typemap
from lakeslot.source import columns, keys
from lakeslot.source.connection import one_row
from lakeslot.source.tables import existing

TID_RANGE_SCAN_VERSION = 140000


@dataclass(frozen=True)
class TableRequest:
    """One table to snapshot and where it goes (``target``: the table name in the namespace)."""

    source: TableName
    target: str
    options: columns.ColumnOptions = columns.NO_OPTIONS  # keyColumns, excludeColumns, textColumns
    partition_by: tuple[PartitionField, ...] = ()  # the mirror's partition spec (partitionBy)
    earlier_target: str | None = None  # the mirror's name before ambiguous names were hashed


@dataclass(frozen=True)
class PageRange:
    """Heap pages ``[start, end)``; ``end=None`` is open-ended."""

    start: int
    end: int | None

    def predicate(self) -> sql.Composable | None:
        """The ctid condition selecting this range (None: the whole heap)."""
        parts = []
        if self.start:
            parts.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({self.start},0)")))
        if self.end is not None:
            parts.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({self.end},0)")))
        return sql.SQL(" AND ").join(parts) if parts else None


@dataclass(frozen=True)
class Heap:
    """A relation with storage to read: the table itself or one of its leaf partitions."""

    oid: int
    name: TableName
    pages: int
    filenode: int  # pg_class.relfilenode as of the snapshot


@dataclass(frozen=True)
class TablePlan:
    request: TableRequest
    columns: tuple[typemap.ColumnMapping, ...]
    rows_estimate: int | None
    ranges: tuple[tuple[Heap, PageRange], ...]


@dataclass(frozen=True)
class TableFailure:
    request: TableRequest
    message: str


def page_ranges(pages: int, pages_per_range: int, tid_range_scan: bool = True) -> list[PageRange]:
    """Split ``pages`` (an estimate) into ranges of ``pages_per_range``; the last is open-ended."""
    count = max(1, math.ceil(pages / max(1, pages_per_range))) if tid_range_scan else 1
    return [PageRange(i * pages_per_range, (i + 1) * pages_per_range if i < count - 1 else None)
            for i in range(count)]


def inspect(conn: psycopg.Connection, requests: Sequence[TableRequest], *,
            target_range_bytes: int) -> list[TablePlan | TableFailure]:
    """Plan every request; ``conn`` must be inside a transaction that imported the snapshot."""
    block_size = int(one_row(conn.execute("SELECT current_setting('block_size')"))[0])
    pages_per_range = max(1, target_range_bytes // block_size)
    tid_range_scan = conn.info.server_version >= TID_RANGE_SCAN_VERSION
    oids = existing(conn, [r.source for r in requests])
    types = columns.TypeCache(conn)
    plans: list[TablePlan | TableFailure] = []
    for request in requests:
        oid = oids.get(request.source)
        if oid is None:
            plans.append(TableFailure(request, f"table {request.source} does not exist (dropped, "
                                      "renamed, or not a table) as of the snapshot"))
            continue
        try:
            mapped = columns.describe(conn, oid, request.options, types=types)
            heaps, rows = _heaps(conn, request, oid)
            keys.check(conn, request.source, oid, request.options.key_columns)
            _check_partition_by(request, mapped)
        except (typemap.MappingError, columns.DescribeError, keys.KeyColumnsError) as e:
            plans.append(TableFailure(request, f"table {request.source}: {e}"))
            continue
        ranges = tuple((heap, r) for heap in heaps
                       for r in page_ranges(heap.pages, pages_per_range, tid_range_scan))
        plans.append(TablePlan(request, mapped, rows, ranges))
    return plans


def _check_partition_by(request: TableRequest, mapped: Sequence[typemap.ColumnMapping]) -> None:
    """partitionBy against the columns as of the snapshot (preflight checked them earlier; the
    table may have changed since)."""
    problems = partitioning.type_problems(
        request.partition_by, {c.name: c.iceberg(0) for c in mapped},
        left_out=dict.fromkeys(request.options.exclude_columns, "excluded (excludeColumns)"),
        source_types={c.name: c.pg.name + "[]" * c.pg.array for c in mapped})
    if problems:
        raise columns.DescribeError("; ".join(map(str, problems)))


def _heaps(conn: psycopg.Connection, request: TableRequest, oid: int) -> tuple[list[Heap], int | None]:
    rows = conn.execute(
        """SELECT c.oid::int8, n.nspname, c.relname, c.relkind, c.relpages, c.reltuples,
                  c.relfilenode::int8
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE (c.oid = %(oid)s::oid AND c.relkind <> 'p')
               OR c.oid IN (SELECT relid FROM pg_partition_tree(%(oid)s::oid) WHERE isleaf)
            ORDER BY c.oid""", {"oid": oid}).fetchall()
    heaps = []
    for leaf_oid, schema, name, kind, pages, _tuples, filenode in rows:
        if kind != "r":
            raise columns.DescribeError(f"partition {TableName(schema, name)} is not an ordinary table "
                                        f"(relkind {kind!r}) and cannot be read by ctid; detach it or "
                                        "exclude the table")
        heaps.append(Heap(leaf_oid, TableName(schema, name), max(pages, 0), filenode))
    tuples = [r[5] for r in rows]
    rows_estimate = int(sum(tuples)) if all(t >= 0 for t in tuples) else None
    return heaps, rows_estimate
