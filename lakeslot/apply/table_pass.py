"""What happens to one table in an apply pass, in three phases the pass calls in turn
(:mod:`lakeslot.apply.passes` decides when, and for which tables):

1. :meth:`TablePass.prepare` — its mirror as the catalog has it: created empty at position 0 when
   ``spec.snapshot.mode`` is ``never`` (else ``waiting`` for its snapshot), its owner checked
   (adopted when unrecorded), a definite error in force or a retry time not yet come skipped,
   its partition spec evolved to ``partitionBy``. Returns the table's state, or its outcome.
2. :meth:`TablePass.plan` — before the batch is reduced: the source checks and the DDL replay
   (:mod:`lakeslot.apply.evolution`; the schema commit comes first), the truncate policy, and
   what the executors need to reduce its changes (:class:`lakeslot.apply.spread.TableConfig`).
   A table the batch does not move is ``current``.
3. :meth:`TablePass.apply` — with its reduction: the schema after the batch's descriptions, the
   changelog (:mod:`lakeslot.apply.changelog`), then one commit with ``lakeslot.lsn = batch end
   - 1``: the driver's row delta for a small batch (:mod:`lakeslot.apply.small_batches`, its rows
   collected for every such table at once: :meth:`TablePass.small_rows`), else a MERGE; a table
   without changes in the batch advances to that position (``advanced``): by an empty commit, or
   in a continuous job in memory until the commit is due (:mod:`lakeslot.apply.coverage`).

Invariants:

- A table is read from the catalog when the job does not know it (its first pass, any pass after
  one it did not go through: failed, retrying, waiting), at least every :data:`REREAD_S` (spread
  by name; longer in a job of more than ``REREAD_S`` × :data:`REREADS_PER_S` tables, so that
  these reads ask the catalog that many loads a second at most — at 1,000 tables on a network
  catalog they were ≈ 600 loads in each 35-s pass), and in every pass of a job that writes a
  changelog; otherwise it is taken as the job's last pass left it — the job's own commits and
  reads, held by Spark's catalog, without a request (the read was a request per table per
  pass: at 30 ms a request, and a catalog on the same two cores, a tenth of a pass and a
  quarter of the driver JVM's CPU at 200 tables).
  Another job's commit in between (a re-snapshot) is found by the commit: the row delta's retry,
  the advance and the MERGE each check the table's position first
  (:class:`lakeslot.mirror.contract.Moved`: nothing committed), and the table is ``retrying``
  until the next pass reads it and plans it again.
- One apply rule (DESIGN.md rule 3): the table takes exactly the changes above its position,
  and each commit records the position it reflects; every commit before the MERGE (schema,
  backfill, changelog) keeps or precedes it, so a crash between any two leaves the table at a
  position it really reflects.
- A mirror another ingestion or source table owns is never written, and its failure is not
  recorded on it (DESIGN.md "Isolation").
- An unchanged TOAST value whose mirror row is absent, a configured key (``keyColumns``) that
  PostgreSQL does not keep unique and the batch duplicates, a TRUNCATE with ``onTruncate:
  Error`` stop the table before anything of the batch is written.

Failure modes: :class:`lakeslot.apply.changes.TableError` (definite, that table only), any other
exception of the table's work (the caller classifies it: :mod:`lakeslot.apply.failures`). Every
phase is run by the caller through :meth:`lakeslot.apply.failures.Failures.attempt`.
"""

from __future__ import annotations

import functools
import logging
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import NoReturn

import pyarrow as pa
from pyspark.sql import functions as F

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.apply import changes, coverage, ddl, merge, slots, small_batches, spread
from lakeslot.apply.changelog import Changelog
from lakeslot.apply.changes import TableError
from lakeslot.apply.coverage import Coverage
from lakeslot.apply.evolution import Evolution
from lakeslot.apply.failures import Failures
from lakeslot.apply.outcomes import WENT_THROUGH, Hooks, Steps, TableOutcome
from lakeslot.apply.small_batches import SmallBatches
from lakeslot.apply.source_tables import SourceTables
from lakeslot.mirror import catalogs, typemap
from lakeslot.mirror.contract import (
    OWNER_PROPERTY,
    SOURCE_FACTS_PROPERTY,
    Moved,
    TableState,
    ownership,
    ownership_problem,
    table_properties,
)
from lakeslot.source import facts, keys
from lakeslot.source.columns import ColumnOptions, DescribeError, describe
from lakeslot.source.tables import existing
from lakeslot.spark.session import error_summary
from lakeslot.spark.tables import Tables
from lakeslot.staging.relations import Relation
from lakeslot.workloads import JobInput

log = logging.getLogger("lakeslot.apply.job")
REREAD_S = 60.0  # a table the job knows is read from the catalog at least this often (× 0.5–1.5)
REREADS_PER_S = 5.0  # ... unless the job's tables would need more of those reads a second


def reread_every_s(tables: int) -> float:
    """How often, on average, a job of ``tables`` tables reads a table it knows from the catalog
    (see the module docstring)."""
    return max(REREAD_S, tables / REREADS_PER_S)


@dataclass(frozen=True)
class Planned:
    """A table ready for the batch's reduction (:meth:`TablePass.plan`)."""

    state: TableState
    plan: ddl.Plan | None
    config: spread.TableConfig
    scan: spread.TableScan


class TablePass:
    """One apply job's work on one table at a time (its memory: this pass's steps and key
    checks; :meth:`begin` starts a pass)."""

    def __init__(self, spark, job: JobInput, tables: Tables, hooks: Hooks, failures: Failures,
                 sources: SourceTables, *, continuous: bool) -> None:
        self.spark, self.job, self.spec, self.tables = spark, job, job.ingestion.spec, tables
        self.hooks, self.failures, self.sources = hooks, failures, sources
        self.evolution = Evolution(spark, self.spec, tables, hooks, sources)
        self.changelog = Changelog(spark, self.spec, tables)
        self.small = SmallBatches(spark)
        self.slots = slots.Slots(self.spec.apply.table_parallelism)  # (see lakeslot.apply.slots)
        self._remote_catalog = catalogs.on_network(self.spec.sink.catalog)
        # continuous: a failed table waits for its retry time (lakeslot.apply.isolation), an idle
        # table's advance is committed when due; a --once run tries every table, commits them all
        self.honour_retry = continuous
        self.coverage = Coverage(keep=continuous)
        self.steps = Steps()  # this pass's
        self._unique: dict[TableName, bool] = {}  # this pass's: see _check_unique
        self._known: set[TableName] = set()  # went through the last pass (see the docstring)
        self._reread: dict[TableName, float] = {}  # when each table is read again (monotonic)

    def begin(self, steps: Steps) -> None:
        """A new pass, timed in ``steps``: what the last one read from the source is forgotten."""
        self.steps, self._unique = steps, {}
        self.sources.new_pass()
        self.evolution.new_pass()

    def settle(self, outcomes: tuple[TableOutcome, ...]) -> None:
        """The pass's final ``outcomes``: the tables the next pass may take as this one left
        them (see the module docstring)."""
        self._known = {o.source for o in outcomes if o.state in WENT_THROUGH}

    def read_messages(self, batch: spread.Batch) -> None:
        """Read the batch's DDL messages, once for every table's :meth:`plan`."""
        self.sources.read_events(batch)

    # 1. the mirror ---------------------------------------------------------------------------

    def prepare(self, table: TableName) -> TableState | TableOutcome:
        with self.slots.held():
            return self._prepare(table)

    def _prepare(self, table: TableName) -> TableState | TableOutcome:
        target = self.job.names.mirror_table(table)
        state = self._read(table, target)
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
        return self.coverage.state(table, state)

    def _read(self, table: TableName, target: str) -> TableState | None:
        """The table's state: as the catalog has it, or as the job's last pass left it (see the
        module docstring)."""
        now = time.monotonic()
        if (table in self._known and now < self._reread.get(table, now)
                and not self.spec.sink.changelog.enabled):
            return self.tables.load(target, refresh=False)
        with self._network():
            state = self.tables.load(target)
        self._reread[table] = now + reread_every_s(len(self.job.tables)) * (
            0.5 + coverage.spread(table))
        return state

    def _network(self) -> AbstractContextManager[None]:
        """Around a request to the catalog: the table's CPU slot let go while it waits, where the
        catalog is reached over a network (not a hadoop catalog, whose metadata is read from
        local disk)."""
        return self.slots.waiting() if self._remote_catalog else nullcontext()

    def _create(self, table: TableName, target: str) -> None:
        """snapshot.mode never: the mirror starts empty at position 0 (everything staged)."""
        options = self.job.table_spec(table)
        conn = self.sources.connection()
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

    # 2. before the reduction -------------------------------------------------------------------

    def plan(self, table: TableName, state: TableState, batch: spread.Batch) -> Planned | TableOutcome:
        """Before the batch is reduced: the source checks and the DDL replay (renames committed
        to the mirror first), the truncate policy, and what the executors need."""
        target = self.job.names.mirror_table(table)
        if batch.end is None or batch.end - 1 <= state.position:
            return TableOutcome(table, target, "current", state.position,
                                committed=None if state.covered is None else state.lsn)
        scanned = batch.tables[table]
        plan = self.evolution.check_source(table, target, state, scanned.oids)
        renames: tuple[tuple[int, int, str, str], ...] = ()
        if plan is not None:
            state = self.evolution.apply_ddl(table, target, state, plan)
            renames = tuple(r for r in plan.facts.renames if r[0] > state.position)
        self.evolution.check_key(table, state, [batch.relations[i] for i in sorted(scanned.described)],
                                 renames)
        if scanned.truncates and self.spec.policies.on_truncate == "Error":
            raise TableError(f"{table} was truncated at {lsn_text.format(scanned.truncates[0])} "
                             "and onTruncate is Error; re-snapshot the table (or set onTruncate: "
                             "Apply before re-snapshotting)", resnapshot=True)
        names = list(state.data_columns())
        for relation in batch.relations:  # columns the batch may add come after the mirror's
            if (relation.schema, relation.table) == tuple(table):
                for view in ddl.translations(relation, renames):
                    names += [c.name for c in view.columns if c.name not in names]
        config = spread.TableConfig(table, state.position, tuple(state.key), tuple(names),
                                    renames, self._check_unique(table, state),
                                    self.spec.sink.changelog.enabled)
        return Planned(state, plan, config, scanned)

    def _check_unique(self, table: TableName, state: TableState) -> bool:
        """Whether the table's key is configured (keyColumns) without PostgreSQL keeping it
        unique (:func:`lakeslot.source.keys.must_check`): then every insert is checked against
        the batch and the mirror."""
        options = self.job.table_spec(table)
        if options is None or not options.key_columns:  # (no catalog read: nothing to check)
            return False
        if table not in self._unique:
            current = self.sources.current_facts().get(table)
            self._unique[table] = current is not None and keys.must_check(
                self.sources.connection(), current.oid, options.key_columns, state.key)
        return self._unique[table]

    # 3. with the reduction ---------------------------------------------------------------------

    def reduced_here(self, planned: dict[TableName, Planned]) -> frozenset[TableName]:
        """The tables whose small batches the driver reduces itself, as it will apply them
        (:func:`lakeslot.apply.small_batches.reduced_here`)."""
        if not self.small.available:
            return frozenset()
        return small_batches.reduced_here({
            table: plan.scan.changes for table, plan in planned.items()
            if small_batches.may_take(plan.config, plan.scan, plan.state)})

    def small_rows(self, planned: dict[TableName, Planned], reduced: dict[TableName, spread.Reduced]
                   ) -> dict[TableName, pa.Table]:
        """The reduced rows of the tables that take the driver's path
        (:mod:`lakeslot.apply.small_batches`), collected in one Spark job per reduction made on
        the executors."""
        if not self.small.available:
            return {}
        by_reduction: dict[int, tuple[spread.Reduced, dict[TableName, int]]] = {}
        for table, plan in planned.items():
            each = reduced.get(table)
            if each is not None and small_batches.eligible(plan.config, plan.scan, plan.state,
                                                           each.tables.get(table)):
                by_reduction.setdefault(id(each), (each, {}))[1][table] = plan.scan.changes
        rows: dict[TableName, pa.Table] = {}
        with self.steps("collect"):
            for each, changes in by_reduction.values():
                try:
                    rows.update(small_batches.collect(each, changes))
                except Exception as e:  # noqa: BLE001 - each table's MERGE meets it, if real
                    log.warning("collecting small batches failed (%s): they take the MERGE",
                                error_summary(e))
        return rows

    def landed(self, table: TableName, planned: Planned, batch: spread.Batch) -> TableOutcome | None:
        """Before a retry of :meth:`apply`: the table's outcome when its commit of this batch
        landed though the attempt failed (a catalog's answer lost on the network after it applied
        the commit) — the table's position already reflects the batch, so the LSN rule leaves
        nothing to apply again; None when it did not land."""
        target = self.job.names.mirror_table(table)
        assert batch.end is not None
        position = self.tables.lsn(target)
        if position is None or position < batch.end - 1:
            return None
        log.warning("%s: its commit landed though the attempt failed (its answer was lost): "
                    "not applied again", table)
        return TableOutcome(table, target, "applied", position, changes=planned.scan.changes)

    def apply(self, table: TableName, planned: Planned, batch: spread.Batch,
              reduced: spread.Reduced | None, small: pa.Table | None = None) -> TableOutcome:
        """The table's pass (``reduced``: its reduction; None: no change of it in the batch;
        ``small``: its reduced rows when it takes the driver's path), in a CPU slot let go
        while a row delta's commit waits on the network (:mod:`lakeslot.apply.slots`)."""
        with self.slots.held():
            try:
                return self._apply(table, planned, batch, reduced, small)
            except Moved as e:  # (nothing committed: the next pass reads it and plans again)
                self._known.discard(table)
                return self.failures.retrying(table, f"{table}: {e}; its changes are applied "
                                              "from there in the next pass")

    def _apply(self, table: TableName, planned: Planned, batch: spread.Batch,
               reduced: spread.Reduced | None, small: pa.Table | None) -> TableOutcome:
        target = self.job.names.mirror_table(table)
        state, plan, config, scanned = planned.state, planned.plan, planned.config, planned.scan
        assert batch.end is not None  # plan returned "current" otherwise
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
            state = self.evolution.evolve(table, target, state, relations)
        if self.spec.sink.changelog.enabled:
            events = None if reduced is None or mine is None else functools.partial(
                self._events, table, state, target, reduced, mine, config.names)
            with self.steps("changelog"):
                self.changelog.append(target, state, lsn, plan, events)
            self.hooks("after-changelog", table)
        applied = plan.applied if plan is not None else ()
        if reduced is None or mine is None:
            # (with lakeslot's event trigger every table has a plan: an idle one)
            if (plan is None or plan.idle) and not self.spec.sink.changelog.enabled \
                    and not self.coverage.commit_due(table, state, lsn):
                return TableOutcome(table, target, "advanced", lsn, committed=state.lsn)
            with self._network():
                self.tables.advance(target, lsn, since=state.lsn)
            return TableOutcome(table, target, "advanced", lsn, ddl=applied)
        if small is not None:
            self.hooks("before-merge", table)
            with self.steps("delta"):
                delimiters, absent = self._parse_inputs(table, state, relations)
                done = self.small.apply(self.tables.held(target), table, state, small,
                                        mine.keeps, config.names, delimiters, absent, lsn,
                                        self.slots.waiting)
            if done:
                self.hooks("after-merge", table)
                return TableOutcome(table, target, "applied", lsn, changes=scanned.changes,
                                    ddl=applied)
        with self._network():  # (a MERGE reads the table as Spark's catalog holds it)
            self.tables.expect(target, state.lsn)
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
            if small is None:  # (else announced before the driver's row delta fell back)
                self.hooks("before-merge", table)
            with self.steps("merge"):
                self.tables.commit_sql(target, merge.merge_sql(source, qualified,
                                                               bool(scanned.truncates)), lsn)
        finally:
            merge.drop(self.spark, source)
        self.hooks("after-merge", table)
        return TableOutcome(table, target, "applied", lsn, changes=scanned.changes, ddl=applied)

    def _events(self, table: TableName, state: TableState, target: str, reduced: spread.Reduced,
                mine: spread.TableReduced, layout: tuple[str, ...], position: int) -> merge.Source:
        """The table's changelog events above ``position``, as a source."""
        events = reduced.rows(table, "E").filter(F.col("lsn") > position)
        return self._source_view(table, state, target, events, mine.event_keeps, mine.relations,
                                 layout)

    def _source_view(self, table: TableName, state: TableState, target: str, rows,
                     keeps: frozenset[int], relations: list[Relation],
                     layout: tuple[str, ...], reused: bool = False) -> merge.Source:
        qualified = self.tables.qualified(target)
        delimiters, absent = self._parse_inputs(table, state, relations)
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

    def _parse_inputs(self, table: TableName, state: TableState, relations: list[Relation]
                      ) -> tuple[dict[str, str], dict[str, str]]:
        """What parsing the table's reduced rows needs beyond them: each array column's element
        delimiter, and the value of each column some change does not carry."""
        delimiters: dict[str, str] = {}
        excluded = self.sources._excluded(table)
        for relation in relations:  # the latest description of a column wins
            delimiters.update(self.sources.types.delimiters(relation, excluded))
        # a change described without a mirror column came before the column was added (or after
        # it was dropped): the row holds the column's "missing value" in the source (else NULL)
        described = [{c.name for c in r.columns} for r in relations]
        not_carried = [n for n in state.data_columns() if any(n not in d for d in described)]
        absent = self.sources.missing_values(table, not_carried)[0] if not_carried else {}
        return delimiters, absent

    def _duplicate(self, table: TableName, state: TableState, key: tuple, where: str) -> NoReturn:
        raise TableError(f"{table}: " + keys.duplicate_error(self.sources.connection(), table,
                                                             state.key, key, where), resnapshot=True)
