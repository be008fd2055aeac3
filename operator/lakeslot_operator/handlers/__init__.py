"""kopf handlers: the one place lakeslot's handlers are registered; each only delegates.

Every handler body is one call into a module of this package named after its event, and those
only translate between kopf and lakeslot's plain modules (which tests call without kopf):

- startup → :mod:`.startup`: kopf's settings (finalizer ``lakeslot.io/finalizer``; handler
  progress and the diff base in ``lakeslot.io/...`` annotations, not in ``status``: the CRD's
  structural schema would prune kopf's own status fields; INFO and above become events).
- create / update / resume / a timer → :mod:`.change`: the same level-based
  :func:`lakeslot_operator.reconcile.reconcile`; its status replaces ``.status``, its events
  are posted and both go to the operator's metrics (:mod:`lakeslot_operator.metrics`). Spec
  errors are conditions, so no handler raises for them (no crash loop).
- delete (behind the finalizer) → :mod:`.delete`: :func:`lakeslot_operator.deletion.delete`
  removes the children and cleans the source per ``deletionPolicy``; a blocked cleanup (reason
  ``CleanupBlocked``) is retried by kopf with backoff until PostgreSQL answers or the annotation
  ``lakeslot.io/skip-source-cleanup: "true"`` lets the deletion finish without touching it;
  a finished deletion drops the ingestion's metrics.

Handler ids are the functions' qualified names (``build_registry.<locals>.on_change``, ...) and
kopf stores progress under them: renaming a handler orphans in-flight progress.
"""

from __future__ import annotations

import kopf

from lakeslot.api.models import GROUP, PLURAL, VERSION
from lakeslot_operator.deletion import RETRY_BASE_S, SKIP_CLEANUP_ANNOTATION
from lakeslot_operator.handlers import change, delete
from lakeslot_operator.handlers.startup import FINALIZER, configure
from lakeslot_operator.metrics import OperatorMetrics
from lakeslot_operator.reconcile import Context

__all__ = ["FINALIZER", "SKIP_CLEANUP_ANNOTATION", "TIMER_INTERVAL_S", "build_registry",
           "configure"]

TIMER_INTERVAL_S = 30.0


def build_registry(ctx: Context, *, timer_interval: float = TIMER_INTERVAL_S,
                   cleanup_retry_base: float = RETRY_BASE_S, login_via_client: bool = True,
                   metrics: OperatorMetrics | None = None) -> kopf.OperatorRegistry:
    """All of lakeslot's handlers on a fresh registry, bound to ``ctx``, reporting to
    ``metrics`` (default: a registry of their own that nobody serves). ``cleanup_retry_base``:
    the first wait before a blocked deletion is tried again (doubled per retry)."""
    observed = metrics if metrics is not None else OperatorMetrics()
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: object) -> None:
        configure(settings)

    if login_via_client:
        kopf.on.login(registry=registry)(kopf.login_via_client)

    @kopf.on.resume(*resource, registry=registry)
    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, registry=registry)
    def on_change(body: kopf.Body, patch: kopf.Patch, **_: object) -> None:
        change.handle(body, patch, ctx, observed)

    @kopf.timer(*resource, registry=registry, interval=timer_interval, initial_delay=timer_interval)
    def on_timer(body: kopf.Body, patch: kopf.Patch, **_: object) -> None:
        change.handle(body, patch, ctx, observed)

    @kopf.on.delete(*resource, registry=registry)
    def on_delete(body: kopf.Body, patch: kopf.Patch, retry: int, **_: object) -> None:
        delete.handle(body, patch, ctx, retry, observed, cleanup_retry_base)

    return registry
