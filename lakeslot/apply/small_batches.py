"""A table's small batch applied from the driver: its reduced rows become one Iceberg
``RowDelta`` — the new row versions in one data file, the old versions' positions deleted —
without Spark SQL's MERGE (whose planning and jobs cost ≈ 0.5 s per table whatever the changes:
the fixed cost that made many busy tables fall behind).

A pass collects the reduced rows (``F``) of every table that can take this path in one Spark
job (:func:`collect`); then, per table, :meth:`SmallBatches.apply` parses them with the shared
type mapping (the parser the MERGE path's executors use for types Spark cannot cast exactly),
finds where the changed keys' rows live (:class:`lakeslot.spark.row_delta.Positions`: key
columns cached per immutable file, so a pass reads only files someone else wrote) and commits.

Invariants:

- **Same result as the MERGE** (:func:`lakeslot.apply.merge.merge_sql`): a key's row is
  deleted when the mirror holds it (op D, U, and an I the mirror already holds), and a row with
  every mirror column is added unless the op is D, ``_lakeslot_lsn`` its last change's LSN;
  the commit carries ``lakeslot.lsn`` like the MERGE's, in one atomic commit.
- **Only what the path covers** (:func:`eligible`): at most :data:`SMALL_CHANGES` changes of the
  table, and at most :data:`SMALL_ROWS` reduced rows collected per pass (the driver's memory is
  bounded by them, not by the batch: DESIGN.md "Scale"); no TRUNCATE, no keyColumns check, no
  changelog, an unpartitioned mirror whose columns are all of types the driver writes
  (:func:`lakeslot.spark.row_delta.writes`). Anything else takes the MERGE, as does a table
  whose commit met another writer's (:class:`lakeslot.spark.row_delta.Conflict`), whose
  unchanged TOAST value has no mirror row to come from (the MERGE reports it), or that turns
  out not to fit (:class:`lakeslot.spark.row_delta.Unsupported`): :meth:`SmallBatches.apply`
  returns False and has committed nothing.
- **Unchanged TOAST values** come from the mirror row the change's ``s`` key names, read by
  field ID from its data file at its position in the snapshot the commit validates from — what
  the MERGE's left join reads (:func:`lakeslot.apply.merge.resolved_sql`).

Failure modes: an unmappable value is the table's definite error (:class:`TableError`, as in the
MERGE path); storage and catalog errors propagate (the table's failure, classified by the
caller) and leave the table as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow

from lakeslot.api.naming import TableName
from lakeslot.apply import merge, spread
from lakeslot.mirror.contract import LSN_COLUMN, PARTITION_PROPERTY, TableState
from lakeslot.spark import row_delta

log = logging.getLogger("lakeslot.apply.job")
SMALL_CHANGES = 20_000  # a table's changes in a pass up to which the driver applies them
SMALL_ROWS = 200_000  # reduced rows collected to the driver per pass, at most


def eligible(config: spread.TableConfig, scanned: spread.TableScan, state: TableState,
             mine: spread.TableReduced | None) -> bool:
    """Whether a table's reduction can take the driver's path (see the module docstring)."""
    return mine is not None and mine.problem is None and may_take(config, scanned, state)


def may_take(config: spread.TableConfig, scanned: spread.TableScan, state: TableState) -> bool:
    """Whether a table's batch may take the driver's path, as far as the plan tells (before the
    reduction: :func:`eligible` tells after it)."""
    return (0 < scanned.changes <= SMALL_CHANGES and not scanned.truncates
            and not config.check_unique and not config.changelog
            and not state.properties.get(PARTITION_PROPERTY)
            and row_delta.writes_every_column(state.schema))


def reduced_here(candidates: Mapping[TableName, int]) -> frozenset[TableName]:
    """Of the tables that may take the driver's path (table → its changes), those the driver
    reduces itself (:func:`lakeslot.apply.spread.reduce` ``here``): fewest changes first, at
    most :data:`lakeslot.apply.spread.DRIVER_CHANGES` changes in all."""
    return frozenset(_fewest_first(candidates, spread.DRIVER_CHANGES))


def collect(reduced: spread.Reduced, changes: Mapping[TableName, int]) -> dict[TableName, pa.Table]:
    """The reduced rows (``F``) of the tables of ``changes`` (table → its changes, the eligible
    ones), fewest changes first until :data:`SMALL_ROWS` (from the executors: in one Spark
    job)."""
    chosen = _fewest_first(changes, SMALL_ROWS)
    if not chosen:
        return {}
    rows = reduced.finals(chosen)
    return {table: rows.filter(pc.equal(rows["t"], reduced.index[table])) for table in chosen}


def _fewest_first(changes: Mapping[TableName, int], most: int) -> list[TableName]:
    """The tables of ``changes`` (table → its changes), fewest changes first, while their
    changes add up to at most ``most``."""
    chosen, total = [], 0
    for table, count in sorted(changes.items(), key=lambda item: item[1]):
        if total + count > most:
            break
        chosen.append(table)
        total += count
    return chosen


class SmallBatches:
    """The driver's path of one apply job (its memory: where keys live, per file)."""

    def __init__(self, spark) -> None:
        self._jvm = spark._jvm
        self.positions = row_delta.Positions()
        # without lakeslot's RowDeltas in the JVM (no JDK to build it), small batches take the MERGE
        self.available = row_delta.available(self._jvm)
        if not self.available:
            log.info("small batches are applied by MERGEs: the JVM has no lakeslot RowDeltas "
                     "(lakeslot.spark.helpers builds it where a JDK is)")
        self._session_codec = row_delta.session_codec(spark)

    def apply(self, java_table, table: TableName, state: TableState, rows: pa.Table,
              keeps: frozenset[int], layout: Sequence[str], delimiters: Mapping[str, str],
              absent: Mapping[str, str], lsn: int,
              waiting: Callable[[], AbstractContextManager[Any]] = nullcontext) -> bool:
        """Commit the table's reduced ``rows`` to the Java Iceberg ``java_table`` (loaded after
        this pass's schema changes, described by ``state``) at ``lsn``; ``keeps``: the columns
        (positions in ``layout``) some row keeps from the mirror; ``waiting``: around the
        commit's requests when they cross a network (:func:`lakeslot.spark.row_delta.commit`).
        False when the MERGE must do it (nothing was committed);
        :class:`lakeslot.mirror.contract.Moved` when the table is no longer at ``state``'s
        position (nothing committed)."""
        if not len(rows) or "values" not in rows.column_names:
            return False  # (nothing reduced: the MERGE path advances the table)
        if not row_delta.writes_every_column(state.schema):
            return False  # (this pass's schema change added a column of another type)
        arrow = schema_to_pyarrow(state.schema)
        names = list(state.data_columns())
        kept = merge.kept_columns(names, keeps, layout)
        typed = merge.parsed_rows(rows, str(table), state, arrow, keeps, layout, delimiters,
                                  absent)
        ids = {f.name: f.field_id for f in state.schema.fields}
        key = [(ids[k], k) for k in state.key]
        keys = pa.table({str(i): typed[f"c{names.index(k)}"] for i, k in key})
        if not row_delta.distinct(keys):
            return False  # (a key twice: the MERGE reports it as it always did)
        try:
            if kept:  # the rows their values are kept from are looked up too
                typed = typed.append_column("row", pa.array(range(len(typed)), pa.int64()))
                keeping = typed.filter(_any(typed, [f"k{i}" for i in kept]))
                sources = pa.table({str(i): keeping[f"s{j}"] for j, (i, _) in enumerate(key)})
                wanted = pa.concat_tables([keys, sources]).group_by(keys.column_names).aggregate([])
            else:
                keeping, wanted = None, keys
            described = row_delta.describe(self._jvm, java_table, [row_delta.CODEC_PROPERTY])
            found = self.positions.find(self._jvm, java_table, described, key, wanted, waiting)
            if keeping is not None:
                resolved = self._resolve(java_table, typed, keeping, found, key,
                                         [(i, ids[names[i]]) for i in kept])
                if resolved is None:
                    return False  # (a row to keep values from is missing: the MERGE says so)
                typed = resolved
            changed = typed.filter(pc.not_equal(typed["op"], "D"))
            columns = []
            for field in arrow:
                if field.name in names:
                    column = changed[f"c{names.index(field.name)}"]
                elif field.name == LSN_COLUMN:
                    column = changed["lsn"]
                else:
                    column = pa.nulls(len(changed), field.type)
                columns.append(column.cast(field.type))
            new = pa.Table.from_arrays(columns, schema=arrow)
            row_delta.commit(self._jvm, java_table, self.positions, found,
                             found.deletes(keys), new, key, lsn,
                             row_delta.compression(self._session_codec, described), waiting,
                             since=state.lsn)
        except (row_delta.Conflict, row_delta.Unsupported) as e:
            log.info("%s: applied by a MERGE instead of the driver's row delta: %s", table, e)
            return False
        return True

    def _resolve(self, java_table, typed: pa.Table, keeping: pa.Table, found: row_delta.Found,
                 key: list[tuple[int, str]], kept: list[tuple[int, int]]) -> pa.Table | None:
        """``typed`` (numbered by ``row``) with each kept value taken from the mirror row of its
        ``s`` key, as the MERGE's left join does (:func:`lakeslot.apply.merge.resolved_sql`);
        ``keeping``: its rows that keep a value; ``kept``: (position, field ID) of the columns.
        None when a row to take values from is not in the mirror."""
        ids = [str(i) for i, _ in key]
        sources = pa.table({**{str(i): keeping[f"s{j}"].cast(found.rows[str(i)].type)
                               for j, (i, _) in enumerate(key)}, "row": keeping["row"]})
        located = sources.join(found.rows.select([*ids, "file_path", "pos"]), ids,
                               join_type="inner")
        if located.num_rows != keeping.num_rows:
            return None
        types = {i: typed[f"c{i}"].type for i, _ in kept}
        parts = []
        for path in pc.unique(located["file_path"]).to_pylist():
            here = located.filter(pc.equal(located["file_path"], path))
            read = self.positions.columns(self._jvm, java_table, path,
                                          [f for _, f in kept]).take(here["pos"])
            parts.append(pa.table({**{str(f): read[str(f)].cast(types[i]) for i, f in kept},
                                   "row": here["row"]}))
        values = pa.concat_tables(parts)
        at = pc.index_in(typed["row"], value_set=values["row"])  # (null: keeps nothing)
        for i, field in kept:
            name = f"c{i}"
            value = pc.if_else(pc.fill_null(typed[f"k{i}"], False),
                               values[str(field)].take(at), typed[name])
            typed = typed.set_column(typed.column_names.index(name), name, value)
        return typed


def _any(table: pa.Table, columns: list[str]) -> pa.ChunkedArray:
    """Row by row, whether any of the boolean ``columns`` is true."""
    result = pc.fill_null(table[columns[0]], False)
    for name in columns[1:]:
        result = pc.or_(result, pc.fill_null(table[name], False))
    return result
