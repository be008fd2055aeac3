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
driver (its rows per table are metrics, :mod:`lakeslot.ingestion_metrics`).

Invariants: the document is rewritten whole on every change, and readers never see a torn file
(a local file is written next to it and renamed; an object store PUT is atomic). Writes from the
driver's threads are serialised. Every change is also logged.

Failure mode: a progress location that cannot be written fails the job at start (checked by the
first write), not silently at the end.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import uuid
from dataclasses import dataclass

from lakeslot import lsn as lsn_text
from lakeslot.filesystems import filesystem
from lakeslot.source.tables import TableName

log = logging.getLogger(__name__)
VERSION = 1
STAGING_FILE = "snapshot-progress.json"


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
        self.write()

    def table(self, source: TableName, **changes) -> None:
        """Update a table's entry, log it, and rewrite the document."""
        with self._lock:
            entry = self.tables[source]
            for key, value in changes.items():
                setattr(entry, key, value)
            log.info("snapshot %s → %s: %s, %d/%d ranges, %d rows staged%s", source, entry.target,
                     entry.state, entry.ranges_done, entry.ranges_total, entry.rows_staged,
                     f": {entry.error}" if entry.error else "")
            self._write_locked()

    def finish(self, error: str | None = None) -> None:
        with self._lock:
            failed = error or any(t.state == "failed" for t in self.tables.values())
            self.state, self.error = ("failed" if failed else "succeeded"), error
            self._write_locked()

    def write(self) -> None:
        with self._lock:
            self._write_locked()

    def document(self) -> dict:
        return {"version": VERSION, "job": self.job, "state": self.state,
                "snapshotLsn": None if self.snapshot_lsn is None
                else lsn_text.format(self.snapshot_lsn),
                "startedAt": self.started, "updatedAt": _now(), "error": self.error,
                "tables": [t.document() for t in self.tables.values()]}

    def _write_locked(self) -> None:
        if self._location is None:
            return
        data = json.dumps(self.document(), indent=1).encode()
        fs, path = filesystem(self._location)
        if fs.type_name == "local":
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            staging = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
            with open(staging, "wb") as f:
                f.write(data)
            os.replace(staging, path)
        else:
            with fs.open_output_stream(path) as f:
                f.write(data)


def in_staging(staging_uri: str) -> str:
    """The progress document's location in staging (next to the segments, which ignore it)."""
    return f"{staging_uri.rstrip('/')}/{STAGING_FILE}"


def read(location: str) -> dict:
    """The progress document at ``location`` (for the operator and local mode)."""
    fs, path = filesystem(location)
    with fs.open_input_stream(path) as f:
        return json.loads(f.read())
