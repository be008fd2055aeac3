"""A batch of sealed segments reduced on Spark executors: the apply job's data path.

The driver plans and commits; it never handles a change row by row, and its memory does not grow
with a batch (DESIGN.md "Scale"). The one exception is bounded: the small batches it commits
itself, at most :data:`DRIVER_CHANGES` changes a pass, it also reduces itself
(``reduce(…, here=staging)``: the fold one task would run, :class:`_Serial`). A pass over a batch:

1. :func:`scan` (driver): which segments form the batch (:func:`lakeslot.staging.segments.chain`
   from the lowest position, at most ``max_segments``), their row groups, the relation
   descriptions of the tracked tables (from the footers), and per table the number of changes
   above its position, the commit LSN of the first, its TRUNCATEs and the OIDs its changes
   carry; plus lakeslot's DDL messages. It reads one row group's small columns (LSNs, op,
   relation, message payload) at a time, vectorised; memory is one row group's. The driver's
   staging fetches the batch's segments whole first, once, and serves its reads, the scan's and
   its own reduction's, from memory (:mod:`lakeslot.apply.segment_cache`: bounded; executors
   read staging themselves).
2. :func:`reduce` (executors, one Spark job for every table with changes). A batch of at most
   :data:`SERIAL_CHANGES` changes — or :data:`ONE_TASK_MAX_CHANGES` on a job of at most
   :data:`ONE_TASK_CORES` cores, where shuffles cost more than they spread — is reduced by one
   task, without a shuffle: folded in stream order below :data:`ONE_TASK_LATEST_CHANGES`, else
   through the latest-change path's steps in that task (:class:`_OneTask`; from
   :data:`REPLICATED_CHANGES`, in one task per core, each reading back a share of the
   winners). A larger one goes
   through :mod:`lakeslot.apply.latest`: the latest change of each key is found vectorised,
   from compact rows, and only the winning rows are read again; the changes of *entangled* keys
   (key changes, unchanged TOAST values that need an earlier change) and of tables that path
   does not cover (schema changes, TRUNCATE, changelog…) are folded as follows. Tasks read
   the row groups, keep each tracked table's changes above its position (rows of a zombie's overlapping
   segment below the previous segment's end are skipped), translate column names across renames
   (:func:`translations`), and route each change by (table, key) — a key change to both keys'
   partitions, a TRUNCATE to every partition. After the shuffle each partition is sorted by
   (table, commit LSN, seq) and folded by :class:`lakeslot.apply.changes.Reducer`. Output
   (:data:`REDUCED`, persisted until the pass ends): the last state per key (``F``), changelog
   events (``E``), a definite error (``X``), a request to redo the table in one partition
   (``R``) and, per table and partition, what the driver needs to plan (``L``: descriptions used,
   columns with values kept from the mirror).
3. :func:`lakeslot.apply.merge.typed_source` parses one table's ``F`` or ``E`` rows into the
   mirror's types on executors (vectorised, the shared type mapping over Arrow) for the MERGE.

Invariants:

- Same result as :func:`lakeslot.apply.changes.reduce` over the table's changes in commit order
  (the reference, and the unit tests' subject): every change of a key is in one partition, in
  commit order. A key change is split into a delete of the old key (its partition) and the new
  image (the new key's), whose unchanged TOAST values come from the mirror's old row; when the
  old key had an image earlier in the batch that the new one needs, the old key's partition asks
  for a redo (``R``) and the table is reduced again in a single partition — exact, serial, rare.
  A TRUNCATE reaches every partition at its place; only partition 0's copy is an event.
- Rows are routed to a partition through Spark's own hash partitioning of an integer ``part``:
  :func:`_partition_values` finds, once per partition count, an integer that Spark sends to each
  partition, so a TRUNCATE's copies land in every partition.
- Column names are those of the mirror after every rename the batch holds (a change before a
  rename carries the old name: :func:`translations` maps each description and rename epoch).

Failure modes: a definite error of a table during the fold (a change without the key, an
unchanged TOAST value that cannot be recovered, a duplicate of keyColumns PostgreSQL does not keep
unique) is an ``X`` row: that table stops with it (the first in commit order), the others go on.
Anything else (storage, executor loss) fails the Spark job: transient, the pass retries.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import threading
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from lakeslot.api.naming import TableName
from lakeslot.apply import ddl, latest
from lakeslot.apply.changes import (
    BOTH,
    KEEP,
    NEW_SIDE,
    OLD_SIDE,
    Change,
    DuplicateKey,
    Image,
    Reducer,
    TableError,
    start_position,
)
from lakeslot.apply.latest import NOTHING, Unit
from lakeslot.apply.segment_cache import TaskSegments
from lakeslot.source.ddl_capture import PREFIX as DDL_PREFIX
from lakeslot.staging.relations import Relation
from lakeslot.staging.segments import SegmentName, chain, tuple_of
from lakeslot.staging.store import Staging

log = logging.getLogger(__name__)
CHANGES_PER_PARTITION = 200_000  # more partitions for bigger batches: bounded executor memory
SERIAL_CHANGES = 50_000  # up to this many, one task reduces the batch (no shuffle)...
ONE_TASK_CORES, ONE_TASK_MAX_CHANGES = 4, 1_200_000  # ... and up to this many on so few cores:
# measured on 2 cores, 1M changes: one task 3.2-3.5 s, the parallel path 6.8 s (its shuffles
# and row conversions cost ≈ 4× the CPU: it wins from about 5 cores); the task's Python worker
# grew by 125 MB for them (≈ 125 B a change), within what Spark sets aside for Python
ONE_TASK_LATEST_CHANGES = 2_000  # from this many, that task takes the latest-change path
DRIVER_CHANGES = ONE_TASK_LATEST_CHANGES  # the most changes the driver reduces itself (reduce)
REPLICATED_CHANGES = 500_000  # from this many, one such task per core (:class:`_OneTask`):
# 1M changes on 2 cores, warm: 9.4 s against 10.1 s with the compaction (reduce 3.2 s, the MERGE's parse
# 1.1 s, against 3.5 and 1.4 s; twice the reduce's CPU); 100k: no gain (3.1 s either way)
ROUTED = pa.schema([
    pa.field("t", pa.int32()), pa.field("lsn", pa.int64()), pa.field("seq", pa.int64()),
    pa.field("op", pa.string()), pa.field("rel", pa.int32()), pa.field("epoch", pa.int32()),
    pa.field("role", pa.int32()), pa.field("part", pa.int64()),
    pa.field("new_kinds", pa.string()), pa.field("new_values", pa.list_(pa.large_string())),
    pa.field("old_kinds", pa.string()), pa.field("old_values", pa.list_(pa.large_string()))])
REDUCED = pa.schema([
    pa.field("t", pa.int32()), pa.field("kind", pa.string()), pa.field("lsn", pa.int64()),
    pa.field("seq", pa.int64()), pa.field("op", pa.string()),
    pa.field("values", pa.list_(pa.large_string())), pa.field("flags", pa.string()),
    pa.field("source", pa.list_(pa.large_string())), pa.field("info", pa.string())])
# flags: one character per mirror column: v value, n NULL, k kept from the mirror, a absent
# (the change came before the column existed: the source row holds its default)


@dataclass(frozen=True)
class TableScan:
    """One table's part of the batch, as the driver's scan saw it."""

    changes: int = 0
    truncates: tuple[int, ...] = ()  # commit LSNs of its TRUNCATEs
    oids: frozenset[int] = frozenset()  # the OIDs its changes were described with
    described: frozenset[int] = frozenset()  # ... and the descriptions (Batch.relations ids)
    by_op: tuple[tuple[str, int], ...] = ()  # (op, changes): I insert, U update, D delete, T truncate
    oldest: int | None = None  # the commit LSN of its first change (None: it has none)


@dataclass
class Batch:
    """The plan of one pass over sealed segments (:func:`scan`)."""

    segments: list[SegmentName]
    units: list[tuple[str, int, int, tuple[int, ...]]] = field(default_factory=list)
    # ^ (segment file, row group, floor, local relation → global relation id or -1)
    relations: list[Relation] = field(default_factory=list)  # global ids, first reference first
    tables: dict[TableName, TableScan] = field(default_factory=dict)
    # lakeslot's DDL messages (lsn, seq, content) in stream order, above the lowest position
    messages: list[tuple[int, int, bytes]] = field(default_factory=list)

    @property
    def end(self) -> int | None:
        return self.segments[-1].end if self.segments else None


def scan(staging: Staging, names: list[SegmentName], positions: Mapping[TableName, int], *,
         max_segments: int) -> Batch:
    """Plan the next batch for tables at ``positions`` from the sealed segments ``names`` (the
    pass's listing of staging, in order; see the module docstring, step 1). ``staging`` is told
    the batch's segments first (:meth:`~lakeslot.staging.store.Staging.read_ahead`: the driver's
    :class:`~lakeslot.apply.segment_cache.SegmentCache` fetches them)."""
    if not positions or not names:
        return Batch([])
    start = min(start_position(names, p) for p in positions.values())
    batch = Batch(chain(names, start)[:max_segments])
    staging.read_ahead(batch.segments)
    ids: dict[Relation, int] = {}
    counts: dict[TableName, dict[str, int]] = {t: {} for t in positions}
    truncates: dict[TableName, list[int]] = {t: [] for t in positions}
    oids: dict[TableName, set[int]] = {t: set() for t in positions}
    described: dict[TableName, set[int]] = {t: set() for t in positions}
    oldest: dict[TableName, int] = {}
    floor = 0
    columns = ["commit_lsn", "seq", "op", "relation", "prefix", "content", "transactional"]
    for name in batch.segments:
        metadata, groups = staging.row_groups(name)
        local = tuple(ids.setdefault(r, len(ids)) if TableName(r.schema, r.table) in positions
                      else -1 for r in metadata.relations)
        batch.relations = list(ids)
        tables = [TableName(r.schema, r.table) for r in batch.relations]
        bounds = pa.array([positions[t] for t in tables] or [0], pa.int64())
        for group in range(groups):
            rows = staging.read_row_group(name, group, columns)
            batch.messages += _messages(rows.filter(pc.greater_equal(rows["commit_lsn"], floor)),
                                        start)
            if not any(i >= 0 for i in local):
                continue
            rows, relation = _changes_above(rows, local, floor, bounds)
            if not len(rows):
                continue
            batch.units.append((name.filename, group, floor, local))
            by_op = pa.table({"gid": relation, "op": rows["op"], "lsn": rows["commit_lsn"]}).group_by(
                ["gid", "op"]).aggregate([([], "count_all"), ("lsn", "min")])
            for gid, op, count, first in zip(by_op["gid"], by_op["op"], by_op["count_all"],
                                             by_op["lsn_min"], strict=True):
                table, ops = tables[gid.as_py()], counts[tables[gid.as_py()]]
                ops[op.as_py()] = ops.get(op.as_py(), 0) + count.as_py()
                oldest[table] = min(oldest.get(table, first.as_py()), first.as_py())
                oids[table].add(batch.relations[gid.as_py()].oid)
                described[table].add(gid.as_py())
            truncated = pc.equal(rows["op"], "T")
            for gid, lsn in zip(relation.filter(truncated).to_pylist(),
                                rows["commit_lsn"].filter(truncated).to_pylist(), strict=True):
                truncates[tables[gid]].append(lsn)
        floor = name.end
    batch.tables = {t: TableScan(sum(counts[t].values()), tuple(truncates[t]), frozenset(oids[t]),
                                 frozenset(described[t]), tuple(sorted(counts[t].items())),
                                 oldest.get(t))
                    for t in positions}
    return batch


def _changes_above(rows: pa.Table, local: Sequence[int], floor: int, bounds: pa.Array
                   ) -> tuple[pa.Table, pa.Array]:
    """The change rows of a row group that a pass takes, with their global relation ids:
    ``local`` maps the segment's relation index to a global id (-1: not tracked), rows below
    ``floor`` belong to the previous segment, and ``bounds`` holds each global id's position
    (only changes above it are taken)."""
    index, gid = latest.taken(rows, local, floor, bounds)
    return rows.take(index), gid


def _messages(rows: pa.Table, start: int) -> list[tuple[int, int, bytes]]:
    wanted = pc.and_(pc.and_(pc.equal(rows["op"], "M"), pc.equal(rows["prefix"], DDL_PREFIX)),
                     pc.and_(pc.fill_null(rows["transactional"], False),
                             pc.greater_equal(rows["commit_lsn"], start)))
    found = rows.filter(pc.fill_null(wanted, False))
    return [(r["commit_lsn"], r["seq"], r["content"]) for r in found.to_pylist()
            if r["content"] is not None]


@dataclass(frozen=True)
class TableConfig:
    """What the executors need of one table (picklable)."""

    table: TableName
    position: int
    key: tuple[str, ...]  # the mirror's key columns
    names: tuple[str, ...]  # the mirror's data columns, in order, after this pass's evolution
    renames: tuple[tuple[int, int, str, str], ...] = ()  # (lsn, seq, old, new) above position
    check_unique: bool = False
    changelog: bool = False
    single: bool = False  # reduce in one partition (see the module docstring)


@dataclass(frozen=True)
class Problem:
    lsn: int
    seq: int
    message: str
    resnapshot: bool
    automatic: bool
    duplicate: tuple | None  # the key of a duplicate keyColumns value


@dataclass
class TableReduced:
    """What the driver learns of one table's reduction (from the ``X``/``R``/``L`` rows)."""

    relations: list[Relation] = field(default_factory=list)  # in order of first use
    keeps: frozenset[int] = frozenset()  # columns with values kept from the mirror (F rows)
    event_keeps: frozenset[int] = frozenset()  # ... in E rows
    problem: Problem | None = None
    redo: bool = False


class Reduced:
    """The output of :func:`reduce` (:data:`REDUCED` rows) and what it says: the rows persisted
    on the executors (``frame``), or held by the driver (``here``, a reduction of at most
    :data:`DRIVER_CHANGES` changes)."""

    def __init__(self, index: dict[TableName, int], tables: dict[TableName, TableReduced],
                 frame: DataFrame | None = None, here: _Here | None = None) -> None:
        self.index, self.tables, self.frame, self.here = index, tables, frame, here

    def rows(self, table: TableName, kind: str) -> DataFrame:
        """The table's ``kind`` rows as a Spark frame (a MERGE's input)."""
        if self.here is not None:
            return self.here.on_executors(table).rows(table, kind)
        assert self.frame is not None
        frame = self.frame
        return frame.filter((F.col("t") == self.index[table]) & (F.col("kind") == kind))

    def finals(self, tables: Sequence[TableName]) -> pa.Table:
        """The ``F`` rows of ``tables`` with the columns the driver's row delta reads (``t``,
        ``values``, ``flags``, ``source``, ``op``, ``lsn``, ``seq``), on the driver (from the
        executors: in one Spark job). No rows: only ``t``."""
        wanted = [self.index[t] for t in tables]
        if self.here is not None:
            rows = self.here.rows
            finals = rows.filter(pc.and_(pc.equal(rows["kind"], "F"),
                                         pc.is_in(rows["t"], pa.array(wanted, pa.int32()))))
            return finals.select(list(FINALS)) if len(finals) else _NO_FINALS
        assert self.frame is not None
        return final_rows(self.frame.filter(F.col("t").isin(wanted)))

    def release(self) -> None:
        if self.frame is not None:
            self.frame.unpersist()
        if self.here is not None:
            self.here.release()


FINALS = ("t", "values", "flags", "source", "op", "lsn", "seq")
_NO_FINALS = pa.table({"t": pa.array([], pa.int32())})


def final_rows(frame: DataFrame) -> pa.Table:
    """The ``F`` rows of a :data:`REDUCED` frame, with the columns of :data:`FINALS`,
    collected in one Spark job (no rows: only ``t``)."""
    batches = frame.filter(F.col("kind") == "F").select(*FINALS)._collect_as_arrow()
    return pa.Table.from_batches(batches) if batches else _NO_FINALS


class _Here:
    """A reduction the driver made (:func:`reduce` with ``here``): its rows, and — made when a
    table's MERGE needs them as a Spark frame (its row delta fell back) — the executors'
    reduction of that table, which is the same (:class:`_Serial`, the same fold)."""

    def __init__(self, rows: pa.Table, spark, staging_uri: str, batch: Batch,
                 configs: Sequence[TableConfig]) -> None:
        self.rows = rows
        self._spark, self._staging_uri, self._batch = spark, staging_uri, batch
        self._configs = {c.table: c for c in configs}
        self._lock = threading.Lock()  # (the pass's threads ask for it)
        self._executors: dict[TableName, Reduced] = {}

    def on_executors(self, table: TableName) -> Reduced:
        with self._lock:
            if table not in self._executors:
                self._executors[table] = reduce(self._spark, self._staging_uri, self._batch,
                                                [self._configs[table]])
            return self._executors[table]

    def release(self) -> None:
        with self._lock:
            for each in self._executors.values():
                each.release()
            self._executors.clear()


def reduce(spark, staging_uri: str, batch: Batch, configs: Sequence[TableConfig], *,
           here: Staging | None = None) -> Reduced:
    """Reduce ``configs``' tables over ``batch`` on the executors (step 2 of the module
    docstring); tables that ask for it are reduced again in one partition. ``here``: by the
    driver itself, reading the segments through ``here`` (the driver's staging, which holds
    the batch: :class:`~lakeslot.apply.segment_cache.SegmentCache`), in its own process, the
    way one task folds a small batch — for at most
    :data:`DRIVER_CHANGES` changes of tables whose reduced rows the driver takes anyway (its
    row delta): a Spark job and the collection of its rows cost ≈ 0.5 s a pass, the fold a few
    milliseconds."""
    if here is not None:
        return _reduce_here(spark, here, batch, configs)
    reduced = _reduce(spark, staging_uri, batch, configs)
    redo = [c for c in configs if reduced.tables[c.table].redo]
    if not redo:
        return reduced
    log.info("%s: a key change needs a value set earlier in the batch: reduced again in one "
             "partition", ", ".join(str(c.table) for c in redo))
    again = _reduce(spark, staging_uri, batch, [replace(c, single=True) for c in redo])
    kept = [c for c in configs if not reduced.tables[c.table].redo]
    assert reduced.frame is not None and again.frame is not None  # (the executors')
    frame = reduced.frame.filter(F.col("t").isin([reduced.index[c.table] for c in kept]))
    shifted = again.frame.withColumn("t", F.col("t") + len(configs))
    union = frame.unionByName(shifted).persist(StorageLevel.MEMORY_AND_DISK)
    union.count()
    reduced.release()
    again.release()
    index = {**{c.table: reduced.index[c.table] for c in kept},
             **{t: i + len(configs) for t, i in again.index.items()}}
    return Reduced(index, {**reduced.tables, **again.tables}, frame=union)


def _numbered(batch: Batch, configs: Sequence[TableConfig]
              ) -> tuple[dict[TableName, int], list[int], list[Unit]]:
    """The tables of ``configs`` numbered in their order (``t``), each relation of the batch's
    table number (-1: not reduced), and the batch's units as the tasks take them."""
    index = {c.table: i for i, c in enumerate(configs)}
    rel_table = [index.get(TableName(r.schema, r.table), -1) for r in batch.relations]
    return index, rel_table, [(s, g, f, tuple(local)) for s, g, f, local in batch.units]


def _reduce_here(spark, staging: Staging, batch: Batch, configs: Sequence[TableConfig]
                 ) -> Reduced:
    changes = sum(batch.tables[c.table].changes for c in configs)
    assert changes <= DRIVER_CHANGES, changes  # (the driver's memory: DESIGN.md "Scale")
    single = [replace(c, single=True) for c in configs]  # (folded in stream order: no redo)
    index, rel_table, units = _numbered(batch, single)
    router = _Router(staging.uri, single, rel_table, batch.relations, [0], units, 1, staging)
    slice_ = pa.record_batch([pa.array([0], pa.int64())], names=["id"])
    rows = pa.Table.from_batches(list(_Serial(router, _Folder(single, batch.relations))([slice_])),
                                 schema=REDUCED)
    notes = rows.filter(pc.is_in(rows["kind"], pa.array(["X", "R", "L"])))
    learned = _learned(single, batch, notes.select(["t", "kind", "lsn", "seq", "info"]).to_pylist())
    return Reduced(index, learned, here=_Here(rows, spark, staging.uri, batch, configs))


def _reduce(spark, staging_uri: str, batch: Batch, configs: Sequence[TableConfig]) -> Reduced:
    wanted = {c.table for c in configs}
    changes = sum(batch.tables[t].changes for t in wanted)
    cores = spark.sparkContext.defaultParallelism
    partitions = max(cores, math.ceil(changes / CHANGES_PER_PARTITION))
    serial = (changes <= SERIAL_CHANGES or partitions == 1 or all(c.single for c in configs)
              or (cores <= ONE_TASK_CORES and changes <= ONE_TASK_MAX_CHANGES))
    # (before serial batches are marked single: the latest-change path is for plain tables)
    plain = [not (c.single or c.changelog or c.check_unique or c.renames) for c in configs]
    if serial:
        configs = [replace(c, single=True) for c in configs]
    index, rel_table, units = _numbered(batch, configs)
    count = 1 if serial else max(1, min(len(units), partitions))  # tasks reading the units
    targets = [0] if serial else _partition_values(spark, partitions)
    router = _Router(staging_uri, list(configs), rel_table, batch.relations, targets, units, count)
    folder = _Folder(list(configs), batch.relations)
    read = latest.slices(spark, count)
    layouts = [latest.covered(batch.relations, c.table, c.key, c.names, plain=p,
                              truncated=bool(batch.tables[c.table].truncates))
               for c, p in zip(configs, plain, strict=True)]
    keys = latest.Keys(staging_uri, units, count, rel_table, [c.position for c in configs],
                       layouts)
    winners = latest.Winners(staging_uri, units, layouts, REDUCED)
    decided = None
    if serial and (changes < ONE_TASK_LATEST_CHANGES or not any(layouts)):
        # one task reads the batch in stream order and folds it: no shuffle, no sort
        frame = read.mapInArrow(_Serial(router, folder), from_arrow_schema(REDUCED))
    elif serial:  # the same task finds the latest change per key, vectorised, and folds the rest
        copies = cores if changes >= REPLICATED_CHANGES else 1
        frame = latest.slices(spark, copies).mapInArrow(
            _OneTask(keys, winners, _Picked(router, units), folder, copies),
            from_arrow_schema(REDUCED))
    elif not any(layouts):
        frame = _folded(read.mapInArrow(router, from_arrow_schema(ROUTED)), partitions, folder)
    else:  # the latest change per key found vectorised; the fold only for entangled keys
        decided = (read.mapInArrow(keys, from_arrow_schema(latest.COMPACT))
                   .repartition(partitions, "t", "key")
                   .mapInArrow(latest.Group(), from_arrow_schema(latest.DECIDED))
                   .persist(StorageLevel.MEMORY_AND_DISK))

        def pointers(kind: str) -> DataFrame:
            return (decided.filter(F.col("kind") == kind).repartition(partitions, "unit")
                    .sortWithinPartitions("unit", "row"))

        frame = pointers("W").mapInArrow(winners, from_arrow_schema(REDUCED))
        if decided.filter(F.col("kind") == "S").count():  # (no Python: the JVM counts)
            picked = pointers("S").mapInArrow(_Picked(router, units), from_arrow_schema(ROUTED))
            frame = frame.unionByName(_folded(picked, partitions, folder))
    frame, notes = persisted(frame)
    found = _learned(configs, batch, notes)
    if decided is not None:  # the frame is computed and persisted: the pointers are not needed
        decided.unpersist()
    return Reduced(index, found, frame=frame)


def _learned(configs: Sequence[TableConfig], batch: Batch, notes: Iterable
             ) -> dict[TableName, TableReduced]:
    """What the driver learns of each table's reduction from its ``X``, ``R`` and ``L`` rows."""
    found = {c.table: TableReduced() for c in configs}
    first: dict[TableName, dict[tuple[int, int], tuple[int, int]]] = {c.table: {} for c in configs}
    for row in notes:
        config = configs[row["t"]]
        reduced = found[config.table]
        info = json.loads(row["info"]) if row["info"] else {}
        if row["kind"] == "R":
            reduced.redo = True
        elif row["kind"] == "X":
            problem = Problem(row["lsn"], row["seq"], info["message"], info["resnapshot"],
                              info["automatic"], tuple(info["duplicate"])
                              if info.get("duplicate") is not None else None)
            if reduced.problem is None or (problem.lsn, problem.seq) < (
                    reduced.problem.lsn, reduced.problem.seq):
                reduced.problem = problem
        else:
            for gid, epoch, lsn, seq in info["relations"]:
                uses = first[config.table]
                uses[(gid, epoch)] = min(uses.get((gid, epoch), (lsn, seq)), (lsn, seq))
            reduced.keeps |= frozenset(info["keeps"])
            reduced.event_keeps |= frozenset(info["event_keeps"])
    for config in configs:
        uses = first[config.table]
        found[config.table].relations = list(dict.fromkeys(
            ddl.translations(batch.relations[gid], config.renames)[epoch]
            for (gid, epoch), _ in sorted(uses.items(), key=lambda item: item[1])))
    return found


def _folded(routed: DataFrame, partitions: int, folder: _Folder) -> DataFrame:
    """Routed changes shuffled to their key's partition and folded there in commit order."""
    return (routed.repartition(partitions, "part").sortWithinPartitions("t", "lsn", "seq", "role")
            .mapInArrow(folder, from_arrow_schema(REDUCED)))


def persisted(frame: DataFrame) -> tuple[DataFrame, list]:
    """``frame`` (:data:`REDUCED` rows) persisted until the pass ends, and its ``X``, ``R`` and
    ``L`` rows (t, kind, lsn, seq, info), which compute it: the plan of every reduce (the
    apply job's warm-up runs it too, :mod:`lakeslot.apply.warmup`)."""
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    return frame, frame.filter(F.col("kind").isin("X", "R", "L")).select(
        "t", "kind", "lsn", "seq", "info").collect()


def warm_up(spark) -> None:
    """Start the executors' Python workers with this module imported, and learn the routing
    values, before the first batch: the first passes of a new apply job are then as fast as
    later ones (they carry the freshness of the first minute)."""
    partitions = spark.sparkContext.defaultParallelism
    _partition_values(spark, partitions)
    spark.range(0, partitions, numPartitions=partitions).mapInArrow(
        _Warm(), "id long").collect()


@dataclass(frozen=True)
class _Warm:
    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from lakeslot.apply import merge  # noqa: F401 (imported for its import cost only)

        yield from batches


_VALUES: dict[int, list[int]] = {}


def _partition_values(spark, partitions: int) -> list[int]:
    """For each partition ``p`` an integer that ``repartition(partitions, col)`` sends to ``p``
    (Spark's Murmur3 hash, asked of Spark itself once per count)."""
    if partitions not in _VALUES:
        found: dict[int, int] = {}
        for row in spark.range(0, 64 * partitions).selectExpr(
                "id", f"pmod(hash(id), {partitions}) AS p").collect():
            found.setdefault(row["p"], row["id"])
        assert len(found) == partitions, found  # 64 candidates per partition: never short
        _VALUES[partitions] = [found[p] for p in range(partitions)]
    return _VALUES[partitions]


# executors -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Serial:
    """Read and fold in one task."""

    router: _Router
    folder: _Folder

    def __call__(self, ids: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return self.folder(self.router(ids))


@dataclass(frozen=True)
class _OneTask:
    """The latest-change path (:mod:`lakeslot.apply.latest`) without a shuffle: compact rows,
    grouped as one partition, the winners read back, and the changes left to the fold folded in
    stream order (pointers sorted by row group and row are stream order: what :class:`_Serial`
    folds). ``copies`` tasks may run it, each given its number: each groups every key (cheaper
    than shuffling the compact rows, which costs more CPU than the grouping it would spread)
    and reads back the winners of its share of the row groups; the first also folds. So the
    winners, and the parse that reads them, spread over the cores."""

    keys: latest.Keys  # reading every unit: one slice
    winners: latest.Winners
    picked: _Picked
    folder: _Folder
    copies: int

    def __call__(self, ids: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        mine = [i for batch in ids for i in batch.column(0).to_pylist()]
        every = [pa.record_batch([pa.array([0], pa.int64())], names=["id"])]
        # (every unit is read here, its winners and folded changes again: fetched once)
        staging = TaskSegments(self.keys.staging_uri, latest.segments(self.keys.units))
        decided = pa.Table.from_batches(list(latest.Group()(self.keys(every, staging))),
                                        schema=latest.DECIDED)

        def pointers(kind: str, share: bool) -> list[pa.RecordBatch]:
            chosen = decided.filter(pc.equal(decided["kind"], kind))
            if share and self.copies > 1:
                chosen = chosen.filter(pa.array(np.isin(
                    chosen["unit"].to_numpy() % self.copies, mine)))
            return chosen.sort_by([("unit", "ascending"), ("row", "ascending")]).to_batches()

        yield from self.winners(pointers("W", share=True), staging)
        if 0 in mine:
            yield from self.folder(self.picked(pointers("S", share=False), staging))


@dataclass(frozen=True)
class _Picked:
    """Routes the changes that ``S`` pointers (sorted by unit and row) point at
    (:mod:`lakeslot.apply.latest`)."""

    router: _Router
    units: list[Unit]

    def __call__(self, pointers: Iterable[pa.RecordBatch], staging: Staging | None = None
                 ) -> Iterator[pa.RecordBatch]:
        staging = staging or Staging(self.router.staging_uri, create=False)
        keys: dict[tuple[int, int], list[int] | None] = {}
        for _, rows, gid in latest.pointed(staging, self.units, pointers, latest.CHANGE_COLUMNS):
            yield self.router.route(rows, gid.to_pylist(), keys)


@dataclass
class _Router:
    """Reads row groups and routes each tracked change (see the module docstring)."""

    staging_uri: str
    configs: list[TableConfig]
    rel_table: list[int]  # global relation id → index in configs, or -1
    relations: list[Relation]
    targets: list[int]  # part value per partition
    units: list[Unit]
    count: int  # slices (lakeslot.apply.latest.slices)
    staging: Staging | None = None  # the driver's, when it reduces itself; else opened here

    def __call__(self, ids: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        mine = list(latest.units_of(ids, self.units, self.count))
        staging = self.staging or TaskSegments(self.staging_uri,
                                               latest.segments(u for _, u in mine))
        # each relation's table position; a table not reduced now takes nothing
        bounds = pa.array([self.configs[t].position if t >= 0 else NOTHING
                           for t in self.rel_table] or [0], pa.int64())
        # (gid, epoch) → key positions in the relation, or None (not carried)
        keys: dict[tuple[int, int], list[int] | None] = {}
        for _, (segment, group, floor, local) in mine:
            rows = staging.read_row_group(SegmentName.parse(segment), group,  # type: ignore[arg-type]
                                          latest.CHANGE_COLUMNS)
            rows, gid = _changes_above(rows, local, floor, bounds)
            if len(rows):
                yield self.route(rows, gid.to_pylist(), keys)

    def route(self, rows: pa.Table, gids: list[int], keys: dict) -> pa.RecordBatch:
        out: dict[str, list] = {f.name: [] for f in ROUTED}
        lsns, seqs, ops = (rows[c].to_pylist() for c in ("commit_lsn", "seq", "op"))
        new_kinds, new_values = rows["new_kinds"].to_pylist(), rows["new_values"].to_pylist()
        old_kinds, old_values = rows["old_kinds"].to_pylist(), rows["old_values"].to_pylist()
        targets = self.targets
        for i, gid in enumerate(gids):
            t = self.rel_table[gid]
            config = self.configs[t]
            epoch = ddl.epoch(config.renames, lsns[i], seqs[i]) if config.renames else 0
            base = (t, lsns[i], seqs[i], ops[i], gid, epoch)
            tuples = (new_kinds[i], new_values[i], old_kinds[i], old_values[i])
            if config.single:
                _append(out, base, BOTH, targets[0], tuples)
                continue
            positions = keys.get((gid, epoch), False)
            if positions is False:
                names = [c.name for c in ddl.translations(self.relations[gid],
                                                          config.renames)[epoch].columns]
                positions = keys[(gid, epoch)] = ([names.index(k) for k in config.key]
                                                  if all(k in names for k in config.key) else None)
            new = _key_text(positions, new_kinds[i], new_values[i])
            old = _key_text(positions, old_kinds[i], old_values[i])
            for index, role in routes(t, ops[i], old, new, len(targets)):
                _append(out, base, role, targets[index], tuples)
        return pa.RecordBatch.from_pydict(out, schema=ROUTED)


def _key_text(positions: list[int] | None, kinds: str | None, values: list | None) -> str | None:
    """The key's text (for routing only); None when the tuple does not carry it."""
    if positions is None or kinds is None or values is None:
        return None
    if any(kinds[p] != "t" for p in positions):
        return None
    return "\x1f".join(values[p] for p in positions)


def routes(t: int, op: str, old: str | None, new: str | None, partitions: int
           ) -> list[tuple[int, int]]:
    """Where a change of table ``t`` goes: (partition, role) for each copy (``old``/``new``:
    the text of the key in its old and new tuple, None when the tuple does not carry it)."""
    if op == "T":
        return [(p, BOTH if p == 0 else OLD_SIDE) for p in range(partitions)]
    if op == "D":
        return [(_partition(t, old, partitions), BOTH)]
    if op == "U" and old is not None and new is not None and old != new:
        before, after = _partition(t, old, partitions), _partition(t, new, partitions)
        if before != after:
            return [(before, OLD_SIDE), (after, NEW_SIDE)]
    return [(_partition(t, new, partitions), BOTH)]


def _partition(t: int, key: str | None, partitions: int) -> int:
    return zlib.crc32(f"{t}\x1e{key or ''}".encode()) % partitions


def _append(out: dict[str, list], base: tuple, role: int, part: int, tuples: tuple) -> None:
    for name, value in zip(("t", "lsn", "seq", "op", "rel", "epoch"), base, strict=True):
        out[name].append(value)
    out["role"].append(role)
    out["part"].append(part)
    for name, value in zip(("new_kinds", "new_values", "old_kinds", "old_values"), tuples,
                           strict=True):
        out[name].append(value)


@dataclass
class _Folder:
    """Folds changes per table, each table's in commit order (a partition sorted by table, LSN
    and seq, or — the serial path — a whole batch read in stream order, tables interleaved)."""

    configs: list[TableConfig]
    relations: list[Relation]

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        folds: dict[int, _Fold] = {}
        for batch in batches:
            for row in _rows(batch):
                fold = folds.get(row[0])
                if fold is None:
                    fold = folds[row[0]] = _Fold(row[0], self.configs[row[0]], self.relations)
                fold.take(row)
        for fold in folds.values():
            yield from fold.result()


class _Fold:
    """One table's reduction in one task, and its ``REDUCED`` rows."""

    def __init__(self, t: int, config: TableConfig, relations: list[Relation]) -> None:
        self.config, self.relations = config, relations
        self.reducer = Reducer(config.table, config.key, check_unique=config.check_unique,
                               events=config.changelog)
        self.views: dict[tuple[int, int], Relation] = {}
        self.uses: dict[tuple[int, int], tuple[int, int]] = {}
        self.out = _Output(t, config)
        self.stopped: pa.RecordBatch | None = None  # an X or R row: the rest is ignored

    def take(self, row: tuple) -> None:
        if self.stopped is not None:
            return
        _, lsn, seq, op, gid, epoch, role, new_kinds, new_values, old_kinds, old_values = row
        relation = self.views.get((gid, epoch))
        if relation is None:
            relation = self.views[(gid, epoch)] = ddl.translations(
                self.relations[gid], self.config.renames)[epoch]
        if role != OLD_SIDE or op != "T":
            self.uses.setdefault((gid, epoch), (lsn, seq))
        change = Change(lsn, seq, op, relation, tuple_of(relation, new_kinds, new_values),
                        tuple_of(relation, old_kinds, old_values))
        try:
            if self.reducer.take(change, role):
                self.stopped = self.out.single("R", lsn, seq, None)
        except DuplicateKey as e:
            self.stopped = self.out.single("X", e.lsn, 0, {
                "message": "", "resnapshot": True, "automatic": False, "duplicate": list(e.key)})
        except TableError as e:
            self.stopped = self.out.single("X", lsn, seq, {
                "message": str(e), "resnapshot": e.resnapshot, "automatic": e.automatic,
                "duplicate": None})

    def result(self) -> Iterator[pa.RecordBatch]:
        if self.stopped is not None:
            yield self.stopped
            return
        out = self.out
        yield from out.finals(self.reducer)
        if self.reducer.events:
            yield from out.events(self.reducer.events)
        yield out.single("L", 0, 0, {
            "relations": [[g, e, lsn, seq] for (g, e), (lsn, seq) in self.uses.items()],
            "keeps": sorted(out.keeps), "event_keeps": sorted(out.event_keeps)})


def _rows(batch: pa.RecordBatch):
    columns = [batch.column(name).to_pylist() for name in (
        "t", "lsn", "seq", "op", "rel", "epoch", "role", "new_kinds", "new_values", "old_kinds",
        "old_values")]
    return zip(*columns, strict=True)


ROWS_PER_BATCH = 8192


class _Output:
    """``REDUCED`` rows of one table, in batches."""

    def __init__(self, t: int, config: TableConfig) -> None:
        self.t, self.config = t, config
        self.keeps: set[int] = set()
        self.event_keeps: set[int] = set()

    def single(self, kind: str, lsn: int, seq: int, info: dict | None) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({
            "t": [self.t], "kind": [kind], "lsn": [lsn], "seq": [seq], "op": [None],
            "values": [None], "flags": [None], "source": [None],
            "info": [None if info is None else json.dumps(info)]}, schema=REDUCED)

    def finals(self, reducer: Reducer) -> Iterator[pa.RecordBatch]:
        key = [self.config.names.index(k) for k in self.config.key]
        for chunk in _chunks(reducer.finals.values()):
            rows = []
            for final in chunk:
                if final.image is None:
                    values: list[str | None] = [None] * len(self.config.names)
                    for position, value in zip(key, final.key, strict=True):
                        values[position] = value
                    flags = "".join("v" if v is not None else "n" for v in values)
                    rows.append((final.lsn, 0, "D", values, flags, None))
                    continue
                values, flags = self._image(final.image, self.keeps)
                op = "I" if final.fresh else "U"
                rows.append((final.lsn, 0, op, values, flags, final.image.source))
            yield self._batch("F", rows)

    def events(self, events) -> Iterator[pa.RecordBatch]:
        for chunk in _chunks(events):
            rows = []
            for event in chunk:
                values, flags = self._image(event.image, self.event_keeps)
                rows.append((event.lsn, event.seq, event.op, values, flags, event.image.source))
            yield self._batch("E", rows)

    def _image(self, image: Image, keeps: set[int]) -> tuple[list, str]:
        values: list[object] = []
        flags: list[str] = []
        for i, name in enumerate(self.config.names):
            value = image.values.get(name, _ABSENT)
            if value is _ABSENT:
                values.append(None)
                flags.append("a")
            elif value is KEEP:
                values.append(None)
                flags.append("k")
                keeps.add(i)
            elif value is None:
                values.append(None)
                flags.append("n")
            else:
                values.append(value)
                flags.append("v")
        return values, "".join(flags)

    def _batch(self, kind: str, rows: list) -> pa.RecordBatch:
        lsn, seq, op, values, flags, source = (list(c) for c in zip(*rows, strict=True))
        return pa.RecordBatch.from_pydict({
            "t": [self.t] * len(rows), "kind": [kind] * len(rows), "lsn": lsn, "seq": seq,
            "op": op, "values": values, "flags": flags,
            "source": [list(s) if s is not None else None for s in source],
            "info": [None] * len(rows)}, schema=REDUCED)


_ABSENT = object()


def _chunks(items) -> Iterator[list]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, ROWS_PER_BATCH)):
        yield chunk
