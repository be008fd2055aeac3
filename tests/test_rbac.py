"""The operator's RBAC grants exactly what its code uses, nothing more and nothing less.

The calls are derived statically (tests/support/rbac.py says how: lakeslot's from the source of
``lakeslot_operator.kube``, kopf's as read from kopf's source); tests/test_helm_operator.py checks
them dynamically, by recording the requests the real operator process makes. Each mode of the
chart is compared as a set of (scope, verb, group, resource) grants, so a rule added to or missing
from the chart fails here.
"""

from __future__ import annotations

import re

import pytest

from lakeslot_operator import children
from tests.support import chart
from tests.support.rbac import Grant, expected_grants, grants, kube_calls

# The spark-operator chart's role for Spark drivers (charts/spark-operator-chart/templates/spark/
# rbac.yaml): Spark's Kubernetes backend manages executor pods, a headless driver service,
# config maps and, with on-demand executor volumes, persistent volume claims.
SPARK_DRIVER_RESOURCES = {"pods", "services", "configmaps", "persistentvolumeclaims"}
SPARK_DRIVER_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}


def test_kube_calls_are_derived():
    """The derivation finds what the operator does today (guards the parser itself)."""
    assert kube_calls() == {
        # secrets: only the user's are read (no Secret is written: a job's input is a ConfigMap,
        # read before it is replaced, to check it is lakeslot's)
        ("get", "", "secrets"), *[(verb, "", "configmaps") for verb in ("get", "create", "update")],
        ("list", "", "pods"),
        *[(verb, "apps", "deployments") for verb in ("get", "list", "create", "update", "patch", "delete")],
        *[(verb, "sparkoperator.k8s.io", "sparkapplications")
          for verb in ("get", "list", "create", "update", "delete")],
        *[(verb, "batch", "jobs") for verb in ("get", "create", "delete")],
    }


@pytest.mark.parametrize("name", sorted(chart.VALUE_SETS))
def test_operator_rbac_is_exactly_what_the_code_calls(name):
    values = chart.VALUE_SETS[name]
    manifests = chart.render(values)
    account = chart.operator_account(manifests)
    if not values.get("rbac", {}).get("create", True):
        assert grants(manifests, account) == set()
        assert not chart.of_kind(manifests, "ClusterRole")
        return
    assert grants(manifests, account) == expected_grants(values)


def test_the_chart_uses_no_wildcards_resource_names_or_aggregation():
    for values in chart.VALUE_SETS.values():
        manifests = chart.render(values)
        for role in chart.of_kind(manifests, "Role") + chart.of_kind(manifests, "ClusterRole"):
            assert "aggregationRule" not in role
            for rule in role["rules"]:
                assert "resourceNames" not in rule and "nonResourceURLs" not in rule
                assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], rule


@pytest.mark.parametrize("name", ["namespaced", "spark-namespaces"])
def test_spark_drivers_get_their_service_account_and_role_in_each_job_namespace(name):
    values = chart.VALUE_SETS[name]
    manifests = chart.render(values)
    namespaces = values.get("spark", {}).get("namespaces") or values["watchNamespaces"]
    account_name = children.OperatorConfig().spark_service_account
    assert {(sa["metadata"]["namespace"], sa["metadata"]["name"])
            for sa in chart.of_kind(manifests, "ServiceAccount")
            if sa["metadata"]["namespace"] != chart.RELEASE_NAMESPACE} == {(ns, account_name) for ns in namespaces}
    for namespace in namespaces:
        assert grants(manifests, (namespace, account_name)) == {
            Grant(namespace, verb, "", resource)
            for resource in SPARK_DRIVER_RESOURCES for verb in SPARK_DRIVER_VERBS}
    env = {e["name"]: e.get("value") for e in chart.operator_container(manifests)["env"]}
    assert env["LAKESLOT_SPARK_SERVICE_ACCOUNT"] == account_name


def test_with_a_spark_account_of_your_own_none_is_made_and_the_notes_warn():
    values = chart.VALUE_SETS["bring-your-own-spark-account"]
    manifests = chart.render(values)
    assert [sa["metadata"]["name"] for sa in chart.of_kind(manifests, "ServiceAccount")] == [chart.RELEASE]
    assert "WARNING: the chart creates it nowhere" in chart.notes(values)
    assert "WARNING" not in chart.notes(chart.VALUE_SETS["namespaced"])


def test_children_owner_references_need_update_on_finalizers():
    """OpenShift's OwnerReferencesPermissionEnforcement: blockOwnerDeletion asks for update on
    the owner's finalizers; without the grant every child create is refused."""
    for name in ("spark-namespaces", "namespaced"):
        values = chart.VALUE_SETS[name]
        granted = grants(chart.render(values), chart.operator_account(chart.render(values)))
        namespace = None if name == "spark-namespaces" else "shop"
        assert Grant(namespace, "update", "lakeslot.io", "postgresingestions/finalizers") in granted


@pytest.mark.parametrize("name", sorted(n for n, v in chart.VALUE_SETS.items()
                                        if v.get("rbac", {}).get("create", True)))
def test_the_notes_list_exactly_what_the_operator_may_do(name):
    """NOTES.txt says what the operator may do in the namespaces it serves: the same grants."""
    values = chart.VALUE_SETS[name]
    notes = chart.notes(values).splitlines()
    start = next(i for i, line in enumerate(notes) if line.endswith("it may:")) + 1
    listed = set()
    for line in notes[start:]:
        match = re.fullmatch(r"  ((?:[a-z]+, )*[a-z]+) ((?:[a-z/]+, )*[a-z/]+)(?: \((.+)\))?", line)
        if match is None:
            break
        verbs, resources, group = match.groups()
        listed |= {(verb, group or "", resource) for verb in verbs.split(", ") for resource in resources.split(", ")}
    manifests = chart.render(values)
    granted = grants(manifests, chart.operator_account(manifests))
    observed = {(v, "apiextensions.k8s.io", "customresourcedefinitions") for v in ("list", "watch")}
    namespaces = values.get("watchNamespaces")
    if namespaces:
        observed |= {(v, "", "namespaces") for v in ("list", "watch")}
        assert "Cluster-wide it also lists and watches CRDs and namespaces, nothing else." in notes
    else:
        assert "Cluster-wide it also lists and watches CRDs, nothing else." in notes
    for namespace in namespaces or [None]:
        assert listed == {(g.verb, g.group, g.resource) for g in granted if g.namespace == namespace} - \
            (set() if namespaces else observed)
    assert {(g.verb, g.group, g.resource) for g in granted if g.namespace is None} == \
        (observed if namespaces else listed | observed)
