"""Table upkeep after each apply pass: old snapshots expired, compaction and clean-up where due
(the mirrors' and the cuts record's), and staging's retention — work that keeps readers' cost
and staging's size flat over time (DESIGN.md "Scale"), never work that changes what a table
holds.

Invariants: every step keeps each table's position (``lakeslot.lsn``); retention deletes only
sealed segments wholly at or below every table's committed position (failed tables included:
their changes wait there; an idle table's uncommitted advance does not count:
:mod:`lakeslot.apply.coverage`) and never while a table waits for its snapshot. Failure modes: expiring
snapshots only logs (the data is safe); maintenance that fails transiently is tried again
later, and a table whose maintenance fails otherwise, or keeps failing, is returned with why
(:meth:`Upkeep.maintain`): it fails alone (:mod:`lakeslot.apply.isolation`).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.apply import coverage, isolation
from lakeslot.apply.outcomes import WENT_THROUGH, Hooks, TableOutcome, Totals
from lakeslot.errors import transient_in_spark
from lakeslot.mirror.contract import LSN_PROPERTY, RETAINED_FOR_S, history_age_s
from lakeslot.spark import row_delta
from lakeslot.spark.maintenance import Maintainer
from lakeslot.spark.session import error_summary, on_threads, with_commit_properties
from lakeslot.spark.tables import Tables
from lakeslot.staging.segments import SegmentName
from lakeslot.staging.store import Staging

log = logging.getLogger("lakeslot.apply.job")
EXPIRE_INTERVAL_S = 3600.0
EXPIRE_MIN_S = 60.0  # a table's expiry at most this often (a commit: not every pass of a 1 s job)
MAINTENANCE_LOOK_S = 5.0  # how often maintenance looks at a table's health, at most
SETTLED_LOOK_S = 600.0  # ... and at an idle table a look found settled (see maintain)
RECORD_HISTORY_S = 600.0  # the cuts record keeps its own snapshots this long (keep_record)
RECORD_TRIM_S = 600.0  # ... and its rows no readable cut needs are deleted this often


class Upkeep:
    """The upkeep of one apply job's tables (its memory: when each was last expired and looked
    at, which were found settled, maintenance failures in a row)."""

    def __init__(self, spark, spec, tables: Tables, staging: Staging, hooks: Hooks,
                 totals: Totals, expire_interval_s: float = EXPIRE_INTERVAL_S,
                 stop: threading.Event | None = None,
                 positions: row_delta.Positions | None = None) -> None:
        self.spec, self.tables, self.staging, self.hooks, self.totals = (spec, tables, staging,
                                                                         hooks, totals)
        self.stop = stop or threading.Event()  # the job's: set, no further table is maintained
        self.maintainer = Maintainer(spark, spec.sink.maintenance, positions)
        self.expire_interval_s = expire_interval_s
        self.spark = spark
        self._expired: dict[str, float] = {}  # table → monotonic time of its last expiry
        self._commits: dict[str, int] = {}  # table → its commits since then
        self._trimmed: dict[str, float] = {}  # the cuts record → when its old rows were deleted
        self._looked: dict[str, float] = {}  # table → monotonic time maintenance last looked
        self._settled: dict[str, float] = {}  # table → when a look found it settled (monotonic)
        self._failures = isolation.Streaks()  # maintenance failures in a row, per table
        self._turn: str | None = None  # the table the last pass's budget ran out before

    def targets(self, outcomes: tuple[TableOutcome, ...],
                states: tuple[str, ...] = ("applied", "advanced")
                 ) -> Iterator[tuple[TableName, str]]:
        """The Iceberg tables of ``outcomes`` in ``states`` — by default those this pass
        committed to —: mirrors and their changelog tables, each with its source table."""
        suffix = self.spec.sink.changelog.suffix if self.spec.sink.changelog.enabled else None
        for outcome in outcomes:
            if outcome.state in states:
                yield outcome.source, outcome.target
                if suffix:
                    yield outcome.source, outcome.target + suffix

    def expire(self, outcomes: tuple[TableOutcome, ...],
               retained: dict[str, dict[str, int]] | None = None, threads: int = 1) -> None:
        """Expire old snapshots of the tables this pass committed to, by the tables' own
        ``history.expire.*`` properties, else older than
        :func:`lakeslot.mirror.contract.history_age_s` (the recent window, bounded by the trigger
        interval: the snapshot count stays bounded), each table at most once per
        ``expire_interval_s`` or an eighth of that age (at least :data:`EXPIRE_MIN_S`), and
        only once it made as many commits since its last expiry as a table committing every
        pass makes in that time (or ``expire_interval_s`` has passed): what a table keeps stays
        bounded by commits, not time, and when passes are slower than the trigger (hundreds of
        busy tables) an expiry is not paid for a handful of snapshots. The tables' turns are
        spread over that interval by name; an idle table whose advance is kept in memory made
        no snapshot to expire, and waits for its next commit. First the snapshots of the
        retained cuts not tagged yet (``retained``: mirror → tag → snapshot id,
        :meth:`lakeslot.apply.cut_record.CutRecord.retained`) are tagged, kept
        :data:`lakeslot.mirror.contract.RETAINED_FOR_S`; a table's entry goes once tagged. The
        tables due expire at once (on up to ``threads``, the pass's): on object storage an
        expiry is a chain of requests (it reads each expired snapshot's manifest list), and one
        after the other they cost the pass their sum. Failures only log: the data is safe."""
        trigger = self.spec.apply.trigger_interval_seconds
        age = history_age_s(trigger)
        interval = min(self.expire_interval_s, max(EXPIRE_MIN_S, age / 8))
        commits = math.ceil(interval / max(trigger, 1e-3))  # a pass's commits in that interval
        retained = {} if retained is None else retained
        due = []
        now = time.monotonic()
        for _, target in self.targets(tuple(o for o in outcomes if o.committed is None)):
            if target not in self._expired:  # (spread by name: not every table in one pass)
                self._expired[target] = now - interval * coverage.spread(target)
                self._commits[target] = int(commits * coverage.spread(target))
            self._commits[target] += 1
            if (self._commits[target] >= commits or now - self._expired[target]
                    >= self.expire_interval_s) and first_within(self._expired, target, interval):
                self._commits[target] = 0
                due.append(target)

        def expire(target: str) -> str | None:
            try:
                self.tables.expire_snapshots(target, age, retained.get(target), RETAINED_FOR_S)
                return target
            except transient_in_spark() as e:
                log.warning("%s: expiring old snapshots failed (retried later): %s", target,
                            error_summary(e))
                return None

        for done in on_threads(self.spark, threads, due, expire, "lakeslot-expire").values():
            if done is not None:
                retained.pop(done, None)

    def maintain(self, outcomes: tuple[TableOutcome, ...], busy_s: float = 0.0,
                 wanted: Callable[[], bool] = lambda: False) -> dict[TableName, str]:
        """Compaction and clean-up where due (:mod:`lakeslot.mirror.maintenance_policy`), table after
        table until the pass's maintenance budget is spent; the rest waits for the next pass,
        which starts with them (the tables take turns). The budget is
        ``maintenance.budgetSeconds``, and in a pass that applied changes for ``busy_s`` seconds
        at most ``maxTimeShare`` of the job's time (``busy_s × share ÷ (1 − share)``): with
        hundreds of busy tables, each due in turn, maintenance would otherwise double every
        pass. One table starts in any pass, whatever its budget (a started compaction
        finishes); no further one once ``wanted`` says the job is wanted for something else
        (asked between tables: changes wait for an idle pass's end), and none once the job is
        stopping.
        A transient failure logs (the data is safe) and is tried again later; a table whose
        maintenance fails otherwise, or :data:`isolation.MAINTENANCE_STREAK` times in a row, is
        returned with why (its reads would only grow slower): it fails alone.

        A look at a table this pass committed to reads it as the commit left it; at another it
        loads the table (a catalog call, and reads its metadata). Either at most every
        :data:`MAINTENANCE_LOOK_S`, and an idle table that a look found *settled* — nothing can
        fall due before its data changes — is not looked at again until a pass changes it (or
        :data:`SETTLED_LOOK_S` has passed: another writer's commits), so a quiet table costs
        the catalog nothing pass after pass."""
        spec = self.spec.sink.maintenance
        budget = float(spec.budget_seconds)
        share = spec.max_time_share
        if busy_s > 0 and share < 1:
            budget = min(budget, busy_s * share / (1 - share))
        deadline = time.monotonic() + budget
        # idle: no change in this pass (nothing sealed for it, or nothing sealed at all — a
        # quiet source: such a table is looked at too, its delete files are compacted away)
        idle = {target for _, target in self.targets(outcomes, ("advanced", "current"))}
        failed: dict[TableName, str] = {}
        targets = list(self.targets(outcomes, WENT_THROUGH))
        turn = next((i for i, (_, t) in enumerate(targets) if t == self._turn), 0)
        started = False  # (whether a table was looked at in this pass)
        for source, target in targets[turn:] + targets[:turn]:
            if not spec.enabled or self.stop.is_set() or (
                    started and (time.monotonic() >= deadline or wanted())):
                self._turn = target  # (first in the next pass)
                return failed
            if source in failed:
                continue
            if target not in idle:
                self._settled.pop(target, None)  # its data changed: anything may be due
            elif time.monotonic() - self._settled.get(target, -math.inf) < SETTLED_LOOK_S:
                continue
            if not first_within(self._looked, target, MAINTENANCE_LOOK_S):
                continue  # (a look loads the table: not on every pass of a fast trigger)
            started = True
            try:
                self.hooks("before-maintenance", source)
                # (a table this pass committed to is held as its commit left it: no request)
                table = (self.tables.iceberg_table(target) if target in idle
                         else self.tables.held(target))
                look = self.maintainer.look(table)
                if self.maintainer.maintain(table, target, idle=target in idle, look=look):
                    self.totals.maintenance["ran"] = self.totals.maintenance.get("ran", 0) + 1
                elif self.maintainer.settled(look):
                    self._settled[target] = time.monotonic()
            except Exception as e:  # noqa: BLE001 - transient or not, it is this table's
                self.totals.maintenance["failed"] = self.totals.maintenance.get("failed", 0) + 1
                streak = self._failures.failed(target)
                error = f"{type(e).__name__}: {error_summary(e)}"
                if isinstance(e, transient_in_spark()) and streak < isolation.MAINTENANCE_STREAK:
                    log.warning("%s: maintenance failed (tried again later): %s", target, error)
                    continue
                self._failures.passed(target)
                failed[source] = (
                    f"maintenance of {target} failed ({streak} time(s) in a row): {error}; "
                    "without it the table's reads grow slower with every pass. Fix the cause "
                    "(the error names it), or turn maintenance off (sink.maintenance.enabled: "
                    "false) and maintain the table yourself")
            else:
                self._failures.passed(target)
        return failed

    def keep_record(self, name: str) -> None:
        """The upkeep of the cuts record ``name`` (:mod:`lakeslot.apply.cut_record`: a small
        file and a snapshot per pass): its snapshots older than :data:`RECORD_HISTORY_S` expired
        (its rows are the history, not its snapshots); every :data:`RECORD_TRIM_S` (a Spark
        query and DELETE) the rows no cut still readable needs: those of cuts recorded more than
        :data:`lakeslot.mirror.contract.RETAINED_FOR_S` ago, and those of the cuts neither
        retained nor in the recent window (their snapshots are expired) — below the latest full
        listing older than the window, so that every cut left has its full listing and every
        row since it; its files compacted where due as a mirror's are. Looked at most every
        :data:`MAINTENANCE_LOOK_S`. Failures only log (the record is only read, and the next
        look tries again)."""
        if not first_within(self._looked, name, MAINTENANCE_LOOK_S) or not self.tables.exists(name):
            return
        try:
            if first_within(self._expired, name, RECORD_HISTORY_S / 8):
                self.tables.expire_snapshots(name, RECORD_HISTORY_S)
            if first_within(self._trimmed, name, RECORD_TRIM_S):
                self._trim(name)
            if self.spec.sink.maintenance.enabled and not self.stop.is_set():
                self.maintainer.maintain(self.tables.iceberg_table(name), name)
        except Exception as e:  # noqa: BLE001 - the record's upkeep never fails a pass
            log.warning("%s: upkeep of the cuts record failed (tried again later): %s", name,
                        error_summary(e))

    def _trim(self, name: str) -> None:
        """Delete the cuts record's rows no readable cut needs (see :meth:`keep_record`), in a
        commit that keeps its ``lakeslot.lsn`` (the latest cut)."""
        now = dt.datetime.now(dt.UTC)

        def at(seconds: float) -> str:
            return f"TIMESTAMP '{now - dt.timedelta(seconds=seconds):%Y-%m-%d %H:%M:%S.%f}+00:00'"

        record = self.tables.qualified(name)
        window = history_age_s(self.spec.apply.trigger_interval_seconds)
        # (refreshed first: Spark reads the catalog's cached table object, which the cut
        # record's commits through an object of its own may have left behind)
        latest = self.tables.lsn(name)
        [[floor]] = self.spark.sql(
            f"SELECT max(cut_lsn) FROM {record} WHERE kind = 'cut' AND full_listing AND "
            f"recorded_at < {at(window)}").collect()
        condition = f"recorded_at < {at(RETAINED_FOR_S)}" + (
            "" if floor is None else f" OR (NOT retained AND cut_lsn < {int(floor)})")
        with_commit_properties(self.spark, {LSN_PROPERTY: str(latest)},
                               lambda: self.spark.sql(f"DELETE FROM {record} WHERE {condition}"))

    def retention(self, outcomes: tuple[TableOutcome, ...], names: list[SegmentName]) -> int:
        if any(o.lsn is None for o in outcomes):
            return 0  # a table waits for its snapshot: every staged change may still be needed
        floor = min((o.durable for o in outcomes if o.durable is not None), default=None)
        if floor is None:
            return 0
        deleted = self.staging.delete_applied(names, floor,
                                              time.time() - self.spec.staging.retention_seconds)
        if deleted:
            log.info("retention removed %d segments at or below %s", deleted,
                     lsn_text.format(floor))
        return deleted

def first_within(marks: dict[str, float], key: str, interval_s: float) -> bool:
    """Whether ``key`` was last marked ``interval_s`` or longer ago (or never); if so, marks it
    now (monotonic time)."""
    now = time.monotonic()
    if now - marks.get(key, -math.inf) < interval_s:
        return False
    marks[key] = now
    return True


