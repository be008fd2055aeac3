"""What a local run shows while it runs: the status model computed every supervision tick
(:mod:`.observe`), drawn or logged (:mod:`.display`) and, with ``--metrics-port``, served on
``/metrics``.

Invariants:

- The status takes at most :data:`STATUS_SHARE` of the run's time (:mod:`.time_share`: after a
  computation that took longer than that share of the tick, the next waits). It reads
  every mirror's metadata and checks every source table, in the run's own process: with hundreds
  of tables, computed every tick, it took the apply job's interpreter lock for a tenth of the
  time and more. The mirrors are not read again while no apply pass finished since the
  re-snapshot decision read them all (:meth:`.schedule.Schedule.progress_read`): at 1,000
  mirrors on a network catalog the status and the decisions made 3,000 loads in a minute.

- Showing never stops the pipeline: a tick whose status cannot be computed is logged and keeps
  the last status (and the last metric values; none refreshed for
  :data:`~lakeslot.observability.metrics.MAX_AGE_S` disappear).
- ``/metrics`` serves the operator's gauges of the ingestion (:mod:`lakeslot.observability.metrics`:
  slot, lag, freshness, conditions, per table), labelled with the ingestion file's namespace and
  name, computed from the status each tick computes and the jobs' documents in staging — what
  ``lakeslot status`` prints, in numbers. The operator's counters (reconciles, evictions) and the
  reader's own metrics are not served: a local run has no reconcile, and its reader runs without
  a port (two runs would fight over it).
- The last status is the run's final one: it is computed once more after everything stopped
  (:meth:`LiveStatus.refresh_final`), with no run active.

Failure modes: a metrics port that cannot be bound is :class:`~.processes.RunFailed` with exit 2,
raised before anything starts; an unreadable apply document leaves its series out until it can
be read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, TextIO

from lakeslot.api.models import PostgresIngestionStatus
from lakeslot.api.naming import TableName
from lakeslot.exits import EXIT_USAGE
from lakeslot.local import observe
from lakeslot.local.config import Local
from lakeslot.local.display import Display
from lakeslot.local.processes import RunFailed
from lakeslot.local.time_share import TimeShare
from lakeslot.mirror.progress import MirrorProgress
from lakeslot.observability import metrics, metrics_http, status_report

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger("lakeslot.local")
STATUS_SHARE = 0.1  # of the run's time, at most, spent computing the live status


class LiveStatus:
    """The run's status, refreshed each tick: shown, and served when asked (see the module
    docstring)."""

    def __init__(self, local: Local, staged: observe.StagedCounter, *, out: TextIO | None,
                 interactive: bool | None) -> None:
        self.local, self.staged = local, staged
        self.display = Display(local, out, interactive=interactive)
        self.started = time.monotonic()
        self.last: PostgresIngestionStatus | None = None
        self.gauges: metrics.Gauges | None = None
        self.metrics_server: WSGIServer | None = None
        self._share = TimeShare(STATUS_SHARE)

    def due(self) -> bool:
        """Whether the status may be computed now (see :data:`STATUS_SHARE`)."""
        return self._share.due()

    def serve_metrics(self, port: int, host: str) -> None:
        from prometheus_client import CollectorRegistry, make_wsgi_app

        self.gauges = metrics.Gauges()
        registry = CollectorRegistry()
        registry.register(self.gauges)
        try:
            self.metrics_server = metrics_http.serve(
                make_wsgi_app(registry), port, host, "lakeslot-run-metrics")
        except OSError as e:
            raise RunFailed(EXIT_USAGE, f"cannot serve metrics on {host}:{port}: "
                            f"{e.strerror or e}") from e
        log.info("metrics on http://%s:%d/metrics", host, self.metrics_server.server_port)

    def refresh(self, activity: observe.Activity, target: int | None,
                apply_seconds: float | None,
                read: Mapping[TableName, MirrorProgress] | None = None
                ) -> PostgresIngestionStatus | None:
        """The status now, shown and exported; None (the last one kept) when it cannot be
        computed; ``read``: as :func:`.observe.observe`'s."""
        try:
            with self._share.spent():
                self.last = observe.observe(self.local, activity, staged=self.staged, read=read)
        except Exception as e:  # noqa: BLE001 - the display must never stop the pipeline
            log.warning("cannot compute the status: %s", status_report.first_line(e))
            return None
        self._export(self.last)
        self.display.show(self.last, time.monotonic() - self.started, target,
                          apply_seconds=apply_seconds)
        return self.last

    def refresh_final(self, activity: observe.Activity, target: int | None,
                      apply_seconds: float | None) -> None:
        self.last = observe.observe(self.local, activity, staged=self.staged)
        self.display.show(self.last, time.monotonic() - self.started, target,
                          apply_seconds=apply_seconds, final=True)

    def _export(self, status: PostgresIngestionStatus) -> None:
        """The status (and the jobs' documents) into the served gauges."""
        if self.gauges is None:
            return
        names = self.local.job.names
        try:
            apply_pass = self.staged.staging.read_apply_status()
        except (OSError, ValueError):  # unreadable now: its series are left out until it is
            apply_pass = None
        self.gauges.set(names.namespace, names.name, metrics.samples(
            status, owner=names.owner, suspended=False, apply_pass=apply_pass,
            snapshot=observe.snapshot_document(self.local)))

    def close(self) -> None:
        self.display.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
