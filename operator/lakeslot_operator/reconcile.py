"""One idempotent, level-based reconcile of a PostgresIngestion.

``reconcile(body, ctx)`` looks at the world as it is now (the resource, PostgreSQL, the
children, the mirror tables in Iceberg), moves it one step towards the spec, and returns the
complete status to write plus the events worth telling. It is called from every kopf handler and
from a timer; calling it twice in a row changes nothing the second time.

Steps, each gating the next (a failed step leaves later conditions Unknown/False and says why):

1. **Spec** — validated with the same pydantic models as ``lakeslot validate``; an invalid
   spec is a condition (``InvalidSpec``), never a crash loop.
2. **Suspend** — reader scaled to 0 and the apply job removed; the slot stays and its retained
   WAL keeps being reported.
3. **Source** (``SourceReady``) — secrets, connection, preflight, publication sync. A table that
   fails its own checks is ``Failed`` with the fix in its message; the others go on.
4. **Slot** (``SlotReady``) — ensure; a lost slot follows ``onSlotLost`` (``Error`` stops,
   ``Resnapshot`` recreates it and re-snapshots every table); any holder other than the current
   reader pod is terminated (stale-holder eviction), and an event says so.
5. **Children** — reader Deployment (always, once the slot is ready), snapshot SparkApplication
   for the tables Iceberg shows without ``lakeslot.lsn`` (or all of them after a re-snapshot
   request), apply SparkApplication once a table has been snapshotted.
6. **Status** — per-table progress from Iceberg (invariant 1: a table's ``lakeslot.lsn`` is the
   truth), the reader's durable LSN from the slot's ``confirmed_flush_lsn`` (invariant 4: the
   reader confirms only what is sealed), lag from the server's current LSN; conditions with
   ``observedGeneration``; phase.

Failure modes: PostgreSQL unreachable or a catalog error → the relevant condition is False with
the error text (never a password: libpq's messages do not contain it) and the timer retries;
Kubernetes API errors propagate to kopf, which retries with backoff.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pydantic

from lakeslot import lsn as lsnlib
from lakeslot import mirror, workloads
from lakeslot.api import conditions as cond
from lakeslot.api.models import (
    ApplyStatus,
    PostgresIngestion,
    PostgresIngestionStatus,
    ReaderStatus,
    SlotStatus,
    SnapshotStatus,
    SourceSpec,
    TableStatus,
)
from lakeslot.api.naming import effective_publication_name, effective_slot_name
from lakeslot.api.validation import parse_resource, problems_of
from lakeslot.source import connection, preflight, publication, slot
from lakeslot.reader.segments import Staging
from lakeslot.source.tables import TableName, selected
from lakeslot_operator import children
from lakeslot_operator.kube import Kube

TERMINAL_SPARK_STATES = ("COMPLETED", "FAILED")
SNAPSHOT_BACKOFF_S = 30
SNAPSHOT_BACKOFF_MAX_S = 3600
OPERATOR_CONNECT_TIMEOUT_S = "10"
# Reasons that waiting will not fix: the user must act (the message says how).
DEFINITE = ("InvalidSpec", "SlotLost", "SlotUnusable")


@dataclass
class Context:
    kube: Kube
    config: children.OperatorConfig = field(default_factory=children.OperatorConfig)
    connect: Callable[..., psycopg.Connection] = connection.connect
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Outcome:
    status: dict
    events: list[Event]


class _Report:
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

    def outcome(self) -> Outcome:
        return Outcome(self.status.to_document(), self.events)


def reconcile(body: Mapping, ctx: Context) -> Outcome:
    meta = body["metadata"]
    report = _Report(PostgresIngestionStatus.model_validate(body.get("status") or {}),
                     meta.get("generation", 0), ctx.now())
    try:
        ingestion = parse_resource({k: v for k, v in body.items() if k != "status"})
    except pydantic.ValidationError as e:
        report.condition("Ready", False, "InvalidSpec",
                         "\n".join(str(p) for p in problems_of(e)))
        report.status.phase = "Failed"
        return report.outcome()
    _Reconciler(ingestion, meta["uid"], ctx, report).run()
    return report.outcome()


class _Reconciler:
    def __init__(self, ingestion: PostgresIngestion, uid: str, ctx: Context, report: _Report):
        self.ing = ingestion
        self.uid = uid
        self.ctx = ctx
        self.r = report
        self.ns = ingestion.metadata.namespace or "default"
        self.owner = f"{self.ns}/{ingestion.metadata.name}"
        source = ingestion.spec.source
        self.slot_name = effective_slot_name(self.ns, ingestion.metadata.name, source)
        self.pub_name = effective_publication_name(self.ns, ingestion.metadata.name, source)
        report.status.publication_name = self.pub_name
        self.progress: dict[TableName, mirror.MirrorProgress] = {}
        self.snapshotting: set[TableName] = set()

    # the steps -----------------------------------------------------------------------------

    def run(self) -> None:
        spec = self.ing.spec
        if spec.suspend:
            self._suspend()
            return
        settings = self._settings()
        if settings is None:
            return
        try:
            with self.ctx.connect(settings, connection.application_name("operator", self.owner),
                                  long_running=True) as conn:
                tables = self._source(conn)
                if tables is None:
                    return
                health = self._slot(conn)
                if health is None:
                    return
                current_lsn = conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::int8"
                                           ).fetchone()[0]
        except psycopg.OperationalError as e:
            self.r.condition("SourceReady", False, "ConnectionFailed", _first_line(e))
            self._summarize()
            return
        self._children(tables)
        self._progress(tables, health, current_lsn)
        self._summarize()

    def _settings(self) -> connection.ConnectionSettings | None:
        try:
            return source_settings(self.ctx.kube, self.ns, self.ing.spec.source)
        except LookupError as e:
            self.r.condition("SourceReady", False, "SecretNotFound", str(e))
            self._summarize()
            return None

    def _source(self, conn: psycopg.Connection) -> list[TableName] | None:
        source = self.ing.spec.source
        tables = selected(conn, source)
        options = {TableName(t.schema_name, t.name): t for t in source.tables}
        findings = preflight.run(
            conn, tables,
            key_columns={t: o.key_columns for t, o in options.items()},
            excluded_columns={t: o.exclude_columns for t, o in options.items()},
            slot_name=self.slot_name)
        failed = preflight.failures(findings)
        server = [f for f in failed if f.table is None]
        if server:
            self.r.condition("SourceReady", False, "PreflightFailed",
                             "\n".join(str(f) for f in server))
            self._summarize()
            return None
        broken = {}
        for finding in failed:
            broken.setdefault(finding.table, []).append(str(finding))
        good = [t for t in tables if t not in broken]
        self._table_rows(tables, broken)
        sync = publication.sync(conn, self.pub_name, good, owner=self.owner)
        if not sync.ok:
            self.r.condition("SourceReady", False, "PublicationOutOfSync", "\n".join(sync.errors))
            self._summarize()
            return None
        for table in sync.added:
            self.r.tell("Normal", "TableAdded", f"{table} added to publication {self.pub_name}")
        for table in sync.removed:
            self.r.tell("Normal", "TableRemoved",
                        f"{table} removed from publication {self.pub_name}; its mirror is kept")
        if not good:
            self.r.condition("SourceReady", False, "NoUsableTable",
                             "every selected table failed its checks (see status.tables)")
            self._summarize()
            return None
        self.r.condition("SourceReady", True, "PreflightPassed",
                         f"{len(good)} table(s) ready" + (f", {len(broken)} failed" if broken else ""))
        return good

    def _slot(self, conn: psycopg.Connection) -> slot.SlotHealth | None:
        policies = self.ing.spec.policies
        try:
            ensured = slot.ensure(conn, self.slot_name)
        except slot.SlotError as e:
            self.r.condition("SlotReady", False, "SlotUnusable", str(e))
            self._summarize()
            return None
        if ensured.created:
            self.r.tell("Normal", "SlotCreated", f"slot {self.slot_name} created at "
                        f"{lsnlib.format(ensured.creation_lsn)}")
        health = slot.health(conn, self.slot_name)
        lost = slot.lost_reason(health)
        if lost and policies.on_slot_lost == "Resnapshot":
            # The staged changes came from the lost slot and have a gap: none of them may be
            # applied any more, and the reader resumes at the new slot once staging is empty
            # (emptied first: a reader on the new slot may be writing right after it exists).
            staging = Staging(self.ing.spec.staging.uri)
            for segment in staging.list():
                staging.delete(segment)
            fresh = slot.recreate(conn, self.slot_name)
            self.r.status.resnapshot_below_lsn = lsnlib.format(fresh.creation_lsn)
            self.r.tell("Warning", "SlotRecreated", f"{lost}; recreated it at "
                        f"{lsnlib.format(fresh.creation_lsn)}, emptied staging and re-snapshotting "
                        "every table (onSlotLost: Resnapshot)")
            self.r.status.snapshot = None
            health = slot.health(conn, self.slot_name)
        elif lost:
            self.r.condition("SlotReady", False, "SlotLost",
                             f"{lost}. Changes are missing: fix the cause (e.g. raise "
                             "max_slot_wal_keep_size), then set policies.onSlotLost: Resnapshot "
                             "to recreate the slot, empty staging and copy every table again")
            self._slot_status(health)
            self._summarize()
            return None
        legitimate = self._reader_identity()
        for eviction in slot.evict_stale_holders(conn, self.slot_name, legitimate):
            self.r.tell("Warning", "StaleHolderEvicted",
                        f"terminated backend {eviction.pid} ({eviction.application_name!r}) holding "
                        f"slot {self.slot_name}; the reader is {legitimate!r}")
        self._slot_status(health)
        self.r.condition("SlotReady", True, "SlotHealthy",
                         f"slot {self.slot_name} wal_status={health.wal_status}")
        return health

    # children ------------------------------------------------------------------------------

    def _reader_pod(self) -> str | None:
        pods = self.ctx.kube.list_pods(self.ns, {children.INGESTION_LABEL: self.ing.metadata.name,
                                                 children.COMPONENT_LABEL: "reader"})
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")
                and p.get("status", {}).get("phase") in ("Pending", "Running")]
        return max(live, key=lambda p: p["metadata"]["creationTimestamp"])["metadata"]["name"] \
            if live else None

    def _reader_identity(self) -> str | None:
        pod = self._reader_pod()
        return connection.application_name("reader", self.owner, pod) if pod else None

    def _children(self, tables: list[TableName]) -> None:
        kube, ing, config = self.ctx.kube, self.ing, self.ctx.config
        kube.ensure(children.reader_deployment(
            ing, self.uid, config, workloads.reader_command(ing, self.slot_name, self.pub_name),
            replicas=1))
        progress = self._mirror_progress(tables)
        if progress is None:
            return
        self._snapshot(tables, progress)
        if any(p.lsn is not None for p in progress.values()):
            kube.ensure(children.apply_application(
                ing, self.uid, config, workloads.apply_arguments(ing, tables)))

    def _mirror_progress(self, tables: list[TableName]) -> dict[TableName, mirror.MirrorProgress] | None:
        try:
            self.progress = mirror.progress(self.ing.spec.sink, tables)
        except Exception as e:  # noqa: BLE001 - any catalog failure is reported, then retried
            self.r.condition("Streaming", False, "CatalogUnreachable", _first_line(e))
            return None
        return self.progress

    def _snapshot(self, tables: list[TableName], progress: dict) -> None:
        spec = self.ing.spec.snapshot
        observed = self.r.status.observed_resnapshot_generation or 0
        resnapshot = spec.resnapshot_generation > observed
        below_text = self.r.status.resnapshot_below_lsn
        below = lsnlib.parse(below_text) if below_text else 0
        cut_off = [t for t in tables if progress[t].lsn is not None and progress[t].lsn < below]
        if below and not cut_off:
            self.r.status.resnapshot_below_lsn = None
        wanted = sorted(tables if resnapshot else
                        [t for t in tables if progress[t].lsn is None or t in cut_off])
        if not wanted or (spec.mode == "never" and not resnapshot and not cut_off):
            if self.r.status.snapshot and self.r.status.snapshot.state != "COMPLETED":
                self.r.status.snapshot = None
            self.r.condition("SnapshotComplete", True, "SnapshotComplete",
                             "every table has a snapshot in Iceberg")
            if resnapshot:
                self.r.status.observed_resnapshot_generation = spec.resnapshot_generation
            return
        digest = hashlib.sha256("\0".join([*map(str, wanted), str(below)]).encode()).hexdigest()[:8]
        generation = f"g{spec.resnapshot_generation}-{digest}"
        name = children.snapshot_name(self.ing, generation)
        state = self.r.status.snapshot
        if state is None or state.generation != generation:
            state = SnapshotStatus(application=name, generation=generation,
                                   tables=[str(t) for t in wanted])
        app = self.ctx.kube.get_spark_application(self.ns, name)
        if app is None:
            if state.state == "FAILED" and not self._backoff_over(state):
                pass
            else:
                self.ctx.kube.ensure(children.snapshot_application(
                    self.ing, self.uid, self.ctx.config,
                    workloads.snapshot_arguments(self.ing, wanted, min_snapshot_lsn=below),
                    generation=generation))
                state.state = "SUBMITTED"
                self.r.tell("Normal", "SnapshotStarted", f"{name}: {len(wanted)} table(s)")
        else:
            app_state = app.get("status", {}).get("applicationState", {})
            new_state = app_state.get("state") or "SUBMITTED"
            if new_state in TERMINAL_SPARK_STATES and state.state != new_state:
                state.finished_at = self.r.now
                if new_state == "FAILED":
                    state.attempts += 1
                    state.message = app_state.get("errorMessage", "")[:4000]
            state.state = new_state
            if new_state == "FAILED" and self._backoff_over(state):
                self.ctx.kube.delete_spark_application(self.ns, name)  # resubmitted next time
            if new_state == "COMPLETED" and resnapshot:
                self.r.status.observed_resnapshot_generation = spec.resnapshot_generation
        self.r.status.snapshot = state
        if state.state == "FAILED":
            self.r.condition("SnapshotComplete", False, "SnapshotFailed",
                             f"{name} failed (attempt {state.attempts}): {state.message}")
        else:
            self.r.condition("SnapshotComplete", False, "Snapshotting",
                             f"{name}: {state.state} for {len(wanted)} table(s)")
        self.snapshotting = set(wanted)

    def _backoff_over(self, state: SnapshotStatus) -> bool:
        delay = min(SNAPSHOT_BACKOFF_S * 2 ** max(state.attempts - 1, 0), SNAPSHOT_BACKOFF_MAX_S)
        return state.finished_at is None or self.r.now >= state.finished_at + timedelta(seconds=delay)

    def _suspend(self) -> None:
        kube = self.ctx.kube
        kube.scale_deployment(self.ns, children.child_name(self.ing, "reader"), 0)
        kube.delete_spark_application(self.ns, children.child_name(self.ing, "apply"))
        self.r.status.phase = "Suspended"
        self.r.condition("Streaming", False, "Suspended", "spec.suspend is true: the reader and "
                         "the apply job are stopped; the slot keeps retaining WAL")
        self.r.condition("Ready", False, "Suspended", "spec.suspend is true")
        settings = self._settings()
        if settings is None:
            return
        try:
            with self.ctx.connect(settings, connection.application_name("operator", self.owner)
                                  ) as conn:
                health = slot.health(conn, self.slot_name)
        except psycopg.OperationalError as e:
            self.r.condition("SourceReady", False, "ConnectionFailed", _first_line(e))
            return
        if health is not None:
            self._slot_status(health)

    # status --------------------------------------------------------------------------------

    def _slot_status(self, health: slot.SlotHealth) -> None:
        self.r.status.slot = SlotStatus(
            name=health.name, active_pid=health.active_pid, holder=health.holder,
            confirmed_flush_lsn=_lsn_text(health.confirmed_flush_lsn),
            restart_lsn=_lsn_text(health.restart_lsn), wal_status=health.wal_status,
            safe_wal_size=health.safe_wal_size,
            retained_bytes=max(health.retained_bytes or 0, 0))

    def _table_rows(self, tables: list[TableName], broken: dict[TableName, list[str]]) -> None:
        previous = {(t.schema_name, t.name): t for t in self.r.old.tables}
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
        self.r.status.tables = rows
        self.r.status.table_count = len(tables)

    def _progress(self, tables: list[TableName], health: slot.SlotHealth, current: int) -> None:
        progress, snapshotting = self.progress, self.snapshotting
        applied = []
        for row in self.r.status.tables:
            table = TableName(row.schema_name, row.name)
            p = progress.get(table)
            if row.state == "Failed" or p is None:
                continue
            if p.lsn is not None and table not in snapshotting:
                row.state = "Streaming"
                row.snapshot_lsn = row.snapshot_lsn or lsnlib.format(p.lsn)
                row.applied_lsn = lsnlib.format(p.lsn)
                row.rows_known = p.rows
                applied.append(p.lsn)
            else:
                row.state = "Snapshotting" if table in snapshotting else "Pending"
        pod = self._reader_pod()
        durable = health.confirmed_flush_lsn
        self.r.status.reader = ReaderStatus(
            pod=pod, durable_lsn=_lsn_text(durable),
            lag_bytes=max(current - durable, 0) if durable is not None else None)
        if applied:
            commits = [p.committed_at_ms for p in progress.values() if p.committed_at_ms]
            self.r.status.apply = ApplyStatus(
                applied_lsn=lsnlib.format(min(applied)),
                last_commit_time=datetime.fromtimestamp(max(commits) / 1000, timezone.utc)
                if commits else None)
            self.r.status.lag_bytes = max(current - min(applied), 0)
        reader_ready = self.ctx.kube.deployment_available(
            self.ns, children.child_name(self.ing, "reader"))
        apply_state = self.ctx.kube.spark_application_state(
            self.ns, children.child_name(self.ing, "apply"))
        if not reader_ready:
            self.r.condition("Streaming", False, "ReaderNotReady",
                             "the reader Deployment has no available replica yet")
        elif not applied:
            self.r.condition("Streaming", False, "WaitingForSnapshot",
                             "no table has been snapshotted yet")
        elif apply_state != "RUNNING":
            self.r.condition("Streaming", False, "ApplyNotRunning",
                             f"the apply SparkApplication is {apply_state or 'absent'}")
        else:
            self.r.condition("Streaming", True, "Streaming",
                             f"{len(applied)} table(s) streaming, lag {self.r.status.lag_bytes} bytes")

    def _summarize(self) -> None:
        status = self.r.status
        failed_tables = [t for t in status.tables if t.state == "Failed"]
        wal_danger = status.slot is not None and status.slot.wal_status == "unreserved"
        if failed_tables or wal_danger:
            what = [f"{len(failed_tables)} table(s) failed (see status.tables)"] if failed_tables else []
            if wal_danger:
                what.append("the slot's WAL is beyond max_slot_wal_keep_size and about to be "
                            "removed: the reader must catch up now")
            self.r.condition("Degraded", True, "TablesFailed" if failed_tables else "WalAtRisk",
                             "; ".join(what))
        else:
            self.r.condition("Degraded", False, "Healthy", "nothing needs attention")
        needed = ("SourceReady", "SlotReady", "SnapshotComplete", "Streaming")
        states = {c.type: c for c in status.conditions}
        not_ready = [t for t in needed if t not in states or states[t].status != "True"]
        if not_ready:
            first = states.get(not_ready[0])
            self.r.condition("Ready", False, first.reason if first else "Reconciling",
                             f"{first.type}: {first.message}" if first
                             else f"{not_ready[0]} is not known yet")
        else:
            self.r.condition("Ready", True, "Streaming", "every selected table is streaming")
        definite = [c for c in status.conditions if c.status == "False" and c.reason in DEFINITE]
        running = status.snapshot is not None and status.snapshot.state not in (None, "COMPLETED")
        status.phase = ("Failed" if definite else "Streaming" if not not_ready
                        else "Snapshotting" if running else "Pending")

def source_settings(kube: Kube, namespace: str, source: SourceSpec) -> connection.ConnectionSettings:
    """Connection settings with the Secrets resolved (LookupError names a missing one)."""
    password = kube.secret_value(namespace, source.password_secret_ref) \
        if source.password_secret_ref else None
    ca_file = _write_temp(kube.secret_value(namespace, source.ca_secret_ref)) \
        if source.ca_secret_ref else None
    settings = connection.settings_from_spec(source, password=password, ca_file=ca_file)
    settings.extra.setdefault("connect_timeout", OPERATOR_CONNECT_TIMEOUT_S)
    return settings


def _lsn_text(value: int | None) -> str | None:
    return None if value is None else lsnlib.format(value)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _write_temp(text: str) -> str:
    """A file holding ``text`` (libpq reads the CA from a file), named by its content so that
    repeated reconciles reuse one file."""
    path = Path(tempfile.gettempdir()) / f"lakeslot-ca-{hashlib.sha256(text.encode()).hexdigest()[:16]}.crt"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return str(path)
