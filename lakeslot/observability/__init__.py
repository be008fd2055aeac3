"""How an ingestion's state is observed: one status report, one reader status document and one
set of metrics for the operator and local mode alike. Spark-free.

- :mod:`.status_report` — the PostgresIngestion status report (conditions, events, progress), built one
  way for the operator's ``.status`` and for ``lakeslot run`` / ``lakeslot status``.
- :mod:`.reader_status` — the reader's status document (streaming, or retrying and why): the
  contract between the reader and those who read it.
- :mod:`.freshness` — how many seconds each mirror table is behind its source.
- :mod:`.metrics` — the gauges of an ingestion, computed from its status, shared by the
  operator's ``/metrics`` and ``lakeslot run --metrics-port``; :mod:`.metrics_http` — serving such an
  endpoint (and a health check) from a daemon thread, for the reader, the operator and local mode.
"""
