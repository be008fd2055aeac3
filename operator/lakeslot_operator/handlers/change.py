"""create / update / resume / timer: one level-based reconcile, written back.

Invariants: the handler never raises for the resource's own problems (an invalid spec, an
unreachable PostgreSQL or catalog are conditions in the status reconcile returns), so kopf does
not crash-loop on them; the returned status replaces ``.status`` as a whole (reconcile computes
the complete status each time; the resource keeps :func:`lakeslot.observability.status_report.stored`
of it, the metrics see all of it) and every event it tells is posted on the resource.

Failure modes: Kubernetes API errors from reconcile propagate to kopf, which retries the handler
with backoff (the timer calls it again anyway).
"""

from __future__ import annotations

import kopf

from lakeslot.observability import status_report
from lakeslot_operator.metrics import OperatorMetrics
from lakeslot_operator.reconcile import Context, Outcome, reconcile


def handle(body: kopf.Body, patch: kopf.Patch, ctx: Context, metrics: OperatorMetrics) -> None:
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    with metrics.reconciling(namespace, name):
        outcome = reconcile(body, ctx)
    write(outcome, body, patch)
    metrics.observe(namespace, name, outcome.status, events=outcome.events,
                    suspended=bool(body.get("spec", {}).get("suspend")), apply_pass=outcome.apply_pass,
                    snapshot=outcome.snapshot)


def write(outcome: Outcome, body: kopf.Body, patch: kopf.Patch) -> None:
    """The outcome's status into kopf's patch, its events onto the resource."""
    patch.status.update(status_report.stored(outcome.status))
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
