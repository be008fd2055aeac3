"""Offline validation of PostgresIngestion documents, with messages for humans.

Every problem names the field (Kubernetes dotted path, the same the API server prints), says
what is wrong and how to fix it: the fix comes from the rule (cross-field rules), from the
schema (what the field accepts, its description), or from the nearest valid field name (typos,
snake_case). Offline validation rejects what the API server with the CRD rejects, and more: it
also refuses unknown fields (the server would prune them silently unless the client asks for
strict field validation) and needs ``metadata.name``.

YAML is read the way Kubernetes reads it: timestamps stay strings, YAML 1.1 booleans (``yes``,
``on``) are booleans, and a key repeated in one mapping is an error rather than "last one wins".

A file may hold several documents. Documents of other kinds (a Secret next to the ingestion) are
skipped; a document of group ``lakeslot.io`` or kind ``PostgresIngestion`` is validated in full,
so a misspelt version or kind is reported instead of skipped. Nothing here does I/O.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from lakeslot.api.crd import resource_schema
from lakeslot.api.models import GROUP, KIND, SPEC_SIZE_FIX, PostgresIngestion
from lakeslot.api.naming import (
    IngestionNames,
    TableName,
    collision_fix,
    effective_publication_name,
    effective_slot_name,
    namespace_of,
)
from lakeslot.api.paths import Location, format_path, parse_path, schema_at
from lakeslot.api.reference import expectation
from lakeslot.api.rules import RULE_ERROR, transition_violations


@dataclass(frozen=True)
class Problem:
    path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}\n    fix: {self.fix}"


@dataclass(frozen=True)
class DocumentReport:
    """The outcome for one document: ``resource`` is set exactly when it is a valid ingestion."""

    position: int  # 1-based position in the stream
    label: str
    problems: tuple[Problem, ...] = ()
    resource: PostgresIngestion | None = None
    notes: tuple[str, ...] = ()  # what to know about a valid document (it stays valid)

    @property
    def skipped(self) -> bool:
        return self.resource is None and not self.problems


class _KubernetesYamlLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


_KubernetesYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_documents(text: str) -> list[Any]:
    """The documents of a YAML stream, empty documents included (as None)."""
    return list(yaml.load_all(text, Loader=_KubernetesYamlLoader))


def parse_resource(document: Any) -> PostgresIngestion:
    """The model of one document; raises pydantic's ``ValidationError``. Aliases only (camelCase)."""
    return PostgresIngestion.model_validate(document, by_alias=True, by_name=False)


def _did_you_mean(loc: Location) -> str:
    parent = schema_at(resource_schema(), loc[:-1]) or {}
    valid = list(parent.get("properties", {}))
    key = str(loc[-1])
    if to_camel(key) in valid:
        return f"rename it to {to_camel(key)} (documents use camelCase)"
    by_lower = {name.lower(): name for name in valid}
    close = difflib.get_close_matches(key.lower(), by_lower, n=1, cutoff=0.6)
    if close:
        return f"did you mean {by_lower[close[0]]}? Rename {key} to {by_lower[close[0]]}"
    return "remove it; fields allowed here: " + ", ".join(valid) if valid else "remove it"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _problem(error: ErrorDetails) -> Problem:
    loc: Location = tuple(error["loc"])
    context = error.get("ctx", {})
    path = format_path(loc)
    if error["type"] == RULE_ERROR:
        return Problem(path, context["message"], context["fix"])
    if error["type"] == "extra_forbidden":
        return Problem(path, "unknown field", _did_you_mean(loc))
    if loc[-1] == "[key]":  # a map key of the wrong type
        return Problem(format_path(loc[:-2]), f"key {loc[-2]!r}: {error['msg']}", "quote the key")
    node = schema_at(resource_schema(), loc)
    about = f" ({node['description']})" if node and node.get("description") else ""
    if error["type"] == "missing":
        return Problem(path, "required field is missing", f"add {loc[-1]}: {expectation(node or {})}{about}")
    return Problem(path, f"{error['msg']} (got {_shown(error['input'])})", f"use {expectation(node or {})}{about}")


def problems_of(error: ValidationError) -> tuple[Problem, ...]:
    return tuple(_problem(item) for item in error.errors(include_url=False))


def validate_update(old: PostgresIngestion, new: PostgresIngestion) -> tuple[Problem, ...]:
    """The problems of replacing ``old`` by ``new`` (the CRD's transition rules, offline)."""
    return tuple(
        Problem(format_path(loc + parse_path(rule.field_path)), rule.message, rule.fix)
        for loc, rule in transition_violations(new, old)
    )


def _label(document: dict[str, Any]) -> str:
    metadata = document.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    namespace = namespace_of(metadata.get("namespace"))
    return f"{document.get('kind', '(no kind)')} {namespace}/{metadata.get('name', '(no name)')}"


def _is_ingestion(document: dict[str, Any]) -> bool:
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if api_version is None or kind is None:
        return True
    return str(api_version).split("/")[0] == GROUP or kind == KIND


def validate_document(position: int, document: Any) -> DocumentReport | None:
    """The report for one document; None for an empty document."""
    if document is None:
        return None
    if not isinstance(document, dict):
        problem = Problem(
            "(document)", f"not a mapping (got {_shown(document)})", "write the resource as a YAML mapping"
        )
        return DocumentReport(position, "(document)", (problem,))
    label = _label(document)
    if not _is_ingestion(document):
        return DocumentReport(position, label)
    try:
        resource = parse_resource(document)
    except ValidationError as error:
        return DocumentReport(position, label, problems_of(error))
    problems = mirror_name_problems(resource)
    return DocumentReport(position, label, problems, None if problems else resource,
                          notes=apply_notes(document))


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
ANNOTATIONS_MAX_BYTES = 256 * 1024  # all of an object's annotations, keys included


def apply_notes(document: dict[str, Any]) -> tuple[str, ...]:
    """What a client-side ``kubectl apply`` does with ``document``: it copies the manifest into
    the annotation :data:`LAST_APPLIED`, and the API server refuses an object whose annotations
    exceed :data:`ANNOTATIONS_MAX_BYTES`."""
    size = len(LAST_APPLIED) + len(json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode())
    if size <= ANNOTATIONS_MAX_BYTES:
        return ()
    return (f"the document is {size / 1024:,.0f} KiB as JSON: a plain `kubectl apply` copies it into the "
            f"{LAST_APPLIED} annotation, and the API server refuses annotations over "
            f"{ANNOTATIONS_MAX_BYTES // 1024} KiB; apply it with `kubectl apply --server-side` (Argo CD: "
            f"ServerSideApply=true), or {SPEC_SIZE_FIX}",)


def mirror_name_problems(ingestion: PostgresIngestion) -> tuple[Problem, ...]:
    """Listed tables that would share a mirror (or a mirror and a changelog table): known
    offline, unlike those a schema selection finds (preflight refuses those)."""
    names = IngestionNames.of(ingestion)
    listed = [TableName(t.schema_name, t.name) for t in ingestion.spec.source.tables]
    refused = names.collisions(listed)
    return tuple(Problem(f"spec.source.tables[{i}]", f"{table}: {refused[table]}",
                         collision_fix(table, names.table_template))
                 for i, table in enumerate(listed) if table in refused)


def validate_text(text: str) -> list[DocumentReport]:
    """Reports for every non-empty document of a YAML stream (one report for a YAML syntax error)."""
    try:
        documents = load_documents(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(yaml)"
        reason = getattr(error, "problem", None) or error
        problem = Problem(where, f"not valid YAML: {reason}", "correct the YAML there")
        return [DocumentReport(0, "YAML", (problem,))]
    reports = (validate_document(position, document) for position, document in enumerate(documents, start=1))
    return [report for report in reports if report is not None]


def all_valid(reports: list[DocumentReport]) -> bool:
    """True when there is at least one ingestion and no problem."""
    return any(report.resource for report in reports) and not any(report.problems for report in reports)


def _summary(report: DocumentReport) -> str:
    if report.problems:
        count = len(report.problems)
        return f"invalid, {count} problem{'s' if count > 1 else ''}"
    resource = report.resource
    if resource is None:  # report.skipped
        return "skipped (not a PostgresIngestion)"
    namespace = namespace_of(resource.metadata.namespace)
    name, source = resource.metadata.name, resource.spec.source
    return (
        f"valid (publication {effective_publication_name(namespace, name, source)}, "
        f"slot {effective_slot_name(namespace, name, source)})"
    )


def render(source: str, reports: list[DocumentReport]) -> str:
    """The human report for one input (a file name, or ``-`` for stdin)."""
    lines = []
    for report in reports:
        where = f"document {report.position}: {report.label}" if report.position else report.label
        lines.append(f"{source}: {where}: {_summary(report)}")
        lines += [f"  {str(problem).replace(chr(10), chr(10) + '  ')}" for problem in report.problems]
        lines += [f"  note: {note}" for note in report.notes]
    if not any(report.resource or report.problems for report in reports):
        lines.append(f"{source}: no PostgresIngestion document found")
    return "\n".join(lines)
