"""The status of a locally run ingestion: the operator's status model, computed from the world.

``lakeslot status`` prints it and ``lakeslot run`` shows it live. Sources of truth, as for the
operator (:mod:`lakeslot.observability.status_report` builds the model): the source database (preflight, read-only;
the slot's health and ``confirmed_flush_lsn`` = the reader's durable LSN; the current WAL LSN),
each mirror table's ``lakeslot.lsn`` in Iceberg, the sealed segments in staging (changes not yet
applied per table, and the commit time of the first one: freshness, :mod:`lakeslot.observability.freshness`;
the snapshot's progress document), and the state directory (is a run active — the run lock —,
the reader's status file, the selection the run last recorded: a table no longer selected since
is ``Removed``).

Invariants: observing changes nothing (no publication sync, no slot creation, no eviction); the
password is used to connect and appears nowhere in the result.

Failure modes: an unreachable source, a missing slot or an unreadable catalog are conditions of
the returned status (``ConnectionFailed``, ``SlotMissing``, ``CatalogUnreachable``), never
exceptions; so ``lakeslot status`` always prints a status.

Local-mode reasons next to the operator's: ``SlotMissing`` (SlotReady: no run created the slot
yet), ``NotSnapshotted`` (SnapshotComplete: tables without a snapshot and no run copying them),
``ReaderNotReady`` says "no local run is active" or the reader's definite error. A reader that
runs but retries a transient error (its status file, :mod:`lakeslot.observability.reader_status`, says
``retrying``) makes ``Streaming`` False with the reader's reason — ``StagingUnwritable``,
``SourceUnreachable``, ``ReaderRetrying`` — and its error, until it makes progress again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

from lakeslot.api.models import PostgresIngestionStatus, SnapshotStatus
from lakeslot.api.naming import TableName
from lakeslot.control import steps
from lakeslot.local import state
from lakeslot.local.config import Local
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.progress import MirrorProgress
from lakeslot.observability import freshness, reader_status, status_report
from lakeslot.snapshot import progress as snapshot_progress
from lakeslot.staging import apply_status
from lakeslot.staging.segments import SegmentName
from lakeslot.staging.store import Staging

COUNT_READERS = 16  # new segments whose changes a status counts at once (StagedCounter)


@dataclass(frozen=True)
class Activity:
    """What runs right now, as the local run knows it (or as :func:`activity` reads it)."""

    run_active: bool
    reader_pod: str | None = None
    reader_running: bool = False
    reader_outcome: Mapping = field(default_factory=dict)  # the reader's status file
    apply_problem: str | None = None


def activity(local: Local) -> Activity:
    """Read from the state directory, by another process (``lakeslot status``)."""
    active = state.run_active(local.state_dir)
    info = state.read_run(local.state_dir) if active else {}
    try:
        outcome = json.loads(local.path("reader-status.json").read_text())
    except (OSError, ValueError):
        outcome = {}
    reader_pid: int | None = info.get("readerPid")
    reader_running = bool(active and reader_pid and _alive(reader_pid))
    return Activity(active, info.get("pod"), reader_running,
                    outcome, None if active else "no local run is active")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class StagedCounter:
    """Changes per table in sealed segments; segments are immutable, so each is read once, the
    new ones :data:`COUNT_READERS` at a time (on object storage a segment's read is several
    requests: 200 new segments one after the other at 30 ms a request kept a status 31 s)."""

    def __init__(self, staging_uri: str) -> None:
        self.staging = Staging(staging_uri)
        self._cache: dict[SegmentName, list[tuple[str, str, int, int]]] = {}

    def _read(self, names: list[SegmentName]) -> None:
        """Count the changes of the segments ``names`` not counted yet: (schema, table,
        commit_lsn, changes) of each, kept by segment."""
        new = [n for n in names if n not in self._cache]
        if len(new) <= 1:
            self._cache.update((n, self.staging.change_counts(n)) for n in new)
            return
        with ThreadPoolExecutor(min(COUNT_READERS, len(new)),
                                thread_name_prefix="lakeslot-staged-counts") as pool:
            self._cache.update(zip(new, pool.map(self.staging.change_counts, new), strict=True))

    def pending(self, applied: Mapping[TableName, int]) -> dict[TableName, int]:
        """Changes with a commit LSN above each table's applied LSN."""
        if not applied:
            return {}
        low = min(applied.values())
        names = [n for n in self.staging.list() if n.end > low]
        self._cache = {n: c for n, c in self._cache.items() if n.end > low}
        self._read(names)
        counts = dict.fromkeys(applied, 0)
        for name in names:
            for schema, table, commit_lsn, changes in self._cache[name]:
                key = TableName(schema, table)
                if key in applied and commit_lsn > applied[key]:
                    counts[key] += changes
        return counts


def snapshot_location(local: Local) -> str:
    """Where a local run's snapshot writes its progress document: in staging, as under the
    operator (one place for both, which the metrics read)."""
    return snapshot_progress.in_staging(local.ingestion.spec.staging.uri)


def snapshot_document(local: Local) -> dict | None:
    try:
        return snapshot_progress.read(snapshot_location(local))
    except (OSError, ValueError):
        return None


def observe(local: Local, activity_now: Activity, *, staged: StagedCounter | None = None,
            now: datetime | None = None,
            read: Mapping[TableName, MirrorProgress] | None = None) -> PostgresIngestionStatus:
    """The status now; ``read``: the mirrors' progress as read since the last apply pass
    finished (:meth:`.schedule.Schedule.progress_read`), taken instead of reading every mirror
    again where it has every table."""
    ing, job = local.ingestion, local.job
    # the selection the run last recorded: a table no longer selected since is shown Removed
    report = status_report.Report(PostgresIngestionStatus(tables=state.read_tables(local.state_dir)),
                                  getattr(ing.metadata, "generation", None) or 0, now or datetime.now(UTC))
    report.status.publication_name = job.names.publication
    source = steps.take_control(job.source(local.environ), ing, report, component="status",
                                reader=None, read_only=True)
    if source is None:
        report.summarize()
        return report.status
    tables, health = source.tables, source.health
    applied = Staging(ing.spec.staging.uri).read_apply_status() or {}
    covered = apply_status.covered(applied)
    try:
        progress = (mirror_progress.with_coverage({t: read[t] for t in tables}, covered)
                    if read is not None and all(t in read for t in tables) else
                    mirror_progress.read(ing, tables, secrets=job.catalog_secrets(local.environ),
                                         covered=covered))
    except Exception as e:  # noqa: BLE001 - any catalog failure is reported
        report.condition("Streaming", False, "CatalogUnreachable", status_report.first_line(e))
        report.summarize()
        return report.status
    snapshotting = _snapshot(report, local, activity_now, tables, progress)
    positions = status_report.record_progress(report, progress, snapshotting,
                                              durable=health.confirmed_flush_lsn if health else None,
                                              current=source.current_lsn, reader=activity_now.reader_pod)
    _staged(report, staged or StagedCounter(ing.spec.staging.uri), progress, snapshotting)
    freshness.record(report.status, Staging(ing.spec.staging.uri, create=False), report.now)
    _apply_errors(report, applied)
    degraded = apply_status.degraded_message(applied)
    reader_reason, reader_problem = reader_state(activity_now) or ("", None)
    status_report.streaming(report, positions, reader_problem=reader_problem, reader_reason=reader_reason,
                            apply_problem=activity_now.apply_problem or degraded,
                            apply_reason=("ApplyNotRunning" if activity_now.apply_problem
                                          else status_report.APPLY_DEGRADED),
                            catching_up_after=status_report.catching_up_after_s(ing.spec))
    report.summarize()
    return report.status


def _snapshot(report: status_report.Report, local: Local, activity_now: Activity, tables: list[TableName],
              progress: Mapping[TableName, MirrorProgress]) -> set[TableName]:
    document = snapshot_document(local)
    copying: set[TableName] = set()
    if document is not None:
        running = document["state"] == "running" and activity_now.run_active
        copying = {TableName(t["schema"], t["name"]) for t in document["tables"]
                   if running and t["state"] in ("pending", "copying")}
        failures = [f"{TableName(t['schema'], t['name'])}: {t['error']}"
                    for t in document["tables"] if t["state"] == "failed"]
        interrupted = document["state"] == "running" and not activity_now.run_active
        state_name = {"running": "RUNNING", "succeeded": "COMPLETED"}.get(document["state"],
                                                                          "FAILED")
        report.status.snapshot = SnapshotStatus(
            application="local", generation=document["job"],
            tables=[str(TableName(t["schema"], t["name"])) for t in document["tables"]],
            state="FAILED" if interrupted else state_name,
            message="\n".join(filter(None, [
                "the run stopped before the snapshot finished; lakeslot run resumes it"
                if interrupted else None, document.get("error"), *failures]))[:4000])
    status_report.snapshot_failures(report, snapshot_progress.failures(snapshot_location(local)), progress,
                                    copying)
    missing = [t for t in tables if progress[t].lsn is None or t in copying]
    if not missing:
        status_report.snapshot_complete(report)
    elif copying:
        report.condition("SnapshotComplete", False, "Snapshotting",
                         f"the local run copies {len(copying)} table(s)")
    elif report.status.snapshot is not None and report.status.snapshot.state == "FAILED":
        report.condition("SnapshotComplete", False, "SnapshotFailed",
                         report.status.snapshot.message or "the snapshot did not finish")
    else:
        report.condition("SnapshotComplete", False, "NotSnapshotted",
                         f"{len(missing)} table(s) have no snapshot in Iceberg yet: "
                         "lakeslot run copies them")
    return copying


def _staged(report: status_report.Report, staged: StagedCounter,
            progress: Mapping[TableName, MirrorProgress], snapshotting: set[TableName]) -> None:
    applied = {t: p.lsn for t, p in progress.items() if p.lsn is not None and t not in snapshotting}
    counts = staged.pending(applied)
    for row in report.status.tables:
        table = TableName(row.schema_name, row.name)
        if table in counts:
            row.rows_staged = counts[table]


def _apply_errors(report: status_report.Report, document: Mapping) -> None:
    """Tables the apply job stopped (definite error) are Failed; its transient errors being
    retried are in the table's message (``document``: the apply job's status document)."""
    outcomes = {TableName(t["schema"], t["name"]): t for t in document.get("tables", [])}
    for row in report.status.tables:
        outcome = outcomes.get(TableName(row.schema_name, row.name))
        if outcome is None or outcome["state"] not in ("failed", "retrying") \
                or row.state == "Removed":
            continue
        if outcome["state"] == "failed":
            row.state = "Failed"
        row.message = f"apply {outcome['state']}: {outcome['error']}"


def reader_state(activity_now: Activity) -> tuple[str, str] | None:
    """The ``Streaming`` condition's reason and message for the reader, None when it streams:
    a running reader's own problem (retrying a transient error: its status document), else why
    no reader runs."""
    if activity_now.reader_running:
        return reader_status.problem(activity_now.reader_outcome)
    problem = _reader_problem(activity_now)
    return None if problem is None else ("ReaderNotReady", problem)


def _reader_problem(activity_now: Activity) -> str | None:
    if activity_now.reader_running:
        return None
    outcome = activity_now.reader_outcome
    if outcome.get("definite"):
        return (f"the reader stopped with a definite error ({outcome.get('reason')}): "
                f"{outcome.get('message')}")
    if not activity_now.run_active and outcome.get("state") == "stopped":
        return (f"the run has stopped; everything up to {outcome.get('lsn')} is sealed in staging "
                "and the slot keeps the rest: lakeslot run -f FILE resumes from there")
    if not activity_now.run_active:
        return "no local run is active: start one with lakeslot run -f FILE"
    return "the reader process is not running" + (
        f" (last outcome: {outcome.get('reason')}: {outcome.get('message')})"
        if reader_status.is_final(outcome) else "")
