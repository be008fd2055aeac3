"""Consistent reads across mirror tables: cuts.

A *cut* is a source LSN at which every mirror table has a snapshot. Reading each table at its
snapshot of the cut (Spark: ``VERSION AS OF <id>``) shows the source as of that one LSN, so a
query joining several mirror tables sees every source transaction whole or not at all — which
reading each table's latest snapshot cannot promise (an apply pass commits the tables one after
the other; a reader between two of its commits sees a transaction in one table and not yet in
the other).

Where cuts come from: by DESIGN.md invariant 1 every commit on a mirror table records the LSN it
reflects (``lakeslot.lsn``), and after it the table equals its source as of that LSN. Each apply
pass commits every table it serves at the same position (the batch end − 1; a table without
changes gets an empty commit), and the snapshot job commits every table it copies at its snapshot
LSN. The cuts are therefore exactly the LSNs that every table's history carries. They are read
from the tables themselves rather than from a record kept beside them, because a separate record
could disagree with the tables (a commit whose record was not written, a snapshot expired since),
while the tables' histories are exactly what time travel can read.

Invariants:

- A cut's snapshot of a table is the newest snapshot in the ancestry of the table's current
  snapshot that carries the cut's LSN (maintenance rewrites keep the LSN and the data).
- Only the current lineage counts: a snapshot no longer an ancestor (rolled back) is never named.
- ``committed_at_ms`` of a cut is when its last snapshot was committed to Iceberg: the moment the
  cut became readable, not the source's commit time.

Failure modes: a table that does not exist or has no snapshot with ``lakeslot.lsn`` has no cut
(:class:`NoCut` names it); snapshots expired by the tables' ``history.expire.*`` properties are no
longer cuts; a catalog error propagates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from lakeslot import lsn_text
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.mirror import catalogs
from lakeslot.mirror.contract import LSN_PROPERTY

# A table's history: lakeslot.lsn → (snapshot id, committed at, ms since the epoch)
History = dict[int, tuple[int, int]]


class NoCut(LookupError):
    """No cut answers the request; the message says why."""


@dataclass(frozen=True)
class Cut:
    lsn: int
    committed_at_ms: int
    snapshots: dict[TableName, int]  # the snapshot id to read of each table


def history(table: Table | None) -> History:
    """The LSNs a table's current lineage holds, each with its newest snapshot."""
    if table is None or table.current_snapshot() is None:
        return {}
    found: History = {}
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):  # newest first
        lsn = snapshot.summary.get(LSN_PROPERTY) if snapshot.summary is not None else None
        if lsn is not None and int(lsn) not in found:
            found[int(lsn)] = (snapshot.snapshot_id, snapshot.timestamp_ms)
    return found


def cuts(histories: Mapping[TableName, History]) -> list[Cut]:
    """Every cut of these tables, oldest first (pure)."""
    if not histories:
        return []
    common = set.intersection(*(set(h) for h in histories.values()))
    return [Cut(lsn, max(h[lsn][1] for h in histories.values()),
                {t: h[lsn][0] for t, h in histories.items()}) for lsn in sorted(common)]


def choose(found: list[Cut], *, at_lsn: int | None = None, at_ms: int | None = None) -> Cut:
    """The latest cut at or below ``at_lsn``, or committed at or before ``at_ms``, or the latest."""
    eligible = [c for c in found if (at_lsn is None or c.lsn <= at_lsn)
                and (at_ms is None or c.committed_at_ms <= at_ms)]
    if not eligible:
        raise NoCut("no cut at or before the requested point: the oldest is "
                    + (f"at LSN {found[0].lsn} (committed at {found[0].committed_at_ms} ms)"
                       if found else "absent (no LSN is common to every table)"))
    return eligible[-1]


def read(ingestion: PostgresIngestion, tables: Iterable[TableName], *,
         secrets: Mapping[str, str] | None = None) -> list[Cut]:
    """The cuts of ``tables``' mirrors (``secrets``: the catalog's Secret-backed properties)."""
    names, tables = IngestionNames.of(ingestion), list(tables)
    loaded = catalogs.load_tables(ingestion.spec.sink.catalog,
                                  [names.mirror_identifier(t) for t in tables], secrets)
    histories = {t: history(table) for t, table in zip(tables, loaded, strict=True)}
    empty = [str(t) for t, h in histories.items() if not h]
    if empty:
        raise NoCut(f"no mirror with a lakeslot.lsn for {', '.join(empty)}: not snapshotted yet")
    return cuts(histories)


def document(ingestion: PostgresIngestion, cut: Cut) -> dict:
    """What ``lakeslot cut`` prints: the LSN, when the cut became readable, and per table the
    Spark table name and the snapshot id to read it at."""
    names, catalog = IngestionNames.of(ingestion), ingestion.spec.sink.catalog.name
    return {"lsn": lsn_text.format(cut.lsn), "committedAt": datetime.fromtimestamp(
                cut.committed_at_ms / 1000, UTC).isoformat().replace("+00:00", "Z"),
            "tables": [{"schema": t.schema, "name": t.name,
                        "table": ".".join([catalog, *names.mirror_identifier(t)]),
                        "snapshotId": sid} for t, sid in cut.snapshots.items()]}
