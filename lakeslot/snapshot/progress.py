"""Progress of a snapshot job: one JSON document the operator and local mode read.

The document (``version`` 1, camelCase, LSNs in PostgreSQL's ``X/X`` form)::

    {"version": 1, "job": "<id>", "state": "running" | "succeeded" | "failed",
     "snapshotLsn": "0/16B3748" | null, "startedAt": "...Z", "updatedAt": "...Z",
     "error": null | "<why the job as a whole failed>",
     "tables": [{"schema": "public", "name": "orders", "target": "ns.public__orders",
                 "state": "pending" | "copying" | "committed" | "skipped" | "failed",
                 "rowsEstimated": 1000000 | null, "rowsStaged": 250000,
                 "rangesTotal": 4, "rangesDone": 1, "lsn": "0/16B3748" | null,
                 "error": null | "<why the table failed, with the fix>",
                 "transient": false | true}]}

``rowsEstimated`` is ``pg_class.reltuples`` (null when the table was never analyzed);
``rowsStaged`` counts rows in data files of finished ranges (it moves range by range);
``lsn`` is set once the table committed. ``skipped`` tables were snapshotted before (at this
generation). ``transient``: the table failed only because a range or its commit kept failing
transiently (retries exhausted): running the job again may succeed; otherwise its error is definite
(a human must act on it).

Where it goes: into staging (:func:`in_staging`), under the operator (the snapshot job's default)
and ``lakeslot run`` alike; the operator reads staging anyway, and the document outlives each
driver (its rows per table are metrics, :mod:`lakeslot.observability.metrics`).

Failures outlive the document (``snapshot-failures.json`` next to it, :func:`failures_location`):
each job rewrites the progress document with its own tables only, so a later job that copies
other tables (a re-snapshot of one table, a table that joined) would erase the only record of an
earlier job's failed table, and status would show that table ``Pending`` with no reason. The
failures document keeps, per table, the error of its last snapshot attempt when that attempt
failed (``{"version": 1, "tables": [{"schema", "name", "error", "transient", "job",
"failedAt"}]}``): a job records a table's failure when it fails and removes it when the table
commits or is skipped (it has a mirror); tables the job does not copy keep their entries. Status
(:func:`lakeslot.observability.status_report.snapshot_failures`) reads both documents.

Invariants: the document is rewritten whole after a change, at most every
:data:`WRITE_INTERVAL_S` and never later than that after it (a change within the interval is
written by a timer at its end): rewritten on every change, the document of N tables cost O(N²)
— at 200 tables a quarter of the snapshot driver's Python time. The first document and the
job's end (:meth:`Progress.finish`) are written at once. Readers never see a torn document
(:func:`lakeslot.filesystems.write_document`, :func:`~lakeslot.filesystems.read_document`). Writes
from the driver's threads are serialised. Every change is also logged at once.

Failure mode: a progress location that cannot be written fails the job at start (checked by the
first write), not silently at the end; a timer's write that fails is raised by the next change
(the job's end is written at once, and raises itself).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.filesystems import filesystem, read_document, write_document

log = logging.getLogger(__name__)
VERSION = 1
WRITE_INTERVAL_S = 0.25  # the progress document is rewritten at most this often, and this late
STAGING_FILE = "snapshot-progress.json"
FAILURES_FILE = "snapshot-failures.json"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class TableProgress:
    source: TableName
    target: str
    state: str = "pending"
    rows_estimated: int | None = None
    rows_staged: int = 0
    ranges_total: int = 0
    ranges_done: int = 0
    lsn: int | None = None
    error: str | None = None
    transient: bool = False  # failed after exhausting retries of transient errors

    def document(self) -> dict:
        return {"schema": self.source.schema, "name": self.source.name, "target": self.target,
                "state": self.state, "rowsEstimated": self.rows_estimated,
                "rowsStaged": self.rows_staged, "rangesTotal": self.ranges_total,
                "rangesDone": self.ranges_done,
                "lsn": None if self.lsn is None else lsn_text.format(self.lsn),
                "error": self.error, "transient": self.transient}


class Progress:
    def __init__(self, location: str | None, tables: list[tuple[TableName, str]]) -> None:
        self._location, self._lock = location, threading.Lock()
        self.job, self.state = uuid.uuid4().hex[:12], "running"
        self.error: str | None = None
        self.snapshot_lsn: int | None = None
        self.started = _now()
        self.tables = {source: TableProgress(source, target) for source, target in tables}
        self._failures: dict[TableName, dict] = {}
        if location is not None:
            self._failures = _read_failures(failures_location(location), None)
        self._written = -math.inf  # (monotonic) when the document was last written
        self._timer: threading.Timer | None = None  # the pending write of a recent change
        self._failed: Exception | None = None  # the pending write's error, raised next
        self.write()

    def table(self, source: TableName, **changes) -> None:
        """Update a table's entry, log it, and rewrite the document."""
        with self._lock:
            entry = self.tables[source]
            for key, value in changes.items():
                setattr(entry, key, value)
            if changes.get("state") == "failed":
                self._failures[source] = {"error": entry.error, "transient": entry.transient,
                                          "job": self.job, "failedAt": _now()}
                self._write_failures_locked()
            elif changes.get("state") in ("committed", "skipped") and source in self._failures:
                del self._failures[source]
                self._write_failures_locked()
            log.info("snapshot %s → %s: %s, %d/%d ranges, %d rows staged%s", source, entry.target,
                     entry.state, entry.ranges_done, entry.ranges_total, entry.rows_staged,
                     f": {entry.error}" if entry.error else "")
            self._changed_locked()

    def finish(self, error: str | None = None) -> None:
        with self._lock:
            failed = error or any(t.state == "failed" for t in self.tables.values())
            self.state, self.error = ("failed" if failed else "succeeded"), error
            self._write_locked()

    def write(self) -> None:
        """Write the document now."""
        with self._lock:
            self._write_locked()

    def _changed_locked(self) -> None:
        if self._failed is not None:
            raise self._failed
        now = time.monotonic()
        if now - self._written >= WRITE_INTERVAL_S:
            self._write_locked()
        elif self._timer is None:
            self._timer = threading.Timer(self._written + WRITE_INTERVAL_S - now, self._flush)
            self._timer.daemon = True
            self._timer.start()

    def _flush(self) -> None:
        with self._lock:
            if self._timer is None:  # (written since, at once)
                return
            try:
                self._write_locked()
            except Exception as e:  # noqa: BLE001 - raised by the next change, in the job
                self._failed = e

    def document(self) -> dict:
        return {"version": VERSION, "job": self.job, "state": self.state,
                "snapshotLsn": None if self.snapshot_lsn is None
                else lsn_text.format(self.snapshot_lsn),
                "startedAt": self.started, "updatedAt": _now(), "error": self.error,
                "tables": [t.document() for t in self.tables.values()]}

    def _write_locked(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._written = time.monotonic()
        if self._location is not None:
            _write(self._location, self.document())

    def _write_failures_locked(self) -> None:
        if self._location is None:
            return
        document = {"version": VERSION, "tables": [
            {"schema": t.schema, "name": t.name, **entry}
            for t, entry in sorted(self._failures.items())]}
        _write(failures_location(self._location), document)


def _write(location: str, document: dict) -> None:
    write_document(*filesystem(location), document)


def in_staging(staging_uri: str) -> str:
    """The progress document's location in staging (next to the segments, which ignore it)."""
    return f"{staging_uri.rstrip('/')}/{STAGING_FILE}"


def read(location: str, environ: Mapping[str, str] | None = None) -> dict:
    """The progress document at ``location`` (for the operator and local mode), reached with the
    storage settings ``environ`` (:func:`lakeslot.filesystems.filesystem`)."""
    document = read_document(*filesystem(location, environ))
    if document is None:
        raise FileNotFoundError(f"no snapshot progress document at {location}")
    return document


def failures_location(location: str) -> str:
    """Where the failures document of the progress document at ``location`` is: beside it."""
    head, slash, _ = location.rpartition("/")
    return f"{head}{slash}{FAILURES_FILE}"


def _read_failures(location: str, environ: Mapping[str, str] | None) -> dict[TableName, dict]:
    try:
        document = read_document(*filesystem(location, environ))
    except OSError:  # unreadable: the next failure rewrites it
        return {}
    if document is None:  # none yet
        return {}
    return {TableName(e["schema"], e["name"]): {k: v for k, v in e.items()
                                                if k not in ("schema", "name")}
            for e in document.get("tables", [])}


def failures(location: str, environ: Mapping[str, str] | None = None) -> dict[TableName, dict]:
    """Per table, its last snapshot attempt's failure (``error``, ``transient``, ``job``,
    ``failedAt``), for the progress document at ``location``; tables whose last attempt did not
    fail are absent. Besides the failures document, the progress document's failed tables count
    (a job of an earlier version wrote only that one)."""
    try:
        document = read(location, environ)
    except (OSError, ValueError):
        document = {}
    found = {TableName(t["schema"], t["name"]): {"error": t.get("error"),
                                                 "transient": bool(t.get("transient")),
                                                 "job": document.get("job")}
             for t in document.get("tables", []) if t.get("state") == "failed"}
    return {**found, **_read_failures(failures_location(location), environ)}
