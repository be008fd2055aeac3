"""Children that cannot work show as conditions and as Degraded in Argo CD, never as a retry loop.

On the emulator (real reconcile, real PostgreSQL 18): the operator's requests go through a proxy
that stands in for admission steps the emulator does not run — OwnerReferencesPermissionEnforcement
(403, what OpenShift answers a chart without ``postgresingestions/finalizers``, judged against the
chart's rendered RBAC) and a spark-operator validating webhook (422; its resource-quota check is
one lakeslot cannot refuse earlier). A refused child is a ``ChildRejected`` condition with the
server's message, an event, and Degraded in the Argo CD health Lua, within that one reconcile.

Simulated (cannot run here): the kubelet's container states (tests write a reader pod's status)
and spark-operator's application states (tests write ``status.applicationState``).
"""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from lakeslot.api.annotations import VERIFY
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.observability.status_report import CHILD_REJECTED, READER_FAILING
from lakeslot_operator import child_health, children
from lakeslot_operator.kube import Kube
from lakeslot_operator.reconcile import Context, reconcile
from tests.api_cases import apply_edits, base_document
from tests.support import chart, operator_env
from tests.support.rbac import (
    Grant,
    RecordingProxy,
    grants,
    owner_reference_calls,
    owner_references_enforcement,
    status_body,
)

QUOTA_DENIAL = ('admission webhook "validate-sparkapplication.sparkoperator.k8s.io" denied the request: '
                "failed to validate SparkApplication: exceeded resource quota of namespace default")


def _chart_grants(*, with_finalizers: bool) -> set[Grant]:
    values = {"watchNamespaces": [operator_env.NAMESPACE]}
    manifests = chart.render(values)
    granted = grants(manifests, chart.operator_account(manifests))
    if not with_finalizers:  # the chart before issue 17
        (call,) = owner_reference_calls()
        granted = {g for g in granted if (g.verb, g.group, g.resource) != call}
    return granted


def _quota_webhook(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]] | None:
    if method == "POST" and path.endswith("/sparkapplications"):
        return 422, status_body(422, "Invalid", QUOTA_DENIAL)
    return None


def _reconcile_through(api, proxy_url: str, name: str):
    """One reconcile whose API calls go through the proxy; its status written back directly."""
    configuration = kubernetes.client.Configuration()
    configuration.host = proxy_url
    with kubernetes.client.ApiClient(configuration) as through:
        outcome = reconcile(operator_env.get_ingestion(api, name) or {}, Context(kube=Kube(through)))
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        *operator_env.CUSTOM, name, {"status": outcome.status})
    return operator_env.get_ingestion(api, name), outcome.events


@pytest.fixture
def ingestion(api, pgdb, tmp_path):
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")
    document = operator_env.ingestion_document("orders", pgdb, [TableName("public", "orders")],
                                               warehouse=(tmp_path / "warehouse").as_uri(),
                                               staging=(tmp_path / "staging").as_uri())
    operator_env.create_ingestion(api, document, pgdb.cluster.password)
    return "orders"


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)
def test_a_refused_child_is_a_condition_an_event_and_degraded_in_one_reconcile(kube, api, ingestion):
    # 403: the chart without update on postgresingestions/finalizers, on OpenShift.
    with RecordingProxy(kube.url, owner_references_enforcement(_chart_grants(with_finalizers=False))) as proxy:
        resource, events = _reconcile_through(api, proxy.url, ingestion)
    assert operator_env.deployments(api) == {} and operator_env.spark_applications(api) == {}
    streaming = operator_env.required_condition(resource, "Streaming")
    snapshot = operator_env.required_condition(resource, "SnapshotComplete")
    for condition, kind, name in ((streaming, "Deployment", "orders-reader"),
                                  (snapshot, "SparkApplication", "orders-snapshot-")):
        assert (condition["status"], condition["reason"]) == ("False", CHILD_REJECTED)
        assert f"the API server refused {kind} {name}" in condition["message"]
        assert "(403): " in condition["message"] and "cannot set blockOwnerDeletion" in condition["message"]
    degraded = operator_env.required_condition(resource, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", CHILD_REJECTED)
    assert "state" not in resource["status"]["snapshot"] and resource["status"]["phase"] == "Pending"
    assert {(e.type, e.reason) for e in events} >= {("Warning", CHILD_REJECTED)}
    assert any("cannot set blockOwnerDeletion" in e.message for e in events)
    health = chart.argocd_health(resource)
    assert health["status"] == "Degraded" and "blockOwnerDeletion" in health["message"]

    # 422 from spark-operator's webhook; the chart's RBAC as it is now: the reader is created.
    admit_owner = owner_references_enforcement(_chart_grants(with_finalizers=True))

    def admit(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]] | None:
        return admit_owner(method, path, body) or _quota_webhook(method, path, body)

    with RecordingProxy(kube.url, admit) as proxy:
        resource, events = _reconcile_through(api, proxy.url, ingestion)
    assert set(operator_env.deployments(api)) == {"orders-reader"} and operator_env.spark_applications(api) == {}
    snapshot = operator_env.required_condition(resource, "SnapshotComplete")
    assert (snapshot["reason"], snapshot["status"]) == (CHILD_REJECTED, "False")
    assert "(422): " + QUOTA_DENIAL in snapshot["message"]
    assert operator_env.required_condition(resource, "Streaming")["reason"] == "ReaderNotReady"  # waiting
    assert chart.argocd_health(resource) == {
        "status": "Degraded", "message": f"{CHILD_REJECTED}: SnapshotComplete: {snapshot['message']}"}

    # Nothing refuses any more: the snapshot is submitted and Argo CD waits again.
    with RecordingProxy(kube.url) as proxy:
        resource, events = _reconcile_through(api, proxy.url, ingestion)
    assert len(operator_env.spark_applications(api)) == 1
    assert operator_env.required_condition(resource, "Degraded")["status"] == "False"
    assert chart.argocd_health(resource)["status"] == "Progressing"


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)
def test_a_crash_looping_reader_is_degraded_not_waiting(kube, api, ingestion):
    resource, _ = _reconcile_through(api, kube.url, ingestion)
    assert operator_env.required_condition(resource, "Streaming")["reason"] == "ReaderNotReady"
    assert chart.argocd_health(resource)["status"] == "Progressing"
    core = kubernetes.client.CoreV1Api(api)
    labels = operator_env.deployments(api)["orders-reader"]["spec"]["template"]["metadata"]["labels"]
    # The client's types ask for a V1Pod; it sends a dict body as is.
    core.create_namespaced_pod(operator_env.NAMESPACE, {  # type: ignore[arg-type]
        "metadata": {"name": "orders-reader-7f9-abcde", "labels": labels},
        "spec": {"containers": [{"name": "reader", "image": "registry.example/lakeslot:typo"}]}})
    core.patch_namespaced_pod_status("orders-reader-7f9-abcde", operator_env.NAMESPACE, {"status": {
        "phase": "Pending", "containerStatuses": [{
            "name": "reader", "ready": False, "restartCount": 0, "image": "registry.example/lakeslot:typo",
            "imageID": "", "state": {"waiting": {"reason": "ImagePullBackOff",
                                                 "message": "Back-off pulling image"}}}]}})
    resource, _ = _reconcile_through(api, kube.url, ingestion)
    streaming = operator_env.required_condition(resource, "Streaming")
    assert (streaming["reason"], streaming["message"]) == (
        READER_FAILING, "reader pod orders-reader-7f9-abcde is ImagePullBackOff: Back-off pulling image")
    assert operator_env.required_condition(resource, "Degraded")["reason"] == READER_FAILING
    assert chart.argocd_health(resource)["status"] == "Degraded"


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)
def test_a_refused_verification_job_is_reported_and_tried_again(kube, api, ingestion):
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *operator_env.CUSTOM, ingestion, {"metadata": {"annotations": {VERIFY: "20250101T000000Z"}}})
    quota = ('jobs.batch "orders-verify" is forbidden: exceeded quota: compute, requested: '
             "count/jobs.batch=1, used: count/jobs.batch=10, limited: count/jobs.batch=10")

    def admit(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]] | None:
        return (403, status_body(403, "Forbidden", quota)) if method == "POST" and path.endswith("/jobs") else None

    with RecordingProxy(kube.url, admit) as proxy:
        resource, _ = _reconcile_through(api, proxy.url, ingestion)
    verified = operator_env.required_condition(resource, "Verified")
    assert (verified["status"], verified["reason"]) == ("False", CHILD_REJECTED)
    assert "(403): " + quota in verified["message"]
    assert resource["status"]["verification"]["state"] == "Verifying"
    assert operator_env.required_condition(resource, "Degraded")["reason"] == CHILD_REJECTED
    assert kubernetes.client.BatchV1Api(api).list_namespaced_job(operator_env.NAMESPACE).items == []

    resource, _ = _reconcile_through(api, kube.url, ingestion)  # the quota freed: created now
    (job,) = kubernetes.client.BatchV1Api(api).list_namespaced_job(operator_env.NAMESPACE).items
    assert job.metadata is not None and job.metadata.name == resource["status"]["verification"]["job"]
    assert operator_env.required_condition(resource, "Verified")["status"] == "Unknown"


def test_a_child_a_concurrent_reconcile_created_first_is_not_an_error(api):
    """The timer's reconcile and a change handler's may both read "absent" and both create: the
    second create is answered 409 AlreadyExists, which is no failure (same name, same spec)."""
    ingestion = PostgresIngestion.model_validate(apply_edits(base_document(), ()))
    app = children.apply_application(ingestion, "uid", children.OperatorConfig(), ["--x"])

    class ReadBeforeTheOtherCreated(Kube):
        def get_spark_application(self, namespace: str, name: str) -> dict | None:
            return None

    assert Kube(api).ensure(app) is True
    assert ReadBeforeTheOtherCreated(api).ensure(app) is False
    assert list(operator_env.spark_applications(api)) == [app["metadata"]["name"]]


def test_a_replace_that_loses_a_race_with_a_status_write_is_retried_at_once(api):
    """The spark-operator writes an application's status between the operator's read and its
    replace: the replace is a 409 Conflict (stale resourceVersion), and ensure reads again and
    writes, instead of leaving the change to kopf's retry a minute later."""
    ingestion = PostgresIngestion.model_validate(apply_edits(base_document(), ()))
    app = children.apply_application(ingestion, "uid", children.OperatorConfig(), ["--x"])
    assert Kube(api).ensure(app) is True
    changed = children.apply_application(ingestion, "uid", children.OperatorConfig(), ["--y"])
    raced: list[str] = []

    class StatusWrittenAfterTheRead(Kube):
        def get_spark_application(self, namespace: str, name: str) -> dict | None:
            live = super().get_spark_application(namespace, name)
            if not raced:
                raced.append(name)
                operator_env.set_spark_state(api, name, "RUNNING")  # the spark-operator's write
            return live

    assert StatusWrittenAfterTheRead(api).ensure(changed) is True
    assert raced == [app["metadata"]["name"]]
    live = operator_env.spark_applications(api)[app["metadata"]["name"]]
    assert live["spec"]["arguments"] == changed["spec"]["arguments"]
    assert live["status"]["applicationState"]["state"] == "RUNNING"


# The pure decisions ----------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "refused"), [
    (400, True), (403, True), (404, True), (422, True), (409, False), (429, False), (500, False), (503, False)])
def test_which_api_errors_are_refusals_for_good(status, refused):
    assert child_health.is_rejection(ApiException(status=status)) is refused


def _pod(reason: str | None) -> dict:
    state = {"waiting": {"reason": reason}} if reason else {"running": {}}
    return {"metadata": {"name": "r-1"}, "status": {"containerStatuses": [{"state": state}]}}


@pytest.mark.parametrize(("deployment", "pods", "reason"), [
    ({"status": {"availableReplicas": 1}}, [_pod("CrashLoopBackOff")], None),  # one available: fine
    ({"status": {}}, [_pod("CrashLoopBackOff")], READER_FAILING),
    ({"status": {}}, [_pod("ErrImagePull")], READER_FAILING),
    ({"status": {}}, [_pod("CreateContainerConfigError")], READER_FAILING),
    ({"status": {}}, [_pod("ContainerCreating")], "ReaderNotReady"),
    ({"status": {"conditions": [{"type": "Progressing", "status": "False",
                                 "reason": "ProgressDeadlineExceeded"}]}}, [], READER_FAILING),
    ({"status": {}}, [], "ReaderNotReady"),
    (None, [], "ReaderNotReady"),
])
def test_reader_states(deployment, pods, reason):
    problem = child_health.reader_problem(deployment, pods)
    assert (problem.reason if problem else None) == reason


@pytest.mark.parametrize(("state", "reason"), [
    ("RUNNING", None), ("SUBMITTED", "ApplyNotRunning"), ("PENDING_RERUN", "ApplyNotRunning"),
    ("FAILING", "ApplyNotRunning"), ("FAILED", "ApplyFailed"), ("SUBMISSION_FAILED", "ApplyFailed")])
def test_apply_states(state, reason):
    problem = child_health.apply_problem({"status": {"applicationState": {"state": state, "errorMessage": "x"}}})
    assert (problem.reason if problem else None) == reason
    assert child_health.apply_problem(None) == child_health.Problem("ApplyNotRunning",
                                                                    "the apply SparkApplication is absent")
