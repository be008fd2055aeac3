"""Decoder of pgoutput protocol version 1 messages.

Control messages (Begin, Commit, Origin, Relation, Type, Truncate, logical Message) decode one by
one into plain dataclasses. Row changes (Insert, Update, Delete) are the bulk of the stream and
decode in batches (:func:`decode_tuples`): the tuple data of thousands of messages is walked
column by column with numpy and lands directly in Arrow arrays, so per-change Python work stays a
list append (the reader must keep up with the walsender on one core).

Tuple values stay in PostgreSQL's text form (the replication connection uses
``client_encoding=UTF8``, so the text is UTF-8). Each value has a kind, kept distinct:

- ``t`` a value (its text in the values list), ``n`` SQL NULL (null in the values list),
- ``u`` an unchanged TOASTed value that PostgreSQL did not send (null in the values list),
- ``-`` not part of the tuple: a non-key column of a key-only old tuple. PostgreSQL sends such
  columns as ``n``, indistinguishable from a real NULL (FACTS.md); the decoder rewrites them
  using the relation's key flags, so ``n`` always means NULL.

Invariants:

- A Relation message always replaces the cached description (it is re-sent after DDL,
  TRUNCATE and relcache invalidations, FACTS.md); callers compare descriptions, never assume
  one relid keeps its columns.
- A change for a relation that was never described, a tuple whose column count differs from its
  relation's, an unknown message type or a tuple in binary format is a :class:`ProtocolError`
  (the stream is not what this decoder understands: never guess).
- Type names: user-defined types are named by the Type message that precedes their Relation
  message (the historic catalog, like the data); built-in types (OID below 10000, for which
  pgoutput sends no Type message) are named by a resolver the caller provides.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
from numpy.lib.stride_tricks import as_strided

from lakeslot.reader import arrays
from lakeslot.staging.relations import Column, Relation

BEGIN, COMMIT, ORIGIN, RELATION, TYPE = b"B"[0], b"C"[0], b"O"[0], b"R"[0], b"Y"[0]
INSERT, UPDATE, DELETE, TRUNCATE, MESSAGE = b"I"[0], b"U"[0], b"D"[0], b"T"[0], b"M"[0]
CHANGES = frozenset((INSERT, UPDATE, DELETE))
FIRST_GENBKI_OID = 10000  # pgoutput sends Type messages only for OIDs at or above this

KIND_TEXT, KIND_NULL, KIND_UNCHANGED, KIND_ABSENT = b"t"[0], b"n"[0], b"u"[0], b"-"[0]
_KNOWN_KIND = np.zeros(256, bool)
_KNOWN_KIND[[0, KIND_TEXT, KIND_NULL, KIND_UNCHANGED]] = True  # 0: past a tuple's last column
REPLICA_IDENTITY = {"d": "default", "n": "nothing", "f": "full", "i": "index"}


class ProtocolError(ValueError):
    """The stream holds something this decoder does not understand."""


class Begin(NamedTuple):  # a tuple: one per transaction, on the hot path
    final_lsn: int  # LSN of the commit record
    commit_time_us: int  # microseconds since 2000-01-01 (PostgreSQL epoch)
    xid: int


class Commit(NamedTuple):
    flags: int
    commit_lsn: int
    end_lsn: int  # the end of the commit record: where a resumed stream continues
    commit_time_us: int


@dataclass(frozen=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True)
class Type:
    oid: int
    schema: str
    name: str


@dataclass(frozen=True)
class Truncate:
    options: int  # 1 = CASCADE, 2 = RESTART IDENTITY
    relation_oids: tuple[int, ...]


@dataclass(frozen=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


_BEGIN = struct.Struct("!QqI")
_COMMIT = struct.Struct("!BQQq")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")


def _cstring(data, pos: int) -> tuple[str, int]:
    end = bytes(data[pos:pos + 4096]).find(b"\0")
    if end < 0:  # a long identifier or message prefix: search the rest
        end = bytes(data[pos:]).find(b"\0")
    if end < 0:
        raise ProtocolError("unterminated string in a pgoutput message")
    return bytes(data[pos:pos + end]).decode(), pos + end + 1


def decode_begin(data, pos: int) -> Begin:
    return Begin._make(_BEGIN.unpack_from(data, pos + 1))


def decode_commit(data, pos: int) -> Commit:
    return Commit._make(_COMMIT.unpack_from(data, pos + 1))


def decode_origin(data, pos: int) -> Origin:
    (commit_lsn,) = _U64.unpack_from(data, pos + 1)
    return Origin(commit_lsn, _cstring(data, pos + 9)[0])


def decode_type(data, pos: int) -> Type:
    (oid,) = _U32.unpack_from(data, pos + 1)
    schema, p = _cstring(data, pos + 5)
    return Type(oid, schema or "pg_catalog", _cstring(data, p)[0])


def decode_relation(data, pos: int) -> Relation:
    """A Relation message, without type names (see :class:`RelationCache`)."""
    (oid,) = _U32.unpack_from(data, pos + 1)
    schema, p = _cstring(data, pos + 5)
    table, p = _cstring(data, p)
    identity = REPLICA_IDENTITY[chr(data[p])]
    (ncols,) = struct.unpack_from("!H", data, p + 1)
    p += 3
    columns = []
    for _ in range(ncols):
        flags = data[p]
        name, p = _cstring(data, p + 1)
        type_oid, typmod = struct.unpack_from("!Ii", data, p)
        p += 8
        columns.append(Column(name, type_oid, typmod, bool(flags & 1)))
    return Relation(oid, schema or "pg_catalog", table, identity, tuple(columns))


def decode_truncate(data, pos: int) -> Truncate:
    nrels, options = struct.unpack_from("!IB", data, pos + 1)
    return Truncate(options, struct.unpack_from(f"!{nrels}I", data, pos + 6))


def decode_message(data, pos: int) -> Message:
    flags, lsn = struct.unpack_from("!BQ", data, pos + 1)
    prefix, p = _cstring(data, pos + 10)
    (length,) = _U32.unpack_from(data, p)
    return Message(bool(flags & 1), lsn, prefix, bytes(data[p + 4:p + 4 + length]))


class RelationCache:
    """The current description of every relation the stream described, with type names."""

    def __init__(self, builtin_type_names: Callable[[Iterable[int]], Mapping[int, str]]) -> None:
        self._builtin_type_names = builtin_type_names
        self._types: dict[int, Type] = {}
        self._builtin: dict[int, str] = {}
        self.relations: dict[int, Relation] = {}

    def add_type(self, type_: Type) -> None:
        self._types[type_.oid] = type_

    def resolve(self, relation: Relation) -> Relation:
        """``relation`` with the names of its column types."""
        missing = {c.type_oid for c in relation.columns
                   if c.type_oid < FIRST_GENBKI_OID and c.type_oid not in self._builtin}
        if missing:
            self._builtin.update(self._builtin_type_names(missing))
        return Relation(relation.oid, relation.schema, relation.table, relation.replica_identity,
                        tuple(self._named(c) for c in relation.columns))

    def changes(self, relation: Relation) -> bool:
        """Whether caching the resolved ``relation`` replaces a different description."""
        return self.relations.get(relation.oid, relation) != relation

    def add(self, relation: Relation) -> None:
        """Cache the resolved ``relation``, always replacing what was cached."""
        self.relations[relation.oid] = relation

    def _named(self, column: Column) -> Column:
        schema: str | None
        name: str | None
        if column.type_oid in self._types:
            t = self._types[column.type_oid]
            schema, name = t.schema, t.name
        elif column.type_oid in self._builtin:
            schema, name = "pg_catalog", self._builtin[column.type_oid]
        else:
            schema = name = None
        return Column(column.name, column.type_oid, column.type_modifier, column.key,
                      schema, name)

    def __getitem__(self, oid: int) -> Relation:
        try:
            return self.relations[oid]
        except KeyError:
            raise ProtocolError(f"pgoutput sent a change for relation {oid} before describing "
                                "it (no Relation message)") from None


# batch decoding of row changes ---------------------------------------------------------------

_BIG_ENDIAN = {2: ">u2", 4: ">u4", 8: ">u8"}


def be_uint(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Big-endian unsigned integers of ``width`` (2, 4 or 8) bytes at each position of ``buf``."""
    windows = as_strided(buf, shape=(len(buf) - width + 1, width), strides=(1, 1))
    return windows[pos].view(_BIG_ENDIAN[width])[:, 0].astype(np.int64)


@dataclass
class _Walk:
    ncols: np.ndarray  # per tuple
    kinds: np.ndarray  # (tuples, max columns) uint8
    starts: np.ndarray  # (tuples, max columns) value start in the buffer
    lengths: np.ndarray  # (tuples, max columns) value length (0 unless kind t)
    end: np.ndarray  # per tuple: position after its last value


def _walk(buf: np.ndarray, pos: np.ndarray) -> _Walk:
    """Walk TupleData (``int16 ncols``, then per column a kind byte and, for ``t``, ``int32 len``
    + bytes) at every position at once, one column at a time."""
    n = len(pos)
    ncols = be_uint(buf, pos, 2)
    width = int(ncols.max()) if n else 0
    kinds = np.zeros((n, width), np.uint8)
    starts = np.zeros((n, width), np.int64)
    lengths = np.zeros((n, width), np.int64)
    last = len(buf) - 1
    p = pos + 2
    for j in range(width):
        active = ncols > j
        every = bool(active.all())
        kind = buf[np.minimum(p, last)]
        if not every:
            kind[~active] = 0
        if not _KNOWN_KIND[kind].all():
            raise ProtocolError("tuple data in a format other than text (binary mode is not "
                                "requested, so the stream is not what this decoder expects)")
        text = kind == KIND_TEXT
        length = np.where(text, be_uint(buf, np.minimum(p + 1, last - 3), 4), 0)
        kinds[:, j] = kind
        starts[:, j] = np.where(text, p + 5, p)  # empty slices stay inside the buffer
        lengths[:, j] = length
        step = np.where(text, 5 + length, 1)
        if not every:
            step[~active] = 0
        p = p + step
    return _Walk(ncols, kinds, starts, lengths, p)


@dataclass
class TupleArrays:
    """One tuple per row of a batch as Arrow arrays (null where a row has no such tuple)."""

    kinds: pa.Array  # string: one kind character per column
    values: pa.Array  # list<large_string>: the text where the kind is t, else null


def _arrays(joined: bytes, walk: _Walk, rows: np.ndarray, nrows: int) -> TupleArrays:
    mask = np.arange(walk.kinds.shape[1]) < walk.ncols[:, None]
    kinds = walk.kinds[mask]
    starts, lengths = walk.starts[mask], walk.lengths[mask]
    nvalues = len(kinds)
    # Every value is a slice of the joined messages. Cut the buffer at each value's start and
    # end (alternating values and the bytes between them) and take every other slice: Arrow
    # copies only the values, in C++.
    bounds = np.empty(2 * nvalues, np.int64)
    bounds[0::2], bounds[1::2] = starts, starts + lengths
    if nvalues:
        pieces = pa.LargeStringArray.from_buffers(2 * nvalues - 1, pa.py_buffer(bounds),
                                                  pa.py_buffer(joined))
        taken = pieces.take(arrays.indices(np.arange(0, 2 * nvalues, 2)))
        values = pa.LargeStringArray.from_buffers(nvalues, taken.buffers()[1],
                                                  taken.buffers()[2],
                                                  arrays.bitmap(kinds == KIND_TEXT))
    else:
        values = arrays.binary([], pa.large_string())
    counts = np.zeros(nrows, np.int32)
    counts[rows] = walk.ncols
    offsets = np.zeros(nrows + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    present = np.zeros(nrows, bool)
    present[rows] = True
    validity = arrays.bitmap(present)
    kind_text = pa.StringArray.from_buffers(nrows, pa.py_buffer(offsets),
                                            pa.py_buffer(kinds.tobytes()), validity)
    lists = pa.ListArray.from_buffers(pa.list_(pa.large_string()), nrows,
                                      [validity, pa.py_buffer(offsets)], children=[values])
    return TupleArrays(kind_text, lists)


def decode_tuples(joined: bytes, starts: np.ndarray, ops: np.ndarray, relation: np.ndarray,
                  natts: np.ndarray, keys: np.ndarray) -> tuple[TupleArrays, TupleArrays]:
    """Old and new tuples of a batch of messages concatenated in ``joined``.

    ``starts``: where each row's pgoutput message begins; ``ops``: its type byte; for change
    rows ``relation`` indexes ``natts`` (column count per relation) and ``keys`` (relations ×
    columns: replica identity flags). Rows that are not I/U/D get null tuples."""
    buf = np.frombuffer(joined, np.uint8)
    nrows = len(starts)
    is_update, is_delete = ops == UPDATE, ops == DELETE
    marker = buf[np.minimum(starts + 5, len(buf) - 1)]  # 'K', 'O' or 'N' after the relid
    old_rows = np.flatnonzero((is_update | is_delete) & ((marker == b"K"[0]) | (marker == b"O"[0])))
    new_rows = np.flatnonzero((ops == INSERT) | is_update)
    if np.any(is_delete & (marker != b"K"[0]) & (marker != b"O"[0])):
        raise ProtocolError("a Delete message without an old tuple")

    old = _walk(buf, starts[old_rows] + 6)
    new_pos = starts[new_rows] + 6
    had_old = np.isin(new_rows, old_rows, assume_unique=True)
    new_pos[had_old] = old.end[np.isin(old_rows, new_rows, assume_unique=True)] + 1
    if np.any(buf[new_pos - 1] != b"N"[0]):
        raise ProtocolError("an Insert or Update message without its new tuple")
    new = _walk(buf, new_pos)

    for walk, rows in ((old, old_rows), (new, new_rows)):
        if np.any(walk.ncols != natts[relation[rows]]):
            raise ProtocolError("a tuple's column count differs from its Relation message")
    key_only = marker[old_rows] == b"K"[0]
    if key_only.any():
        not_key = ~keys[relation[old_rows]][:, :old.kinds.shape[1]]
        old.kinds[key_only[:, None] & not_key & (old.kinds == KIND_NULL)] = KIND_ABSENT
    return _arrays(joined, old, old_rows, nrows), _arrays(joined, new, new_rows, nrows)
