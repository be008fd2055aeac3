"""The pass's last commit: its cut, in the cuts record (:mod:`lakeslot.mirror.cuts` says what a
cut is, the record's rows and how engines read them).

Why a record: a cut needs, for one LSN, a snapshot of every table that equals its source as of
that LSN. An idle table commits its advance only every few minutes (:mod:`lakeslot.apply.coverage`:
an empty commit per idle table per pass cost most of a pass with hundreds of tables), so its
snapshots rarely carry the LSN the busy tables' do, and the tables' histories alone hold almost
no cut after the snapshot. The record says what the job knows: the idle table's latest snapshot,
at ``L``, equals the source as of the pass's batch end, since nothing of it is staged in between.

Invariants (DESIGN.md invariant 9):

- One commit per pass at most, whatever the number of tables, after every table commit of the
  pass and before its maintenance (the cut is readable as soon as it can be) and its status
  document; none when the batch end did not
  move past the latest recorded cut (``cut_lsn`` strictly increases: the record's current
  snapshot carries it as ``lakeslot.lsn``, read once when the job starts).
- A table is part of the pass's cut at ``X = batch end − 1`` when its outcome is ``applied``,
  ``advanced`` or ``current`` at ``X``; its snapshot is the one the catalog has as current, taken
  only if it carries the position the pass left it at (committed, or covered from there: the
  outcome's ``durable``) — else it is absent (``moved``). Any other table is absent, with its
  outcome's state as the reason (``ahead`` for one whose position is past ``X``: re-snapshotted).
- Rows only for what changed since the previous recorded cut (a snapshot, an absence); a full
  listing at the job's first cut and every :data:`lakeslot.mirror.cuts.FULL_LISTING_S`, so
  readers never need rows older than that.
- A full listing every :data:`lakeslot.mirror.contract.RETAINED_EVERY_S` (and the job's first)
  is a *retained* cut: its snapshots are handed to the upkeep to be tagged
  (:attr:`CutRecord.retained`, :meth:`lakeslot.apply.upkeep.Upkeep.expire`) before the table's
  next expiry, which then keeps them. A job that stops before tagging them leaves that cut to
  the recent window only.
- The job's memory of what it recorded changes only once the commit landed.

Cost: one Iceberg commit per pass on the record — a Parquet file of the rows, a manifest, a
manifest list, the table's metadata (the parent's manifest list is read) — and no catalog load
per table: the tables' objects as the catalog caches them, already current after this pass's
prepare and commits (refreshed only when one does not carry the position expected), looked up on
the pass's threads: a full listing of 1,000 mirrors whose cached objects expired (after a long
snapshot) is 1,000 catalog loads, 93 s one after the other at 30 ms a request.

Failure modes: a transient error (storage, the catalog) logs and leaves the memory as it was: the
next pass records its own cut, with the rows this one would have written. Any other error
propagates (the pass fails as a whole: it belongs to no table).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa

from lakeslot.api.naming import TableName
from lakeslot.apply.outcomes import TableOutcome
from lakeslot.errors import transient_in_spark
from lakeslot.mirror import cuts
from lakeslot.mirror.contract import (
    LSN_PROPERTY,
    OWNER_PROPERTY,
    RETAINED_EVERY_S,
    TABLE_DEFAULTS,
    cut_tag,
)
from lakeslot.spark import row_delta
from lakeslot.spark.session import error_summary, on_threads, with_commit_properties
from lakeslot.spark.tables import Tables, position_of
from lakeslot.workloads import JobInput

log = logging.getLogger("lakeslot.apply.job")
MEMBERS = ("applied", "advanced", "current")  # outcomes whose table is part of the pass's cut
SPARK_SCHEMA = ", ".join(f"{f.name} {t}" for f, t in zip(cuts.RECORD_SCHEMA.fields, (
    "bigint", "string", "timestamp", "string", "boolean", "string", "string", "string", "bigint",
    "bigint", "string", "boolean"), strict=True))  # (the record's schema, for Spark's fallback write)


class CutRecord:
    """One apply job's commits to the cuts record (its memory: what it recorded of each table,
    the latest cut, when it last listed every table)."""

    def __init__(self, spark, job: JobInput, tables: Tables,
                 clock: Callable[[], float] = time.time) -> None:
        self.spark, self.job, self.tables, self.clock = spark, job, tables, clock
        self._recorded: dict[TableName, tuple[int | None, int | None]] = {}  # (snapshot, lsn)
        self._cut: int | None = None  # the latest recorded cut (None: not read yet)
        self._listed_at = -math.inf  # when the last full listing was recorded (clock)
        self._retained_at = -math.inf  # ... and the last retained cut
        # the retained cuts' snapshots to tag: mirror → tag → snapshot id (Upkeep.expire)
        self.retained: dict[str, dict[str, int]] = {}
        self._table = None  # the record's Java table (kept: this job is its one writer)
        self.name = job.names.cuts_table

    def record(self, end: int | None, outcomes: Sequence[TableOutcome], threads: int = 1
               ) -> int | None:
        """Record the cut of a pass whose batch ended at ``end`` (None: nothing sealed), whose
        tables ended as ``outcomes``, looking their snapshots up on ``threads`` threads; the
        cut's LSN, or None when none was recorded."""
        if end is None:
            return None
        lsn, now = end - 1, self.clock()
        try:
            if self._cut is None:
                self._cut = self._latest()
            if lsn <= self._cut:
                return None
            retain = now - self._retained_at >= RETAINED_EVERY_S
            full = retain or not self._recorded or now - self._listed_at >= cuts.FULL_LISTING_S
            looked = on_threads(self.spark, threads,
                                [o for o in outcomes if self._looked_up(o, lsn, full)],
                                lambda o: self.tables.snapshot_at(o.target, o.durable),
                                "lakeslot-cut")
            listed = [each for o in outcomes
                      if (each := self._listed(o, lsn, full, looked)) is not None]
            self._commit(cuts.record_rows(lsn, int(now * 1000), listed, full=full,
                                          retained=retain), lsn)
        except transient_in_spark() as e:
            log.warning("recording the cut at %s failed (the next pass records its own): %s",
                        lsn, error_summary(e))
            self._table = None
            return None
        if full:
            self._recorded, self._listed_at = {}, now
        if retain:
            self._retained_at = now
            for each in listed:
                if each.snapshot is not None:
                    self.retained.setdefault(each.mirror, {})[cut_tag(lsn)] = each.snapshot
        self._recorded.update((e.table, (e.snapshot, e.lsn)) for e in listed)
        self._cut = lsn
        return lsn

    def _looked_up(self, outcome: TableOutcome, lsn: int, full: bool) -> bool:
        """Whether the cut at ``lsn`` lists ``outcome``'s table with its snapshot: a member of
        the cut, in a full listing or when its position changed since the previous cut."""
        if not _member(outcome, lsn):
            return False
        before = self._recorded.get(outcome.source)
        return full or before is None or before[0] is None or before[1] != outcome.durable

    def _listed(self, outcome: TableOutcome, lsn: int, full: bool,
                looked: Mapping[TableOutcome, int | None]) -> cuts.Listed | None:
        """``outcome``'s table as the cut at ``lsn`` has it (its snapshot as ``looked`` up);
        None when unchanged since the previous cut recorded (and this is no full listing)."""
        before = self._recorded.get(outcome.source)
        if not _member(outcome, lsn):
            if not full and before is not None and before[0] is None:
                return None  # (still absent)
            why = "ahead" if outcome.state in MEMBERS else outcome.state
            return cuts.Listed(outcome.source, outcome.target, None, None, why)
        if outcome not in looked:
            return None  # the same snapshot as in the previous cut
        durable, snapshot = outcome.durable, looked[outcome]
        return cuts.Listed(outcome.source, outcome.target, snapshot,
                           durable if snapshot is not None else None,
                           outcome.state if snapshot is not None else "moved")

    def _latest(self) -> int:
        """The record's latest cut (−1: no record yet)."""
        table = self._record()
        latest = None if table is None else position_of(table)
        return -1 if latest is None else latest

    def _record(self, create: bool = False):
        """The record's Java table (created empty when ``create``; None: it does not exist)."""
        if self._table is None:
            if not self.tables.exists(self.name):
                if not create:
                    return None
                properties = {**TABLE_DEFAULTS, "format-version": "2",
                              OWNER_PROPERTY: self.job.names.owner}
                self.tables.begin(self.tables.namespace, self.name, cuts.RECORD_SCHEMA,
                                  properties, replace=False).commit([], -1)
            self._table = self.tables.iceberg_table(self.name)
        return self._table

    def _commit(self, rows: pa.Table, lsn: int) -> None:
        """Append ``rows`` to the record in one commit carrying ``lakeslot.lsn = lsn``: the
        driver's row delta (:mod:`lakeslot.spark.row_delta`), else Spark's append."""
        table = self._record(create=True)
        jvm = self.spark._jvm
        if not row_delta.available(jvm):
            frame = self.spark.createDataFrame(rows.to_pylist(), schema=SPARK_SCHEMA)
            with_commit_properties(self.spark, {LSN_PROPERTY: str(lsn)},
                                   frame.writeTo(self.tables.qualified(self.name)).append)
            self._table = None  # (Spark committed through its own object)
            return
        row_delta.append(jvm, table, rows, f"cut-{lsn:016x}-{uuid.uuid4().hex}.parquet", lsn, "zstd")


def _member(outcome: TableOutcome, lsn: int) -> bool:
    """Whether ``outcome``'s table is part of the cut at ``lsn`` (see the module docstring)."""
    return outcome.state in MEMBERS and outcome.lsn == lsn
