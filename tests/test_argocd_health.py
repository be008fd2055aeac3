"""The Argo CD side of lakeslot (helm/argocd): the PostgresIngestion health check, run by a real Lua
5.1 in Argo CD's sandbox against Argo CD-format test cases; the argocd-cm snippet carrying exactly
that script; the example Applications syncing the operator before the ingestions.

The status fixtures are kept honest against the operator: each validates against the CRD's status
schema with nothing pruned, and every condition reason in them, and every reason the script treats
as "waiting", is one the operator writes. tests/test_helm_operator.py also runs the script on a
status the real operator wrote.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import lupa.lua51
import pytest
import yaml

import lakeslot_operator
from lakeslot import errors
from lakeslot.api import validation
from lakeslot.api.crd import crd_manifest
from lakeslot.api.models import GROUP, KIND
from lakeslot.control import steps
from lakeslot.observability import status_report
from tests.support import chart
from tests.support.kube_emulator import prune, to_json_schema

ARGOCD = chart.HELM / "argocd"
REPOSITORY = chart.HELM.parent
CASES = yaml.safe_load((ARGOCD / "health_test.yaml").read_text())["tests"]
HEALTH_KEY = f"resource.customizations.health.{GROUP}_{KIND}"
KUBE_VERSION = "1.29.0"


def fixture(case: dict) -> dict:
    return yaml.safe_load((ARGOCD / case["inputPath"]).read_text())


def operator_reasons() -> set[str]:
    """Every condition reason the operator's code writes (string literals in the modules that
    set conditions: its own package, and the control steps and status it shares with local
    mode)."""
    modules = [importlib.import_module(m.name) for m in
               pkgutil.walk_packages(lakeslot_operator.__path__, "lakeslot_operator.")]
    source = "".join(inspect.getsource(m) for m in [*modules, steps, status_report])
    return set(re.findall(r'"([A-Z][A-Za-z]+)"', source))


@pytest.mark.parametrize("case", CASES, ids=lambda case: Path(case["inputPath"]).stem)
def test_health_of_each_fixture(case):
    assert chart.argocd_health(fixture(case)) == case["healthStatus"]


def test_the_fixtures_cover_every_health_status():
    assert len(CASES) >= 8
    assert {case["healthStatus"]["status"] for case in CASES} == \
        {"Healthy", "Progressing", "Degraded", "Suspended"}


@pytest.mark.parametrize("case", CASES, ids=lambda case: Path(case["inputPath"]).stem)
def test_each_fixture_is_a_status_the_operator_can_write(case):
    (version,) = crd_manifest()["spec"]["versions"]
    status_schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    status = fixture(case).get("status", {})
    jsonschema.Draft202012Validator(to_json_schema(status_schema)).validate(status)
    assert prune(status, status_schema) == status, "fields the CRD does not know"
    assert {c["reason"] for c in status.get("conditions", [])} <= operator_reasons()


def test_every_waiting_reason_is_one_the_operator_writes():
    script = chart.HEALTH_LUA.read_text()
    found = re.search(r"local WAITING = \{(.*?)\n\}", script, re.S)
    assert found, "the health script has no WAITING table"
    table = found.group(1)
    waiting = set(re.findall(r"^\s*(\w+) = true", table, re.M))
    assert waiting and waiting <= operator_reasons()
    assert not waiting & set(errors.DEFINITE_REASONS), "a definite error is never waited out"
    assert not waiting & set(status_report.CHILD_FAILURES), "a child that cannot work is never waited out"


@pytest.mark.parametrize("script", ['return {status = string.upper("healthy")}',
                                    'return {status = ("Healthy"):lower()}',
                                    'return {status = os.getenv("HOME")}'])
def test_the_sandbox_offers_only_base_and_table(script):
    with pytest.raises(lupa.lua51.LuaError):
        chart.argocd_health({}, script)
    assert chart.argocd_health({}, 'return {status = table.concat({"Hea", "lthy"})}') == \
        {"status": "Healthy"}


def test_argocd_cm_embeds_exactly_health_lua():
    configmap = yaml.safe_load((ARGOCD / "argocd-cm.yaml").read_text())
    kubernetes_validate.validate(configmap, KUBE_VERSION, strict=True)
    assert (configmap["metadata"]["name"], configmap["metadata"]["namespace"]) == ("argocd-cm", "argocd")
    assert configmap["data"] == {HEALTH_KEY: chart.HEALTH_LUA.read_text()}


def test_the_applications_sync_the_operator_before_the_ingestions():
    operator_app, ingestions_app = yaml.safe_load_all((ARGOCD / "applications.yaml").read_text())
    wave = lambda app: int(app["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"])  # noqa: E731
    assert wave(operator_app) < wave(ingestions_app)

    source = operator_app["spec"]["source"]
    assert REPOSITORY / source["path"] == chart.CHART
    manifests = chart.render(source["helm"]["valuesObject"], release=source["helm"]["releaseName"],
                             namespace=operator_app["spec"]["destination"]["namespace"])
    served = source["helm"]["valuesObject"].get("watchNamespaces")
    assert not served or ingestions_app["spec"]["destination"]["namespace"] in served
    assert chart.one(manifests, "Deployment")["metadata"]["namespace"] == "lakeslot-system"
    assert "ServerSideApply=true" in operator_app["spec"]["syncPolicy"]["syncOptions"]

    source = ingestions_app["spec"]["source"]
    files = sorted((REPOSITORY / source["path"]).glob(source["directory"]["include"]))
    assert files
    for path in files:
        assert validation.all_valid(validation.validate_text(path.read_text())), path
    assert "SkipDryRunOnMissingResource=true" in ingestions_app["spec"]["syncPolicy"]["syncOptions"]
    assert "prune" not in ingestions_app["spec"]["syncPolicy"]["automated"]
