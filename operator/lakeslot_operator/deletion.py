"""Deleting a PostgresIngestion: its children go, and its source is cleaned per ``deletionPolicy``.

Plain module (no kopf): :func:`delete` makes one attempt and returns a :class:`Deletion`; the kopf
handler (``handlers/delete.py``) only writes its status and asks kopf to retry.

Invariants:

- The children (reader Deployment, SparkApplications) are deleted on every attempt, first.
- PostgreSQL is touched only for a valid resource with ``deletionPolicy: Delete`` and without the
  annotation ``lakeslot.io/skip-source-cleanup: "true"``: a resource that never validated never
  got a slot or publication from lakeslot; ``Retain`` (the default) keeps both; the annotation is the way out
  when PostgreSQL cannot be reached (the slot then stays and retains WAL until dropped by hand).
- Cleaning is idempotent (:func:`lakeslot.source.cleanup.cleanup`): an attempt after a success
  is a no-op, so retrying is always safe.

Failure modes: a missing Secret or a PostgreSQL error (unreachable, refused) blocks the deletion:
the result carries the message — the error and the way out — and the status to write (phase
``Deleting``, ``Ready`` False with reason ``CleanupBlocked``); the caller retries after
:func:`retry_delay`. Kubernetes API errors propagate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import psycopg
import pydantic

from lakeslot.api import conditions
from lakeslot.api.annotations import SKIP_SOURCE_CLEANUP as SKIP_CLEANUP_ANNOTATION
from lakeslot.api.models import PostgresIngestion, PostgresIngestionStatus
from lakeslot.api.naming import IngestionNames, namespace_of
from lakeslot.api.validation import parse_resource
from lakeslot.source import cleanup, connection
from lakeslot_operator import children
from lakeslot_operator.reconcile import Context, source_settings

RETRY_BASE_S = 10
RETRY_MAX_S = 300


@dataclass(frozen=True)
class Blocked:
    """The source could not be cleaned: the deletion must wait and be retried."""

    message: str  # the error and the way out
    status: dict  # the status to write meanwhile (phase Deleting, Ready: CleanupBlocked)


@dataclass(frozen=True)
class Deletion:
    """One attempt's result."""

    cleaned: Mapping[str, str] | None = None  # cleanup's report, e.g. {"slot": "dropped"}; None: not touched
    blocked: Blocked | None = None

    @property
    def done(self) -> bool:
        return self.blocked is None


def source_to_clean(body: Mapping) -> PostgresIngestion | None:
    """The validated ingestion when deleting it must clean its source; None when PostgreSQL is
    left untouched (never valid, ``deletionPolicy: Retain``, or the skip annotation)."""
    try:
        ingestion = parse_resource({k: v for k, v in body.items() if k != "status"})
    except pydantic.ValidationError:
        return None  # never valid: lakeslot never created a slot or publication for it
    annotations = body["metadata"].get("annotations") or {}
    if ingestion.spec.policies.deletion_policy == "Retain" or \
            annotations.get(SKIP_CLEANUP_ANNOTATION) == "true":
        return None
    return ingestion


def blocked_message(error: BaseException) -> str:
    return (f"cannot drop the slot and publication (deletionPolicy: Delete): {error}; retrying. "
            f"To delete without touching PostgreSQL, annotate the resource with "
            f'{SKIP_CLEANUP_ANNOTATION}="true" (the slot then keeps retaining WAL)')


def blocked_status(body: Mapping, message: str, now: datetime) -> dict:
    """The resource's status with phase ``Deleting`` and ``Ready: CleanupBlocked``."""
    status = PostgresIngestionStatus.model_validate(body.get("status") or {})
    status.phase = "Deleting"
    status.conditions = conditions.set_condition(status.conditions, "Ready", "False", "CleanupBlocked",
                                                 message, now=now)
    return status.to_document()


def retry_delay(retry: int, base: float = RETRY_BASE_S) -> float:
    """Seconds before the ``retry``-th retry (0-based) of a blocked deletion: ``base`` doubled
    per retry, at most :data:`RETRY_MAX_S`."""
    return min(base * 2 ** retry, RETRY_MAX_S)


def delete(body: Mapping, ctx: Context) -> Deletion:
    """Delete the children, then clean the source when :func:`source_to_clean` says so."""
    meta = body["metadata"]
    namespace = namespace_of(meta.get("namespace"))
    ctx.kube.delete_children(namespace, {children.INGESTION_LABEL: meta["name"]})
    ingestion = source_to_clean(body)
    if ingestion is None:
        return Deletion()
    names = IngestionNames.of(ingestion)
    try:
        settings = source_settings(ctx.kube, namespace, ingestion.spec.source)
        with ctx.connect(settings, connection.application_name("operator", names.owner),
                         long_running=True) as conn:
            cleaned = cleanup.cleanup(conn, slot_name=names.slot,
                                      publication_name=names.publication, owner=names.owner,
                                      deletion_policy=ingestion.spec.policies.deletion_policy,
                                      publication_management=ingestion.spec.source.publication_management)
    except (psycopg.Error, LookupError) as e:
        message = blocked_message(e)
        return Deletion(blocked=Blocked(message, blocked_status(body, message, ctx.now())))
    return Deletion(cleaned=cleaned)
