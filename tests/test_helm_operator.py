"""The operator as the chart deploys it: the chart's CRDs are installed on the Kubernetes API
emulator, and the real ``lakeslot`` process is started with the command, arguments and environment
of the rendered Deployment, its kubeconfig pointing at a recording proxy in front of the emulator.
It reconciles examples/ingestion.yaml (pointed at a real PostgreSQL 18) until the slot is ready
and the children exist, and deletes it again. Then:

- its liveness endpoint answered where the Deployment's probe asks, and its metrics endpoint
  where the PodMonitor scrapes (the ingestion's series while it exists, none after its deletion);
- every API request it made is allowed by the rendered RBAC for its service account (so a rule
  missing from the chart fails here even if tests/test_rbac.py's derivation missed the call);
- kopf's part of the derivation in tests/support/rbac.py is what kopf really asked for;
- the Argo CD health check reads the status the operator wrote as Progressing.

Simulated: the spark-operator and the Deployment controller (nothing runs the children), as in
tests/test_operator_kopf.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from lakeslot.api.models import GROUP, PLURAL, VERSION
from tests.support import chart, operator_env
from tests.support.kube_emulator import KubeEmulator, write_kubeconfig
from tests.support.prometheus import scrape
from tests.support.rbac import RecordingProxy, allowed, grants, is_discovery, kopf_calls, request_attributes
from tests.support.waiting import wait_for

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ingestion.yaml"
NAMESPACE = "shop"
POD_NAME = "lakeslot-7d9c5-x2x4q"
MODES: dict[str, dict[str, Any]] = {
    "clusterwide": chart.SERVED,
    "namespaced-peering": {"watchNamespaces": [NAMESPACE, "team-b"], "replicaCount": 2},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def example_ingestion(db, tmp_path: Path) -> dict:
    """examples/ingestion.yaml in namespace ``shop``, its source pointed at ``db``, its catalog
    and staging at local directories (no object-store keys)."""
    document = yaml.safe_load(EXAMPLE.read_text())
    document["metadata"]["namespace"] = NAMESPACE
    source = document["spec"]["source"]
    source.update(host="127.0.0.1", port=db.cluster.port, database=db.name, user=db.cluster.superuser)
    with db.connect() as conn:
        for table in source["tables"]:
            conn.execute(f'CREATE TABLE "{table["name"]}" (id int PRIMARY KEY, note text)')
    # (the example's REST catalog and object store, like its source, are replaced by what runs
    # here: their credentials go with them)
    document["spec"]["sink"]["catalog"] = {"type": "hadoop", "warehouse": (tmp_path / "warehouse").as_uri()}
    document["spec"]["staging"]["uri"] = (tmp_path / "staging").as_uri()
    del document["spec"]["secretEnv"]
    return document


def process_environment(container: dict, kubeconfig: Path) -> dict[str, str]:
    """The container's environment as the kubelet would set it, outside a cluster."""
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("KUBERNETES_SERVICE") and k != "KUBECONFIG"}
    for variable in container["env"]:
        if "value" in variable:
            environment[variable["name"]] = variable["value"]
        else:
            assert variable["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, variable
            environment[variable["name"]] = POD_NAME
    return {**environment, "KUBECONFIG": str(kubeconfig)}


def liveness(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def install(api, manifests: list[dict]) -> None:
    """The chart's CRDs (what Helm installs first), the spark-operator's CRD, and the peering
    objects the chart renders (the other rendered kinds do nothing on the emulator)."""
    extensions = kubernetes.client.ApiextensionsV1Api(api)
    for crd in [*chart.chart_crds(), operator_env.SPARK_CRD]:
        # The client's types ask for a V1CustomResourceDefinition; it sends a dict body as is.
        extensions.create_custom_resource_definition(crd)  # type: ignore[arg-type]
    custom = kubernetes.client.CustomObjectsApi(api)
    for peering in chart.of_kind(manifests, "KopfPeering"):
        custom.create_namespaced_custom_object("kopf.dev", "v1", peering["metadata"]["namespace"],
                                               "kopfpeerings", peering)
    for peering in chart.of_kind(manifests, "ClusterKopfPeering"):
        custom.create_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", peering)


def ingestion(api, name: str) -> dict | None:
    listing = kubernetes.client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL)
    assert isinstance(listing, dict), listing
    return next((i for i in listing["items"] if i["metadata"]["name"] == name), None)


def reconciled(api, name: str) -> dict | None:
    resource = ingestion(api, name)
    slot_ready = resource and operator_env.condition(resource, "SlotReady")
    listing = kubernetes.client.CustomObjectsApi(api).list_namespaced_custom_object(
        operator_env.SPARK_GROUP, operator_env.SPARK_VERSION, NAMESPACE, operator_env.SPARK_PLURAL)
    assert isinstance(listing, dict), listing
    apps = listing["items"]
    deployments = kubernetes.client.AppsV1Api(api).list_namespaced_deployment(NAMESPACE).items
    if slot_ready and slot_ready["status"] == "True" and apps and deployments:
        return resource
    return None


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_operator_started_as_the_chart_says_reconciles_within_its_rbac(
        kube: KubeEmulator, pgdb, tmp_path, mode):
    values = {**MODES[mode], "livenessPort": free_port(),
              "metrics": {"port": free_port(), "podMonitor": {"enabled": True}}}
    manifests = chart.render(values)
    container = chart.operator_container(manifests)
    account = chart.operator_account(manifests)
    probe = container["livenessProbe"]["httpGet"]
    document = example_ingestion(pgdb, tmp_path)
    name = document["metadata"]["name"]
    log = tmp_path / "operator.log"

    with kube.api_client() as api, RecordingProxy(kube.url) as proxy:
        install(api, manifests)
        # A kubeconfig for the proxy.
        kubeconfig = write_kubeconfig(proxy.url, tmp_path / "kubeconfig")
        executable = shutil.which(container["command"][0], path=str(Path(sys.executable).parent))
        with log.open("wb") as output:
            process = subprocess.Popen([executable, *container["args"]], stdout=output,
                                       stderr=subprocess.STDOUT,
                                       env=process_environment(container, kubeconfig))
        try:
            wait_for(lambda: process.poll() is not None or liveness(
                f"http://127.0.0.1:{values['livenessPort']}{probe['path']}"), "the liveness endpoint")
            assert process.poll() is None, log.read_text()

            # The client's types ask for a V1Secret; it sends a dict body as is.
            kubernetes.client.CoreV1Api(api).create_namespaced_secret(NAMESPACE, {  # type: ignore[arg-type]
                "metadata": {"name": document["spec"]["source"]["passwordSecretRef"]["name"]},
                "stringData": {"password": pgdb.cluster.password}})
            kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, document)
            resource = wait_for(lambda: reconciled(api, name), "slot, reader Deployment and snapshot")
            assert resource is not None  # wait_for returns only a truthy value
            assert chart.argocd_health(resource)["status"] == "Progressing"
            (monitor,) = [m for m in chart.of_kind(manifests, "PodMonitor")
                          if m["metadata"]["name"].endswith("-operator")]
            (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
            (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == endpoint["port"]]
            metrics_url = f"http://127.0.0.1:{port}{endpoint['path']}"
            wait_for(lambda: scrape(metrics_url).value("lakeslot_slot_retained_wal_bytes", ingestion=name) is not None,
                     "the ingestion's series in the operator's metrics")
            wait_for(lambda: kubernetes.client.CoreV1Api(api).list_namespaced_event(NAMESPACE).items,
                     "events posted by the operator")

            kubernetes.client.CustomObjectsApi(api).delete_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, name)
            wait_for(lambda: ingestion(api, name) is None, "the deletion to finish")
            wait_for(lambda: not [k for k in scrape(metrics_url) if ("ingestion", name) in k[1]],
                     "the deleted ingestion's series gone from the metrics")
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
            print(log.read_text()[-20000:])  # shown by pytest when the test fails
        requests = list(proxy.requests)

    assert all(is_discovery(m, p) for m, p, q in requests if request_attributes(m, p, q) is None)
    granted = grants(manifests, account)
    observed = {a for a in (request_attributes(m, p, q) for m, p, q in requests) if a}
    denied = sorted(a for a in observed if not allowed(granted, a))
    assert denied == [], f"requests the chart's RBAC would refuse: {denied}"
    clusterwide = not values.get("watchNamespaces")
    cluster, served = kopf_calls(clusterwide=clusterwide, peering=values.get("replicaCount", 1) > 1)
    seen = {(a.verb, a.group, a.resource) for a in observed}
    assert cluster | served <= seen, f"kopf calls derived but never made: {(cluster | served) - seen}"
