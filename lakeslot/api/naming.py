"""Names lakeslot derives: default publication and slot names, and Iceberg table names.

Pure functions, no I/O.

Default publication and slot name (when the spec leaves them empty): ``lakeslot_<namespace>_<name>``
with every character outside ``[a-z0-9_]`` replaced by ``_``. Invariants:

- the result is a valid slot name (``[a-z0-9_]``, at most 63 bytes), so the same default serves
  the publication and the slot (PostgreSQL keeps them in separate namespaces);
- it depends only on namespace and name (stable across operator restarts and versions);
- two different resources get different names: when a replacement made the mapping lossy
  (``a-b/c`` and ``a/b-c`` would both read ``lakeslot_a_b_c``) or the name had to be cut to 63
  bytes, a hash of the exact ``namespace/name`` is appended (``_`` + 8 hex digits). Names without
  ``-`` or ``.`` stay readable: ``prod/orders`` → ``lakeslot_prod_orders``.

Not covered: two Kubernetes clusters whose resources share namespace and name and point at the
same database would share the default; set ``slotName`` explicitly in that case.

The operator reports the effective names in ``status.publicationName`` and ``status.slot.name``.

:class:`IngestionNames` is the one place every component takes these names from (operator,
local mode, the Spark jobs, the reader's command line): namespace (``default`` when the resource
has none), owner (``namespace/name``, the ingestion's identity in ``application_name``, logs and
the publication's ownership comment), slot, publication, and the mirror table of a source table.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakeslot.api.models import PostgresIngestion, SourceSpec
from lakeslot.api.types import IDENTIFIER_MAX_BYTES

if TYPE_CHECKING:
    from lakeslot.source.tables import TableName

PREFIX = "lakeslot"
HASH_DIGITS = 8
_UNSAFE = re.compile(r"[^a-z0-9_]")


def default_replication_name(namespace: str, name: str) -> str:
    """The default publication and slot name of the resource ``namespace/name``."""
    readable = f"{PREFIX}_{namespace}_{name}".lower()
    safe = _UNSAFE.sub("_", readable)
    if safe == readable and len(safe) <= IDENTIFIER_MAX_BYTES:
        return safe
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:HASH_DIGITS]
    return f"{safe[: IDENTIFIER_MAX_BYTES - HASH_DIGITS - 1]}_{digest}"


def effective_publication_name(namespace: str, name: str, source: SourceSpec) -> str:
    return source.publication_name or default_replication_name(namespace, name)


def effective_slot_name(namespace: str, name: str, source: SourceSpec) -> str:
    return source.slot_name or default_replication_name(namespace, name)


def iceberg_table_name(template: str, schema: str, table: str) -> str:
    """The mirror table name for a source table (see ``sink.tableNameTemplate``).

    Lower-cased, and every character outside ``[a-z0-9_]`` becomes ``_``, so the name is valid
    in every catalog type (Glue accepts only lower case) without quoting. The mapping is lossy on
    purpose; the preflight rejects two tables that map to one name.
    """
    filled = template.replace("{schema}", schema).replace("{table}", table)
    return _UNSAFE.sub("_", filled.lower())


def namespace_of(namespace: str | None) -> str:
    """The resource's namespace; ``default`` when it has none (a manifest without one)."""
    return namespace or "default"


@dataclass(frozen=True)
class IngestionNames:
    """Every name derived from one PostgresIngestion (see the module docstring)."""

    namespace: str
    name: str
    slot: str
    publication: str
    sink_namespace: str  # spec.sink.namespace: dot-separated Iceberg namespace levels
    table_template: str  # spec.sink.tableNameTemplate

    @classmethod
    def of(cls, ingestion: PostgresIngestion) -> IngestionNames:
        namespace = namespace_of(ingestion.metadata.namespace)
        name, spec = ingestion.metadata.name, ingestion.spec
        return cls(namespace, name,
                   effective_slot_name(namespace, name, spec.source),
                   effective_publication_name(namespace, name, spec.source),
                   spec.sink.namespace, spec.sink.table_name_template)

    @property
    def owner(self) -> str:
        """``namespace/name``: the ingestion's identity in application_name, logs and events."""
        return f"{self.namespace}/{self.name}"

    def mirror_table(self, table: TableName) -> str:
        """The mirror table's name inside ``spec.sink.namespace``."""
        return iceberg_table_name(self.table_template, table.schema, table.name)

    def mirror_identifier(self, table: TableName) -> tuple[str, ...]:
        """The mirror table's Iceberg identifier: namespace levels + table name."""
        return (*self.sink_namespace.split("."), self.mirror_table(table))
