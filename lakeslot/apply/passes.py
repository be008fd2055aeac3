"""How an apply pass schedules its tables: the pass loop, from the staging listing to the status
document. What happens to each table is :mod:`lakeslot.apply.table_pass`'s; this module decides
which tables go through which phase, in what order, and what the pass reports.

A pass (:meth:`Passes.run_pass`), every step timed (:class:`lakeslot.apply.outcomes.Steps`):

1. ``prepare``: every table's mirror (:meth:`~lakeslot.apply.table_pass.TablePass.prepare`: read
   from the catalog, or as the last pass left it when it went through that pass),
   ``apply.tableParallelism`` at a time on the CPU, more waiting on the network
   (:mod:`lakeslot.apply.slots`);
   staging is listed; a table whose position is below the first staged segment is cut off (a
   definite error: its changes are gone).
2. ``scan``: the batch (:func:`lakeslot.apply.spread.scan`, at most ``max_segments`` segments
   from the lowest position).
3. ``plan``: lakeslot's DDL messages of the batch, then every table's plan.
4. ``reduce``: every table with changes at once (:mod:`lakeslot.apply.reduction`): the small
   batches the driver will apply itself are reduced by the driver, the rest on the executors.
5. Every planned table applied (:meth:`~lakeslot.apply.table_pass.TablePass.apply`),
   as many at a time, oldest change first (:func:`oldest_first`), then the reductions released.
6. Escalation of tables that keep failing transiently; ``cut``: the pass's cut in the cuts
   record (:mod:`lakeslot.apply.cut_record`): one commit, after every table commit of the pass,
   whatever the number of tables.
7. ``maintenance``: upkeep
   (:mod:`lakeslot.apply.upkeep`: expiry, the cuts record's upkeep, compaction — at most its
   share of a pass that applied changes; in a pass that applied none, until new segments are
   sealed —, retention), lifting the errors of tables that work again.
8. ``status``: the status document ``<staging>/apply-status.json``.

Invariants:

- Every table of the job has exactly one outcome per pass, reported in the job's table order.
- Each table's work runs through :meth:`lakeslot.apply.failures.Failures.attempt`: an error of
  one table becomes that table's outcome and the pass goes on (DESIGN.md "Isolation"); when
  the source cannot be read for the DDL messages, no table is planned and each is ``retrying``.
- Retention sees every table's outcome, failed ones included (their changes wait in staging).
- Tables are applied in the order of their first change in the batch, those without one (an
  advance) last: a change waits for the batch after it, then for its table's turn in the pass;
  in that order the two add up to about one pass whatever the table, where in the job's order a
  late table's change waited up to two (at 1,000 tables the cold tables, each with a change or
  two, were the p99 of commit → visible).
- Passes start on the seals' grid (:mod:`lakeslot.cadence`): :meth:`Passes.until_next_pass`.

Failure modes: an error that belongs to no table — staging or the catalog unreachable, a gap in
staging (:class:`lakeslot.staging.segments.GapError`) — propagates out of :meth:`Passes.run_pass`:
the pass fails as a whole (the caller counts it and ends the job). Hooks
(:class:`lakeslot.apply.outcomes.Hooks`) may raise at any of their points to simulate a crash.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn, TypeVar

import pyarrow as pa

from lakeslot import cadence, lsn_text
from lakeslot.api.naming import TableName
from lakeslot.apply import slots, spread
from lakeslot.apply.changes import TableError
from lakeslot.apply.cut_record import CutRecord
from lakeslot.apply.failures import Exhausted, Failures
from lakeslot.apply.outcomes import Hooks, PassResult, Steps, TableOutcome, Totals, now_text
from lakeslot.apply.reduction import Reduction
from lakeslot.apply.table_pass import Planned, TablePass
from lakeslot.apply.upkeep import Upkeep
from lakeslot.mirror import catalogs
from lakeslot.mirror.contract import TableState
from lakeslot.spark.session import make_active, on_threads
from lakeslot.spark.tables import Tables
from lakeslot.staging.segments import SegmentName
from lakeslot.staging.store import Staging
from lakeslot.workloads import JobInput

log = logging.getLogger("lakeslot.apply.job")
T = TypeVar("T")
NEWS_INTERVAL_S = 1.0  # an idle pass's maintenance looks for new seals at most this often


def oldest_first(plans: Mapping[TableName, Planned]) -> list[TableName]:
    """The planned tables in the order a pass applies them (see the module docstring): by the
    commit LSN of their first change in the batch, those without changes last, ties in the
    job's order."""
    return sorted(plans, key=lambda t: (plans[t].scan.oldest is None, plans[t].scan.oldest or 0))


class Passes:
    """One apply job's passes (its memory: the furthest segment listed, the lag behind the
    seals, the totals since the job started)."""

    def __init__(self, spark, job: JobInput, tables: Tables, staging: Staging, hooks: Hooks,
                 failures: Failures, totals: Totals, work: TablePass, reduction: Reduction,
                 upkeep: Upkeep, max_segments: int, *, continuous: bool = True) -> None:
        self.spark, self.job, self.spec = spark, job, job.ingestion.spec
        self.tables, self.staging, self.hooks = tables, staging, hooks
        self.failures, self.totals = failures, totals
        self.work, self.reduction, self.upkeep = work, reduction, upkeep
        self.max_segments = max_segments
        self.interval = self.spec.apply.trigger_interval_seconds
        self.parallelism = self.spec.apply.table_parallelism
        self.threads = slots.threads(self.parallelism, catalogs.on_network(self.spec.sink.catalog))
        self.lag = cadence.Lag(self.spec.seal_seconds())  # passes behind the seals
        self._seen_end: int | None = None  # the furthest segment end a listing showed
        self.continuous = continuous
        self._news_at = -math.inf  # when maintenance last listed staging for news (monotonic)
        self.cuts = CutRecord(spark, job, tables)

    def run_pass(self) -> PassResult:
        started = time.monotonic()
        make_active(self.spark)  # (the JVM thread may lose it)
        self.tables.ensure_namespace(self.spec.sink.namespace)
        self.failures.retried_now = set()
        outcomes: dict[TableName, TableOutcome] = {}
        states: dict[TableName, TableState] = {}
        steps = Steps()
        self.work.begin(steps)
        with steps("prepare"):
            for table, prepared in self._each(self.job.tables, self.work.prepare).items():
                if isinstance(prepared, TableState):
                    states[table] = prepared
                else:
                    outcomes[table] = prepared
        staged = self._list_staging()
        for table, state in list(states.items()):
            position = state.position
            if staged and position > 0 and position + 1 < staged[0].start:
                outcomes[table] = self.failures.attempt(table, functools.partial(
                    _cut_off, table, position, staged[0].start))
                del states[table]
        with steps("scan"):
            batch = spread.scan(self.staging, staged, {t: s.position for t, s in states.items()},
                                max_segments=self.max_segments)
        self.hooks("batch-read")
        planned: dict[TableName, Planned] = {}
        with steps("plan"):
            read = self.failures.retried("reading lakeslot's DDL messages",
                                         functools.partial(self.work.read_messages, batch))
            if isinstance(read, Exhausted):  # (the source is down: nothing can be planned)
                outcomes.update((t, self.failures.retrying(t, read.error)) for t in states)
                states = {}
            for table, state in states.items():
                plan = self.failures.attempt(table, functools.partial(
                    self.work.plan, table, state, batch))
                if isinstance(plan, Planned):
                    planned[table] = plan
                else:
                    outcomes[table] = plan
        with steps("reduce"):
            reduced = self.reduction.reduce(
                batch, [p.config for p in planned.values() if p.scan.changes], outcomes,
                here=self.work.reduced_here(planned))
        try:
            todo = {t: p for t, p in planned.items() if t not in outcomes}
            small = self.work.small_rows(todo, reduced)
            outcomes.update(self._apply(list(todo.items()), batch, reduced, small))
        finally:
            for each in {id(r): r for r in reduced.values()}.values():
                each.release()
        self.hooks("after-tables")
        self.failures.escalate(outcomes)
        ordered = tuple(outcomes[t] for t in self.job.tables)
        with steps("cut"):  # (before maintenance: the cut is readable as soon as it can be)
            self.cuts.record(batch.end, ordered, self.threads)
        busy = time.monotonic() - started  # (the pass so far: maintenance gets a share of it)
        applied = any(o.state == "applied" for o in ordered)
        with steps("maintenance"):
            self.upkeep.expire(ordered, self.cuts.retained, self.threads)
            self.upkeep.keep_record(self.cuts.name)
            for table, error in self.upkeep.maintain(
                    ordered, busy if applied else 0.0,
                    wanted=lambda: not applied and self._sealed_since()).items():
                outcomes[table] = self.failures.retryable(table, error)
            ordered = tuple(outcomes[t] for t in self.job.tables)
            self.failures.recovered(ordered)
            self.work.settle(ordered)
            deleted = self.upkeep.retention(ordered, staged)
        self.hooks("after-retention")
        result = PassResult(batch.end, len(batch.segments) == self.max_segments, ordered, deleted,
                            steps.seconds, time.monotonic() - started)
        self.totals.add_pass(result, batch.tables)
        with steps("status"):
            self._write_status(result)
        return result

    def _apply(self, todo: list[tuple[TableName, Planned]], batch: spread.Batch,
               reduced: dict[TableName, spread.Reduced], small: dict[TableName, pa.Table]
               ) -> dict[TableName, TableOutcome]:
        """Each planned table applied (:meth:`TablePass.apply`): each table's MERGE and commit
        its own; a retry first asks whether the failed attempt's commit landed
        (:meth:`TablePass.landed`)."""
        plans, tried = dict(todo), set()

        def apply(table: TableName) -> TableOutcome:
            if table in tried and (landed := self.work.landed(table, plans[table], batch)):
                return landed  # (a retry: the commit may have landed, its answer lost)
            tried.add(table)
            return self.work.apply(table, plans[table], batch, reduced.get(table),
                                   small.get(table))

        return self._each(oldest_first(plans), apply)

    def _each(self, tables: Sequence[TableName], work: Callable[[TableName], T]
              ) -> dict[TableName, T | TableOutcome]:
        """``work`` for each table through :meth:`Failures.attempt`, on :attr:`threads` threads of
        this Spark application (one with ``apply.tableParallelism`` 1), in ``tables``' order; an
        error that belongs to no table ends the pass once the tables in flight are done."""
        def one(table: TableName) -> T | TableOutcome:
            return self.failures.attempt(table, functools.partial(work, table))

        return on_threads(self.spark, 1 if self.parallelism == 1 else self.threads, tables, one,
                          "lakeslot-apply")

    def until_next_pass(self, started: float) -> float:
        """Seconds until the pass after one that started at the wall time ``started``, just after
        a seal when the interval allows (:func:`lakeslot.cadence.wait`)."""
        return cadence.wait(started, self.interval, self.lag.period, self.lag.seconds, time.time())

    def _list_staging(self) -> list[SegmentName]:
        """The sealed segments; when those new since the last listing were sealed feeds the
        passes' lag behind the seals (:mod:`lakeslot.cadence`) — not those of the job's first
        listing, which may have been sealed long before, by size or by an older reader."""
        listing = self.staging.listing()
        seen = self._seen_end
        if seen is not None:
            self.lag.observe(t for name, t in listing if t is not None and name.end > seen)
        self._seen_end = max((name.end for name, _ in listing), default=seen)
        return [name for name, _ in listing]

    def _sealed_since(self) -> bool:
        """In a continuous job, whether segments were sealed since this pass listed staging (a
        listing at most every :data:`NEWS_INTERVAL_S`): an idle pass's maintenance then makes
        way for the next pass — its budget is ``budgetSeconds``, long for a change to wait."""
        now = time.monotonic()
        if not self.continuous or now - self._news_at < NEWS_INTERVAL_S:
            return False
        self._news_at = now
        seen = self._seen_end
        try:
            listing = self.staging.listing()
        except Exception as e:  # noqa: BLE001 - not worth failing the pass: maintenance goes on
            log.info("looking for new segments failed: %s", e)
            return False
        return any(seen is None or name.end > seen for name, _ in listing)

    def _write_status(self, result: PassResult) -> None:
        document = {
            "version": 1, "ingestion": self.job.names.owner,
            "updatedAt": now_text(),
            "batchEnd": None if result.end is None else lsn_text.format(result.end),
            "segmentsDeleted": result.deleted,
            "tables": [t.document() for t in result.tables],
            "totals": self.totals.document()}
        self.staging.write_apply_status(document)


def _cut_off(table: TableName, position: int, first: int) -> NoReturn:
    raise TableError(
        f"{table}: the mirror reflects {lsn_text.format(position)} but staging starts at "
        f"{lsn_text.format(first)}: the changes in between are gone (the slot was recreated after "
        "it was lost, or segments were deleted by hand); re-snapshot the table", resnapshot=True)
