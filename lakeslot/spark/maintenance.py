"""Maintenance of the mirror tables through Spark: compaction, manifest rewrite and orphan-file
removal, run by the apply job between passes (``spec.sink.maintenance``) when
:func:`lakeslot.mirror.maintenance_policy.due` says so.

Invariants:

- **The position never moves.** Every commit maintenance makes (a compaction — on the driver
  for a small table, :mod:`lakeslot.spark.driver_compaction`, else Iceberg's
  ``rewriteDataFiles`` action —, the manifests' rewrite — on the driver for an unpartitioned
  table, lakeslot's ``Manifests``, else Spark's ``rewriteManifests`` action —, a ``replace``
  snapshot) carries ``lakeslot.lsn`` equal to the position the table had when it started (the
  actions' ``snapshotProperty``) and rewrites files, never rows: the table's content and
  position are those of the commit before it.
- **Never concurrent with the apply job's own commits**: it runs in the apply job's thread
  between passes (:meth:`lakeslot.apply.passes.Passes.run_pass`). The only other writer of a mirror
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
- Each run's outcome, when it ran and how long it took are recorded on the table (properties,
  no snapshot) for the next decision (:class:`lakeslot.mirror.maintenance_policy.Record`).

Failure modes: a failing action (a conflict with a re-snapshot, storage or catalog errors) is
logged and recorded in :data:`MAINTENANCE_PROPERTY` (status shows it as ``lastMaintenance``); the data is
never at risk and the table is tried again after :meth:`Record.next_at`. An action cannot be
interrupted: a compaction started near the end of the budget finishes.
"""
from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import math
import time
from dataclasses import dataclass

import pyarrow as pa

from lakeslot.api.models import MaintenanceSpec
from lakeslot.mirror.contract import (
    LSN_PROPERTY,
    MAINTENANCE_AT_PROPERTY,
    MAINTENANCE_PROPERTY,
    MAINTENANCE_SECONDS_PROPERTY,
    MAINTENANCE_SUMMARY,
    ORPHANS_AT_PROPERTY,
)
from lakeslot.mirror.maintenance_policy import MANIFESTS_PER_SNAPSHOT, Health, Record, due
from lakeslot.spark import driver_compaction, row_delta
from lakeslot.spark.helpers import MANIFESTS, loaded
from lakeslot.spark.session import each, error_summary, execute, iceberg_actions, on_threads
from lakeslot.spark.tables import position_of, python_dict

log = logging.getLogger(__name__)
# Table locations whose orphan files are listed through Hadoop's FileSystem; any other (s3://,
# gs://, abfs://…) through the table's FileIO by prefix: the image ships no Hadoop filesystem for
# object stores (hadoop-aws), and without usePrefixListing Iceberg failed with 'No FileSystem for
# scheme "s3"' (seen with S3FileIO on SeaweedFS).
HADOOP_LISTED = ("file:", "/", "hdfs:")
# a driver compaction's data files (each with its delete files) on object storage read at once,
# at most
COMPACTION_READS = 8


@dataclass(frozen=True)
class Look:
    """A table as maintenance sees it: its current snapshot's health (None: no snapshot), the
    record of its last maintenance, and its target data file size."""
    health: Health | None
    last: Record
    target_file_bytes: int


class Maintainer:
    """Runs due maintenance on mirror tables: on the driver where it can, else through
    Iceberg's Spark actions (py4j)."""

    def __init__(self, spark, spec: MaintenanceSpec,
                 positions: row_delta.Positions | None = None) -> None:
        """``positions``: the apply job's (its planning is shared with the driver's compaction,
        which tells it the files it left); None: every compaction is Spark's action."""
        self._spark, self._jvm, self.spec = spark, spark._jvm, spec
        self._actions = iceberg_actions(spark)
        self._manifests = loaded(self._jvm, MANIFESTS)  # (None: Spark's action rewrites them)
        self._positions = positions if driver_compaction.available(self._jvm) else None
        self._session_codec = row_delta.session_codec(spark)

    def look(self, table) -> Look:
        """What :meth:`maintain` and :meth:`settled` decide from, read from the Java Iceberg
        ``table`` (refreshed) once: its current snapshot's summary and its properties."""
        current = table.currentSnapshot()
        properties = python_dict(self._jvm, table.properties())
        return Look(None if current is None else Health.of(python_dict(self._jvm, current.summary())),
                    Record.of(properties),
                    int(properties.get("write.target-file-size-bytes") or 512 << 20))

    def maintain(self, table, name: str, *, now: float | None = None, idle: bool = False,
                 look: Look | None = None) -> str | None:
        """Maintain the Java Iceberg ``table`` (refreshed; ``look``: what :meth:`look` found on
        it) if anything is due (``idle``: it had no change in the pass); returns the outcome
        (None: nothing was due). Errors are recorded on the table, then re-raised."""
        now = time.time() if now is None else now
        look = self.look(table) if look is None else look
        if look.health is None:
            return None
        work = due(look.health, look.last, self.spec, look.target_file_bytes, now, idle=idle)
        if not work:
            return None
        position = position_of(table)  # (a foreign compaction on top keeps its parent's)
        lsn = None if position is None else str(position)
        started, done = time.monotonic(), []
        try:
            done.append(self._compact(table, lsn, work.why, look))
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
                     orphans=work.orphans or not math.isfinite(look.last.orphans_at))
        log.info("%s: maintenance: %s", name, outcome)
        return outcome

    def settled(self, look: Look) -> bool:
        """Whether nothing can fall due on a table (``look``: what :meth:`look` found on it)
        before its data changes: :func:`due` finds no reason even for an idle table, whenever it
        is asked (no delete file, no threshold reached; orphan files are only looked for with a
        compaction)."""
        return look.health is None or not due(look.health, Record(), self.spec,
                                              look.target_file_bytes, 0.0, idle=True)

    def _compact(self, table, lsn: str | None, why: str, look: Look) -> str:
        """Rewrites every data file that has deletes (and small ones), then the delete files left
        over, then the manifests if there are many: a small table on the driver
        (:mod:`lakeslot.spark.driver_compaction`: all its files into one), any other by Spark's
        action. New files take a new sequence number (not the starting one): nothing commits
        deletes concurrently, and so the old delete files no longer apply to anything."""
        left = None  # the live files the driver's compaction left (None: Spark's action ran)
        if self._positions is not None:
            assert look.health is not None  # (maintain compacts only a table with a snapshot)
            try:
                # (its files read several at once where they are not on local disk, as the Java
                # side reads its manifests: Compactions.java)
                reads = COMPACTION_READS if row_delta.local_path(table.location()) is None else 1
                done = driver_compaction.compact(
                    self._jvm, table, self._positions, _summary(lsn, "compaction"),
                    self._session_codec, look.health.bytes, look.target_file_bytes,
                    functools.partial(on_threads, self._spark, reads,
                                      name="lakeslot-compaction-read"))
            except row_delta.Unsupported as e:
                log.debug("%s: compacted by Spark: %s", table.name(), e)
            else:
                left = done.files
                text = (f"compacted ({why}) on the driver: {done.data_files} data files "
                        f"rewritten into {len(left)}, {done.delete_files} delete files removed")
        if left is None:
            result = execute(self._spark, self._tagged(
                self._actions.rewriteDataFiles(table), lsn, "compaction")
                .option("delete-file-threshold", "1")
                .option("use-starting-sequence-number", "false"))
            removed = result.removedDeleteFilesCount() + self._drop_dangling_deletes(table, lsn)
            text = (f"compacted ({why}): {result.rewrittenDataFilesCount()} data files rewritten "
                    f"into {result.addedDataFilesCount()}, {removed} delete files removed")
            table.refresh()  # (the driver's commit left ``table`` as it made it: no request)
        manifests = table.currentSnapshot().allManifests(table.io()).size()
        if manifests > MANIFESTS_PER_SNAPSHOT:
            replaced, created = self._rewrite_manifests(table, lsn, left)
            text += f", {replaced} manifests rewritten into {created}"
        return text

    def _rewrite_manifests(self, table, lsn: str | None,
                           left: pa.Table | None) -> tuple[int, int]:
        """The data manifests rewritten (how many replaced, how many created): an unpartitioned
        table's by lakeslot's ``Manifests`` on the driver (:mod:`lakeslot.spark.helpers`), in
        one group; else — partitioned, or a JVM without the class — by Spark's action, which
        clusters them by partition (a Spark job: ≈ 0.3 s of a small table's 0.5-s compaction).
        ``left``: the live files the driver's compaction left, if it ran (the snapshot made here
        has the same)."""
        if self._manifests is not None and table.spec().isUnpartitioned():
            counts = json.loads(self._manifests.rewrite(
                table, json.dumps(_summary(lsn, "manifests"))))
            if left is not None and self._positions is not None:
                self._positions.known(counts["manifest_list"], left)
            return counts["replaced"], counts["created"]
        rewritten = execute(self._spark, self._tagged(self._actions.rewriteManifests(table), lsn,
                                                      "manifests"))
        return _size(rewritten.rewrittenManifests()), _size(rewritten.addedManifests())

    def _drop_dangling_deletes(self, table, lsn: str | None) -> int:
        """Removes the delete files that apply to no live data file any more — those of the data
        files just rewritten — in one commit, tagged like every maintenance commit (the
        rewrite's own ``remove-dangling-deletes`` committed without its summary properties, and
        dropped them only when no older data file was left). Which delete files apply is what
        a scan plans: exactly what readers merge, so dropping the others changes no read.
        (Iceberg's rewritePositionDeletes would do it, but fails on tables with list columns:
        "Invalid partition field parent".)"""
        table.refresh()
        current = table.currentSnapshot()
        if current is None or not int(current.summary().get("total-delete-files") or 0):
            return 0
        live: set[str] = set()
        tasks = table.newScan().useSnapshot(current.snapshotId()).planFiles()
        try:
            for task in each(tasks):
                live.update(d.location() for d in each(task.deletes()))
        finally:
            tasks.close()
        files = self._jvm.org.apache.iceberg.ManifestFiles
        rewrite = table.newRewrite().validateFromSnapshot(current.snapshotId())
        dangling = 0
        for manifest in each(current.deleteManifests(table.io())):
            for entry in each(files.readDeleteManifest(manifest, table.io(), table.specs())):
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
        for name, value in _summary(lsn, what).items():
            update = (update.snapshotProperty if action else update.set)(name, value)
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


def _summary(lsn: str | None, what: str) -> dict[str, str]:
    """The summary properties of a maintenance commit: what it is, and the position it keeps."""
    return {MAINTENANCE_SUMMARY: what, **({} if lsn is None else {LSN_PROPERTY: lsn})}


def _size(iterable) -> int:
    return sum(1 for _ in each(iterable))


def _stamp(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
