"""kopf handlers: translate kopf's events into ``reconcile()`` and ``cleanup`` calls, nothing else.

- create / update / resume / a timer → the same level-based :func:`reconcile.reconcile`; its
  status replaces ``.status`` and its events are posted. Spec errors are conditions, so no
  handler raises for them (no crash loop).
- delete (behind kopf's finalizer ``lakeslot.io/finalizer``) → children removed and the source
  cleaned per ``deletionPolicy``. An unreachable PostgreSQL is retried with backoff while the
  ``Ready`` condition says so (reason ``CleanupBlocked``); the annotation
  ``lakeslot.io/skip-source-cleanup: "true"`` lets the deletion finish without touching
  PostgreSQL (the slot then stays and retains WAL until dropped by hand).
- Handler progress and the diff base live in annotations (``lakeslot.io/...``), not in
  ``status``: the CRD's structural schema would prune kopf's own status fields.
"""

from __future__ import annotations

from datetime import datetime, timezone

import kopf
import psycopg
import pydantic

from lakeslot.api import conditions as cond
from lakeslot.api.models import GROUP, PLURAL, VERSION, PostgresIngestionStatus
from lakeslot.api.naming import IngestionNames, namespace_of
from lakeslot.api.validation import parse_resource
from lakeslot.source import cleanup, connection
from lakeslot_operator import children
from lakeslot_operator.reconcile import Context, Outcome, reconcile, source_settings

FINALIZER = f"{GROUP}/finalizer"
SKIP_CLEANUP_ANNOTATION = f"{GROUP}/skip-source-cleanup"
TIMER_INTERVAL_S = 30.0


def configure(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = 20  # INFO and above become Kubernetes events


def _apply(outcome: Outcome, body: kopf.Body, patch: kopf.Patch) -> None:
    patch.status.update(outcome.status)
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def build_registry(ctx: Context, *, timer_interval: float = TIMER_INTERVAL_S,
                   login_via_client: bool = True) -> kopf.OperatorRegistry:
    """All of lakeslot's handlers on a fresh registry, bound to ``ctx``."""
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
        _apply(reconcile(body, ctx), body, patch)

    @kopf.timer(*resource, registry=registry, interval=timer_interval, initial_delay=timer_interval)
    def on_timer(body: kopf.Body, patch: kopf.Patch, **_: object) -> None:
        _apply(reconcile(body, ctx), body, patch)

    @kopf.on.delete(*resource, registry=registry)
    def on_delete(body: kopf.Body, patch: kopf.Patch, retry: int, **_: object) -> None:
        delete(body, patch, ctx, retry)

    return registry


def delete(body: kopf.Body, patch: kopf.Patch, ctx: Context, retry: int) -> None:
    meta = body["metadata"]
    namespace, name = namespace_of(meta.get("namespace")), meta["name"]
    ctx.kube.delete_children(namespace, {children.INGESTION_LABEL: name})
    try:
        ingestion = parse_resource({k: v for k, v in body.items() if k != "status"})
    except pydantic.ValidationError:
        return  # never valid: lakeslot never created a slot or publication for it
    policy = ingestion.spec.policies.deletion_policy
    if policy == "Retain" or meta.get("annotations", {}).get(SKIP_CLEANUP_ANNOTATION) == "true":
        return
    names = IngestionNames.of(ingestion)
    try:
        settings = source_settings(ctx.kube, namespace, ingestion.spec.source)
        with ctx.connect(settings, connection.application_name("operator", names.owner),
                         long_running=True) as conn:
            cleanup.cleanup(conn, slot_name=names.slot, publication_name=names.publication,
                            owner=names.owner, deletion_policy=policy)
    except (psycopg.Error, LookupError) as e:
        message = (f"cannot drop the slot and publication (deletionPolicy: Delete): {e}; retrying. "
                   f"To delete without touching PostgreSQL, annotate the resource with "
                   f'{SKIP_CLEANUP_ANNOTATION}="true" (the slot then keeps retaining WAL)')
        status = PostgresIngestionStatus.model_validate(body.get("status") or {})
        status.phase = "Deleting"
        status.conditions = cond.set_condition(status.conditions, "Ready", "False",
                                               "CleanupBlocked", message,
                                               now=datetime.now(timezone.utc))
        patch.status.update(status.to_document())
        raise kopf.TemporaryError(message, delay=min(10 * 2 ** retry, 300)) from None
