"""What operator tests need around the real operator code: the CRDs on the emulator, ingestions
pointing at a real test database, and **simulations of the controllers that cannot run here**.

Simulated, because nothing on this machine can run them (each test says when it uses them):

- the spark-operator: :func:`set_spark_state` writes ``status.applicationState`` of a
  SparkApplication as the spark-operator would;
- the Deployment/ReplicaSet controllers and the kubelet: :func:`reader_pod_running` creates the
  reader Pod the Deployment would get and marks the Deployment available;
- the snapshot job's Iceberg commits: :func:`commit_snapshot` writes each mirror table with the
  summary property ``lakeslot.lsn`` through real Spark + Iceberg, as the job's final commit does.

Everything else — PostgreSQL, the API server (emulated), kopf, the official client — is real.
"""

from __future__ import annotations

import argparse
import base64
import sys
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import kubernetes.client
import pytest
import yaml
from kubernetes.client import ApiException

from lakeslot import workloads
from lakeslot.api.models import GROUP, PLURAL, VERSION, SinkSpec
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.api.validation import parse_resource
from lakeslot.local import config
from lakeslot_operator import children

NAMESPACE = "default"
SPARK_GROUP, SPARK_VERSION, SPARK_PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
SPARK_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{SPARK_PLURAL}.{SPARK_GROUP}"},
    "spec": {
        "group": SPARK_GROUP, "scope": "Namespaced",
        "names": {"plural": SPARK_PLURAL, "singular": "sparkapplication", "kind": "SparkApplication"},
        "versions": [{"name": SPARK_VERSION, "served": True, "storage": True,
                      "subresources": {"status": {}},
                      "schema": {"openAPIV3Schema": {"type": "object",
                                                     "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}


def install_crds(api_client: kubernetes.client.ApiClient) -> None:
    extensions = kubernetes.client.ApiextensionsV1Api(api_client)
    with open("crds/postgresingestions.lakeslot.io.yaml") as f:
        extensions.create_custom_resource_definition(yaml.safe_load(f))
    # The client's types ask for a V1CustomResourceDefinition; it sends a dict body as is.
    extensions.create_custom_resource_definition(SPARK_CRD)  # type: ignore[arg-type]


def create_secret(api_client, name: str, values: dict[str, str], namespace: str = NAMESPACE) -> None:
    # The client's types ask for a V1Secret; it sends a dict body as is.
    kubernetes.client.CoreV1Api(api_client).create_namespaced_secret(namespace, {  # type: ignore[arg-type]
        "metadata": {"name": name},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}})


class _Cluster(NamedTuple):
    port: int
    superuser: str


class OfflineDatabase(NamedTuple):
    """Stands in for a test Database in documents that never connect (argument contracts)."""

    name: str = "app"
    cluster: _Cluster = _Cluster(6543, "lakeslot")


# The custom-objects API's (group, version, namespace, plural) for our resources in NAMESPACE.
CUSTOM = (GROUP, VERSION, NAMESPACE, PLURAL)


@pytest.fixture
def api(kube):
    """An API client on the emulator with the PostgresIngestion and SparkApplication CRDs."""
    with kube.api_client() as api_client:
        install_crds(api_client)
        yield api_client


def ingestion_document(name: str, db, tables: list[TableName], *, warehouse: str, staging: str,
                       **spec: object) -> dict:
    """A PostgresIngestion for ``db`` (a ``tests.support.fixtures_pg.Database``), its password
    in the Secret ``<name>-pg``, Iceberg in a hadoop catalog on ``warehouse``."""
    document: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PostgresIngestion",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "source": {"host": "127.0.0.1", "port": db.cluster.port, "database": db.name,
                       "user": db.cluster.superuser,
                       "passwordSecretRef": {"name": f"{name}-pg", "key": "password"},
                       "tables": [{"schema": t.schema, "name": t.name} for t in tables]},
            "sink": {"catalog": {"type": "hadoop", "warehouse": warehouse},
                     "namespace": f"it_{uuid.uuid4().hex[:8]}"},
            "staging": {"uri": staging},
        },
    }
    for key, value in spec.items():
        document["spec"][key] = value
    return document


def operator_and_local(name: str, db, tables: list[TableName], tmp_path: Path, *,
                       warehouse: Path) -> tuple[dict, config.Local]:
    """An ingestion for the operator whose work ``lakeslot run`` does in this process (pods cannot
    run here): its document (Iceberg in ``warehouse``, the tests' Spark warehouse; a quick apply
    trigger) and the local mode's configuration of the same file."""
    document = ingestion_document(name, db, tables, warehouse=warehouse.as_uri(),
                                  staging=(tmp_path / "staging").as_uri(),
                                  snapshot={"parallelism": 2, "targetRangeBytes": 1 << 20},
                                  apply={"triggerIntervalSeconds": 1})
    path = tmp_path / "ingestion.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    return document, config.load(str(path), state_dir=str(tmp_path / "state"),
                                 environ={workloads.PASSWORD_ENV: db.cluster.password})


def create_ingestion(api_client, document: dict, password: str) -> dict:
    """The ingestion and the Secret holding its source password."""
    create_secret(api_client, f"{document['metadata']['name']}-pg", {"password": password})
    created = kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, document)
    assert isinstance(created, dict), created
    return created


def get_ingestion(api_client, name: str, namespace: str = NAMESPACE) -> dict | None:
    try:
        resource = kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    assert isinstance(resource, dict), resource
    return resource


def spark_applications(api_client, namespace: str = NAMESPACE) -> dict[str, dict]:
    listing = kubernetes.client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        SPARK_GROUP, SPARK_VERSION, namespace, SPARK_PLURAL)
    assert isinstance(listing, dict), listing
    return {app["metadata"]["name"]: app for app in listing["items"]}


def deployments(api_client, namespace: str = NAMESPACE) -> dict[str, dict]:
    result = {}
    for d in kubernetes.client.AppsV1Api(api_client).list_namespaced_deployment(namespace).items:
        assert d.metadata is not None and d.metadata.name is not None, d
        result[d.metadata.name] = api_client.sanitize_for_serialization(d)
    return result


def set_spark_state(api_client, name: str, state: str, error: str = "", namespace: str = NAMESPACE) -> None:
    """Simulated spark-operator: report the application's state."""
    kubernetes.client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
        SPARK_GROUP, SPARK_VERSION, namespace, SPARK_PLURAL, name,
        {"status": {"applicationState": {"state": state, "errorMessage": error}}})


def reader_pod_running(api_client, ingestion_name: str, pod_name: str, namespace: str = NAMESPACE) -> None:
    """Simulated Deployment controller + kubelet: the reader Pod exists and runs, the
    Deployment reports an available replica."""
    core = kubernetes.client.CoreV1Api(api_client)
    apps = kubernetes.client.AppsV1Api(api_client)
    deployment = apps.read_namespaced_deployment(f"{ingestion_name}-reader", namespace)
    assert deployment.spec is not None, deployment
    template = deployment.spec.template
    assert template.metadata is not None and template.spec is not None, template
    # The client's types ask for a V1Pod; it sends a dict body as is.
    core.create_namespaced_pod(namespace, {  # type: ignore[arg-type]
        "metadata": {"name": pod_name, "labels": template.metadata.labels},
        "spec": {"containers": [{"name": "reader", "image": template.spec.containers[0].image}]}})
    core.patch_namespaced_pod_status(pod_name, namespace, {"status": {"phase": "Running"}})
    apps.patch_namespaced_deployment_status(f"{ingestion_name}-reader", namespace, {
        "status": {"replicas": 1, "availableReplicas": 1, "readyReplicas": 1}})


def container_environment(api_client, container: dict, *, home: Path, pod: str = "") -> dict[str, str]:
    """Simulated kubelet: the environment of ``container`` — its literal values, Secret references
    resolved from the emulator's Secrets, ``metadata.name`` field references as ``pod`` — plus
    ``PATH`` (lakeslot's scripts) and ``HOME``; nothing of the test's own environment."""
    core = kubernetes.client.CoreV1Api(api_client)
    environ = {"PATH": str(Path(sys.executable).parent), "HOME": str(home)}
    for variable in container.get("env", []):
        source = variable.get("valueFrom", {})
        if "value" in variable:
            environ[variable["name"]] = variable["value"]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            data = core.read_namespaced_secret(ref["name"], NAMESPACE).data or {}
            environ[variable["name"]] = base64.b64decode(data[ref["key"]]).decode()
        else:
            assert source["fieldRef"]["fieldPath"] == "metadata.name", variable
            environ[variable["name"]] = pod
    return environ


def commit_snapshot(spark, document: dict, tables: list[TableName], lsn: int) -> None:
    """Simulated snapshot job commit: each mirror table gets one row and lakeslot.lsn = lsn."""
    sink = SinkSpec.model_validate(document["spec"]["sink"])
    names = IngestionNames.of(parse_resource(document))
    for table in tables:
        name = "lakeslot." + ".".join(names.mirror_identifier(table))
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lakeslot.{sink.namespace}")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {name} (id bigint, _lakeslot_lsn bigint) USING iceberg")
        spark.createDataFrame([(1, lsn)], "id bigint, _lakeslot_lsn bigint").writeTo(name).option(
            "snapshot-property.lakeslot.lsn", str(lsn)).overwritePartitions()


def job_arguments(application: dict) -> argparse.Namespace:
    """A SparkApplication's arguments, parsed by the parser of the very job its
    mainApplicationFile names (a flag the job does not know fails the test)."""
    from spark_jobs import apply, snapshot

    parsers = {"snapshot.py": snapshot.build_parser, "apply.py": apply.build_parser}
    main_file = application["spec"]["mainApplicationFile"]
    assert main_file.startswith("local:///opt/lakeslot/spark_jobs/"), main_file
    return parsers[main_file.rsplit("/", 1)[1]]().parse_args(application["spec"]["arguments"])


def input_document(api_client, child: dict) -> str:
    """The job document of ``child`` (a SparkApplication or a Job): its input ConfigMap's, which
    must be owned by the child and be the document its arguments name (``--input-sha256``)."""
    metadata = child["metadata"]
    config_map = api_client.sanitize_for_serialization(kubernetes.client.CoreV1Api(
        api_client).read_namespaced_config_map(children.input_name(metadata["name"]), metadata["namespace"]))
    owners = config_map["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"]) for o in owners] == [(child["kind"], metadata["name"])], owners
    document = config_map["data"][workloads.JOB_INPUT_KEY]
    arguments = (child["spec"]["arguments"] if child["kind"] == "SparkApplication"
                 else child["spec"]["template"]["spec"]["containers"][0]["command"])
    assert arguments[arguments.index("--input-sha256") + 1] == workloads.digest(document)
    return document


def job_input(api_client, application: dict) -> workloads.JobInput:
    """What a SparkApplication asks its job to do (its arguments parse, its document read)."""
    job_arguments(application)
    return workloads.parse_input(input_document(api_client, application))


def mounted(api_client, child: dict, arguments: list[str], directory: Path) -> list[str]:
    """``arguments`` (the child's) with its input ConfigMap "mounted" in ``directory``: the kubelet
    that would mount it does not run here, so the document is written there and ``--input``
    names it."""
    path = directory / workloads.JOB_INPUT_KEY
    path.write_text(input_document(api_client, child))
    at = arguments.index("--input") + 1
    assert arguments[at] == workloads.JOB_INPUT_FILE
    return [*arguments[:at], str(path), *arguments[at + 1:]]


def condition(resource: dict, type_: str) -> dict | None:
    for c in (resource.get("status") or {}).get("conditions", []):
        if c["type"] == type_:
            return c
    return None


def required_condition(resource: dict, type_: str) -> dict:
    """The condition ``type_`` of ``resource``; fails the test when its status has none."""
    found = condition(resource, type_)
    assert found is not None, f"no {type_} condition in {resource.get('status')}"
    return found

