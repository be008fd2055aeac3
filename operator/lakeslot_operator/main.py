"""``lakeslot operator``: run the control plane.

Connects with the in-cluster service account (or ``$KUBECONFIG`` outside a cluster), watches
PostgresIngestions cluster-wide or in the given namespaces, serves kopf's liveness endpoint, and
with ``--peering`` takes part in kopf peering so that a standby replica takes over when the
active one stops (only one operator acts at a time; the peering CRDs ship with the Helm chart).
"""

from __future__ import annotations

import asyncio
import os

import kopf
from kubernetes import client, config

from lakeslot_operator.children import OperatorConfig
from lakeslot_operator.handlers import build_registry
from lakeslot_operator.kube import Kube
from lakeslot_operator.reconcile import Context


def _api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(os.environ.get("KUBECONFIG"))
    return client.ApiClient()


def operator_config() -> OperatorConfig:
    defaults = OperatorConfig()
    return OperatorConfig(
        image=os.environ.get("LAKESLOT_IMAGE", defaults.image),
        spark_service_account=os.environ.get("LAKESLOT_SPARK_SERVICE_ACCOUNT",
                                             defaults.spark_service_account),
        image_pull_policy=os.environ.get("LAKESLOT_IMAGE_PULL_POLICY", defaults.image_pull_policy))


def run(*, namespaces: list[str], peering: str | None, liveness: str | None) -> None:
    ctx = Context(kube=Kube(_api_client()), config=operator_config())
    asyncio.run(kopf.operator(
        registry=build_registry(ctx), clusterwide=not namespaces, namespaces=namespaces,
        standalone=peering is None, peering_name=peering, liveness_endpoint=liveness))
