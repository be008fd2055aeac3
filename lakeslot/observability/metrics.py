"""The gauges of an ingestion, as Prometheus reads them: shared by the operator's ``/metrics``
(:mod:`lakeslot_operator.metrics`) and ``lakeslot run --metrics-port`` (:mod:`lakeslot.local.live_status`),
so both export the same names, labels and meaning.

Invariants:

- Every value is computed by :func:`samples`, a pure function of an ingestion's status (the
  operator's reconcile writes it; local mode computes the same model, :mod:`lakeslot.local.observe`)
  and of two documents the jobs write (the apply job's last pass, the snapshot's progress) — no
  gauge has a source of its own, so a scrape and the status never disagree.
- :class:`Gauges` holds the latest samples per ingestion and forgets an ingestion's series when
  told (:meth:`Gauges.forget`) or when nothing refreshed them for :data:`MAX_AGE_S` (a paused
  operator replica, a local run whose status cannot be computed: they stop reporting instead of
  repeating old values).
- Cardinality is bounded by the resources, never by data: per ingestion at most 49 gauge series
  (slot 11, conditions 7 types × 3 statuses, tables by state 5, apply outcomes 6, 6 more) and 14
  counter series (steps 10, maintenance outcomes 2, 2 more), per table 7 gauges and 4 counters.
  Labels: ``namespace``, ``ingestion``; ``table`` (``schema.table``, quoted like psql) on the
  per-table ones; ``state``, ``kind``, ``type``, ``status``, ``step``, ``op``,
  ``outcome`` take only the values listed below.

The apply job's and the snapshot's figures come from the documents they rewrite whole
(``apply-status.json`` in staging; the snapshot progress document, :mod:`lakeslot.snapshot.progress`)
rather than from scrapes of the Spark driver: its pod is named and restarted by the
spark-operator, it would need a Service and a monitor of its own, and a value it held would die
with it, while the documents outlive every driver. They describe the *last* pass and the *last*
snapshot (gauges), not totals.

Gauges (prefix ``lakeslot_``; "absent" means the series is not exported):

======================================  ==================================================================
``slot_retained_wal_bytes``             WAL the slot keeps: current WAL LSN − ``restart_lsn``
``slot_safe_wal_size_bytes``            ``safe_wal_size``: WAL that may still be written before the slot
                                        is in danger (absent without ``max_slot_wal_keep_size``)
``slot_wal_status{state}``              1 for the slot's ``wal_status`` (reserved, extended, unreserved,
                                        lost), 0 for the others
``slot_active``                         1 while a backend streams from the slot
``slot_holder{kind}``                   1 for who holds it: ``reader`` (the current reader), ``other``
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
``table_applied_lsn{table}``            the position the table reflects as a number (its
                                        ``lakeslot.lsn``, or where an idle table is covered to)
``table_freshness_seconds{table}``      seconds since the first staged transaction not applied to it
                                        (:mod:`lakeslot.observability.freshness`; 0: caught up)
``table_rows{table}``                   rows in the mirror as of its applied LSN
``table_failed{table}``                 1 while the table is Failed (its status message says why)
``table_snapshot_rows{table}``          rows the last snapshot of the table copied so far (range by range)
``table_snapshot_rows_estimated{table}``  ``pg_class.reltuples`` when that snapshot started (absent when
                                        the table was never analyzed)
``apply_last_pass_timestamp_seconds``   when the apply job's last pass ended (Unix time)
``apply_pass_tables{state}``            tables per outcome of the last pass (applied, advanced, current,
                                        waiting, failed, retrying)
``apply_pass_changes{table}``           changes the last pass applied to the table
``apply_started_timestamp_seconds``     when the running apply job started (its counters count from then)
======================================  ==================================================================

Counters (``_total``), of the running apply job since it started (the status document's
``totals``): they start again at 0 with a new job, as Prometheus expects of a restarted process
(``rate``/``increase`` handle it):

======================================  ==================================================================
``apply_passes_total``                  passes
``apply_pass_seconds_total{step}``      seconds spent per step of a pass (prepare, scan, plan, reduce,
                                        evolve, changelog, parse, merge, maintenance, status)
``apply_changes_total{table,op}``       changes applied per table and op (insert, update, delete,
                                        truncate)
``apply_retries_total``                 transient failures retried (storage, catalog, Spark, source)
``apply_maintenance_runs_total{outcome}``  table maintenance runs that did work (ran) or failed
======================================  ==================================================================

A table the snapshot skipped (its mirror already held a snapshot of that generation) has no
snapshot series: that snapshot copied nothing of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lakeslot import lsn_text
from lakeslot.api.models import PostgresIngestionStatus, TableState
from lakeslot.api.naming import TableName
from lakeslot.errors import DEFINITE_REASONS
from lakeslot.source import connection

PREFIX = "lakeslot_"
MAX_AGE_S = 300.0
WAL_STATES = ("reserved", "extended", "unreserved", "lost")
HOLDER_KINDS = ("reader", "other", "none")
CONDITION_STATUSES = ("True", "False", "Unknown")
TABLE_STATES: tuple[str, ...] = get_args(TableState)
APPLY_STATES = ("applied", "advanced", "current", "waiting", "failed", "retrying")
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
    "table_applied_lsn": ("LSN the mirror table reflects (lakeslot.lsn, or further while the apply "
                          "job reports it covered), as a number", ("table",)),
    "table_freshness_seconds": ("Seconds since the commit of the first staged transaction not "
                                "yet applied to the table (0: caught up)", ("table",)),
    "table_rows": ("Rows in the mirror table as of its applied LSN", ("table",)),
    "table_failed": ("1 while the table is Failed", ("table",)),
    "table_snapshot_rows": ("Rows the last snapshot of the table copied so far", ("table",)),
    "table_snapshot_rows_estimated": ("Rows the table had by pg_class.reltuples when its last "
                                      "snapshot started", ("table",)),
    "apply_last_pass_timestamp_seconds": ("When the apply job's last pass ended (Unix time)", ()),
    "apply_pass_tables": ("Tables per outcome of the apply job's last pass", ("state",)),
    "apply_pass_changes": ("Changes the apply job's last pass applied to the table", ("table",)),
    "apply_started_timestamp_seconds": ("When the running apply job started (Unix time)", ()),
}
# name (without the prefix and _total) → (help, extra label names)
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "apply_passes": ("Passes of the running apply job", ()),
    "apply_pass_seconds": ("Seconds the running apply job spent per step of a pass", ("step",)),
    "apply_changes": ("Changes the running apply job applied, per table and op", ("table", "op")),
    "apply_retries": ("Transient failures the running apply job retried", ()),
    "apply_maintenance_runs": ("Table maintenance runs of the running apply job that did work "
                               "(ran) or failed", ("outcome",)),
}
STEPS = ("prepare", "scan", "plan", "reduce", "evolve", "changelog", "parse", "merge",
         "maintenance", "status")
OPS = {"I": "insert", "U": "update", "D": "delete", "T": "truncate"}
MAINTENANCE_OUTCOMES = ("ran", "failed")


@dataclass(frozen=True)
class Sample:
    metric: str  # a key of GAUGES or COUNTERS
    labels: tuple[str, ...]  # the values of the metric's extra labels, in order
    value: float


def samples(status: PostgresIngestionStatus, *, owner: str, suspended: bool,
            apply_pass: Mapping | None = None, snapshot: Mapping | None = None) -> list[Sample]:
    """Every gauge's value for one ingestion (``owner``: ``namespace/name``), from its status,
    the apply job's last pass document (``apply-status.json``) and the snapshot's progress
    document (None: none readable)."""
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
    put("definite_error", any(c.status == "False" and c.reason in DEFINITE_REASONS
                              for c in status.conditions))
    for state in TABLE_STATES:
        put("tables", sum(1 for t in status.tables if t.state == state), state)
    for t in status.tables:
        if t.state == "Removed":
            continue
        name = str(TableName(t.schema_name, t.name))
        put("table_applied_lsn", lsn_text.parse(t.applied_lsn) if t.applied_lsn else None, name)
        put("table_freshness_seconds", t.lag_seconds, name)
        put("table_rows", t.rows_known, name)
        put("table_failed", t.state == "Failed", name)
    if snapshot is not None:
        for t in snapshot.get("tables", []):
            if t["state"] != "skipped":
                name = str(TableName(t["schema"], t["name"]))
                put("table_snapshot_rows", t.get("rowsStaged", 0), name)
                put("table_snapshot_rows_estimated", t.get("rowsEstimated"), name)
    if apply_pass is not None:
        ended = datetime.fromisoformat(apply_pass["updatedAt"].replace("Z", "+00:00"))
        put("apply_last_pass_timestamp_seconds", ended.timestamp())
        outcomes = apply_pass.get("tables", [])
        for state in APPLY_STATES:
            put("apply_pass_tables", sum(1 for t in outcomes if t["state"] == state), state)
        for t in outcomes:
            put("apply_pass_changes", t.get("changes", 0), str(TableName(t["schema"], t["name"])))
        totals = apply_pass.get("totals")
        if totals is not None:
            _totals(totals, put)
    return out


def _totals(totals: Mapping, put: Callable[..., None]) -> None:
    """The counters of the apply job's ``totals`` (only known steps, ops and outcomes)."""
    started = datetime.fromisoformat(totals["startedAt"].replace("Z", "+00:00"))
    put("apply_started_timestamp_seconds", started.timestamp())
    put("apply_passes", totals.get("passes", 0))
    seconds = totals.get("seconds", {})
    for step in STEPS:
        put("apply_pass_seconds", seconds.get(step, 0.0), step)
    for table, ops in totals.get("changes", {}).items():
        for op, name in OPS.items():
            put("apply_changes", ops.get(op, 0), table, name)
    put("apply_retries", sum(totals.get("retries", {}).values()))
    for outcome in MAINTENANCE_OUTCOMES:
        put("apply_maintenance_runs", totals.get("maintenance", {}).get(outcome, 0), outcome)


def _holder_kind(holder: str | None, pid: int | None, owner: str, reader_pod: str | None) -> str:
    if pid is None:
        return "none"
    reader = connection.application_name("reader", owner, reader_pod) if reader_pod else None
    return "reader" if reader is not None and holder == reader else "other"


class Gauges(Collector):
    """The latest samples of each ingestion, collected on demand into the :data:`GAUGES`
    families; register it in a ``CollectorRegistry``."""

    def __init__(self, *, max_age: float = MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max_age, self._clock = max_age, clock
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, str], tuple[float, list[Sample]]] = {}

    def set(self, namespace: str, name: str, values: list[Sample]) -> None:
        """Replace the ingestion's samples (refreshing their age)."""
        with self._lock:
            self._latest[(namespace, name)] = (self._clock(), values)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._latest.pop((namespace, name), None)

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        with self._lock:
            fresh = {key: values for key, (at, values) in self._latest.items()
                     if now - at <= self._max_age}
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            metric: GaugeMetricFamily(PREFIX + metric, help_, labels=[*INGESTION_LABELS, *extra])
            for metric, (help_, extra) in GAUGES.items()}
        families.update({
            metric: CounterMetricFamily(PREFIX + metric, help_, labels=[*INGESTION_LABELS, *extra])
            for metric, (help_, extra) in COUNTERS.items()})
        for (namespace, name), values in sorted(fresh.items()):
            for s in values:
                families[s.metric].add_metric([namespace, name, *s.labels], s.value)
        yield from families.values()

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected on demand: nothing to check at registration
