"""The generated CRD on a Kubernetes API server (the emulator, which evaluates the schema and the
CEL rules like kube-apiserver): it accepts the examples and rejects every invalid document of
tests/api_cases.py with 422 naming the same field ``lakeslot validate`` names."""

from __future__ import annotations

import json

import kubernetes.client
import pytest
import yaml
from kubernetes.client import ApiException

from lakeslot.api.cluster import INGESTION_NAME_MAX
from lakeslot.api.models import GROUP, PLURAL, VERSION
from tests.api_cases import BAD_NAMES, EXAMPLES, GOOD_NAMES, INVALID_CASES, UPDATE_CASES, apply_edits, base_document

NAMESPACE = "default"


@pytest.fixture
def objects(kube):
    with kube.api_client() as api_client:
        with open("crds/postgresingestions.lakeslot.io.yaml") as f:
            kubernetes.client.ApiextensionsV1Api(api_client).create_custom_resource_definition(
                yaml.safe_load(f))
        yield kubernetes.client.CustomObjectsApi(api_client)


def _namespace(document) -> str:
    return document["metadata"].get("namespace", NAMESPACE)


def _create(objects, document):
    return objects.create_namespaced_custom_object(GROUP, VERSION, _namespace(document), PLURAL,
                                                   document)


def _rejection(call) -> dict:
    with pytest.raises(ApiException) as caught:
        call()
    body = caught.value.body
    assert body is not None, "the rejection carries no body"
    return {**json.loads(body), "http": caught.value.status}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(objects, path):
    document = yaml.safe_load(path.read_text())
    stored = _create(objects, document)
    assert [t["name"] for t in stored["spec"]["source"]["tables"]] == \
        [t["name"] for t in document["spec"]["source"]["tables"]]
    assert {t["schema"] for t in stored["spec"]["source"]["tables"]} >= {"public"}  # defaulted


@pytest.mark.parametrize("case", [c for c in INVALID_CASES if c.server_status == 422],
                         ids=lambda c: c.id)
def test_invalid_documents_are_rejected_naming_the_field(objects, case):
    rejection = _rejection(lambda: _create(objects, case.document()))
    assert rejection["http"] == 422 and rejection["reason"] == "Invalid"
    fields = [cause.get("field") for cause in rejection["details"]["causes"]]
    assert case.path in fields, (case.path, rejection["message"])
    assert case.path in rejection["message"]


@pytest.mark.parametrize("case", [c for c in INVALID_CASES if c.server_status != 422],
                         ids=lambda c: c.id)
def test_unknown_fields_are_pruned_by_the_server(objects, case):
    stored = _create(objects, case.document())  # lakeslot validate rejects it; the server prunes
    *parents, last = case.path.split(".")
    node = stored
    for part in parents:
        node = node[part]
    assert last not in node


@pytest.mark.parametrize("case", UPDATE_CASES, ids=lambda c: c.id)
def test_immutable_and_monotonic_fields_reject_updates(objects, case):
    stored = _create(objects, case.old())
    new = case.new()
    new["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
    rejection = _rejection(lambda: objects.replace_namespaced_custom_object(
        GROUP, VERSION, _namespace(new), PLURAL, new["metadata"]["name"], new))
    assert rejection["http"] == 422
    assert case.path in [cause.get("field") for cause in rejection["details"]["causes"]], \
        rejection["message"]


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=list(BAD_NAMES))
def test_names_that_would_break_the_children_are_refused_at_admission(objects, name):
    """The rule reads metadata.name from the root (CEL may; the CRD schema leaves metadata to the
    server), so the server reports it at the resource with the message lakeslot validate gives."""
    rejection = _rejection(lambda: _create(objects, apply_edits(base_document(), (("metadata.name", name),))))
    assert rejection["http"] == 422 and rejection["reason"] == "Invalid"
    assert f"DNS-1035 label of at most {INGESTION_NAME_MAX} characters" in rejection["message"]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_names_up_to_the_limit_are_accepted(objects, name):
    assert _create(objects, apply_edits(base_document(), (("metadata.name", name),)))["metadata"]["name"] == name
