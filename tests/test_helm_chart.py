"""The Helm chart (helm/lakeslot) with the real Helm engine: it lints clean, renders for every
values combination in ``chart.VALUE_SETS``, and every rendered manifest is valid — core kinds
against Kubernetes' own schemas (kubernetes-validate, offline, for the oldest Kubernetes the chart
supports and the newest the validator knows), kopf's peering objects against the CRD the chart
ships (jsonschema). The PodMonitor's CRD belongs to the Prometheus Operator and is not available
offline: it is checked against what it must select (the reader pods the operator creates).

RBAC is tests/test_rbac.py; starting the operator as the Deployment says is
tests/test_helm_operator.py.
"""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest
from helm_python import HelmError, HelmValuesError

import lakeslot
from lakeslot.api.models import PostgresIngestion
from lakeslot.cli import build_parser
from lakeslot.workloads import READER_METRICS_PORT
from lakeslot_operator import children
from lakeslot_operator.main import operator_config
from tests.api_cases import base_document
from tests.support import chart
from tests.support.kube_emulator import to_json_schema
from tests.support.pod_security import assert_restricted

# The chart's kubeVersion floor (CEL validation in the CRD) and the newest schemas offline.
KUBE_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
NOT_CORE = {"kopf.dev/v1", "monitoring.coreos.com/v1"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering", "CustomResourceDefinition"}
VALUE_SET_NAMES = sorted(chart.VALUE_SETS)


@pytest.mark.parametrize("name", VALUE_SET_NAMES)
def test_the_chart_lints_clean(name):
    report = chart.lint(chart.VALUE_SETS[name])
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); warnings and errors fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("name", VALUE_SET_NAMES)
def test_every_rendered_manifest_is_valid(name):
    manifests = chart.render(chart.VALUE_SETS[name])
    peering_schemas = {crd["spec"]["names"]["kind"]: crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                       for crd in chart.chart_crds() if crd["spec"]["group"] == "kopf.dev"}
    for manifest in manifests:
        what = f"{manifest['kind']} {manifest['metadata']['name']}"
        assert ("namespace" in manifest["metadata"]) != (manifest["kind"] in CLUSTER_SCOPED), what
        if manifest["apiVersion"] == "kopf.dev/v1":
            jsonschema.Draft202012Validator(to_json_schema(peering_schemas[manifest["kind"]])).validate(manifest)
        elif manifest["apiVersion"] not in NOT_CORE:
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(manifest, version, strict=True)
    assert {m["apiVersion"] for m in manifests} - NOT_CORE <= {
        "v1", "apps/v1", "rbac.authorization.k8s.io/v1", "networking.k8s.io/v1", "policy/v1"}


def test_the_chart_crds_are_valid():
    """Ours is the generated copy (tests/test_crd.py fails when it is stale) and kopf's peering."""
    crds = chart.chart_crds()
    for crd in crds:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(crd, version, strict=True)
    names = {crd["metadata"]["name"] for crd in crds}
    assert names == {"postgresingestions.lakeslot.io", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"}


@pytest.mark.parametrize(("values", "key"), [
    ({"watchNamespace": ["shop"]}, "watchNamespace"),
    ({"replicaCount": 0}, "/replicaCount"),
    ({"watchNamespaces": ["Shop_Ns"]}, "/watchNamespaces/0"),
    ({"watchNamespaces": ["shop", "shop"]}, "/watchNamespaces"),
    ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"livenessPort": 80}, "/livenessPort"),
    ({"metrics": {"podMonitor": {"interval": "soon"}}}, "/metrics/podMonitor/interval"),
    ({"spark": {"serviceAccount": {"name": ""}}}, "/spark/serviceAccount/name"),
    ({"podLabels": {"team": 7}}, "/podLabels/team"),
])
def test_values_schema_rejects_what_would_break_the_install(values, key):
    with pytest.raises(HelmValuesError, match=key):
        chart.render(values)


def test_a_default_install_says_what_to_set():
    """values.yaml alone watches every namespace and cannot know where Spark jobs will run: the
    install fails naming the values to set, rather than start an operator whose jobs cannot."""
    with pytest.raises(HelmError, match=r"set spark\.namespaces to the namespaces that will hold"):
        chart.render({})
    manifests = chart.render(chart.SERVED)
    assert sorted(m["kind"] for m in manifests) == [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "ServiceAccount",
        "ServiceAccount"]
    assert chart.render(chart.VALUE_SETS["bring-your-own-spark-account"])  # nothing to create: fine


@pytest.mark.parametrize("name", VALUE_SET_NAMES)
def test_the_operator_pod_meets_the_restricted_pod_security_standard(name):
    """The checks of Kubernetes' "restricted" profile (Pod Security Standards), on the pod spec."""
    pod = chart.one(chart.render(chart.VALUE_SETS[name]), "Deployment")["spec"]["template"]["spec"]
    assert_restricted(pod)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost")


@pytest.mark.parametrize("name", VALUE_SET_NAMES)
def test_the_operator_command_line_is_what_the_values_ask_for(name):
    values = chart.VALUE_SETS[name]
    manifests = chart.render(values)
    deployment = chart.one(manifests, "Deployment")
    container = chart.operator_container(manifests)
    args = build_parser().parse_args(container["args"])
    assert container["command"] == ["lakeslot"] and args.command == "operator"
    assert args.namespace == values.get("watchNamespaces", [])
    peering = chart.of_kind(manifests, "KopfPeering") + chart.of_kind(manifests, "ClusterKopfPeering")
    if values.get("replicaCount", 1) > 1:
        assert {p["metadata"]["name"] for p in peering} == {args.peering}
        assert {p["metadata"].get("namespace") for p in peering} == set(args.namespace or [None])
        assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    else:
        assert args.peering is None and peering == []
        assert deployment["spec"]["strategy"]["type"] == "Recreate"
    # The liveness probe asks the endpoint the operator serves.
    port = int(args.liveness.rsplit(":", 1)[1].split("/")[0])
    (named,) = [p for p in container["ports"] if p["name"] == container["livenessProbe"]["httpGet"]["port"]]
    assert named["containerPort"] == port == values.get("livenessPort", 8080)
    assert args.liveness.endswith(container["livenessProbe"]["httpGet"]["path"])
    # The metrics port is the one the operator serves, named for the PodMonitor.
    metrics = values.get("metrics", {}).get("port", 9188)
    assert args.metrics_port == metrics
    assert [p["containerPort"] for p in container["ports"] if p["name"] == "metrics"] == ([metrics] if metrics else [])


def test_image_and_children_defaults_follow_the_release():
    manifests = chart.render(chart.SERVED)
    container = chart.operator_container(manifests)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert lakeslot.__version__ == chart.chart_metadata()["appVersion"]
    assert container["image"] == env["LAKESLOT_IMAGE"] == children.OperatorConfig().image
    assert env["LAKESLOT_IMAGE_PULL_POLICY"] == children.OperatorConfig().image_pull_policy
    assert env["LAKESLOT_SPARK_SERVICE_ACCOUNT"] == children.OperatorConfig().spark_service_account
    assert operator_config(env) == children.OperatorConfig()  # what the chart sets is the default
    customized = chart.operator_container(chart.render(chart.VALUE_SETS["customized"]))
    assert customized["image"] == "registry.example/lakeslot:dev"
    customized_env = {e["name"]: e.get("value") for e in customized["env"]}
    assert customized_env["LAKESLOT_IMAGE"] == customized["image"]
    assert operator_config(customized_env).spark_pod_templates is True  # spark.podTemplates
    with pytest.raises(ValueError, match="LAKESLOT_SPARK_POD_TEMPLATES"):
        operator_config({**customized_env, "LAKESLOT_SPARK_POD_TEMPLATES": "yes"})


@pytest.mark.parametrize("name", ["pod-monitor", "namespaced"])
def test_the_pod_monitor_selects_the_reader_pods_metrics_port(name):
    values = {**chart.VALUE_SETS[name], "metrics": {"podMonitor": {"enabled": True}}}
    (monitor,) = [m for m in chart.of_kind(chart.render(values), "PodMonitor")
                  if m["metadata"]["name"].endswith("-readers")]
    ingestion = PostgresIngestion.model_validate(base_document())
    reader = children.reader_deployment(ingestion, "uid", children.OperatorConfig(), ["lakeslot"], replicas=1)
    pod_labels = reader["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = reader["spec"]["template"]["spec"]["containers"]
    assert {"name": endpoint["port"], "containerPort": READER_METRICS_PORT} in container["ports"]
    namespaces = values.get("watchNamespaces")
    assert monitor["spec"]["namespaceSelector"] == ({"matchNames": namespaces} if namespaces else {"any": True})


def test_the_network_policy_denies_ingress_and_restricts_egress_only_when_asked():
    (policy,) = chart.of_kind(chart.render(chart.VALUE_SETS["network-policy-ingress-only"]), "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 9188}]}]  # metrics only
    (policy,) = chart.of_kind(chart.render(chart.VALUE_SETS["no-metrics"]), "NetworkPolicy")
    assert policy["spec"]["ingress"] == []
    values = chart.VALUE_SETS["network-policy"]
    manifests = chart.render(values)
    policy = chart.one(manifests, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["egress"] == values["networkPolicy"]["egress"]
    pod_labels = chart.one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()


def test_the_notes_say_how_to_upgrade_the_crds():
    notes = chart.notes(chart.SERVED)
    assert "helm upgrade` never updates the CRDs" in notes
    assert "kubectl apply --server-side" in notes


def test_every_pod_lakeslot_creates_gets_the_image_pull_secrets_and_service_accounts():
    """The chart's imagePullSecrets and reader service account reach the operator's configuration
    (lakeslot_operator.main reads the environment the Deployment sets), and from there every pod
    the operator builds: the reader, the verification Job and both SparkApplications."""
    values = {**chart.VALUE_SETS["customized"], "reader": {"serviceAccount": {"name": "reader-wi"}}}
    env = {e["name"]: e["value"] for e in chart.operator_container(chart.render(values))["env"] if "value" in e}
    config = operator_config(env)
    assert config.image_pull_secrets == ("registry", "mirror")
    assert config.reader_service_account == "reader-wi"
    ingestion = PostgresIngestion.model_validate(base_document())
    reader = children.reader_deployment(ingestion, "uid", config, ["lakeslot"], replicas=1)
    job = children.verify_job(ingestion, "uid", config, ["lakeslot"], token="t")
    for pod in (reader["spec"]["template"]["spec"], job["spec"]["template"]["spec"]):
        assert pod["imagePullSecrets"] == [{"name": "registry"}, {"name": "mirror"}]
        assert pod["serviceAccountName"] == "reader-wi"
    for app in (children.apply_application(ingestion, "uid", config, []),
                children.snapshot_application(ingestion, "uid", config, [], generation="g0-1")):
        assert app["spec"]["imagePullSecrets"] == ["registry", "mirror"]


def test_service_accounts_carry_their_workload_identity_annotations():
    values = chart.VALUE_SETS["workload-identity"]
    accounts = {(sa["metadata"]["namespace"], sa["metadata"]["name"]): sa
                for sa in chart.of_kind(chart.render(values), "ServiceAccount")}
    spark = accounts[("shop", values["spark"]["serviceAccount"].get("name", "lakeslot-spark"))]
    assert spark["metadata"]["annotations"] == values["spark"]["serviceAccount"]["annotations"]
    reader = accounts[("shop", "lakeslot-reader")]
    assert reader["metadata"]["annotations"] == values["reader"]["serviceAccount"]["annotations"]
    env = {e["name"]: e["value"] for e in chart.operator_container(chart.render(values))["env"] if "value" in e}
    assert env["LAKESLOT_READER_SERVICE_ACCOUNT"] == "lakeslot-reader"
    with pytest.raises(HelmValuesError, match="reader/serviceAccount"):
        chart.render({**values, "reader": {"serviceAccount": {"create": True}}})  # created, unnamed


@pytest.mark.parametrize("name", ["peering", "namespaced-peering"])
def test_replicas_roll_without_gaps_and_keep_one_through_disruptions(name):
    manifests = chart.render(chart.VALUE_SETS[name])
    deployment = chart.one(manifests, "Deployment")
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    budget = chart.one(manifests, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert chart.of_kind(chart.render(chart.SERVED), "PodDisruptionBudget") == []
