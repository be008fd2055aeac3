"""Consistent reads across mirror tables: cuts, and the cuts record.

A *cut* is a source LSN ``X`` and, for every mirror table, a snapshot that equals its source
table as of ``X``. Reading each table at its snapshot of the cut (Spark: ``VERSION AS OF <id>``)
shows the source as of that one LSN, so a query joining several mirror tables sees every source
transaction whole or not at all — which reading each table's latest snapshot cannot promise (an
apply pass commits the tables one after the other; a reader between two of its commits sees a
transaction in one table and not yet in the other).

Where cuts come from:

- **The cuts record** (:attr:`lakeslot.api.naming.IngestionNames.cuts_table`,
  ``lakeslot_cuts_<namespace>_<name>``, an Iceberg table in the sink namespace,
  :data:`RECORD_SCHEMA`): the apply job commits to it once per pass whose batch end
  moved, after every table commit of the pass landed (:mod:`lakeslot.apply.cut_record`). An idle
  table keeps its advance in memory (:mod:`lakeslot.apply.coverage`) and commits it only every
  few minutes, so its latest snapshot carries an LSN ``L`` below the pass's ``X``: it equals the
  source as of ``X`` all the same (nothing of it is staged in between), and the record says so.
  Per pass it writes one ``cut`` row (``cut_lsn = X``) and one ``table`` row per mirror whose
  snapshot (or absence) changed since the previous cut it recorded; a ``full_listing`` cut lists
  every mirror (at the job's first cut, then every :data:`FULL_LISTING_S`). A ``retained`` cut
  (a full listing every :data:`lakeslot.mirror.contract.RETAINED_EVERY_S`) has its snapshots
  tagged in the tables so that expiry keeps them (:mod:`lakeslot.mirror.contract`, "History"):
  the other cuts reach back as far as the recent window. The cut at ``X`` of
  a mirror is its latest ``table`` row at or below ``X`` and at or above the latest full listing
  at or below ``X`` (:data:`SQL`, plain SQL for any engine): ``snapshot_id`` NULL means the
  mirror is absent from the cut (``state`` says why: ``failed``, ``retrying``, ``waiting`` for
  its snapshot, or ``ahead`` — re-snapshotted at an LSN the passes have not reached).
- **The tables' histories** (:func:`history`): every commit records the LSN it reflects
  (DESIGN.md invariant 1), so an LSN every table's history carries is a cut (the snapshot job's
  LSN, a pass where every table committed). Read as a fallback and to check the record.

Invariants:

- The record names only committed snapshots: a pass records its cut after its table commits,
  and a row's ``snapshot_id`` is the table's current snapshot as the catalog has it, carrying
  ``lakeslot.lsn = table_lsn ≤ cut_lsn`` with nothing of the table staged in between.
- ``cut_lsn`` strictly increases from one record commit to the next (the record's current
  snapshot carries the latest as its ``lakeslot.lsn``): a mirror has at most one row per cut.
- A record cut is used only once checked against the tables (:func:`valid`): each snapshot it
  names exists, is in the table's current lineage (:func:`lineage`: an ancestor of its current
  snapshot, or tagged for a retained cut since its latest re-snapshot — a rolled-back branch or
  an earlier snapshot generation is never named) and reflects an LSN at or below the cut.
- A cut's snapshot of a table from the histories is the newest snapshot in the ancestry of the
  table's current snapshot that carries the cut's LSN (maintenance rewrites keep the LSN).
- ``committed_at_ms`` of a cut is when it became readable: its last snapshot's commit (history),
  or when the pass recorded it, after its snapshots' commits (record) — not the source's commit
  time.

Failure modes: a table that does not exist or has no snapshot with ``lakeslot.lsn`` has no cut
(:class:`NoCut` names it); a cut whose snapshot was expired, or whose table was re-snapshotted
since, is no longer a cut; a record that is absent (a job older than it) leaves the histories'
cuts; a catalog error propagates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.types import BooleanType, LongType, NestedField, StringType, TimestamptzType

from lakeslot import lsn_text
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.mirror import catalogs
from lakeslot.mirror.contract import CUT_TAG_PREFIX, LSN_PROPERTY, SNAPSHOT_LSN_PROPERTY
from lakeslot.mirror.progress import position

# A table's history: lakeslot.lsn → (snapshot id, committed at, ms since the epoch)
History = dict[int, tuple[int, int]]
# A table's current lineage: snapshot id → the LSN it reflects (None: unknown)
Lineage = dict[int, int | None]

FULL_LISTING_S = 600.0  # a full listing at least this often (readers need no older rows)
CUT, TABLE = "cut", "table"  # the record's kinds of rows
RECORD_SCHEMA = Schema(
    NestedField(1, "cut_lsn", LongType(), required=False),  # the cut's LSN
    NestedField(2, "lsn", StringType(), required=False),  # ... as PostgreSQL prints it (X/Y)
    NestedField(3, "recorded_at", TimestamptzType(), required=False),
    NestedField(4, "kind", StringType(), required=False),  # cut | table
    NestedField(5, "full_listing", BooleanType(), required=False),  # the cut lists every mirror
    NestedField(6, "source_schema", StringType(), required=False),  # table rows: the source table
    NestedField(7, "source_table", StringType(), required=False),
    NestedField(8, "mirror", StringType(), required=False),  # ... its mirror in the namespace
    NestedField(9, "snapshot_id", LongType(), required=False),  # NULL: absent from the cut
    NestedField(10, "table_lsn", LongType(), required=False),  # the snapshot's lakeslot.lsn
    NestedField(11, "state", StringType(), required=False),  # the pass's outcome, or why absent
    NestedField(12, "retained", BooleanType(), required=False))  # a retained cut (kept longer)

# The latest cut at or below the LSN ``{at}`` (a number; the latest cut: 9223372036854775807) in
# plain SQL, Spark SQL and DuckDB alike; ``{record}``: the record table as the engine names it.
# One row per mirror of the cut: its name and the snapshot id to read it at.
SQL = """\
WITH c AS (SELECT max(r.cut_lsn) AS at FROM {record} r WHERE r.kind = 'cut' AND r.cut_lsn <= {at}),
     f AS (SELECT max(r.cut_lsn) AS at FROM {record} r, c
            WHERE r.kind = 'cut' AND r.full_listing AND r.cut_lsn <= c.at)
SELECT r.mirror, max_by(r.snapshot_id, r.cut_lsn) AS snapshot_id, max(c.at) AS cut_lsn
  FROM {record} r, c, f
 WHERE r.kind = 'table' AND r.cut_lsn BETWEEN f.at AND c.at
 GROUP BY r.mirror
HAVING max_by(r.snapshot_id, r.cut_lsn) IS NOT NULL"""


class NoCut(LookupError):
    """No cut answers the request; the message says why."""


@dataclass(frozen=True)
class Cut:
    lsn: int
    committed_at_ms: int
    snapshots: dict[TableName, int]  # the snapshot id to read of each table


@dataclass(frozen=True)
class Listed:
    """A mirror as one cut has it: its snapshot (None: absent) and the LSN it carries."""

    table: TableName
    mirror: str
    snapshot: int | None
    lsn: int | None
    state: str


def record_rows(lsn: int, at_ms: int, listed: Iterable[Listed], *, full: bool,
                retained: bool = False) -> pa.Table:
    """The record's rows of the cut at ``lsn`` (recorded at ``at_ms``, ms since the epoch; one
    time for all its rows): its ``cut`` row and one per ``listed`` mirror."""
    text, at = lsn_text.format(lsn), datetime.fromtimestamp(at_ms / 1000, UTC)
    rows = [{"cut_lsn": lsn, "lsn": text, "recorded_at": at, "kind": CUT, "full_listing": full,
             "retained": retained}]
    rows += [{"cut_lsn": lsn, "lsn": text, "recorded_at": at, "kind": TABLE,
              "full_listing": full, "retained": retained, "source_schema": each.table.schema,
              "source_table": each.table.name, "mirror": each.mirror,
              "snapshot_id": each.snapshot, "table_lsn": each.lsn, "state": each.state}
             for each in listed]
    return pa.Table.from_pylist(rows, schema=record_arrow_schema())


def record_arrow_schema() -> pa.Schema:
    """:data:`RECORD_SCHEMA` in Arrow, with Iceberg's field IDs."""
    return schema_to_pyarrow(RECORD_SCHEMA)


def recorded(rows: pa.Table, tables: Iterable[TableName]) -> list[Cut]:
    """The record's cuts of which every one of ``tables`` is part, oldest first (pure): each
    mirror's latest row at or below the cut, from the first full listing on."""
    wanted = set(tables)
    ordered = rows.sort_by([("cut_lsn", "ascending")]).to_pylist()
    found: list[Cut] = []
    state: dict[TableName, int | None] = {}
    started = False  # (rows before the first full listing may lack mirrors)
    for i, row in enumerate(ordered):
        if row["kind"] == CUT and row["full_listing"]:
            state, started = {}, True
        if row["kind"] == TABLE:
            state[TableName(row["source_schema"], row["source_table"])] = row["snapshot_id"]
        last = i + 1 == len(ordered) or ordered[i + 1]["cut_lsn"] != row["cut_lsn"]
        if last and started and wanted and all(state.get(t) is not None for t in wanted):
            found.append(Cut(row["cut_lsn"], int(row["recorded_at"].timestamp() * 1000),
                             {t: state[t] for t in sorted(wanted)}))  # type: ignore[misc]
    return found


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


def lineage(table: Table | None) -> Lineage:
    """The snapshots of a table's current lineage, each with the LSN it reflects: the ancestors
    of its current snapshot, and the snapshots lakeslot tagged for a retained cut
    (:func:`lakeslot.mirror.contract.cut_tag`: expiry breaks the chain of parents between them
    and the current snapshot) taken since the table's latest (re-)snapshot."""
    if table is None or table.current_snapshot() is None:
        return {}
    found: Lineage = {s.snapshot_id: position(table, s)
                      for s in ancestors_of(table.current_snapshot(), table.metadata)}
    since = int(table.metadata.properties.get(SNAPSHOT_LSN_PROPERTY, "-1"))
    for name, ref in table.metadata.refs.items():
        tagged = table.snapshot_by_id(ref.snapshot_id) if name.startswith(CUT_TAG_PREFIX) else None
        if tagged is not None and (lsn := position(table, tagged)) is not None and lsn >= since:
            found.setdefault(tagged.snapshot_id, lsn)
    return found


def valid(cut: Cut, lineages: Mapping[TableName, Lineage]) -> bool:
    """Whether every snapshot ``cut`` names is in its table's current lineage and reflects an LSN
    at or below the cut's (see the module docstring)."""
    for table, snapshot in cut.snapshots.items():
        reflects = lineages.get(table, {}).get(snapshot)
        if reflects is None or reflects > cut.lsn:
            return False
    return True


def cuts(histories: Mapping[TableName, History]) -> list[Cut]:
    """Every cut the histories of these tables hold, oldest first (pure)."""
    if not histories:
        return []
    common = set.intersection(*(set(h) for h in histories.values()))
    return [Cut(lsn, max(h[lsn][1] for h in histories.values()),
                {t: h[lsn][0] for t, h in histories.items()}) for lsn in sorted(common)]


def merged(*found: Iterable[Cut]) -> list[Cut]:
    """Cuts from several sources, oldest first, one per LSN (the first source's wins)."""
    by_lsn: dict[int, Cut] = {}
    for each in found:
        for cut in each:
            by_lsn.setdefault(cut.lsn, cut)
    return [by_lsn[lsn] for lsn in sorted(by_lsn)]


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
    """The cuts of ``tables``' mirrors (``secrets``: the catalog's Secret-backed properties): the
    record's that the tables' histories confirm, and the histories' own."""
    names, tables = IngestionNames.of(ingestion), list(tables)
    loaded = catalogs.load_tables(
        ingestion.spec.sink.catalog,
        [*(names.mirror_identifier(t) for t in tables),
         names.cuts_identifier()], secrets)
    mirrors, record = loaded[:-1], loaded[-1]
    histories = {t: history(table) for t, table in zip(tables, mirrors, strict=True)}
    empty = [str(t) for t, h in histories.items() if not h]
    if empty:
        raise NoCut(f"no mirror with a lakeslot.lsn for {', '.join(empty)}: not snapshotted yet")
    lineages = {t: lineage(table) for t, table in zip(tables, mirrors, strict=True)}
    kept = [] if record is None or record.current_snapshot() is None else [
        c for c in recorded(record.scan().to_arrow(), tables) if valid(c, lineages)]
    return merged(cuts(histories), kept)


def document(ingestion: PostgresIngestion, cut: Cut) -> dict:
    """What ``lakeslot cut`` prints: the LSN, when the cut became readable, the cuts record, and
    per table the Spark table name and the snapshot id to read it at."""
    names, catalog = IngestionNames.of(ingestion), ingestion.spec.sink.catalog.name
    return {"lsn": lsn_text.format(cut.lsn), "committedAt": datetime.fromtimestamp(
                cut.committed_at_ms / 1000, UTC).isoformat().replace("+00:00", "Z"),
            "record": ".".join([catalog, *names.cuts_identifier()]),
            "tables": [{"schema": t.schema, "name": t.name,
                        "table": ".".join([catalog, *names.mirror_identifier(t)]),
                        "snapshotId": sid} for t, sid in cut.snapshots.items()]}
