"""Field paths in Kubernetes' dotted form (``spec.source.tables[0].name``) and schema lookup.

A location is a tuple of keys (str) and list indexes (int), as pydantic reports it; its dotted
form is what the API server prints in a 422. Map keys are printed dotted too, so a key that
itself contains dots (``sparkConf`` keys) is ambiguous in the dotted form: paths are for humans
and for the test cases, which avoid such keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

Location = tuple[str | int, ...]

_TOKEN = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]")


def format_path(loc: Iterable[str | int]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def parse_path(path: str) -> Location:
    """The location of a dotted path; also accepts relative paths such as ``.tables`` or ``[1]``."""
    parts: list[str | int] = []
    position = 0
    while position < len(path):
        match = _TOKEN.match(path, position)
        if not match:
            raise ValueError(f"not a field path: {path!r}")
        key, index = match.groups()
        parts.append(key if index is None else int(index))
        position = match.end()
    return tuple(parts)


def schema_at(schema: dict[str, Any], loc: Location) -> dict[str, Any] | None:
    """The schema node describing ``loc``, or None where the schema does not describe it."""
    node: Any = schema
    for part in loc:
        if isinstance(part, int):
            node = node.get("items")
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        else:
            node = node.get("additionalProperties")
        if not isinstance(node, dict):
            return None
    return node
