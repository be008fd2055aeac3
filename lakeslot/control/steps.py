"""The control steps against the source, taken once per reconcile by the operator, per start by
``lakeslot run`` and per ``lakeslot status`` (read-only): one sequence, so all three report the
same conditions with the same messages (:mod:`lakeslot.observability.status_report` builds the report).

Steps, each gating the next:

1. **Connect** — an ``OperationalError`` is the condition ``SourceReady: ConnectionFailed`` with
   libpq's first line (never a credential: libpq does not print the password).
2. **Check the source** (:func:`check_source`, ``SourceReady``) — the selected tables, preflight
   (a server-level finding fails the step; a table's own finding fails only that table, which is
   ``Failed`` in ``status.tables`` with the fix — so does a mirror name another selected table
   maps to as well, :meth:`lakeslot.api.naming.IngestionNames.collisions`; a note — e.g.
   generated columns left out of the mirror — is the message of a table that passed),
   publication sync — or, for a publication lakeslot does not manage
   (:func:`lakeslot.source.publication.plan`, ``status.publicationManagedBy``), verification,
   also in read-only mode; a selected table it does not publish as its mirror needs is ``Failed``
   alone with the ``ALTER PUBLICATION`` for the DBA, and once published is treated as a table that
   joined. A table that joins the
   publication is copied from a snapshot taken after it joined (its row's
   ``resnapshotBelowLsn``): the rows it got before, or while it was out, are in no stream. A
   table of the previous status that is no longer selected (dropped, renamed, moved, taken out
   of the spec) stays in ``status.tables`` as ``Removed``; its mirror is kept, never deleted.
3. **Ensure the slot** (:func:`ensure_slot`, ``SlotReady``) — created before any snapshot
   (DESIGN.md rule 2); a lost slot follows ``policies.onSlotLost``: ``Error`` stops here,
   ``Resnapshot`` empties staging first (:func:`discard_staging`: the staged changes came from
   the lost slot and have a gap; a reader on the new slot may write right after it exists), then
   recreates the slot and records ``status.resnapshotBelowLsn``; every holder other than the
   legitimate reader is terminated (stale-holder eviction, an event each). A slot missing on a
   server whose timeline differs from staging's was lost by a failover
   (:func:`lakeslot.source.failover.lost_by_failover`) and follows ``onSlotLost`` too, instead
   of being created afresh over the gap. ``status.slot.failoverSafe`` and the ``SlotReady``
   message say whether a failover would keep the slot (:func:`lakeslot.source.failover.safety`).
4. **Read the current WAL LSN** — the end of the lag measure and ``--once``'s target.

The selection (``spec.source.schemas`` and listed tables) is resolved by every call of
:func:`check_source` — every reconcile of the operator. ``lakeslot run`` takes the steps at start,
then, while it streams, asks :func:`selection_fingerprint` (one catalog query) and takes
:func:`check_source` again only when its answer changed.

Read-only mode (``lakeslot status``) changes nothing: no publication sync, no slot creation or
eviction; a missing slot is ``SlotReady: SlotMissing`` and the steps go on.

Failure modes: every failure is a condition of the report and :func:`take_control` returns None;
only errors that are not the source's answer (bugs, Kubernetes) propagate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psycopg

from lakeslot import lsn_text
from lakeslot.api.models import PostgresIngestion, SourceSpec
from lakeslot.api.naming import IngestionNames, TableName, collision_fix, quote_ident
from lakeslot.mirror import catalogs
from lakeslot.observability.status_report import (
    Report,
    first_line,
    lost_condition,
    slot_condition,
    slot_status,
    table_rows,
)
from lakeslot.source import connection, ddl_capture, failover, preflight, publication, slot
from lakeslot.source.columns import ColumnOptions
from lakeslot.source.tables import selected
from lakeslot.staging.store import Staging

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
                 read_only: bool = False, connect: Connect = connection.connect,
                 environ: Mapping[str, str] | None = None) -> Source | None:
    """Steps 1–4 (see the module docstring) as ``component`` (its application_name); ``reader``
    is the legitimate reader's application_name (None: no reader runs yet); ``environ``: the
    settings staging is reached with (the ingestion's ``secretEnv`` in the operator; None: this
    process's environment). None when a step failed: the report's conditions say which and
    why."""
    names = IngestionNames.of(ingestion)
    try:
        with connect(settings, connection.application_name(component, names.owner),
                     long_running=not read_only) as conn:
            tables = check_source(conn, ingestion, report, sync_publication=not read_only)
            if tables is None:
                return None
            if read_only:
                health = slot.health(conn, names.slot)
                lost = None if health is not None else _lost_by_failover(conn, ingestion, environ)
                if lost is not None:
                    lost_condition(report, lost)
                    return None
                if health is None:
                    report.condition("SlotReady", False, "SlotMissing",
                                     f"slot {names.slot} does not exist yet: lakeslot run creates it")
                elif not slot_condition(report, health, _failover_safety(conn, ingestion, health)):
                    return None
            else:
                health = ensure_slot(conn, ingestion, report, legitimate=reader, environ=environ)
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
    column_options = {t: ColumnOptions.of(o) for t, o in options.items()}
    plan = publication.plan(conn, names.publication, owner=names.owner,
                            setting=source.publication_management)
    report.status.publication_managed_by = plan.managed_by
    findings = preflight.run(
        conn, tables, options=column_options,
        partition_by={t: o.partition_fields() for t, o in options.items()},
        manage_publication=plan.managed, create_publication=plan.managed and not plan.exists,
        slot_name=names.slot, failover_slot=source.failover_slot,
        on_slot_lost=ingestion.spec.policies.on_slot_lost,
        folding_catalog=catalogs.folding(ingestion.spec.sink.catalog))
    failed = preflight.failures(findings)
    server = [f for f in failed if f.table is None]
    if server:
        report.condition("SourceReady", False, "PreflightFailed", "\n".join(str(f) for f in server))
        return None
    broken: dict[TableName, list[str]] = {}
    for finding in failed:
        assert finding.table is not None  # server-level findings returned above
        broken.setdefault(finding.table, []).append(str(finding))
    established = {TableName(r.schema_name, r.name) for r in report.old.tables
                   if r.state not in ("Failed", "Removed")}
    for table, why in names.collisions(tables, established).items():
        broken.setdefault(table, []).append(f"{table}: {why} — fix: {collision_fix(table, names.table_template)}")
    good = [t for t in tables if t not in broken]
    noted: dict[TableName, list[str]] = {}
    for finding in preflight.notes(findings):
        assert finding.table is not None  # notes are about a table
        noted.setdefault(finding.table, []).append(
            finding.message + (f" — {finding.fix}" if finding.fix else ""))
    removed = _departed(report, source, tables, names)
    sync = None
    if sync_publication or not plan.managed:  # (verifying only reads)
        sync = publication.sync(conn, names.publication, good, owner=names.owner,
                                manage=plan.managed, options=column_options)
        if not sync.ok:
            table_rows(report, tables, broken, noted, removed)  # (each table's own findings)
            report.condition("SourceReady", False, "PublicationOutOfSync", "\n".join(sync.errors))
            return None
        for table, why in sync.failed.items():
            broken.setdefault(table, []).append(f"{table}: {why}")
        good = [t for t in good if t not in sync.failed]
    table_rows(report, tables, broken, noted, removed)
    for table, why in removed.items():
        report.tell("Normal", "TableRemoved", f"{table}: {why}")
    if sync is not None and sync_publication:
        joined = sync.added + _published_again(report, good)
        _joined(report, joined, current_lsn(conn) if joined else 0)
        for table in sync.added:
            report.tell("Normal", "TableAdded", (
                f"{table} added to publication {names.publication}: it is copied (again, if it "
                "has a mirror) from a snapshot taken after this point, alone and online"))
        for table in sync.removed:
            if table not in removed:
                report.tell("Normal", "TableRemoved",
                            f"{table} removed from publication {names.publication}; its mirror is kept")
    if not good:
        report.condition("SourceReady", False, "NoUsableTable",
                         "every selected table failed its checks (see status.tables)")
        return None
    try:
        capture = ddl_capture.ensure(conn, source.ddl_capture, read_only=not sync_publication)
    except ddl_capture.CaptureUnavailable as e:
        report.condition("SourceReady", False, "DdlCaptureUnavailable", str(e))
        return None
    report.status.ddl_capture = capture.mode
    report.condition("SourceReady", True, "PreflightPassed",
                     f"{len(good)} table(s) ready" + (f", {len(broken)} failed" if broken else "")
                     + f"; {capture.message}")
    return good


def _departed(report: Report, source: SourceSpec, tables: list[TableName],
              names: IngestionNames) -> dict[TableName, str]:
    """The tables of the previous status that are no longer selected, each with why and what
    becomes of its mirror (kept, never deleted by lakeslot: DESIGN.md, deletion)."""
    selected = set(tables)
    departed = {}
    for row in report.old.tables:
        table = TableName(row.schema_name, row.name)
        if row.state == "Removed" or table in selected:
            continue
        why = (f"no longer in schema {quote_ident(table.schema)} (dropped, renamed or moved to "
               "another schema)" if table.schema in source.schemas
               else "no longer selected by spec.source (tables or schemas)")
        mirror = ".".join(names.mirror_identifier(table))
        departed[table] = (
            f"{why}: not replicated any more. Its mirror {mirror} is kept as it was at "
            f"{row.applied_lsn or 'its last commit'} and never deleted by lakeslot "
            "(drop it in the catalog if it is not wanted); a table of that name selected again "
            "is copied afresh")
    return departed


def _published_again(report: Report, good: list[TableName]) -> list[TableName]:
    """The tables an external publication did not publish as their mirrors need at the previous
    check (their rows were ``Failed`` with :data:`publication.NOT_MANAGED`) and now does: like a
    table lakeslot adds, each is copied from a snapshot taken after that."""
    usable = set(good)
    return [TableName(r.schema_name, r.name) for r in report.old.tables
            if r.state == "Failed" and publication.NOT_MANAGED in r.message
            and TableName(r.schema_name, r.name) in usable]


def _joined(report: Report, added: list[TableName], lsn: int) -> None:
    """Tables that joined the publication at ``lsn`` (now) hold rows their stream never carried
    (written before they joined, or while they were out of it): each is copied from a snapshot
    at or after ``lsn`` — new ones by the ordinary snapshot, those with a mirror by a re-snapshot
    of that table alone (``status.tables[].resnapshotBelowLsn``, served like a user's request,
    see :mod:`lakeslot.control.resnapshot`)."""
    rows = {TableName(r.schema_name, r.name): r for r in report.status.tables}
    for table in added:
        row = rows.get(table)
        if row is not None:
            below = max(lsn, lsn_text.parse(row.resnapshot_below_lsn) if row.resnapshot_below_lsn
                        else 0)
            row.resnapshot_below_lsn = lsn_text.format(below)


def selection_fingerprint(conn: psycopg.Connection, source: SourceSpec,
                          publication_name: str | None = None) -> tuple:
    """One catalog query whose answer changes whenever :func:`check_source` may find another
    selection: a table created, dropped, renamed, re-created or moved in or out of
    ``source.schemas``, a listed table appearing or disappearing, or a table's replica identity
    (``REPLICA IDENTITY``, its primary key or identity index) changing; with
    ``publication_name``, also what that publication publishes (its tables, their column lists
    and columns, its options: a DBA adding a table to an external one). ``lakeslot run`` asks
    it while streaming and runs :func:`check_source` again only when the answer changed."""
    published: tuple = ()
    if publication_name is not None:  # (with each published table's number of columns: one
        # added to a table with a column list is not published, which the check reports)
        published = tuple(conn.execute(
            """SELECT p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, p.pubviaroot,
                      (SELECT array_agg(to_jsonb(t)::text || (
                                SELECT count(*) FROM pg_attribute a JOIN pg_class c
                                    ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
                                 WHERE n.nspname = t.schemaname AND c.relname = t.tablename
                                   AND a.attnum > 0 AND NOT a.attisdropped)
                              ORDER BY t.schemaname, t.tablename)
                         FROM pg_publication_tables t WHERE t.pubname = p.pubname)
                 FROM pg_publication p WHERE p.pubname = %s""", (publication_name,)).fetchall())
    rows = conn.execute(
        """SELECT n.nspname, c.relname, c.oid::int8, c.relreplident::text,
                  EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid
                             AND (i.indisprimary OR i.indisreplident))
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.relkind IN ('r', 'p')
              AND ((n.nspname = ANY(%s) AND NOT c.relispartition)
                   OR (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[])))
            ORDER BY 1, 2""",
        (list(source.schemas), [t.schema_name for t in source.tables],
         [t.name for t in source.tables])).fetchall()
    return (tuple(rows), published)


def ensure_slot(conn: psycopg.Connection, ingestion: PostgresIngestion, report: Report, *,
                legitimate: str | None, environ: Mapping[str, str] | None = None) -> slot.SlotHealth | None:
    """Ensure the slot, handle a lost one per ``onSlotLost`` (a slot a failover lost counts as
    lost, :func:`lakeslot.source.failover.lost_by_failover`), terminate every holder other than
    ``legitimate`` (the reader's application_name; None: no reader runs yet). The slot's
    health, or None when the step failed (``SlotReady`` says why)."""
    slot_name = IngestionNames.of(ingestion).slot
    wanted = ingestion.spec.source.failover_slot
    health = slot.health(conn, slot_name)
    lost = _lost_by_failover(conn, ingestion, environ) if health is None else None
    if lost is None:
        try:
            ensured = slot.ensure(conn, slot_name, failover=wanted)
        except slot.SlotError as e:
            report.condition("SlotReady", False, "SlotUnusable", str(e))
            return None
        if ensured.created:
            assert ensured.creation_lsn is not None  # known whenever this call created the slot
            report.tell("Normal", "SlotCreated", f"slot {slot_name} created at "
                        f"{lsn_text.format(ensured.creation_lsn)}")
        health = slot.health(conn, slot_name)
        assert health is not None  # ensured just now
        lost = slot.lost_reason(health)
    if lost and ingestion.spec.policies.on_slot_lost == "Resnapshot":
        staging_uri = ingestion.spec.staging.uri
        try:
            discard_staging(staging_uri, environ)
        except OSError as e:
            report.condition("SlotReady", False, "StagingUnreachable", (
                f"{lost}; to recreate it (onSlotLost: Resnapshot) staging must be emptied first, "
                f"but it cannot be written: {e}. Give access to {staging_uri} (keys in "
                "spec.secretEnv, or workload identity) or delete the segments there by hand"))
            return None
        fresh = slot.recreate(conn, slot_name, failover=wanted)
        # recreate() drops the slot first, so its ensure() is the call that creates it.
        assert fresh.creation_lsn is not None
        report.status.resnapshot_below_lsn = lsn_text.format(fresh.creation_lsn)
        report.tell("Warning", "SlotRecreated", f"{lost}; recreated it at "
                    f"{lsn_text.format(fresh.creation_lsn)}, emptied staging and re-snapshotting "
                    "every table (onSlotLost: Resnapshot)")
        report.status.snapshot = None
        health = slot.health(conn, slot_name)
        assert health is not None  # recreated just now
    elif lost:
        if health is not None:  # (a slot a failover lost has no health: it is gone)
            report.status.slot = slot_status(health)  # wal_status lost: the metrics and alerts see it
        lost_condition(report, lost)
        return None
    assert health is not None  # ensured, or recreated, above
    for eviction in slot.evict_stale_holders(conn, slot_name, legitimate):
        report.tell("Warning", "StaleHolderEvicted",
                    f"terminated backend {eviction.pid} ({eviction.application_name!r}) holding "
                    f"slot {slot_name}; the reader is {legitimate!r}")
    slot_condition(report, health, _failover_safety(conn, ingestion, health))
    return health


def _lost_by_failover(conn: psycopg.Connection, ingestion: PostgresIngestion,
                      environ: Mapping[str, str] | None) -> str | None:
    """Why the missing slot was lost by a failover, or None (no evidence, or staging cannot be
    read from here). Looking creates nothing."""
    try:
        return failover.lost_by_failover(conn, IngestionNames.of(ingestion).slot,
                                         Staging(ingestion.spec.staging.uri, create=False, environ=environ))
    except (OSError, ValueError):  # unreachable, or a segment pyarrow cannot read
        return None


def _failover_safety(conn: psycopg.Connection, ingestion: PostgresIngestion,
                     health: slot.SlotHealth) -> failover.Safety:
    return failover.safety(conn, health.name, failover=health.failover,
                           on_slot_lost=ingestion.spec.policies.on_slot_lost)


def discard_staging(uri: str, environ: Mapping[str, str] | None = None) -> None:
    """Delete every sealed segment (they belong to a slot that no longer exists); OSError when
    staging cannot be written."""
    staging = Staging(uri, environ=environ)
    for segment in staging.list():
        staging.delete(segment)


def current_lsn(conn: psycopg.Connection) -> int:
    return connection.one_row(conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::int8"))[0]
