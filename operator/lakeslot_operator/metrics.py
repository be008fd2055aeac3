"""Prometheus metrics of the operator, served on ``/metrics`` of the operator pod.

Invariants:

- Every value is computed by :func:`samples`, a pure function of the status a reconcile wrote
  (which holds what the operator read from ``pg_replication_slots``, Iceberg and staging) — no
  metric has a source of its own, so a scrape and ``kubectl get pgi -o yaml`` never disagree.
  The kopf handler only hands each reconcile's outcome to :meth:`OperatorMetrics.observe`.
- Everything lives in the operator's own registry (no process-global state: tests run several
  operators side by side).
- An ingestion's series disappear when it is deleted (:meth:`OperatorMetrics.forget`) and when
  no reconcile refreshed them for :data:`MAX_AGE_S` (a replica that kopf peering paused, or
  that lost the resource, stops reporting instead of repeating old values). With several
  replicas only the active one reports: alert on ``max by (namespace, ingestion)``.
- Cardinality is bounded by the resources, never by data: per ingestion at most 67 series
  (gauges: slot 11, conditions 7 types × 3 statuses, tables by state 5, apply outcomes 6, 5 more;
  the two counters 4 with their ``_created``; the reconcile histogram 15), and per table 5.
  Labels: ``namespace``, ``ingestion``; ``table`` (``schema.table``, quoted like psql) on the
  per-table ones; ``state``, ``kind``, ``type``, ``status`` take only the values listed below.

The apply job's metrics come the same way: each pass rewrites its document in staging
(``apply-status.json``: when, and per table the outcome and the changes applied), and the
reconcile hands it over with the status. Pulled rather than served by the Spark driver: the
driver's pod is named and restarted by the spark-operator, it would need a Service and a monitor
of its own, and a value it held would die with it, while the document outlives every driver and
the operator reads staging anyway (freshness). They describe the *last* pass (gauges), not totals
over passes a scrape did not see.

Metrics (prefix ``lakeslot_``; "absent" means the series is not exported):

======================================  ==================================================================
``slot_retained_wal_bytes``             WAL the slot keeps: current WAL LSN − ``restart_lsn``
``slot_safe_wal_size_bytes``            ``safe_wal_size``: WAL that may still be written before the slot
                                        is in danger (absent without ``max_slot_wal_keep_size``)
``slot_wal_status{state}``              1 for the slot's ``wal_status`` (reserved, extended, unreserved,
                                        lost), 0 for the others
``slot_active``                         1 while a backend streams from the slot
``slot_holder{kind}``                   1 for who holds it: ``reader`` (the current reader pod), ``other``
                                        (a client lakeslot terminates), ``none``; as read before eviction
``slot_confirmed_flush_lag_bytes``      current WAL LSN − ``confirmed_flush_lsn`` (not yet durable in
                                        staging)
``lag_bytes``                           current WAL LSN − the lowest applied LSN (end to end)
``freshness_seconds``                   the largest table freshness (``status.apply.lagSeconds``)
``condition{type,status}``              1 for each condition's status (True, False, Unknown), 0 for the
                                        other two
``definite_error``                      1 while a condition says waiting will not fix it (``SlotLost``,
                                        ``SlotUnusable``, ``InvalidSpec``)
``suspended``                           1 with ``spec.suspend``
``tables{state}``                       tables per state (Pending, Snapshotting, Streaming, Failed, Removed)
``table_applied_lsn{table}``            the table's ``lakeslot.lsn`` as a number
``table_freshness_seconds{table}``      seconds since the first staged transaction not applied to it
                                        (:mod:`lakeslot.freshness`; 0: caught up)
``table_rows{table}``                   rows in the mirror as of its applied LSN
``table_failed{table}``                 1 while the table is Failed (its status message says why)
``apply_last_pass_timestamp_seconds``   when the apply job's last pass ended (Unix time)
``apply_pass_tables{state}``            tables per outcome of the last pass (applied, advanced, current,
                                        waiting, failed, retrying)
``apply_pass_changes{table}``           changes the last pass applied to the table
``stale_holder_evictions_total``        slot holders other than the reader terminated
``reconcile_duration_seconds``          histogram of reconcile durations
``reconcile_errors_total``              reconciles that raised (kopf retries them)
======================================  ==================================================================

Failure mode: a port already in use raises ``OSError`` when serving starts (the operator exits).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import get_args
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lakeslot import lsn as lsnlib
from lakeslot import metrics_http
from lakeslot.api.models import PostgresIngestionStatus, TableState
from lakeslot.source import connection
from lakeslot.source.tables import TableName
from lakeslot.status import DEFINITE
from lakeslot.status import Event as StatusEvent

PREFIX = "lakeslot_"
MAX_AGE_S = 300.0
WAL_STATES = ("reserved", "extended", "unreserved", "lost")
HOLDER_KINDS = ("reader", "other", "none")
CONDITION_STATUSES = ("True", "False", "Unknown")
TABLE_STATES: tuple[str, ...] = get_args(TableState)
INGESTION_LABELS = ("namespace", "ingestion")
TABLE_LABELS = (*INGESTION_LABELS, "table")

# name (without the prefix) → (help, extra label names)
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "slot_retained_wal_bytes": ("WAL retained by the slot: current WAL LSN minus restart_lsn", ()),
    "slot_safe_wal_size_bytes": ("WAL that can still be written before the slot is in danger "
                                 "(safe_wal_size; absent without max_slot_wal_keep_size)", ()),
    "slot_wal_status": ("1 for the slot's wal_status, 0 for the other states", ("state",)),
    "slot_active": ("1 while a backend streams from the slot", ()),
    "slot_holder": ("1 for who holds the slot: reader, other (terminated by lakeslot) or none",
                    ("kind",)),
    "slot_confirmed_flush_lag_bytes": ("Current WAL LSN minus the slot's confirmed_flush_lsn", ()),
    "lag_bytes": ("Current WAL LSN minus the lowest applied LSN (end to end)", ()),
    "freshness_seconds": ("Largest freshness of the streaming tables, in seconds", ()),
    "condition": ("1 for each condition's status, 0 for the other two", ("type", "status")),
    "definite_error": ("1 while a condition reports an error that waiting will not fix", ()),
    "suspended": ("1 while spec.suspend is true", ()),
    "tables": ("Tables per state", ("state",)),
    "table_applied_lsn": ("LSN the mirror table reflects (lakeslot.lsn), as a number", ("table",)),
    "table_freshness_seconds": ("Seconds since the commit of the first staged transaction not "
                                "yet applied to the table (0: caught up)", ("table",)),
    "table_rows": ("Rows in the mirror table as of its applied LSN", ("table",)),
    "table_failed": ("1 while the table is Failed", ("table",)),
    "apply_last_pass_timestamp_seconds": ("When the apply job's last pass ended (Unix time)", ()),
    "apply_pass_tables": ("Tables per outcome of the apply job's last pass", ("state",)),
    "apply_pass_changes": ("Changes the apply job's last pass applied to the table", ("table",)),
}
APPLY_STATES = ("applied", "advanced", "current", "waiting", "failed", "retrying")


@dataclass(frozen=True)
class Sample:
    metric: str  # a key of GAUGES
    labels: tuple[str, ...]  # the values of the metric's extra labels, in order
    value: float


def samples(status: PostgresIngestionStatus, *, owner: str, suspended: bool,
            apply_pass: Mapping | None = None) -> list[Sample]:
    """Every gauge's value for one ingestion (``owner``: ``namespace/name``), from its status and
    the apply job's last pass document (``apply-status.json``; None: none readable)."""
    out: list[Sample] = [Sample("suspended", (), float(suspended))]

    def put(metric: str, value: float | None, *labels: str) -> None:
        if value is not None:
            out.append(Sample(metric, labels, float(value)))

    slot = status.slot
    if slot is not None:
        put("slot_retained_wal_bytes", slot.retained_bytes)
        put("slot_safe_wal_size_bytes", slot.safe_wal_size)
        for state in WAL_STATES:
            put("slot_wal_status", slot.wal_status == state, state)
        put("slot_active", slot.active_pid is not None)
        kind = _holder_kind(slot.holder, slot.active_pid, owner,
                            status.reader.pod if status.reader else None)
        for each in HOLDER_KINDS:
            put("slot_holder", each == kind, each)
    if status.reader is not None:
        put("slot_confirmed_flush_lag_bytes", status.reader.lag_bytes)
    put("lag_bytes", status.lag_bytes)
    put("freshness_seconds", status.apply.lag_seconds if status.apply else None)
    for c in status.conditions:
        for each in CONDITION_STATUSES:
            put("condition", c.status == each, c.type, each)
    put("definite_error", any(c.status == "False" and c.reason in DEFINITE
                              for c in status.conditions))
    for state in TABLE_STATES:
        put("tables", sum(1 for t in status.tables if t.state == state), state)
    for t in status.tables:
        if t.state == "Removed":
            continue
        name = str(TableName(t.schema_name, t.name))
        put("table_applied_lsn", lsnlib.parse(t.applied_lsn) if t.applied_lsn else None, name)
        put("table_freshness_seconds", t.lag_seconds, name)
        put("table_rows", t.rows_known, name)
        put("table_failed", t.state == "Failed", name)
    if apply_pass is not None:
        ended = datetime.fromisoformat(apply_pass["updatedAt"].replace("Z", "+00:00"))
        put("apply_last_pass_timestamp_seconds", ended.timestamp())
        outcomes = apply_pass.get("tables", [])
        for state in APPLY_STATES:
            put("apply_pass_tables", sum(1 for t in outcomes if t["state"] == state), state)
        for t in outcomes:
            put("apply_pass_changes", t.get("changes", 0), str(TableName(t["schema"], t["name"])))
    return out


def _holder_kind(holder: str | None, pid: int | None, owner: str, reader_pod: str | None) -> str:
    if pid is None:
        return "none"
    reader = connection.application_name("reader", owner, reader_pod) if reader_pod else None
    return "reader" if reader is not None and holder == reader else "other"


class OperatorMetrics(Collector):
    """The operator's registry: gauges from the last status of each ingestion, counters and the
    reconcile histogram kept as they happen."""

    def __init__(self, *, max_age: float = MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry()
        self._max_age, self._clock = max_age, clock
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, str], tuple[float, list[Sample]]] = {}
        r = self.registry
        self.evictions = Counter(PREFIX + "stale_holder_evictions",
                                 "Backends other than the reader terminated for holding the slot",
                                 INGESTION_LABELS, registry=r)
        self.errors = Counter(PREFIX + "reconcile_errors",
                              "Reconciles that raised (kopf retries them)", INGESTION_LABELS,
                              registry=r)
        self.duration = Histogram(PREFIX + "reconcile_duration_seconds", "Reconcile duration",
                                  INGESTION_LABELS, registry=r,
                                  buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        r.register(self)

    @contextlib.contextmanager
    def reconciling(self, namespace: str, name: str) -> Iterator[None]:
        """Time the block; count it as an error when it raises (the exception propagates)."""
        start, errors = self._clock(), self.errors.labels(namespace, name)  # exported from 0 on
        try:
            yield
        except BaseException:
            errors.inc()
            raise
        finally:
            self.duration.labels(namespace, name).observe(self._clock() - start)

    def observe(self, namespace: str, name: str, status: Mapping, *, suspended: bool,
                events: list[StatusEvent], apply_pass: Mapping | None = None) -> None:
        """Take one reconcile's outcome: the status it wrote, the events it told and the apply
        job's last pass document it read."""
        model = PostgresIngestionStatus.model_validate(status)
        values = samples(model, owner=f"{namespace}/{name}", suspended=suspended, apply_pass=apply_pass)
        with self._lock:
            self._latest[(namespace, name)] = (self._clock(), values)
        evicted = sum(1 for e in events if e.reason == "StaleHolderEvicted")
        counter = self.evictions.labels(namespace, name)  # exported from 0 on
        if evicted:
            counter.inc(evicted)

    def forget(self, namespace: str, name: str) -> None:
        """The ingestion is gone: drop every series of it."""
        with self._lock:
            self._latest.pop((namespace, name), None)
        for metric in (self.evictions, self.errors, self.duration):
            with contextlib.suppress(KeyError):
                metric.remove(namespace, name)

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        with self._lock:
            fresh = {key: values for key, (at, values) in self._latest.items()
                     if now - at <= self._max_age}
        families = {metric: GaugeMetricFamily(
            PREFIX + metric, help_, labels=[*(TABLE_LABELS[:2]), *extra])
            for metric, (help_, extra) in GAUGES.items()}
        for (namespace, name), values in sorted(fresh.items()):
            for s in values:
                families[s.metric].add_metric([namespace, name, *s.labels], s.value)
        yield from families.values()

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected on demand: nothing to check at registration

    def serve(self, port: int, host: str = "0.0.0.0") -> WSGIServer:
        """Serve ``/metrics`` from a daemon thread; returns the server (``server_port``)."""
        return metrics_http.serve(make_wsgi_app(self.registry), port, host,
                                  "lakeslot-operator-metrics")
