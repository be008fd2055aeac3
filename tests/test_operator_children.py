"""The operator's child objects, built by pure functions: shape, ownership, secrets, names.
Core kinds are validated against Kubernetes' own OpenAPI schemas (kubernetes-validate)."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml

from lakeslot.api import cluster
from lakeslot.api.models import PostgresIngestion
from lakeslot_operator import children
from tests.api_cases import base_document

UID = "0f1e2d3c-0000-4000-8000-000000000001"
CONFIG = children.OperatorConfig(image="registry.example/lakeslot:test")


@pytest.fixture
def ingestion() -> PostgresIngestion:
    with open("examples/ingestion.yaml") as f:
        document = yaml.safe_load(f)
    document["metadata"]["namespace"] = "shop"
    document["spec"]["source"]["sslMode"] = "verify-full"
    document["spec"]["source"]["caSecretRef"] = {"name": "shop-ca", "key": "ca.pem"}
    document["spec"]["secretEnv"] = [
        {"name": "AWS_ACCESS_KEY_ID", "secretKeyRef": {"name": "shop-s3", "key": "id"}}]
    document["spec"]["sink"]["catalog"]["secretProperties"] = {
        "s3.secret-access-key": {"name": "shop-s3", "key": "secret"},
        "credential": {"name": "shop-rest", "key": "credential"}}
    return PostgresIngestion.model_validate(document)


def _validate_core(obj: dict) -> None:
    kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def test_reader_is_a_singleton_recreated_with_secrets_by_reference(ingestion):
    deployment = children.reader_deployment(ingestion, UID, CONFIG, ["lakeslot", "reader"],
                                            replicas=1)
    _validate_core(deployment)
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    container = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e["valueFrom"] for e in container["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env[children.PASSWORD_ENV] == {"secretKeyRef": {"name": "shop-postgres", "key": "password"}}
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "shop-s3", "key": "id"}}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"name": "source-ca", "mountPath": children.CA_MOUNT, "readOnly": True} in container["volumeMounts"]
    assert deployment["metadata"]["ownerReferences"] == [{
        "apiVersion": "lakeslot.io/v1alpha1", "kind": "PostgresIngestion", "name": "orders",
        "uid": UID, "controller": True, "blockOwnerDeletion": True}]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert children.reader_deployment(ingestion, UID, CONFIG, ["x"], replicas=0)["spec"]["replicas"] == 0


def test_spark_applications_wire_secrets_through_spark_conf(ingestion):
    snapshot = children.snapshot_application(ingestion, UID, CONFIG, ["--flag"], generation="g0-abc")
    apply = children.apply_application(ingestion, UID, CONFIG, ["--flag"])
    for app in (snapshot, apply):
        spec = app["spec"]
        assert spec["restartPolicy"]["type"] == "OnFailure"
        assert spec["type"] == "Python" and spec["image"] == CONFIG.image
        conf = spec["sparkConf"]
        for role in ("driver", "executor"):
            assert conf[f"spark.kubernetes.{role}.secretKeyRef.{children.PASSWORD_ENV}"] == "shop-postgres:password"
            assert conf[f"spark.kubernetes.{role}.secrets.shop-ca"] == children.CA_MOUNT
            assert conf[f"spark.kubernetes.{role}.secretKeyRef.AWS_ACCESS_KEY_ID"] == "shop-s3:id"
            assert conf[f"spark.kubernetes.{role}.secretKeyRef.LAKESLOT_CATALOG_S3_SECRET_ACCESS_KEY"] \
                == "shop-s3:secret"
        assert conf["spark.sql.catalog.lakeslot"] == "org.apache.iceberg.spark.SparkCatalog"
        assert not any("secret-access-key" in key for key in conf)  # only by reference
        # Spark redacts the keys the job's driver sets them under, which its default pattern misses
        redacted = re.compile(conf["spark.redaction.regex"])
        assert redacted.search("spark.sql.catalog.lakeslot.credential")
        assert not redacted.search("spark.sql.catalog.lakeslot.uri")
    assert snapshot["metadata"]["name"] == "orders-snapshot-g0-abc"
    assert snapshot["spec"]["timeToLiveSeconds"] == children.SNAPSHOT_TTL_SECONDS
    assert "timeToLiveSeconds" not in apply["spec"]
    assert apply["metadata"]["name"] == "orders-apply"


def test_names_are_deterministic_and_valid_dns_labels(ingestion):
    long = ingestion.model_copy(deep=True)
    long.metadata.name = "a" * 60
    name = children.child_name(long, "snapshot-g12")
    assert len(name) <= 63 and name == children.child_name(long, "snapshot-g12")
    assert name != children.child_name(long, "snapshot-g13")


def test_no_child_contains_a_credential(ingestion):
    built = [children.reader_deployment(ingestion, UID, CONFIG, ["lakeslot", "reader"], replicas=1),
             children.snapshot_application(ingestion, UID, CONFIG, [], generation="g0"),
             children.apply_application(ingestion, UID, CONFIG, [])]
    for app in built[1:]:  # (the pattern of what Spark redacts names "password")
        del app["spec"]["sparkConf"]["spark.redaction.regex"]
    text = json.dumps(built)
    assert "password" not in text.replace("shop-postgres:password", "").replace('"key": "password"', "")


@pytest.mark.parametrize("length", [1, 20, 35, 36, cluster.INGESTION_NAME_MAX])
def test_every_name_the_operator_gives_is_one_validation_reserves(length):
    """A Secret reference may not name one of these (lakeslot.api.cluster.reserved_secret_names),
    whatever the ingestion's name length (long ones are cut with a hash)."""
    name = "o" * (length - 1) + "1" if length > 1 else "o"
    ingestion = PostgresIngestion.model_validate({**base_document(), "metadata": {"name": name}})
    names = [children.reader_name(ingestion), children.apply_name(ingestion),
             children.snapshot_name(ingestion, "g4294967295-0123abcd"),
             children.snapshot_name(ingestion, "g0-0123abcd"), children.verify_name(ingestion, "20250101T000000Z")]
    for child in [*names, *map(children.input_name, names[1:])]:
        assert cluster.is_reserved_name(child, name), child
