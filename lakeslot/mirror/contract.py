"""Names and defaults of the mirror-table contract (DESIGN.md "Data contracts").

Invariants:

- Every commit on a mirror table carries :data:`LSN_PROPERTY` in its snapshot summary: after it
  the table equals the source table as of that LSN (DESIGN.md invariant 1).
- Table properties (they survive compaction and snapshot expiry, a summary property does not):
  :data:`GENERATION_PROPERTY` and :data:`SNAPSHOT_LSN_PROPERTY` are set by the snapshot in the
  same commit as the data, and so is :data:`SOURCE_FACTS_PROPERTY` (the source table's OID,
  columns' attnums and partitions as of the snapshot, updated when the apply job adds columns);
  :data:`BACKFILL_PROPERTY` by the apply job in the commit that adds a
  column with a default; :data:`PARTITION_PROPERTY` (the table's ``partitionBy``, canonical) in
  every commit that sets the partition spec from it; the error properties by the apply job when
  it stops a table — the error is in force only while the table's position equals
  :data:`ERROR_LSN_PROPERTY` (:func:`apply_error`), so a re-snapshot, which moves the position,
  lifts it; a retryable error (:mod:`lakeslot.apply.isolation`) also carries
  :data:`RETRY_AT_PROPERTY` and :data:`FAILURES_PROPERTY`, and the apply pass that works again
  lifts it.
- Ownership: :data:`OWNER_PROPERTY`, :data:`SOURCE_TABLE_PROPERTY` and :data:`SOURCE_OID_PROPERTY`
  are set when lakeslot creates or replaces a table (:func:`ownership`), and the jobs write a
  table only when they name this ingestion and this source table
  (:func:`ownership_problem`): two source tables — or two ingestions — never share a mirror.
  A table from before these properties existed is adopted: the apply job records them.
- Columns: the source's, plus :data:`LSN_COLUMN` (commit LSN of the row's last change) in the
  mirror; the changelog table adds :data:`OP_COLUMN` and :data:`SEQ_COLUMN`.
- :class:`TableState` reads a table's properties by these rules (what the apply job decides on);
  a commit planned from a state whose position the table no longer has is refused
  (:class:`Moved`).
- Tables lakeslot creates are format v2 with :data:`TABLE_DEFAULTS` unless
  ``sink.tableProperties`` says otherwise (format v2 is not negotiable).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType

# snapshot summary properties
LSN_PROPERTY = "lakeslot.lsn"
RESNAPSHOT_SUMMARY = "lakeslot.control.resnapshot"  # "true" on the commit that replaced a snapshotted table
MAINTENANCE_SUMMARY = "lakeslot.maintenance"  # compaction | delete-files | manifests

# table properties
SNAPSHOT_LSN_PROPERTY = "lakeslot.snapshot-lsn"
GENERATION_PROPERTY = "lakeslot.snapshot-generation"
BACKFILL_PROPERTY = "lakeslot.backfill"
SOURCE_FACTS_PROPERTY = "lakeslot.source-facts"  # lakeslot.source.facts.TableFacts as JSON
SCHEMA_CHANGE_PROPERTY = "lakeslot.schema-change"  # the last DDL applied in place, and where
ERROR_PROPERTY = "lakeslot.apply-error"
ERROR_LSN_PROPERTY = "lakeslot.apply-error-lsn"
RESNAPSHOT_PROPERTY = "lakeslot.control.resnapshot-required"  # "true", or RESNAPSHOT_AUTOMATIC
RETRY_AT_PROPERTY = "lakeslot.apply-error-retry-at"  # a retryable error: when it is tried again
FAILURES_PROPERTY = "lakeslot.apply-error-failures"  # ... and how many times in a row it failed
ERROR_PROPERTIES = (ERROR_PROPERTY, ERROR_LSN_PROPERTY, RESNAPSHOT_PROPERTY,
                    RETRY_AT_PROPERTY, FAILURES_PROPERTY)
MAINTENANCE_PROPERTY = "lakeslot.last-maintenance"  # the last maintenance run's outcome, as text
MAINTENANCE_AT_PROPERTY = "lakeslot.last-maintenance-at"  # ... when it ran (Unix seconds)
MAINTENANCE_SECONDS_PROPERTY = "lakeslot.last-maintenance-seconds"  # ... how long it took
ORPHANS_AT_PROPERTY = "lakeslot.last-orphan-removal-at"  # when orphan files were last removed
PARTITION_PROPERTY = "lakeslot.partition-by"  # the partitionBy the mirror's spec was last set to
OWNER_PROPERTY = "lakeslot.owner"  # the ingestion that owns the table: namespace/name
SOURCE_TABLE_PROPERTY = "lakeslot.source-table"  # the source table it mirrors: "schema"."table"
SOURCE_OID_PROPERTY = "lakeslot.source-oid"  # ... and that table's OID when it was copied
RESNAPSHOT_AUTOMATIC = "automatic"  # lakeslot copies the table again by itself (onSchemaChange)

# columns
LSN_COLUMN = "_lakeslot_lsn"
OP_COLUMN = "_lakeslot_op"
SEQ_COLUMN = "_lakeslot_seq"
OWN_COLUMNS = (LSN_COLUMN, OP_COLUMN, SEQ_COLUMN)

# Mirror and changelog tables get a commit per apply pass: without the first two, every commit's
# metadata file would stay forever. Merge-on-read: a MERGE writes the changed rows and position
# deletes instead of rewriting every data file a change touches, so its cost follows the changes,
# not the table (bench/apply_throughput.py --merge-mode); the apply job's maintenance
# (lakeslot.mirror.maintenance_policy) compacts what it leaves behind. ``sink.tableProperties`` override
# them.
TABLE_DEFAULTS = {"write.metadata.delete-after-commit.enabled": "true",
                  "write.metadata.previous-versions-max": "100",
                  "write.merge.mode": "merge-on-read",
                  "write.update.mode": "merge-on-read",
                  "write.delete.mode": "merge-on-read"}


# History (docs/maintenance.md "What a mirror keeps"): every commit rewrites the table's metadata
# file, which lists every snapshot kept (3,600 snapshots: a 2.7 MB file, and a commit cost 2.6×
# that of a fresh table), so what a table keeps is bounded whatever the trigger:
# - every snapshot of the last RECENT_PASSES passes (at most Iceberg's 5 days): time travel and
#   every cut of that window;
# - beyond it, the snapshots of one *retained* cut per RETAINED_EVERY_S (the cuts record marks it,
#   lakeslot.mirror.cuts), tagged CUT_TAG_PREFIX + its LSN with a maximum age of RETAINED_FOR_S:
#   Iceberg's expiry keeps tagged snapshots, and drops the tag once it is older.
# A table that sets history.expire.max-snapshot-age-ms itself keeps what it says (and the tags).
# Expiry runs once a table made a pass's worth of commits since the last (lakeslot.apply.upkeep),
# so the snapshots beyond the window are bounded by commits too, whatever a pass takes.
MAX_SNAPSHOT_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"
ICEBERG_MAX_SNAPSHOT_AGE_S = 5 * 24 * 3600.0
RECENT_PASSES = 100
RETAINED_EVERY_S = 3600.0
RETAINED_FOR_S = ICEBERG_MAX_SNAPSHOT_AGE_S
CUT_TAG_PREFIX = "lakeslot-cut-"


def history_age_s(trigger_interval_seconds: float) -> float:
    """How far back the apply job keeps every snapshot of a table that does not say (the recent
    window; retained cuts' snapshots are kept longer, by tag)."""
    return min(ICEBERG_MAX_SNAPSHOT_AGE_S, RECENT_PASSES * trigger_interval_seconds)


def cut_tag(lsn: int) -> str:
    """The tag that keeps a table's snapshot of the retained cut at ``lsn``."""
    return f"{CUT_TAG_PREFIX}{lsn:016X}"


def table_properties(user: Mapping[str, str]) -> dict[str, str]:
    """The properties of a table lakeslot creates, from ``sink.tableProperties``."""
    return {**TABLE_DEFAULTS, **user, "format-version": "2"}


def apply_error(properties: Mapping[str, str], lsn: int | None) -> str | None:
    """The apply job's definite error recorded in table ``properties``, if still in force: a
    re-snapshot moves the table's position ``lsn`` and so lifts it."""
    if ERROR_PROPERTY in properties and properties.get(ERROR_LSN_PROPERTY) == str(lsn):
        return properties[ERROR_PROPERTY]
    return None


def ownership(owner: str, table: str, oid: int | None) -> dict[str, str]:
    """The properties that say which ingestion (``namespace/name``) and which source table
    (``table``: its quoted qualified name, and ``oid``) a mirror belongs to."""
    recorded = {OWNER_PROPERTY: owner, SOURCE_TABLE_PROPERTY: table}
    if oid is not None:
        recorded[SOURCE_OID_PROPERTY] = str(oid)
    return recorded


def ownership_problem(properties: Mapping[str, str], mirror: str, owner: str,
                      table: str) -> str | None:
    """Why ingestion ``owner`` may not write source table ``table`` into the Iceberg table
    ``mirror`` whose ``properties`` these are (None: it may — its own, or not recorded yet)."""
    recorded_owner = properties.get(OWNER_PROPERTY)
    recorded_table = properties.get(SOURCE_TABLE_PROPERTY)
    if recorded_owner is None and recorded_table is None:
        return None
    if recorded_owner == owner and recorded_table == table:
        return None
    holder = f"source table {recorded_table} of ingestion {recorded_owner}"
    return (f"Iceberg table {mirror} is the mirror of {holder}, not of {table} of ingestion "
            f"{owner}: lakeslot never writes one table's changes into another's mirror; give "
            f"{table} another mirror name (mirrorName in spec.source.tables, "
            "sink.tableNameTemplate or sink.namespace)")


class Moved(Exception):
    """A table's position is no longer the one a commit was planned from: another job committed
    to it since it was read (a re-snapshot). Nothing was committed; the change is planned again
    from the table as it is."""


@dataclass(frozen=True)
class TableState:
    """A table as the catalog has it now (``covered``: as the apply job knows it, see
    :attr:`position`)."""

    lsn: int | None  # lakeslot.lsn of the current snapshot
    schema: Schema
    properties: dict[str, str]
    covered: int | None = None  # nothing of the table is staged above lsn up to this (coverage)

    @property
    def position(self) -> int:
        """Where the table's changes start, of a table known to have a ``lsn`` (the apply job
        works only on such tables: one without waits for its snapshot; evolving or backfilling a
        table keeps it): ``lsn``, or the position an idle table is covered to above it
        (:mod:`lakeslot.apply.coverage`). Errors are recorded at ``lsn``, the committed one."""
        assert self.lsn is not None, "the table has no lakeslot.lsn yet"
        return self.covered if self.covered is not None else self.lsn

    @property
    def error(self) -> str | None:
        """The recorded definite error, if still in force (see the module docstring)."""
        return apply_error(self.properties, self.lsn)

    @property
    def resnapshot_required(self) -> bool:
        return self.properties.get(RESNAPSHOT_PROPERTY) in ("true", RESNAPSHOT_AUTOMATIC)

    @property
    def retry(self) -> tuple[float, int] | None:
        """A retryable error's (when it is tried again, failures in a row); None otherwise."""
        at = self.properties.get(RETRY_AT_PROPERTY)
        if at is None:
            return None
        return float(at), int(self.properties.get(FAILURES_PROPERTY, "1"))

    @property
    def stale_error(self) -> bool:
        return ERROR_PROPERTY in self.properties and self.error is None

    @property
    def backfill(self) -> dict[str, str]:
        """Added columns whose existing rows still need their value (see ``Tables.evolve``)."""
        return json.loads(self.properties.get(BACKFILL_PROPERTY, "{}"))

    @property
    def key(self) -> list[str]:
        key = []
        for field_id in self.schema.identifier_field_ids:
            name = self.schema.find_column_name(field_id)
            assert name is not None  # Iceberg only accepts identifier fields that are in the schema
            key.append(name)
        return key

    def data_columns(self) -> dict[str, IcebergType]:
        """Columns other than lakeslot's own, in order."""
        return {f.name: f.field_type for f in self.schema.fields
                if f.name not in OWN_COLUMNS}
