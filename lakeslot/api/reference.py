"""The Markdown reference of the PostgresIngestion resource, generated from the CRD schema.

It walks the same structural schema the CRD carries, so the documentation cannot disagree with the
API server: every field (path, what it accepts, default, description), the status fields, the
conditions, the annotations users set, every validation rule and the derived names. ``lakeslot crd
--write`` puts it between the markers of the reference page (``docs/reference.md``); a test fails
when that region is stale.

:func:`expectation` (what a schema node accepts, as a noun phrase) also writes the "fix" of
offline validation messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from lakeslot.api.annotations import ANNOTATIONS
from lakeslot.api.cluster import (
    CATALOG_CONF_PREFIX,
    DENIED_SPARK_CONF,
    QUIET_SLOW_EVENTS,
    REDACTION_CONF,
    RESERVED_SPARK_CONF,
    RESERVED_SPARK_CONF_PREFIXES,
    SPARK_REDACTION_REGEX,
    TUNING,
)
from lakeslot.api.crd import PRINTER_COLUMNS, openapi_schema
from lakeslot.api.models import API_VERSION, CONDITION_TYPES, KIND, SHORT_NAMES
from lakeslot.api.naming import HASH_DIGITS, default_replication_name
from lakeslot.api.types import IDENTIFIER_MAX_BYTES

Node = dict[str, Any]

# The examples are files of the repository, outside the documentation site: linked where they are
# published.
EXAMPLES_URL = "https://github.com/lakeslot/lakeslot/blob/main/examples"
CELL_MAX = 300  # characters of a table cell, as on every documentation page; more goes below


def _range(node: Node) -> str:
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None and high is not None:
        return f" from {low} to {high}"
    if low is not None:
        return f" ≥ {low}"
    return f" ≤ {high}" if high is not None else ""


def _string(node: Node) -> str:
    if node.get("format") == "date-time":
        return "an RFC 3339 time (UTC, for example 2024-05-01T12:00:00Z)"
    low, high = node.get("minLength", 0), node.get("maxLength")
    text = "a string"
    if high is not None:
        text += f" of {low} to {high} characters" if low else f" of at most {high} characters"
    elif low:
        text += " (not empty)"
    if "pattern" in node:
        text += f" matching `{node['pattern']}`"
    return text


def _list(node: Node) -> str:
    items = node["items"]
    text = "a list of objects" if items.get("type") == "object" else f"a list, each {expectation(items)}"
    if node.get("x-kubernetes-list-type") == "set":
        text += ", without duplicates"
    if node.get("x-kubernetes-list-type") == "map":
        text += f", unique by {' and '.join(node['x-kubernetes-list-map-keys'])}"
    if "maxItems" in node:
        text += f", at most {node['maxItems']}"
    return text


def expectation(node: Node) -> str:
    """What a schema node accepts, as a noun phrase ("an integer from 1 to 65535")."""
    if node.get("x-kubernetes-int-or-string"):
        return "an integer or a string"
    if "enum" in node:
        return "one of " + ", ".join(f"`{value}`" for value in node["enum"])
    kind = node.get("type")
    if kind == "string":
        return _string(node)
    if kind == "integer":
        return "an integer" + _range(node)
    if kind == "number":
        return "a number" + _range(node)
    if kind == "boolean":
        return "true or false"
    if kind == "array":
        return _list(node)
    values = node.get("additionalProperties")
    if isinstance(values, dict):
        return "a map of string keys to " + ("objects" if values.get("type") == "object" else expectation(values))
    return "an object"


def walk_schema(node: Node, path: str, role: str = "root") -> Iterator[tuple[str, Node, str]]:
    """(path, node, role) for ``node`` and every node below it, depth first in model order.

    role: ``required`` or ``optional`` for object fields, ``item`` for list entries, ``value``
    for map values, ``root`` for the starting node.
    """
    yield path, node, role
    required = set(node.get("required", ()))
    for name, child in node.get("properties", {}).items():
        yield from walk_schema(child, f"{path}.{name}", "required" if name in required else "optional")
    for key, suffix, child_role in (("items", "[]", "item"), ("additionalProperties", ".<key>", "value")):
        if isinstance(node.get(key), dict):
            yield from walk_schema(node[key], path + suffix, child_role)


# Characters of a code span that Markdown would still read once the span is written as HTML.
_MARKDOWN = {c: f"&#{ord(c)};" for c in "&<>|[]()*_`\\~"}


def _cell(text: str) -> str:
    """``text`` fit for a table cell: one line, ``|`` escaped. A code span holding ``|`` is
    written as HTML with the pipes (and whatever else Markdown would read) as entities: GitHub
    and the documentation site's Markdown disagree about ``\\|`` inside a code span (the site
    would show the backslash), and neither splits a cell on an entity."""
    parts = re.split(r"(`[^`]+`)", text.replace("\n", " "))
    return "".join(
        "<code>" + "".join(_MARKDOWN.get(c, c) for c in part[1:-1]) + "</code>"
        if part.startswith("`") and "|" in part else part.replace("|", "\\|")
        for part in parts)


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """A Markdown table of ``rows`` (raw texts; the first names the row). A cell longer than
    :data:`CELL_MAX` is shortened in the table — to its first sentence, or to "below" for code —
    and given whole in a list under the table, by the row's name."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    notes = []
    for row in rows:
        cells = [_cell(text) for text in row]
        for i, cell in enumerate(cells):
            if len(cell) > CELL_MAX:
                notes.append(f"- {cells[0]}, {header[i].lower()}: {cell}")
                cells[i] = _shortened(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "")


def _shortened(cell: str) -> str:
    """A long cell's stand-in in its table (see :func:`_table`)."""
    if cell.startswith(("`", "<code>")):
        return "(below)"
    end = cell.find(". ", 0, CELL_MAX - 20)
    if end > 0:
        return cell[:end + 1] + " (More below.)"
    cut = cell.rfind(" ", 0, CELL_MAX - 20)
    return cell[:cut] + "… (below)" if cut > 0 else "(below)"


def _default(node: Node, role: str) -> str:
    if "default" in node:
        return f"`{json.dumps(node['default'], ensure_ascii=False)}`"
    return "required" if role == "required" else "—"


def _field_table(node: Node, path: str) -> str:
    rows = [(f"`{field_path}`", expectation(child), _default(child, role), child["description"])
            for field_path, child, role in walk_schema(node, path) if role in ("required", "optional")]
    return _table(("Field", "Accepts", "Default", "Description"), rows)


def _rules_table(node: Node, path: str, root: Node | None = None) -> str:
    grouped: dict[tuple[str, str], list[str]] = {}
    for rule in (root or {}).get("x-kubernetes-validations", ()):  # the resource's own: metadata.name
        grouped.setdefault((rule["rule"], rule["message"]), []).append(
            f"`{rule['fieldPath'].lstrip('.')}`" if "fieldPath" in rule else "`metadata.name`")
    for node_path, child, _ in walk_schema(node, path):
        for rule in child.get("x-kubernetes-validations", ()):
            field_path = node_path + rule.get("fieldPath", "")
            grouped.setdefault((rule["rule"], rule["message"]), []).append(f"`{field_path}`")
    rows = [(", ".join(paths), f"`{cel}`" + (" (on update)" if "oldSelf" in cel else ""), message)
            for (cel, message), paths in grouped.items()]
    return _table(("Fields", "Rule (CEL)", "Message"), rows)


def _conditions_table() -> str:
    return _table(("Type", "Meaning"), [(f"`{type_}`", meaning) for type_, meaning in CONDITION_TYPES.items()])


def _annotations_table() -> str:
    return _table(("Annotation", "Meaning"), [(f"`{name}`", meaning) for name, meaning in ANNOTATIONS.items()])


def _columns_table() -> str:
    lines = ["| Column | Source |", "| --- | --- |"]
    lines += [f"| {column['name']} | `{_cell(column['jsonPath'])}` |" for column in PRINTER_COLUMNS]
    return "\n".join(lines)


def _names_section() -> str:
    examples = [("prod", "orders"), ("team-a", "orders.v2"), ("analytics", "x" * 60)]
    kept = IDENTIFIER_MAX_BYTES - HASH_DIGITS - 1
    lines = [
        "When `spec.source.publicationName` or `spec.source.slotName` is empty, the operator uses",
        "`lakeslot_<namespace>_<name>`: lower case, every character outside `[a-z0-9_]` replaced by `_`.",
        f"When a character was replaced or the result exceeds {IDENTIFIER_MAX_BYTES} bytes, it is cut to "
        f"{kept} bytes and `_` plus",
        f"{HASH_DIGITS} hex digits of SHA-256(`<namespace>/<name>`) are appended, so two resources of one "
        "cluster do not share",
        "a slot. The default is not stored in the spec; the effective names are reported in",
        "`status.publicationName` and `status.slot.name`. Once set, both spec fields are immutable.",
        "",
        "| Resource | Default publication and slot name |",
        "| --- | --- |",
    ]
    lines += [
        f"| `{namespace}/{name}` | `{default_replication_name(namespace, name)}` |" for namespace, name in examples
    ]
    return "\n".join(lines)


def _spark_conf_section() -> str:
    denied = ", ".join(f"`{key}`" for key in DENIED_SPARK_CONF)
    reserved = ", ".join(f"`{key}`" for key in RESERVED_SPARK_CONF)
    prefixes = ", ".join(f"`{prefix}*`" for prefix in RESERVED_SPARK_CONF_PREFIXES)
    return "\n".join([
        "`spec.spark.sparkConf` refuses two kinds of keys (rules above):",
        "",
        f"- denied by spark-operator 2.5's webhook (kubeflow/spark-operator "
        f"`internal/webhook/sparkconf_validator.go`), which would refuse every SparkApplication: {denied} "
        "(the webhook accepts `spark.kubernetes.namespace` only when it equals the application's "
        "namespace; lakeslot always runs applications in the ingestion's namespace, so it refuses the key);",
        f"- set by lakeslot itself, which a value of yours would silently replace: {reserved}, {prefixes}, "
        f"and `{CATALOG_CONF_PREFIX}<sink.catalog.name>` with its sub-keys.",
        "",
        "Defaults lakeslot sets, which a value of yours replaces: "
        + ", ".join(f"`{key}` = `{value}`" for key, value in TUNING.items())
        + " (Python workers start without the archives Spark puts on their path, 25 ms less "
        "per task; the apply job's MERGE builds a hash table of the changes when every shuffle "
        "partition of them is at most 64 MB, instead of sorting the mirror: 2.0 s against "
        "3.3–4.0 s for 100k changes into a 5M-row table).",
        "",
        "The values of two of those, which keep the catalog's Secret-backed properties out of "
        f"Spark's logs and event log: `{REDACTION_CONF}` = `{SPARK_REDACTION_REGEX}` "
        "(Spark's default) and the session keys of `sink.catalog.secretProperties` (Spark redacts "
        "keys or values that match it, and `credential` or `s3.access-key-id` match none of its "
        "words), "
        + ", ".join(f"`{key}` = `{value}`" for key, value in QUIET_SLOW_EVENTS.items())
        + " (Spark's line about a slow event listener shows a job's properties, every session "
        "setting among them, unredacted).",
    ])


def reference_markdown() -> str:
    schema = openapi_schema()
    spec, status = schema["properties"]["spec"], schema["properties"]["status"]
    sections = [
        f"`apiVersion: {API_VERSION}`, `kind: {KIND}` (short name `{SHORT_NAMES[0]}`), namespaced. "
        f"Examples: [examples/ingestion.yaml]({EXAMPLES_URL}/ingestion.yaml) (minimal) and "
        f"[examples/ingestion-full.yaml]({EXAMPLES_URL}/ingestion-full.yaml) (every field). Check a file "
        "offline with `lakeslot validate -f FILE`. Lists and maps that are left out are empty.",
        "## Spec\n\n" + _field_table(spec, "spec"),
        "## Status\n\nWritten by the operator only (status subresource).\n\n" + _field_table(status, "status"),
        "## Conditions\n\n" + _conditions_table(),
        "## Annotations\n\nRequests to the operator, set with `kubectl annotate pgi <name> <annotation>=<value>`; "
        "they change neither the spec nor its generation.\n\n" + _annotations_table(),
        "## Printer columns\n\n" + _columns_table(),
        "## Validation rules\n\nEnforced by the API server (CEL) and by `lakeslot validate` alike; "
        "rules marked *on update* compare with the stored object.\n\n" + _rules_table(spec, "spec", schema),
        "## Spark configuration keys\n\n" + _spark_conf_section(),
        "## Names\n\n" + _names_section(),
    ]
    return "\n\n".join(sections) + "\n"
