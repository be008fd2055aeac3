"""How a mirror follows its source table's definition during an apply pass: what changed in the
source besides rows, and the schema commits that follow it in place.

Every pass, before any change of a table is applied, idle tables included
(:meth:`Evolution.check_source`):

- with lakeslot's event trigger (the one the mirror's recorded facts name, still installed, no
  message it failed to write): the batch's DDL messages above the table's position are replayed
  (:mod:`lakeslot.apply.ddl`) into a plan, committed to the mirror before the MERGE
  (:meth:`Evolution.apply_ddl`: renames, added columns with the value existing rows got,
  promotions, and the facts as of the last message);
- without it: the catalog is compared with the recorded facts (:mod:`lakeslot.source.facts`:
  dropped and re-created, renamed or re-added columns, partitions attached, detached, dropped or
  truncated); columns added to the source are added now.

After the reduction, the relation descriptions the table's changes carried are compared with the
mirror (:meth:`Evolution.evolve`, :func:`lakeslot.apply.columns.plan_schema`): added columns are
added, dropped ones kept and NULL from then on; then existing rows get the value of columns
added with a default (the backfill).

Invariants:

- Never a silent divergence (DESIGN.md invariant 8): a type change, a default PostgreSQL wrote by
  rewriting the table, a change of another table of the same name, a key that moved (a new
  primary key, another replica identity index: :meth:`Evolution.check_key`; the copy keys the
  mirror by the new one), or anything the mirror cannot follow in place stops the table for a
  re-snapshot (automatic with ``onSchemaChange:
  Resnapshot``); ``onSchemaChange: Error`` stops it for any change of its definition.
- Every commit here keeps the table's position (``lakeslot.lsn``); the facts committed with the
  schema are those of the last message replayed, so a pass that crashed after the schema commit
  and before the MERGE replays nothing twice.

Failure modes: :class:`lakeslot.apply.changes.TableError` (definite, that table only, the way out
in its message); catalog and source connection errors propagate (transient, retried by the
caller, :mod:`lakeslot.apply.failures`).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import replace

from lakeslot.api.naming import TableName
from lakeslot.apply import columns, ddl, merge
from lakeslot.apply.changes import TableError
from lakeslot.apply.outcomes import Hooks
from lakeslot.apply.source_tables import SourceTables
from lakeslot.mirror.contract import (
    BACKFILL_PROPERTY,
    SCHEMA_CHANGE_PROPERTY,
    SOURCE_FACTS_PROPERTY,
    TableState,
)
from lakeslot.source import ddl_capture, facts
from lakeslot.spark.tables import Tables
from lakeslot.staging.relations import Relation

log = logging.getLogger("lakeslot.apply.job")


class Evolution:
    """The schema side of one apply job's tables (its memory: the tables this pass follows by
    their DDL messages)."""

    def __init__(self, spark, spec, tables: Tables, hooks: Hooks, sources: SourceTables) -> None:
        self.spark, self.spec, self.tables, self.hooks = spark, spec, tables, hooks
        self.sources = sources
        self._replayed: set[TableName] = set()  # this pass's: tables following DDL messages

    def new_pass(self) -> None:
        self._replayed = set()

    def check_source(self, table: TableName, target: str, state: TableState,
                     oids: frozenset[int]) -> ddl.Plan | None:
        """Stop the table for a re-snapshot when its source changed in a way the mirror cannot
        follow (DESIGN.md invariant 8), checked on every pass, idle tables included, before any
        change is applied. With lakeslot's event trigger (the one the recorded facts name still
        installed): the batch's DDL messages are replayed (:mod:`lakeslot.apply.ddl`) and the plan
        returned; else the catalog is compared with the recorded facts
        (:mod:`lakeslot.source.facts`) and None returned."""
        current = self.sources.current_facts().get(table)
        recorded_text = state.properties.get(SOURCE_FACTS_PROPERTY)
        if recorded_text is None:  # snapshotted before lakeslot recorded facts: adopt today's
            if current is not None:
                self.tables.set_properties(target, {SOURCE_FACTS_PROPERTY: current.to_json()})
            return None
        recorded = facts.TableFacts.from_json(recorded_text)
        capture = self.sources.capture
        if capture is not None and recorded.capture == capture.trigger and not any(
                e.event == "error" for e in self.sources.events):
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
        rewritten = self.sources.missing_values(table, added)[1] if added else []
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
        addable = [n for n in added if n not in self.sources._excluded(table)]
        if addable and self.spec.policies.on_schema_change == "Error":
            raise TableError(f"{table}: the source table's columns changed (added {addable}) "
                             f"and onSchemaChange is Error; {self._way_out()}", resnapshot=True)
        known = recorded.with_columns(current, addable)
        known = replace(known, capture=current.capture)
        if known == recorded:
            return None
        values = self.sources.missing_values(table, addable)[0] if addable else {}
        add = tuple(ddl.Added(n, self.sources.iceberg_of(table, ddl_capture.SourceColumn(
            current.columns[n], n, current.types[n], current.typmods.get(n, -1), None, ",",
            False)), values.get(n)) for n in addable)
        return ddl.Plan(known, add=add, applied=tuple(
            f"column {n!r} added (found in the catalog)" for n in addable))

    def _replay(self, table: TableName, state: TableState, recorded: facts.TableFacts,
                current: facts.TableFacts | None) -> ddl.Plan:
        position = state.position
        plan = ddl.replay(table, recorded, [e for e in self.sources.events if e.lsn > position],
                          state.data_columns(), functools.partial(self.sources.iceberg_of, table),
                          self.sources._excluded(table), self.sources._text_columns(table))
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

    def check_key(self, table: TableName, state: TableState, relations: list[Relation],
                  renames: tuple[tuple[int, int, str, str], ...]) -> None:
        """Stop the table for a re-snapshot when its changes were described with another key
        than the mirror's (:func:`moved_key`) — automatic with ``onSchemaChange: Resnapshot``,
        refused with ``Error``: the copy keys the mirror by the source's key as it is then."""
        options = self.sources.job.table_spec(table)
        if options is not None and options.key_columns:  # keyed by the spec, not the source
            return
        moved = moved_key(state.key, relations, renames)
        if moved is None:
            return
        what = (f"{table}: its key moved from ({', '.join(state.key)}) to ({', '.join(moved)}) "
                "(a new primary key, or the replica identity set to another unique index): the "
                "mirror's key (Iceberg identifier fields) follows the source's by a re-snapshot")
        if self.spec.policies.on_schema_change == "Error":
            raise TableError(f"{what}, and onSchemaChange is Error; {self._way_out()}", resnapshot=True)
        raise TableError(f"{what}; {self._way_out()}", resnapshot=True, automatic=self._automatic())

    def apply_ddl(self, table: TableName, target: str, state: TableState,
                  plan: ddl.Plan) -> TableState:
        """One schema commit: renames, added columns (their existing rows' value recorded for
        the backfill), promotions, and the facts as of the last message (so a crash before the
        MERGE replays nothing twice). Nothing to commit when the facts did not move."""
        if plan.add:  # the catalog's missing values, then the messages' (exact at the ADD) win
            self.sources.record_missing(table, {a.name: a.missing for a in plan.add})
        recorded = state.properties.get(SOURCE_FACTS_PROPERTY)
        position = state.position
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

    def evolve(self, table: TableName, target: str, state: TableState,
               relations: list[Relation]) -> TableState:
        """The mirror's schema after the descriptions the table's changes carried (``relations``),
        and its existing rows backfilled."""
        excluded = self.sources._excluded(table)
        described = [self.sources.types.of(r, excluded) for r in relations]
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
            values, _ = self.sources.missing_values(table, added)  # rewritten: check_source
            current = self.sources.current_facts().get(table)
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

    def _backfill(self, target: str, state: TableState) -> TableState:
        """Give existing rows the value of columns added with a default, recorded by evolve."""
        if not state.backfill:
            return state
        qualified = self.tables.qualified(target)
        statement, view = merge.backfill_sql(self.spark, state, self.spark.table(qualified).schema,
                                             qualified, state.backfill)
        self.tables.commit_sql(target, statement, state.position)
        self.spark.catalog.dropTempView(view)
        self.tables.set_properties(target, {}, remove=(BACKFILL_PROPERTY,))
        backfilled = self.tables.load(target)
        assert backfilled is not None  # it was just committed to
        return backfilled

    def _automatic(self) -> bool:
        return self.spec.policies.on_schema_change == "Resnapshot"

    def _way_out(self) -> str:
        policy = self.spec.policies.on_schema_change
        if policy == "Resnapshot":
            return "the table is copied again on its own (policies.onSchemaChange: Resnapshot)"
        return ("raise the table's resnapshotGeneration (spec.source.tables[]) to copy it again "
                f"(policies.onSchemaChange: {policy})")


def moved_key(key: list[str], relations: list[Relation],
              renames: tuple[tuple[int, int, str, str], ...]) -> list[str] | None:
    """The key the source's changes were described with when it is not the mirror's ``key``
    (its identifier fields), else None: a description under ``REPLICA IDENTITY DEFAULT`` or
    ``USING INDEX`` names its key columns (pgoutput's key flags), taken as the mirror names them
    after the batch's renames (``renames``: :func:`lakeslot.apply.ddl.translations`). A
    description with no key (the primary key dropped, none added yet) moves nothing: its updates
    and deletes cannot happen, PostgreSQL refuses them."""
    for relation in relations:
        if relation.replica_identity not in ("default", "index"):
            continue
        views = ddl.translations(relation, renames)
        keys = [[c.name for c in view.columns if c.key] for view in views]
        if keys[0] and all(set(k) != set(key) for k in keys):
            return keys[-1]
    return None
