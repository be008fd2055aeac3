"""A small change to one Iceberg table committed from the driver as one ``RowDelta``: where the
changed keys' rows are (:class:`Positions`), and the commit of the new row versions with the
position deletes of the old ones (:func:`commit`) — no Spark job, no MERGE planning.

Invariants:

- **Positions are those of the snapshot the commit validates from.** :meth:`Positions.find`
  plans the table's files at one snapshot (Iceberg's Java scan, pruned by the keys' bounds) and
  returns the live rows (deletes applied) holding the keys; :func:`commit` validates from that
  snapshot that every data file it deletes from still exists, and that no delete file was added
  since. A commit by anyone else in between that rewrote those files (a compaction) fails
  Iceberg's validation (:class:`Conflict`): nothing is committed, the caller applies the change
  another way.
- **A data file's keys never change** (files are immutable): the key columns read from a file,
  and the (file, position) rows of a position-delete file, are cached by path, bounded in bytes
  (:data:`CACHE_BYTES`, least recently used out). The files a commit writes enter the cache
  from memory; only files others wrote (the snapshot, compactions, a MERGE) are read, once.
- Files are written through the table's own ``FileIO`` (the credentials and storage Spark's
  catalog uses), Parquet with Iceberg's field IDs, their metrics computed by Iceberg itself from
  the written footer. A file written by a commit that then fails is an orphan (maintenance's
  orphan-file removal deletes it); it is never referenced.
- Format v2 position deletes, one delete file per data file it deletes from (file-scoped,
  ``referencedDataFile`` set: a scan pairs it with that file only). A table with equality
  deletes, or partitioned, is not handled here (:class:`Unsupported`: the caller uses its
  MERGE).
- A scan's tasks cross py4j as JSON (``ScanTaskParser``), one call per task.

Failure modes: :class:`Conflict` (validation failed: retry another way), :class:`Unsupported`
(before anything is written); any other error is storage's or the catalog's (transient, or the
table's own failure) and leaves the table as it was (a commit either lands whole or not at all).
"""

from __future__ import annotations

import io
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from py4j.protocol import Py4JJavaError

from lakeslot.mirror.contract import LSN_PROPERTY

CACHE_BYTES = 256 << 20  # key columns and position deletes held in the driver, at most
FIELD_ID = b"PARQUET:field_id"
FILE_PATH_ID, POS_ID = 2147483546, 2147483545  # the position-delete schema's field IDs (spec)
DELETES = pa.schema([pa.field("file_path", pa.string(), False, {FIELD_ID: str(FILE_PATH_ID)}),
                     pa.field("pos", pa.int64(), False, {FIELD_ID: str(POS_ID)})])
READ_CHUNK = 8 << 20  # bytes per call across py4j when a file is read


class Unsupported(Exception):
    """This table or change cannot take the driver's path (nothing was written)."""


class Conflict(Exception):
    """Another commit since the positions were found touched their files (nothing committed)."""


class _JavaFile(io.RawIOBase):
    """A readable, seekable file over an Iceberg ``InputFile`` (for pyarrow's Parquet reader)."""

    def __init__(self, input_file) -> None:
        self._size = input_file.getLength()
        self._stream = input_file.newStream()
        self._at = 0

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


class _Cache:
    """Immutable files' contents by path, least recently used out beyond a byte budget."""

    def __init__(self, budget: int) -> None:
        self.budget, self._held, self._bytes = budget, OrderedDict[str, pa.Table](), 0
        self._lock = threading.Lock()

    def get(self, path: str) -> pa.Table | None:
        with self._lock:
            found = self._held.get(path)
            if found is not None:
                self._held.move_to_end(path)
            return found

    def put(self, path: str, content: pa.Table) -> None:
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

    def deletes(self, keys: pa.Table | None = None) -> pa.Table:
        """DELETES rows of the rows found (of those holding ``keys`` only, when given), in
        (file, position) order."""
        rows = self.rows
        if keys is not None:
            rows = rows.join(_cast_like(keys, rows), keys.column_names, join_type="left semi")
        return pa.table([rows["file_path"].cast(pa.string()), rows["pos"]], schema=DELETES).sort_by(
            [("file_path", "ascending"), ("pos", "ascending")])


class Positions:
    """Where keys' live rows are, per table and snapshot, from cached key columns (one per
    apply job: the cache outlives passes). Columns are named by their Iceberg field IDs, which
    survive renames (a file keeps the name a column had when it was written)."""

    def __init__(self, jvm, budget: int = CACHE_BYTES) -> None:
        self._jvm = jvm
        self._cache = _Cache(budget)

    def find(self, table, key: Sequence[tuple[int, str]], keys: pa.Table) -> Found:
        """The live rows of the Java Iceberg ``table`` (as loaded) whose key columns — ``key``:
        (field ID, current name) — hold one of ``keys`` (distinct; columns named by field ID),
        at its current snapshot."""
        ids = [str(i) for i, _ in key]
        current = table.currentSnapshot()
        if current is None:
            return Found(None, self._no_rows(keys))
        if not table.spec().isUnpartitioned():
            raise Unsupported("the table is partitioned")
        snapshot = current.snapshotId()
        scan = table.newScan().useSnapshot(snapshot).filter(self._bounds(key, keys))
        found = []
        tasks = scan.planFiles()
        parser = self._jvm.org.apache.iceberg.ScanTaskParser
        try:
            for task in _iterate(tasks):  # (one py4j call per task for what it holds)
                planned = json.loads(parser.toJson(task))
                path = planned["data-file"]["file-path"]
                live = self._keys(table, path, [i for i, _ in key])
                for delete in planned["delete-files"]:
                    if delete["content"] != "POSITION_DELETES":
                        raise Unsupported("the table has equality deletes")
                    gone = self._deleted(table, delete["file-path"])
                    gone = gone.filter(pc.equal(gone["file_path"], path))["pos"]
                    if len(gone):
                        live = live.filter(pc.invert(pc.is_in(live["pos"], value_set=gone)))
                hit = _cast_like(live.select(ids), keys).append_column("pos", live["pos"]).join(
                    keys, ids, join_type="inner")
                if len(hit):
                    found.append(hit.append_column(
                        "file_path", pa.array([path] * len(hit), pa.string())))
        finally:
            tasks.close()
        if not found:
            return Found(snapshot, self._no_rows(keys))
        return Found(snapshot, pa.concat_tables(found))

    @staticmethod
    def _no_rows(keys: pa.Table) -> pa.Table:
        return keys.slice(0, 0).append_column("pos", pa.array([], pa.int64())).append_column(
            "file_path", pa.array([], pa.string()))

    def _bounds(self, key: Sequence[tuple[int, str]], keys: pa.Table):
        """A filter that prunes files by the keys' lower and upper bounds (column by column)."""
        expressions = self._jvm.org.apache.iceberg.expressions.Expressions
        both = getattr(expressions, "and")  # (a Python keyword)
        where = expressions.alwaysTrue()
        for field_id, name in key:
            column = keys[str(field_id)]
            low, high = pc.min(column).as_py(), pc.max(column).as_py()
            if isinstance(low, int | str) and isinstance(high, int | str):
                where = both(where, both(expressions.greaterThanOrEqual(name, low),
                                         expressions.lessThanOrEqual(name, high)))
        return where

    def _keys(self, table, path: str, ids: Sequence[int]) -> pa.Table:
        cached = self._cache.get(path)
        if cached is None or not {str(i) for i in ids} <= set(cached.column_names):
            read = self.columns(table, path, ids)
            cached = read.append_column("pos", pa.array(range(read.num_rows), pa.int64()))
            self._cache.put(path, cached)
        return cached

    def columns(self, table, path: str, ids: Sequence[int]) -> pa.Table:
        """The columns ``ids`` (field IDs) of the data file ``path`` of the Java Iceberg
        ``table``, named by field ID, every row (NULL for a column the file predates)."""
        with _JavaFile(table.io().newInputFile(path)) as raw:
            parquet = pq.ParquetFile(raw)
            names = {int(f.metadata[FIELD_ID]): f.name for f in parquet.schema_arrow
                     if f.metadata and FIELD_ID in f.metadata}
            read = parquet.read(columns=[names[i] for i in ids if i in names])
            count = parquet.metadata.num_rows
        return pa.table({str(i): read[names[i]] if i in names else pa.nulls(count) for i in ids})

    def _deleted(self, table, path: str) -> pa.Table:
        cached = self._cache.get(path)
        if cached is None:
            with _JavaFile(table.io().newInputFile(path)) as raw:
                cached = pq.read_table(raw, columns=["file_path", "pos"])
            self._cache.put(path, cached)
        return cached

    def remember(self, path: str, content: pa.Table) -> None:
        """A file this driver just wrote (its key columns named by field ID and ``pos``, or
        DELETES' rows)."""
        self._cache.put(path, content)


def _cast_like(table: pa.Table, like: pa.Table) -> pa.Table:
    """``table``'s columns cast to the types of ``like``'s columns of the same names (a file
    written before a type was widened holds the narrower type)."""
    return pa.table({n: table[n].cast(like[n].type) for n in table.column_names})


def _iterate(closeable):
    """The elements of a Java ``CloseableIterable``."""
    iterator = closeable.iterator()
    while iterator.hasNext():
        yield iterator.next()


def commit(jvm, table, positions: Positions, snapshot: int | None, deletes: pa.Table,
           rows: pa.Table | None, key: Sequence[tuple[int, str]], lsn: int,
           compression: str) -> None:
    """Commit ``rows`` (the table's columns, Iceberg's Arrow types and field IDs; None or empty:
    none) and the position ``deletes`` (:data:`DELETES`, in order) to the Java Iceberg ``table``
    as one ``RowDelta`` tagged ``lakeslot.lsn = lsn``, validated from ``snapshot``, where the
    deleted rows were found (:class:`Conflict` if another commit since removed a file it deletes
    from or added deletes). ``key``: (field ID, name) of the key columns."""
    spec, io_, location = table.spec(), table.io(), table.locationProvider()
    name = f"delta-{lsn:016x}-{uuid.uuid4().hex}"  # (the snapshot's workers write lakeslot-…)
    delta = table.newRowDelta()
    if snapshot is not None:
        delta = delta.validateFromSnapshot(snapshot).validateNoConflictingDeleteFiles()
    if rows is not None and len(rows):
        path = location.newDataLocation(f"{name}.parquet")
        size = _write(io_, path, rows, compression)
        metrics = jvm.org.apache.iceberg.parquet.ParquetUtil.fileMetrics(
            io_.newInputFile(path), jvm.org.apache.iceberg.MetricsConfig.forTable(table))
        delta = delta.addRows(jvm.org.apache.iceberg.DataFiles.builder(spec).withPath(path)
                              .withFormat("PARQUET").withFileSizeInBytes(size)
                              .withMetrics(metrics).build())
        positions.remember(path, pa.table({str(i): rows[n] for i, n in key}).append_column(
            "pos", pa.array(range(len(rows)), pa.int64())))
    files = pc.unique(deletes["file_path"]).to_pylist()
    for number, data_file in enumerate(files):  # one delete file per data file (file-scoped:
        # a scan pairs it with that file only, where a delete file spanning several is read
        # with every data file whose path sorts between them)
        mine = deletes.filter(pc.equal(deletes["file_path"], data_file))
        path = location.newDataLocation(f"{name}-{number}-deletes.parquet")
        size = _write(io_, path, mine, compression)
        metrics = jvm.org.apache.iceberg.parquet.ParquetUtil.fileMetrics(
            io_.newInputFile(path), jvm.org.apache.iceberg.MetricsConfig.forPositionDelete(table))
        delta = delta.addDeletes(
            jvm.org.apache.iceberg.FileMetadata.deleteFileBuilder(spec).ofPositionDeletes()
            .withPath(path).withFormat("PARQUET").withFileSizeInBytes(size).withMetrics(metrics)
            .withReferencedDataFile(data_file).build())
        positions.remember(path, mine)
    if files:
        delta = delta.validateDataFilesExist(jvm.java.util.ArrayList(files))
    try:
        delta.set(LSN_PROPERTY, str(lsn)).commit()
    except Py4JJavaError as e:
        kind = e.java_exception.getClass().getName()
        if kind.endswith("ValidationException"):
            raise Conflict(str(e.java_exception.getMessage())) from None
        raise


def _write(io_, path: str, rows: pa.Table, compression: str) -> int:
    sink = io.BytesIO()
    pq.write_table(rows, sink, compression=compression)
    data = sink.getvalue()
    out = io_.newOutputFile(path).create()
    try:
        out.write(bytearray(data))
    finally:
        out.close()
    return len(data)
