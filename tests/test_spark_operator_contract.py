"""Every child the operator builds meets what the cluster and spark-operator will check.

For the examples and edge-case specs (names at the length limit, every ``sslMode``, a CA under a
key other than ``ca.crt``, image pull secrets, a reader service account), in both of the operator's
Spark modes (``MODES``: security contexts for spark-operator's mutating webhook; and, for a
spark-operator ≥ 2.1 without it, pod templates as well):

- SparkApplications validate strictly (nothing pruned) against the schema of spark-operator v2,
  and against v1beta2-1.3.8's with nothing pruned but ``seccompProfile`` (webhook mode only: it
  has no pod template field, and the check shows it would prune one; its CRD predates
  ``seccompProfile``, so the Spark pods it makes are not ``restricted``, as the docs say)
  (tests/data/spark-operator/: excerpts transcribed from the upstream API types, each file naming
  its source; the full CRDs, 197k and 800k characters, were not copied, and no PyPI, npm or
  Debian package ships them), and the core types inside them (the security contexts, the pod
  templates) against Kubernetes' own schemas, for the oldest supported Kubernetes (1.29) and the
  newest the validator knows; and they round-trip unchanged through spark-operator 2.4's own API
  models (PyPI ``kubeflow-spark-api``, generated from its OpenAPI spec, corev1 types included);
- they pass the replay of spark-operator's published webhook rules (DNS-1035 names, denied
  sparkConf keys), and the replay itself refuses what it must;
- Spark's own secret-mount naming (``<secret>-volume``, one file per key at the mount path) puts a
  file exactly where ``LAKESLOT_SOURCE_CA_FILE`` in the driver and executor environment says the
  CA is, and the job's connection settings read it from there;
- the job document's ConfigMap is mounted in the driver, once, where the job reads it: by the
  webhook (``driver.configMaps``) in webhook mode, by the pod template alone in template mode, and
  still once when the webhook runs in template mode too; without either it is missing, and the
  check sees that;
- every pod spec (reader, verification Job, Spark driver and executors) meets the ``restricted``
  Pod Security Standard and carries the configured image pull secrets: the Spark pods as the
  webhook makes them in webhook mode, as Spark builds them on the templates alone in template
  mode (and the same with the webhook on as well: the two agree); webhook mode without the
  webhook is the failure the templates exist for, and the check sees it.

Not run here (and why): spark-operator itself and its webhook (a Go controller) and Spark's pod
building (pods need a cluster); the replay in tests/support/spark_operator.py stands in for the
parts lakeslot's output depends on.
"""

from __future__ import annotations

import copy
import dataclasses
import posixpath

import kubernetes_validate
import pydantic
import pytest
import yaml
from kubeflow_spark_api.models.spark_v1beta2_spark_application import (
    SparkV1beta2SparkApplication as SparkApplicationModel,
)

from lakeslot.api.cluster import INGESTION_NAME_MAX
from lakeslot.api.models import PostgresIngestion
from lakeslot.workloads import CA_FILE_ENV, JOB_INPUT_FILE, JOB_INPUT_KEY, JobInput
from lakeslot_operator import children
from tests.api_cases import EXAMPLES, apply_edits, base_document
from tests.support import spark_operator
from tests.support.pod_security import assert_restricted

KUBE_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CONFIG = children.OperatorConfig(image="registry.example/lakeslot:1", image_pull_secrets=("registry",),
                                 reader_service_account="lakeslot-reader")
# The operator's Spark modes: for spark-operator's webhook, and pod templates (no webhook, >= 2.1).
MODES = {"webhook": CONFIG, "pod-templates": dataclasses.replace(CONFIG, spark_pod_templates=True)}
# Which spark-operator schema each mode is for (v1beta2-1.3.8 has no pod template field).
# What each version's API server prunes from every application lakeslot builds (webhook mode):
# v1beta2-1.3.x's CRD predates seccompProfile (tests/data/spark-operator/, the header).
PRUNED = {"v2": [], "v1beta2-1.3.8": [
    "fields the API server would prune: [" + ", ".join(
        f"'.spec.{role}.{field}.seccompProfile'" for role in ("driver", "executor")
        for field in ("securityContext", "podSecurityContext")) + "]"]}
SCHEMA_MODES = [(version, mode) for version in sorted(spark_operator.SCHEMAS) for mode in sorted(MODES)
                if not (version.startswith("v1beta2-1.3") and mode == "pod-templates")]
CA_KEY = "ca.pem"  # the project's own fixture's key: not ca.crt
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _specs() -> dict[str, dict]:
    specs = {path.stem: yaml.safe_load(path.read_text()) for path in EXAMPLES}
    base = base_document()
    for mode in SSL_MODES:
        edits: list[tuple[str, object]] = [("spec.source.sslMode", mode)]
        if mode not in ("disable", "allow", "prefer"):
            edits.append(("spec.source.caSecretRef", {"name": "shop-ca", "key": CA_KEY}))
        specs[f"ssl-{mode}"] = apply_edits(base, tuple(edits))
    specs["longest-name"] = apply_edits(base, (("metadata.name", "o" * (INGESTION_NAME_MAX - 1) + "1"),
                                               ("spec.source.sslMode", "verify-full"),
                                               ("spec.source.caSecretRef", {"name": "c" * 56, "key": CA_KEY})))
    specs["longest-name-resnapshot"] = apply_edits(specs["longest-name"], (
        ("spec.snapshot.resnapshotGeneration", 123456789),))
    return specs


SPECS = _specs()


def _ingestion(name: str) -> PostgresIngestion:
    return PostgresIngestion.model_validate(SPECS[name])


JOB_DOCUMENT = '{"ingestion": {}, "tables": []}'  # (what Spark mounts is all that is checked)


def _applications(ingestion: PostgresIngestion, config: children.OperatorConfig = CONFIG) -> list[dict]:
    generation = f"g{ingestion.spec.snapshot.resnapshot_generation}-0123abcd"
    return [children.snapshot_application(ingestion, "uid", config, ["--x"], generation=generation),
            children.apply_application(ingestion, "uid", config, ["--x"])]


def _pod_specs(ingestion: PostgresIngestion, config: children.OperatorConfig = CONFIG, *,
               webhook: bool = True) -> dict[str, dict]:
    reader = children.reader_deployment(ingestion, "uid", CONFIG, ["lakeslot", "reader"], replicas=1)
    job = children.verify_job(ingestion, "uid", CONFIG, ["lakeslot", "verify"], token="20250101T000000Z")
    pods = {"reader": reader["spec"]["template"]["spec"], "verify": job["spec"]["template"]["spec"]}
    for app in _applications(ingestion, config):
        for role in ("driver", "executor"):
            view = spark_operator.pod_view(app, role, _secrets(ingestion), webhook=webhook,
                                           config_maps=_config_maps(ingestion))
            pods[f"{app['metadata']['labels'][children.COMPONENT_LABEL]}-{role}"] = view["pod"]
    return pods


def _secrets(ingestion: PostgresIngestion) -> dict[str, dict[str, str]]:
    """The Secrets Spark mounts: the CA's (when there is one)."""
    ref = ingestion.spec.source.ca_secret_ref
    return {} if ref is None else {ref.name: {ref.key: "-----BEGIN CERTIFICATE-----", "other": "x"}}


def _config_maps(ingestion: PostgresIngestion) -> dict[str, dict[str, str]]:
    """Every job's input ConfigMap, as the operator writes it."""
    return {children.input_name(app["metadata"]["name"]): {JOB_INPUT_KEY: JOB_DOCUMENT}
            for app in _applications(ingestion)}


@pytest.mark.parametrize(("mode", "webhook"), [("webhook", True), ("pod-templates", False),
                                               ("pod-templates", True)])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_job_document_is_where_the_driver_reads_it(name, mode, webhook):
    ingestion = _ingestion(name)
    for app in _applications(ingestion, MODES[mode]):
        driver = spark_operator.pod_view(app, "driver", _secrets(ingestion), webhook=webhook,
                                         config_maps=_config_maps(ingestion))
        assert driver["files"][JOB_INPUT_FILE] == JOB_DOCUMENT
        assert driver["mounts"].count(posixpath.dirname(JOB_INPUT_FILE)) == 1  # (twice: refused)
        assert len(set(driver["volumes"])) == len(driver["volumes"])
        assert all(spark_operator.DNS1123_LABEL.fullmatch(v) and len(v) <= 63 for v in driver["volumes"])
        executor = spark_operator.pod_view(app, "executor", _secrets(ingestion), webhook=webhook,
                                           config_maps=_config_maps(ingestion))
        assert JOB_INPUT_FILE not in executor["files"]  # (the driver alone reads it)


def test_without_the_webhook_or_a_template_the_job_document_is_missing():
    """What the docs say: in webhook mode the webhook mounts the job input (Spark cannot)."""
    ingestion = _ingestion("ingestion")
    for app in _applications(ingestion, MODES["webhook"]):
        driver = spark_operator.pod_view(app, "driver", _secrets(ingestion), webhook=False,
                                         config_maps=_config_maps(ingestion))
        assert JOB_INPUT_FILE not in driver["files"]


@pytest.mark.parametrize(("version", "mode"), SCHEMA_MODES)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_spark_applications_validate_strictly_against_the_upstream_schema(name, version, mode):
    schema = spark_operator.load_schema(version)
    for app in _applications(_ingestion(name), MODES[mode]):
        assert spark_operator.schema_problems(app, schema) == PRUNED[version], app["metadata"]["name"]
        for role in ("driver", "executor"):  # the core types inside, with Kubernetes' schemas
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {
                "securityContext": app["spec"][role]["podSecurityContext"],
                "containers": [{"name": "c", "image": "i", "securityContext": app["spec"][role]["securityContext"]}]}}
            template = app["spec"][role].get("template")
            assert (template is not None) == MODES[mode].spark_pod_templates
            objects = [pod] if template is None else [pod, {
                "apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": template}]
            for obj in objects:
                for kube in KUBE_VERSIONS:
                    kubernetes_validate.validate(obj, kube, strict=True)


def test_spark_operator_before_2_1_would_prune_the_pod_templates():
    app = _applications(_ingestion("ingestion"), MODES["pod-templates"])[0]
    assert spark_operator.schema_problems(app, spark_operator.load_schema("v1beta2-1.3.8")) == [
        "fields the API server would prune: [" + ", ".join(
            f"'.spec.{role}.{field}'" for role in ("driver", "executor")
            for field in ("securityContext.seccompProfile", "podSecurityContext.seccompProfile",
                          "template")) + "]"]


def test_spark_operator_1_3_prunes_seccomp_so_its_spark_pods_are_not_restricted():
    """v1beta2-1.3.x's CRD predates ``seccompProfile``: its API server drops it, and the pods its
    webhook makes are refused where ``restricted`` is enforced — what the docs' support table
    says (restricted namespaces need spark-operator ≥ 2.0)."""
    schema = spark_operator.load_schema("v1beta2-1.3.8")
    for app in _applications(_ingestion("ingestion")):
        stored = spark_operator.prune(copy.deepcopy(app), schema, object_meta=True)
        for role in ("driver", "executor"):
            pod = spark_operator.pod_view(stored, role, _secrets(_ingestion("ingestion")),
                                          config_maps=_config_maps(_ingestion("ingestion")))["pod"]
            assert "seccompProfile" not in pod["securityContext"]
            assert "seccompProfile" not in pod["containers"][0]["securityContext"]
            with pytest.raises(AssertionError):
                assert_restricted(pod)


def test_the_schema_check_refuses_a_field_upstream_does_not_have():
    app = _applications(_ingestion("ingestion"))[0]
    app["spec"]["driver"]["podTemplate"] = {}
    assert spark_operator.schema_problems(app, spark_operator.load_schema("v2")) == [
        "fields the API server would prune: ['.spec.driver.podTemplate']"]
    app = _applications(_ingestion("ingestion"))[0]
    app["spec"]["pythonVersion"] = 3
    assert spark_operator.schema_problems(app, spark_operator.load_schema("v2"))


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(SPECS))
def test_spark_applications_round_trip_through_spark_operators_own_api_models(name, mode):
    """spark-operator 2.4's API models, generated from its OpenAPI spec (PyPI kubeflow-spark-api,
    corev1 types included): they validate types strictly and drop any field they do not know,
    so a round trip that changes nothing means every field is one spark-operator keeps."""
    for app in _applications(_ingestion(name), MODES[mode]):
        assert SparkApplicationModel.from_dict(app).to_dict() == app


def test_the_api_models_drop_and_refuse_what_spark_operator_does_not_know():
    app = _applications(_ingestion("ingestion"))[0]
    app["spec"]["driver"]["podTemplate"] = {}
    assert "podTemplate" not in SparkApplicationModel.from_dict(app).to_dict()["spec"]["driver"]
    app["spec"]["executor"]["instances"] = "2"
    with pytest.raises(pydantic.ValidationError):
        SparkApplicationModel.from_dict(app)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_spark_applications_pass_spark_operators_webhook_rules(name):
    for app in _applications(_ingestion(name)):
        assert spark_operator.webhook_problems(app) == []
        assert len(app["metadata"]["name"]) <= children.SPARK_NAME_MAX


def test_the_webhook_replay_refuses_what_spark_operator_refuses():
    app = _applications(_ingestion("ingestion"))[1]
    bad = {**app, "metadata": {**app["metadata"], "name": "2orders.apply"},
           "spec": {**app["spec"], "sparkConf": {"spark.master": "local", "spark.kubernetes.namespace": "other"}}}
    assert spark_operator.webhook_problems(bad) == [
        "metadata.name '2orders.apply' is not a DNS-1035 label",
        "the UI Service '2orders.apply-ui-svc' is not a DNS-1035 label",
        "sparkConf key 'spark.master' is not allowed",
        "sparkConf key 'spark.kubernetes.namespace' must equal the application namespace"]
    bad["metadata"]["name"] = "a" * 57
    assert spark_operator.webhook_problems(bad)[0].startswith("the UI Service")


@pytest.mark.parametrize("name", [n for n in sorted(SPECS) if SPECS[n]["spec"]["source"].get("caSecretRef")])
def test_the_ca_is_where_the_spark_jobs_look_for_it(name):
    ingestion = _ingestion(name)
    ref = ingestion.spec.source.ca_secret_ref
    assert ref is not None
    for app in _applications(ingestion):
        for role in ("driver", "executor"):
            view = spark_operator.pod_view(app, role, _secrets(ingestion), config_maps=_config_maps(ingestion))
            path = view["env"][CA_FILE_ENV]
            assert view["files"][path] == _secrets(ingestion)[ref.name][ref.key]
            assert all(spark_operator.DNS1123_LABEL.fullmatch(v) and len(v) <= 63 for v in view["volumes"])
            settings = JobInput(ingestion, ()).source({k: v for k, v in view["env"].items()
                                                      if not v.startswith("secretKeyRef:")})
            assert settings.sslrootcert == path


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_pod_is_restricted_and_pulls_with_the_configured_secrets(name, mode):
    """Webhook mode as spark-operator's webhook makes the Spark pods, template mode as Spark builds
    them on the templates alone; template mode with the webhook running as well gives the same."""
    ingestion = _ingestion(name)
    config = MODES[mode]
    pods = _pod_specs(ingestion, config, webhook=not config.spark_pod_templates)
    if config.spark_pod_templates:
        assert _pod_specs(ingestion, config, webhook=True) == pods
    assert set(pods) == {"reader", "verify", "snapshot-driver", "snapshot-executor", "apply-driver",
                         "apply-executor"}
    for what, pod in pods.items():
        assert_restricted(pod)
        assert pod["imagePullSecrets"] == [{"name": "registry"}], what
    reader_account = ingestion.spec.reader.service_account or CONFIG.reader_service_account
    spark_account = ingestion.spec.spark.service_account or CONFIG.spark_service_account
    assert pods["reader"]["serviceAccountName"] == pods["verify"]["serviceAccountName"] == reader_account
    assert {pods[p]["serviceAccountName"] for p in pods if "-" in p} == {spark_account}


def test_without_the_webhook_only_the_templates_make_spark_pods_restricted():
    ingestion = _ingestion("ingestion")
    templated = _pod_specs(ingestion, MODES["pod-templates"], webhook=False)
    bare = _pod_specs(ingestion, MODES["webhook"], webhook=False)
    for what in ("snapshot-driver", "snapshot-executor", "apply-driver", "apply-executor"):
        assert_restricted(templated[what])
        with pytest.raises(AssertionError):
            assert_restricted(bare[what])


@pytest.mark.parametrize("name", sorted(SPECS))
def test_reader_and_verify_job_validate_strictly_for_every_supported_kubernetes(name):
    ingestion = _ingestion(name)
    for obj in (children.reader_deployment(ingestion, "uid", CONFIG, ["lakeslot"], replicas=1),
                children.verify_job(ingestion, "uid", CONFIG, ["lakeslot"], token="t")):
        for kube in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, kube, strict=True)
        labels = obj["metadata"]["labels"]
        assert all(len(v) <= 63 for v in labels.values()) and len(obj["metadata"]["name"]) <= 63
