"""Asking a running reader pod how it is: ``GET /status`` on its metrics port.

A reader whose pod is available may still make no progress: it retries a transient error
(staging full or unwritable, the source unreachable from the pod). Only the reader knows; it
serves its status document (:mod:`lakeslot.observability.reader_status`) next to its metrics, and the
operator asks for it once per reconcile of an ingestion whose reader Deployment is available.
Staging cannot carry this document: it is often the thing that fails.

Invariants: one GET with a short timeout (:data:`TIMEOUT_S`) per reconcile, to the pod's own IP
and the reader's metrics port; the answer holds no credential (the reader never puts one in it).

Failure modes: no pod IP yet, a refused or timed-out connection (e.g. a NetworkPolicy that keeps
the operator from the reader's port), a non-JSON answer — all are "nothing known" (None): the
``Streaming`` condition then says what the Deployment says, as before, never a problem the reader
did not report.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Mapping
from typing import Any

from lakeslot.workloads import READER_METRICS_PORT

log = logging.getLogger(__name__)

TIMEOUT_S = 2.0


def fetch(pod: Mapping[str, Any], *, port: int = READER_METRICS_PORT,
          timeout: float = TIMEOUT_S) -> dict | None:
    """The status document the reader in ``pod`` serves, or None when it cannot be had."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    host = f"[{ip}]" if ":" in ip else ip
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/status", timeout=timeout) as answer:
            document = json.loads(answer.read())
    except (OSError, ValueError) as e:
        log.debug("cannot ask reader pod %s for its status: %s", pod["metadata"]["name"], e)
        return None
    return document if isinstance(document, dict) else None
