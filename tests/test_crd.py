"""The generated CRD: checked in and current, structural, agreeing with the models and cases."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel, Field

from lakeslot.api import models
from lakeslot.api.crd import SchemaError, crd_manifest, openapi_schema, structural_schema
from lakeslot.api.generated import generated_files
from lakeslot.api.paths import format_path, parse_path, schema_at
from lakeslot.api.reference import walk_schema
from lakeslot.api.rules import ApiModel
from tests.api_cases import EXAMPLES, INVALID_CASES, base_document

# The CEL functions and methods our rules use (all in the emulator and in Kubernetes; no macros).
CEL_FUNCTIONS = {"has", "size", "bytes", "startsWith", "matches", "all"}  # standard CEL, also in the emulator
NODE_KEYWORDS = {
    "type", "description", "properties", "required", "items", "additionalProperties", "enum", "default",
    "pattern", "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "maxProperties",
    "format", "anyOf",
    "x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
}  # fmt: skip


def version() -> dict[str, Any]:
    (served,) = crd_manifest()["spec"]["versions"]
    return served


@pytest.mark.parametrize("path", list(generated_files()), ids=lambda path: path.name)
def test_checked_in_file_is_current(path):
    assert path.read_text() == generated_files()[path], f"{path} is stale: run `lakeslot crd --write`"


def test_identity_and_subresources():
    spec = crd_manifest()["spec"]
    assert (spec["group"], spec["scope"]) == ("lakeslot.io", "Namespaced")
    assert spec["names"] == {
        "kind": "PostgresIngestion",
        "listKind": "PostgresIngestionList",
        "plural": "postgresingestions",
        "singular": "postgresingestion",
        "shortNames": ["pgi"],
        "categories": ["lakeslot"],
    }
    assert (version()["name"], version()["served"], version()["storage"]) == ("v1alpha1", True, True)
    assert version()["subresources"] == {"status": {}}
    assert [column["name"] for column in version()["additionalPrinterColumns"]] == [
        "Phase",
        "Ready",
        "Lag",
        "Behind",
        "Tables",
        "Age",
    ]


def test_printer_columns_point_at_status_fields():
    schema = openapi_schema()
    for column in version()["additionalPrinterColumns"]:
        path = column["jsonPath"].split("[?")[0].lstrip(".")
        if not path.startswith("metadata"):
            assert schema_at(schema, parse_path(path)) is not None, column


@pytest.mark.parametrize(
    ("path", "node", "role"),
    list(walk_schema(openapi_schema(), "")),
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_schema_is_structural(path, node, role):
    assert set(node) <= NODE_KEYWORDS, f"unsupported keywords: {set(node) - NODE_KEYWORDS}"
    if node.get("x-kubernetes-int-or-string"):
        assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}] and "type" not in node
    else:
        assert node.get("type") in {"object", "array", "string", "integer", "boolean", "number"}
        assert "anyOf" not in node
    assert not ("properties" in node and "additionalProperties" in node)
    if role in ("required", "optional") and path != ".metadata":
        assert node.get("description"), "every field needs a description"
    if "default" in node:
        jsonschema.validate(node["default"], node)
        for name in node.get("required", ()):
            assert name in node["default"], "a defaulted object must not require fields"
    if node.get("x-kubernetes-list-type") == "map":
        item = node["items"]
        for key in node["x-kubernetes-list-map-keys"]:
            assert key in item.get("required", ()) or "default" in item["properties"][key]
            assert item["properties"][key]["type"] in {"string", "integer", "boolean"}
    if node.get("x-kubernetes-list-type") == "set":
        assert node["items"]["type"] in {"string", "integer", "boolean"}


def test_metadata_is_left_to_the_api_server():
    assert openapi_schema()["properties"]["metadata"] == {"type": "object"}


def test_cel_rules_stay_in_the_emulator_subset():
    for _, node, _ in walk_schema(openapi_schema(), ""):
        for rule in node.get("x-kubernetes-validations", ()):
            assert set(re.findall(r"(\w+)\s*\(", rule["rule"])) <= CEL_FUNCTIONS, rule
            assert "\n" not in rule["message"]


def all_models(cls=ApiModel):
    for subclass in cls.__subclasses__():
        yield subclass
        yield from all_models(subclass)


def test_every_model_rule_is_in_the_crd():
    emitted = [
        rule for _, node, _ in walk_schema(openapi_schema(), "") for rule in node.get("x-kubernetes-validations", ())
    ]
    declared = [rule.kubernetes() for model in all_models() for rule in model.__dict__.get("rules", ())]
    assert declared and all(rule in emitted for rule in declared)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_examples_validate_against_the_openapi_schema(path):
    jsonschema.validate(yaml.safe_load(path.read_text()), openapi_schema())


def kube_path(error: jsonschema.ValidationError) -> str:
    """The path Kubernetes prints: a missing field is reported at the field, not at its parent."""
    missing = re.match(r"'(.+)' is a required property", error.message) if error.validator == "required" else None
    return format_path((*error.absolute_path, *([missing.group(1)] if missing else [])))


def server_rejection(case) -> str:
    """How the API server rejects a case: the schema, a list type, a CEL rule or pruning.

    jsonschema evaluates the OpenAPI part exactly; for the rest it checks that the CRD carries a
    list type or a CEL rule reported at the expected path (the offline tests show the rule fires).
    """
    document, schema = case.document(), openapi_schema()
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(document))
    if errors:
        assert case.path in [kube_path(error) for error in errors]
        return "schema"
    loc = parse_path(case.path)
    parent = schema_at(schema, loc[:-1]) or {}
    if isinstance(loc[-1], int) and parent.get("x-kubernetes-list-type") in ("map", "set"):
        return "list-type"
    for depth in range(len(loc), -1, -1):
        node = schema_at(schema, loc[:depth]) or {}
        for rule in node.get("x-kubernetes-validations", ()):
            if format_path(loc[:depth] + parse_path(rule.get("fieldPath", ""))) == case.path:
                return "cel"
    assert schema_at(schema, loc) is None, f"{case.id}: the CRD does not reject it"
    return "unknown-field"


@pytest.mark.parametrize("case", INVALID_CASES, ids=lambda case: case.id)
def test_the_crd_rejects_every_invalid_case_at_the_same_field(case):
    mechanism = server_rejection(case)
    assert (case.server_status == 400) == (mechanism == "unknown-field")


def test_the_base_document_of_the_cases_is_valid():
    jsonschema.validate(base_document(), openapi_schema())


def test_generator_refuses_what_kubernetes_would_refuse():
    class Undescribed(BaseModel):
        value: int

    class Union(BaseModel):
        value: int | str = Field(description="either")

    with pytest.raises(SchemaError, match="description"):
        structural_schema(Undescribed)
    with pytest.raises(SchemaError, match="union"):
        structural_schema(Union)


def test_defaults_in_the_crd_are_the_model_defaults():
    """Kubernetes defaulting of the minimal example yields the document pydantic would build."""

    def default(node: dict[str, Any], value: Any) -> Any:
        if isinstance(value, dict) and "properties" in node:
            for name, child in node["properties"].items():
                if name not in value and "default" in child:
                    value[name] = copy.deepcopy(child["default"])
                if name in value:
                    value[name] = default(child, value[name])
        if isinstance(value, list) and "items" in node:
            return [default(node["items"], item) for item in value]
        return value

    def without_empty(value: Any) -> Any:
        if isinstance(value, dict):
            pruned = {key: without_empty(item) for key, item in value.items()}
            return {key: item for key, item in pruned.items() if item not in ({}, [])}
        return [without_empty(item) for item in value] if isinstance(value, list) else value

    document = base_document()
    defaulted = default(openapi_schema(), base_document())
    parsed = models.PostgresIngestion.model_validate(document)
    assert models.PostgresIngestion.model_validate(defaulted) == parsed
    # ...and the CRD defaults every scalar pydantic defaults (lists and maps stay absent).
    dumped = parsed.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert without_empty(defaulted) == without_empty(dumped)
