"""The replication reader: the slot's pgoutput stream → sealed, LSN-named segments in staging.

- ``protocol``: COPY_BOTH framing (XLogData, keepalive) and standby status updates.
- ``pgoutput``: the pgoutput v1 decoder (control messages one by one, row changes in batches)
  and the relation cache.
- ``writer``: decoded rows → one open segment → sealed (the format and the store are
  :mod:`lakeslot.staging`, which consumers read through).
- ``stream``: one replication session's loop — segments, durable LSN, feedback.
- ``reader``: the process — session start checks, retries, definite errors, exit codes.
- ``command``: its command line (arguments → configuration), light to import.
- ``metrics``: Prometheus metrics, the health endpoint and ``/status``.
- ``health``: the reader's own state while it runs (streaming, or retrying a transient error),
  the status document of :mod:`lakeslot.observability.reader_status`, written on a change and bounded.
- ``arrays``: Arrow arrays from numpy buffers (``pyarrow.array`` would import pandas).

This package module only holds the defaults the command line shows without importing the rest.
"""

DEFAULT_SEGMENT_MAX_BYTES = 128 << 20
DEFAULT_SEGMENT_MAX_SECONDS = 10.0
DEFAULT_MAX_RETRY_SECONDS = 300.0
DEFAULT_HEALTH_INTERVAL_S = 5.0
