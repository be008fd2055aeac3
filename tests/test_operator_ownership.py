"""The operator changes and deletes only its own objects, and writes no Secret.

On the emulator (the official client, the operator's :class:`~lakeslot_operator.kube.Kube`, the real
reconcile with PostgreSQL 18 where a step needs the source): an object that has a child's name
— or its input ConfigMap's — but is not lakeslot's (no lakeslot labels and owner reference) is left
exactly as it was: every write of it is refused as ``NameTaken`` with a message naming both, a
delete or scale of it does nothing. lakeslot's own objects, even from an earlier incarnation of
the child or the ingestion under the same name, are taken over. The user's Secrets are never
written (the operator has no right to: tests/test_rbac.py).

Simulated (cannot run here): nothing; no controller acts on these objects in these tests.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes.client
import pytest

from lakeslot import workloads
from lakeslot.api.annotations import VERIFY
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.api.validation import parse_resource
from lakeslot.observability.status_report import NAME_TAKEN
from lakeslot_operator import children
from lakeslot_operator.kube import Kube, NameTaken
from lakeslot_operator.reconcile import Context, reconcile
from tests.support import chart, operator_env

CONFIG = children.OperatorConfig()
THEIRS = {"app": "theirs"}
JOB_DOCUMENT = '{"ingestion": {}, "tables": []}'


def _created(api, document: dict) -> tuple[PostgresIngestion, str]:
    """The ingestion ``document`` stored on the emulator (offline: never connects): the model and
    its uid."""
    created = operator_env.create_ingestion(api, document, "unused")
    return parse_resource({k: v for k, v in created.items() if k != "status"}), created["metadata"]["uid"]


@pytest.fixture
def offline(api) -> tuple[PostgresIngestion, str]:
    document = operator_env.ingestion_document("orders", operator_env.OfflineDatabase(),
                                               [TableName("public", "orders")],
                                               warehouse="file:///tmp/w", staging="file:///tmp/s")
    return _created(api, document)


def _user_object(kind: str, name: str, **labels: str) -> dict[str, Any]:
    """A user's object of ``kind`` named ``name`` (no owner reference)."""
    metadata = {"name": name, "namespace": operator_env.NAMESPACE, "labels": {**THEIRS, **labels}}
    containers = [{"name": "c", "image": "theirs:1"}]
    pod = {"metadata": {"labels": THEIRS}, "spec": {"restartPolicy": "Never", "containers": containers}}
    return {
        "ConfigMap": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"theirs": "1"}},
        "Secret": {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque",
                   "stringData": {"theirs": "1"}},
        "Deployment": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": {
            "replicas": 2, "selector": {"matchLabels": THEIRS},
            "template": {**pod, "spec": {"containers": containers}}}},
        "Job": {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": {"template": pod}},
        "SparkApplication": {"apiVersion": children.SPARK_API_VERSION, "kind": "SparkApplication",
                             "metadata": metadata, "spec": {"type": "Python", "theirs": True}},
    }[kind]


def _create(api, obj: dict) -> dict:
    core, apps = kubernetes.client.CoreV1Api(api), kubernetes.client.AppsV1Api(api)
    batch, custom = kubernetes.client.BatchV1Api(api), kubernetes.client.CustomObjectsApi(api)
    # The client's types ask for its models; it sends a dict body as is.
    create = {"ConfigMap": lambda: core.create_namespaced_config_map(operator_env.NAMESPACE, obj),  # type: ignore[arg-type]
              "Secret": lambda: core.create_namespaced_secret(operator_env.NAMESPACE, obj),  # type: ignore[arg-type]
              "Deployment": lambda: apps.create_namespaced_deployment(operator_env.NAMESPACE, obj),  # type: ignore[arg-type]
              "Job": lambda: batch.create_namespaced_job(operator_env.NAMESPACE, obj),  # type: ignore[arg-type]
              "SparkApplication": lambda: custom.create_namespaced_custom_object(
                  operator_env.SPARK_GROUP, operator_env.SPARK_VERSION, operator_env.NAMESPACE,
                  operator_env.SPARK_PLURAL, obj)}[obj["kind"]]
    create()
    return _read(api, obj["kind"], obj["metadata"]["name"])


def _read(api, kind: str, name: str) -> dict:
    core, apps = kubernetes.client.CoreV1Api(api), kubernetes.client.AppsV1Api(api)
    batch, custom = kubernetes.client.BatchV1Api(api), kubernetes.client.CustomObjectsApi(api)
    try:
        read = {"ConfigMap": lambda: core.read_namespaced_config_map(name, operator_env.NAMESPACE),
                "Secret": lambda: core.read_namespaced_secret(name, operator_env.NAMESPACE),
                "Deployment": lambda: apps.read_namespaced_deployment(name, operator_env.NAMESPACE),
                "Job": lambda: batch.read_namespaced_job(name, operator_env.NAMESPACE),
                "SparkApplication": lambda: custom.get_namespaced_custom_object(
                    operator_env.SPARK_GROUP, operator_env.SPARK_VERSION, operator_env.NAMESPACE,
                    operator_env.SPARK_PLURAL, name)}[kind]()
    except kubernetes.client.ApiException as e:
        if e.status != 404:
            raise
        return {}
    return api.sanitize_for_serialization(read)


def _children(ingestion: PostgresIngestion, uid: str) -> dict[str, dict]:
    invocation = workloads.apply_invocation(ingestion, [])
    return {"Deployment": children.reader_deployment(ingestion, uid, CONFIG, ["lakeslot"], replicas=1),
            "SparkApplication": children.apply_application(ingestion, uid, CONFIG, invocation.arguments()),
            "Job": children.verify_job(ingestion, uid, CONFIG, ["lakeslot"], token="t1")}


def _wanted(api, offline: tuple[PostgresIngestion, str], kind: str) -> tuple[Kube, dict, str]:
    """The operator's Kube, its desired child of ``kind`` and that child's name."""
    wanted = _children(*offline)[kind]
    return Kube(api), wanted, wanted["metadata"]["name"]


@pytest.mark.parametrize("kind", ["Deployment", "SparkApplication", "Job"])
def test_a_users_object_of_a_childs_name_is_refused_and_left_untouched(api, offline, kind):
    kube, wanted, name = _wanted(api, offline, kind)
    # lakeslot's labels alone do not make an object lakeslot's: the owner reference is missing
    theirs = _create(api, _user_object(kind, name, **{children.INGESTION_LABEL: "orders",
                                                      children.MANAGED_BY_LABEL: children.MANAGED_BY}))
    with pytest.raises(NameTaken) as raised:
        kube.create_job(wanted) if kind == "Job" else kube.ensure(wanted)
    message = str(raised.value)
    assert f"{kind} default/{name} exists and is not lakeslot's" in message
    assert "PostgresIngestion orders" in message and "rename or delete" in message
    delete = {"Deployment": lambda: kube.scale_deployment(operator_env.NAMESPACE, name, 0, ingestion="orders"),
              "SparkApplication": lambda: kube.delete_spark_application(operator_env.NAMESPACE, name,
                                                                        ingestion="orders"),
              "Job": lambda: kube.delete_job(operator_env.NAMESPACE, name, ingestion="orders")}[kind]
    delete()
    kube.delete_children(operator_env.NAMESPACE, {children.INGESTION_LABEL: "orders"})
    assert _read(api, kind, name) == theirs  # not a field changed, not a new resourceVersion


@pytest.mark.parametrize("kind", ["Deployment", "SparkApplication", "Job"])
def test_lakeslots_own_children_are_changed_and_deleted(api, offline, kind):
    kube, wanted, name = _wanted(api, offline, kind)
    if kind == "Job":
        kube.create_job(wanted)
        kube.create_job(wanted)  # exists, lakeslot's: nothing to do
        kube.delete_job(operator_env.NAMESPACE, name, ingestion="orders")
    elif kind == "Deployment":
        assert kube.ensure(wanted)
        kube.scale_deployment(operator_env.NAMESPACE, name, 0, ingestion="orders")
        assert _read(api, kind, name)["spec"]["replicas"] == 0
        assert kube.ensure(wanted) and _read(api, kind, name)["spec"]["replicas"] == 1
        kube.delete_children(operator_env.NAMESPACE, {children.INGESTION_LABEL: "orders"})
    else:
        assert kube.ensure(wanted)
        changed = copy.deepcopy(wanted)
        changed["spec"]["arguments"] = ["--other"]
        assert kube.ensure(changed) and _read(api, kind, name)["spec"]["arguments"] == ["--other"]
        kube.delete_spark_application(operator_env.NAMESPACE, name, ingestion="orders")
    assert _read(api, kind, name) == {}


def test_a_childs_input_config_map_is_written_only_when_it_is_lakeslots(api, offline):
    ingestion, uid = offline
    kube = Kube(api)
    app = _children(ingestion, uid)["SparkApplication"]
    kube.ensure(app)
    input_name = children.input_name(app["metadata"]["name"])
    theirs = _create(api, _user_object("ConfigMap", input_name))
    with pytest.raises(NameTaken) as raised:
        kube.ensure_job_input(app, JOB_DOCUMENT)
    assert f"ConfigMap default/{input_name} exists and is not lakeslot's" in str(raised.value)
    assert "the job input of SparkApplication orders-apply" in str(raised.value)
    assert _read(api, "ConfigMap", input_name) == theirs

    kubernetes.client.CoreV1Api(api).delete_namespaced_config_map(input_name, operator_env.NAMESPACE)
    kube.ensure_job_input(app, JOB_DOCUMENT)
    ours = _read(api, "ConfigMap", input_name)
    assert ours["data"] == {workloads.JOB_INPUT_KEY: JOB_DOCUMENT}
    live_app = _read(api, "SparkApplication", app["metadata"]["name"])
    assert [o["uid"] for o in ours["metadata"]["ownerReferences"]] == [live_app["metadata"]["uid"]]
    # the child re-created under its name: its predecessor's input is lakeslot's, taken over
    kube.delete_spark_application(operator_env.NAMESPACE, app["metadata"]["name"], ingestion="orders")
    assert _read(api, "ConfigMap", input_name) == {}  # (deleted with its owner)
    _create(api, {**ours, "metadata": {k: v for k, v in ours["metadata"].items()
                                       if k in ("name", "namespace", "labels", "ownerReferences")}})
    kube.ensure(app)
    kube.ensure_job_input(app, JOB_DOCUMENT + " ")
    taken_over = _read(api, "ConfigMap", input_name)
    new_uid = _read(api, "SparkApplication", app["metadata"]["name"])["metadata"]["uid"]
    assert taken_over["data"] == {workloads.JOB_INPUT_KEY: JOB_DOCUMENT + " "}
    assert [o["uid"] for o in taken_over["metadata"]["ownerReferences"]] == [new_uid]


def test_a_re_created_ingestion_takes_its_predecessors_children_over(api, offline):
    ingestion, uid = offline
    kube = Kube(api)
    reader = _children(ingestion, uid)["Deployment"]
    kube.ensure(reader)
    successor = _children(ingestion, "a-new-uid")["Deployment"]  # same name, another uid
    assert kube.ensure(successor)
    owners = _read(api, "Deployment", reader["metadata"]["name"])["metadata"]["ownerReferences"]
    assert [o["uid"] for o in owners] == ["a-new-uid"]


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)
def test_the_reconcile_reports_a_taken_name_and_leaves_the_users_objects_alone(api, pgdb, tmp_path):
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")
    document = operator_env.ingestion_document("orders", pgdb, [TableName("public", "orders")],
                                               warehouse=(tmp_path / "warehouse").as_uri(),
                                               staging=(tmp_path / "staging").as_uri())
    document["metadata"]["annotations"] = {VERIFY: "20250101T000000Z"}
    operator_env.create_ingestion(api, document, pgdb.cluster.password)
    ingestion = PostgresIngestion.model_validate(document)
    users = [_create(api, _user_object("Deployment", children.reader_name(ingestion))),
             _create(api, _user_object("Job", children.verify_name(ingestion, "20250101T000000Z"))),
             _create(api, _user_object("SparkApplication", children.apply_name(ingestion))),
             # a Secret of a name lakeslot once used for a job's input: lakeslot writes no Secret
             _create(api, _user_object("Secret", children.input_name(children.apply_name(ingestion))))]

    def reconciled() -> dict:
        outcome = reconcile(operator_env.get_ingestion(api, "orders") or {}, Context(kube=Kube(api)))
        kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            *operator_env.CUSTOM, "orders", {"status": outcome.status})
        resource = operator_env.get_ingestion(api, "orders")
        assert resource is not None
        return resource

    resource = reconciled()
    streaming = operator_env.required_condition(resource, "Streaming")
    verified = operator_env.required_condition(resource, "Verified")
    for condition, kind, name in ((streaming, "Deployment", "orders-reader"),
                                  (verified, "Job", children.verify_name(ingestion, "20250101T000000Z"))):
        assert (condition["status"], condition["reason"]) == ("False", NAME_TAKEN)
        assert f"{kind} default/{name} exists and is not lakeslot's" in condition["message"]
        assert "PostgresIngestion orders" in condition["message"]
    degraded = operator_env.required_condition(resource, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", NAME_TAKEN)
    assert chart.argocd_health(resource)["status"] == "Degraded"
    assert len(operator_env.spark_applications(api)) == 2  # the others go on: the snapshot was submitted
    snapshot = next(a for n, a in operator_env.spark_applications(api).items() if n != children.apply_name(ingestion))
    assert operator_env.job_input(api, snapshot).ingestion.metadata.name == "orders"

    # suspended: the reader is scaled to 0 and the apply job deleted — lakeslot's, not these
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *operator_env.CUSTOM, "orders", {"spec": {"suspend": True}})
    assert reconciled()["status"]["phase"] == "Suspended"
    assert [_read(api, u["kind"], u["metadata"]["name"]) for u in users] == users
