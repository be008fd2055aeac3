"""The replication reader: the slot's pgoutput stream → sealed, LSN-named segments in staging.

- :mod:`.reader` — the process: session start checks, retries, definite errors, exit codes;
  :mod:`.command` — its command line (arguments → configuration), light to import.
- :mod:`.stream` — one replication session's loop: segments, durable LSN, feedback.
- :mod:`.protocol` — COPY_BOTH framing (XLogData, keepalive) and standby status updates.
- :mod:`.pgoutput` — the pgoutput v1 decoder (control messages one by one, row changes in
  batches) and the relation cache.
- :mod:`.writer` — decoded rows → one open segment → sealed (the format and the store are
  :mod:`lakeslot.staging`, which consumers read through).
- :mod:`.health` — the reader's own state while it runs (streaming, or retrying a transient
  error), the status document of :mod:`lakeslot.observability.reader_status`, written on a change
  and bounded; :mod:`.metrics` — Prometheus metrics, the health endpoint and ``/status``.
- :mod:`.orphan` — a reader whose parent died ends, even when its main thread is blocked.
- :mod:`.arrays` — Arrow arrays from numpy buffers (``pyarrow.array`` would import pandas).

This package module only holds the defaults the command line shows without importing the rest.
"""

from lakeslot.cadence import SEAL_MAX_S

DEFAULT_SEGMENT_MAX_BYTES = 128 << 20
DEFAULT_SEGMENT_MAX_SECONDS = SEAL_MAX_S
DEFAULT_MAX_RETRY_SECONDS = 300.0
DEFAULT_HEALTH_INTERVAL_S = 5.0
