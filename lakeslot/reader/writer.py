"""The reader's side of staging: decoded pgoutput rows → one open segment → sealed.

The format is :mod:`lakeslot.staging.segments`, the store :mod:`lakeslot.staging.store`; this module
only produces it.

Invariants:

- Determinism (DESIGN.md rule 5): the content is a function of the WAL range only — no clock,
  host or process appears in it, row groups are cut by size only, relations are numbered by
  first reference. A zombie writing the same name writes the same content.
- Memory is bounded: rows are written in batches of at most :data:`BATCH_BYTES` of pgoutput data
  or :data:`BATCH_ROWS` rows, each batch one row group, whatever the transaction's size.

Failure modes: filesystem errors surface as ``OSError`` from :meth:`SegmentWriter.write` and
:meth:`SegmentWriter.seal` (the reader retries: nothing was confirmed for an unsealed segment);
:meth:`SegmentWriter.abort` removes the temporary file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lakeslot.reader import arrays, pgoutput
from lakeslot.reader.protocol import HEADER, POSTGRES_EPOCH_US
from lakeslot.staging.relations import Relation
from lakeslot.staging.segments import METADATA_KEY, SCHEMA, SegmentName, SourceIdentity, metadata_document
from lakeslot.staging.store import Staging

BATCH_BYTES = 4 << 20
BATCH_ROWS = 16384
_DICTIONARY_COLUMNS = ["op", "schema", "table", "new_kinds", "old_kinds", "origin", "prefix"]
_STATISTICS_COLUMNS = ["commit_lsn", "seq", "op", "relation", "end_lsn"]
_OPS = "CDIMTU"
_OP_NAMES = arrays.binary(list(_OPS))
_OP_INDEX = np.zeros(256, np.int32)
_OP_INDEX[[ord(c) for c in _OPS]] = np.arange(len(_OPS))
_TABLE_OPS = [pgoutput.INSERT, pgoutput.UPDATE, pgoutput.DELETE, pgoutput.TRUNCATE]


# the rows of the open segment ------------------------------------------------------------------

class SegmentRelations:
    """The relation descriptions a segment's rows reference, numbered by first reference."""

    def __init__(self) -> None:
        self.relations: list[Relation] = []
        self._index: dict[Relation, int] = {}

    def index(self, relation: Relation) -> int:
        if relation not in self._index:
            self._index[relation] = len(self.relations)
            self.relations.append(relation)
        return self._index[relation]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, pa.Array, pa.Array]:
        """Column count, key flags (relations × columns), schema and table of each relation."""
        width = max((len(r.columns) for r in self.relations), default=0)
        keys = np.zeros((len(self.relations), width), bool)
        for i, r in enumerate(self.relations):
            keys[i, :len(r.columns)] = [c.key for c in r.columns]
        natts = np.array([len(r.columns) for r in self.relations], np.int64)
        return (natts, keys, arrays.binary([r.schema for r in self.relations]),
                arrays.binary([r.table for r in self.relations]))


@dataclass(slots=True)
class _Run:
    """Consecutive rows of one transaction (or one non-transactional message)."""

    first_row: int
    commit_lsn: int
    first_seq: int
    xid: int | None
    origin: str | None = None


@dataclass
class Batch:
    """Rows received but not yet written: whole pgoutput XLogData messages in stream order.

    The hot path only appends to :attr:`raw` (and adds to :attr:`nbytes`); everything else is
    decoded per batch by :meth:`take`."""

    raw: list = field(default_factory=list)
    nbytes: int = 0
    _runs: list[_Run] = field(default_factory=list)

    def begin(self, commit_lsn: int, xid: int | None) -> None:
        self._runs.append(_Run(len(self.raw), commit_lsn, 0, xid))

    def origin(self, name: str) -> None:
        self._runs[-1].origin = name

    def truncate(self, relation_oids) -> None:
        """One row per truncated relation, each shaped like a change of that relation."""
        for oid in relation_oids:
            self.raw.append(bytes(HEADER) + b"T" + struct.pack("!I", oid))

    @property
    def full(self) -> bool:
        return self.nbytes >= BATCH_BYTES or len(self.raw) >= BATCH_ROWS

    def take(self, cache: pgoutput.RelationCache, relations: SegmentRelations,
             in_transaction: bool) -> pa.RecordBatch | None:
        """The rows as a record batch of :data:`SCHEMA`; the batch is then empty (an open
        transaction continues in it)."""
        if not self.raw:
            return None
        record = _record_batch(self.raw, self._runs, cache, relations)
        last = self._runs[-1]
        self._runs = ([_Run(0, last.commit_lsn, last.first_seq + len(self.raw) - last.first_row,
                            last.xid, last.origin)] if in_transaction else [])
        self.raw.clear()  # in place: the reader's loop holds this list
        self.nbytes = 0
        return record


def _record_batch(raw: list, runs: list[_Run], cache: pgoutput.RelationCache,
                  relations: SegmentRelations) -> pa.RecordBatch:
    n = len(raw)
    joined = b"".join(raw)
    buf = np.frombuffer(joined, np.uint8)
    starts = np.zeros(n, np.int64)
    np.cumsum(np.fromiter(map(len, raw[:-1]), np.int64, n - 1), out=starts[1:])
    msg = starts + HEADER
    ops = buf[msg]

    run_first = np.array([r.first_row for r in runs], np.int64)
    run_of = np.repeat(np.arange(len(runs)), np.diff(np.append(run_first, n)))
    commit_lsn = np.array([r.commit_lsn for r in runs], np.int64)[run_of]
    seq = (np.array([r.first_seq for r in runs], np.int64)[run_of]
           + np.arange(n) - run_first[run_of])

    is_rel = np.isin(ops, _TABLE_OPS)
    oids, inverse = np.unique(pgoutput.be_uint(buf, msg[is_rel] + 1, 4), return_inverse=True)
    segment_index = np.array([relations.index(cache[int(oid)]) for oid in oids], np.int32)
    relation = np.zeros(n, np.int32)
    relation[is_rel] = segment_index[inverse.reshape(-1)]
    natts, keys, schemas, tables = relations.arrays()
    old, new = pgoutput.decode_tuples(joined, msg, ops, relation, natts, keys)
    relation_or_null = arrays.fixed(pa.int32(), relation, is_rel)

    is_commit = ops == pgoutput.COMMIT
    commit_runs = [runs[i] for i in run_of[is_commit]]
    end_lsn, commit_time = np.zeros(n, np.int64), np.zeros(n, np.int64)
    end_lsn[is_commit] = pgoutput.be_uint(buf, msg[is_commit] + 10, 8)
    commit_time[is_commit] = pgoutput.be_uint(buf, msg[is_commit] + 18, 8) + POSTGRES_EPOCH_US
    columns = {
        "commit_lsn": arrays.fixed(pa.int64(), commit_lsn),
        "seq": arrays.fixed(pa.int64(), seq),
        "op": _OP_NAMES.take(arrays.indices(_OP_INDEX[ops])),
        "relation": relation_or_null,
        "schema": schemas.take(arrays.indices(relation, is_rel)),
        "table": tables.take(arrays.indices(relation, is_rel)),
        "new_kinds": new.kinds, "new_values": new.values,
        "old_kinds": old.kinds, "old_values": old.values,
        "end_lsn": arrays.fixed(pa.int64(), end_lsn, is_commit),
        "commit_time": arrays.fixed(SCHEMA.field("commit_time").type, commit_time, is_commit),
        "xid": _scatter(is_commit, [r.xid for r in commit_runs], pa.int64()),
        "origin": _scatter(is_commit, [r.origin for r in commit_runs], pa.string()),
    }
    is_message = ops == pgoutput.MESSAGE
    messages = [pgoutput.decode_message(raw[i], HEADER) for i in np.flatnonzero(is_message)]
    columns["prefix"] = _scatter(is_message, [m.prefix for m in messages], pa.string())
    columns["content"] = _scatter(is_message, [m.content for m in messages], pa.large_binary())
    columns["transactional"] = _scatter(is_message, [m.transactional for m in messages],
                                        pa.bool_())
    return pa.RecordBatch.from_arrays([columns[f.name] for f in SCHEMA], schema=SCHEMA)


def _scatter(where: np.ndarray, values: list, type_: pa.DataType) -> pa.Array:
    """An array of ``len(where)`` nulls with ``values`` at the rows where ``where`` is true."""
    if not values:
        return pa.nulls(len(where), type_)
    if type_ == pa.int64():
        dense = arrays.fixed(type_, np.array([v or 0 for v in values], np.int64),
                             np.array([v is not None for v in values]))
    elif type_ == pa.bool_():
        dense = arrays.booleans(np.array(values, bool))
    else:
        dense = arrays.binary(values, type_)
    index = np.zeros(len(where), np.int64)
    index[where] = np.arange(len(values))
    return dense.take(arrays.indices(index, where))


# writing ------------------------------------------------------------------------------------

class SegmentWriter:
    """One open segment: batches stream into a temporary file; :meth:`seal` publishes it."""

    def __init__(self, staging: Staging, start: int, source: SourceIdentity) -> None:
        self.staging = staging
        self.start = start
        self.source = source
        self.relations = SegmentRelations()
        self.rows = 0
        self._temp: str | None = None
        self._writer: pq.ParquetWriter | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        self._open().write_batch(batch)
        self.rows += batch.num_rows

    def _open(self) -> pq.ParquetWriter:
        """The open writer, opening it (and its temporary file) on first use."""
        if self._writer is None:
            self._temp, filesystem = self.staging.temporary(self.start)
            self._writer = pq.ParquetWriter(
                self._temp, SCHEMA, filesystem=filesystem, compression="zstd",
                use_dictionary=_DICTIONARY_COLUMNS, write_statistics=_STATISTICS_COLUMNS)
        return self._writer

    def seal(self, end: int) -> SegmentName:
        """Finish the file and make it visible as ``<start>-<end>.parquet``."""
        if end < self.start:
            raise ValueError(f"a segment cannot end ({end:X}) before it starts ({self.start:X})")
        writer = self._open()
        temp = self._temp
        assert temp is not None  # _open sets the temporary file together with the writer
        name = SegmentName(self.start, end)
        writer.add_key_value_metadata({METADATA_KEY: metadata_document(
            self.start, end, self.source, self.relations.relations)})
        writer.close()
        self._writer = None
        self.staging.publish(temp, name)
        self._temp = None
        return name

    def abort(self) -> None:
        """Drop the unsealed rows (the temporary file is removed)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._temp is not None:
            self.staging.discard(self._temp)
            self._temp = None


