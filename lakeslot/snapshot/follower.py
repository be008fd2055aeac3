"""A follower: one ctid range of one heap, read inside the exported snapshot, written as Parquet
data files of the mirror table. Runs in a Spark task (:func:`run_task`), one range per task.

Reading: the ADBC PostgreSQL driver (C++, binary COPY → Arrow record batches of ≈16 MB) on a
connection in autocommit mode, so its own catalog queries at connect time run outside our
transaction; then :func:`lakeslot.source.exported_snapshot.import_statements` as the first statements of
the transaction, then one ``SELECT … FROM ONLY <heap> WHERE ctid …`` (the driver wraps it in
COPY). Session options: UTC/ISO text forms (as every lakeslot session), no lock or idle timeouts,
``statement_timeout`` as configured, and ``row_security = off``: PostgreSQL then refuses to run a
query that row-level security would filter, instead of silently returning fewer rows.

Converting: :mod:`lakeslot.mirror.typemap` per column (native reads are checked, text reads parsed),
then ``_lakeslot_lsn = s`` on every row.

Writing: Parquet (Iceberg's conventions: field ids, 3-level lists, µs timestamps) with the
table's codec; row groups of about ``row_group_bytes`` of Arrow data, a new file once a file
passes ``target_file_bytes``; a writer thread encodes one row group while the next is read.
Memory is bounded by two row groups plus one batch. File names are
unique per attempt, so a retried or concurrent duplicate attempt never overwrites anything.

Invariants:

- A task returns files only after the whole range was read and the heap was verified unchanged
  (``pg_relation_filenode`` equals the ``relfilenode`` the snapshot saw: no TRUNCATE, VACUUM FULL,
  CLUSTER or rewriting ALTER TABLE happened in between, which would move rows between ranges or
  hide them from an old snapshot). Nothing here commits to Iceberg: a failed attempt's files are
  deleted when possible and are otherwise unreferenced orphans.
- The password is read from the environment (``LAKESLOT_SOURCE_PASSWORD``, else ``PGPASSWORD``),
  never shipped in the task.

Failure modes: a definite error (:class:`lakeslot.errors.DefiniteError` — table dropped or
altered during the snapshot, heap rewritten, row-level security, missing privilege, statement
timeout, the exported snapshot gone, a value with no faithful mapping, a NULL in a key column)
comes back as ``RangeResult.error``; it would fail again on retry under the same snapshot (the exported snapshot
gone — :class:`SnapshotLost` — is flagged ``snapshot_lost``: the job copies the table again under
a new snapshot). Anything else (connection lost, backend
terminated, executor lost) raises, so Spark and then the driver retry the range.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import adbc_driver_manager
import adbc_driver_postgresql.dbapi as adbc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from psycopg import conninfo, sql

from lakeslot.api.naming import TableName
from lakeslot.errors import DefiniteError
from lakeslot.filesystems import create_parent, filesystem
from lakeslot.mirror import typemap
from lakeslot.snapshot.plan import Heap, PageRange
from lakeslot.source.connection import (
    LONG_RUNNING_OPTIONS,
    PASSWORD_ENV,
    SESSION_OPTIONS,
    ConnectionSettings,
    application_name,
)
from lakeslot.source.exported_snapshot import import_statements
from lakeslot.spark.tables import WriteOptions

PASSWORD_VARIABLES = (PASSWORD_ENV, "PGPASSWORD")  # ours first, then libpq's


def password_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    env: Mapping[str, str] = os.environ if environ is None else environ
    return next((env[k] for k in PASSWORD_VARIABLES if env.get(k)), None)


class SnapshotLost(DefiniteError):
    """The exported snapshot is gone (the leader's session ended): no range can be read under it
    any more, but the table can be copied again under a new one."""


@dataclass(frozen=True)
class RangeTask:
    settings: ConnectionSettings  # without the password
    ingestion: str
    label: str  # names the range in application_name and file names
    snapshot: str
    lsn: int
    table: TableName
    heap: Heap
    range: PageRange
    columns: tuple[typemap.ColumnMapping, ...]
    schema: pa.Schema  # the Parquet schema, with the mirror table's field ids
    location: str  # data file prefix, from the table's location provider
    write: WriteOptions = field(default_factory=WriteOptions)
    statement_timeout_ms: int = 0


@dataclass(frozen=True)
class RangeResult:
    files: tuple[str, ...] = ()
    rows: int = 0
    error: str | None = None  # a definite error; None on success
    snapshot_lost: bool = False  # the error is SnapshotLost: a new exported snapshot would do
    cpu: dict[str, float] = field(default_factory=dict)  # process CPU seconds: read/convert/write


def run_task(task: RangeTask) -> RangeResult:
    """The Spark task body. Definite errors are returned; transient ones raise."""
    try:
        return _copy_range(task)
    except DefiniteError as e:
        return RangeResult(error=str(e), snapshot_lost=isinstance(e, SnapshotLost))


def query(task: RangeTask) -> str:
    """The SELECT of a range: columns ``c<i>`` as :mod:`typemap` reads them, then checks ``k<i>``."""
    items = [sql.SQL("{} AS {}").format(m.select(sql.Identifier(m.name)), sql.Identifier(f"c{i}"))
             for i, m in enumerate(task.columns)]
    items += [sql.SQL("{} AS {}").format(check, sql.Identifier(f"k{i}"))
              for i, check in _checks(task)]
    where = task.range.predicate()
    statement = sql.SQL("SELECT {} FROM ONLY {}").format(sql.SQL(", ").join(items),
                                                         task.heap.name.sql())
    if where is not None:
        statement = sql.SQL("{} WHERE {}").format(statement, where)
    return statement.as_string(None)


def _checks(task: RangeTask) -> list[tuple[int, sql.Composable]]:
    checks = ((i, m.check(sql.Identifier(m.name))) for i, m in enumerate(task.columns))
    return [(i, check) for i, check in checks if check is not None]


def _conninfo(task: RangeTask) -> str:
    params = task.settings.params()
    params["application_name"] = application_name(
        "snapshot", task.ingestion, f"{task.label} pid {os.getpid()}")
    params["options"] = (SESSION_OPTIONS + LONG_RUNNING_OPTIONS
                         + f" -c statement_timeout={task.statement_timeout_ms} -c row_security=off")
    password = password_from_env()
    if password:
        params["password"] = password
    return conninfo.make_conninfo(**params)


def _copy_range(task: RangeTask) -> RangeResult:
    cpu = {"read": 0.0, "convert": 0.0}
    files = _DataFiles(task)
    try:
        with _transaction(task) as cursor:
            cursor.execute(query(task))
            batches = cursor.fetch_record_batch()
            for batch in _timed(batches, cpu, "read"):
                started = time.thread_time()
                converted = _convert(task, batch)
                cpu["convert"] += time.thread_time() - started
                files.write(converted)
            batches.close()
            _check_heap_unchanged(task, cursor)
        written = files.finish()
    except BaseException:
        files.discard()
        raise
    return RangeResult(written, files.rows, cpu={**cpu, "write": files.cpu})


def _timed(batches: pa.RecordBatchReader, cpu: dict[str, float], phase: str) -> Iterator[pa.RecordBatch]:
    while True:
        started = time.thread_time()
        try:
            batch = batches.read_next_batch()
        except StopIteration:
            return
        finally:
            cpu[phase] += time.thread_time() - started
        yield batch


@contextlib.contextmanager
def _transaction(task: RangeTask) -> Iterator:
    """A cursor inside a transaction that imported the snapshot; PostgreSQL errors classified."""
    try:
        with adbc.connect(_conninfo(task), autocommit=True) as conn, conn.cursor() as cursor:
            for statement in import_statements(task.snapshot):
                cursor.execute(statement)
            yield cursor
            cursor.execute("COMMIT")
    except adbc_driver_manager.DatabaseError as e:
        if _snapshot_lost(e):
            raise SnapshotLost(f"the exported snapshot is no longer available "
                               f"({_server_message(e)}): the leader's session ended") from None
        message = _definite_message(task, e)
        if message is None:
            raise
        raise DefiniteError(message) from None


def _server_message(e: adbc_driver_manager.DatabaseError) -> str:
    found = re.search(r"ERROR:\s+(.*)", str(e))
    return found.group(1).strip() if found else str(e).splitlines()[0]


def _definite_message(task: RangeTask, e: adbc_driver_manager.DatabaseError) -> str | None:
    state, said, table = getattr(e, "sqlstate", None) or "", _server_message(e), task.table
    if state in ("42P01", "42703", "42704"):
        return (f"table {table} was dropped or altered during the snapshot ({said}); run the "
                "snapshot again to copy its new definition")
    if state == "42501" and "row-level security" in said:
        return (f"row-level security would hide rows of {table} ({said}); fix: ALTER ROLE "
                f"{task.settings.user} BYPASSRLS, or disable row-level security on the table")
    if state == "42501":
        return f"cannot read {table} ({said}); fix: GRANT SELECT ON the table to {task.settings.user}"
    if state == "57014":
        return (f"statement_timeout canceled the copy of a range of {table} ({said}); raise "
                "snapshot.statementTimeoutSeconds or lower snapshot.targetRangeBytes")
    return None


def _snapshot_lost(e: adbc_driver_manager.DatabaseError) -> bool:
    """Importing the exported snapshot failed because it is gone: PostgreSQL 15 says "invalid
    snapshot identifier" (22023), 18 'snapshot "…" does not exist' (42704)."""
    state, said = getattr(e, "sqlstate", None) or "", _server_message(e)
    return ((state in ("22023", "0A000", "55000") and "snapshot" in said)
            or (state == "42704" and said.startswith('snapshot "')))


def _check_heap_unchanged(task: RangeTask, cursor) -> None:
    cursor.execute(f"SELECT pg_relation_filenode({int(task.heap.oid)})::int8")
    filenode = cursor.fetchone()[0]
    if filenode != task.heap.filenode:
        raise DefiniteError(
            f"{task.heap.name} was rewritten during the snapshot (TRUNCATE, VACUUM FULL, CLUSTER "
            "or a rewriting ALTER TABLE: relfilenode changed), so rows could move between ranges "
            f"or vanish from the snapshot's view; run the snapshot of {task.table} again")


def _convert(task: RangeTask, batch: pa.RecordBatch) -> pa.RecordBatch:
    arrays = []
    for i, mapping in enumerate(task.columns):
        raw = batch.column(i)
        try:
            native = mapping.read is typemap.ReadMode.NATIVE
            values = mapping.from_native(raw) if native else mapping.from_text(raw)
        except typemap.UnmappableValue as e:
            raise DefiniteError(_row_message(task, batch, e.index, str(e))) from None
        if mapping.required and values.null_count:
            row = pc.index(values.is_null(), True).as_py()
            raise DefiniteError(_row_message(task, batch, row, f"key column {mapping.name!r} is "
                                             "NULL; choose key columns that are never NULL"))
        arrays.append(values)
    for offset, (i, _check) in enumerate(_checks(task), start=len(task.columns)):
        flags = pc.fill_null(batch.column(offset), False)
        if pc.any(flags).as_py():
            row = pc.index(flags, True).as_py()
            error = typemap.UnmappableValue(task.columns[i].check_reason(), row,
                                            column=task.columns[i].name)
            raise DefiniteError(_row_message(task, batch, row, str(error)))
    arrays.append(pa.array(np.full(batch.num_rows, task.lsn, np.int64)))
    return pa.RecordBatch.from_arrays(arrays, schema=task.schema)


def _row_message(task: RangeTask, batch: pa.RecordBatch, row: int, what: str) -> str:
    keys = [(m.name, batch.column(i)[row].as_py()) for i, m in enumerate(task.columns) if m.required]
    names = ", ".join(name for name, _ in keys)
    values = ", ".join(str(value) for _, value in keys)
    return f"table {task.table}, row ({names})=({values}): {what}"


class _DataFiles:
    """The Parquet files of one attempt at one range. A writer thread encodes and writes one row
    group while the caller reads the next, so PostgreSQL keeps sending; at most two row groups
    are held (one being written, one filling)."""

    def __init__(self, task: RangeTask) -> None:
        self._task, self._prefix = task, f"{task.location}-{uuid.uuid4().hex[:8]}"
        self.files: list[str] = []
        self.rows = 0
        self.cpu = 0.0  # CPU seconds of the writer thread
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0
        self._stream: pa.NativeFile | None = None  # the open file and its writer, or both None
        self._writer: pq.ParquetWriter | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet")
        self._writing: Future | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        self.rows += batch.num_rows
        if self._pending_bytes >= self._task.write.row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending, self._task.schema)
        self._pending, self._pending_bytes = [], 0
        self._wait()
        self._writing = self._thread.submit(self._write_row_group, table)

    def _wait(self) -> None:
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def _write_row_group(self, table: pa.Table) -> None:
        """Write ``table`` as row groups of about ``row_group_bytes``, starting a new file once
        the current one reaches ``target_file_bytes``."""
        started = time.thread_time()
        options = self._task.write
        rows = max(1, table.num_rows * options.row_group_bytes // max(1, table.nbytes))
        for offset in range(0, table.num_rows, rows):
            if self._writer is None:
                self._open_file()
            assert self._writer is not None and self._stream is not None  # _open_file opened both
            self._writer.write_table(table.slice(offset, rows), row_group_size=rows)
            if self._stream.tell() >= options.target_file_bytes:
                self._close_file()
        self.cpu += time.thread_time() - started

    def _open_file(self) -> None:
        options = self._task.write
        uri = f"{self._prefix}-{len(self.files):05d}.parquet"
        fs, path = filesystem(uri)
        create_parent(fs, path)
        self.files.append(uri)
        self._stream = fs.open_output_stream(path)
        self._writer = pq.ParquetWriter(
            self._stream, self._task.schema, compression=options.compression,
            compression_level=options.compression_level, use_dictionary=False)

    def _close_file(self) -> None:
        if self._writer is not None:
            assert self._stream is not None  # set together with the writer
            self._writer.close()
            self._stream.close()
            self._stream = self._writer = None

    def finish(self) -> tuple[str, ...]:
        self._flush()
        self._wait()
        self._thread.shutdown()
        self._close_file()
        return tuple(self.files)

    def discard(self) -> None:
        with contextlib.suppress(Exception):
            self._wait()
        self._thread.shutdown()
        with contextlib.suppress(Exception):
            self._close_file()
        delete_files(self.files)


def delete_files(uris: list[str] | tuple[str, ...]) -> None:
    """Best-effort removal of data files that will never be committed."""
    for uri in uris:
        with contextlib.suppress(Exception):
            fs, path = filesystem(uri)
            fs.delete_file(path)


def without_password(settings: ConnectionSettings) -> ConnectionSettings:
    return dataclasses.replace(settings, password=None)
