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
- **Only lakeslot's own objects are changed or deleted.** Before every replace, patch or delete
  the live object is read and must be lakeslot's (:func:`lakeslot_operator.children.is_ours`: the
  ingestion's labels and an owner reference to the ingestion, or for a job's input ConfigMap to
  its child); the write then carries that object's ``resourceVersion`` (replace) or its ``uid``
  (patch; a precondition of a delete), so an object swapped in meanwhile is refused by the API
  server, not changed. An object of a child's name that is not lakeslot's is left untouched:
  writing it raises :class:`NameTaken` (naming it and what lakeslot needs the name for), and a
  delete or scale of it does nothing (lakeslot's child of that name does not exist). A Job found
  under the name of one lakeslot creates is checked the same way.
- Secrets are only read — the user's, whose values the operator hands to libpq and the catalog —
  and never written; values are never logged or returned in errors. A job's input goes into a
  ConfigMap (:meth:`Kube.ensure_job_input`).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any, TypeVar, cast

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


K = TypeVar("K")


def _absent(e: ApiException) -> bool:
    return e.status == 404


class NameTaken(Exception):
    """An object of the name lakeslot would write exists and is not lakeslot's; it is left
    untouched. The message names it and what lakeslot needs the name for."""

    def __init__(self, live: Mapping, wanted: Mapping):
        meta, owner = wanted["metadata"], wanted["metadata"]["ownerReferences"][0]
        super().__init__(
            f"{wanted['kind']} {meta['namespace']}/{meta['name']} exists and is not lakeslot's "
            f"(lakeslot's carries the label {children.INGESTION_LABEL}={meta['labels'][children.INGESTION_LABEL]} "
            f"and an owner reference to {owner['kind']} {owner['name']}): lakeslot left it untouched "
            f"and needs the name for {children.purpose(wanted)}; rename or delete that "
            f"{live.get('kind') or wanted['kind']}, or give the PostgresIngestion another name")


def _preconditions(live: Mapping) -> client.V1DeleteOptions:
    """Delete exactly the object that was read (the API server refuses another of its name)."""
    return client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=live["metadata"]["uid"]))


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
        return self.secret_values(namespace, {ref.key: ref})[ref.key]

    def secret_values(self, namespace: str, refs: Mapping[K, SecretKeyRef]) -> dict[K, str]:
        """The value of each of ``refs``, each Secret read once however many keys of it are named
        (LookupError names a missing Secret or key)."""
        read: dict[str, dict[str, Any]] = {}  # the Secrets read, their base64 data by key
        values: dict[K, str] = {}
        for name, ref in refs.items():
            if ref.name not in read:
                try:
                    read[ref.name] = self.core.read_namespaced_secret(ref.name, namespace).data or {}
                except ApiException as e:
                    if _absent(e):
                        raise LookupError(f"Secret {namespace}/{ref.name} does not exist: create it "
                                          f"with the key {ref.key!r}") from None
                    raise
            data = read[ref.name]
            if ref.key not in data:
                raise LookupError(f"Secret {namespace}/{ref.name} has no key {ref.key!r} (keys: "
                                  f"{', '.join(sorted(data)) or 'none'})")
            values[name] = base64.b64decode(data[ref.key]).decode()
        return values

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
        if not children.is_ours(live, obj):
            raise NameTaken(live, obj)
        if (live["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) == digest:
            return False
        obj["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        if spark:
            self.custom.replace_namespaced_custom_object(*SPARK[:2], namespace, SPARK[2], name, obj)
        else:
            self.apps.replace_namespaced_deployment(name, namespace, _deployment(obj))
        return True

    def scale_deployment(self, namespace: str, name: str, replicas: int, *, ingestion: str) -> None:
        """Set the replicas of the ingestion's existing Deployment (absent or not lakeslot's:
        nothing to scale). The spec hash is dropped so the next ensure restores the desired
        count."""
        live = self.get_deployment(namespace, name)
        if live is None or not children.is_ours(live, children.owned_by_ingestion(ingestion)):
            return
        try:
            self.apps.patch_namespaced_deployment(name, namespace, {
                "metadata": {"annotations": {HASH_ANNOTATION: None}, "uid": live["metadata"]["uid"]},
                "spec": {"replicas": replicas}})
        except ApiException as e:
            if not _absent(e):
                raise

    def get_config_map(self, namespace: str, name: str) -> dict | None:
        try:
            return self._plain(self.core.read_namespaced_config_map(name, namespace))
        except ApiException as e:
            if _absent(e):
                return None
            raise

    def ensure_job_input(self, child: dict, document: str) -> None:
        """Create or replace the ConfigMap holding ``child``'s job document
        (:func:`lakeslot_operator.children.job_input_config_map`), owned by the live child — which
        must exist (it was just written) — unless it already holds that document for it
        (:class:`NameTaken` when a ConfigMap of its name is not lakeslot's)."""
        namespace, name = child["metadata"]["namespace"], child["metadata"]["name"]
        live = (self.get_spark_application(namespace, name) if child["kind"] == "SparkApplication"
                else self.get_job(namespace, name))
        if live is None:
            return  # gone meanwhile (deleted, or its time to live ran out): nothing to feed
        wanted = children.job_input_config_map(child, document, live["metadata"]["uid"])
        current = self.get_config_map(namespace, wanted["metadata"]["name"])
        if current is None:
            self.core.create_namespaced_config_map(namespace, client.V1ConfigMap.model_validate(wanted))
            return
        if not children.is_ours(current, wanted):
            raise NameTaken(current, wanted)
        owners = [o["uid"] for o in current["metadata"].get("ownerReferences") or []]
        if current.get("data") == wanted["data"] and owners == [live["metadata"]["uid"]]:
            return
        wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        self.core.replace_namespaced_config_map(wanted["metadata"]["name"], namespace,
                                                client.V1ConfigMap.model_validate(wanted))

    def create_job(self, obj: dict) -> None:
        """Create the Job ``obj`` unless lakeslot's Job of its name exists: a Job is never
        rewritten (its pod template is immutable, and its name says what it runs);
        :class:`NameTaken` when a Job of its name is not lakeslot's."""
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            self.batch.create_namespaced_job(namespace, client.V1Job.model_validate(obj))
        except ApiException as e:
            if e.status != 409:
                raise
            live = self.get_job(namespace, name)
            if live is not None and not children.is_ours(live, obj):
                raise NameTaken(live, obj) from None

    def delete_job(self, namespace: str, name: str, *, ingestion: str) -> None:
        """Delete the ingestion's Job and, in the background, its pods (absent or not
        lakeslot's: nothing to delete)."""
        live = self.get_job(namespace, name)
        if live is None or not children.is_ours(live, children.owned_by_ingestion(ingestion)):
            return
        try:
            self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background",
                                             body=_preconditions(live))
        except ApiException as e:
            if not _absent(e):
                raise

    def delete_spark_application(self, namespace: str, name: str, *, ingestion: str) -> None:
        """Delete the ingestion's SparkApplication (absent or not lakeslot's: nothing to delete)."""
        live = self.get_spark_application(namespace, name)
        if live is None or not children.is_ours(live, children.owned_by_ingestion(ingestion)):
            return
        try:
            self.custom.delete_namespaced_custom_object(*SPARK[:2], namespace, SPARK[2], name,
                                                        body=_preconditions(live))
        except ApiException as e:
            if not _absent(e):
                raise

    def delete_children(self, namespace: str, labels: Mapping[str, str]) -> None:
        """Delete every Deployment and SparkApplication carrying ``labels`` (which name the
        ingestion) that is lakeslot's child of that ingestion."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        ingestion = labels[children.INGESTION_LABEL]
        owner = children.owned_by_ingestion(ingestion)
        for deployment in self.apps.list_namespaced_deployment(namespace, label_selector=selector).items:
            live = self._plain(deployment)
            if children.is_ours(live, owner):
                self.apps.delete_namespaced_deployment(live["metadata"]["name"], namespace,
                                                       body=_preconditions(live))
        # The custom objects API is untyped: it returns the list's JSON, a dict.
        apps = cast(dict[str, Any], self.custom.list_namespaced_custom_object(
            *SPARK[:2], namespace, SPARK[2], label_selector=selector))
        for app in apps.get("items", []):
            self.delete_spark_application(namespace, app["metadata"]["name"], ingestion=ingestion)
