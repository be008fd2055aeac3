"""kopf's settings for lakeslot, applied at startup.

Invariants: the finalizer is ``lakeslot.io/finalizer`` (a deleted resource stays until its
delete handler succeeded); handler progress and the diff base live in ``lakeslot.io/...``
annotations, never in ``status`` (the CRD's structural schema would prune kopf's own status
fields); log records at INFO and above are posted as Kubernetes events.
"""

from __future__ import annotations

import logging

import kopf

from lakeslot.api.models import GROUP

FINALIZER = f"{GROUP}/finalizer"


def configure(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = logging.INFO  # INFO and above become Kubernetes events
