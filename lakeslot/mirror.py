"""Reading the mirror tables' progress from Iceberg itself.

By DESIGN.md invariant 1, every commit on a mirror table records in its snapshot summary
(``lakeslot.lsn``) the source LSN the table reflects. So the truth about how far a table got is
in the table, not in any side file: the operator and ``lakeslot status`` read it here, read-only,
with pyiceberg (no Spark, no JVM).

- A table that does not exist, or whose current snapshot has no ``lakeslot.lsn``, has no
  progress (``None``): it has not been snapshotted yet.
- An idle table advances too: the apply job commits an empty snapshot carrying the new
  ``lakeslot.lsn`` (no data rewritten), so its progress moves with the others.
- A table the apply job stopped carries its definite error in table properties
  (``lakeslot.apply-error``, in force while ``lakeslot.apply-error-lsn`` equals the table's
  position; :func:`apply_error`): ``error`` and ``resnapshot_required`` report it.
- hadoop catalogs are read from their metadata files (``version-hint.text`` names the current
  ``v<N>.metadata.json``); other catalog types through ``pyiceberg.catalog.load_catalog`` with
  the spec's uri, warehouse and properties.

Failure modes: an unreachable catalog or warehouse raises (the caller reports it as a
condition); a corrupt ``lakeslot.lsn`` raises ``ValueError`` rather than being guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import load_file_io
from pyiceberg.table import StaticTable, Table

from lakeslot.api.models import CatalogSpec, SinkSpec
from lakeslot.api.naming import iceberg_table_name
from lakeslot.source.tables import TableName

LSN_PROPERTY = "lakeslot.lsn"
ERROR_PROPERTY = "lakeslot.apply-error"
ERROR_LSN_PROPERTY = "lakeslot.apply-error-lsn"
RESNAPSHOT_PROPERTY = "lakeslot.resnapshot-required"
SNAPSHOT_LSN_PROPERTY = "lakeslot.snapshot-lsn"  # set by the snapshot job (lakeslot.snapshot.mirror)
GENERATION_PROPERTY = "lakeslot.snapshot-generation"  # likewise

# Mirror and changelog tables get a commit per apply pass: without these, every commit's metadata
# file would stay forever. ``sink.tableProperties`` override them; format v2 is not negotiable.
TABLE_DEFAULTS = {"write.metadata.delete-after-commit.enabled": "true",
                  "write.metadata.previous-versions-max": "100"}


def table_properties(user: Mapping[str, str]) -> dict[str, str]:
    """The properties of a table lakeslot creates, from ``sink.tableProperties``."""
    return {**TABLE_DEFAULTS, **user, "format-version": "2"}


@dataclass(frozen=True)
class MirrorProgress:
    lsn: int | None  # lakeslot.lsn of the current snapshot; None: nothing committed by lakeslot
    rows: int | None  # total-records of the current snapshot
    committed_at_ms: int | None
    error: str | None = None  # the apply job stopped the table (definite error), and why
    resnapshot_required: bool = False  # the way out of ``error`` is a re-snapshot
    snapshot_lsn: int | None = None  # lakeslot.snapshot-lsn: where the table's snapshot was taken


def apply_error(properties: Mapping[str, str], lsn: int | None) -> str | None:
    """The apply job's definite error recorded in table ``properties``, if still in force: a
    re-snapshot moves the table's position ``lsn`` and so lifts it."""
    if ERROR_PROPERTY in properties and properties.get(ERROR_LSN_PROPERTY) == str(lsn):
        return properties[ERROR_PROPERTY]
    return None


def identifier(sink: SinkSpec, table: TableName) -> tuple[str, ...]:
    """The mirror table's Iceberg identifier: namespace levels + table name."""
    return (*sink.namespace.split("."),
            iceberg_table_name(sink.table_name_template, table.schema, table.name))


def load_hadoop_table(warehouse: str, ident: tuple[str, ...],
                      properties: Mapping[str, str] | None = None) -> Table | None:
    """The current state of a hadoop-catalog table, or None when it does not exist."""
    location = "/".join([warehouse.rstrip("/"), *ident])
    io = load_file_io(dict(properties or {}), location)
    hint = io.new_input(f"{location}/metadata/version-hint.text")
    if not hint.exists():
        return None
    with hint.open() as f:
        version = int(f.read().decode().strip())
    return StaticTable.from_metadata(f"{location}/metadata/v{version}.metadata.json",
                                     dict(properties or {}))


def _load(catalog: CatalogSpec, ident: tuple[str, ...]) -> Table | None:
    if catalog.type == "hadoop":
        return load_hadoop_table(catalog.warehouse, ident, catalog.properties)
    from pyiceberg.catalog import load_catalog

    options = {"type": catalog.type, **catalog.properties}
    options.update({k: v for k, v in (("uri", catalog.uri), ("warehouse", catalog.warehouse)) if v})
    try:
        return load_catalog(catalog.name, **options).load_table(ident)
    except NoSuchTableError:
        return None


def progress_of(table: Table | None) -> MirrorProgress:
    snapshot = table.current_snapshot() if table is not None else None
    if snapshot is None:
        return MirrorProgress(None, None, None)
    summary = snapshot.summary
    lsn = summary[LSN_PROPERTY] if summary is not None else None
    rows = summary["total-records"] if summary is not None else None
    position = int(lsn) if lsn is not None else None
    error = apply_error(table.properties, position)
    taken = table.properties.get(SNAPSHOT_LSN_PROPERTY)
    return MirrorProgress(position, int(rows) if rows is not None else None, snapshot.timestamp_ms,
                          error, error is not None and table.properties.get(RESNAPSHOT_PROPERTY) == "true",
                          int(taken) if taken is not None else None)


def progress(sink: SinkSpec, tables: Iterable[TableName]) -> dict[TableName, MirrorProgress]:
    return {t: progress_of(_load(sink.catalog, identifier(sink, t))) for t in tables}
