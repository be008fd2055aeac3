"""helm/ as tests see it: the chart rendered with the real Helm engine (helm-python-sdk, Helm v4's
Go library), split into manifests, for a named set of values combinations; and the Argo CD
health check run as Argo CD runs it.

``VALUE_SETS`` are the install shapes the tests cover; each test iterates the ones it needs.
``render()`` returns the parsed manifests (NOTES.txt and empty documents left out) in template
order; ``chart_crds()`` the CustomResourceDefinitions of the chart's ``crds/`` directory, which
Helm installs before the templates and never renders; ``alert_rules()``, ``dashboard()`` and
``dashboard_queries()`` the monitoring the chart ships, as Prometheus and Grafana read it.

``argocd_health(obj)`` runs helm/argocd/health.lua on a resource in a sandbox like Argo CD's: Lua
5.1 (Argo CD embeds gopher-lua, a Lua 5.1), the object as the global ``obj``, only the base and
table libraries, and no string methods (``s:find()`` needs the string library). A script that
reaches for anything else fails with ``lupa.lua51.LuaError``.

Failure modes: a template error or values rejected by ``values.schema.json`` raise
``helm_python.HelmError`` from ``render()`` (Helm validates the values before rendering).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import helm_python
import lupa.lua51
import yaml

HELM = Path(__file__).resolve().parents[2] / "helm"
CHART = HELM / "lakeslot"
HEALTH_LUA = HELM / "argocd" / "health.lua"
RELEASE = "lakeslot"
RELEASE_NAMESPACE = "lakeslot-system"

# The smallest install that renders: watching every namespace, the chart must be told where the
# ingestions live (spark.namespaces), else it fails (see test_a_default_install_says_what_to_set).
SERVED: dict[str, Any] = {"spark": {"namespaces": ["shop"]}}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "namespaced": {"watchNamespaces": ["shop", "team-b"]},
    "peering": {**SERVED, "replicaCount": 2},
    "namespaced-peering": {"watchNamespaces": ["shop", "team-b"], "replicaCount": 3},
    "spark-namespaces": SERVED,
    "pod-monitor": {**SERVED, "metrics": {"podMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "monitoring": {**SERVED, "metrics": {
        "podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
        "dashboard": {"enabled": True, "namespace": "monitoring"}}},
    "no-metrics": {**SERVED, "metrics": {"port": 0, "podMonitor": {"enabled": True}},
                   "networkPolicy": {"enabled": True}},
    "network-policy": {**SERVED, "networkPolicy": {"enabled": True, "egress": [
        {"to": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP", "port": 53}]},
        {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
         "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 5432}]}]}},
    "network-policy-ingress-only": {**SERVED, "networkPolicy": {"enabled": True}},
    "bring-your-own-spark-account": {"spark": {"serviceAccount": {"create": False, "name": "spark"},
                                               "rbac": {"create": False}}},
    "workload-identity": {
        "watchNamespaces": ["shop"],
        "spark": {"serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/spark"}}},
        "reader": {"serviceAccount": {"create": True, "name": "lakeslot-reader", "annotations": {
            "iam.gke.io/gcp-service-account": "reader@project.iam.gserviceaccount.com"}}},
    },
    "no-rbac": {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "ops"},
                "spark": {"serviceAccount": {"create": False, "name": "spark"},
                          "rbac": {"create": False}, "namespaces": ["shop"]}},
    "customized": {
        "fullnameOverride": "cdc", "image": {"repository": "registry.example/lakeslot", "tag": "dev",
                                             "pullPolicy": "Always"},
        **SERVED, "imagePullSecrets": [{"name": "registry"}, {"name": "mirror"}], "livenessPort": 9090,
        "podAnnotations": {"example.com/team": "data"}, "podLabels": {"team": "data"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "data", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
        "priorityClassName": "data-platform",
        "spark": {**SERVED["spark"], "podTemplates": True},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/cdc"}},
        "resources": {"requests": {"cpu": "200m", "memory": "300Mi"}, "limits": {"memory": "1Gi"}},
    },
}


def render(values: Mapping[str, Any] | None = None, *, namespace: str = RELEASE_NAMESPACE,
           release: str = RELEASE) -> list[dict[str, Any]]:
    """The manifests Helm would install for ``values`` (templates only; see ``chart_crds``)."""
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(dict(values or {}), name=release, namespace=namespace)
    return [doc for name, text in sorted(rendered.items()) if not name.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


def lint(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``helm lint --strict`` of the chart with ``values`` (helm_python.lint's report)."""
    return helm_python.lint(CHART, dict(values or {}), strict=True, namespace=RELEASE_NAMESPACE)


def chart_metadata() -> dict[str, Any]:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def notes(values: Mapping[str, Any] | None = None) -> str:
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(dict(values or {}), name=RELEASE, namespace=RELEASE_NAMESPACE)
    return rendered[f"{CHART.name}/templates/NOTES.txt"]


def chart_crds() -> list[dict[str, Any]]:
    with helm_python.Chart.load(CHART) as chart:
        files = chart.crds
    return [doc for crd in files for doc in yaml.safe_load_all(crd["data"]) if doc]


def of_kind(manifests: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [dict(m) for m in manifests if m["kind"] == kind]


def one(manifests: Iterable[Mapping[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = of_kind(manifests, kind)
    return found


def operator_account(manifests: Iterable[Mapping[str, Any]]) -> tuple[str, str]:
    """(namespace, name) of the service account the operator runs as."""
    deployment = one(manifests, "Deployment")
    return deployment["metadata"]["namespace"], deployment["spec"]["template"]["spec"]["serviceAccountName"]


def operator_container(manifests: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    (container,) = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


# Lua 5.1's base library (what Argo CD's sandbox opens besides ``table``).
_LUA_BASE = ("assert", "collectgarbage", "dofile", "error", "getfenv", "getmetatable", "ipairs",
             "load", "loadfile", "loadstring", "next", "pairs", "pcall", "print", "rawequal",
             "rawget", "rawset", "select", "setfenv", "setmetatable", "tonumber", "tostring",
             "type", "unpack", "xpcall", "_VERSION")
_SANDBOX = """
local base, script, obj = ...
local env = {table = {}}
for _, name in ipairs(base) do env[name] = _G[name] end
for name, fn in pairs(table) do env.table[name] = fn end
env._G = env
env.obj = obj
getmetatable("").__index = nil
local chunk = assert(loadstring(script, "=health.lua"))
setfenv(chunk, env)
return chunk()
"""


def argocd_health(obj: Mapping[str, Any], script: str | None = None) -> dict[str, Any]:
    """``{"status": ..., "message": ...}`` as Argo CD's health check would report for ``obj``
    (``script``: another health script, default helm/argocd/health.lua)."""
    lua = lupa.lua51.LuaRuntime(unpack_returned_tuples=False, register_eval=False,
                                register_builtins=False)
    run = lua.eval(f"function(...) {_SANDBOX} end")
    result = run(lua.table_from(_LUA_BASE), HEALTH_LUA.read_text() if script is None else script,
                 lua.table_from(obj, recursive=True))
    return dict(result.items())


def alert_rules(manifests: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The PrometheusRule's alerting rules by alert name."""
    rule = one(manifests, "PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def dashboard(manifests: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The Grafana dashboard of the chart's dashboard ConfigMap, parsed."""
    (text,) = one(manifests, "ConfigMap")["data"].values()
    return json.loads(text)


def dashboard_queries(board: Mapping[str, Any]) -> list[str]:
    """Every PromQL query of ``board`` as Prometheus would receive it from Grafana: the panels'
    targets and the selectors of the ``label_values(selector, label)`` variables, with Grafana's
    variables replaced (``$__rate_interval`` by 5m, a dashboard variable by the regex ``.*`` that
    "All" selects)."""
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((.*), *[a-z_]+\)", variable["query"]["query"])
            assert found, variable
            queries.append(found.group(1))
    return [re.sub(r"\$[a-z_]+", ".*", q.replace("$__rate_interval", "5m")) for q in queries]


def alerts(**thresholds: int) -> dict[str, dict]:
    """The chart's alert rules by name, rendered with ``thresholds`` (``metrics.prometheusRule``)."""
    return alert_rules(render({**SERVED, "metrics": {"prometheusRule": {"enabled": True, **thresholds}}}))
