"""The changelog table of a mirror (``spec.sink.changelog``): an append-only history of the changes
the apply job applied, ``<mirror><suffix>`` (DESIGN.md "Data contracts").

Its columns (:func:`changelog_schema`): the mirror's, all optional and without identifier fields,
then ``_lakeslot_lsn``, ``_lakeslot_op`` and ``_lakeslot_seq``. It is created on first use at the
mirror's position, follows the mirror's renames and added or widened columns, and is appended
once per pass, before the mirror's MERGE.

Invariants:

- Each commit records the position it reflects (``lakeslot.lsn``, DESIGN.md rule 1), and a pass
  appends exactly the changes above the changelog's position — never below the mirror's: a
  changelog created or left behind by a re-snapshot starts at the mirror's position.
- The changelog commits before its mirror, so it is never behind it: after a crash between the
  two its changes are not appended twice (its position already moved), and the mirror catches up.

Failure modes: catalog and Spark errors propagate to the caller, which fails the table alone or
retries (:mod:`lakeslot.apply.failures`); nothing is appended then, and the position stays.
"""

from __future__ import annotations

from collections.abc import Callable

from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from lakeslot.apply import columns, ddl, merge
from lakeslot.mirror.contract import LSN_COLUMN, OP_COLUMN, SEQ_COLUMN, TableState, table_properties
from lakeslot.spark.tables import Tables


class Changelog:
    """The changelog tables of one apply job's mirrors."""

    def __init__(self, spark, spec, tables: Tables) -> None:
        self.spark, self.spec, self.tables = spark, spec, tables

    def append(self, target: str, state: TableState, lsn: int, plan: ddl.Plan | None,
               events: Callable[[int], merge.Source] | None) -> None:
        """Append the changes above the changelog's position (never below the mirror's: a
        changelog created or left behind by a re-snapshot starts at the mirror's position), and
        record ``lsn``. ``state``: the mirror's; ``events(position)``: the table's changelog
        events above ``position`` as a source (None: no change of the table in the batch)."""
        name = target + self.spec.sink.changelog.suffix
        log_state = self.tables.load(name)
        if log_state is None:
            self.tables.create(name, changelog_schema(state.schema),
                               table_properties(self.spec.sink.table_properties), state.position)
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
        position = max(log_state.lsn or 0, state.position)
        if position >= lsn:
            return
        if events is None:
            self.tables.advance(name, lsn)
            return
        source = events(position)
        try:
            self.tables.commit_sql(name, merge.append_sql(source, self.tables.qualified(target),
                                                          self.tables.qualified(name)), lsn)
        finally:
            merge.drop(self.spark, source)


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
