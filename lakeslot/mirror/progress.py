"""Reading the mirror tables' progress from Iceberg itself.

By DESIGN.md invariant 1, every commit on a mirror table records in its snapshot summary
(``lakeslot.lsn``) the source LSN the table reflects. So the truth about how far a table got is
in the table, not in any side file: the operator and ``lakeslot status`` read it here, read-only,
with pyiceberg (no Spark, no JVM), through :func:`lakeslot.mirror.catalogs.load_tables` (many at
once through one catalog client: a status or a reconcile over 1,000 tables is not 1,000 round
trips in a row), parsing only the part of each table's history they read
(:func:`what_progress_reads`: a status or a reconcile costs the same CPU after a day of commits
as after a minute).

- A table that does not exist, or whose current snapshot has no ``lakeslot.lsn``, has no
  progress (``None``): it has not been snapshotted yet — except a ``replace`` snapshot (a
  compaction lakeslot did not run), which has its parent's (:func:`position`).
- An idle table advances too, in two ways: the apply job commits an empty snapshot carrying the
  new ``lakeslot.lsn`` (no data rewritten) every few minutes, and in between its status document
  says how far the table is covered above that (:mod:`lakeslot.apply.coverage`). :func:`read`
  given what that document says (``covered``) reports the covered position where the mirror is
  still at the committed one the document names: an idle table is not shown as behind. Without
  it (or once the mirror moved) the position is the mirror's own.
- A table the apply job stopped carries its definite error in table properties, in force while
  the table's position is the one it stopped at (:func:`lakeslot.mirror.contract.apply_error`):
  ``error`` and ``resnapshot_required`` report it (``resnapshot_automatic``: lakeslot copies the
  table again by itself; ``resnapshots_last_hour`` counts the re-snapshot commits, for the loop
  guard of :mod:`lakeslot.control.resnapshot`).

- ``rows`` is the mirror's live row count as of its position: the snapshot summary's
  ``total-records`` (every row in the live data files) minus ``total-position-deletes`` (rows
  those files hold that position deletes or deletion vectors mark deleted) — :func:`live_rows`.
  The mirrors are written merge-on-read, so ``total-records`` alone counts every version a MERGE
  left behind (1,001,208 for a 1,000,000-row mirror after its updates). It is exact for what
  lakeslot writes (Spark's MERGE deletes only live rows, by position; its compaction drops
  dangling deletes). It is None (unknown) when the table has equality deletes (lakeslot never
  writes them: another writer did; one can delete any number of rows, which no summary says),
  and would undercount while position deletes that no longer apply to a live file, left by a
  compaction someone else ran without removing them, are counted — until lakeslot's own
  compaction drops them.

Failure modes: an unreachable catalog or warehouse raises (the caller reports it as a
condition); a corrupt ``lakeslot.lsn`` raises ``ValueError`` rather than being guessed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot

from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.mirror import catalogs
from lakeslot.mirror.contract import (
    LSN_PROPERTY,
    MAINTENANCE_PROPERTY,
    RESNAPSHOT_AUTOMATIC,
    RESNAPSHOT_PROPERTY,
    RESNAPSHOT_SUMMARY,
    SCHEMA_CHANGE_PROPERTY,
    SNAPSHOT_LSN_PROPERTY,
    apply_error,
)


@dataclass(frozen=True)
class MirrorProgress:
    lsn: int | None  # lakeslot.lsn of the current snapshot; None: nothing committed by lakeslot
    rows: int | None  # live rows of the current snapshot (live_rows); None: unknown
    committed_at_ms: int | None
    error: str | None = None  # the apply job stopped the table (definite error), and why
    resnapshot_required: bool = False  # the way out of ``error`` is a re-snapshot
    snapshot_lsn: int | None = None  # lakeslot.snapshot-lsn: where the table's snapshot was taken
    resnapshot_automatic: bool = False  # ... which lakeslot starts by itself
    resnapshots_last_hour: int = 0  # re-snapshots committed within the hour before reading
    schema_change: str | None = None  # the last DDL the apply job applied in place
    data_files: int | None = None  # total-data-files of the current snapshot
    delete_files: int | None = None  # total-delete-files of the current snapshot
    maintenance: str | None = None  # the last maintenance outcome (mirror.maintenance)


def progress_of(table: Table | None) -> MirrorProgress:
    snapshot = table.current_snapshot() if table is not None else None
    if table is None or snapshot is None:
        return MirrorProgress(None, None, None)
    summary = snapshot.summary
    lsn = position(table, snapshot)
    rows = live_rows(summary) if summary is not None else None
    data_files = summary.get("total-data-files") if summary is not None else None
    delete_files = summary.get("total-delete-files") if summary is not None else None
    error = apply_error(table.properties, lsn)
    taken = table.properties.get(SNAPSHOT_LSN_PROPERTY)
    way_out = table.properties.get(RESNAPSHOT_PROPERTY) if error is not None else None
    hour_ago = int(time.time() * 1000) - 3_600_000
    recent = sum(1 for s in table.snapshots() if s.timestamp_ms >= hour_ago
                 and s.summary is not None and s.summary.get(RESNAPSHOT_SUMMARY) == "true")
    return MirrorProgress(lsn, rows, snapshot.timestamp_ms,
                          error, way_out in ("true", RESNAPSHOT_AUTOMATIC),
                          int(taken) if taken is not None else None,
                          way_out == RESNAPSHOT_AUTOMATIC, recent,
                          table.properties.get(SCHEMA_CHANGE_PROPERTY),
                          int(data_files) if data_files is not None else None,
                          int(delete_files) if delete_files is not None else None,
                          table.properties.get(MAINTENANCE_PROPERTY))


def live_rows(summary: Mapping[str, str]) -> int | None:
    """Rows of the data files minus the rows deleted by position (see the module docstring);
    None when it cannot be known from the summary: equality deletes, a total missing, or more
    deletes than rows (deletes left dangling by someone else's compaction)."""
    records, positional = summary.get("total-records"), summary.get("total-position-deletes")
    if records is None or int(summary.get("total-equality-deletes") or 0) != 0:
        return None
    live = int(records) - int(positional or 0)
    return live if live >= 0 else None


def position(table: Table, snapshot: Snapshot) -> int | None:
    """The ``lakeslot.lsn`` ``snapshot`` reflects. A ``replace`` snapshot without one (a
    compaction someone else ran: a managed catalog's automatic compaction, Iceberg's procedures
    by hand) changed no rows, so it has its parent's."""
    while snapshot.summary is not None and snapshot.summary.get(LSN_PROPERTY) is None \
            and snapshot.summary.operation == Operation.REPLACE \
            and snapshot.parent_snapshot_id is not None:
        parent = table.snapshot_by_id(snapshot.parent_snapshot_id)
        if parent is None:  # expired: the position is unknown
            return None
        snapshot = parent
    value = snapshot.summary.get(LSN_PROPERTY) if snapshot.summary is not None else None
    return int(value) if value is not None else None


def what_progress_reads(metadata: dict[str, Any]) -> dict[str, Any]:
    """A table's metadata (its JSON) with only the history :func:`progress_of` reads: the current
    snapshot and the ``replace`` ancestors :func:`position` walks, and the re-snapshot commits;
    no other snapshot, ref, log or statistics — a mirror aged a day lists ≈ 185 snapshots, and
    pyiceberg parses each (:data:`lakeslot.mirror.catalogs.Trim`)."""
    snapshots = {s.get("snapshot-id"): s for s in metadata.get("snapshots") or ()}
    kept = [s for s in snapshots.values()
            if (s.get("summary") or {}).get(RESNAPSHOT_SUMMARY) == "true"]
    current = snapshots.get(metadata.get("current-snapshot-id"))
    while current is not None and current not in kept:
        kept.append(current)
        summary = current.get("summary") or {}
        if LSN_PROPERTY in summary or summary.get("operation") != Operation.REPLACE.value:
            break
        current = snapshots.get(current.get("parent-snapshot-id"))
    ids = {s.get("snapshot-id") for s in kept}
    refs = {name: ref for name, ref in (metadata.get("refs") or {}).items()
            if ref.get("snapshot-id") in ids}
    return {**metadata, "snapshots": kept, "refs": refs, "snapshot-log": [], "metadata-log": [],
            "statistics": [], "partition-statistics": []}


def read(ingestion: PostgresIngestion, tables: Iterable[TableName], *,
         secrets: Mapping[str, str] | None = None,
         covered: Mapping[TableName, tuple[int, int]] | None = None,
         environ: Mapping[str, str] | None = None) -> dict[TableName, MirrorProgress]:
    """The progress of each table's mirror; ``secrets``: the catalog's Secret-backed properties;
    ``covered``: the idle tables' covered positions (:func:`with_coverage`); ``environ``: the
    warehouse's storage settings (:func:`lakeslot.mirror.catalogs.pyiceberg_properties`)."""
    names, tables = IngestionNames.of(ingestion), list(tables)
    loaded = catalogs.load_tables(ingestion.spec.sink.catalog,
                                  [names.mirror_identifier(t) for t in tables], secrets, environ,
                                  what_progress_reads)
    return with_coverage({t: progress_of(table) for t, table in zip(tables, loaded, strict=True)},
                         covered or {})


def with_coverage(progress: Mapping[TableName, MirrorProgress],
                  covered: Mapping[TableName, tuple[int, int]]) -> dict[TableName, MirrorProgress]:
    """``progress`` with each idle table's covered position — ``covered``: table → (committed,
    covered), what the apply job's status document says
    (:func:`lakeslot.staging.apply_status.covered`) — where the mirror is still at that
    committed position."""
    moved = dict(progress)
    for table, p in progress.items():
        position = covered_to(covered, table, p.lsn)
        if position is not None:
            moved[table] = replace(p, lsn=position)
    return moved


def covered_to(covered: Mapping[TableName, tuple[int, int]], table: TableName,
               lsn: int | None) -> int | None:
    """How far ``table``, whose mirror is at ``lsn``, is covered beyond it by ``covered`` (see
    :func:`with_coverage`); None when the document names another committed position (the
    mirror moved since, or was replaced) or none."""
    committed, position = covered.get(table, (None, None))
    if lsn is None or committed != lsn or position is None or position <= lsn:
        return None
    return position
