"""The apply job: sealed segments → per-table MERGE commits, each tagged with the LSN it reflects.

:func:`run` is the whole job: ``spark_jobs/apply.py`` calls it, and local mode calls it in-process
with its own SparkSession::

    result = run(spark, job_input, once=True)          # one pass over everything sealed now
    run(spark, job_input, once=False, stop=event)      # until ``stop`` is set

A pass (:meth:`Applier.run_pass`; its collaborators: :mod:`.failures` runs each table's work and
says how it failed, :mod:`.upkeep` expires, compacts and deletes applied segments, :mod:`.outcomes`
holds what a pass reports):

1. Each table's state comes from the catalog (``lakeslot.lsn`` of its current snapshot is its
   position ``L``). A missing mirror is created empty at position 0 (everything staged applies)
   when ``spec.snapshot.mode`` is ``never``; with ``initial`` the table waits for its snapshot
   (``waiting``, not an error). A table whose definite error is in force is skipped.
2. The batch is planned on the driver from the segments' footers and small columns
   (:func:`lakeslot.apply.spread.scan`: at most ``max_segments`` sealed segments in LSN order
   from the lowest position; a capped batch is followed at once by the next). Each table takes
   the changes above its own position (DESIGN.md rule 3: rewind and idempotency in one rule).
   The rows themselves are read, routed by key and reduced on the executors, one Spark job for
   every table with changes (:func:`lakeslot.apply.spread.reduce`), and parsed into the mirror's
   types there (:func:`lakeslot.apply.merge.typed_source`: by Spark's casts where they are exact,
   else by the shared Python type mapping): the driver never handles a change row by row, and
   its memory does not grow with the batch (DESIGN.md "Scale").
3. Per table: first the source facts (:mod:`lakeslot.source.facts`: dropped and re-created,
   renamed or re-added columns, partitions attached, detached, dropped or truncated — what no
   row change shows) → marked for re-snapshot; TRUNCATE per ``onTruncate``; schema changes per
   ``onSchemaChange`` (added columns added, with the value existing rows got from a constant
   default; dropped columns kept and NULL from then on; a type change, a default PostgreSQL
   wrote by rewriting the table, or anything incompatible → marked for re-snapshot: DESIGN.md
   invariant 8, never a silent divergence); the changelog table (when enabled) is appended
   first, then the mirror is MERGEd; each is one commit with ``lakeslot.lsn = batch end - 1``.
   A table without changes gets an empty commit with that position (idle tables advance
   without rewriting data).
4. Upkeep (:mod:`lakeslot.apply.upkeep`): each table committed to has its old snapshots
   expired at most once an hour, by its ``history.expire.*`` properties (new tables also delete
   superseded metadata files, see :data:`lakeslot.mirror.contract.TABLE_DEFAULTS`), so a commit
   per pass does not pile up; and is compacted where due (``spec.sink.maintenance``,
   :mod:`lakeslot.mirror.maintenance`: delete files and small files merge-on-read MERGEs leave,
   manifests, orphan files), within a time budget per pass, in commits that keep its position.
   Retention: sealed segments wholly at or below every table's position and older than
   ``spec.staging.retentionSeconds`` are deleted (never the furthest segment, where the reader
   resumes; nothing while a table waits for its snapshot).
5. The status document ``<staging>/apply-status.json`` is rewritten
   (:mod:`lakeslot.staging.apply_status`).

Exactly once: the only state is in Iceberg (each table's position, committed atomically with its
data) and in the immutable segments. A crash anywhere — between table commits, during a MERGE,
after a commit before retention — leaves every table at a position it really reflects; the next
pass reapplies exactly the changes above it. The changelog commits before its mirror, so it is
never behind it: after a crash between the two it is skipped, and the mirror catches up.

Errors (every table is its own failure domain: :mod:`lakeslot.apply.isolation`):

- Definite (:class:`lakeslot.apply.changes.TableError`, unmappable values): recorded on the table
  (``lakeslot.apply-error`` and friends, see :mod:`lakeslot.spark.tables`) and in the status
  document; that table stops, the others go on. ``resnapshot``: the way out is a re-snapshot,
  which lifts the error by moving the table's position.
- Any other error of one table's work (a Spark analysis error, an executor's exception, a failed
  MERGE or maintenance), or a transient one that keeps failing it while others pass: that table
  fails alone, recorded with when it is tried again; the first pass that works lifts it. A failed
  reduction of the whole batch is narrowed down to the tables it fails for.
- Transient (Spark/py4j, catalog and storage ``OSError``, PostgreSQL connection errors): retried
  ``max_attempts`` times with backoff within the pass, then reported as ``retrying`` and retried
  by the next pass.
- A pass that fails as a whole raises (the job ends; its supervisor restarts it) and is counted
  in the status document: repeated, it is ``ApplyDegraded`` in every status.
- A table whose position is below the first staged segment (the slot was recreated after it was
  lost, or segments were deleted by hand) is a definite error of that table: its changes are
  missing, and its re-snapshot lifts the error. A gap between staged segments
  (:class:`lakeslot.staging.format.GapError`) fails the job: nothing is applied past it.

Hooks (:class:`lakeslot.apply.outcomes.Hooks`) are called at the named points of
:data:`lakeslot.apply.outcomes.POINTS`; tests raise from them to
simulate a crash at that point.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NoReturn

import psycopg
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.sql import functions as F

from lakeslot import cadence
from lakeslot import lsn as lsn_text
from lakeslot.api.naming import TableName
from lakeslot.apply import changes, columns, ddl, merge, spread, warmup
from lakeslot.apply.changes import TableError
from lakeslot.apply.failures import Exhausted, Failures
from lakeslot.apply.isolation import halves
from lakeslot.apply.outcomes import ApplyResult, Hooks, PassResult, Steps, TableOutcome, Totals, now_text
from lakeslot.apply.upkeep import EXPIRE_INTERVAL_S, Upkeep
from lakeslot.mirror import typemap
from lakeslot.mirror.contract import (
    BACKFILL_PROPERTY,
    LSN_COLUMN,
    OP_COLUMN,
    OWNER_PROPERTY,
    SCHEMA_CHANGE_PROPERTY,
    SEQ_COLUMN,
    SOURCE_FACTS_PROPERTY,
    TableState,
    ownership,
    ownership_problem,
    table_properties,
)
from lakeslot.source import ddl_capture, facts, keys
from lakeslot.source.columns import ColumnOptions, DescribeError, TypeCache, describe
from lakeslot.source.connection import application_name, connect
from lakeslot.source.tables import existing
from lakeslot.spark.session import error_summary, make_active
from lakeslot.spark.tables import Tables
from lakeslot.staging.format import SegmentName
from lakeslot.staging.relations import Column, Relation
from lakeslot.staging.store import Staging
from lakeslot.workloads import JobInput

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Planned:
    """A table ready for the batch's reduction (:meth:`Applier._plan`)."""

    state: TableState
    plan: ddl.Plan | None
    config: spread.TableConfig
    scan: spread.TableScan


def run(spark, job: JobInput, *, once: bool, stop: threading.Event | None = None,
        hooks: Hooks | None = None, max_segments: int = 256, max_attempts: int = 3,
        environ=None, expire_interval_s: float = EXPIRE_INTERVAL_S,
        on_pass: Callable[[PassResult], None] | None = None) -> ApplyResult:
    """Apply staged changes to ``job.tables`` (see the module docstring). ``once``: passes until
    everything sealed when it started is applied, then return; otherwise until ``stop`` is set,
    a pass starting every ``spec.apply.triggerIntervalSeconds`` (at once after a longer one),
    just after the reader's seals when the interval allows (:mod:`lakeslot.cadence`).
    ``on_pass`` is given each pass's outcome as it ends (benchmarks time passes with it).
    Returns the last pass's outcome."""
    applier = Applier(spark, job, hooks or Hooks(), max_segments, max_attempts, environ,
                      expire_interval_s, honour_retry=not once)
    stop = stop or threading.Event()
    result = ApplyResult()
    try:
        if not once:
            warmup.warm_up(spark)
        while True:
            started = time.time()
            try:
                result.last = applier.run_pass()
            except Exception as e:
                applier.failures.pass_failed(e)  # counted in the status document
                raise
            result.passes += 1
            result.steps = applier.totals.seconds  # (every pass of this run: the applier's)
            if on_pass is not None:
                on_pass(result.last)
            if stop.is_set() or (once and not result.last.capped):
                return result
            if not result.last.capped:  # passes start every interval, on the seals' grid
                # (lakeslot.cadence); a long one is followed at once
                stop.wait(applier.until_next_pass(started))
    finally:
        applier.close()


class Applier:
    def __init__(self, spark, job: JobInput, hooks: Hooks, max_segments: int, max_attempts: int,
                 environ=None, expire_interval_s: float = EXPIRE_INTERVAL_S, *,
                 honour_retry: bool = True) -> None:
        spec = job.ingestion.spec
        self.spark, self.job, self.spec, self.hooks = spark, job, spec, hooks
        make_active(spark)  # (again at every pass: the JVM thread may lose it)
        self.max_segments = max_segments
        self.tables = Tables(spark, spec.sink.catalog.name, spec.sink.namespace)
        self.staging = Staging(spec.staging.uri)
        self.types = columns.RelationTypes(self._resolve_type, self._relation_text_columns)
        self._settings = job.source(environ)
        self._conn: psycopg.Connection | None = None
        self._facts: dict[TableName, facts.TableFacts | None] | None = None  # this pass's
        # this pass's: column → (missing value, written by a rewrite) — see _missing_values
        self._defaults: dict[TableName, dict[str, tuple[str | None, bool]]] = {}
        # this pass's: lakeslot's event trigger now, and its messages in the batch
        self._capture: ddl_capture.Capture | None = None
        self._unique: dict[TableName, bool] = {}  # this pass's: see _check_unique
        self._replayed: set[TableName] = set()  # this pass's: tables following DDL messages
        self._events: list[ddl_capture.DdlEvent] = []
        self.steps = Steps()  # this pass's
        self.totals = Totals()
        self.interval = spec.apply.trigger_interval_seconds
        self.lag = cadence.Lag(spec.reader.seal_seconds(self.interval))  # passes behind the seals
        self._seen_end: int | None = None  # the furthest segment end a listing showed
        # a failed table waits for its retry time (lakeslot.apply.isolation); a --once run tries
        # every table at once
        self.honour_retry = honour_retry
        self.failures = Failures(self.tables, job.names, self.staging, self.totals, max_attempts)
        self.upkeep = Upkeep(spark, spec, self.tables, self.staging, hooks, self.totals,
                             expire_interval_s)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # the source catalog (new mirrors in mode never; types that are not built in) --------------

    def _source(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._settings, application_name("apply", self.job.names.owner))
        return self._conn

    def _resolve_type(self, column: Column) -> typemap.PgType:
        return TypeCache(self._source()).pg_type(column.type_oid, column.type_modifier)

    def _excluded(self, table: TableName) -> tuple[str, ...]:
        return ColumnOptions.of(self.job.table_spec(table)).exclude_columns

    def _text_columns(self, table: TableName) -> tuple[str, ...]:
        """The table's ``textColumns``: kept as text, as the snapshot keeps them."""
        return ColumnOptions.of(self.job.table_spec(table)).text_columns

    def _relation_text_columns(self, relation: Relation) -> tuple[str, ...]:
        return self._text_columns(TableName(relation.schema, relation.table))

    # a pass ----------------------------------------------------------------------------------

    def run_pass(self) -> PassResult:
        make_active(self.spark)
        self.tables.ensure_namespace(self.spec.sink.namespace)
        self._facts, self._defaults, self._capture, self._events = None, {}, None, []
        self._unique, self._replayed, self.failures.retried_now = {}, set(), set()
        outcomes: dict[TableName, TableOutcome] = {}
        states: dict[TableName, TableState] = {}
        self.steps = steps = Steps()
        with steps("prepare"):
            for table in self.job.tables:
                prepared = self.failures.attempt(table, functools.partial(self._prepare, table))
                if isinstance(prepared, TableState):
                    states[table] = prepared
                else:
                    outcomes[table] = prepared
        staged = self._list_staging()
        for table, state in list(states.items()):
            position = _position(state)
            if staged and position > 0 and position + 1 < staged[0].start:
                outcomes[table] = self.failures.attempt(table, functools.partial(
                    _cut_off, table, position, staged[0].start))
                del states[table]
        with steps("scan"):
            batch = spread.scan(self.staging, staged, {t: _position(s) for t, s in states.items()},
                                max_segments=self.max_segments)
        self.hooks("batch-read")
        planned: dict[TableName, _Planned] = {}
        with steps("plan"):
            read = self.failures.retried("reading lakeslot's DDL messages",
                                         functools.partial(self._read_events, batch))
            if isinstance(read, Exhausted):  # (the source is down: nothing can be planned)
                outcomes.update((t, self.failures.retrying(t, read.error)) for t in states)
                states = {}
            for table, state in states.items():
                plan = self.failures.attempt(table, functools.partial(self._plan, table, state, batch))
                if isinstance(plan, _Planned):
                    planned[table] = plan
                else:
                    outcomes[table] = plan
        with steps("reduce"):
            reduced = self._reduce(batch, planned, outcomes)
        try:
            for table, plan in planned.items():
                if table not in outcomes:
                    outcomes[table] = self.failures.attempt(table, functools.partial(
                        self._apply, table, plan, batch, reduced.get(table)))
        finally:
            for each in {id(r): r for r in reduced.values()}.values():
                each.release()
        self.hooks("after-tables")
        self.failures.escalate(outcomes)
        ordered = tuple(outcomes[t] for t in self.job.tables)
        with steps("maintenance"):
            self.upkeep.expire(ordered)
            for table, error in self.upkeep.maintain(ordered).items():
                outcomes[table] = self.failures.retryable(table, error)
            ordered = tuple(outcomes[t] for t in self.job.tables)
            self.failures.recovered(ordered)
            deleted = self.upkeep.retention(ordered, staged)
        self.hooks("after-retention")
        result = PassResult(batch.end, len(batch.segments) == self.max_segments, ordered, deleted,
                            steps.seconds)
        self.totals.add_pass(result, batch.tables)
        with steps("status"):
            self._write_status(result)
        return result

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

    def _prepare(self, table: TableName) -> TableState | TableOutcome:
        target = self.job.names.mirror_table(table)
        state = self.tables.load(target)
        if state is None:
            if self.spec.snapshot.mode == "initial":
                return TableOutcome(table, target, "waiting", None,
                                    error="waiting for the snapshot of the table")
            self._create(table, target)
            state = self.tables.load(target)
            assert state is not None  # _create just created it
        owner, source = self.job.names.owner, str(table)
        foreign = ownership_problem(state.properties, f"{self.spec.sink.namespace}.{target}", owner,
                                    source)
        if foreign is not None:  # (not recorded on the table: it is not this table's)
            log.error("%s: stopped: %s", table, foreign)
            return TableOutcome(table, target, "failed", None, error=foreign)
        if OWNER_PROPERTY not in state.properties:  # from before ownership was recorded: adopted
            recorded = state.properties.get(SOURCE_FACTS_PROPERTY)
            self.tables.set_properties(target, ownership(
                owner, source, facts.TableFacts.from_json(recorded).oid if recorded else None))
        if state.lsn is None:
            return TableOutcome(table, target, "waiting", None,
                                error="the mirror table has no lakeslot.lsn yet (no snapshot)")
        if state.error is not None:
            retry = state.retry
            if retry is None or (self.honour_retry and time.time() < retry[0]):
                return TableOutcome(table, target, "failed", state.lsn, error=state.error,
                                    resnapshot=state.resnapshot_required)
            self.failures.retried_now.add(table)  # its retry time came: tried again
        if state.stale_error:
            self.tables.clear_error(target)
        options = self.job.table_spec(table)  # partitionBy changed: evolve the spec in place
        self.tables.partition(target, options.partition_fields() if options else (), state.properties)
        if not state.key:
            raise TableError(f"{table}: the mirror table has no identifier fields (key); set "
                             "keyColumns for the table and re-snapshot it")
        return state

    def _create(self, table: TableName, target: str) -> None:
        """snapshot.mode never: the mirror starts empty at position 0 (everything staged)."""
        options = self.job.table_spec(table)
        conn = self._source()
        oid = existing(conn, [table]).get(table)
        if oid is None:
            raise TableError(f"table {table} does not exist (dropped, renamed, or not a table)")
        try:
            mapped = describe(conn, oid, ColumnOptions.of(options))
        except (typemap.MappingError, DescribeError) as e:
            raise TableError(f"table {table}: {e}") from None
        self.tables.create(target, typemap.mirror_schema(mapped),
                           {**table_properties(self.spec.sink.table_properties),
                            **ownership(self.job.names.owner, str(table), oid)}, 0,
                           options.partition_fields() if options else ())

    # one table -----------------------------------------------------------------------------

    def _plan(self, table: TableName, state: TableState, batch: spread.Batch
              ) -> _Planned | TableOutcome:
        """Before the batch is reduced: the source checks and the DDL replay (renames committed
        to the mirror first), the truncate policy, and what the executors need."""
        target = self.job.names.mirror_table(table)
        if batch.end is None or batch.end - 1 <= _position(state):
            return TableOutcome(table, target, "current", state.lsn)
        scanned = batch.tables[table]
        plan = self._check_source(table, target, state, scanned.oids)
        renames: tuple[tuple[int, int, str, str], ...] = ()
        if plan is not None:
            state = self._apply_ddl(table, target, state, plan)
            renames = tuple(r for r in plan.facts.renames if r[0] > _position(state))
        if scanned.truncates and self.spec.policies.on_truncate == "Error":
            raise TableError(f"{table} was truncated at {lsn_text.format(scanned.truncates[0])} "
                             "and onTruncate is Error; re-snapshot the table (or set onTruncate: "
                             "Apply before re-snapshotting)", resnapshot=True)
        names = list(state.data_columns())
        for relation in batch.relations:  # columns the batch may add come after the mirror's
            if (relation.schema, relation.table) == tuple(table):
                for view in ddl.translations(relation, renames):
                    names += [c.name for c in view.columns if c.name not in names]
        config = spread.TableConfig(table, _position(state), tuple(state.key), tuple(names),
                                    renames, self._check_unique(table, state),
                                    self.spec.sink.changelog.enabled)
        return _Planned(state, plan, config, scanned)

    def _reduce(self, batch: spread.Batch, planned: dict[TableName, _Planned],
                outcomes: dict[TableName, TableOutcome]) -> dict[TableName, spread.Reduced]:
        """Reduce every table with changes in one Spark job (:mod:`lakeslot.apply.spread`),
        retried like a table's work. When it cannot be had, the tables are reduced in halves,
        and halves again, until the tables it fails for are found alone: those fail (or are
        ``retrying``), the others go on (:mod:`lakeslot.apply.isolation`). Each table's
        reduction, by table."""
        configs = [p.config for p in planned.values() if p.scan.changes]
        if not configs:
            return {}
        try:
            reduced = self.failures.retried("reducing the batch", functools.partial(
                spread.reduce, self.spark, self.spec.staging.uri, batch, configs))
        except Exception as e:  # noqa: BLE001 - found out table by table below
            log.warning("reducing the batch failed (%s): reducing its tables in parts",
                        error_summary(e))
        else:
            if not isinstance(reduced, Exhausted):
                return {c.table: reduced for c in configs}
            log.warning("reducing the batch kept failing (%s): reducing its tables in parts",
                        reduced.error)
        return self._reduce_parts(batch, configs, outcomes)

    def _reduce_parts(self, batch: spread.Batch, configs: list[spread.TableConfig],
                      outcomes: dict[TableName, TableOutcome]) -> dict[TableName, spread.Reduced]:
        if len(configs) == 1:  # alone: its own error, classified as any work of the table
            table = configs[0].table
            alone = self.failures.attempt(table, functools.partial(
                spread.reduce, self.spark, self.spec.staging.uri, batch, configs))
            if isinstance(alone, TableOutcome):
                outcomes[table] = alone
                return {}
            return {table: alone}
        found: dict[TableName, spread.Reduced] = {}
        for part in halves(configs):
            try:
                reduced = spread.reduce(self.spark, self.spec.staging.uri, batch, part)
            except Exception:  # noqa: BLE001 - narrowed down further
                found.update(self._reduce_parts(batch, list(part), outcomes))
            else:
                found.update((c.table, reduced) for c in part)
        return found

    def _apply(self, table: TableName, planned: _Planned, batch: spread.Batch,
               reduced: spread.Reduced | None) -> TableOutcome:
        """The table's pass (``reduced``: its reduction; None: no change of it in the batch)."""
        target = self.job.names.mirror_table(table)
        state, plan, config, scanned = planned.state, planned.plan, planned.config, planned.scan
        assert batch.end is not None  # _plan returned "current" otherwise
        lsn = batch.end - 1
        mine = reduced.tables.get(table) if reduced is not None else None
        if mine is not None and mine.problem is not None:
            problem = mine.problem
            if problem.duplicate is not None:
                self._duplicate(table, state, problem.duplicate,
                                f"at {lsn_text.format(problem.lsn)}")
            raise TableError(problem.message, resnapshot=problem.resnapshot,
                             automatic=problem.automatic)
        relations = mine.relations if mine is not None else []
        with self.steps("evolve"):
            state = self._evolve(table, target, state, relations)
        if self.spec.sink.changelog.enabled:
            with self.steps("changelog"):
                self._changelog(table, target, state, reduced, mine, lsn, plan, config.names)
            self.hooks("after-changelog", table)
        applied = plan.applied if plan is not None else ()
        if reduced is None or mine is None:
            self.tables.advance(target, lsn)
            return TableOutcome(table, target, "advanced", lsn, ddl=applied)
        qualified = self.tables.qualified(target)
        check_unique = config.check_unique and not scanned.truncates
        with self.steps("parse"):
            source = self._source_view(table, state, target, reduced.rows(table, "F"),
                                       mine.keeps, relations, config.names, reused=check_unique)
        try:
            if check_unique:
                held = self.spark.sql(merge.duplicates_sql(source, qualified)).collect()
                if held:
                    self._duplicate(table, state, tuple(held[0]), "in this batch, and the mirror "
                                    "already holds a row with that key")
            self.hooks("before-merge", table)
            with self.steps("merge"):
                self.tables.commit_sql(target, merge.merge_sql(source, qualified,
                                                               bool(scanned.truncates)), lsn)
        finally:
            merge.drop(self.spark, source)
        self.hooks("after-merge", table)
        return TableOutcome(table, target, "applied", lsn, changes=scanned.changes, ddl=applied)

    def _source_view(self, table: TableName, state: TableState, target: str, rows,
                     keeps: frozenset[int], relations: list[Relation],
                     layout: tuple[str, ...], reused: bool = False) -> merge.Source:
        qualified = self.tables.qualified(target)
        delimiters: dict[str, str] = {}
        excluded = self._excluded(table)
        for relation in relations:  # the latest description of a column wins
            delimiters.update(self.types.delimiters(relation, excluded))
        # a change described without a mirror column came before the column was added (or after
        # it was dropped): the row holds the column's "missing value" in the source (else NULL)
        described = [{c.name for c in r.columns} for r in relations]
        not_carried = [n for n in state.data_columns() if any(n not in d for d in described)]
        absent = self._missing_values(table, not_carried)[0] if not_carried else {}
        source = merge.typed_source(rows, str(table), state, self.spark.table(qualified).schema,
                                    keeps, layout, delimiters, absent, reused)
        if source.resolves:
            missing = self.spark.sql(merge.missing_sql(source, qualified)).collect()
            if missing:
                merge.drop(self.spark, source)
                raise TableError(
                    f"{table}: an update left a TOASTed column unchanged for key "
                    f"{list(missing[0])}, which is not in the mirror table; the value cannot "
                    f"be recovered: {changes.TOAST_FIX}", resnapshot=True)
        return source

    def _check_source(self, table: TableName, target: str, state: TableState,
                      oids: frozenset[int]) -> ddl.Plan | None:
        """Stop the table for a re-snapshot when its source changed in a way the mirror cannot
        follow (DESIGN.md invariant 8), checked on every pass, idle tables included, before any
        change is applied. With lakeslot's event trigger (the one the recorded facts name still
        installed): the batch's DDL messages are replayed (:mod:`lakeslot.apply.ddl`) and the plan
        returned; else the catalog is compared with the recorded facts
        (:mod:`lakeslot.source.facts`) and None returned."""
        current = self._current_facts().get(table)
        recorded_text = state.properties.get(SOURCE_FACTS_PROPERTY)
        if recorded_text is None:  # snapshotted before lakeslot recorded facts: adopt today's
            if current is not None:
                self.tables.set_properties(target, {SOURCE_FACTS_PROPERTY: current.to_json()})
            return None
        recorded = facts.TableFacts.from_json(recorded_text)
        capture = self._capture
        if capture is not None and recorded.capture == capture.trigger and not any(
                e.event == "error" for e in self._events):
            self._replayed.add(table)
            return self._replay(table, state, recorded, current)
        reason = facts.divergence(recorded, current, state.data_columns())
        others = sorted(oids - {recorded.oid})
        if reason is None and others:
            reason = (f"changes of another table of that name arrived (OID {others[0]}, the "
                      f"mirror's is {recorded.oid}): it was dropped and created again")
        mirrored = state.data_columns()
        added = [n for n in current.columns if n not in recorded.columns and n not in mirrored] \
            if current is not None and reason is None else []
        rewritten = self._missing_values(table, added)[1] if added else []
        if rewritten:
            reason = (f"column(s) {rewritten} were added with a default PostgreSQL wrote into "
                      "every existing row (a volatile default, or the table was rewritten since), "
                      "which no row change reports")
        if reason is not None:
            raise TableError(f"{table}: {reason}; {self._way_out()}", resnapshot=True,
                             automatic=self._automatic())
        return self._catalog_plan(table, recorded, current, added)

    def _catalog_plan(self, table: TableName, recorded: facts.TableFacts,
                      current: facts.TableFacts | None, added: list[str]) -> ddl.Plan | None:
        """Without the trigger, what the catalog shows and nothing diverged: columns added to
        the source (even with no row change since) are added now, existing rows getting the
        default PostgreSQL gave them; and when the trigger appeared (or was installed again),
        the messages describe the table's definition from here on."""
        if current is None:
            return None
        addable = [n for n in added if n not in self._excluded(table)]
        if addable and self.spec.policies.on_schema_change == "Error":
            raise TableError(f"{table}: the source table's columns changed (added {addable}) "
                             f"and onSchemaChange is Error; {self._way_out()}", resnapshot=True)
        known = recorded.with_columns(current, addable)
        known = replace(known, capture=current.capture)
        if known == recorded:
            return None
        values = self._missing_values(table, addable)[0] if addable else {}
        add = tuple(ddl.Added(n, self._iceberg_of(table, ddl_capture.SourceColumn(
            current.columns[n], n, current.types[n], current.typmods.get(n, -1), None, ",",
            False)), values.get(n)) for n in addable)
        return ddl.Plan(known, add=add, applied=tuple(
            f"column {n!r} added (found in the catalog)" for n in addable))

    def _replay(self, table: TableName, state: TableState, recorded: facts.TableFacts,
                current: facts.TableFacts | None) -> ddl.Plan:
        position = _position(state)
        plan = ddl.replay(table, recorded, [e for e in self._events if e.lsn > position],
                          state.data_columns(), functools.partial(self._iceberg_of, table),
                          self._excluded(table), self._text_columns(table))
        reason = plan.reason or facts.rewritten_partitions(plan.facts, current)
        if reason is not None:
            if self.spec.policies.on_schema_change == "Error":
                raise TableError(f"{table}: {reason}; {self._way_out()}", resnapshot=True)
            raise TableError(f"{table}: {reason}; {self._way_out()}", resnapshot=True,
                             automatic=self._automatic())
        if plan.changes_mirror and self.spec.policies.on_schema_change == "Error":
            raise TableError(f"{table}: the source table's definition changed "
                             f"({'; '.join(plan.applied)}) and onSchemaChange is Error; "
                             f"{self._way_out()}", resnapshot=True)
        return plan

    def _iceberg_of(self, table: TableName, column: ddl_capture.SourceColumn):
        pg = TypeCache(self._source()).pg_type(column.type_oid, column.type_modifier)
        return typemap.map_column(column.name, pg, as_text=column.name in
                                  self._text_columns(table)).iceberg(0)

    def _apply_ddl(self, table: TableName, target: str, state: TableState,
                   plan: ddl.Plan) -> TableState:
        """One schema commit: renames, added columns (their existing rows' value recorded for
        the backfill), promotions, and the facts as of the last message (so a crash before the
        MERGE replays nothing twice). Nothing to commit when the facts did not move."""
        if plan.add:  # the catalog's missing values, then the messages' (exact at the ADD) win
            self._missing_values(table, [])
            self._defaults[table].update({a.name: (a.missing, False) for a in plan.add})
        recorded = state.properties.get(SOURCE_FACTS_PROPERTY)
        position = _position(state)
        kept = replace(plan.facts, renames=tuple(r for r in plan.facts.renames if r[0] > position))
        properties = {SOURCE_FACTS_PROPERTY: kept.to_json()}
        if plan.applied:
            properties[SCHEMA_CHANGE_PROPERTY] = "; ".join(plan.applied)
            log.info("%s: %s", table, "; ".join(plan.applied))
        if recorded == properties[SOURCE_FACTS_PROPERTY] and not plan.changes_mirror:
            return state
        self.tables.evolve(target, [(a.name, a.iceberg) for a in plan.add], list(plan.promote),
                           backfill={a.name: a.missing for a in plan.add if a.missing is not None},
                           properties=properties, renames=list(plan.renames))
        self.hooks("after-evolve", table)
        evolved = self.tables.load(target)
        assert evolved is not None  # evolve just committed to it
        return evolved

    def _read_events(self, batch: spread.Batch) -> None:
        """lakeslot's event trigger now, and the batch's DDL messages parsed with its key."""
        if batch.end is None:
            return
        self._capture = ddl_capture.state(self._source())
        if self._capture is None:
            return
        key = self._capture.key
        self._events = [e for lsn, seq, content in batch.messages
                        if (e := ddl_capture.parse(lsn, seq, content, key)) is not None]

    def _check_unique(self, table: TableName, state: TableState) -> bool:
        """Whether the table's key is configured (keyColumns) without PostgreSQL keeping it
        unique (:func:`lakeslot.source.keys.must_check`): then every insert is checked against
        the batch and the mirror."""
        options = self.job.table_spec(table)
        if options is None or not options.key_columns:  # (no catalog read: nothing to check)
            return False
        if table not in self._unique:
            current = self._current_facts().get(table)
            self._unique[table] = current is not None and keys.must_check(
                self._source(), current.oid, options.key_columns, state.key)
        return self._unique[table]

    def _duplicate(self, table: TableName, state: TableState, key: tuple, where: str) -> NoReturn:
        raise TableError(f"{table}: " + keys.duplicate_error(self._source(), table, state.key,
                                                             key, where), resnapshot=True)

    def _current_facts(self) -> dict[TableName, facts.TableFacts | None]:
        """The source facts of every table, read once per pass."""
        if self._facts is None:
            self._facts = facts.read(self._source(), self.job.tables)
        return self._facts

    def _automatic(self) -> bool:
        return self.spec.policies.on_schema_change == "Resnapshot"

    def _way_out(self) -> str:
        policy = self.spec.policies.on_schema_change
        if policy == "Resnapshot":
            return "the table is copied again on its own (policies.onSchemaChange: Resnapshot)"
        return ("raise the table's resnapshotGeneration (spec.source.tables[]) to copy it again "
                f"(policies.onSchemaChange: {policy})")

    def _evolve(self, table: TableName, target: str, state: TableState,
                relations: list[Relation]) -> TableState:
        excluded = self._excluded(table)
        described = [self.types.of(r, excluded) for r in relations]
        schema = columns.plan_schema(state.data_columns(), described,
                                     widened_in_place=table in self._replayed)
        if not schema.changes:
            return self._backfill(target, state)
        if self.spec.policies.on_schema_change == "Error":
            raise TableError(f"{table}: the source table's columns changed "
                             f"({schema.describe()}) and onSchemaChange is Error; "
                             f"{self._way_out()}", resnapshot=True)
        if schema.incompatible:
            raise TableError(f"{table}: incompatible schema change ({schema.describe()}); "
                             f"{self._way_out()}", resnapshot=True, automatic=self._automatic())
        if schema.promote:
            raise TableError(
                f"{table}: a column changed type ({schema.describe()}): ALTER … TYPE rewrites the "
                "table, and a USING expression may have changed stored values without any row "
                f"change; {self._way_out()}", resnapshot=True, automatic=self._automatic())
        if schema.add:
            added = [name for name, _ in schema.add]
            values, _ = self._missing_values(table, added)  # rewritten: _check_source
            current = self._current_facts().get(table)
            recorded_text = state.properties.get(SOURCE_FACTS_PROPERTY)
            properties = ({SOURCE_FACTS_PROPERTY: facts.TableFacts.from_json(recorded_text)
                           .with_columns(current, added).to_json()}
                          if current is not None and recorded_text is not None else {})
            self.tables.evolve(target, list(schema.add), backfill=values, properties=properties)
            self.hooks("after-evolve", table)
            evolved = self.tables.load(target)
            assert evolved is not None  # evolve just committed to it
            state = evolved
        return self._backfill(target, state)

    def _missing_values(self, table: TableName, added: list[str]) -> tuple[dict[str, str], list[str]]:
        """The value (text form) existing rows have in each added column — PostgreSQL's "missing
        value" of a column added with a non-volatile default, as long as no rewrite stored the
        values and cleared it (none: NULL) — and the added columns whose existing rows hold a
        value that is not known that way (a default without a missing value: written by a
        rewrite; or a generated column)."""
        if table not in self._defaults:  # every column of the table, read once per pass
            rows = self._source().execute(
                "SELECT a.attname, a.atthasmissing, a.attmissingval::text, t.typdelim,"
                " a.atthasdef OR a.attgenerated <> '' FROM pg_catalog.pg_attribute a"
                " JOIN pg_catalog.pg_class c ON c.oid = a.attrelid"
                " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
                " JOIN pg_catalog.pg_type t ON t.oid = a.atttypid"
                " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0"
                " AND NOT a.attisdropped",
                (table.schema, table.name)).fetchall()
            self._defaults[table] = {
                name: (typemap.parse_array(array, delimiter)[0] if has_missing else None,
                       not has_missing and has_default)
                for name, has_missing, array, delimiter, has_default in rows}
        known = self._defaults[table]
        values = {n: value for n in added if n in known and (value := known[n][0]) is not None}
        return values, [n for n in added if n in known and known[n][1]]

    def _backfill(self, target: str, state: TableState) -> TableState:
        """Give existing rows the value of columns added with a default, recorded by evolve."""
        if not state.backfill:
            return state
        qualified = self.tables.qualified(target)
        statement, view = merge.backfill_sql(self.spark, state, self.spark.table(qualified).schema,
                                             qualified, state.backfill)
        self.tables.commit_sql(target, statement, _position(state))
        self.spark.catalog.dropTempView(view)
        self.tables.set_properties(target, {}, remove=(BACKFILL_PROPERTY,))
        backfilled = self.tables.load(target)
        assert backfilled is not None  # it was just committed to
        return backfilled

    def _changelog(self, table: TableName, target: str, state: TableState,
                   reduced: spread.Reduced | None, mine: spread.TableReduced | None, lsn: int,
                   plan: ddl.Plan | None, layout: tuple[str, ...]) -> None:
        """Append the changes above the changelog's position (never below the mirror's: a
        changelog created or left behind by a re-snapshot starts at the mirror's position)."""
        name = target + self.spec.sink.changelog.suffix
        log_state = self.tables.load(name)
        if log_state is None:
            self.tables.create(name, changelog_schema(state.schema),
                               table_properties(self.spec.sink.table_properties),
                               _position(state))
            log_state = self.tables.load(name)
            assert log_state is not None  # just created
        renames = [(old, new) for _, _, old, new in plan.facts.renames] if plan else []
        if renames:  # the mirror's renames, where the changelog has not followed yet
            self.tables.evolve(name, [], renames=renames)
            log_state = self.tables.load(name)
            assert log_state is not None  # just evolved
        wanted, present = state.data_columns(), log_state.data_columns()
        self.tables.evolve(name, [(n, t) for n, t in wanted.items() if n not in present],
                           [(n, t) for n, t in wanted.items()
                            if n in present and not columns.same_type(present[n], t)])
        position = max(log_state.lsn or 0, _position(state))
        if position >= lsn:
            return
        if reduced is None or mine is None:
            self.tables.advance(name, lsn)
            return
        events = reduced.rows(table, "E").filter(F.col("lsn") > position)
        source = self._source_view(table, state, target, events, mine.event_keeps,
                                   mine.relations, layout)
        try:
            self.tables.commit_sql(name, merge.append_sql(source, self.tables.qualified(target),
                                                          self.tables.qualified(name)), lsn)
        finally:
            merge.drop(self.spark, source)

    # table maintenance, retention and status --------------------------------------------------

    def _write_status(self, result: PassResult) -> None:
        document = {
            "version": 1, "ingestion": self.job.names.owner,
            "updatedAt": now_text(),
            "batchEnd": None if result.end is None else lsn_text.format(result.end),
            "segmentsDeleted": result.deleted,
            "tables": [t.document() for t in result.tables],
            "totals": self.totals.document()}
        self.staging.write_apply_status(document)


def _position(state: TableState) -> int:
    """The position of a table :meth:`Applier._prepare` accepted: it returns only tables that
    have one, and evolving or backfilling a table keeps it."""
    assert state.lsn is not None
    return state.lsn


def _cut_off(table: TableName, position: int, first: int) -> NoReturn:
    raise TableError(
        f"{table}: the mirror reflects {lsn_text.format(position)} but staging starts at "
        f"{lsn_text.format(first)}: the changes in between are gone (the slot was recreated after "
        "it was lost, or segments were deleted by hand); re-snapshot the table", resnapshot=True)


def changelog_schema(mirror: Schema) -> Schema:
    """The mirror's columns, all optional and without identifier fields, then
    ``_lakeslot_lsn``, ``_lakeslot_op``, ``_lakeslot_seq``."""
    fields = [NestedField(f.field_id, f.name, f.field_type, required=False)
              for f in mirror.fields if f.name != LSN_COLUMN]
    top = mirror.highest_field_id
    return Schema(*fields,
                  NestedField(top + 1, LSN_COLUMN, LongType(), required=True),
                  NestedField(top + 2, OP_COLUMN, StringType(), required=True),
                  NestedField(top + 3, SEQ_COLUMN, LongType(), required=True))

