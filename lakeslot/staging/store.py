"""The staging store: sealed segments (:mod:`lakeslot.staging.segments`) at a URI, and the apply
job's status document next to them.

Staging is a URI (``file:///path``, a plain path, ``s3://bucket/prefix``…) opened with
``pyarrow.fs`` (:func:`lakeslot.filesystems.filesystem`). The reader writes through :class:`Staging` (temporary file,
then an atomic seal), the apply job reads and deletes (retention), status and local mode read.
Next to the segments live two kinds of JSON documents: the apply job's status
(:data:`APPLY_STATUS_FILE`) and the results of verifications the operator requested
(``verify/<token>.json``, written by the verification Job, read by the operator).

Invariants:

- Atomic seal: rows stream into a temporary file (hidden ``.tmp-*`` next to the segments on a
  local filesystem, renamed into place after fsync; a local temporary file uploaded in one put
  — or one multipart upload, which becomes visible only when completed — for object stores,
  which have no rename). A segment name is visible only once its content is complete: a killed
  uploader leaves nothing, a failed upload is deleted and its size checked; a zombie's identical
  segment is simply replaced (DESIGN.md rule 5).
- Sealed segments are immutable: a consumer may cache what it read of one by name (the rows,
  row groups and metadata). A zombie's copy that replaces one holds the same content, not
  always the same bytes (another writer version writes another footer): a cache of the bytes
  keys them by name, size and time from a listing (:meth:`Staging.sealed`).
- Documents (the apply status, verification results) are written whole, never appended: a
  reader sees the previous document or the new one
  (:func:`lakeslot.filesystems.write_document`, :func:`~lakeslot.filesystems.read_document`).
- A reader that opens staging with ``create=False`` (the operator reading a verification result)
  writes nothing, not even the directory.
- Staging is reached with the settings it is given (``environ``: the ingestion's ``secretEnv``,
  which the operator passes) or else this process's environment
  (:func:`lakeslot.filesystems.filesystem`).

Failure modes: filesystem errors surface as ``OSError`` — refused credentials, a missing
bucket or an unreachable endpoint met creating or listing staging as a
:class:`lakeslot.filesystems.StorageError` naming the setting to fix — (the reader retries: nothing was
confirmed to PostgreSQL for an unsealed segment; the apply job retries the pass). Leftover
temporary files of killed writers are removed by :meth:`Staging.remove_temporaries` (the reader
calls it once it holds the slot, when no other legitimate writer can exist).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from lakeslot.filesystems import StorageError, explain, filesystem, read_document, write_document
from lakeslot.staging.segments import CHANGE_OPS, Segment, SegmentMetadata, SegmentName, parse_metadata

TEMP_PREFIX = ".tmp-"
APPLY_STATUS_FILE = "apply-status.json"
VERIFY_RESULTS = "verify"  # the directory of the verification results, one per request token


class Sealed(NamedTuple):
    """A sealed segment as a listing shows it."""

    name: SegmentName
    modified: float | None  # Unix seconds; None when the filesystem does not say
    size: int | None  # bytes; None when the filesystem does not say


class Staging:
    """Sealed segments at a URI: list, read, write (see the module docstring)."""

    def __init__(self, uri: str, *, create: bool = True, environ: Mapping[str, str] | None = None) -> None:
        self.uri = uri
        self.environ = environ
        self.fs, self.path = filesystem(uri, environ)
        self.path = self.path.rstrip("/")
        self._local = isinstance(self.fs, pafs.LocalFileSystem)
        if create:
            try:
                self.fs.create_dir(self.path, recursive=True)
            except OSError as e:
                raise self._explained(e) from e

    def _explained(self, error: OSError) -> OSError:
        """``error``, or a :class:`StorageError` naming the setting to fix."""
        message = explain(self.uri, error, "spec.staging.uri", self.environ)
        return error if message is None else StorageError(message)

    def _file(self, filename: str) -> str:
        return f"{self.path}/{filename}"

    def _files(self) -> list[pafs.FileInfo]:
        try:
            return self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        except OSError as e:
            raise self._explained(e) from e

    def list(self) -> list[SegmentName]:
        """Every sealed segment, ordered by (start, end)."""
        return [name for name, _ in self.listing()]

    def listing(self) -> builtins.list[tuple[SegmentName, float | None]]:
        """Every sealed segment, ordered by (start, end), with when its file was last modified
        (Unix seconds, None when the filesystem does not say): one listing request."""
        return [(s.name, s.modified) for s in self.sealed()]

    def sealed(self) -> builtins.list[Sealed]:
        """:meth:`listing` with each file's size: one listing request."""
        found = ((SegmentName.parse(f.base_name), f) for f in self._files())
        return sorted((Sealed(name, None if f.mtime is None else f.mtime.timestamp(), f.size)
                       for name, f in found if name), key=lambda s: s.name)

    def resume_point(self) -> SegmentName | None:
        """The sealed segment that reaches furthest: a reader resumes at its end."""
        return max(self.list(), key=lambda n: (n.end, n.start), default=None)

    def delete(self, name: SegmentName) -> None:
        """Remove a sealed segment (retention, or a recreated slot making staging obsolete)."""
        self.fs.delete_file(self._file(name.filename))

    def delete_applied(self, names: builtins.list[SegmentName], floor: int, cutoff: float) -> int:
        """Retention: delete the segments of ``names`` (a listing, in order) wholly at or below
        ``floor`` (every table's position) and last modified at or before ``cutoff`` (Unix time),
        oldest first, never the one that reaches furthest (where the reader resumes); returns
        how many. Segments are sealed in LSN order, so the walk stops at the first one that must
        stay: it looks at the segments it deletes and one more, not at everything retained (a
        day of half-second segments is 170,000 files)."""
        furthest = max(names, key=lambda n: (n.end, n.start), default=None)
        deleted = 0
        for name in names:
            if name.end > floor + 1 or name == furthest:
                break
            info = self.fs.get_file_info(self._file(name.filename))
            if info.mtime is None or info.mtime.timestamp() > cutoff:
                break
            self.delete(name)
            deleted += 1
        return deleted

    def metadata(self, name: SegmentName) -> SegmentMetadata:
        with self._input(name) as f:
            return parse_metadata(name, pq.ParquetFile(f).metadata.metadata)

    def row_groups(self, name: SegmentName) -> tuple[SegmentMetadata, int]:
        """The segment's metadata and how many row groups it has (the footer only)."""
        with self._input(name) as f:
            footer = pq.ParquetFile(f).metadata
            return parse_metadata(name, footer.metadata), footer.num_row_groups

    def read_row_group(self, name: SegmentName, index: int,
                       columns: builtins.list[str] | None = None) -> pa.Table:
        """One row group of a segment (``columns``: only those)."""
        with self._input(name) as f:
            return pq.ParquetFile(f).read_row_group(index, columns=columns)

    def read(self, name: SegmentName) -> Segment:
        with self._input(name) as f:
            pf = pq.ParquetFile(f)
            return Segment(parse_metadata(name, pf.metadata.metadata), pf.read())

    def read_whole(self, name: SegmentName) -> pa.Buffer:
        """A segment's file, whole: on an object store one ``HEAD`` (pyarrow's, for the size:
        its Python API opens by path only) and one ``GET``."""
        with self.fs.open_input_file(self._file(name.filename)) as f:
            return f.read_buffer()

    def read_ahead(self, names: Sequence[SegmentName]) -> None:
        """``names`` are about to be read: a plain staging reads each when asked (nothing to do
        here); a cache of it may fetch them now (:class:`lakeslot.apply.segment_cache.SegmentCache`)."""

    def _input(self, name: SegmentName) -> pa.NativeFile:
        """A sealed segment's file, open for reading."""
        return self.fs.open_input_file(self._file(name.filename))

    # used by the reader's segment writer --------------------------------------------------------------------

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
            # One PUT (or a multipart upload, completed only at its end): the object is visible
            # whole or not at all, and a killed uploader leaves no object. An upload that failed
            # in this process is removed before the error propagates, whatever pyarrow's stream
            # did on close, and the size is checked: a truncated object never has a sealed name.
            size = os.path.getsize(temp)
            try:
                pafs.copy_files(temp, final, source_filesystem=pafs.LocalFileSystem(),
                                destination_filesystem=self.fs)
                uploaded = self.fs.get_file_info(final).size
                if uploaded != size:
                    raise OSError(f"segment {name.filename}: {uploaded} bytes in staging, {size} written")
            except BaseException:
                with contextlib.suppress(OSError):
                    self.fs.delete_file(final)
                raise
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

    # builtins.list: inside the class body, ``list`` is the method above.
    def change_counts(self, name: SegmentName) -> builtins.list[tuple[str, str, int, int]]:
        """``(schema, table, commit_lsn, changes)`` of one sealed segment, reading only the
        columns needed."""
        table = pq.read_table(self._file(name.filename),
                              columns=["commit_lsn", "op", "schema", "table"], filesystem=self.fs)
        table = table.filter(pc.is_in(table["op"], value_set=pc.cast(list(CHANGE_OPS), "string")))
        grouped = table.group_by(["schema", "table", "commit_lsn"]).aggregate([("op", "count")])
        return list(zip(*(grouped[c].to_pylist()
                          for c in ("schema", "table", "commit_lsn", "op_count")), strict=True))

    # documents: the apply job's status, verification results ------------------------------

    def _write_document(self, filename: str, document: dict) -> None:
        write_document(self.fs, self._file(filename), document)

    def _read_document(self, filename: str) -> dict | None:
        return read_document(self.fs, self._file(filename))

    def write_apply_status(self, document: dict) -> None:
        """Rewrite ``<staging>/apply-status.json`` whole."""
        self._write_document(APPLY_STATUS_FILE, document)

    def read_apply_status(self) -> dict | None:
        """The last status document of the apply job, or None before its first pass."""
        return self._read_document(APPLY_STATUS_FILE)

    def write_verify_result(self, token: str, document: dict) -> None:
        """Rewrite ``<staging>/verify/<token>.json`` whole (``token``: a checked request token,
        :func:`lakeslot.verify.request.check_token`)."""
        self._write_document(f"{VERIFY_RESULTS}/{token}.json", document)

    def read_verify_result(self, token: str) -> dict | None:
        """The result of the verification requested with ``token``, or None before it finished."""
        return self._read_document(f"{VERIFY_RESULTS}/{token}.json")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
