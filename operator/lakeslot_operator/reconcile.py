"""One idempotent, level-based reconcile of a PostgresIngestion.

``reconcile(body, ctx)`` looks at the world as it is now (the resource, PostgreSQL, the
children, the mirror tables in Iceberg), moves it one step towards the spec, and returns the
complete status to write plus the events worth telling. It is called from every kopf handler and
from a timer; calling it twice in a row changes nothing the second time.

Steps, each gating the next (a failed step leaves later conditions Unknown/False and says why).
Steps 3, 4 and 6 are :mod:`lakeslot.status`, shared with local mode (``lakeslot run`` and
``lakeslot status``), so both report the same conditions with the same messages:

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
from lakeslot import control, mirror, workloads
from lakeslot import status as st
from lakeslot.api.models import PostgresIngestion, PostgresIngestionStatus, SnapshotStatus, SourceSpec
from lakeslot.api.naming import IngestionNames
from lakeslot.api.validation import parse_resource, problems_of
from lakeslot.source import connection, slot
from lakeslot.source.tables import TableName
from lakeslot_operator import children
from lakeslot_operator.kube import Kube

TERMINAL_SPARK_STATES = ("COMPLETED", "FAILED")
SNAPSHOT_BACKOFF_S = 30
SNAPSHOT_BACKOFF_MAX_S = 3600
OPERATOR_CONNECT_TIMEOUT_S = "10"


@dataclass
class Context:
    kube: Kube
    config: children.OperatorConfig = field(default_factory=children.OperatorConfig)
    connect: Callable[..., psycopg.Connection] = connection.connect
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)


@dataclass
class Outcome:
    status: dict
    events: list[st.Event]


def reconcile(body: Mapping, ctx: Context) -> Outcome:
    meta = body["metadata"]
    report = st.Report(PostgresIngestionStatus.model_validate(body.get("status") or {}),
                       meta.get("generation", 0), ctx.now())
    try:
        ingestion = parse_resource({k: v for k, v in body.items() if k != "status"})
    except pydantic.ValidationError as e:
        report.condition("Ready", False, "InvalidSpec",
                         "\n".join(str(p) for p in problems_of(e)))
        report.status.phase = "Failed"
        return _outcome(report)
    _Reconciler(ingestion, meta["uid"], ctx, report).run()
    return _outcome(report)


def _outcome(report: st.Report) -> Outcome:
    return Outcome(report.status.to_document(), report.events)


class _Reconciler:
    def __init__(self, ingestion: PostgresIngestion, uid: str, ctx: Context, report: st.Report):
        self.ing = ingestion
        self.uid = uid
        self.ctx = ctx
        self.r = report
        self.names = IngestionNames.of(ingestion)
        self.ns = self.names.namespace
        report.status.publication_name = self.names.publication
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
        source = control.take_control(settings, self.ing, self.r, component="operator",
                                      reader=self._reader_identity(), connect=self.ctx.connect)
        if source is not None:
            self._children(source.tables)
            self._progress(source.tables, source.health, source.current_lsn)
        self.r.summarize()

    def _settings(self) -> connection.ConnectionSettings | None:
        try:
            return source_settings(self.ctx.kube, self.ns, self.ing.spec.source)
        except LookupError as e:
            self.r.condition("SourceReady", False, "SecretNotFound", str(e))
            self.r.summarize()
            return None

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
        return connection.application_name("reader", self.names.owner, pod) if pod else None

    def _children(self, tables: list[TableName]) -> None:
        kube, ing, config = self.ctx.kube, self.ing, self.ctx.config
        kube.ensure(children.reader_deployment(
            ing, self.uid, config, workloads.reader_command(ing),
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
            self.r.condition("Streaming", False, "CatalogUnreachable", st.first_line(e))
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
            st.snapshot_complete(self.r)
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
            with self.ctx.connect(settings, connection.application_name("operator",
                                                                       self.names.owner)) as conn:
                health = slot.health(conn, self.names.slot)
        except psycopg.OperationalError as e:
            self.r.condition("SourceReady", False, "ConnectionFailed", st.first_line(e))
            return
        if health is not None:
            self.r.status.slot = st.slot_status(health)

    # status --------------------------------------------------------------------------------

    def _progress(self, tables: list[TableName], health, current: int) -> None:
        applied = st.record_progress(self.r, self.progress, self.snapshotting,
                                     durable=health.confirmed_flush_lsn, current=current,
                                     reader=self._reader_pod())
        reader_ready = self.ctx.kube.deployment_available(
            self.ns, children.child_name(self.ing, "reader"))
        apply_state = self.ctx.kube.spark_application_state(
            self.ns, children.child_name(self.ing, "apply"))
        st.streaming(self.r, applied,
                     reader_problem=None if reader_ready else
                     "the reader Deployment has no available replica yet",
                     apply_problem=None if apply_state == "RUNNING" else
                     f"the apply SparkApplication is {apply_state or 'absent'}")

def source_settings(kube: Kube, namespace: str, source: SourceSpec) -> connection.ConnectionSettings:
    """Connection settings with the Secrets resolved (LookupError names a missing one)."""
    password = kube.secret_value(namespace, source.password_secret_ref) \
        if source.password_secret_ref else None
    ca_file = _write_temp(kube.secret_value(namespace, source.ca_secret_ref)) \
        if source.ca_secret_ref else None
    settings = connection.settings_from_spec(source, password=password, ca_file=ca_file)
    settings.extra.setdefault("connect_timeout", OPERATOR_CONNECT_TIMEOUT_S)
    return settings


def _write_temp(text: str) -> str:
    """A file holding ``text`` (libpq reads the CA from a file), named by its content so that
    repeated reconciles reuse one file."""
    path = Path(tempfile.gettempdir()) / f"lakeslot-ca-{hashlib.sha256(text.encode()).hexdigest()[:16]}.crt"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return str(path)
