"""What the state of a child says: waiting for it, or someone must act. Pure functions.

The operator reports a child that cannot work under a reason of its own, and the Argo CD health
check (helm/argocd/health.lua) shows every reason outside its short *waiting* list as Degraded:

- ``ChildRejected`` — the API server refused to create or change a child (a 4xx other than 409
  Conflict and 429 Too Many Requests, which retrying resolves): the server's message, e.g. an
  admission webhook's or a Pod Security denial, or a 403 from RBAC. :func:`rejection` turns the
  client's exception into it.
- ``NameTaken`` — an object of a child's name (or of its input ConfigMap's) exists and is not
  lakeslot's (:class:`lakeslot_operator.kube.NameTaken`, whose message names both): lakeslot
  leaves it untouched, so the child cannot be written until it is renamed or deleted.
- ``ReaderFailing`` — the reader Deployment exceeded its progress deadline, or a reader pod is
  waiting for a reason that waiting does not fix (:data:`STUCK_CONTAINER_REASONS`:
  CrashLoopBackOff, ImagePullBackOff, ...).
- ``ApplyFailed`` — the apply SparkApplication is ``FAILED`` or ``SUBMISSION_FAILED``
  (spark-operator's terminal failure states once its retries are used up).

Everything else (no available replica yet, the apply application being submitted or restarted)
stays a waiting reason (``ReaderNotReady``, ``ApplyNotRunning``).

Invariant: messages carry the server's or the kubelet's words and object names only, never a
Secret's value (no child holds one).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from lakeslot.errors import definite_status
from lakeslot.observability.status_report import APPLY_FAILED, CHILD_REJECTED, NAME_TAKEN, READER_FAILING

READER_NOT_READY = "ReaderNotReady"
APPLY_NOT_RUNNING = "ApplyNotRunning"

STUCK_CONTAINER_REASONS = ("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull",
                           "InvalidImageName", "CreateContainerConfigError",
                           "CreateContainerError")
FAILED_SPARK_STATES = ("FAILED", "SUBMISSION_FAILED")
ERROR_CHARS = 1000  # of spark-operator's errorMessage (a spark-submit log can be long)


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str


def is_rejection(error: ApiException) -> bool:
    """Whether the API server refused a write for good (:func:`lakeslot.errors.definite_status`)."""
    return definite_status(error.status)


def rejection(kind: str, name: str, error: ApiException) -> Problem:
    """``ChildRejected`` with the server's own message (its Status body, else the HTTP reason)."""
    message = error.reason or ""
    try:
        body = json.loads(error.body or "")
        message = body.get("message") or message
    except (ValueError, AttributeError):
        pass
    return Problem(CHILD_REJECTED, f"the API server refused {kind} {name} ({error.status}): {message}")


def name_taken(error: Exception) -> Problem:
    """``NameTaken`` with the message of :class:`lakeslot_operator.kube.NameTaken`."""
    return Problem(NAME_TAKEN, str(error))


def reader_problem(deployment: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> Problem | None:
    """Why the reader does not run (None: it has an available replica)."""
    status = (deployment or {}).get("status") or {}
    if status.get("availableReplicas"):
        return None
    for pod in pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_CONTAINER_REASONS:
                detail = f": {waiting['message']}" if waiting.get("message") else ""
                return Problem(READER_FAILING, f"reader pod {pod['metadata']['name']} is "
                               f"{waiting['reason']}{detail}")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            return Problem(READER_FAILING, "the reader Deployment exceeded its progress deadline: "
                           + (condition.get("message") or "no replica became available"))
    if deployment is None:
        return Problem(READER_NOT_READY, "the reader Deployment does not exist yet")
    return Problem(READER_NOT_READY, "the reader Deployment has no available replica yet")


def apply_problem(app: Mapping[str, Any] | None) -> Problem | None:
    """Why the apply job does not run (None: it is RUNNING)."""
    if app is None:
        return Problem(APPLY_NOT_RUNNING, "the apply SparkApplication is absent")
    state = ((app.get("status") or {}).get("applicationState") or {})
    name = state.get("state") or "SUBMITTED"
    if name == "RUNNING":
        return None
    if name in FAILED_SPARK_STATES:
        detail = f": {state['errorMessage'][:ERROR_CHARS]}" if state.get("errorMessage") else ""
        return Problem(APPLY_FAILED, f"the apply SparkApplication is {name}{detail}")
    return Problem(APPLY_NOT_RUNNING, f"the apply SparkApplication is {name}")
