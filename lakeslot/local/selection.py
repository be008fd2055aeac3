"""Which tables a local run mirrors: the selection as the source steps
(:mod:`lakeslot.control.steps`) last resolved it, kept in the state directory, and watched while
the run streams.

Every ``Options.selection_interval`` seconds (10) one catalog query
(:func:`lakeslot.control.steps.selection_fingerprint`) on a connection of its own tells whether
the tables of ``spec.source.schemas`` (or the listed ones), their replica identities, or what the
publication publishes (a DBA adding a table to an external one) changed;
only then are the source steps (preflight, publication sync) taken again, and their selection
adopted: the tables that joined and left go to the schedule (:mod:`.schedule`). ``--once``
resolves the selection only at start.

Invariants:

- The rows (``status.tables``) are written to ``tables.json`` whenever they change, so
  ``lakeslot status`` and the next run see what this run saw: a table that left is ``Removed``
  with the position its mirror was last seen at (:meth:`Selection.remember_positions`), and a
  table that joined the publication again keeps its ``resnapshotBelowLsn`` until its copy
  reaches it (:meth:`Selection.joined_below`), across runs.
- A table without a usable replica identity is ``Failed`` in its row with its fix and left out
  of the publication (a warning says so); once fixed it joins.
- The fingerprint is taken before the source steps at start, so a table created meanwhile is
  seen by the first check; it is remembered only once its selection was adopted, so a change the
  steps could not take is tried again at the next check.

Failure modes: the source unreachable or refusing the check is a warning, and the check is made
again after the interval (on a new connection); a selection that cannot be taken (the condition
says why) is logged, and the tables stream on as they were.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from lakeslot import lsn_text
from lakeslot.api.models import Condition, PostgresIngestionStatus, TableStatus
from lakeslot.api.naming import TableName
from lakeslot.control import steps
from lakeslot.local import state
from lakeslot.local.config import Local
from lakeslot.mirror.progress import MirrorProgress
from lakeslot.observability import status_report
from lakeslot.source import connection

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("lakeslot.local")


def log_events(report: status_report.Report) -> None:
    """The events the steps told, as log lines."""
    for event in report.events:
        log.log(logging.WARNING if event.type == "Warning" else logging.INFO, "%s: %s",
                event.reason, event.message)


class Selection:
    """The selected tables and their rows (see the module docstring)."""

    def __init__(self, local: Local, interval: float) -> None:
        self.local, self.interval = local, interval
        self.job = local.job
        self.tables: list[TableName] = []  # selected and usable
        self.rows: list[TableStatus] = []  # status.tables as the source steps last left them
        self._fingerprint: tuple | None = None
        self._checked_at = time.monotonic()
        self._watch: psycopg.Connection | None = None

    def take_fingerprint(self) -> None:
        """The selection's fingerprint now, before the source steps of the start."""
        self._fingerprint = self._fingerprint_now()

    def _fingerprint_now(self) -> tuple | None:
        """:func:`lakeslot.control.steps.selection_fingerprint` on the run's own connection, opened
        once and again after a failure; None when the source cannot answer now."""
        import psycopg

        try:
            if self._watch is None or self._watch.closed:
                self._watch = connection.connect(
                    self.job.source(self.local.environ),
                    connection.application_name("local", self.job.names.owner))
            return steps.selection_fingerprint(self._watch, self.local.ingestion.spec.source,
                                               self.job.names.publication)
        except psycopg.Error as e:
            log.warning("cannot check the selection now (again in %.0f s): %s",
                        self.interval, status_report.first_line(e))
            if self._watch is not None:
                self._watch.close()
            self._watch = None
            return None

    def watch(self, conditions: list[Condition]) -> tuple[set[TableName], set[TableName]] | None:
        """Every ``interval`` seconds: the source steps again when the selection's fingerprint
        changed, and their selection adopted; the tables that joined and those that left, or
        None when nothing was adopted. ``conditions``: the status's, which the steps update."""
        import psycopg

        if time.monotonic() - self._checked_at < self.interval:
            return None
        self._checked_at = time.monotonic()
        fingerprint = self._fingerprint_now()
        if fingerprint is None or fingerprint == self._fingerprint or self._watch is None:
            return None
        report = status_report.Report(PostgresIngestionStatus(tables=self.rows, conditions=conditions),
                                      0, datetime.now(UTC))
        try:
            tables = steps.check_source(self._watch, self.local.ingestion, report)
        except psycopg.Error as e:
            log.warning("cannot check the selection now (again in %.0f s): %s",
                        self.interval, status_report.first_line(e))
            self._watch.close()
            return None
        log_events(report)
        if tables is None:  # the condition says why; the tables stream on, checked again later
            for c in report.status.conditions:
                if c.status == "False":
                    log.warning("the selection changed but cannot be taken: %s: %s: %s", c.type,
                                c.reason, c.message)
            return None
        self._fingerprint = fingerprint
        before = set(self.tables)
        self.adopt(report, tables)
        return set(tables) - before, before - set(tables)

    def adopt(self, report: status_report.Report, tables: list[TableName]) -> None:
        """Take the source steps' selection: the usable tables and the rows (kept in the state
        directory for ``lakeslot status`` and the next run)."""
        self.rows = report.status.tables
        state.write_tables(self.local.state_dir, self.rows)
        for row in self.rows:
            if row.state == "Failed":
                log.warning("%s.%s is skipped: %s", row.schema_name, row.name, row.message)
        self.tables = list(tables)

    def remember_positions(self, status: PostgresIngestionStatus) -> None:
        """Keep in the rows where each mirror was last seen, so that a table that leaves the
        selection is reported Removed with its mirror's position."""
        seen = {(r.schema_name, r.name): r for r in status.tables if r.state != "Removed"}
        for row in self.rows:
            if row.state != "Removed" and (now := seen.get((row.schema_name, row.name))) is not None:
                row.applied_lsn = now.applied_lsn or row.applied_lsn
                row.snapshot_lsn = now.snapshot_lsn or row.snapshot_lsn

    def joined_below(self, progress: Mapping[TableName, MirrorProgress]) -> dict[TableName, int]:
        """Tables that joined the publication with a mirror (re-created, or selected again), each
        with the LSN its copy must reach (``resnapshotBelowLsn``). Served ones are cleared, and so
        are those without a mirror: no copy runs while this is called, so theirs starts later,
        after they joined. The rows hold the user's requests too
        (:func:`lakeslot.control.resnapshot.serve_requests`), recorded at the mirror's position
        + 1, which only grows; a table that joined again asks for more — the LSN it joined at,
        above a position that stayed where it was while the table was out of the stream."""
        below: dict[TableName, int] = {}
        served = False
        for row in self.rows:
            table = TableName(row.schema_name, row.name)
            if row.resnapshot_below_lsn is None or table not in progress:
                continue
            lsn = lsn_text.parse(row.resnapshot_below_lsn)
            position = progress[table].lsn
            if position is None or (progress[table].snapshot_lsn or 0) >= lsn:
                row.resnapshot_below_lsn, served = None, True
            elif lsn > position + 1:
                below[table] = lsn
        if served:
            state.write_tables(self.local.state_dir, self.rows)
        return below

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
