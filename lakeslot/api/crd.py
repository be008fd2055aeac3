"""The PostgresIngestion CustomResourceDefinition, generated from the pydantic models.

``model_json_schema()`` is turned into a Kubernetes *structural* schema:

- ``$ref``/``$defs`` are inlined (the referring field's description and default win over the
  referenced class's);
- ``Optional[X]`` (``anyOf: [X, null]``) becomes plain ``X``: optional means "not in ``required``",
  never ``nullable``;
- ``const`` becomes a one-value ``enum``; ``title``, ``default: null`` and
  ``additionalProperties: false`` (which Kubernetes forbids next to ``properties``) are dropped;
- any other keyword, or any other union, is an error: the generator fails rather than emit a
  schema the API server would reject or interpret differently.

Every property must carry a description (it feeds ``kubectl explain`` and the reference page).
Rules (``x-kubernetes-validations``), list types and int-or-string markers come from the models
(``lakeslot.api.rules``, ``lakeslot.api.types``) and pass through unchanged.

At the root, ``apiVersion``/``kind`` are plain strings and ``metadata`` a bare object, as the API
server requires; ``status`` is a subresource with its own schema. Output is deterministic (keys
sorted), so the checked-in file can be compared byte for byte.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import yaml
from pydantic import BaseModel

from lakeslot.api.models import (
    CATEGORIES,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    PostgresIngestion,
)

CRD_NAME = f"{PLURAL}.{GROUP}"

_PASSED_THROUGH = {
    "type",
    "description",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "enum",
    "default",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "maxProperties",
    "format",
    "anyOf",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
}

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase."},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "Status of the Ready condition.",
    },
    {
        "name": "Lag",
        "type": "integer",
        "jsonPath": ".status.lagBytes",
        "description": "Bytes of WAL not yet reflected in Iceberg.",
    },
    {
        "name": "Behind",
        "type": "integer",
        "jsonPath": ".status.apply.lagSeconds",
        "description": "Seconds the furthest-behind streaming table lags its source (freshness).",
    },
    {"name": "Tables", "type": "integer", "jsonPath": ".status.tableCount", "description": "Tables replicated."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


class SchemaError(ValueError):
    """The models produce a schema that cannot be expressed as a structural CRD schema."""


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural schema of ``model`` (document field names, i.e. camelCase)."""
    raw = model.model_json_schema(by_alias=True)
    definitions = raw.pop("$defs", {})
    return _convert(raw, definitions, model.__name__)


@functools.cache
def _resource_schema() -> dict[str, Any]:
    return structural_schema(PostgresIngestion)


def resource_schema() -> dict[str, Any]:
    """The structural schema of a whole PostgresIngestion document, metadata fields included.

    A fresh copy each time: callers may modify it (defaulting inserts the schema's defaults).
    """
    return copy.deepcopy(_resource_schema())


def _inline(node: dict[str, Any], definitions: dict[str, Any], where: str) -> dict[str, Any]:
    """``node`` with its ``$ref`` or its ``Optional`` wrapper resolved (siblings win)."""
    siblings = {key: value for key, value in node.items() if key not in ("$ref", "anyOf")}
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        return _inline({**target, **siblings}, definitions, where)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        branches = [branch for branch in node["anyOf"] if branch.get("type") != "null"]
        if len(branches) != 1:
            raise SchemaError(f"{where}: a union of several types is not a structural schema")
        return _inline({**branches[0], **siblings}, definitions, where)
    return node


def _convert(node: dict[str, Any], definitions: dict[str, Any], where: str) -> dict[str, Any]:
    node = dict(_inline(node, definitions, where))
    node.pop("title", None)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("default", ...) is None:
        del node["default"]
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    unknown = set(node) - _PASSED_THROUGH
    if unknown:
        raise SchemaError(f"{where}: keywords not supported in a CRD schema: {sorted(unknown)}")
    if "properties" in node:
        node["properties"] = {
            name: _property(child, definitions, f"{where}.{name}") for name, child in node["properties"].items()
        }
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            node[key] = _convert(node[key], definitions, f"{where}.{key}")
    return node


def _property(node: dict[str, Any], definitions: dict[str, Any], where: str) -> dict[str, Any]:
    converted = _convert(node, definitions, where)
    if not converted.get("description"):
        raise SchemaError(f"{where}: every field needs a description")
    return converted


def openapi_schema() -> dict[str, Any]:
    """The CRD's ``openAPIV3Schema``."""
    document = resource_schema()
    properties = document["properties"]
    root_rules = document.get("x-kubernetes-validations")
    return {
        "description": document["description"],
        "type": "object",
        # Rules of the whole resource: CEL reads metadata.name there (and nothing else of metadata).
        **({"x-kubernetes-validations": root_rules} if root_rules else {}),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version: lakeslot.io/v1alpha1."},
            "kind": {"type": "string", "description": "Kind: PostgresIngestion."},
            "metadata": {"type": "object"},
            "spec": properties["spec"],
            "status": properties["status"],
        },
    }


def crd_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "lakeslot"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-trees out in full: no YAML anchors or aliases in the CRD."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def crd_yaml() -> str:
    header = "# Generated from lakeslot/api/models.py by `lakeslot crd --write`. Do not edit.\n"
    body = yaml.dump(crd_manifest(), Dumper=_PlainDumper, sort_keys=True, allow_unicode=True, width=100)
    return header + body
