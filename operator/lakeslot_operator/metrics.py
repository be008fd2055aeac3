"""Prometheus metrics of the operator, served on ``/metrics`` of the operator pod.

Invariants:

- The gauges are :mod:`lakeslot.observability.metrics`' (the same as ``lakeslot run
  --metrics-port``): computed from the status a reconcile wrote (which holds what the operator
  read from ``pg_replication_slots``, Iceberg and staging) and the jobs' documents it read, so a
  scrape and ``kubectl get pgi -o yaml`` never disagree. The kopf handler only hands each
  reconcile's outcome to :meth:`OperatorMetrics.observe`.
- Everything lives in the operator's own registry (no process-global state: tests run several
  operators side by side).
- An ingestion's series disappear when it is deleted (:meth:`OperatorMetrics.forget`) and when
  no reconcile refreshed them for :data:`~lakeslot.observability.metrics.MAX_AGE_S` (a replica that
  kopf peering paused, or that lost the resource, stops reporting instead of repeating old
  values). With several replicas only the active one reports: alert on ``max by (namespace,
  ingestion)``.
- Cardinality: per ingestion the 48 gauge series of :mod:`lakeslot.observability.metrics`, the two
  counters 4 with their ``_created`` and the reconcile histogram 15 (67 in all); per table 7.

Metrics besides the gauges (prefix ``lakeslot_``, labels ``namespace``, ``ingestion``):

======================================  ==================================================================
``stale_holder_evictions_total``        slot holders other than the reader terminated
``reconcile_duration_seconds``          histogram of reconcile durations
``reconcile_errors_total``              reconciles that raised (kopf retries them)
======================================  ==================================================================

Failure mode: a port already in use raises ``OSError`` when serving starts (the operator exits).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app

from lakeslot.api.models import PostgresIngestionStatus
from lakeslot.observability import metrics_http
from lakeslot.observability.metrics import INGESTION_LABELS, MAX_AGE_S, PREFIX, Gauges, samples
from lakeslot.observability.status_report import Event as StatusEvent


class OperatorMetrics:
    """The operator's registry: the gauges from the last status of each ingestion, counters and
    the reconcile histogram kept as they happen."""

    def __init__(self, *, max_age: float = MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry()
        self._clock = clock
        self.gauges = Gauges(max_age=max_age, clock=clock)
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
        r.register(self.gauges)

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
                events: list[StatusEvent], apply_pass: Mapping | None = None,
                snapshot: Mapping | None = None) -> None:
        """Take one reconcile's outcome: the status it wrote, the events it told, the apply
        job's last pass document and the snapshot's progress document it read."""
        model = PostgresIngestionStatus.model_validate(status)
        self.gauges.set(namespace, name, samples(model, owner=f"{namespace}/{name}",
                                                 suspended=suspended, apply_pass=apply_pass,
                                                 snapshot=snapshot))
        evicted = sum(1 for e in events if e.reason == "StaleHolderEvicted")
        counter = self.evictions.labels(namespace, name)  # exported from 0 on
        if evicted:
            counter.inc(evicted)

    def forget(self, namespace: str, name: str) -> None:
        """The ingestion is gone: drop every series of it."""
        self.gauges.forget(namespace, name)
        for metric in (self.evictions, self.errors, self.duration):
            with contextlib.suppress(KeyError):
                metric.remove(namespace, name)

    def serve(self, port: int, host: str = "0.0.0.0") -> WSGIServer:
        """Serve ``/metrics`` from a daemon thread; returns the server (``server_port``)."""
        return metrics_http.serve(make_wsgi_app(self.registry), port, host,
                                  "lakeslot-operator-metrics")
