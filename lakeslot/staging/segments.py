"""The staging format: sealed, LSN-named Parquet segments of decoded changes — the contract
between the reader (:mod:`lakeslot.reader.writer` writes it) and its consumers (the apply job,
status, local mode read it through :mod:`lakeslot.staging.store`).

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

Failure modes: a segment without the footer metadata, or of another ``format``, is refused with
``ValueError`` naming the file (never guessed); a gap in the chain is :class:`GapError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa

from lakeslot import lsn_text
from lakeslot.staging.relations import Relation

FORMAT = 1
METADATA_KEY = b"lakeslot.segment"
_NAME = re.compile(r"([0-9A-F]{16})-([0-9A-F]{16})\.parquet")
CHANGE_OPS = ("I", "U", "D", "T")  # the ops that change a table (one row each)

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


@dataclass(frozen=True)
class SourceIdentity:
    """Which PostgreSQL system and timeline a stream comes from (``IDENTIFY_SYSTEM``); recorded
    in every segment and checked on resume."""

    system_id: str
    timeline: int


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
    result: list[SegmentName] = []
    position, i = after, 0
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


# reading -------------------------------------------------------------------------------------

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
                      tuple_of(relation, r["new_kinds"], r["new_values"]),
                      tuple_of(relation, r["old_kinds"], r["old_values"]),
                      r["end_lsn"], r["commit_time"], r["xid"], r["origin"], r["prefix"],
                      r["content"], r["transactional"])


def tuple_of(relation: Relation | None, kinds: str | None, values: list | None) -> dict | None:
    """A row's tuple as ``{column name: text | None | marker}`` (None: the row has none)."""
    if kinds is None:
        return None
    # Only I/U/D rows carry kinds, and those always have a relation and the values list.
    assert relation is not None and values is not None
    return {c.name: (v if k == "t" else _MARKERS[k])
            for c, k, v in zip(relation.columns, kinds, values, strict=True)}


def metadata_document(start: int, end: int, source: SourceIdentity,
                      relations: list[Relation]) -> bytes:
    """The footer value of :data:`METADATA_KEY` for a segment (deterministic: sorted keys)."""
    return json.dumps({
        "format": FORMAT, "start": lsn_text.format(start), "end": lsn_text.format(end),
        "system_id": source.system_id, "timeline": source.timeline,
        "relations": [r.as_dict() for r in relations],
    }, sort_keys=True).encode()


def parse_metadata(name: SegmentName, kv: dict | None) -> SegmentMetadata:
    if not kv or METADATA_KEY not in kv:
        raise ValueError(f"segment {name.filename} has no {METADATA_KEY.decode()} metadata")
    meta = json.loads(kv[METADATA_KEY])
    if meta["format"] != FORMAT:
        raise ValueError(f"segment {name.filename} has format {meta['format']}; this version "
                         f"reads format {FORMAT}")
    return SegmentMetadata(name, SourceIdentity(meta["system_id"], meta["timeline"]),
                           tuple(Relation.from_dict(r) for r in meta["relations"]))
