"""kopf's settings for lakeslot, applied at startup.

Invariants: the finalizer is ``lakeslot.io/finalizer`` (a deleted resource stays until its
delete handler succeeded); handler progress lives in ``lakeslot.io/...`` annotations (small);
the diff base — the whole spec — in ``status.lastHandledConfiguration``, a field of the CRD's
schema (which would prune any other status field of kopf's): an object's annotations are limited
to 256 KiB in total, and a spec listing many tables exceeds that, which would make every patch
of the resource fail. Log records at INFO and above are posted as Kubernetes events.

Upgrading from a release that kept the diff base in the annotation: kopf finds none in status and
handles each resource as new once; every handler reconciles the same way (level-triggered), so
that costs one reconcile.
"""

from __future__ import annotations

import logging

import kopf

from lakeslot.api.models import GROUP

FINALIZER = f"{GROUP}/finalizer"


def configure(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(
        field="status.lastHandledConfiguration")
    settings.posting.level = logging.INFO  # INFO and above become Kubernetes events
