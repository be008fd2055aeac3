"""How PostgreSQL column types land in Iceberg: the one place that decides it.

This module classifies a column type (after resolving domains to their base type and arrays to
their element type) into one of three kinds:

- ``NATIVE``: a faithful Arrow/Iceberg type exists (integers, numerics, floats, bool, strings,
  bytea, uuid, dates and times, json/jsonb, enums as strings, inet/cidr/macaddr/money/xml as
  strings, arrays of these as lists).
- ``TEXT``: no Arrow type carries the value faithfully, so the column is kept as PostgreSQL's
  own text form (ranges, multiranges, composite types, geometric types, bit strings, tsvector,
  tsquery, pg_lsn, and types from extensions such as hstore or ltree). Text is lossless:
  PostgreSQL can read every such value back from it.
- ``UNSUPPORTED``: the text form is not a stable rendering of the value. The ``reg*`` OID alias
  types (``regclass``, ``regtype``…) print a name looked up in the catalog at decode time, so the
  snapshot and the stream could write different text for the same stored OID. Pseudo-types
  cannot be column types at all.

Failure mode: an unknown base type is ``TEXT`` (never silently dropped, never guessed).
"""

from __future__ import annotations

import enum

NATIVE_TYPES = frozenset({
    "int2", "int4", "int8", "numeric", "float4", "float8", "bool", "text", "varchar", "bpchar",
    "char", "name", "bytea", "uuid", "date", "time", "timetz", "timestamp", "timestamptz",
    "interval", "json", "jsonb", "inet", "cidr", "macaddr", "macaddr8", "money", "xml", "oid",
})
UNSUPPORTED_TYPES = frozenset({
    "regclass", "regcollation", "regconfig", "regdictionary", "regnamespace", "regoper",
    "regoperator", "regproc", "regprocedure", "regrole", "regtype",
})


class Kind(enum.Enum):
    NATIVE = "native"
    TEXT = "text"
    UNSUPPORTED = "unsupported"


def classify(base_type: str, typtype: str) -> tuple[Kind, str]:
    """Kind and reason for a base (domain-resolved, array-element) type.

    ``typtype`` is ``pg_type.typtype``: b(ase), c(omposite), d(omain), e(num), p(seudo),
    r(ange), m(ultirange)."""
    if typtype == "e":
        return Kind.NATIVE, "enum values are stored as strings"
    if base_type in UNSUPPORTED_TYPES:
        return Kind.UNSUPPORTED, (
            f"{base_type} prints a catalog name looked up when the value is read, so the same "
            "stored OID could land as different text; cast it (e.g. a generated column of type "
            "oid or text) or exclude the column")
    if typtype == "p":
        return Kind.UNSUPPORTED, f"{base_type} is a pseudo-type"
    if base_type in NATIVE_TYPES:
        return Kind.NATIVE, ""
    return Kind.TEXT, f"{base_type} has no faithful Iceberg type: kept as PostgreSQL text"
