"""delete (behind the finalizer): one :func:`lakeslot_operator.deletion.delete` attempt, translated.

Invariants: a finished attempt returns, so kopf removes the finalizer and Kubernetes the
resource (and its metrics go); a blocked one writes its status (phase ``Deleting``, ``Ready: CleanupBlocked`` with the
way out) and raises :class:`kopf.TemporaryError`, so the finalizer stays and kopf retries after
:func:`lakeslot_operator.deletion.retry_delay` (``retry_base``, 10 s, doubling, at most 5
minutes).

Failure modes: Kubernetes API errors propagate to kopf, which retries with its own backoff.
"""

from __future__ import annotations

import kopf

from lakeslot_operator import deletion
from lakeslot_operator.metrics import OperatorMetrics
from lakeslot_operator.reconcile import Context


def handle(body: kopf.Body, patch: kopf.Patch, ctx: Context, retry: int,
           metrics: OperatorMetrics, retry_base: float) -> None:
    blocked = deletion.delete(body, ctx).blocked
    if blocked is not None:
        patch.status.update(blocked.status)
        raise kopf.TemporaryError(blocked.message, delay=deletion.retry_delay(retry, retry_base))
    metrics.forget(body["metadata"]["namespace"], body["metadata"]["name"])
