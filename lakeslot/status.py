"""The PostgresIngestion status, built one way for the operator and for local mode.

The operator writes this status into the resource; ``lakeslot run`` shows it live and
``lakeslot status`` prints it. Both go through these functions, so a condition, a reason and a
message mean the same thing wherever they are read (the README's operations table).

Steps against the source (each gating the next, as in the operator's reconcile):

- :func:`check_source` — the selected tables, preflight (server checks fail the whole step,
  table checks fail only that table), publication sync; condition ``SourceReady``.
- :func:`ensure_slot` — ensure the permanent slot, apply ``onSlotLost``, evict any holder that
  is not the legitimate reader; condition ``SlotReady``.

Then the progress (:func:`record_progress`): per-table state from each mirror table's
``lakeslot.lsn`` (DESIGN.md invariant 1), the reader's durable LSN from the slot's
``confirmed_flush_lsn`` (invariant 4), lag from the server's current LSN; ``Streaming`` says
what keeps the data from flowing (:func:`streaming`), ``Degraded``/``Ready``/phase summarise
(:meth:`Report.summarize`).

Invariants: conditions carry ``observedGeneration``; ``lastTransitionTime`` moves only when a
condition's status flips; every condition change is also an event; messages are libpq's or
ours, never a credential.

Failure modes: the step functions let ``psycopg.OperationalError`` through (the caller reports
``ConnectionFailed``); everything else that the source can say is a condition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

import psycopg

from lakeslot import lsn as lsnlib
from lakeslot import mirror
from lakeslot.api import conditions as cond
from lakeslot.api.models import (
    ApplyStatus,
    PostgresIngestion,
    PostgresIngestionStatus,
    ReaderStatus,
    SlotStatus,
    TableStatus,
)
from lakeslot.reader.segments import Staging
from lakeslot.source import preflight, publication, slot
from lakeslot.source.tables import TableName, selected

# Reasons that waiting will not fix: the user must act (the message says how).
DEFINITE = ("InvalidSpec", "SlotLost", "SlotUnusable")
NEEDED_FOR_READY = ("SourceReady", "SlotReady", "SnapshotComplete", "Streaming")


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


class Report:
    """The status being built, and the events that its changes deserve."""

    def __init__(self, old: PostgresIngestionStatus, generation: int, now: datetime):
        self.old = old
        self.status = old.model_copy(deep=True)
        self.status.observed_generation = generation
        self.generation = generation
        self.now = now
        self.events: list[Event] = []

    def condition(self, type_: str, ok: bool | None, reason: str, message: str = "") -> None:
        value = {True: "True", False: "False", None: "Unknown"}[ok]
        before = cond.find_condition(self.old.conditions, type_)
        self.status.conditions = cond.set_condition(
            self.status.conditions, type_, value, reason, message[:32000], now=self.now,
            observed_generation=self.generation)
        if before is None or (before.status, before.reason) != (value, reason):
            healthy = ok is True if type_ != "Degraded" else ok is False
            self.events.append(Event("Normal" if healthy else "Warning", reason,
                                     message or f"{type_} is {value}"))

    def tell(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def summarize(self) -> None:
        """``Degraded``, ``Ready`` (the first failing needed condition) and the phase."""
        status = self.status
        failed_tables = [t for t in status.tables if t.state == "Failed"]
        wal_danger = status.slot is not None and status.slot.wal_status == "unreserved"
        if failed_tables or wal_danger:
            what = [f"{len(failed_tables)} table(s) failed (see status.tables)"] if failed_tables else []
            if wal_danger:
                what.append("the slot's WAL is beyond max_slot_wal_keep_size and about to be "
                            "removed: the reader must catch up now")
            self.condition("Degraded", True, "TablesFailed" if failed_tables else "WalAtRisk",
                           "; ".join(what))
        else:
            self.condition("Degraded", False, "Healthy", "nothing needs attention")
        states = {c.type: c for c in status.conditions}
        not_ready = [t for t in NEEDED_FOR_READY if t not in states or states[t].status != "True"]
        if not_ready:
            first = states.get(not_ready[0])
            self.condition("Ready", False, first.reason if first else "Reconciling",
                           f"{first.type}: {first.message}" if first
                           else f"{not_ready[0]} is not known yet")
        else:
            self.condition("Ready", True, "Streaming", "every selected table is streaming")
        definite = [c for c in status.conditions if c.status == "False" and c.reason in DEFINITE]
        running = status.snapshot is not None and status.snapshot.state not in (None, "COMPLETED")
        status.phase = ("Failed" if definite else "Streaming" if not not_ready
                        else "Snapshotting" if running else "Pending")


# the steps against the source ----------------------------------------------------------------

def check_source(conn: psycopg.Connection, ingestion: PostgresIngestion, report: Report, *,
                 slot_name: str, publication_name: str, owner: str,
                 sync_publication: bool = True) -> list[TableName] | None:
    """Preflight and publication sync; the usable tables, or None when the step failed (the
    condition says why). ``sync_publication=False`` only reads (``lakeslot status``)."""
    source = ingestion.spec.source
    tables = selected(conn, source)
    options = {TableName(t.schema_name, t.name): t for t in source.tables}
    findings = preflight.run(
        conn, tables,
        key_columns={t: o.key_columns for t, o in options.items()},
        excluded_columns={t: o.exclude_columns for t, o in options.items()},
        slot_name=slot_name)
    failed = preflight.failures(findings)
    server = [f for f in failed if f.table is None]
    if server:
        report.condition("SourceReady", False, "PreflightFailed", "\n".join(str(f) for f in server))
        return None
    broken: dict[TableName, list[str]] = {}
    for finding in failed:
        broken.setdefault(finding.table, []).append(str(finding))
    good = [t for t in tables if t not in broken]
    table_rows(report, tables, broken)
    if sync_publication:
        sync = publication.sync(conn, publication_name, good, owner=owner)
        if not sync.ok:
            report.condition("SourceReady", False, "PublicationOutOfSync", "\n".join(sync.errors))
            return None
        for table in sync.added:
            report.tell("Normal", "TableAdded", f"{table} added to publication {publication_name}")
        for table in sync.removed:
            report.tell("Normal", "TableRemoved",
                        f"{table} removed from publication {publication_name}; its mirror is kept")
    if not good:
        report.condition("SourceReady", False, "NoUsableTable",
                         "every selected table failed its checks (see status.tables)")
        return None
    report.condition("SourceReady", True, "PreflightPassed",
                     f"{len(good)} table(s) ready" + (f", {len(broken)} failed" if broken else ""))
    return good


def ensure_slot(conn: psycopg.Connection, ingestion: PostgresIngestion, report: Report, *,
                slot_name: str, legitimate: str | None) -> slot.SlotHealth | None:
    """Ensure the slot, handle a lost one per ``onSlotLost``, terminate every holder other than
    ``legitimate`` (the reader's application_name; None: no reader runs yet). The slot's
    health, or None when the step failed (``SlotReady`` says why)."""
    try:
        ensured = slot.ensure(conn, slot_name)
    except slot.SlotError as e:
        report.condition("SlotReady", False, "SlotUnusable", str(e))
        return None
    if ensured.created:
        report.tell("Normal", "SlotCreated", f"slot {slot_name} created at "
                    f"{lsnlib.format(ensured.creation_lsn)}")
    health = slot.health(conn, slot_name)
    lost = slot.lost_reason(health)
    if lost and ingestion.spec.policies.on_slot_lost == "Resnapshot":
        # The staged changes came from the lost slot and have a gap: none of them may be
        # applied any more, and the reader resumes at the new slot once staging is empty
        # (emptied first: a reader on the new slot may be writing right after it exists).
        try:
            staging = Staging(ingestion.spec.staging.uri)
            for segment in staging.list():
                staging.delete(segment)
        except OSError as e:
            report.condition("SlotReady", False, "StagingUnreachable", (
                f"{lost}; to recreate it (onSlotLost: Resnapshot) staging must be emptied first, "
                f"but it cannot be written: {e}. Give the operator access to "
                f"{ingestion.spec.staging.uri} (e.g. object-store credentials in its environment) "
                "or delete the segments there by hand"))
            return None
        fresh = slot.recreate(conn, slot_name)
        report.status.resnapshot_below_lsn = lsnlib.format(fresh.creation_lsn)
        report.tell("Warning", "SlotRecreated", f"{lost}; recreated it at "
                    f"{lsnlib.format(fresh.creation_lsn)}, emptied staging and re-snapshotting "
                    "every table (onSlotLost: Resnapshot)")
        report.status.snapshot = None
        health = slot.health(conn, slot_name)
    elif lost:
        slot_condition(report, health)
        return None
    for eviction in slot.evict_stale_holders(conn, slot_name, legitimate):
        report.tell("Warning", "StaleHolderEvicted",
                    f"terminated backend {eviction.pid} ({eviction.application_name!r}) holding "
                    f"slot {slot_name}; the reader is {legitimate!r}")
    slot_condition(report, health)
    return health


def slot_condition(report: Report, health: slot.SlotHealth) -> bool:
    """``status.slot`` and ``SlotReady`` for an existing slot; False when it is lost."""
    report.status.slot = slot_status(health)
    lost = slot.lost_reason(health)
    if lost:
        report.condition("SlotReady", False, "SlotLost",
                         f"{lost}. Changes are missing: fix the cause (e.g. raise "
                         "max_slot_wal_keep_size), then set policies.onSlotLost: Resnapshot "
                         "to recreate the slot, empty staging and copy every table again")
        return False
    report.condition("SlotReady", True, "SlotHealthy",
                     f"slot {health.name} wal_status={health.wal_status}")
    return True


def snapshot_complete(report: Report) -> None:
    report.condition("SnapshotComplete", True, "SnapshotComplete",
                     "every table has a snapshot in Iceberg")


def current_lsn(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::int8").fetchone()[0]


# status pieces -------------------------------------------------------------------------------

def slot_status(health: slot.SlotHealth) -> SlotStatus:
    return SlotStatus(
        name=health.name, active_pid=health.active_pid, holder=health.holder,
        confirmed_flush_lsn=lsn_text(health.confirmed_flush_lsn),
        restart_lsn=lsn_text(health.restart_lsn), wal_status=health.wal_status,
        safe_wal_size=health.safe_wal_size,
        retained_bytes=max(health.retained_bytes or 0, 0))


def table_rows(report: Report, tables: list[TableName],
               broken: Mapping[TableName, list[str]]) -> None:
    """One row per selected table (kept from the previous status), Failed with the fixes."""
    previous = {(t.schema_name, t.name): t for t in report.old.tables}
    rows = []
    for table in tables:
        row = previous.get((table.schema, table.name)) or TableStatus(
            schema=table.schema, name=table.name, state="Pending")
        row = row.model_copy()
        if table in broken:
            row.state, row.message = "Failed", "\n".join(broken[table])
        elif row.state == "Failed":
            row.state, row.message = "Pending", ""
        rows.append(row)
    report.status.tables = rows
    report.status.table_count = len(tables)


def record_progress(report: Report, progress: Mapping[TableName, mirror.MirrorProgress],
                    snapshotting: set[TableName], *, durable: int | None, current: int,
                    reader: str | None) -> list[int]:
    """Table states, reader and apply status and the end-to-end lag; returns the applied LSNs
    of the streaming tables (empty: nothing has been snapshotted yet)."""
    status = report.status
    applied = []
    for row in status.tables:
        table = TableName(row.schema_name, row.name)
        p = progress.get(table)
        if row.state == "Failed" or p is None:
            continue
        if p.lsn is not None and table not in snapshotting:
            row.state = "Streaming"
            row.snapshot_lsn = lsn_text(p.snapshot_lsn) or row.snapshot_lsn or lsnlib.format(p.lsn)
            row.applied_lsn = lsnlib.format(p.lsn)
            row.rows_known = p.rows
            applied.append(p.lsn)
        else:
            row.state = "Snapshotting" if table in snapshotting else "Pending"
    status.reader = ReaderStatus(
        pod=reader, durable_lsn=lsn_text(durable),
        lag_bytes=max(current - durable, 0) if durable is not None else None)
    if applied:
        commits = [p.committed_at_ms for p in progress.values() if p.committed_at_ms]
        status.apply = ApplyStatus(
            applied_lsn=lsnlib.format(min(applied)),
            last_commit_time=datetime.fromtimestamp(max(commits) / 1000, timezone.utc)
            if commits else None)
        status.lag_bytes = max(current - min(applied), 0)
    return applied


def streaming(report: Report, applied: list[int], *, reader_problem: str | None,
              apply_problem: str | None) -> None:
    """``Streaming``: the first thing that keeps changes from flowing, else True."""
    if reader_problem:
        report.condition("Streaming", False, "ReaderNotReady", reader_problem)
    elif not applied:
        report.condition("Streaming", False, "WaitingForSnapshot",
                         "no table has been snapshotted yet")
    elif apply_problem:
        report.condition("Streaming", False, "ApplyNotRunning", apply_problem)
    else:
        report.condition("Streaming", True, "Streaming",
                         f"{len(applied)} table(s) streaming, lag {report.status.lag_bytes} bytes")


def lsn_text(value: int | None) -> str | None:
    return None if value is None else lsnlib.format(value)


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
