"""The PostgresIngestion status report, built one way for the operator and for local mode.

The operator writes this status into the resource; ``lakeslot run`` shows it live and
``lakeslot status`` prints it. Both build it with these functions (the control steps that feed
it are :mod:`lakeslot.control.steps`), so a condition, a reason and a message mean the same thing
wherever they are read (the operations page's conditions table, docs/operations.md).

- :class:`Report` — the status being built and the events its changes deserve.
- The progress (:func:`record_progress`): per-table state from each mirror table's
  ``lakeslot.lsn`` (DESIGN.md invariant 1), the reader's durable LSN from the slot's
  ``confirmed_flush_lsn`` (invariant 4), lag from the server's current LSN.
- ``Streaming`` says what keeps the data from flowing (:func:`streaming`).
- The summary (:func:`summary`, pure): ``Degraded``, ``Ready`` (the first failing needed
  condition) and the phase, from the other conditions, the tables and the slot.
- What the resource stores (:func:`stored`, pure): every table keeps its row, but only the first
  :data:`TABLE_DETAILS_MAX` rows (failed, pending and snapshotting tables first) keep their
  details (:data:`DETAIL_FIELDS`, recomputed every reconcile); ``tableDetailsOmitted`` counts the
  others, so the status of 1,000+ tables stays far below the API server's 1.5 MiB per object.
  ``lakeslot status`` and the metrics have every table's details.

Invariants: conditions carry ``observedGeneration``; ``lastTransitionTime`` moves only when a
condition's status flips; every condition change is also an event; messages are libpq's or
ours, never a credential.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, cast

from lakeslot import lsn_text
from lakeslot.api import conditions
from lakeslot.api.models import (
    ApplyStatus,
    ConditionStatus,
    Phase,
    PostgresIngestionSpec,
    PostgresIngestionStatus,
    ReaderStatus,
    SlotStatus,
    TableStatus,
)
from lakeslot.api.naming import TableName
from lakeslot.errors import DEFINITE_REASONS
from lakeslot.mirror.progress import MirrorProgress
from lakeslot.source import failover, slot

# A child the operator runs cannot work (lakeslot_operator.child_health): Degraded until fixed.
CHILD_REJECTED = "ChildRejected"  # the API server refused to create or change it
NAME_TAKEN = "NameTaken"  # an object of its name is not lakeslot's (left untouched)
READER_FAILING = "ReaderFailing"  # CrashLoopBackOff, ImagePullBackOff, progress deadline
APPLY_FAILED = "ApplyFailed"  # the apply SparkApplication is FAILED or SUBMISSION_FAILED
APPLY_DEGRADED = "ApplyDegraded"  # its passes keep failing as a whole (lakeslot.staging.apply_status)
CHILD_FAILURES = (CHILD_REJECTED, NAME_TAKEN, READER_FAILING, APPLY_FAILED, APPLY_DEGRADED)
NEEDED_FOR_READY = ("SourceReady", "SlotReady", "SnapshotComplete", "Streaming")
CATCHING_UP_MIN_S = 10.0  # a streaming ingestion this far behind or less is current
_CONDITION_STATUS: dict[bool | None, ConditionStatus] = {True: "True", False: "False", None: "Unknown"}


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
        value = _CONDITION_STATUS[ok]
        before = conditions.find_condition(self.old.conditions, type_)
        self.status.conditions = conditions.set_condition(
            self.status.conditions, type_, value, reason, message[:32000], now=self.now,
            observed_generation=self.generation)
        if before is None or (before.status, before.reason) != (value, reason):
            healthy = ok is True if type_ != "Degraded" else ok is False
            self.events.append(Event("Normal" if healthy else "Warning", reason,
                                     message or f"{type_} is {value}"))

    def tell(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def summarize(self) -> None:
        """Set ``Degraded``, ``Ready`` and the phase from the rest (see :func:`summary`)."""
        result = summary(self.status)
        for verdict in result.conditions:
            self.condition(verdict.type, verdict.ok, verdict.reason, verdict.message)
        self.status.phase = result.phase


@dataclass(frozen=True)
class Verdict:
    type: str
    ok: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Summary:
    conditions: tuple[Verdict, Verdict]  # Degraded, Ready
    phase: Phase


def summary(status: PostgresIngestionStatus) -> Summary:
    """``Degraded`` (a child cannot work (:data:`CHILD_FAILURES`), a table failed, or the slot's
    WAL is about to be removed), ``Ready`` (True
    when every needed condition is True, else the first failing one's reason and message) and the
    phase (``Failed`` on a definite reason, :data:`lakeslot.errors.DEFINITE_REASONS`,
    ``Streaming`` when ready, ``Snapshotting`` while a snapshot runs, else ``Pending``). Pure:
    reads ``status``, changes nothing."""
    failed_tables = [t for t in status.tables if t.state == "Failed"]
    wal_danger = status.slot is not None and status.slot.wal_status == "unreserved"
    failing = [c for c in status.conditions if c.type not in ("Ready", "Degraded")
               and c.status == "False" and c.reason in CHILD_FAILURES]
    if failing:
        degraded = Verdict("Degraded", True, failing[0].reason,
                           "; ".join(f"{c.type}: {c.message}" for c in failing))
    elif failed_tables or wal_danger:
        what = [f"{len(failed_tables)} table(s) failed (see status.tables)"] if failed_tables else []
        if wal_danger:
            what.append("the slot's WAL is beyond max_slot_wal_keep_size and about to be "
                        "removed: the reader must catch up now")
        degraded = Verdict("Degraded", True, "TablesFailed" if failed_tables else "WalAtRisk",
                           "; ".join(what))
    else:
        degraded = Verdict("Degraded", False, "Healthy", "nothing needs attention")
    states = {c.type: c for c in status.conditions if c.type not in ("Ready", "Degraded")}
    not_ready = [t for t in NEEDED_FOR_READY if t not in states or states[t].status != "True"]
    if not_ready:
        first = states.get(not_ready[0])
        ready = Verdict("Ready", False, first.reason if first else "Reconciling",
                        f"{first.type}: {first.message}" if first
                        else f"{not_ready[0]} is not known yet")
    else:
        ready = Verdict("Ready", True, "Streaming", "every selected table is streaming")
    definite = [c for c in states.values() if c.status == "False" and c.reason in DEFINITE_REASONS]
    running = status.snapshot is not None and status.snapshot.state not in (None, "COMPLETED")
    phase: Phase = ("Failed" if definite else "Streaming" if not not_ready
                    else "Snapshotting" if running else "Pending")
    return Summary((degraded, ready), phase)


# status pieces -------------------------------------------------------------------------------

def slot_condition(report: Report, health: slot.SlotHealth,
                   safety: failover.Safety | None = None) -> bool:
    """``status.slot`` and ``SlotReady`` for an existing slot (``safety``: whether a failover
    keeps it, said in the message when it would not); False when it is lost."""
    report.status.slot = slot_status(health)
    lost = slot.lost_reason(health)
    if lost:
        lost_condition(report, lost)
        return False
    if safety is not None:
        report.status.slot.failover_safe = safety.safe
    note = f"; {safety.message}" if safety is not None and not safety.safe else ""
    report.condition("SlotReady", True, "SlotHealthy",
                     f"slot {health.name} wal_status={health.wal_status}{note}")
    return True


def lost_condition(report: Report, lost: str) -> None:
    """``SlotReady: SlotLost`` saying why (``lost``) and the way out."""
    report.condition("SlotReady", False, "SlotLost",
                     f"{lost}. Changes are missing: fix the cause (e.g. raise "
                     "max_slot_wal_keep_size, or make the slot a failover slot), then set "
                     "policies.onSlotLost: Resnapshot to recreate the slot, empty staging and "
                     "copy every table again")


def snapshot_complete(report: Report) -> None:
    report.condition("SnapshotComplete", True, "SnapshotComplete",
                     "every table has a snapshot in Iceberg")


def slot_status(health: slot.SlotHealth) -> SlotStatus:
    return SlotStatus(
        name=health.name, active_pid=health.active_pid, holder=health.holder,
        confirmed_flush_lsn=lsn_text.optional(health.confirmed_flush_lsn),
        restart_lsn=lsn_text.optional(health.restart_lsn),
        # The server's text, one of these values; the model validates it at runtime.
        wal_status=cast(Literal["reserved", "extended", "unreserved", "lost"] | None, health.wal_status),
        safe_wal_size=health.safe_wal_size,
        retained_bytes=max(health.retained_bytes or 0, 0))


NOTE_PREFIX = "note: "
# Rows of status.tables the resource stores with their details, and the details the others lose.
TABLE_DETAILS_MAX = 100
DETAIL_FIELDS = ("rowsKnown", "rowsStaged", "lagSeconds", "dataFiles", "deleteFiles", "lastMaintenance")


def stored(status: Mapping) -> dict:
    """``status`` (a document) as the resource keeps it (see the module docstring)."""
    tables = list(status.get("tables") or [])
    keep = {id(row) for row in sorted(tables, key=lambda row: row.get("state") == "Streaming")[:TABLE_DETAILS_MAX]}
    rows = [row if id(row) in keep else {k: v for k, v in row.items() if k not in DETAIL_FIELDS}
            for row in tables]
    omitted = sum(1 for row in tables if id(row) not in keep and any(k in row for k in DETAIL_FIELDS))
    document = {**status, "tables": rows} if tables else dict(status)
    document["tableDetailsOmitted"] = omitted or None
    return document


REMOVED_ROWS = 20  # rows of tables no longer selected (state Removed) kept, the latest


def table_rows(report: Report, tables: list[TableName],
               broken: Mapping[TableName, list[str]],
               notes: Mapping[TableName, list[str]] | None = None,
               removed: Mapping[TableName, str] | None = None) -> None:
    """One row per selected table (kept from the previous status), Failed with the fixes;
    ``notes``: what a table that passed its checks should still say (e.g. columns left out of
    the mirror), its message (prefixed ``note: ``) unless something else is wrong. ``removed``:
    tables of the previous status that are no longer selected, each with why — their rows stay,
    ``Removed`` (with the mirror's last known position), after the selected ones; of all Removed
    rows the latest :data:`REMOVED_ROWS` are kept, and a table selected again starts afresh."""
    previous = {(t.schema_name, t.name): t for t in report.old.tables}
    rows = []
    for table in tables:
        row = previous.get((table.schema, table.name))
        if row is None or row.state == "Removed":
            row = TableStatus(schema_name=table.schema, name=table.name, state="Pending")
        row = row.model_copy()
        if table in broken:
            row.state, row.message = "Failed", "\n".join(broken[table])
            rows.append(row)
            continue
        if row.state == "Failed":
            row.state, row.message = "Pending", ""
        noted = (notes or {}).get(table)
        if noted:
            row.message = "\n".join(NOTE_PREFIX + n for n in noted)
        elif row.message.startswith(NOTE_PREFIX):
            row.message = ""
        rows.append(row)
    selected = set(tables)
    gone = [r for r in report.old.tables if r.state == "Removed"
            and TableName(r.schema_name, r.name) not in selected]
    for table, why in (removed or {}).items():
        row = previous.get((table.schema, table.name))
        if row is not None and row.state != "Removed" and table not in selected:
            gone.append(row.model_copy(update={"state": "Removed", "message": why,
                                               "rows_staged": None,
                                               "resnapshot_below_lsn": None}))
    report.status.tables = rows + gone[-REMOVED_ROWS:]
    report.status.table_count = len(tables)


SNAPSHOT_FAILED = "snapshot failed: "  # the message of a table whose last snapshot failed


def snapshot_failures(report: Report, failures: Mapping[TableName, Mapping],
                      progress: Mapping[TableName, MirrorProgress],
                      snapshotting: set[TableName]) -> None:
    """A table without a mirror whose last snapshot attempt failed says why, until it is retried:
    ``Failed`` for a definite error (a human must act: the error says how), ``Pending`` with the
    error when only retries of transient errors ran out (the next attempt may pass). ``failures``:
    :func:`lakeslot.snapshot.progress.failures` — it outlives the progress document, which each
    job rewrites with its own tables only. A table being copied again (``snapshotting``: the
    retry) is ``Snapshotting``, its message still saying what failed last time; a table with a
    mirror shows no snapshot failure; a table that failed its checks (preflight) keeps that
    finding. Call after :func:`table_rows`; :func:`record_progress` keeps a Failed row as it is."""
    for row in report.status.tables:
        table = TableName(row.schema_name, row.name)
        failure = failures.get(table)
        p = progress.get(table)
        if row.state == "Removed" or p is None:
            continue
        if failure is None or p.lsn is not None:  # copied since (or never failed)
            if row.message.startswith(SNAPSHOT_FAILED):
                row.message = ""
            continue
        if row.state == "Failed":  # its checks failed: that finding is what to fix first
            continue
        row.message = SNAPSHOT_FAILED + str(failure.get("error") or "no reason recorded")
        if table in snapshotting:
            row.message += " (copying it again)"
        elif not failure.get("transient"):
            row.state = "Failed"


def record_progress(report: Report, progress: Mapping[TableName, MirrorProgress],
                    snapshotting: set[TableName], *, durable: int | None, current: int,
                    reader: str | None) -> list[int]:
    """Table states, reader and apply status and the end-to-end lag; returns the applied LSNs
    of the streaming tables (empty: nothing has been snapshotted yet)."""
    status = report.status
    applied = []
    before = {(r.schema_name, r.name): r for r in report.old.tables}
    for row in status.tables:
        table = TableName(row.schema_name, row.name)
        p = progress.get(table)
        if row.state == "Failed" or p is None:
            continue
        if p.lsn is not None and table not in snapshotting:
            row.state = "Streaming"
            row.snapshot_lsn = lsn_text.optional(p.snapshot_lsn) or row.snapshot_lsn or lsn_text.format(p.lsn)
            row.applied_lsn = lsn_text.format(p.lsn)
            row.rows_known = p.rows
            row.data_files, row.delete_files = p.data_files, p.delete_files
            row.last_maintenance = p.maintenance or row.last_maintenance
            applied.append(p.lsn)
            if p.error is not None:  # the apply job stopped it (the mirror says why)
                row.state, row.message = "Failed", p.error
                was = before.get((table.schema, table.name))
                if was is None or (was.state, was.message) != ("Failed", p.error):
                    report.tell("Warning", "TableFailed", f"{table}: {p.error}")
            if p.schema_change is not None and p.schema_change != row.last_schema_change:
                report.tell("Normal", "SchemaChangeApplied", f"{table}: {p.schema_change}")
                row.last_schema_change = p.schema_change
        else:
            row.state = "Snapshotting" if table in snapshotting else "Pending"
    status.reader = ReaderStatus(
        pod=reader, durable_lsn=lsn_text.optional(durable),
        lag_bytes=max(current - durable, 0) if durable is not None else None)
    if applied:
        commits = [p.committed_at_ms for p in progress.values() if p.committed_at_ms]
        status.apply = ApplyStatus(
            applied_lsn=lsn_text.format(min(applied)),
            last_commit_time=datetime.fromtimestamp(max(commits) / 1000, UTC)
            if commits else None)
        status.lag_bytes = max(current - min(applied), 0)
    return applied


def catching_up_after_s(spec: PostgresIngestionSpec) -> float:
    """Freshness above which a streaming ingestion says it is catching up: more than twice what
    a change waits in a steady stream (its segment's seal, then the next apply pass), and at
    least :data:`CATCHING_UP_MIN_S`."""
    trigger = spec.apply.trigger_interval_seconds
    return max(CATCHING_UP_MIN_S, 2 * (spec.seal_seconds() + trigger))


def streaming(report: Report, applied: list[int], *, reader_problem: str | None,
              apply_problem: str | None, catching_up_after: float,
              reader_reason: str = "ReaderNotReady", apply_reason: str = "ApplyNotRunning") -> None:
    """``Streaming``: the first thing that keeps changes from flowing, else True — with reason
    ``CatchingUp`` while the mirrors are more than ``catching_up_after`` seconds behind (a
    backlog, or a new apply job's first passes), so the first minutes are not reported as
    current (the reasons of a problem default to the waiting ones; the operator passes
    :data:`CHILD_FAILURES` ones)."""
    if reader_problem:
        report.condition("Streaming", False, reader_reason, reader_problem)
    elif not applied:
        report.condition("Streaming", False, "WaitingForSnapshot",
                         "no table has been snapshotted yet")
    elif apply_problem:
        report.condition("Streaming", False, apply_reason, apply_problem)
    else:
        flowing = f"{len(applied)} table(s) streaming, lag {report.status.lag_bytes} bytes"
        behind = report.status.apply.lag_seconds if report.status.apply else None
        if behind is not None and behind > catching_up_after:
            report.condition("Streaming", True, "CatchingUp",
                             f"{flowing}, {behind} s behind the source: the apply job is catching "
                             f"up (a backlog, or its first passes warming up); current is within "
                             f"{catching_up_after:g} s")
        else:
            report.condition("Streaming", True, "Streaming", flowing)


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
