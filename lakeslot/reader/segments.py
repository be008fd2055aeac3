"""The staging format: sealed, LSN-named Parquet segments of decoded changes.

Staging is a URI (``file:///path``, a plain absolute path, ``s3://bucket/prefix``…) opened with
``pyarrow.fs``. It holds one kind of visible file:

    <start>-<end>.parquet     start and end LSN, 16 upper-case hex digits each

A segment holds every change of every transaction whose commit record lies in ``[start, end)``
— whole transactions only — and ``end`` is where a reader resumes after it. Consecutive segments
of one reader chain exactly (``next.start == previous.end``). A segment may hold no rows: it then
records that nothing published happened in its range (an idle or unrelated-write database still
advances, DESIGN.md rule 4).

Rows (one per change, in stream order; ``seq`` orders the rows of a transaction):

==============  ========================  =====================================================
column          type                      meaning
==============  ========================  =====================================================
commit_lsn      int64                     LSN of the transaction's commit record (a
                                          non-transactional logical message: its own LSN)
seq             int64                     0-based position of the row within its transaction
op              string                    I insert, U update, D delete, T truncate (one row per
                                          truncated table), M logical message, C commit (the
                                          transaction's last row)
relation        int32                     I/U/D/T: index into the segment's relations (below)
schema, table   string                    I/U/D/T: the relation's name (raw, unquoted)
new_kinds       string                    I/U: one character per column of the relation:
                                          ``t`` value, ``n`` NULL, ``u`` unchanged TOAST value
                                          (not sent: keep the value already held)
new_values      list<large_string>        I/U: PostgreSQL text form where the kind is ``t``,
                                          else null
old_kinds       string                    U (REPLICA IDENTITY FULL, or a changed key) and D: as
                                          new_kinds, plus ``-``: not part of a key-only old tuple
old_values      list<large_string>        U/D: as new_values
end_lsn         int64                     C: end of the commit record (next transaction > it)
commit_time     timestamp[us, UTC]        C: commit timestamp
xid             int64                     C: transaction id
origin          string                    C: replication origin of the transaction, if any
prefix          string                    M: the logical message's prefix
content         large_binary              M: its payload (``pg_logical_emit_message``)
transactional   bool                      M: emitted inside a transaction (else it stands alone)
==============  ========================  =====================================================

The footer's key-value metadata ``lakeslot.segment`` holds JSON: ``format`` (1), ``start``,
``end`` (LSN text), ``system_id`` and ``timeline`` of the source, and ``relations``: the
description of every relation a row references, in order of first reference — ``oid``,
``schema``, ``table``, ``replica_identity`` (default/nothing/full/index) and ``columns`` (``name``,
``type_oid``, ``type_modifier``, ``key``, ``type_schema``, ``type_name``). A relation whose
columns change within a segment (ADD/DROP COLUMN) has one entry per description; each row points
at the one in effect.

Invariants:

- Atomic seal: rows stream into a temporary file (hidden ``.tmp-*`` next to the segments on a
  local filesystem, renamed into place after fsync; a local temporary file uploaded in one put
  for object stores). A segment name is visible only once its content is complete.
- Determinism (DESIGN.md rule 5): the content is a function of the WAL range only — no clock,
  host or process appears in it, row groups are cut by size only, relations are numbered by
  first reference. A zombie writing the same name writes the same content; renaming over it
  is harmless.
- Memory is bounded: rows are written in batches of at most :data:`BATCH_BYTES` of pgoutput data
  or :data:`BATCH_ROWS` rows, each batch one row group, whatever the transaction's size.

Failure modes: filesystem errors surface as ``OSError`` (the reader retries: nothing was
confirmed to PostgreSQL for an unsealed segment). Leftover temporary files of killed writers are
removed by :meth:`Staging.remove_temporaries` (the reader calls it once it holds the slot, when
no other legitimate writer can exist).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from lakeslot import lsn as lsn_text
from lakeslot.reader import arrays, pgoutput
from lakeslot.reader.pgoutput import Relation
from lakeslot.reader.protocol import HEADER, POSTGRES_EPOCH_US, SourceIdentity

FORMAT = 1
METADATA_KEY = b"lakeslot.segment"
BATCH_BYTES = 4 << 20
BATCH_ROWS = 16384
TEMP_PREFIX = ".tmp-"
_NAME = re.compile(r"([0-9A-F]{16})-([0-9A-F]{16})\.parquet")

SCHEMA = pa.schema([
    pa.field("commit_lsn", pa.int64(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("op", pa.string(), nullable=False),
    pa.field("relation", pa.int32()),
    pa.field("schema", pa.string()),
    pa.field("table", pa.string()),
    pa.field("new_kinds", pa.string()),
    pa.field("new_values", pa.list_(pa.large_string())),
    pa.field("old_kinds", pa.string()),
    pa.field("old_values", pa.list_(pa.large_string())),
    pa.field("end_lsn", pa.int64()),
    pa.field("commit_time", pa.timestamp("us", tz="UTC")),
    pa.field("xid", pa.int64()),
    pa.field("origin", pa.string()),
    pa.field("prefix", pa.string()),
    pa.field("content", pa.large_binary()),
    pa.field("transactional", pa.bool_()),
])
_DICTIONARY_COLUMNS = ["op", "schema", "table", "new_kinds", "old_kinds", "origin", "prefix"]
_STATISTICS_COLUMNS = ["commit_lsn", "seq", "op", "relation", "end_lsn"]
_OPS = "CDIMTU"
_OP_NAMES = arrays.binary(list(_OPS))
_OP_INDEX = np.zeros(256, np.int32)
_OP_INDEX[[ord(c) for c in _OPS]] = np.arange(len(_OPS))
_TABLE_OPS = [pgoutput.INSERT, pgoutput.UPDATE, pgoutput.DELETE, pgoutput.TRUNCATE]


class GapError(RuntimeError):
    """Sealed segments do not cover an LSN range that must be read."""


@dataclass(frozen=True, order=True)
class SegmentName:
    start: int
    end: int

    @property
    def filename(self) -> str:
        return f"{self.start:016X}-{self.end:016X}.parquet"

    @classmethod
    def parse(cls, filename: str) -> SegmentName | None:
        m = _NAME.fullmatch(filename)
        return cls(int(m.group(1), 16), int(m.group(2), 16)) if m else None

    def __str__(self) -> str:
        return f"{lsn_text.format(self.start)}-{lsn_text.format(self.end)}"


def chain(segments: list[SegmentName], after: int) -> list[SegmentName]:
    """The sealed segments to read, in order, for everything after LSN ``after``: at each
    position the segment covering it that reaches furthest. Segments of a zombie may overlap a
    chosen one: a consumer skips rows whose ``commit_lsn`` is below the previous segment's end.
    Raises :class:`GapError` when a later segment exists but nothing covers the position."""
    ordered = sorted(segments)
    result, position, i = [], after, 0
    while True:
        best = None
        while i < len(ordered) and ordered[i].start <= position:
            if ordered[i].end > position and (best is None or ordered[i].end > best.end):
                best = ordered[i]
            i += 1
        if best is None:
            if i < len(ordered):
                raise GapError(f"no sealed segment covers {lsn_text.format(position)}; the next "
                               f"one starts at {lsn_text.format(ordered[i].start)}")
            return result
        result.append(best)
        position = best.end


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
        self._open()
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def _open(self) -> None:
        if self._writer is None:
            self._temp, filesystem = self.staging.temporary(self.start)
            self._writer = pq.ParquetWriter(
                self._temp, SCHEMA, filesystem=filesystem, compression="zstd",
                use_dictionary=_DICTIONARY_COLUMNS, write_statistics=_STATISTICS_COLUMNS)

    def seal(self, end: int) -> SegmentName:
        """Finish the file and make it visible as ``<start>-<end>.parquet``."""
        if end < self.start:
            raise ValueError(f"a segment cannot end ({end:X}) before it starts ({self.start:X})")
        self._open()
        name = SegmentName(self.start, end)
        self._writer.add_key_value_metadata({METADATA_KEY: json.dumps({
            "format": FORMAT, "start": lsn_text.format(self.start), "end": lsn_text.format(end),
            "system_id": self.source.system_id, "timeline": self.source.timeline,
            "relations": [r.as_dict() for r in self.relations.relations],
        }, sort_keys=True)})
        self._writer.close()
        self._writer = None
        self.staging.publish(self._temp, name)
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


# the staging location -----------------------------------------------------------------------

@dataclass(frozen=True)
class SegmentMetadata:
    name: SegmentName
    source: SourceIdentity
    relations: tuple[Relation, ...]


class _Marker:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


UNCHANGED_TOAST = _Marker("UNCHANGED_TOAST")
NOT_IN_KEY = _Marker("NOT_IN_KEY")
_MARKERS = {"n": None, "u": UNCHANGED_TOAST, "-": NOT_IN_KEY}


@dataclass(frozen=True)
class Row:
    """One segment row with its tuples as ``{column name: text | None | marker}``."""

    commit_lsn: int
    seq: int
    op: str
    relation: Relation | None
    new: dict | None
    old: dict | None
    end_lsn: int | None
    commit_time: datetime | None
    xid: int | None
    origin: str | None
    prefix: str | None
    content: bytes | None
    transactional: bool | None


@dataclass(frozen=True)
class Segment:
    metadata: SegmentMetadata
    table: pa.Table

    def rows(self) -> Iterator[Row]:
        relations = self.metadata.relations
        for r in self.table.to_pylist():
            relation = None if r["relation"] is None else relations[r["relation"]]
            yield Row(r["commit_lsn"], r["seq"], r["op"], relation,
                      _tuple(relation, r["new_kinds"], r["new_values"]),
                      _tuple(relation, r["old_kinds"], r["old_values"]),
                      r["end_lsn"], r["commit_time"], r["xid"], r["origin"], r["prefix"],
                      r["content"], r["transactional"])


def _tuple(relation: Relation | None, kinds: str | None, values: list | None) -> dict | None:
    if kinds is None:
        return None
    return {c.name: (v if k == "t" else _MARKERS[k])
            for c, k, v in zip(relation.columns, kinds, values, strict=True)}


class Staging:
    """Sealed segments at a URI: list, read, write (see the module docstring)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.fs, self.path = pafs.FileSystem.from_uri(uri)
        self.path = self.path.rstrip("/")
        self._local = isinstance(self.fs, pafs.LocalFileSystem)
        self.fs.create_dir(self.path, recursive=True)

    def _file(self, filename: str) -> str:
        return f"{self.path}/{filename}"

    def _files(self) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))

    def list(self) -> list[SegmentName]:
        """Every sealed segment, ordered by (start, end)."""
        return sorted(n for n in (SegmentName.parse(f.base_name) for f in self._files()) if n)

    def resume_point(self) -> SegmentName | None:
        """The sealed segment that reaches furthest: a reader resumes at its end."""
        return max(self.list(), key=lambda n: (n.end, n.start), default=None)

    def delete(self, name: SegmentName) -> None:
        """Remove a sealed segment (retention, or a recreated slot making staging obsolete)."""
        self.fs.delete_file(self._file(name.filename))

    def metadata(self, name: SegmentName) -> SegmentMetadata:
        with self.fs.open_input_file(self._file(name.filename)) as f:
            return _metadata(name, pq.ParquetFile(f).metadata.metadata)

    def read(self, name: SegmentName) -> Segment:
        with self.fs.open_input_file(self._file(name.filename)) as f:
            pf = pq.ParquetFile(f)
            return Segment(_metadata(name, pf.metadata.metadata), pf.read())

    def open(self, start: int, source: SourceIdentity) -> SegmentWriter:
        return SegmentWriter(self, start, source)

    # used by SegmentWriter --------------------------------------------------------------------

    def temporary(self, start: int) -> tuple[str, pafs.FileSystem]:
        """Where an open segment's rows go: next to the segments on a local filesystem (so the
        seal is a rename), else a local temporary file (uploaded in one put)."""
        filename = f"{TEMP_PREFIX}{start:016X}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"
        directory = self.path if self._local else tempfile.gettempdir()
        return f"{directory}/{filename}", pafs.LocalFileSystem()

    def publish(self, temp: str, name: SegmentName) -> None:
        final = self._file(name.filename)
        _fsync(temp)
        if self._local:
            os.replace(temp, final)  # atomic; a zombie's identical segment is simply replaced
            _fsync(self.path)
        else:
            try:
                pafs.copy_files(temp, final, source_filesystem=pafs.LocalFileSystem(),
                                destination_filesystem=self.fs)
            finally:
                os.unlink(temp)

    def discard(self, temp: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)

    def remove_temporaries(self) -> int:
        """Remove leftover temporary files of earlier writers; returns how many."""
        if not self._local:
            return 0
        leftovers = [f.path for f in self._files() if f.base_name.startswith(TEMP_PREFIX)]
        for path in leftovers:
            self.discard(path)
        return len(leftovers)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _metadata(name: SegmentName, kv: dict | None) -> SegmentMetadata:
    if not kv or METADATA_KEY not in kv:
        raise ValueError(f"segment {name.filename} has no {METADATA_KEY.decode()} metadata")
    meta = json.loads(kv[METADATA_KEY])
    if meta["format"] != FORMAT:
        raise ValueError(f"segment {name.filename} has format {meta['format']}; this version "
                         f"reads format {FORMAT}")
    return SegmentMetadata(name, SourceIdentity(meta["system_id"], meta["timeline"]),
                           tuple(Relation.from_dict(r) for r in meta["relations"]))
