"""One idempotent, level-based reconcile of a PostgresIngestion.

``reconcile(body, ctx)`` looks at the world as it is now (the resource, PostgreSQL, the
children, the mirror tables in Iceberg), moves it one step towards the spec, and returns the
complete status to write plus the events worth telling. It is called from every kopf handler and
from a timer; calling it twice in a row changes nothing the second time.

Steps, each gating the next (a failed step leaves later conditions Unknown/False and says why).
Steps 3 and 4 are :mod:`lakeslot.control.steps` and step 6 is
:mod:`lakeslot.observability.status_report`, shared with local mode (``lakeslot run`` and
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
5. **Children** — reader Deployment (always, once the slot is ready); the snapshot
   SparkApplication as :mod:`lakeslot.control.scheduling` decides (pure, shared with local mode:
   the tables Iceberg shows without ``lakeslot.lsn`` or below ``status.resnapshotBelowLsn``, all
   of them after a re-snapshot request) and :mod:`lakeslot_operator.snapshot_lifecycle` follows it
   (one at a time; a failed attempt is retried after a backoff) — here the decision is only
   executed; the apply SparkApplication once a table has been snapshotted.
6. **Status** — per-table progress from Iceberg (invariant 1: a table's ``lakeslot.lsn`` is the
   truth), the reader's durable LSN from the slot's ``confirmed_flush_lsn`` (invariant 4: the
   reader confirms only what is sealed), lag from the server's current LSN, freshness in seconds
   from the commit times in staging (:mod:`lakeslot.observability.freshness`), and the apply job's last pass
   document from staging for the metrics (not part of the status); a table without a mirror
   whose last snapshot attempt failed is ``Failed`` with the error (``Pending`` with it after
   transient errors) until the table is copied again (:func:`lakeslot.observability.status_report.snapshot_failures`,
   from the snapshot's failures document in staging); conditions with
   ``observedGeneration``; ``Degraded``, ``Ready`` and the phase from the rest
   (:func:`lakeslot.observability.status_report.summary`).

Before the steps, whatever the spec's state: a verification requested with the
``lakeslot.io/verify`` annotation is served (:mod:`lakeslot_operator.verification`: its Job,
the ``Verified`` condition, ``status.verification``).

Failure modes: PostgreSQL unreachable or a catalog error → the relevant condition is False with
the error text (never a password: libpq's messages do not contain it) and the timer retries.
A reader that runs but retries a transient error (staging full or unwritable, the source
unreachable from its pod) says so at ``/status`` (:mod:`lakeslot_operator.reader_status`): its
reason (``StagingUnwritable``, ``SourceUnreachable``, ``ReaderRetrying``) and error make
``Streaming`` False until it makes progress again.
A child the API server refuses to create or change (a 4xx but 409/429:
:func:`lakeslot_operator.child_health.is_rejection`) becomes ``ChildRejected`` with the server's
message on the condition the child serves (``Streaming`` for the reader and the apply job,
``SnapshotComplete`` for the snapshot) and so an event and ``Degraded``, in the same reconcile;
the others go on. A child whose name (or its input ConfigMap's) is taken by an object that is not
lakeslot's is reported the same way as ``NameTaken`` (:class:`lakeslot_operator.kube.NameTaken`);
that object is left untouched. A reader that crash-loops or cannot pull its image and an apply job that
failed for good are ``ReaderFailing`` / ``ApplyFailed`` (:mod:`lakeslot_operator.child_health`).
Other Kubernetes API errors (409 conflicts, throttling, 5xx, connection errors) propagate to
kopf, which retries with backoff.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pydantic
from kubernetes.client.exceptions import ApiException

from lakeslot import workloads
from lakeslot.api.models import PostgresIngestion, PostgresIngestionStatus, SecretEnvVar, SourceSpec
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.api.validation import parse_resource, problems_of
from lakeslot.control import resnapshot, scheduling, steps
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.progress import MirrorProgress
from lakeslot.observability import freshness, status_report
from lakeslot.observability import reader_status as observability_reader_status
from lakeslot.snapshot import progress as snapshot_progress
from lakeslot.source import connection, slot
from lakeslot.staging import apply_status
from lakeslot.staging.store import Staging
from lakeslot_operator import child_health, children, reader_status, snapshot_lifecycle, verification
from lakeslot_operator.kube import Kube, NameTaken

OPERATOR_CONNECT_TIMEOUT_S = "10"


@dataclass
class Context:
    kube: Kube
    config: children.OperatorConfig = field(default_factory=children.OperatorConfig)
    connect: Callable[..., psycopg.Connection] = connection.connect
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    # the status document a running reader pod serves (lakeslot_operator.reader_status)
    reader_status: Callable[[Mapping], dict | None] = reader_status.fetch


@dataclass
class Outcome:
    status: dict
    events: list[status_report.Event]
    apply_pass: dict | None = None  # the apply job's last pass document (staging), for metrics
    snapshot: dict | None = None  # the snapshot's progress document (staging), for metrics


def reconcile(body: Mapping, ctx: Context) -> Outcome:
    meta = body["metadata"]
    report = status_report.Report(PostgresIngestionStatus.model_validate(body.get("status") or {}),
                                  meta.get("generation", 0), ctx.now())
    try:
        ingestion = parse_resource({k: v for k, v in body.items() if k != "status"})
    except pydantic.ValidationError as e:
        report.condition("Ready", False, "InvalidSpec",
                         "\n".join(str(p) for p in problems_of(e)))
        report.status.phase = "Failed"
        return _outcome(report)
    reconciler = _Reconciler(ingestion, meta["uid"], ctx, report)
    reconciler.run()
    return Outcome(report.status.to_document(), report.events, reconciler.apply_pass,
                   reconciler.snapshot)


def _outcome(report: status_report.Report) -> Outcome:
    return Outcome(report.status.to_document(), report.events)


class _Reconciler:
    def __init__(self, ingestion: PostgresIngestion, uid: str, ctx: Context, report: status_report.Report):
        self.ingestion = ingestion
        self.uid = uid
        self.ctx = ctx
        self.report = report
        self.names = IngestionNames.of(ingestion)
        self.namespace = self.names.namespace
        report.status.publication_name = self.names.publication
        self.progress: dict[TableName, MirrorProgress] = {}
        self.snapshotting: set[TableName] = set()
        self.rejected: dict[str, child_health.Problem] = {}  # component → why the server refused it
        self.apply_pass: dict | None = None
        self.snapshot: dict | None = None
        self.environ: dict[str, str] = {}  # spec.secretEnv, resolved (run)

    # the steps -----------------------------------------------------------------------------

    def run(self) -> None:
        environ = self._storage_environ()
        if environ is not None:
            verification.serve(self.ingestion, self.uid, self.ctx.kube, self.ctx.config, self.report, environ)
        spec = self.ingestion.spec
        if spec.suspend:
            self._suspend()
            return
        settings = self._settings()
        if settings is None or environ is None:
            self.report.summarize()
            return
        self.environ = environ
        source = steps.take_control(settings, self.ingestion, self.report, component="operator",
                                    reader=self._reader_identity(), connect=self.ctx.connect,
                                    environ=environ)
        if source is not None:
            self._children(source.tables)
            self._progress(source.tables, source.health, source.current_lsn)
        self.report.summarize()

    def _settings(self) -> connection.ConnectionSettings | None:
        try:
            return source_settings(self.ctx.kube, self.namespace, self.ingestion.spec.source)
        except LookupError as e:
            self.report.condition("SourceReady", False, "SecretNotFound", str(e))
            return None

    def _storage_environ(self) -> dict[str, str] | None:
        """The ingestion's ``secretEnv``, resolved: what staging and the warehouse are reached
        with; None when a Secret is missing (``SourceReady`` names it: nothing can run)."""
        try:
            return storage_environ(self.ctx.kube, self.namespace, self.ingestion.spec.secret_env)
        except LookupError as e:
            self.report.condition("SourceReady", False, "SecretNotFound", f"spec.secretEnv: {e}")
            return None

    # children ------------------------------------------------------------------------------

    def _live_reader_pod(self) -> dict | None:
        pods = self.ctx.kube.list_pods(self.namespace, {children.INGESTION_LABEL: self.ingestion.metadata.name,
                                                        children.COMPONENT_LABEL: "reader"})
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")
                and p.get("status", {}).get("phase") in ("Pending", "Running")]
        return max(live, key=lambda p: p["metadata"]["creationTimestamp"]) if live else None

    def _reader_pod(self) -> str | None:
        pod = self._live_reader_pod()
        return pod["metadata"]["name"] if pod else None

    def _reader_identity(self) -> str | None:
        pod = self._reader_pod()
        return connection.application_name("reader", self.names.owner, pod) if pod else None

    def _write(self, component: str, obj: dict,
               invocation: workloads.Invocation | None = None) -> bool:
        """Create or update a child and (``invocation``: a job) the ConfigMap with its job document;
        a refusal for good, or a name taken by an object that is not lakeslot's, is recorded under
        ``component`` (False)."""
        try:
            self.ctx.kube.ensure(obj)
            if invocation is not None:
                self.ctx.kube.ensure_job_input(obj, invocation.document)
        except ApiException as e:
            if not child_health.is_rejection(e):
                raise
            self.rejected[component] = child_health.rejection(
                obj["kind"], obj["metadata"]["name"], e)
            return False
        except NameTaken as e:
            self.rejected[component] = child_health.name_taken(e)
            return False
        return True

    def _children(self, tables: list[TableName]) -> None:
        ing, config = self.ingestion, self.ctx.config
        self._write("reader", children.reader_deployment(
            ing, self.uid, config, workloads.reader_command(ing),
            replicas=1))
        progress = self._mirror_progress(tables)
        if progress is None:
            return
        self._snapshot(tables, progress)
        if any(p.lsn is not None for p in progress.values()):
            invocation = workloads.apply_invocation(ing, tables)
            self._write("apply", children.apply_application(
                ing, self.uid, config, invocation.arguments()), invocation)

    def _mirror_progress(self, tables: list[TableName]) -> dict[TableName, MirrorProgress] | None:
        with contextlib.suppress(OSError):  # staging unreadable: the mirrors' own positions
            self.apply_pass = self._staging().read_apply_status()
        try:
            catalog = self.ingestion.spec.sink.catalog
            secrets = self.ctx.kube.secret_values(self.namespace, catalog.secret_properties)
            self.progress = mirror_progress.read(self.ingestion, tables, secrets=secrets,
                                                 covered=apply_status.covered(self.apply_pass),
                                                 environ=self.environ)
        except Exception as e:  # noqa: BLE001 - any catalog failure is reported, then retried
            self.report.condition("Streaming", False, "CatalogUnreachable", status_report.first_line(e))
            return None
        return self.progress

    def _snapshot(self, tables: list[TableName], progress: dict) -> None:
        """Execute :mod:`lakeslot.control.scheduling`'s decision as
        :mod:`.snapshot_lifecycle` steps it: submit or delete the snapshot application, and record
        its state, the condition and the event."""
        status = self.report.status
        plan = scheduling.plan(tables, {t: progress[t].lsn for t in tables},
                               scheduling.Request.of(self.ingestion.spec.snapshot, status),
                               self._again(tables, progress))
        if plan.clear_below:
            status.resnapshot_below_lsn = None
        held = snapshot_lifecycle.hold(status.snapshot, plan, tables)
        waiting: list[TableName] = []
        if held is not None and held.generation is not None:
            running = self.ctx.kube.get_spark_application(
                self.namespace, children.snapshot_name(self.ingestion, held.generation))
            if running is not None and snapshot_lifecycle.Application.of(running).state \
                    not in snapshot_lifecycle.TERMINAL_SPARK_STATES:
                waiting = sorted(set(plan.wanted) - set(held.wanted))
                plan = held
        if plan.generation is None:
            self._record(snapshot_lifecycle.advance(status.snapshot, plan, None, None, self.report.now))
            return
        name = children.snapshot_name(self.ingestion, plan.generation)
        app = self.ctx.kube.get_spark_application(self.namespace, name)
        step = snapshot_lifecycle.advance(
            status.snapshot, plan, name,
            None if app is None else snapshot_lifecycle.Application.of(app), self.report.now)
        if waiting:
            step = dataclasses.replace(step, message=(
                f"{step.message}; then {', '.join(map(str, waiting))} (waiting for it to finish)"))
        invocation = workloads.snapshot_invocation(self.ingestion, plan.wanted,
                                                   min_snapshot_lsn=plan.min_snapshot_lsn)
        if step.submit and self._write("snapshot", children.snapshot_application(
                self.ingestion, self.uid, self.ctx.config, invocation.arguments(),
                generation=plan.generation), invocation):
            self.report.tell("Normal", "SnapshotStarted", f"{name}: {len(plan.wanted)} table(s)")
        if step.delete:
            self.ctx.kube.delete_spark_application(  # resubmitted next time
                self.namespace, name, ingestion=self.ingestion.metadata.name)
        self._record(step)
        if (refused := self.rejected.get("snapshot")) is not None:
            if status.snapshot is not None:  # not submitted: the application does not exist
                status.snapshot.state, status.snapshot.message = None, refused.message
            self.report.condition("SnapshotComplete", False, refused.reason, refused.message)

    def _again(self, tables: list[TableName], progress: dict[TableName, MirrorProgress]
               ) -> dict[TableName, int]:
        """The tables to copy again alone (:mod:`lakeslot.control.resnapshot`): record each new per-table
        request with the LSN it must reach, serve the rows' ``resnapshotBelowLsn`` (a user's
        request, or a table that joined the publication again with a mirror: see
        :func:`lakeslot.control.steps.check_source`), tell each re-snapshot once, and say in the
        table's row why the loop guard holds one back."""
        rows = {TableName(r.schema_name, r.name): r for r in self.report.status.tables}
        job = workloads.JobInput(self.ingestion, tuple(tables))
        generations = {t: options.resnapshot_generation for t in tables
                       if (options := job.table_spec(t)) is not None}
        served = resnapshot.serve_requests([rows[t] for t in tables if t in rows],
                                           {t: progress[t] for t in tables}, generations, self._copying)
        for table in sorted(served.new):
            self.report.tell("Normal", "TableResnapshot", f"{table}: copying it again as requested "
                             f"(resnapshotGeneration {generations[table]})")
        decision = resnapshot.decide(progress, self.ingestion.spec.policies, served.below)
        previous = set(self.report.old.snapshot.tables) if self.report.old.snapshot else set()
        for table in decision.copy:
            if table not in decision.requested and str(table) not in previous:
                self.report.tell("Warning", "TableResnapshot",
                                 f"{table}: copying it again, online: {progress[table].error}")
        for table, why in decision.held.items():
            if (row := rows.get(table)) is not None:
                row.state, row.message = "Failed", why
        return decision.copy

    def _copying(self, table: TableName) -> bool:
        """Whether the recorded snapshot, still in flight, copies ``table``."""
        running = self.report.status.snapshot
        return running is not None and running.state not in snapshot_lifecycle.TERMINAL_SPARK_STATES \
            and str(table) in running.tables

    def _record(self, step: snapshot_lifecycle.Step) -> None:
        status = self.report.status
        if step.observed_generation is not None:
            status.observed_resnapshot_generation = step.observed_generation
        status.snapshot = step.snapshot
        if step.complete:
            status_report.snapshot_complete(self.report)
        else:
            self.report.condition("SnapshotComplete", False, step.reason, step.message)
        self.snapshotting = set(step.snapshotting)

    def _suspend(self) -> None:
        kube, owner = self.ctx.kube, self.ingestion.metadata.name
        kube.scale_deployment(self.namespace, children.reader_name(self.ingestion), 0, ingestion=owner)
        kube.delete_spark_application(self.namespace, children.apply_name(self.ingestion), ingestion=owner)
        self.report.status.phase = "Suspended"
        self.report.condition("Streaming", False, "Suspended", "spec.suspend is true: the reader and "
                              "the apply job are stopped; the slot keeps retaining WAL")
        self.report.condition("Ready", False, "Suspended", "spec.suspend is true")
        settings = self._settings()
        if settings is None:
            self.report.summarize()
            return
        try:
            with self.ctx.connect(settings, connection.application_name("operator",
                                                                        self.names.owner)) as conn:
                health = slot.health(conn, self.names.slot)
        except psycopg.OperationalError as e:
            self.report.condition("SourceReady", False, "ConnectionFailed", status_report.first_line(e))
            return
        if health is not None:
            self.report.status.slot = status_report.slot_status(health)

    # status --------------------------------------------------------------------------------

    def _progress(self, tables: list[TableName], health, current: int) -> None:
        job = self.report.status.snapshot
        # a failed snapshot application waiting out its backoff copies nothing: not a retry yet
        copying = set() if job is not None and job.state == "FAILED" else self.snapshotting
        with contextlib.suppress(OSError, ValueError):  # staging unreadable: none known now
            status_report.snapshot_failures(self.report, snapshot_progress.failures(snapshot_progress.in_staging(
                self.ingestion.spec.staging.uri), self.environ), self.progress, copying)
        applied = status_report.record_progress(self.report, self.progress, self.snapshotting,
                                                durable=health.confirmed_flush_lsn, current=current,
                                                reader=self._reader_pod())
        with contextlib.suppress(OSError):  # (S3Access's refusal of half a key pair)
            freshness.record(self.report.status, self._staging(), self.report.now)
        with contextlib.suppress(OSError, ValueError):  # none yet, or unreadable: no snapshot rows
            self.snapshot = snapshot_progress.read(snapshot_progress.in_staging(self.ingestion.spec.staging.uri),
                                                   self.environ)
        kube = self.ctx.kube
        reader = self.rejected.get("reader") or child_health.reader_problem(
            kube.get_deployment(self.namespace, children.reader_name(self.ingestion)),
            kube.list_pods(self.namespace, {children.INGESTION_LABEL: self.ingestion.metadata.name,
                                            children.COMPONENT_LABEL: "reader"})) or self._reader_retrying()
        degraded = apply_status.degraded_message(self.apply_pass)
        apply = self.rejected.get("apply") or child_health.apply_problem(
            kube.get_spark_application(self.namespace, children.apply_name(self.ingestion))) or (
            child_health.Problem(status_report.APPLY_DEGRADED, degraded) if degraded else None)
        status_report.streaming(self.report, applied,
                                reader_problem=reader.message if reader else None,
                                reader_reason=reader.reason if reader else "",
                                apply_problem=apply.message if apply else None,
                                apply_reason=apply.reason if apply else "",
                                catching_up_after=status_report.catching_up_after_s(self.ingestion.spec))

    def _staging(self) -> Staging:
        """Staging, read with the ingestion's own settings (never this process's environment)."""
        return Staging(self.ingestion.spec.staging.uri, create=False, environ=self.environ)

    def _reader_retrying(self) -> child_health.Problem | None:
        """A running reader's own problem (a transient error it retries), as it reports it."""
        pod = self._live_reader_pod()
        problem = observability_reader_status.problem(self.ctx.reader_status(pod)) if pod else None
        return child_health.Problem(*problem) if problem else None


def source_settings(kube: Kube, namespace: str, source: SourceSpec) -> connection.ConnectionSettings:
    """Connection settings with the Secrets resolved (LookupError names a missing one)."""
    password = kube.secret_value(namespace, source.password_secret_ref) \
        if source.password_secret_ref else None
    ca_file = _write_temp(kube.secret_value(namespace, source.ca_secret_ref)) \
        if source.ca_secret_ref else None
    settings = connection.settings_from_spec(source, password=password, ca_file=ca_file)
    settings.extra.setdefault("connect_timeout", OPERATOR_CONNECT_TIMEOUT_S)
    return settings


def storage_environ(kube: Kube, namespace: str, secret_env: Iterable[SecretEnvVar]) -> dict[str, str]:
    """``spec.secretEnv`` with its Secrets resolved (LookupError names a missing one): the
    settings the operator reaches this ingestion's staging and warehouse with, as the jobs do
    from their environment (:mod:`lakeslot.filesystems`). Never exported to this process."""
    return kube.secret_values(namespace, {variable.name: variable.secret_key_ref for variable in secret_env})


def _write_temp(text: str) -> str:
    """A file holding ``text`` (libpq reads the CA from a file), named by its content so that
    repeated reconciles reuse one file."""
    path = Path(tempfile.gettempdir()) / f"lakeslot-ca-{hashlib.sha256(text.encode()).hexdigest()[:16]}.crt"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return str(path)
