"""Prometheus metrics and the health endpoint of the replication reader.

Served on one port (the reader Deployment's ``metrics`` port): ``/metrics`` in Prometheus' text
format, ``/healthz`` for the liveness and readiness probes, ``/status`` the reader's status document
(:mod:`lakeslot.observability.reader_status`: streaming, or retrying with the reason and error — how the
operator learns why a running reader makes no progress). Every metric lives in the reader's
own registry (no process-global state, so tests can run readers side by side).

Metrics (all prefixed ``lakeslot_reader_``):

- ``received_lsn``: the furthest WAL position the server reported (changes and keepalives).
- ``durable_lsn``: the end of the last sealed segment — what the reader confirms as flushed.
- ``lag_bytes``: the server's current WAL position minus the slot's confirmed flush position
  (WAL the slot retains because of the reader), sampled at each health check.
- ``transactions_total``, ``changes_total{op}`` (I, U, D, T, M), ``segments_sealed_total``,
  ``segment_rows_total``, ``reconnects_total``.
- ``start_time_seconds``: when the process started (Unix time); a new value in the same pod is
  a container restart (the chart's ``LakeslotReaderRestarting`` alert counts them).

Health: ``/healthz`` answers 200 while the reader's loop has shown life within
:data:`STALE_AFTER_S` (it beats while streaming and while waiting to retry), 503 otherwise — a
reader stuck inside a call gets restarted by Kubernetes.

Failure mode: a port already in use raises ``OSError`` at start (the reader exits 1).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app

from lakeslot.observability import metrics_http

STALE_AFTER_S = 120.0


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.received_lsn = Gauge("lakeslot_reader_received_lsn",
                                  "Furthest WAL position reported by the server", registry=r)
        self.durable_lsn = Gauge("lakeslot_reader_durable_lsn",
                                 "End of the last sealed segment (confirmed as flushed)", registry=r)
        self.lag_bytes = Gauge("lakeslot_reader_lag_bytes",
                               "Server WAL position minus the slot's confirmed flush position",
                               registry=r)
        self.transactions = Counter("lakeslot_reader_transactions",
                                    "Transactions received", registry=r)
        self.changes = Counter("lakeslot_reader_changes", "Changes received by operation",
                               ["op"], registry=r)
        self.segments_sealed = Counter("lakeslot_reader_segments_sealed",
                                       "Segments sealed in staging", registry=r)
        self.segment_rows = Counter("lakeslot_reader_segment_rows",
                                    "Rows written to segments", registry=r)
        self.reconnects = Counter("lakeslot_reader_reconnects",
                                  "Replication sessions started after the first", registry=r)
        self.start_time = Gauge("lakeslot_reader_start_time_seconds",
                                "When the reader process started (Unix time)", registry=r)
        self.start_time.set_to_current_time()
        self._beat = time.monotonic()

    def beat(self) -> None:
        self._beat = time.monotonic()

    def healthy(self) -> bool:
        return time.monotonic() - self._beat < STALE_AFTER_S

    def rows(self, ops: pa.Array) -> None:
        """Count a written batch by its ``op`` column."""
        for entry in pc.value_counts(ops).to_pylist():
            op, count = entry["values"], entry["counts"]
            if op == "C":
                self.transactions.inc(count)
            else:
                self.changes.labels(op).inc(count)
        self.segment_rows.inc(len(ops))

    def serve(self, port: int, host: str = "0.0.0.0", *,
              status: Callable[[], dict] | None = None) -> WSGIServer:
        """Serve ``/metrics``, ``/healthz`` and (with ``status``) ``/status`` from a daemon
        thread; returns the server."""
        prometheus = make_wsgi_app(self.registry)

        def app(environ, start_response):
            if status is not None and environ.get("PATH_INFO") == "/status":
                start_response("200 OK", [("Content-Type", "application/json")])
                return [json.dumps(status()).encode() + b"\n"]
            if environ.get("PATH_INFO") == "/healthz":
                ok = self.healthy()
                start_response("200 OK" if ok else "503 Service Unavailable",
                               [("Content-Type", "text/plain")])
                return [b"ok\n" if ok else b"stale\n"]
            return prometheus(environ, start_response)

        return metrics_http.serve(app, port, host, "lakeslot-reader-metrics")
