"""``lakeslot operator``: run the control plane.

Connects with the in-cluster service account (or ``$KUBECONFIG`` outside a cluster), watches
PostgresIngestions cluster-wide or in the given namespaces, serves kopf's liveness endpoint and
its own Prometheus metrics (``/metrics`` on ``metrics_port``, :mod:`lakeslot_operator.metrics`;
0: none), and
with ``--peering`` takes part in kopf peering with a priority of its own
(:mod:`lakeslot_operator.peering`), so that exactly one replica acts and a standby takes over
when it stops (the peering CRDs ship with the Helm chart).

The children's defaults come from the environment the chart sets: ``LAKESLOT_IMAGE``,
``LAKESLOT_IMAGE_PULL_POLICY``, ``LAKESLOT_IMAGE_PULL_SECRETS`` (comma-separated Secret names),
``LAKESLOT_SPARK_SERVICE_ACCOUNT``, ``LAKESLOT_READER_SERVICE_ACCOUNT``,
``LAKESLOT_SPARK_POD_TEMPLATES`` (``true``: pod templates for a spark-operator without its webhook;
anything but ``true``/``false`` stops the operator at start); ``POD_ID`` is kopf's
identity in the peering object, and ``LAKESLOT_PEERING_LIFETIME_S`` how long a replica that died
keeps the others waiting (default :data:`lakeslot_operator.peering.LIFETIME_S`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

import kopf
from kubernetes import client, config

from lakeslot_operator.children import OperatorConfig
from lakeslot_operator.handlers import build_registry
from lakeslot_operator.kube import Kube
from lakeslot_operator.metrics import OperatorMetrics
from lakeslot_operator.peering import LIFETIME_S, configure
from lakeslot_operator.reconcile import Context


def _api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(os.environ.get("KUBECONFIG"))
    return client.ApiClient()


def operator_config(environ: Mapping[str, str] | None = None) -> OperatorConfig:
    env = os.environ if environ is None else environ
    defaults = OperatorConfig()
    secrets = tuple(s.strip() for s in env.get("LAKESLOT_IMAGE_PULL_SECRETS", "").split(",") if s.strip())
    return OperatorConfig(
        image=env.get("LAKESLOT_IMAGE", defaults.image),
        spark_service_account=env.get("LAKESLOT_SPARK_SERVICE_ACCOUNT",
                                      defaults.spark_service_account),
        image_pull_policy=env.get("LAKESLOT_IMAGE_PULL_POLICY", defaults.image_pull_policy),
        image_pull_secrets=secrets,
        reader_service_account=env.get("LAKESLOT_READER_SERVICE_ACCOUNT") or None,
        spark_pod_templates=_flag(env, "LAKESLOT_SPARK_POD_TEMPLATES", defaults.spark_pod_templates))


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name, "").strip().lower()
    if value not in ("", "true", "false"):
        raise ValueError(f"{name} must be true or false, not {env[name]!r}")
    return default if not value else value == "true"


def run(*, namespaces: list[str], peering: str | None, liveness: str | None,
        metrics_port: int = 0) -> None:
    kopf.configure()  # kopf's log format at INFO: handling, peering (pausing, resuming), errors
    ctx = Context(kube=Kube(_api_client()), config=operator_config())
    metrics = OperatorMetrics()
    if metrics_port:
        metrics.serve(metrics_port)
    settings = kopf.OperatorSettings()
    if peering is not None:
        configure(
            settings, pod=os.environ.get("POD_ID") or os.uname().nodename,
            lifetime=int(os.environ.get("LAKESLOT_PEERING_LIFETIME_S") or LIFETIME_S))
    asyncio.run(kopf.operator(
        registry=build_registry(ctx, metrics=metrics), settings=settings, clusterwide=not namespaces,
        namespaces=namespaces, standalone=peering is None, peering_name=peering,
        liveness_endpoint=liveness))
