"""Maintenance of the mirror tables: compaction, manifest rewrite and orphan-file removal, run by
the apply job between passes (``spec.sink.maintenance``).

Why: mirror tables are written merge-on-read (:data:`lakeslot.mirror.contract.TABLE_DEFAULTS`),
so a MERGE costs what its changes cost, not what the table costs; but every pass leaves small
data files and position-delete files that every reader must merge, and a commit per pass grows
the manifest list. Compaction rewrites the data files that carry deletes or are too small, which
applies the deletes and drops the delete files; manifests are rewritten with it.

Invariants:

- **The position never moves.** Every commit maintenance makes (Iceberg's ``rewriteDataFiles``
  and ``rewriteManifests`` actions, a ``replace`` snapshot) carries ``lakeslot.lsn`` equal to the
  position the table had when it started (the actions' ``snapshotProperty``) and rewrites files,
  never rows: the table's content and position are those of the commit before it.
- **Never concurrent with the apply job's own commits**: it runs in the apply job's thread
  between passes (:meth:`lakeslot.apply.job.Applier.run_pass`). The only other writer of a mirror
  is a re-snapshot (a replace transaction): a compaction committing after it fails Iceberg's
  validation (the files it rewrote are gone) and is retried at a later run, and one committing
  before it is replaced with everything else — so a maintenance tag never lands on top of a
  newer position.
- **Orphan files**: only files older than ``orphanFileAgeHours`` are deleted, so files a
  snapshot or write is still producing (written before their commit) are never touched. They
  are looked for with a compaction once a day, the first time a day after the table's first
  compaction (that one starts the clock): a new table's orphans are younger than the age (72 h
  by default), so there is nothing to delete yet, and a look lists the table's location — the
  first compaction of a 36k-row mirror took 2.6–3.1 s with it, later ones 0.7–0.8 s, and the
  pass waiting behind it set the freshness tail.
- What is due is decided by :func:`due` (pure) from the current snapshot's summary totals, and
  when maintenance last ran and how long it took, recorded on the table with its outcome (table
  properties: no snapshot, the position is untouched), so a restarted job does not compact again
  at once. Its cost is bounded by ``maxTimeShare``: after a run of d seconds the table waits
  d × (1 − share) ÷ share — small tables are compacted often (their readers see little debris),
  big ones rarely (their debris is small beside them). A table idle in a pass has its delete
  files compacted away as soon as that allows, so readers of a quiet table merge nothing.

Failure modes: a failing action (a conflict with a re-snapshot, storage or catalog errors) is
logged and recorded in :data:`MAINTENANCE_PROPERTY` (status shows it as ``lastMaintenance``); the data is
never at risk and the table is tried again after :meth:`Record.next_at`. An action cannot be
interrupted: a compaction started near the end of the budget finishes.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from lakeslot.api.models import MaintenanceSpec
from lakeslot.mirror.catalog import position_of
from lakeslot.mirror.contract import (
    LSN_PROPERTY,
    MAINTENANCE_AT_PROPERTY,
    MAINTENANCE_PROPERTY,
    MAINTENANCE_SECONDS_PROPERTY,
    MAINTENANCE_SUMMARY,
    ORPHANS_AT_PROPERTY,
)
from lakeslot.spark_session import error_summary, execute, iceberg_actions

log = logging.getLogger(__name__)
DELETED_ROWS_RATIO = 0.2  # compact once position deletes exceed this share of the live rows
DELETED_ROWS_MIN = 10_000  # ... and this many (merging a few deletes costs a reader nothing)
ORPHAN_INTERVAL_S = 86400.0  # orphan files are looked for once a day per table
# Table locations whose orphan files are listed through Hadoop's FileSystem; any other (s3://,
# gs://, abfs://…) through the table's FileIO by prefix: the image ships no Hadoop filesystem for
# object stores (hadoop-aws), and without usePrefixListing Iceberg failed with 'No FileSystem for
# scheme "s3"' (seen with S3FileIO on SeaweedFS).
HADOOP_LISTED = ("file:", "/", "hdfs:")
MANIFESTS_PER_SNAPSHOT = 8  # rewrite the manifests with a compaction once there are more


@dataclass(frozen=True)
class Health:
    """A table's file statistics: the totals of its current snapshot's summary."""

    data_files: int
    delete_files: int
    records: int
    position_deletes: int
    bytes: int

    @classmethod
    def of(cls, summary: Mapping[str, str]) -> Health:
        def total(name: str) -> int:
            return int(summary.get(f"total-{name}") or 0)
        return cls(total("data-files"), total("delete-files"), total("records"),
                   total("position-deletes"), total("files-size"))


@dataclass(frozen=True)
class Record:
    """When maintenance last ran, when it last removed orphan files (Unix seconds) and how long
    its last run took, from the table's properties (:data:`MAINTENANCE_AT_PROPERTY`,
    :data:`ORPHANS_AT_PROPERTY`, :data:`MAINTENANCE_SECONDS_PROPERTY`)."""

    at: float = -math.inf
    orphans_at: float = -math.inf
    took: float = 0.0

    @classmethod
    def of(cls, properties: Mapping[str, str]) -> Record:
        def seconds(name: str, absent: float = -math.inf) -> float:
            try:
                value = float(properties[name])
            except (KeyError, ValueError):
                return absent  # absent or unreadable: as if it never ran
            return value if math.isfinite(value) else absent
        return cls(seconds(MAINTENANCE_AT_PROPERTY), seconds(ORPHANS_AT_PROPERTY),
                   max(0.0, seconds(MAINTENANCE_SECONDS_PROPERTY, 0.0)))

    def next_at(self, spec: MaintenanceSpec) -> float:
        """The earliest time of the next run: ``intervalSeconds`` after this one, and late
        enough that maintenance takes at most ``maxTimeShare`` of the time."""
        share = spec.max_time_share
        return self.at + max(float(spec.interval_seconds), self.took * (1 - share) / share)


@dataclass(frozen=True)
class Due:
    """What a table needs: compaction (why, for the outcome), and orphan-file removal with it."""

    why: str = ""  # empty: nothing is due
    orphans: bool = False

    def __bool__(self) -> bool:
        return bool(self.why)


def due(health: Health, last: Record, spec: MaintenanceSpec, target_file_bytes: int,
        now: float, *, idle: bool = False) -> Due:
    """What maintenance a table needs now: compaction once delete files, deleted rows or surplus
    small files pass their thresholds — or, when the table was ``idle`` (no change in the pass),
    once it has any delete file — never before :meth:`Record.next_at`; orphan files are looked
    for with a compaction, at most once a day and not before a day after the first one (a table
    that never needs compacting writes none)."""
    if not spec.enabled or now < last.next_at(spec):
        return Due()
    needed = max(1, math.ceil(health.bytes / max(target_file_bytes, 1)))
    reasons = []
    if health.delete_files >= spec.delete_file_threshold:
        reasons.append(f"{health.delete_files} delete files")
    if health.position_deletes >= max(DELETED_ROWS_MIN, DELETED_ROWS_RATIO * health.records):
        reasons.append(f"{health.position_deletes} deleted rows of {health.records}")
    if health.data_files - needed >= spec.small_file_threshold:
        reasons.append(f"{health.data_files} data files where {needed} would do")
    if idle and health.delete_files and not reasons:
        reasons.append(f"idle with {health.delete_files} delete files")
    orphans = (bool(reasons) and spec.orphan_file_age_hours > 0
               and math.isfinite(last.orphans_at) and now - last.orphans_at >= ORPHAN_INTERVAL_S)
    return Due(", ".join(reasons), orphans)


class Maintainer:
    """Runs due maintenance on mirror tables through Iceberg's Spark actions (py4j)."""

    def __init__(self, spark, spec: MaintenanceSpec) -> None:
        self._spark, self._jvm, self.spec = spark, spark._jvm, spec
        self._actions = iceberg_actions(spark)

    def maintain(self, table, name: str, *, now: float | None = None,
                 idle: bool = False) -> str | None:
        """Maintain the Java Iceberg ``table`` (refreshed) if anything is due (``idle``: it had no
        change in the pass); returns the outcome (None: nothing was due). Errors are recorded on
        the table, then re-raised."""
        now = time.time() if now is None else now
        current = table.currentSnapshot()
        if current is None:
            return None
        summary = dict(current.summary())
        last = Record.of(dict(table.properties()))
        work = due(Health.of(summary), last, self.spec, _target_file_bytes(table), now, idle=idle)
        if not work:
            return None
        position = position_of(table)  # (a foreign compaction on top keeps its parent's)
        lsn = None if position is None else str(position)
        started, done = time.monotonic(), []
        try:
            done.append(self._compact(table, lsn, work.why))
            if work.orphans:
                done.append(self._remove_orphans(table, now))
        except Exception as e:
            outcome = (f"{_stamp(now)}: failed ({'; '.join(done) or 'nothing done'}): "
                       f"{error_summary(e)}")
            self._record(table, outcome, now, time.monotonic() - started)
            raise
        took = time.monotonic() - started
        outcome = f"{_stamp(now)}: {'; '.join(done)} in {took:.1f} s"
        self._record(table, outcome, now, took,
                     orphans=work.orphans or not math.isfinite(last.orphans_at))
        log.info("%s: maintenance: %s", name, outcome)
        return outcome

    def settled(self, table) -> bool:
        """Whether nothing can fall due on the Java Iceberg ``table`` before its data changes:
        :func:`due` finds no reason even for an idle table, whenever it is asked (no delete
        file, no threshold reached; orphan files are only looked for with a compaction)."""
        current = table.currentSnapshot()
        if current is None:
            return True
        return not due(Health.of(dict(current.summary())), Record(), self.spec,
                       _target_file_bytes(table), 0.0, idle=True)

    def _compact(self, table, lsn: str | None, why: str) -> str:
        """Rewrites every data file that has deletes (and small ones), then the delete files left
        over, then the manifests if there are many. New files take a new sequence number (not the
        starting one): nothing commits deletes concurrently, and so the old delete files no
        longer apply to anything."""
        result = execute(self._spark, self._tagged(
            self._actions.rewriteDataFiles(table), lsn, "compaction")
            .option("delete-file-threshold", "1")
            .option("use-starting-sequence-number", "false")
            .option("remove-dangling-deletes", "true"))
        text = (f"compacted ({why}): {result.rewrittenDataFilesCount()} data files rewritten "
                f"into {result.addedDataFilesCount()}")
        removed = result.removedDeleteFilesCount() + self._drop_dangling_deletes(table, lsn)
        text += f", {removed} delete files removed"
        table.refresh()
        manifests = table.currentSnapshot().allManifests(table.io()).size()
        if manifests > MANIFESTS_PER_SNAPSHOT:
            rewritten = execute(self._spark, self._tagged(self._actions.rewriteManifests(table),
                                                          lsn, "manifests"))
            text += (f", {_size(rewritten.rewrittenManifests())} manifests rewritten "
                     f"into {_size(rewritten.addedManifests())}")
        return text

    def _drop_dangling_deletes(self, table, lsn: str | None) -> int:
        """Removes the delete files that apply to no live data file any more — those of the data
        files just rewritten, which Iceberg drops itself only when no older data file is left —
        in one commit. Which delete files apply is what a scan plans: exactly what readers merge,
        so dropping the others changes no read. (Iceberg's rewritePositionDeletes would do it,
        but fails on tables with list columns: "Invalid partition field parent".)"""
        table.refresh()
        current = table.currentSnapshot()
        if current is None or not int(current.summary().get("total-delete-files") or 0):
            return 0
        live: set[str] = set()
        tasks = table.newScan().useSnapshot(current.snapshotId()).planFiles()
        try:
            for task in _each(tasks):
                live.update(d.location() for d in _each(task.deletes()))
        finally:
            tasks.close()
        files = self._jvm.org.apache.iceberg.ManifestFiles
        rewrite = table.newRewrite().validateFromSnapshot(current.snapshotId())
        dangling = 0
        for manifest in _each(current.deleteManifests(table.io())):
            for entry in _each(files.readDeleteManifest(manifest, table.io(), table.specs())):
                if entry.location() not in live:
                    rewrite = rewrite.deleteFile(entry.copy())
                    dangling += 1
        if dangling:
            self._tagged(rewrite, lsn, "delete-files", action=False).commit()
        return dangling

    @staticmethod
    def _tagged(update, lsn: str | None, what: str, *, action: bool = True):
        """An action (``snapshotProperty``) or a snapshot update (``set``) with lakeslot's summary
        properties: the position it keeps, and what it is."""
        update = (update.snapshotProperty if action else update.set)(MAINTENANCE_SUMMARY, what)
        if lsn is not None:
            update = (update.snapshotProperty if action else update.set)(LSN_PROPERTY, lsn)
        return update

    def _remove_orphans(self, table, now: float) -> str:
        older_than = int((now - self.spec.orphan_file_age_hours * 3600) * 1000)
        action = self._actions.deleteOrphanFiles(table).olderThan(older_than)
        if not table.location().startswith(HADOOP_LISTED):
            action = action.usePrefixListing(True)
        result = execute(self._spark, action)
        return f"{_size(result.orphanFileLocations())} orphan files removed"

    def _record(self, table, outcome: str, at: float, took: float, *,
                orphans: bool = False) -> None:
        update = (table.updateProperties().set(MAINTENANCE_PROPERTY, outcome)
                  .set(MAINTENANCE_AT_PROPERTY, repr(at))
                  .set(MAINTENANCE_SECONDS_PROPERTY, f"{took:.3f}"))
        if orphans:
            update = update.set(ORPHANS_AT_PROPERTY, repr(at))
        update.commit()


def _target_file_bytes(table) -> int:
    return int(table.properties().get("write.target-file-size-bytes") or 512 << 20)


def _each(iterable):
    """The elements of a Java ``Iterable`` (py4j does not iterate those)."""
    iterator = iterable.iterator()
    while iterator.hasNext():
        yield iterator.next()


def _size(iterable) -> int:
    return sum(1 for _ in _each(iterable))


def _stamp(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

