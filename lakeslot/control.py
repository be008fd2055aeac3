"""The control steps against the source, taken once per reconcile by the operator, per start by
``lakeslot run`` and per ``lakeslot status`` (read-only): one sequence, so all three report the
same conditions with the same messages (:mod:`lakeslot.status` builds the report).

Steps, each gating the next:

1. **Connect** — an ``OperationalError`` is the condition ``SourceReady: ConnectionFailed`` with
   libpq's first line (never a credential: libpq does not print the password).
2. **Check the source** (:func:`check_source`, ``SourceReady``) — the selected tables, preflight
   (a server-level finding fails the step; a table's own finding fails only that table, which is
   ``Failed`` in ``status.tables`` with the fix; a note — e.g. generated columns left out of the
   mirror — is the message of a table that passed), publication sync.
3. **Ensure the slot** (:func:`ensure_slot`, ``SlotReady``) — created before any snapshot
   (DESIGN.md rule 2); a lost slot follows ``policies.onSlotLost``: ``Error`` stops here,
   ``Resnapshot`` empties staging first (:func:`discard_staging`: the staged changes came from
   the lost slot and have a gap; a reader on the new slot may write right after it exists), then
   recreates the slot and records ``status.resnapshotBelowLsn``; every holder other than the
   legitimate reader is terminated (stale-holder eviction, an event each).
4. **Read the current WAL LSN** — the end of the lag measure and ``--once``'s target.

Read-only mode (``lakeslot status``) changes nothing: no publication sync, no slot creation or
eviction; a missing slot is ``SlotReady: SlotMissing`` and the steps go on.

Failure modes: every failure is a condition of the report and :func:`take_control` returns None;
only errors that are not the source's answer (bugs, Kubernetes) propagate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from lakeslot import lsn as lsnlib
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import IngestionNames
from lakeslot.source import connection, preflight, publication, slot
from lakeslot.source.tables import TableName, selected
from lakeslot.staging.store import Staging
from lakeslot.status import Report, first_line, slot_condition, table_rows

Connect = Callable[..., psycopg.Connection]


@dataclass(frozen=True)
class Source:
    """What the steps found: the usable tables, the slot (None only in read-only mode when it
    does not exist yet) and the server's current WAL LSN."""

    tables: list[TableName]
    health: slot.SlotHealth | None
    current_lsn: int


def take_control(settings: connection.ConnectionSettings, ingestion: PostgresIngestion,
                 report: Report, *, component: str, reader: str | None,
                 read_only: bool = False, connect: Connect = connection.connect) -> Source | None:
    """Steps 1–4 (see the module docstring) as ``component`` (its application_name); ``reader``
    is the legitimate reader's application_name (None: no reader runs yet). None when a step
    failed: the report's conditions say which and why."""
    names = IngestionNames.of(ingestion)
    try:
        with connect(settings, connection.application_name(component, names.owner),
                     long_running=not read_only) as conn:
            tables = check_source(conn, ingestion, report, sync_publication=not read_only)
            if tables is None:
                return None
            if read_only:
                health = slot.health(conn, names.slot)
                if health is None:
                    report.condition("SlotReady", False, "SlotMissing",
                                     f"slot {names.slot} does not exist yet: lakeslot run creates it")
                elif not slot_condition(report, health):
                    return None
            else:
                health = ensure_slot(conn, ingestion, report, legitimate=reader)
                if health is None:
                    return None
            return Source(tables, health, current_lsn(conn))
    except psycopg.OperationalError as e:
        report.condition("SourceReady", False, "ConnectionFailed", first_line(e))
        return None


def check_source(conn: psycopg.Connection, ingestion: PostgresIngestion, report: Report, *,
                 sync_publication: bool = True) -> list[TableName] | None:
    """Preflight and publication sync; the usable tables, or None when the step failed (the
    condition says why). ``sync_publication=False`` only reads (``lakeslot status``)."""
    names = IngestionNames.of(ingestion)
    source = ingestion.spec.source
    tables = selected(conn, source)
    options = {TableName(t.schema_name, t.name): t for t in source.tables}
    findings = preflight.run(
        conn, tables,
        key_columns={t: o.key_columns for t, o in options.items()},
        excluded_columns={t: o.exclude_columns for t, o in options.items()},
        slot_name=names.slot)
    failed = preflight.failures(findings)
    server = [f for f in failed if f.table is None]
    if server:
        report.condition("SourceReady", False, "PreflightFailed", "\n".join(str(f) for f in server))
        return None
    broken: dict[TableName, list[str]] = {}
    for finding in failed:
        assert finding.table is not None  # server-level findings returned above
        broken.setdefault(finding.table, []).append(str(finding))
    good = [t for t in tables if t not in broken]
    noted: dict[TableName, list[str]] = {}
    for finding in preflight.notes(findings):
        assert finding.table is not None  # notes are about a table
        noted.setdefault(finding.table, []).append(
            finding.message + (f" — {finding.fix}" if finding.fix else ""))
    table_rows(report, tables, broken, noted)
    if sync_publication:
        sync = publication.sync(conn, names.publication, good, owner=names.owner)
        if not sync.ok:
            report.condition("SourceReady", False, "PublicationOutOfSync", "\n".join(sync.errors))
            return None
        for table in sync.added:
            report.tell("Normal", "TableAdded", f"{table} added to publication {names.publication}")
        for table in sync.removed:
            report.tell("Normal", "TableRemoved",
                        f"{table} removed from publication {names.publication}; its mirror is kept")
    if not good:
        report.condition("SourceReady", False, "NoUsableTable",
                         "every selected table failed its checks (see status.tables)")
        return None
    report.condition("SourceReady", True, "PreflightPassed",
                     f"{len(good)} table(s) ready" + (f", {len(broken)} failed" if broken else ""))
    return good


def ensure_slot(conn: psycopg.Connection, ingestion: PostgresIngestion, report: Report, *,
                legitimate: str | None) -> slot.SlotHealth | None:
    """Ensure the slot, handle a lost one per ``onSlotLost``, terminate every holder other than
    ``legitimate`` (the reader's application_name; None: no reader runs yet). The slot's
    health, or None when the step failed (``SlotReady`` says why)."""
    slot_name = IngestionNames.of(ingestion).slot
    try:
        ensured = slot.ensure(conn, slot_name)
    except slot.SlotError as e:
        report.condition("SlotReady", False, "SlotUnusable", str(e))
        return None
    if ensured.created:
        assert ensured.creation_lsn is not None  # known whenever this call created the slot
        report.tell("Normal", "SlotCreated", f"slot {slot_name} created at "
                    f"{lsnlib.format(ensured.creation_lsn)}")
    health = slot.health(conn, slot_name)
    assert health is not None  # ensured just now
    lost = slot.lost_reason(health)
    if lost and ingestion.spec.policies.on_slot_lost == "Resnapshot":
        staging_uri = ingestion.spec.staging.uri
        try:
            discard_staging(staging_uri)
        except OSError as e:
            report.condition("SlotReady", False, "StagingUnreachable", (
                f"{lost}; to recreate it (onSlotLost: Resnapshot) staging must be emptied first, "
                f"but it cannot be written: {e}. Give the operator access to {staging_uri} "
                "(e.g. object-store credentials in its environment) or delete the segments "
                "there by hand"))
            return None
        fresh = slot.recreate(conn, slot_name)
        # recreate() drops the slot first, so its ensure() is the call that creates it.
        assert fresh.creation_lsn is not None
        report.status.resnapshot_below_lsn = lsnlib.format(fresh.creation_lsn)
        report.tell("Warning", "SlotRecreated", f"{lost}; recreated it at "
                    f"{lsnlib.format(fresh.creation_lsn)}, emptied staging and re-snapshotting "
                    "every table (onSlotLost: Resnapshot)")
        report.status.snapshot = None
        health = slot.health(conn, slot_name)
        assert health is not None  # recreated just now
    elif lost:
        slot_condition(report, health)
        return None
    for eviction in slot.evict_stale_holders(conn, slot_name, legitimate):
        report.tell("Warning", "StaleHolderEvicted",
                    f"terminated backend {eviction.pid} ({eviction.application_name!r}) holding "
                    f"slot {slot_name}; the reader is {legitimate!r}")
    slot_condition(report, health)
    return health


def discard_staging(uri: str) -> None:
    """Delete every sealed segment (they belong to a slot that no longer exists); OSError when
    staging cannot be written."""
    staging = Staging(uri)
    for segment in staging.list():
        staging.delete(segment)


def current_lsn(conn: psycopg.Connection) -> int:
    return connection.one_row(conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::int8"))[0]
