"""Is the mirror equal to the source? Two checks, both over every replicated column of every row.

The expected content of a mirror table is the source table's rows, every replicated column,
each value converted by the one type mapping (:mod:`lakeslot.typemap`) from its PostgreSQL text
form — exactly the path a streamed change takes. The source is read in a session with lakeslot's
settings (UTC, ISO dates, full float precision); the mirror is read with pyiceberg (no Spark,
none of the apply job's code) and cast to the same Arrow types.

**The exact check** (:func:`verify`, ``lakeslot verify``): equality at one LSN while the source
is being written and the pipeline runs. One round:

1. A source snapshot with a known LSN ``P`` — the snapshot leader's own method
   (:func:`lakeslot.snapshot.leader.exported_snapshot`: a temporary slot created with
   USE_SNAPSHOT, ``P = consistent point − 1``: exactly the transactions committed at or below
   ``P`` are visible). Each table is read in a session that imported it.
2. The mirror: wait (up to ``timeout``) until the table has an Iceberg snapshot whose
   ``lakeslot.lsn`` is ``≥ P``, and read the first such snapshot (time travel); its position is
   ``L``. By DESIGN.md invariant 1 the mirror there must equal the source as of ``L``.
3. Staging: the keys of the table that transactions with a commit LSN in ``(P, L]`` changed
   (new and old tuples; a TRUNCATE makes the whole table in flight). Every other key has the
   same content in the source at ``P`` and at ``L``, so for it ``source@P ≠ mirror@L`` is a real
   divergence — no false alarm, and nothing the mirror got wrong there is missed. If the table's
   definition or storage changed after ``P`` (DDL, TRUNCATE, a rewrite: the catalog as of ``P``
   differs from the catalog after ``L`` was chosen), the whole table is in flight.
4. The changed ("in-flight") keys are checked again in the next round with a fresh ``P``, only
   those keys; keys still changing after the last round are reported as not compared (changing
   continuously), never as a difference.

Segments may be deleted by retention as soon as every table applied them, so a watcher copies
each segment that appears in staging while the check runs (:class:`SegmentCache`); a segment
that existed before the check started ends at or below every ``P`` (its end was a WAL position
already written then) and is not needed. If staging does not cover ``(P, L]`` after all, the
round decides nothing for that table and the next one tries again.

Per table the result lists missing rows (in the source, not in the mirror), extra rows (in the
mirror, not in the source) and differing rows by key, with counts; a key held by more rows on
one side than on the other counts as missing or extra.

Limits: a pipeline must be running (the mirror must reach ``P``); a key that changes in every
round is not compared; the first round holds each whole table of both sides in memory (Arrow),
one table at a time, later rounds only the in-flight keys (the mirror side pruned by key for a
single integer or text key only). Which keys are in flight comes from staging, the pipeline's
own record of the changes: a change the reader lost inside ``(P, L]`` leaves that key looking
equal in that round (the mirror still matches the source at ``P`` there), and shows as a
difference in any later check, whose snapshot is past it.

**The quiet-source check** (:func:`compare`, used by the demo and tests after a run has caught
up and stopped): one ``REPEATABLE READ`` transaction and the mirror's current state, compared by
row counts and full-content checksums (SHA-256 of each row's Python values in key order); the
first differing key is reported. Only meaningful when the source no longer changes.

Scope: any ``sink.catalog`` pyiceberg can read (:func:`lakeslot.mirror.catalogs.load_table`);
:func:`compare` reads hadoop catalogs only.

Failure modes: a missing mirror table counts as 0 rows (:func:`compare`) or as "behind"
(:func:`verify`); a source value that has no mapping raises
:class:`lakeslot.typemap.UnmappableValue` (the snapshot would have failed that table too);
connection and storage errors propagate (``lakeslot verify`` reports them, exit 1).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql
from pyarrow import fs as pafs
from pyiceberg.expressions import In
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot as IcebergSnapshot
from pyiceberg.table.snapshots import ancestors_of

from lakeslot import lsn as lsnlib
from lakeslot import typemap
from lakeslot.api.models import PostgresIngestion
from lakeslot.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from lakeslot.local.config import Local
from lakeslot.mirror import catalogs
from lakeslot.mirror.contract import LSN_PROPERTY, apply_error
from lakeslot.snapshot.leader import exported_snapshot, import_statements
from lakeslot.source.columns import DescribeError, describe
from lakeslot.source.connection import ConnectionSettings, application_name, connect
from lakeslot.source.tables import TableName, existing, selected
from lakeslot.staging.format import CHANGE_OPS, GapError, Segment, SegmentName, chain
from lakeslot.staging.store import Staging
from lakeslot.workloads import JobInput

log = logging.getLogger(__name__)

FETCH_ROWS = 50_000
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_ROUNDS = 3
LISTED_KEYS = 20  # keys listed per kind of difference (the counts are always complete)
POLL_S = 0.5  # how often the mirror's position is read while waiting
SEGMENT_POLL_S = 0.1  # how often staging is listed for new segments


@dataclass(frozen=True)
class TableCheck:
    table: TableName
    source_rows: int
    mirror_rows: int
    source_checksum: str
    mirror_checksum: str
    first_difference: str | None = None

    @property
    def equal(self) -> bool:
        return (self.source_rows, self.source_checksum) == (self.mirror_rows, self.mirror_checksum)


def checksum(table: pa.Table, keys: list[str]) -> str:
    """SHA-256 over the rows sorted by ``keys``, each row as the tuple of its Python values."""
    digest = hashlib.sha256()
    ordered = table.sort_by([(k, "ascending") for k in keys]) if table.num_rows else table
    for batch in ordered.to_batches(FETCH_ROWS):
        for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            digest.update(repr(row).encode())
    return digest.hexdigest()[:16]


def _first_difference(source: pa.Table, copy: pa.Table, keys: list[str]) -> str | None:
    def rows(t: pa.Table) -> dict:
        ordered = t.sort_by([(k, "ascending") for k in keys]) if t.num_rows else t
        return {tuple(r[k] for k in keys): r for r in ordered.to_pylist()}

    left, right = rows(source), rows(copy)
    for key in sorted(set(left) | set(right), key=repr):
        if left.get(key) != right.get(key):
            return f"key {key}: source {left.get(key)} ≠ mirror {right.get(key)}"
    return None


def _expected(conn, table: TableName, columns: tuple[typemap.ColumnMapping, ...],
              where: sql.Composable | None = None, params: tuple = ()) -> pa.Table:
    """The source rows as the mirror should hold them (text form → the one mapping), all of
    them or those ``where`` selects."""
    select = sql.SQL(", ").join(
        sql.SQL("{}({})::text").format(sql.Identifier(*c.pg.output), sql.Identifier(c.name))
        for c in columns)
    texts: list[list[str | None]] = [[] for _ in columns]
    with conn.cursor(name="lakeslot_verify") as cursor:
        cursor.itersize = FETCH_ROWS
        cursor.execute(sql.SQL("SELECT {} FROM {} {}").format(select, table.sql(),
                                                              where or sql.SQL("")), params)
        for row in cursor:
            for i, value in enumerate(row):
                texts[i].append(value)
    return pa.table({c.name: c.from_text(pa.array(values, pa.string()))
                     for c, values in zip(columns, texts, strict=True)})


def _mirror(job: JobInput, table: TableName, columns: tuple[typemap.ColumnMapping, ...],
            secrets: Mapping[str, str] | None) -> pa.Table | None:
    loaded = catalogs.load_table(job.ingestion.spec.sink.catalog,
                                 job.names.mirror_identifier(table), secrets)
    if loaded is None or loaded.current_snapshot() is None:
        return None
    data = loaded.scan(selected_fields=tuple(c.name for c in columns)).to_arrow()
    return pa.table({c.name: data[c.name].cast(c.arrow) for c in columns})


def compare(ingestion: PostgresIngestion, settings: ConnectionSettings,
            tables: list[TableName], *,
            secrets: Mapping[str, str] | None = None) -> list[TableCheck]:
    """Check each of ``tables`` on a quiet source; ``secrets``: the catalog's Secret-backed
    properties."""
    if ingestion.spec.sink.catalog.type != "hadoop":
        raise ValueError("verify reads hadoop catalogs only (sink.catalog.type: hadoop)")
    job = JobInput(ingestion, tuple(tables))
    checks = []
    owner = job.names.owner
    with connect(settings, application_name("verify", owner), long_running=True,
                 autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        oids = existing(conn, tables)
        for table in tables:
            options, oid = job.table_spec(table), oids.get(table)
            if oid is None:
                raise ValueError(f"table {table} does not exist (dropped, renamed, or not a table)")
            try:
                columns = describe(conn, oid,
                                   key_columns=options.key_columns if options else (),
                                   exclude_columns=options.exclude_columns if options else (),
                                   text_columns=options.text_columns if options else ())
            except (typemap.MappingError, DescribeError) as e:
                raise ValueError(f"table {table}: {e}") from None
            keys = [c.name for c in columns if c.required] or [c.name for c in columns]
            source = _expected(conn, table, columns)
            copy = _mirror(job, table, columns, secrets)
            source_sum = checksum(source, keys)
            if copy is None:
                checks.append(TableCheck(table, source.num_rows, 0, source_sum, "-",
                                         "the mirror table has no snapshot"))
                continue
            mirror_sum = checksum(copy, keys)
            difference = None if (source.num_rows, source_sum) == (copy.num_rows, mirror_sum) \
                else _first_difference(source, copy, keys)
            checks.append(TableCheck(table, source.num_rows, copy.num_rows, source_sum,
                                     mirror_sum, difference))
        conn.rollback()
    return checks


def render(checks: list[TableCheck]) -> list[str]:
    rows = [("table", "source rows", "iceberg rows", "source checksum", "iceberg checksum", "")]
    rows += [(str(c.table), f"{c.source_rows:,}", f"{c.mirror_rows:,}", c.source_checksum,
              c.mirror_checksum, "equal" if c.equal else "DIFFERENT") for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines += [f"  {c.table}: {c.first_difference}" for c in checks if c.first_difference]
    return lines


# the exact check: results --------------------------------------------------------------------

@dataclass
class Keys:
    """How many keys of one kind, and the first :data:`LISTED_KEYS` of them (``{column: value}``;
    for differing rows also ``columns``: ``{column: [source value, mirror value]}``)."""

    count: int = 0
    listed: list[dict] = field(default_factory=list)

    def add(self, entries: list[dict], count: int | None = None) -> None:
        self.count += len(entries) if count is None else count
        self.listed.extend(entries[:max(0, LISTED_KEYS - len(self.listed))])


@dataclass(frozen=True)
class Round:
    number: int
    source_lsn: int  # P: the source snapshot
    mirror_lsn: int | None  # L: lakeslot.lsn of the mirror snapshot read (None: not reached)
    compared: int  # keys whose comparison this round settled
    in_flight: int | None  # keys changed in (P, L] among those read (None: the whole table)
    note: str = ""  # why the round settled nothing, if it did not


@dataclass
class TableResult:
    table: TableName
    source_rows: int | None = None  # in the source at the first round's P
    mirror_rows: int | None = None  # in the mirror at the first round's L
    compared: int = 0  # keys compared and settled (equal or not), over all rounds
    missing: Keys = field(default_factory=Keys)  # in the source, not in the mirror
    extra: Keys = field(default_factory=Keys)  # in the mirror, not in the source
    differing: Keys = field(default_factory=Keys)
    not_compared: Keys = field(default_factory=Keys)  # still in flight after the last round
    not_compared_reason: str | None = None  # why, when not simply changing continuously
    lacking_columns: list[str] = field(default_factory=list)  # source columns the mirror lacks
    problem: str | None = None  # why the check could not complete (or the columns differ)
    rounds: list[Round] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return self.missing.count + self.extra.count + self.differing.count

    @property
    def result(self) -> str:
        """``equal``, ``different`` (rows differ, or the mirror lacks source columns) or
        ``incomplete`` (the check could not finish: the reason is ``problem``). Keys that were
        still changing after the last round are listed, not counted against equality."""
        if self.differences or self.lacking_columns:
            return "different"
        return "incomplete" if self.problem else "equal"


@dataclass(frozen=True)
class Verification:
    tables: list[TableResult]

    @property
    def equal(self) -> bool:
        return all(t.result == "equal" for t in self.tables)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.equal else EXIT_FAILED


# the exact check: staging --------------------------------------------------------------------

class SegmentCache:
    """Local copies of the sealed segments that appear in staging while a check runs, so that
    retention (which may delete a segment once every table applied it) cannot take away the
    changes of ``(P, L]`` before they are read. Segments present when the cache starts are not
    copied: they end at or below every later snapshot's ``P`` (see the module docstring) and are
    read from staging if ever asked for. Use as a context manager: a thread polls staging."""

    def __init__(self, staging_uri: str, interval: float = SEGMENT_POLL_S) -> None:
        self.staging = Staging(staging_uri)
        self._directory = tempfile.TemporaryDirectory(prefix="lakeslot-verify-")
        self.copies = Staging(self._directory.name)
        self._initial = set(self.staging.list())
        self._copied: set[SegmentName] = set()
        self._floor = 0  # segments ending at or below it are no longer needed
        self._interval = interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="verify-segments", daemon=True)

    def __enter__(self) -> SegmentCache:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._directory.cleanup()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except OSError as e:  # staging briefly unreachable: a gap is detected when reading
                log.warning("listing staging failed: %s", e)

    def need_above(self, position: int) -> None:
        """From now on only segments with commits above ``position`` are needed."""
        with self._lock:
            self._floor = max(self._floor, position + 1)
            for name in [n for n in self._copied if n.end <= self._floor]:
                self._copied.discard(name)
                os.unlink(f"{self.copies.path}/{name.filename}")

    def poll(self) -> None:
        """Copy every new segment that may still be needed."""
        with self._lock:
            for name in self.staging.list():
                if name in self._initial or name in self._copied or name.end <= self._floor:
                    continue
                final = f"{self.copies.path}/{name.filename}"
                partial = f"{self.copies.path}/.partial-{name.filename}"
                try:
                    pafs.copy_files(f"{self.staging.path}/{name.filename}", partial,
                                    source_filesystem=self.staging.fs,
                                    destination_filesystem=pafs.LocalFileSystem())
                except OSError:  # deleted by retention first: reading (P, L] will see the gap
                    continue
                os.replace(partial, final)
                self._copied.add(name)

    def changes(self, table: TableName, low: int, high: int) -> list[Segment] | str:
        """The segments with the changes of ``table`` committed in ``(low, high]``, each
        holding only those rows; or why staging does not cover that range."""
        self.poll()
        with self._lock:
            copied = set(self._copied)
        staged = set(self.staging.list())
        try:
            names = [n for n in chain(sorted(copied | staged), low + 1) if n.start <= high]
        except GapError as e:
            return f"staging does not cover {_range(low, high)}: {e}"
        if not names or names[0].start > low + 1 or names[-1].end <= high:
            return f"staging does not cover {_range(low, high)} (segments already deleted)"
        try:
            return list(self._read(names, table, low, high, copied))
        except OSError as e:  # a staged segment deleted by retention since it was listed
            return f"staging does not cover {_range(low, high)}: {e}"

    def _read(self, names: list[SegmentName], table: TableName, low: int, high: int,
              copied: set[SegmentName]) -> Iterator[Segment]:
        floor = 0  # rows of a zombie's overlapping segment below the previous end: already read
        for name in names:
            segment = (self.copies if name in copied else self.staging).read(name)
            rows = segment.table
            commit = rows["commit_lsn"]
            mask = pc.and_(pc.and_(pc.equal(rows["schema"], table.schema),
                                   pc.equal(rows["table"], table.name)),
                           pc.and_(pc.greater(commit, max(low, floor - 1)),
                                   pc.less_equal(commit, high)))
            yield Segment(segment.metadata, rows.filter(pc.fill_null(mask, False)))
            floor = name.end


def _range(low: int, high: int) -> str:
    return f"({lsnlib.format(low)}, {lsnlib.format(high)}]"


@dataclass(frozen=True)
class InFlight:
    """The keys changed in ``(P, L]``: ``keys`` (repr of the mapped key → the key), or ``whole``
    (why the whole table is in flight)."""

    keys: dict[str, ChangedKey]
    whole: str | None = None


@dataclass(frozen=True, order=True)
class ChangedKey:
    values: tuple  # mapped like the rows' keys
    texts: tuple[str, ...]  # PostgreSQL text forms (how the source is asked for the row)


def changed_keys(segments: Iterable[Segment], columns: tuple[typemap.ColumnMapping, ...]
                 ) -> InFlight:
    """The keys that the changes in ``segments`` touched, from new and old tuples, mapped like
    the rows (so they compare with the rows' keys); a TRUNCATE, or a change that does not carry
    its key, puts the whole table in flight."""
    key_columns = [c for c in columns if c.required]
    names = [c.name for c in key_columns]
    texts: list[tuple] = []
    for segment in segments:
        for row in segment.rows():
            if row.op == "T":
                return InFlight({}, f"truncated at {lsnlib.format(row.commit_lsn)}")
            if row.op not in CHANGE_OPS:
                continue
            tuples = ([row.new] if row.op in "IU" else []) + ([row.old] if row.op in "UD" else [])
            for values in tuples:
                if values is None and row.op == "U":
                    continue  # no old tuple: the key did not change
                key = tuple((values or {}).get(n) for n in names)
                if not all(isinstance(v, str) for v in key):
                    return InFlight({}, f"a change at {lsnlib.format(row.commit_lsn)} does not "
                                        "carry its key")
                texts.append(key)
    if not texts:
        return InFlight({})
    try:
        mapped = [c.from_text([t[i] for t in texts]).to_pylist() for i, c in enumerate(key_columns)]
    except typemap.UnmappableValue as e:
        return InFlight({}, f"a changed key cannot be mapped: {e}")
    return InFlight({repr(tuple(k)): ChangedKey(tuple(k), t)
                     for k, t in zip(zip(*mapped, strict=True), texts, strict=True)})


# the exact check: source and mirror ----------------------------------------------------------

_FINGERPRINT = """
WITH RECURSIVE tree(relid) AS (
    SELECT %(oid)s::oid
    UNION ALL
    SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)
SELECT (SELECT array_agg(c.oid::int8 || ':' || c.relfilenode::int8 || ':' || c.relkind::text
                         ORDER BY c.oid)
          FROM tree JOIN pg_class c ON c.oid = tree.relid),
       (SELECT array_agg(a.attname || ':' || a.atttypid::int8 || ':' || a.atttypmod
                         ORDER BY a.attnum)
          FROM pg_attribute a
         WHERE a.attrelid = %(oid)s::oid AND a.attnum > 0 AND NOT a.attisdropped)
"""


def _fingerprint(conn: psycopg.Connection, oid: int) -> tuple:
    """The table's definition and storage (partitions, relfilenodes, columns) as the session's
    snapshot sees the catalog: it differs after DDL, TRUNCATE or a rewrite (which would also
    hide rows from an older snapshot: rewrites are not MVCC-safe)."""
    row = conn.execute(_FINGERPRINT, {"oid": oid}).fetchone()
    return tuple(row) if row is not None else ()


def _source_rows(conn: psycopg.Connection, table: TableName,
                 columns: tuple[typemap.ColumnMapping, ...],
                 keys: dict[str, ChangedKey] | None) -> pa.Table:
    """All rows, or those with the given keys (text forms, turned into the key columns' types by
    the server: ``json_populate_recordset`` over the table's row type)."""
    if keys is None:
        return _expected(conn, table, columns)
    names = [c.name for c in columns if c.required]
    if not keys:
        return _expected(conn, table, columns, sql.SQL("WHERE false"))
    where = sql.SQL("WHERE ({}) IN (SELECT {} FROM json_populate_recordset(NULL::{}, %s::json) AS k)"
                    ).format(sql.SQL(", ").join(sql.Identifier(n) for n in names),
                             sql.SQL(", ").join(sql.Identifier("k", n) for n in names),
                             table.sql())
    document = json.dumps([dict(zip(names, k.texts, strict=True)) for k in keys.values()])
    return _expected(conn, table, columns, where, (document,))


def _position(snapshot: IcebergSnapshot) -> int | None:
    value = snapshot.summary.get(LSN_PROPERTY) if snapshot.summary is not None else None
    return int(value) if value is not None else None


def first_snapshot_at(table: IcebergTable, position: int) -> IcebergSnapshot | None:
    """The first snapshot (in commit order, among the current snapshot's ancestors) whose
    ``lakeslot.lsn`` is at or above ``position``."""
    ancestry = list(ancestors_of(table.current_snapshot(), table.metadata))
    return next((s for s in reversed(ancestry) if _at_or_above(_position(s), position)), None)


def _at_or_above(lsn: int | None, position: int) -> bool:
    return lsn is not None and lsn >= position


@dataclass(frozen=True)
class _Reached:
    table: IcebergTable
    snapshot: IcebergSnapshot
    lsn: int


def _wait_for_mirror(job: JobInput, table: TableName, position: int, deadline: float,
                     secrets: Mapping[str, str] | None, timeout: float,
                     say: Callable[[str], None]) -> _Reached | str:
    """The first mirror snapshot at or above ``position``, once there is one; or, at the
    deadline or when the apply job stopped the table, why not."""
    said = False
    current: int | None = None
    while True:
        try:
            loaded = catalogs.load_table(job.ingestion.spec.sink.catalog,
                                         job.names.mirror_identifier(table), secrets)
        except OSError as e:  # a metadata file replaced while read: try again
            log.debug("reading the mirror of %s: %s", table, e)
            loaded = None
        if loaded is not None:
            snapshot = first_snapshot_at(loaded, position)
            if snapshot is not None:
                lsn = _position(snapshot)
                assert lsn is not None  # first_snapshot_at chose it by its position
                return _Reached(loaded, snapshot, lsn)
            head = loaded.current_snapshot()
            current = _position(head) if head is not None else None
            stopped = apply_error(loaded.properties, current)
            if stopped:
                return f"the apply job stopped this table at {_lsn(current)}: {stopped}"
        if time.monotonic() >= deadline:
            if current is None:
                return (f"the mirror table has no lakeslot snapshot yet after waiting {timeout:.0f} s "
                        "(is the snapshot running: lakeslot run, or the operator?)")
            return (f"the mirror is behind: at {lsnlib.format(current)}, "
                    f"{_bytes(position - current)} behind the source snapshot at "
                    f"{lsnlib.format(position)} after waiting {timeout:.0f} s; verify needs a "
                    "running pipeline (lakeslot run, or the operator's apply job) that reaches it")
        if not said:
            say(f"  waiting for the mirror of {table} to reach {lsnlib.format(position)} "
                f"(at {_lsn(current)})")
            said = True
        time.sleep(POLL_S)


def _lsn(value: int | None) -> str:
    return lsnlib.format(value) if value is not None else "-"


def _bytes(n: int) -> str:
    from lakeslot.local.display import human_bytes

    return human_bytes(n)


def _mirror_rows(reached: _Reached, columns: tuple[typemap.ColumnMapping, ...],
                 keys: dict[str, ChangedKey] | None) -> pa.Table | list[str]:
    """The mirror's rows at the chosen snapshot (pruned to ``keys`` where pyiceberg can: one
    integer or text key column), or the source columns it lacks."""
    snapshot = reached.snapshot
    schema = reached.table.schemas().get(snapshot.schema_id) if snapshot.schema_id is not None \
        else None
    schema = schema or reached.table.schema()
    present = {f.name for f in schema.fields}
    lacking = [c.name for c in columns if c.name not in present]
    if lacking:
        return lacking
    scan: dict[str, Any] = {"snapshot_id": snapshot.snapshot_id,
                            "selected_fields": tuple(c.name for c in columns)}
    key_columns = [c for c in columns if c.required]
    if keys is not None and len(key_columns) == 1 and (
            pa.types.is_integer(key_columns[0].arrow) or pa.types.is_string(key_columns[0].arrow)):
        values = [k.values[0] for k in keys.values()]
        if not values:
            return pa.table({c.name: pa.array([], c.arrow) for c in columns})
        scan["row_filter"] = In(term=key_columns[0].name, literals=values)
    data = reached.table.scan(**scan).to_arrow()
    return pa.table({c.name: data[c.name].cast(c.arrow) for c in columns})


# the exact check: comparing ------------------------------------------------------------------

@dataclass(frozen=True)
class _Side:
    rows: pa.Table  # sorted by key where Arrow can sort the key's types
    table: pa.Table  # k: repr of the mapped key, h: digest of the row, i: row number in ``rows``


def _side(rows: pa.Table, key_names: list[str]) -> _Side:
    if rows.num_rows:
        # A key type Arrow cannot sort: listed keys then come in source order.
        with contextlib.suppress(pa.ArrowNotImplementedError, pa.ArrowTypeError):
            rows = rows.sort_by([(k, "ascending") for k in key_names])
    where = [rows.column_names.index(k) for k in key_names]
    keys: list[str] = []
    digests: list[bytes] = []
    for batch in rows.to_batches(FETCH_ROWS):
        for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            keys.append(repr(tuple(row[i] for i in where)))
            digests.append(hashlib.blake2b(repr(row).encode(), digest_size=16).digest())
    return _Side(rows, pa.table({"k": pa.array(keys, pa.string()),
                                 "h": pa.array(digests, pa.binary(16)),
                                 "i": pa.array(range(len(keys)), pa.int64())}))


@dataclass
class _Diff:
    compared: int = 0
    missing: list[int] = field(default_factory=list)  # rows of the source side
    extra: list[int] = field(default_factory=list)  # rows of the mirror side
    differing: list[tuple[int, int]] = field(default_factory=list)  # (source row, mirror row)
    missing_count: int = 0
    extra_count: int = 0
    differing_count: int = 0


def _diff(source: _Side, mirror: _Side, in_flight: set[str], scope: set[str] | None) -> _Diff:
    """Compare the rows whose key is in ``scope`` (None: all) and not in flight."""
    s, m = source.table, mirror.table
    if scope is not None:
        allowed = pa.array(sorted(scope), pa.string())
        s = s.filter(pc.is_in(s["k"], value_set=allowed))
        m = m.filter(pc.is_in(m["k"], value_set=allowed))
    if in_flight:
        skipped = pa.array(sorted(in_flight), pa.string())
        s = s.filter(pc.invert(pc.is_in(s["k"], value_set=skipped)))
        m = m.filter(pc.invert(pc.is_in(m["k"], value_set=skipped)))
    duplicated = _duplicated(s) | _duplicated(m)
    result = _Diff()
    if duplicated:
        result = _diff_duplicated(s, m, duplicated)
        doubled = pa.array(sorted(duplicated), pa.string())
        s = s.filter(pc.invert(pc.is_in(s["k"], value_set=doubled)))
        m = m.filter(pc.invert(pc.is_in(m["k"], value_set=doubled)))
    joined = s.join(m, keys="k", join_type="full outer", left_suffix="_s", right_suffix="_m")
    missing = joined.filter(pc.is_null(joined["h_m"])).sort_by("i_s")
    extra = joined.filter(pc.is_null(joined["h_s"])).sort_by("i_m")
    both = joined.filter(pc.and_(pc.is_valid(joined["h_s"]), pc.is_valid(joined["h_m"])))
    differing = both.filter(pc.not_equal(both["h_s"], both["h_m"])).sort_by("i_s")
    result.compared += joined.num_rows
    result.missing_count += missing.num_rows
    result.extra_count += extra.num_rows
    result.differing_count += differing.num_rows
    result.missing += missing["i_s"].to_pylist()[:LISTED_KEYS]
    result.extra += extra["i_m"].to_pylist()[:LISTED_KEYS]
    result.differing += list(zip(differing["i_s"].to_pylist()[:LISTED_KEYS],
                                 differing["i_m"].to_pylist()[:LISTED_KEYS], strict=True))
    return result


def _duplicated(side: pa.Table) -> set[str]:
    if side.num_rows == pc.count_distinct(side["k"]).as_py():
        return set()
    counts = side.group_by("k").aggregate([("k", "count")])
    return set(counts.filter(pc.greater(counts["k_count"], 1))["k"].to_pylist())


def _diff_duplicated(s: pa.Table, m: pa.Table, keys: set[str]) -> _Diff:
    """Keys held by more than one row on a side: more rows in the source is missing, more in
    the mirror extra, as many on both sides but other content differing."""
    def rows(side: pa.Table) -> dict[str, list[tuple[bytes, int]]]:
        found: dict[str, list[tuple[bytes, int]]] = {}
        for k, h, i in zip(*(side[c].to_pylist() for c in ("k", "h", "i")), strict=True):
            if k in keys:
                found.setdefault(k, []).append((h, i))
        return found

    left, right = rows(s), rows(m)
    result = _Diff(compared=len(keys))
    for key in sorted(keys):
        a, b = sorted(left.get(key, [])), sorted(right.get(key, []))
        if len(a) > len(b):
            result.missing_count += 1
            result.missing.append(a[0][1])
        elif len(b) > len(a):
            result.extra_count += 1
            result.extra.append(b[0][1])
        elif [h for h, _ in a] != [h for h, _ in b]:
            result.differing_count += 1
            result.differing.append((a[0][1], b[0][1]))
    return result


def plain(value: object) -> object:
    """A value for JSON and text output: numbers, strings, booleans and None as they are (NaN
    and infinities as text), lists element-wise, bytes as PostgreSQL's hex form, else ``str``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return str(value)


def _key_of(rows: pa.Table, index: int, key_names: list[str]) -> dict:
    row = rows.slice(index, 1).to_pylist()[0]
    return {k: plain(row[k]) for k in key_names}


def _differing_entry(source: pa.Table, mirror: pa.Table, pair: tuple[int, int],
                     key_names: list[str]) -> dict:
    a, b = source.slice(pair[0], 1).to_pylist()[0], mirror.slice(pair[1], 1).to_pylist()[0]
    return {"key": {k: plain(a[k]) for k in key_names},
            "columns": {c: [plain(a[c]), plain(b[c])] for c in a if repr(a[c]) != repr(b[c])}}


# the exact check: rounds ---------------------------------------------------------------------

@dataclass
class _TableState:
    result: TableResult
    pending: dict[str, ChangedKey] | None = None  # keys to check (None: the whole table)
    pending_reason: str | None = None  # why the whole table is pending
    key_names: list[str] | None = None
    done: bool = False


def verify(ingestion: PostgresIngestion, settings: ConnectionSettings, tables: list[TableName],
           *, secrets: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S,
           rounds: int = DEFAULT_ROUNDS, say: Callable[[str], None] = lambda text: None
           ) -> Verification:
    """The exact check of ``tables`` (see the module docstring); ``secrets``: the catalog's
    Secret-backed properties; ``timeout``: the longest wait for the mirror in each round;
    ``say``: progress lines for a person."""
    job = JobInput(ingestion, tuple(tables))
    app = application_name("verify", job.names.owner)
    states = [_TableState(TableResult(t)) for t in tables]
    with SegmentCache(ingestion.spec.staging.uri) as cache, connect(settings, app) as now:
        check = _Check(job, cache, now, secrets, timeout, say)
        for number in range(1, rounds + 1):
            active = [s for s in states if not s.done]
            if not active:
                break
            with exported_snapshot(settings, app) as snapshot:
                cache.need_above(snapshot.lsn)
                say(f"round {number}: source snapshot at {lsnlib.format(snapshot.lsn)}, "
                    f"{len(active)} table(s)")
                deadline = time.monotonic() + timeout
                with connect(settings, app, long_running=True) as conn:
                    for statement in import_statements(snapshot.name):
                        conn.execute(statement)
                    oids = existing(conn, [s.result.table for s in active])
                    for state in active:
                        check.round(state, number, snapshot.lsn, conn,
                                    oids.get(state.result.table), deadline)
                    conn.execute("COMMIT")
    for state in states:
        if not state.done:
            _left_over(state)
    return Verification([s.result for s in states])


def _left_over(state: _TableState) -> None:
    """What the last round left in flight: keys are listed as not compared; a whole table in
    flight means the check could not complete for it."""
    result = state.result
    note = result.rounds[-1].note if result.rounds else ""
    if state.pending is None:
        result.problem = ("not compared after the last round: "
                          + (state.pending_reason or note or "the whole table kept changing"))
        return
    names = state.key_names or []
    result.not_compared.add([{n: plain(v) for n, v in zip(names, k.values, strict=True)}
                             for k in sorted(state.pending.values(), key=repr)])
    result.not_compared_reason = note or None


@dataclass(frozen=True)
class _Check:
    """What every round of every table uses."""

    job: JobInput
    cache: SegmentCache
    now: psycopg.Connection  # autocommit: the catalog as it is now
    secrets: Mapping[str, str] | None
    timeout: float
    say: Callable[[str], None]

    def round(self, state: _TableState, number: int, position: int, conn: psycopg.Connection,
              oid: int | None, deadline: float) -> None:
        """One round of one table (``conn`` holds the snapshot at ``position``): settle what
        it can, leave the in-flight keys pending."""
        result, table = state.result, state.result.table

        def stop(problem: str, mirror_lsn: int | None = None) -> None:
            result.rounds.append(Round(number, position, mirror_lsn, 0, None, problem))
            result.problem, state.done = problem, True

        if oid is None:
            return stop("the table does not exist in the source as of the snapshot "
                        f"{lsnlib.format(position)}")
        options = self.job.table_spec(table)
        try:
            columns = describe(conn, oid, key_columns=options.key_columns if options else (),
                               exclude_columns=options.exclude_columns if options else (),
                               text_columns=options.text_columns if options else ())
        except (typemap.MappingError, DescribeError) as e:
            return stop(f"the table cannot be mirrored as configured: {e}")
        key_names = [c.name for c in columns if c.required]
        if state.key_names not in (None, key_names):
            state.pending = None  # the key changed: compare everything again
        state.key_names = key_names
        before = _fingerprint(conn, oid)
        source = _source_rows(conn, table, columns, state.pending)
        reached = _wait_for_mirror(self.job, table, position, deadline, self.secrets,
                                   self.timeout, self.say)
        if isinstance(reached, str):
            return stop(reached)

        def undecided(note: str, whole: str | None = None) -> None:
            result.rounds.append(Round(number, position, reached.lsn, 0, None, note))
            if whole is not None:
                state.pending, state.pending_reason = None, whole

        if _fingerprint(self.now, oid) != before:
            reason = ("its definition or storage changed after the snapshot (DDL, TRUNCATE or "
                      "a rewrite)")
            return undecided(reason, reason)
        mirror = _mirror_rows(reached, columns, state.pending)
        if isinstance(mirror, list):
            result.lacking_columns = mirror
            return stop(f"the mirror lacks the source columns {mirror} at "
                        f"{lsnlib.format(reached.lsn)}", reached.lsn)
        if state.pending is None:
            result.source_rows, result.mirror_rows = source.num_rows, mirror.num_rows
        segments = self.cache.changes(table, position, reached.lsn)
        if isinstance(segments, str):
            return undecided(segments)
        flight = changed_keys(segments, columns)
        if flight.whole is not None:
            return undecided(f"the whole table is in flight: {flight.whole}", flight.whole)
        scope = set(state.pending) if state.pending is not None else None
        in_flight = {k: v for k, v in flight.keys.items() if scope is None or k in scope}
        a, b = _side(source, key_names), _side(mirror, key_names)
        diff = _diff(a, b, set(in_flight), scope)
        result.compared += diff.compared
        result.missing.add([_key_of(a.rows, i, key_names) for i in diff.missing],
                           diff.missing_count)
        result.extra.add([_key_of(b.rows, i, key_names) for i in diff.extra], diff.extra_count)
        result.differing.add([_differing_entry(a.rows, b.rows, pair, key_names)
                              for pair in diff.differing], diff.differing_count)
        result.rounds.append(Round(number, position, reached.lsn, diff.compared, len(in_flight)))
        state.pending, state.pending_reason = in_flight, None
        state.done = not in_flight
        return None


# the exact check: output and the command -----------------------------------------------------

def to_document(verification: Verification) -> dict:
    """The JSON output of ``lakeslot verify -o json``."""
    def keys(k: Keys) -> dict:
        return {"count": k.count, "keys": k.listed}

    return {
        "equal": verification.equal,
        "tables": [{
            "schema": t.table.schema, "name": t.table.name, "table": str(t.table),
            "result": t.result, "problem": t.problem,
            "rowsCompared": t.compared, "sourceRows": t.source_rows, "mirrorRows": t.mirror_rows,
            "missing": keys(t.missing), "extra": keys(t.extra), "differing": keys(t.differing),
            "notCompared": {**keys(t.not_compared), "reason": _not_compared_reason(t)},
            "lackingColumns": t.lacking_columns,
            "rounds": [{"round": r.number, "sourceLsn": lsnlib.format(r.source_lsn),
                        "mirrorLsn": _lsn(r.mirror_lsn) if r.mirror_lsn is not None else None,
                        "compared": r.compared, "inFlight": r.in_flight, "note": r.note or None}
                       for r in t.rounds],
        } for t in verification.tables],
    }


def _not_compared_reason(t: TableResult) -> str | None:
    if not t.not_compared.count:
        return None
    return t.not_compared_reason or "changing continuously"


def _key_text(key: dict) -> str:
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in key.items())


def _short(value: object, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[:width - 1] + "…"


def render_text(verification: Verification) -> list[str]:
    """The text output of ``lakeslot verify``: a table per source table, then the keys."""
    header = ("table", "result", "rows compared", "missing", "extra", "differing", "not compared")
    rows = [header] + [
        (str(t.table), t.result.upper() if t.result != "equal" else "equal", f"{t.compared:,}",
         f"{t.missing.count:,}", f"{t.extra.count:,}", f"{t.differing.count:,}",
         f"{t.not_compared.count:,}")
        for t in verification.tables]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(r, widths, strict=True))).rstrip()
             for r in rows]
    for t in verification.tables:
        details = []
        if t.rounds:
            first, last = t.rounds[0], t.rounds[-1]
            details.append(f"  source snapshot {lsnlib.format(first.source_lsn)}, mirror at "
                           f"{_lsn(first.mirror_lsn)}; {len(t.rounds)} round(s), last at "
                           f"{lsnlib.format(last.source_lsn)}")
        if t.problem:
            details.append(f"  {t.problem}")
        for title, k in (("missing (in the source, not in the mirror)", t.missing),
                         ("extra (in the mirror, not in the source)", t.extra),
                         (f"not compared ({_not_compared_reason(t)})", t.not_compared)):
            if k.count:
                more = f" (first {len(k.listed)})" if k.count > len(k.listed) else ""
                details.append(f"  {title}: {k.count:,}{more}: "
                               + "; ".join(_key_text(key) for key in k.listed))
        if t.differing.count:
            more = f" (first {len(t.differing.listed)})" if t.differing.count > len(t.differing.listed) else ""
            details.append(f"  differing: {t.differing.count:,}{more}:")
            for entry in t.differing.listed:
                changes = ", ".join(f"{c}: source {_short(v[0])} ≠ mirror {_short(v[1])}"
                                    for c, v in entry["columns"].items())
                details.append(f"    {_key_text(entry['key'])}: {changes}")
        if details and (t.result != "equal" or t.not_compared.count):
            lines += [f"{t.table}:", *details]
    summary = sum(t.result == "different" for t in verification.tables), \
        sum(t.result == "incomplete" for t in verification.tables)
    if verification.equal:
        lines.append(f"every table is equal ({len(verification.tables)} table(s))")
    else:
        lines.append(f"{summary[0]} table(s) differ, {summary[1]} could not be checked")
    return lines


_IDENTIFIER = re.compile(r'"((?:[^"]|"")+)"|([^".]+)')


def parse_table(text: str) -> TableName:
    """``SCHEMA.NAME`` as PostgreSQL reads it: each part plain (folded to lower case) or
    double-quoted (kept as written, ``""`` for a quote). Raises ``ValueError``."""
    parts, position = [], 0
    while True:
        match = _IDENTIFIER.match(text, position)
        if match is None:
            break
        quoted, bare = match.groups()
        parts.append(quoted.replace('""', '"') if quoted is not None else bare.strip().lower())
        position = match.end()
        if position == len(text) or text[position] != ".":
            break
        position += 1
    if position != len(text) or len(parts) != 2 or not all(parts):
        raise ValueError(f"--table {text!r}: expected SCHEMA.NAME (quote parts that need it, "
                         'e.g. \'"My Schema"."My Table"\')')
    return TableName(parts[0], parts[1])


def command(local: Local, table_args: list[str], *, output: str = "text",
            timeout: float = DEFAULT_TIMEOUT_S, rounds: int = DEFAULT_ROUNDS) -> int:
    """``lakeslot verify``: prints the result (stdout), progress and problems (stderr); returns
    the exit code (:mod:`lakeslot.exits`)."""

    def fail(message: str, code: int) -> int:
        print(f"lakeslot verify: {message}", file=sys.stderr)
        return code

    try:
        wanted = [parse_table(t) for t in table_args]
    except ValueError as e:
        return fail(str(e), EXIT_USAGE)
    job = local.job
    try:
        secrets = job.catalog_secrets(local.environ)
    except ValueError as e:
        return fail(str(e), EXIT_USAGE)
    settings = job.source(local.environ)
    try:
        with connect(settings, application_name("verify", job.names.owner)) as conn:
            chosen = selected(conn, local.ingestion.spec.source)
    except psycopg.Error as e:
        return fail(f"cannot read the source: {str(e).strip().splitlines()[0]}", EXIT_FAILED)
    unknown = [t for t in wanted if t not in chosen]
    if unknown:
        return fail(f"not selected by this ingestion: {', '.join(map(str, unknown))}; it selects: "
                    f"{', '.join(map(str, chosen)) or 'no table'}", EXIT_USAGE)
    tables = wanted or chosen
    if not tables:
        return fail("the ingestion selects no table", EXIT_USAGE)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:
        verification = verify(local.ingestion, settings, tables, secrets=secrets, timeout=timeout,
                              rounds=rounds, say=say)
    except (psycopg.Error, OSError, GapError, typemap.UnmappableValue) as e:
        return fail(f"the check could not complete: {str(e).strip().splitlines()[0]}",
                    EXIT_FAILED)
    if output == "json":
        print(json.dumps(to_document(verification), indent=2, ensure_ascii=False))
    else:
        print("\n".join(render_text(verification)))
    return verification.exit_code
