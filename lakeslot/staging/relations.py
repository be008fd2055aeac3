"""Relation descriptions as recorded in segments: a table's identity, replica identity and
columns (with their type names), as pgoutput's Relation message (plus Type messages and the
catalog for type names) describes them at a point of the stream.

Invariants: a description is immutable and compares by value, so a changed description (ADD or
DROP COLUMN, a type change, a new replica identity) is a different value; ``as_dict`` and
``from_dict`` round-trip exactly (the segment footer stores ``as_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int
    key: bool  # part of the replica identity (every column under REPLICA IDENTITY FULL)
    type_schema: str | None = None
    type_name: str | None = None


@dataclass(frozen=True)
class Relation:
    oid: int
    schema: str
    table: str
    replica_identity: str  # default | nothing | full | index
    columns: tuple[Column, ...]

    def as_dict(self) -> dict:
        return {"oid": self.oid, "schema": self.schema, "table": self.table,
                "replica_identity": self.replica_identity,
                "columns": [vars(c).copy() for c in self.columns]}

    @classmethod
    def from_dict(cls, d: Mapping) -> Relation:
        return cls(d["oid"], d["schema"], d["table"], d["replica_identity"],
                   tuple(Column(**c) for c in d["columns"]))
