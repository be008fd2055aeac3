"""A small change to one Iceberg table committed from the driver as one ``RowDelta``: where the
changed keys' rows are (:class:`Positions`), and the commit of the new row versions with the
position deletes of the old ones (:func:`commit`) — no Spark job, no MERGE planning.

Invariants:

- **Positions are those of the snapshot the commit validates from.** :meth:`Positions.find`
  plans the table's files at one snapshot (see "Planning" below) and returns the live rows
  (deletes applied) holding the keys; :func:`commit` validates from that snapshot that every
  data file it deletes from still exists, and that no delete file was added since. A commit by
  anyone else in between that rewrote those files (a compaction) fails Iceberg's validation
  (:class:`Conflict`): nothing is committed, the caller applies the change another way.
- **A data file's keys never change** (files are immutable): the key columns read from a file,
  and the (file, position) rows of a position-delete file, are cached by path, bounded in bytes
  (:data:`CACHE_BYTES`, least recently used out). The files a commit writes enter the cache
  from memory; only files others wrote (the snapshot, compactions, a MERGE) are read, once. A
  data file's live rows are kept with the delete files applied to them, so a pass applies only
  the delete files new since (deletes only accumulate on a data file).
- Files are written through the table's own ``FileIO`` (the credentials and storage Spark's
  catalog uses), Parquet with Iceberg's field IDs. On local disk (``file:`` or a plain path)
  Python reads and writes them itself (:func:`_local`): every byte through py4j cost more than
  the file's use (a 10 KB manifest ≈ 20 ms while the pass's threads share the cores). Elsewhere
  a commit's files go to ``RowDeltas.commit`` whole, which writes them at once. Their names are
  new (a UUID each): written without an existence check (one request less each on object
  storage). A file written by a commit that then fails is an orphan (maintenance's orphan-file
  removal deletes it); it is never referenced.
- **The Java side is three calls** of lakeslot's ``RowDeltas`` (:mod:`lakeslot.spark.helpers`,
  ``java/RowDeltas.java``): the table's facts (:func:`describe`), the new files' locations, and
  the commit with the files' metrics computed by Iceberg from their footers (not read back),
  JSON in and out; and one per file the planning reads off local disk (``manifestList``,
  ``read``: its bytes, whole, in one request, up to :data:`WHOLE_BYTES` — a file's stream read
  from Python was six calls and three proxies released). The commit starts from the table as
  the caller loaded it (no reload: the catalog checks the commit's requirements, and Iceberg
  reloads and retries one that fails them — only from the position the caller planned from)
  and ends with its answer's state (no reload after it). Done call by call from Python, a row
  delta took about forty py4j round trips and as many again to release their results'
  proxies. A JVM without the class
  (:func:`available`) is the caller's to handle: it applies the batch another way.
- Format v2 position deletes, one delete file per data file it deletes from (file-scoped,
  ``referencedDataFile`` set: a scan pairs it with that file only). A table with equality
  deletes, or partitioned, is not handled here (:class:`Unsupported`: the caller uses its
  MERGE).
- **Planning** reads only what is new. The live files of the snapshot this driver's own commit
  made are known from the commit (:meth:`Positions.committed`); otherwise the snapshot's
  manifest list is read, and each manifest once (immutable too) with pyiceberg's Avro reader
  (its reader built once per file schema: :class:`_Avro`) through the table's FileIO, cached
  with the key columns: the live data files, pruned key by key by the columns' bounds (integer
  and string keys), and the position-delete files Iceberg would pair with each (committed at
  or after it, naming it or spanning its path). Equality deletes, deletion vectors and files
  that are not Parquet are :class:`Unsupported`. Iceberg's Java planning cost a py4j call or
  three per data file, and its worker pool's 10 ms polls (the commit scans manifests on the
  calling thread for the same reason).

Failure modes: :class:`Conflict` (validation failed: retry another way), :class:`Unsupported`
(before anything is written), :class:`lakeslot.mirror.contract.Moved` (the table moved since the
caller read it: plan again); any other error is storage's or the catalog's (transient, or the
table's own failure) and leaves the table as it was (a commit either lands whole or not at all).
"""

from __future__ import annotations

import bisect
import contextlib
import io
import json
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from py4j.protocol import Py4JJavaError
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.file import AvroFile
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import resolve_reader
from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFileContent,
    ManifestContent,
    ManifestEntryStatus,
    ManifestFile,
    PartitionFieldSummary,
    manifest_entry_schema_with_data_file,
)
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record, StructProtocol
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from lakeslot.mirror.contract import LSN_PROPERTY, Moved
from lakeslot.spark.helpers import ROW_DELTAS, loaded
from lakeslot.spark.jvm import java

CACHE_BYTES = 256 << 20  # key columns and position deletes held in the driver, at most
FIELD_ID = b"PARQUET:field_id"
FILE_PATH_ID, POS_ID = 2147483546, 2147483545  # the position-delete schema's field IDs (spec)
DELETES = pa.schema([pa.field("file_path", pa.string(), False, {FIELD_ID: str(FILE_PATH_ID)}),
                     pa.field("pos", pa.int64(), False, {FIELD_ID: str(POS_ID)})])
LIVE = "#live"  # a data file's live rows are cached under its path and this (Positions._live)
FILES = "#files"  # a snapshot's live files are cached under its manifest list's path and this
READ_CHUNK = 8 << 20  # bytes per call across py4j when a file is read
# a remote file of at most this size is read whole, in one request, where a Parquet reader's
# seeks (its footer, then its columns) cost a request each on object storage
WHOLE_BYTES = 4 << 20
# a manifest entry as the planning reads it: the spec's v2 fields, and the data file's
# referenced_data_file (pyiceberg's v2 read schema leaves it out)
_DATA_FILE = StructType(*DATA_FILE_TYPE[2].fields,
                        NestedField(143, "referenced_data_file", StringType(), required=False))
_ENTRY = manifest_entry_schema_with_data_file(2, _DATA_FILE)
_IN_ENTRY = {f.name: i for i, f in enumerate(_ENTRY.fields)}
_IN_FILE = {f.name: i for i, f in enumerate(_DATA_FILE.fields)}
# a manifest list as read (pyiceberg's read_manifest_list's schema and types)
_LISTED = MANIFEST_LIST_FILE_SCHEMAS[2]
_LISTED_TYPES: dict[int, Callable[..., StructProtocol]] = {-1: ManifestFile, 508: PartitionFieldSummary}
_LISTED_ENUMS: dict[int, Callable[..., Enum]] = {517: ManifestContent}
_AVRO_SCHEMA = "avro.schema"  # an Avro file's header entry: its schema (JSON)
_AVRO_READERS = 64  # reader trees kept (_Avro), at most
_D = TypeVar("_D", bound=StructProtocol)
ENTRIES = pa.schema([  # a manifest's live entries, as the cache holds them (one row per file)
    pa.field("file_path", pa.string()), pa.field("content", pa.int8()),
    pa.field("parquet", pa.bool_()), pa.field("sequence", pa.int64()),
    pa.field("referenced", pa.string()),
    pa.field("lower", pa.map_(pa.int32(), pa.binary())),
    pa.field("upper", pa.map_(pa.int32(), pa.binary())),
    pa.field("size", pa.int64())])  # file_size_in_bytes (None: a file this driver wrote)


# the column types the driver writes (pyarrow's Parquet, as Iceberg's Spark writer would), and
# lists of them
TYPES = (BooleanType, IntegerType, LongType, FloatType, DoubleType, DecimalType, DateType,
         TimestampType, TimestamptzType, StringType, BinaryType)
CODEC_PROPERTY = "write.parquet.compression-codec"
SESSION_CODEC = "spark.sql.iceberg.compression-codec"  # (see session_codec)
CODECS = {"zstd": "zstd", "snappy": "snappy", "gzip": "gzip", "lz4": "lz4", "brotli": "brotli",
          "uncompressed": "none"}  # Iceberg's write.parquet.compression-codec → pyarrow's


def writes(type_: IcebergType) -> bool:
    """Whether the driver writes columns of ``type_``: :data:`TYPES`, and lists of them."""
    if isinstance(type_, ListType):
        return isinstance(type_.element_type, TYPES)
    return isinstance(type_, TYPES)


def writes_every_column(schema: Schema) -> bool:
    """Whether the driver writes every column of a table of ``schema``."""
    return all(writes(f.field_type) for f in schema.fields)


class Unsupported(Exception):
    """This table or change cannot take the driver's path (nothing was written)."""


class Conflict(Exception):
    """Another commit since the positions were found touched their files (nothing committed)."""


class _JavaFile(io.RawIOBase):
    """A readable, seekable file over an Iceberg ``InputFile`` (for pyarrow's Parquet reader);
    one of at most :data:`WHOLE_BYTES` is fetched whole by its first read."""

    def __init__(self, input_file) -> None:
        self._size = input_file.getLength()
        self._stream = input_file.newStream()
        self._at = 0
        self._whole: bytes | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence]
        self._at = base + offset
        return self._at

    def readinto(self, buffer) -> int:
        wanted = min(len(buffer), self._size - self._at)
        if self._whole is None and wanted > 0 and self._size <= WHOLE_BYTES:
            self._stream.seek(0)
            self._whole = bytes(self._stream.readNBytes(self._size))
        if self._whole is not None:
            chunk = self._whole[self._at:self._at + wanted]
            buffer[:len(chunk)] = chunk
            self._at += len(chunk)
            return len(chunk)
        done = 0
        while done < wanted:
            self._stream.seek(self._at + done)
            chunk = self._stream.readNBytes(min(wanted - done, READ_CHUNK))
            if not chunk:
                break
            buffer[done:done + len(chunk)] = chunk
            done += len(chunk)
        self._at += done
        return done

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


def local_path(location: str) -> str | None:
    """The path of a location on local disk (``file:/p``, ``file:///p`` or ``/p``), else None."""
    if location.startswith("file://"):
        location = location[len("file://"):]
    elif location.startswith("file:"):
        location = location[len("file:"):]
    return location if location.startswith("/") else None


def _open(jvm, table, location: str, length: int | None = None, *, whole: bool = False
          ) -> io.RawIOBase | io.BufferedReader | io.BytesIO:
    """The file at ``location`` of the Java Iceberg ``table``'s ``FileIO``, readable: from local
    disk; else, when ``whole`` or its ``length`` is known to be at most :data:`WHOLE_BYTES`, its
    bytes in one call if it is no larger (:func:`_read`); else through a :class:`_JavaFile` (a
    larger file is read in parts, a Parquet file only the columns asked for)."""
    if (local := local_path(location)) is not None:
        return open(local, "rb")
    if ((whole or (length is not None and length <= WHOLE_BYTES))
            and (content := _read(jvm, table, location, length)) is not None):
        return io.BytesIO(content)
    io_ = table.io()
    return _JavaFile(io_.newInputFile(location) if length is None
                     else io_.newInputFile(location, length))


def _read(jvm, table, location: str, length: int | None = None) -> bytes | None:
    """The bytes of the remote file at ``location`` of the Java Iceberg ``table``'s ``FileIO``,
    whole, if it holds at most :data:`WHOLE_BYTES` (else None): ``RowDeltas.read``, one py4j
    call and one request (``length``: its size when known, else it is not asked first)."""
    read = java(jvm, f"{ROW_DELTAS}.read")(table, location, -1 if length is None else length,
                                           WHOLE_BYTES)
    return None if read is None else bytes(read)


@dataclass(frozen=True)
class _Live:
    """A data file's rows left by the delete files ``applied`` (:meth:`Positions._live`)."""

    applied: frozenset[str]
    rows: pa.Table

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes


class _Cache:
    """Immutable files' contents by path, least recently used out beyond a byte budget."""

    def __init__(self, budget: int) -> None:
        self.budget, self._held, self._bytes = budget, OrderedDict[str, Any](), 0
        self._lock = threading.Lock()

    def get(self, path: str) -> Any:
        with self._lock:
            found = self._held.get(path)
            if found is not None:
                self._held.move_to_end(path)
            return found

    def drop(self, path: str) -> None:
        with self._lock:
            if path in self._held:
                self._bytes -= self._held.pop(path).nbytes

    def put(self, path: str, content: pa.Table | _Live) -> None:
        with self._lock:
            if path in self._held:  # (replaced: more columns of the file than it held)
                self._bytes -= self._held.pop(path).nbytes
            self._held[path] = content
            self._bytes += content.nbytes
            while self._bytes > self.budget and len(self._held) > 1:
                _, dropped = self._held.popitem(last=False)
                self._bytes -= dropped.nbytes


@dataclass(frozen=True)
class Found:
    """The live rows holding some keys at one snapshot."""

    snapshot: int | None  # None: the table has no snapshot (nothing found)
    rows: pa.Table  # the key columns (named by field ID), file_path and pos of each row found
    files: pa.Table | None = None  # the snapshot's live files (ENTRIES), when it has one
    listing: str | None = None  # the snapshot's manifest list (its live files are cached by it)

    def deletes(self, keys: pa.Table | None = None) -> pa.Table:
        """DELETES rows of the rows found (of those holding ``keys`` only, when given), in
        (file, position) order."""
        rows = self.rows
        if keys is not None:
            rows = holding(rows, _cast_like(keys, rows))
        return pa.table([rows["file_path"].cast(pa.string()), rows["pos"]], schema=DELETES).sort_by(
            [("file_path", "ascending"), ("pos", "ascending")])


class Positions:
    """Where keys' live rows are, per table and snapshot, from cached key columns (one per
    apply job: the cache outlives passes). Columns are named by their Iceberg field IDs, which
    survive renames (a file keeps the name a column had when it was written)."""

    def __init__(self, budget: int = CACHE_BYTES) -> None:
        self._cache = _Cache(budget)

    def find(self, jvm, table, described: Described, key: Sequence[tuple[int, str]],
             keys: pa.Table, waiting: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
             ) -> Found:
        """The live rows of the Java Iceberg ``table`` (as loaded, and as ``described``) whose
        key columns — ``key``: (field ID, current name) — hold one of ``keys`` (distinct;
        columns named by field ID), at its current snapshot. ``waiting``: around the search
        when it reads the snapshot's files from object storage (its manifests and data files
        are not known from this job's commits: a table's first commit in a job)."""
        if described.snapshot is None or described.listing is None:
            return Found(None, self._no_rows(keys))
        remote = local_path(described.listing) is None and self._cache.get(described.listing + FILES) is None
        with waiting() if remote else contextlib.nullcontext():
            return self._find(jvm, table, described, key, keys)

    def _find(self, jvm, table, described: Described, key: Sequence[tuple[int, str]],
              keys: pa.Table) -> Found:
        ids = [str(i) for i, _ in key]
        files = self.files(jvm, table, described)
        deletes = Deletes(files)
        values = [(i, _values(keys[str(i)])) for i, _ in key]
        paths: list[str] = []
        live: list[pa.Table] = []
        for data in data_files(files):
            if not all(_may_hold(data, i, wanted) for i, wanted in values):
                continue
            path = data["file_path"]
            rows = self._live(jvm, table, path, [i for i, _ in key], deletes.of(path, data["sequence"]),
                              data["size"])
            live.append(_cast_like(rows.select(ids), keys).append_column("pos", rows["pos"])
                        .append_column("file", pa.array(np.full(len(rows), len(paths), np.int32))))
            paths.append(path)
        if not live:
            return Found(described.snapshot, self._no_rows(keys), files, described.listing)
        hit = holding(pa.concat_tables(live), keys)  # (one for all: keys are distinct)
        return Found(described.snapshot, hit.drop_columns(["file"]).append_column(
            "file_path", pa.array(paths, pa.string()).take(hit["file"])), files,
            described.listing)

    @staticmethod
    def _no_rows(keys: pa.Table) -> pa.Table:
        return keys.slice(0, 0).append_column("pos", pa.array([], pa.int64())).append_column(
            "file_path", pa.array([], pa.string()))

    def files(self, jvm, table, described: Described) -> pa.Table:
        """Every live file (:data:`ENTRIES`) of the snapshot ``described`` (it has one) of the
        Java Iceberg ``table``: :class:`Unsupported` unless the table is unpartitioned with
        Parquet data files and position deletes only."""
        if not described.unpartitioned:
            raise Unsupported("the table is partitioned")
        assert described.listing is not None
        files = self._files(jvm, table, described.listing)
        if not pc.all(files["parquet"], min_count=0).as_py():  # (an empty table: all of none)
            raise Unsupported("the table has files that are not Parquet (or deletion vectors)")
        if pc.any(pc.equal(files["content"], DataFileContent.EQUALITY_DELETES.value),
                  min_count=0).as_py():
            raise Unsupported("the table has equality deletes")
        return files

    def _files(self, jvm, table, listing: str) -> pa.Table:
        """Every live file of the snapshot whose manifest list is ``listing`` (:data:`ENTRIES`):
        as this driver's own commit or compaction left it (:meth:`committed`, :meth:`known`),
        else read, each manifest once (a manifest never changes). The list is read by
        ``RowDeltas.manifestList``: the table's snapshot keeps what it lists, so the commit
        that follows does not read it again."""
        known = self._cache.get(listing + FILES)
        if known is not None:
            return known
        files = _JavaIO(jvm, table)
        read = java(jvm, f"{ROW_DELTAS}.manifestList")(table, listing)
        parts = []
        with _Avro[ManifestFile](_Bytes(listing, bytes(read)), _LISTED, _LISTED_TYPES,
                                 _LISTED_ENUMS) as manifests:
            listed = list(manifests)
        for manifest in listed:
            cached = self._cache.get(manifest.manifest_path)
            if cached is None:
                cached = _entries(files, manifest)
                self._cache.put(manifest.manifest_path, cached)
            parts.append(cached)
        found = pa.concat_tables(parts) if parts else ENTRIES.empty_table()
        self._cache.put(listing + FILES, found)
        return found

    def committed(self, parent: Found, added: pa.Table, lsn: int, current: dict) -> None:
        """After a commit of the files ``added`` (:data:`ENTRIES`, sequence numbers unset) at
        ``lsn``, validated from ``parent``'s snapshot: the live files of the snapshot it made
        are the parent's and these, known without reading its manifests — when the table's
        ``current`` snapshot (``RowDeltas.commit``'s answer) is that commit's (its parent and
        ``lakeslot.lsn``) and its totals of data and delete files agree. A ``RowDelta`` removes
        no file."""
        if parent.files is None or current["parent"] != parent.snapshot:
            return  # (retried onto another writer's commit: its files are read when needed)
        summary = current["summary"]
        files = pa.concat_tables([parent.files, added.set_column(
            added.column_names.index("sequence"), "sequence",
            pa.array(np.full(len(added), current["sequence"]), pa.int64()))]).combine_chunks()
        data = pc.sum(pc.equal(files["content"], DataFileContent.DATA.value)).as_py() or 0
        if (summary.get(LSN_PROPERTY) == str(lsn)
                and summary.get("total-data-files") == str(data)
                and summary.get("total-delete-files") == str(len(files) - data)):
            self._cache.put(current["manifest_list"] + FILES, files)
            if parent.listing is not None:  # (superseded: the table's snapshot moved on)
                self._cache.drop(parent.listing + FILES)

    def known(self, listing: str, files: pa.Table) -> None:
        """The live files (:data:`ENTRIES`, sequence numbers set) of the snapshot whose manifest
        list is ``listing``, as the commit that made it knows them."""
        self._cache.put(listing + FILES, files)

    def _keys(self, jvm, table, path: str, ids: Sequence[int], size: int | None) -> pa.Table:
        cached = self._cache.get(path)
        if cached is None or not {str(i) for i in ids} <= set(cached.column_names):
            read = self.columns(jvm, table, path, ids, size)
            cached = read.append_column("pos", pa.array(range(read.num_rows), pa.int64()))
            self._cache.put(path, cached)
        return cached

    def columns(self, jvm, table, path: str, ids: Sequence[int], size: int | None = None) -> pa.Table:
        """The columns ``ids`` (field IDs) of the data file ``path`` of the Java Iceberg
        ``table``, named by field ID, every row (NULL for a column the file predates); ``size``:
        the file's, when its manifest entry gave it (not asked of the store then)."""
        with _open(jvm, table, path, size) as raw:
            parquet = pq.ParquetFile(raw)
            names = {int(f.metadata[FIELD_ID]): f.name for f in parquet.schema_arrow
                     if f.metadata and FIELD_ID in f.metadata}
            read = parquet.read(columns=[names[i] for i in ids if i in names])
            count = parquet.metadata.num_rows
        return pa.table({str(i): read[names[i]] if i in names else pa.nulls(count) for i in ids})

    def _live(self, jvm, table, path: str, ids: Sequence[int], deletes: list[str],
              size: int | None) -> pa.Table:
        """The key columns ``ids`` and ``pos`` of the rows of the data file ``path`` that the
        position-delete files ``deletes`` leave. Kept per file with the delete files applied:
        deletes only accumulate on a file (a rewrite gives its rows a new file), so a pass
        applies only the delete files new since (a big table's file, deleted from in every
        pass, would otherwise be filtered by every delete file it ever had, every pass)."""
        if not deletes:
            return self._keys(jvm, table, path, ids, size)
        wanted, known = frozenset(deletes), self._cache.get(path + LIVE)
        if (isinstance(known, _Live) and known.applied <= wanted
                and {str(i) for i in ids} <= set(known.rows.column_names)):
            rows, todo = known.rows, wanted - known.applied
        else:
            rows, todo = self._keys(jvm, table, path, ids, size), wanted
        gone = self.deleted(jvm, table, path, sorted(todo))
        if len(gone):
            rows = rows.filter(pc.invert(pc.is_in(rows["pos"], value_set=gone)))
        if todo:
            self._cache.put(path + LIVE, _Live(wanted, rows))
        return rows

    def deleted(self, jvm, table, path: str, deletes: Sequence[str]) -> pa.Array:
        """The positions in the data file ``path`` that the position-delete files ``deletes``
        delete (each delete file read once: cached)."""
        gone = []
        for delete in deletes:
            rows = self._cache.get(delete)
            if rows is None:
                with _open(jvm, table, delete, whole=True) as raw:
                    rows = pq.read_table(raw, columns=["file_path", "pos"])
                self._cache.put(delete, rows)
            gone.append(rows.filter(pc.equal(rows["file_path"], path))["pos"].combine_chunks())
        return pa.concat_arrays(gone) if gone else pa.array([], pa.int64())

    def remember(self, path: str, content: pa.Table) -> None:
        """A file this driver just wrote (its key columns named by field ID and ``pos``, or
        DELETES' rows)."""
        self._cache.put(path, content)


def holding(table: pa.Table, keys: pa.Table) -> pa.Table:
    """The rows of ``table`` whose columns named as ``keys``' hold one of its rows (of the same
    types). One key column: a filter (an Acero join costs about a millisecond whatever its size,
    several per table and pass)."""
    if keys.num_columns == 1:
        name = keys.column_names[0]
        return table.filter(pc.is_in(table[name], value_set=keys[name].combine_chunks()))
    return table.join(keys, keys.column_names, join_type="left semi")


def distinct(keys: pa.Table) -> bool:
    """Whether no row of ``keys`` is there twice."""
    if keys.num_columns == 1:
        return pc.count_distinct(keys.column(0), mode="all").as_py() == keys.num_rows
    return keys.group_by(keys.column_names).aggregate([]).num_rows == keys.num_rows


def _cast_like(table: pa.Table, like: pa.Table) -> pa.Table:
    """``table``'s columns cast to the types of ``like``'s columns of the same names (a file
    written before a type was widened holds the narrower type)."""
    return pa.table({n: table[n].cast(like[n].type) for n in table.column_names})


def data_files(files: pa.Table) -> list[dict]:
    """The data files of a snapshot's live files (:data:`ENTRIES`), as rows."""
    return files.filter(pc.equal(files["content"], DataFileContent.DATA.value)).to_pylist()


class Deletes:
    """A snapshot's position-delete files, by the data file they name."""

    def __init__(self, files: pa.Table) -> None:
        """``files``: the snapshot's live files (:data:`ENTRIES`)."""
        # (path, data sequence number, file_path bounds) of each, by the data file it names
        self._named: dict[str, list[tuple[str, int, bytes | None, bytes | None]]] = {}
        self._spanning: list[tuple[str, int, bytes | None, bytes | None]] = []  # (naming none)
        files = files.filter(pc.equal(files["content"], DataFileContent.POSITION_DELETES.value))
        for row in files.to_pylist():
            low, high = dict(row["lower"]).get(FILE_PATH_ID), dict(row["upper"]).get(FILE_PATH_ID)
            entry = (row["file_path"], row["sequence"], low, high)
            if row["referenced"] is not None:
                self._named.setdefault(row["referenced"], []).append(entry)
            else:
                self._spanning.append(entry)

    def of(self, path: str, sequence: int) -> list[str]:
        """The delete files that may delete rows of the data file ``path`` whose data sequence
        number is ``sequence``: as Iceberg pairs them, those committed at or after it, naming it
        or with ``path`` within their ``file_path`` bounds."""
        wanted = path.encode()
        return [delete for delete, committed, low, high in
                [*self._named.get(path, []), *self._spanning]
                if committed >= sequence and _within(wanted, low, high)]


def _within(value, low, high) -> bool:
    """Whether ``value`` may lie within bounds (a missing bound does not exclude anything)."""
    return (low is None or low <= value) and (high is None or value <= high)


def _values(column: pa.ChunkedArray) -> list[Any] | None:
    """The keys' distinct values in order, as the bounds in manifests are compared, for integer
    and string keys (None: the column's files are not pruned)."""
    if not (pa.types.is_integer(column.type) or pa.types.is_string(column.type)
            or pa.types.is_large_string(column.type)) or column.null_count:
        return None
    values = pc.unique(column).to_pylist()
    if values and isinstance(values[0], str):
        values = [v.encode() for v in values]  # (bounds compare as UTF-8 bytes)
    return sorted(values)


def _may_hold(data: dict, field_id: int, values: list[Any] | None) -> bool:
    """Whether the data file (:data:`ENTRIES` row) may hold one of the keys ``values`` (in
    order) in the column ``field_id``, by the column's bounds in the manifest (Iceberg's
    serialization: integers little-endian, strings UTF-8, the upper one possibly truncated
    upwards). Key by key, not by the keys' span: random keys into a big table span all of it,
    while its files, written in key order, each hold a range of their own."""
    if values is None:
        return True
    low, high = dict(data["lower"]).get(field_id), dict(data["upper"]).get(field_id)
    if low is None or high is None:
        return True
    if isinstance(values[0], int):
        low, high = (int.from_bytes(b, "little", signed=True) for b in (low, high))
    at = bisect.bisect_left(values, low)
    return at < len(values) and values[at] <= high


class _Avro(AvroFile[_D]):
    """pyiceberg's Avro file reader, its reader tree built once per (the file's schema, the read
    schema): building it — converting the header's schema, resolving it against the read
    schema — was ≈ 95 % of reading a small manifest or manifest list (≈ 2 ms each, for every
    table's first commit), and the files of a kind share a handful of schemas (a manifest's
    depends on the partition spec's type only). A reader tree holds no state of a read."""

    _built: ClassVar[dict[tuple[str, int], tuple[Schema, Reader]]] = {}

    def __enter__(self) -> _Avro[_D]:
        with self.input_file.open() as f:
            self.decoder = new_decoder(f.read())
        self.header = self._read_header()
        key = (self.header.meta.get(_AVRO_SCHEMA, ""), id(self.read_schema))
        built = _Avro._built.get(key)
        if built is None:
            schema = self.header.get_schema()
            built = schema, resolve_reader(schema, self.read_schema or schema, self.read_types,
                                           self.read_enums)
            if len(_Avro._built) >= _AVRO_READERS:  # (bounded: many partition types)
                _Avro._built.clear()
            _Avro._built[key] = built
        self.schema, self.reader = built
        self.read_schema = self.read_schema or self.schema
        return self


def _entries(files: _JavaIO, manifest: ManifestFile) -> pa.Table:
    """The live entries of ``manifest`` (:data:`ENTRIES`), data sequence numbers inherited as
    the spec says (an added entry without one has its manifest's)."""
    rows = []
    with _Avro[Record](files.new_input(manifest.manifest_path, manifest.manifest_length),
                       _ENTRY) as reader:
        for entry in reader:
            status, written = entry[_IN_ENTRY["status"]], entry[_IN_ENTRY["sequence_number"]]
            if status == ManifestEntryStatus.DELETED.value:
                continue
            inherited = written is None and status == ManifestEntryStatus.ADDED.value
            data = entry[_IN_ENTRY["data_file"]]
            lower, upper = data[_IN_FILE["lower_bounds"]], data[_IN_FILE["upper_bounds"]]
            rows.append({"file_path": data[_IN_FILE["file_path"]],
                         "content": data[_IN_FILE["content"]],
                         "parquet": str(data[_IN_FILE["file_format"]]).upper() == "PARQUET",
                         "sequence": manifest.sequence_number if inherited else written,
                         "referenced": data[_IN_FILE["referenced_data_file"]],
                         "lower": list((lower or {}).items()),
                         "upper": list((upper or {}).items()),
                         "size": data[_IN_FILE["file_size_in_bytes"]]})
    return pa.Table.from_pylist(rows, schema=ENTRIES)


class _JavaIO(FileIO):
    """A read-only pyiceberg ``FileIO`` over a Java Iceberg table's ``FileIO``: each file read
    whole (in one call: :func:`_open`)."""

    def __init__(self, jvm, table) -> None:
        super().__init__()
        self._jvm, self._table = jvm, table

    def new_input(self, location: str, length: int | None = None) -> InputFile:
        with _open(self._jvm, self._table, location, length, whole=True) as raw:
            return _Bytes(location, raw.read())

    def new_output(self, location: str) -> OutputFile:
        raise NotImplementedError("read only")

    def delete(self, location) -> None:
        raise NotImplementedError("read only")


class _Bytes(InputFile):
    """A file's content, read already."""

    def __init__(self, location: str, content: bytes) -> None:
        super().__init__(location)
        self._content = content

    def __len__(self) -> int:
        return len(self._content)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return io.BytesIO(self._content)



@dataclass(frozen=True)
class Described:
    """What a row delta needs to know of a table (:func:`describe`)."""

    snapshot: int | None  # its current snapshot (None: it has none)
    listing: str | None  # that snapshot's manifest list
    unpartitioned: bool
    properties: dict[str, str | None]  # the table properties asked for (None: unset)


def available(jvm) -> bool:
    """Whether the JVM has lakeslot's ``RowDeltas`` (:mod:`lakeslot.spark.helpers`): without it,
    the caller applies small batches another way."""
    return loaded(jvm, ROW_DELTAS) is not None


def describe(jvm, table, properties: Sequence[str] = ()) -> Described:
    """The Java Iceberg ``table``'s current snapshot, spec and ``properties``, in one call."""
    answer = json.loads(java(jvm, f"{ROW_DELTAS}.describe")(table, json.dumps(list(properties))))
    return Described(answer["snapshot"], answer["manifest_list"], answer["unpartitioned"],
                     answer["properties"])


def session_codec(spark) -> str | None:
    """The session's Iceberg codec, if it sets one (Iceberg's Spark writes take it before the
    table's)."""
    return spark.conf.get(SESSION_CODEC, None)


def compression(session_codec: str | None, described: Described) -> str:
    """pyarrow's name of the codec Iceberg's Spark writes would use for the table ``described``
    (with :data:`CODEC_PROPERTY` asked for) in a session whose :data:`SESSION_CODEC` is
    ``session_codec``: :class:`Unsupported` for one pyarrow does not write."""
    codec = (session_codec or described.properties.get(CODEC_PROPERTY) or "zstd").lower()
    if codec not in CODECS:  # (Spark's write fails with Iceberg's own words)
        raise Unsupported(f"compression codec {codec!r} is not one it writes")
    return CODECS[codec]


def commit(jvm, table, positions: Positions, found: Found, deletes: pa.Table,
           rows: pa.Table | None, key: Sequence[tuple[int, str]], lsn: int,
           compression: str,
           waiting: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext, *,
           since: int | None = None) -> None:
    """Commit ``rows`` (the table's columns, Iceberg's Arrow types and field IDs; None or empty:
    none) and the position ``deletes`` (:data:`DELETES`, in order) to the Java Iceberg ``table``
    as one ``RowDelta`` tagged ``lakeslot.lsn = lsn``, validated from the snapshot where the
    deleted rows were ``found`` (:class:`Conflict` if another commit since removed a file it
    deletes from or added deletes); ``since``: the position the change was planned from, which
    a retry after the catalog refused the first attempt requires (:class:`Moved` otherwise).
    ``key``: (field ID, name) of the key columns. The files are written here; their metrics and
    the commit are ``RowDeltas.commit``'s, in one call."""
    name = f"delta-{lsn:016x}-{uuid.uuid4().hex}"  # (the snapshot's workers write lakeslot-…)
    targets = pc.unique(deletes["file_path"]).to_pylist()  # the data files it deletes from
    contents: list[tuple[pa.Table, str | None]] = []  # (what each file holds, its data file)
    if rows is not None and len(rows):
        contents.append((rows, None))
    for data_file in targets:  # one delete file per data file (file-scoped: a scan pairs it
        # with that file only, where a delete file spanning several is read with every data
        # file whose path sorts between them)
        contents.append((deletes.filter(pc.equal(deletes["file_path"], data_file)), data_file))
    names = [f"{name}-{number}-deletes.parquet" if referenced is not None else f"{name}.parquet"
             for number, (_, referenced) in enumerate(contents)]
    paths = locations(jvm, table, names)
    files, sent, added = [], [], []
    for path, (content, referenced) in zip(paths, contents, strict=True):
        encoded = parquet(content, compression)
        ends = footer(encoded)
        if (local := local_path(path)) is not None:  # written here; only its footer crosses py4j
            _write_local(local, encoded)
            sent.append(ends)
        else:  # written by the Java side, all the commit's files at once
            sent.append(encoded)
        files.append({"path": path, "size": len(encoded), "footer": len(ends),
                      "content": local is None, "referenced": referenced})
        if referenced is None:
            keys = pa.table({str(i): content[n] for i, n in key})
            positions.remember(path, keys.append_column(
                "pos", pa.array(range(len(content)), pa.int64())))
            added.append(_entry(path, DataFileContent.DATA, None, keys))
        else:
            positions.remember(path, content)
            added.append(_entry(path, DataFileContent.POSITION_DELETES, referenced))
    request = {"from": found.snapshot, "property": LSN_PROPERTY, "value": str(lsn), "files": files,
               "position": None if since is None else str(since)}
    with waiting() if any(local_path(p) is None for p in paths) else contextlib.nullcontext():
        answer = validated(java(jvm, f"{ROW_DELTAS}.commit"), table, json.dumps(request),
                           bytearray(b"".join(sent)))
    positions.committed(found, pa.Table.from_pylist(added, schema=ENTRIES), lsn, answer)


def append(jvm, table, rows: pa.Table, name: str, lsn: int, compression: str) -> dict:
    """Commit ``rows`` to ``table`` as one new data file named ``name`` (no deletes, no
    validation from a snapshot), the commit carrying ``lakeslot.lsn = lsn``: the cuts record's
    commit, through the same ``RowDeltas.commit`` request as :func:`commit`'s."""
    [path] = locations(jvm, table, [name])
    written = write(table.io, path, rows, compression)
    ends = footer(written)
    request = {"from": None, "property": LSN_PROPERTY, "value": str(lsn),
               "files": [{"path": path, "size": len(written), "footer": len(ends),
                          "content": False, "referenced": None}]}  # (written here: its footer sent)
    return validated(java(jvm, f"{ROW_DELTAS}.commit"), table, json.dumps(request), bytearray(ends))


def validated(call: Callable[..., str], *args) -> dict:
    """The JSON answer of a helper's commit ``call`` with ``args``: :class:`Conflict` when
    Iceberg's validation failed it, :class:`Moved` when the table moved since the caller read it
    (nothing committed)."""
    try:
        return json.loads(call(*args))
    except Py4JJavaError as e:
        name = e.java_exception.getClass().getName()
        if name.endswith("ValidationException"):
            raise Conflict(str(e.java_exception.getMessage())) from None
        if name.endswith("CommitOperations$Moved"):
            raise Moved(str(e.java_exception.getMessage())) from None
        raise


def locations(jvm, table, names: Sequence[str]) -> list[str]:
    """The locations of new data files of ``names`` in the Java Iceberg ``table``."""
    return json.loads(java(jvm, f"{ROW_DELTAS}.locations")(table, json.dumps(list(names))))


def added_files(paths: Sequence[str], sequence: int) -> pa.Table:
    """The :data:`ENTRIES` rows of the data files ``paths`` added at ``sequence`` (their bounds
    unknown: never pruned)."""
    return pa.Table.from_pylist([{**_entry(path, DataFileContent.DATA, None),
                                  "sequence": sequence} for path in paths], schema=ENTRIES)


def footer(content: bytes) -> bytes:
    """The Parquet footer of a file's ``content`` (its metadata, without the length and magic
    that end the file)."""
    return content[-8 - int.from_bytes(content[-8:-4], "little"):-8]


def _entry(path: str, content: DataFileContent, referenced: str | None,
           keys: pa.Table | None = None) -> dict:
    """The :data:`ENTRIES` row of a file a commit adds (its sequence number set later): the
    bounds of ``keys`` (columns named by field ID; integer and string ones, as Iceberg
    serializes them: :func:`_may_hold`), or of a delete file's one ``referenced`` data file."""
    lower: list[tuple[int, bytes]] = []
    upper: list[tuple[int, bytes]] = []
    if referenced is not None:
        lower = upper = [(FILE_PATH_ID, referenced.encode())]
    for name, column in zip(keys.column_names, keys.columns, strict=True) if keys is not None else ():
        if not len(column) or column.null_count:
            continue
        low, high = pc.min_max(column).values()
        if pa.types.is_integer(column.type):
            width = column.type.bit_width // 8
            lower.append((int(name), low.as_py().to_bytes(width, "little", signed=True)))
            upper.append((int(name), high.as_py().to_bytes(width, "little", signed=True)))
        elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            lower.append((int(name), low.as_py().encode()))
            upper.append((int(name), high.as_py().encode()))
    return {"file_path": path, "content": content.value, "parquet": True, "sequence": None,
            "referenced": referenced, "lower": lower, "upper": upper, "size": None}


def parquet(rows: pa.Table, compression: str) -> bytes:
    """``rows`` as a Parquet file's bytes."""
    sink = io.BytesIO()
    pq.write_table(rows, sink, compression=compression)
    return sink.getvalue()


def _write_local(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "xb") as file:
        file.write(data)


def write(files: Callable[[], Any], path: str, rows: pa.Table, compression: str) -> bytes:
    """Write ``rows`` as a Parquet file at ``path`` (a new name: on local disk itself, else
    through the Java ``FileIO`` that ``files`` returns, with no existence check first); returns
    the file's bytes."""
    data = parquet(rows, compression)
    if (local := local_path(path)) is not None:
        _write_local(local, data)
        return data
    out = files().newOutputFile(path).createOrOverwrite()
    try:
        out.write(bytearray(data))
    finally:
        out.close()
    return data
