"""The operator's Kubernetes access: a thin layer over the official client, dicts in, dicts out.

Invariants:

- :meth:`Kube.ensure` writes a child only when what we want differs from what we last wrote:
  the desired object's hash is kept in the ``lakeslot.io/spec-hash`` annotation. The API server
  adds defaults to every object, so comparing live specs would rewrite children forever; and
  rewriting a running SparkApplication makes the spark-operator kill and resubmit it (FACTS.md).
- A changed child is replaced whole (PUT with its resourceVersion), so fields removed from the
  desired object are removed from the live one; a concurrent change (the spark-operator writes
  an application's status all the time) makes the PUT fail with 409 Conflict: the child is read
  and compared again, at once, up to :data:`REPLACE_ATTEMPTS` times, and only then is the error
  left to kopf's retry (a minute later). A create answered 409 (AlreadyExists: a concurrent
  reconcile, e.g. the timer's, created it first under the same deterministic name) is not an
  error: the next reconcile compares it like any live child.
- Jobs (the verification's) are created once and never replaced (:meth:`Kube.create_job`): a
  Job's name says what it runs; deleting one deletes its pods too.
- Secrets are read only to hand a value to libpq (the user's) or to compare a job document
  (lakeslot's own input Secrets, :meth:`Kube.ensure_job_input`: the only Secrets it writes);
  values are never logged or returned in errors.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lakeslot.api.models import SecretKeyRef
from lakeslot_operator import children

HASH_ANNOTATION = "lakeslot.io/spec-hash"
SPARK = ("sparkoperator.k8s.io", "v1beta2", "sparkapplications")
REPLACE_ATTEMPTS = 3  # read-compare-replace rounds before a 409 Conflict goes to kopf's retry


def desired_hash(obj: Mapping) -> str:
    relevant = {"spec": obj.get("spec"), "labels": obj["metadata"].get("labels"),
                "ownerReferences": obj["metadata"].get("ownerReferences")}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:20]


def _absent(e: ApiException) -> bool:
    return e.status == 404


def _deployment(obj: dict) -> client.V1Deployment:
    """The client's model of a Deployment manifest: what the client makes of a dict body anyway
    (its methods validate their arguments), so the request it sends is the same."""
    return client.V1Deployment.model_validate(obj)


class Kube:
    def __init__(self, api_client: client.ApiClient):
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self._api_client = api_client

    def _plain(self, obj) -> dict:
        return self._api_client.sanitize_for_serialization(obj)

    # reading ---------------------------------------------------------------------------------

    def secret_value(self, namespace: str, ref: SecretKeyRef) -> str:
        try:
            secret = self.core.read_namespaced_secret(ref.name, namespace)
        except ApiException as e:
            if _absent(e):
                raise LookupError(f"Secret {namespace}/{ref.name} does not exist: create it with "
                                  f"the key {ref.key!r}") from None
            raise
        data = secret.data or {}
        if ref.key not in data:
            raise LookupError(f"Secret {namespace}/{ref.name} has no key {ref.key!r} (keys: "
                              f"{', '.join(sorted(data)) or 'none'})")
        return base64.b64decode(data[ref.key]).decode()

    def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        pods = self.core.list_namespaced_pod(namespace, label_selector=selector)
        return [self._plain(p) for p in pods.items]

    def get_deployment(self, namespace: str, name: str) -> dict | None:
        try:
            return self._plain(self.apps.read_namespaced_deployment(name, namespace))
        except ApiException as e:
            if _absent(e):
                return None
            raise

    def get_spark_application(self, namespace: str, name: str) -> dict | None:
        try:
            # The custom objects API is untyped: it returns the object's JSON, a dict.
            return cast(dict[str, Any],
                        self.custom.get_namespaced_custom_object(*SPARK[:2], namespace, SPARK[2], name))
        except ApiException as e:
            if _absent(e):
                return None
            raise

    def get_job(self, namespace: str, name: str) -> dict | None:
        try:
            return self._plain(self.batch.read_namespaced_job(name, namespace))
        except ApiException as e:
            if _absent(e):
                return None
            raise

    # writing ---------------------------------------------------------------------------------

    def ensure(self, obj: dict) -> bool:
        """Create or replace ``obj`` (a Deployment or SparkApplication) unless the live object
        was written from the same desired state. Returns whether anything was written."""
        obj = json.loads(json.dumps(obj))
        digest = desired_hash(obj)
        obj["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = digest
        attempt = 1
        while True:
            try:
                return self._ensure_once(obj, digest)
            except ApiException as e:
                if e.status != 409 or attempt >= REPLACE_ATTEMPTS:
                    raise
                attempt += 1

    def _ensure_once(self, obj: dict, digest: str) -> bool:
        """One read-compare-write; a replace that lost a race with another writer (the
        spark-operator updates an application's status all the time) is a 409 Conflict."""
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        spark = obj["kind"] == "SparkApplication"
        live = self.get_spark_application(namespace, name) if spark else \
            self.get_deployment(namespace, name)
        if live is None:
            try:
                if spark:
                    self.custom.create_namespaced_custom_object(*SPARK[:2], namespace, SPARK[2], obj)
                else:
                    self.apps.create_namespaced_deployment(namespace, _deployment(obj))
            except ApiException as e:
                if e.status != 409:
                    raise
                return False  # created meanwhile by a concurrent reconcile (the timer's): same name, same spec
            return True
        if (live["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) == digest:
            return False
        obj["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        if spark:
            self.custom.replace_namespaced_custom_object(*SPARK[:2], namespace, SPARK[2], name, obj)
        else:
            self.apps.replace_namespaced_deployment(name, namespace, _deployment(obj))
        return True

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """Set the replicas of an existing Deployment (absent: nothing to scale). The spec hash
        is dropped so the next ensure restores the desired count."""
        try:
            self.apps.patch_namespaced_deployment(name, namespace, {
                "metadata": {"annotations": {HASH_ANNOTATION: None}},
                "spec": {"replicas": replicas}})
        except ApiException as e:
            if not _absent(e):
                raise

    def ensure_job_input(self, child: dict, document: str) -> None:
        """Create or replace the Secret holding ``child``'s job document
        (:func:`lakeslot_operator.children.job_input_secret`), owned by the live child — which
        must exist (it was just written) — unless it already holds that document for it."""
        namespace, name = child["metadata"]["namespace"], child["metadata"]["name"]
        live = (self.get_spark_application(namespace, name) if child["kind"] == "SparkApplication"
                else self.get_job(namespace, name))
        if live is None:
            return  # gone meanwhile (deleted, or its time to live ran out): nothing to feed
        wanted = children.job_input_secret(child, document, live["metadata"]["uid"])
        secret_name = wanted["metadata"]["name"]
        try:
            current = self.core.read_namespaced_secret(secret_name, namespace)
        except ApiException as e:
            if not _absent(e):
                raise
            self.core.create_namespaced_secret(namespace, client.V1Secret.model_validate(wanted))
            return
        owners = [o.uid for o in (current.metadata.owner_references or [])] if current.metadata else []
        if current.data == wanted["data"] and owners == [live["metadata"]["uid"]]:
            return
        assert current.metadata is not None  # the API server returns every object's metadata
        wanted["metadata"]["resourceVersion"] = current.metadata.resource_version
        self.core.replace_namespaced_secret(secret_name, namespace,
                                            client.V1Secret.model_validate(wanted))

    def create_job(self, obj: dict) -> None:
        """Create the Job ``obj`` unless a Job of its name exists: a Job is never rewritten (its
        pod template is immutable, and its name says what it runs)."""
        try:
            self.batch.create_namespaced_job(obj["metadata"]["namespace"], client.V1Job.model_validate(obj))
        except ApiException as e:
            if e.status != 409:
                raise

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and, in the background, its pods (absent: nothing to delete)."""
        try:
            self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
        except ApiException as e:
            if not _absent(e):
                raise

    def delete_spark_application(self, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(*SPARK[:2], namespace, SPARK[2], name)
        except ApiException as e:
            if not _absent(e):
                raise

    def delete_children(self, namespace: str, labels: Mapping[str, str]) -> None:
        """Delete every Deployment and SparkApplication carrying ``labels``."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        for deployment in self.apps.list_namespaced_deployment(namespace, label_selector=selector).items:
            metadata = deployment.metadata
            assert metadata is not None and metadata.name is not None  # the API server names every object
            self.apps.delete_namespaced_deployment(metadata.name, namespace)
        # The custom objects API is untyped: it returns the list's JSON, a dict.
        apps = cast(dict[str, Any], self.custom.list_namespaced_custom_object(
            *SPARK[:2], namespace, SPARK[2], label_selector=selector))
        for app in apps.get("items", []):
            self.delete_spark_application(namespace, app["metadata"]["name"])
