"""Replaying a table's DDL messages (:mod:`lakeslot.source.ddl_capture`) onto its mirror (pure).

Input: the table's recorded source facts (as of the last DDL message the mirror includes, see
:class:`lakeslot.source.facts.TableFacts`), the trigger's messages of the batch in stream order,
and the mirror's columns. Output (:class:`Plan`): either a reason to copy the table again, or
what to do to the mirror in place, each with the statement that caused it:

==========================================  ==============================================
DDL                                         outcome
==========================================  ==============================================
ADD COLUMN (nullable, or constant default)  column added; existing rows get the value
                                            PostgreSQL gave them (the message's missing
                                            value, even if a later rewrite cleared it)
RENAME COLUMN                               Iceberg rename, values kept; changes before the
                                            rename (same transaction included) are read
                                            with the new name (:func:`translations`)
ALTER … TYPE, no rewrite, same Iceberg      nothing (e.g. varchar(10) → varchar(20), text)
type; or a widening Iceberg allows          type promoted (numeric precision up)
ALTER … TYPE with rewrite, no USING,        type promoted (int2/int4 → int8, float4 →
value-preserving integer/float widening     float8) or nothing (int2 → int4)
DROP COLUMN                                 kept in the mirror, NULL from then on
CREATE TABLE … PARTITION OF (empty)         nothing
anything else: a rewrite that may change    re-snapshot of this table alone
values (USING, volatile default, generated
column), another type change, DROP/re-
CREATE or RENAME of the table, ATTACH/
DETACH/DROP of a partition, a renamed or
re-added column whose name is excluded or
kept as text, a message the trigger could
not write (``error``)
==========================================  ==============================================

Invariants: a message at or below the facts' ``stamp`` is already in the facts and ignored (a
pass that crashed after the schema commit and before the MERGE is replayed without doing
anything twice); the renames the facts keep above the mirror's position still translate the
changes of the replayed pass. A message of another table is ignored unless it names this table
(re-created under the same name) or one of its partitions.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from pyiceberg.types import IcebergType

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.apply.columns import same_type, widens
from lakeslot.mirror import typemap
from lakeslot.source.ddl_capture import DdlEvent, SourceColumn
from lakeslot.source.facts import TableFacts
from lakeslot.staging.relations import Relation

INT2, INT4, INT8, FLOAT4, FLOAT8 = 21, 23, 20, 700, 701
# rewrites that keep every value (no USING): the text form of each value is unchanged
VALUE_PRESERVING = {(INT2, INT4), (INT2, INT8), (INT4, INT8), (FLOAT4, FLOAT8)}


@dataclass(frozen=True)
class Added:
    name: str
    iceberg: IcebergType
    missing: str | None  # what existing rows hold (text form); None: NULL


@dataclass(frozen=True)
class Plan:
    facts: TableFacts  # after the batch's messages
    reason: str | None = None  # re-snapshot the table (the rest of the plan is void)
    renames: tuple[tuple[str, str], ...] = ()  # in order
    add: tuple[Added, ...] = ()
    promote: tuple[tuple[str, IcebergType], ...] = ()
    applied: tuple[str, ...] = ()  # what was done, with the statement and its LSN
    messages: int = 0  # the batch's messages replayed (any table's: each moves the facts' stamp)

    @property
    def changes_mirror(self) -> bool:
        return bool(self.renames or self.add or self.promote)

    @property
    def idle(self) -> bool:
        """Whether the plan replayed no message and does nothing (the table's state is as if
        there were no plan)."""
        return not (self.messages or self.applied or self.changes_mirror)


def _at(event: DdlEvent) -> str:
    return f"{event.tag} at {lsn_text.format(event.lsn)}"


class _Resnapshot(Exception):
    pass


def replay(table: TableName, facts: TableFacts, events: Iterable[DdlEvent],
           mirror: Mapping[str, IcebergType], iceberg_of: Callable[[SourceColumn], IcebergType],
           excluded: Sequence[str] = (), text_columns: Sequence[str] = ()) -> Plan:
    """The plan for ``events`` (the batch's messages, in stream order) of ``table``, whose facts
    are ``facts`` and whose mirror has ``mirror`` (column → type). ``iceberg_of``: the mirror type
    of a source column (raises :class:`lakeslot.mirror.typemap.MappingError`)."""
    replayer = _Replayer(table, facts, dict(mirror), iceberg_of, set(excluded), set(text_columns))
    try:
        for event in events:
            if event.position > facts.stamp:
                replayer.take(event)
    except _Resnapshot as e:
        return Plan(facts, reason=str(e))
    return replayer.plan()


@dataclass
class _Replayer:
    table: TableName
    facts: TableFacts
    mirror: dict[str, IcebergType]
    iceberg_of: Callable[[SourceColumn], IcebergType]
    excluded: set[str]
    text: set[str]

    def __post_init__(self) -> None:
        self.renames: list[tuple[str, str]] = []
        self.add: dict[str, Added] = {}
        self.promote: dict[str, IcebergType] = {}
        self.applied: list[str] = []
        self.leaves = dict(self.facts.partitions)
        self.rewritten = False  # a rewrite message for this table came before its DDL message
        self.messages = 0

    def plan(self) -> Plan:
        return Plan(self.facts, None, tuple(self.renames), tuple(self.add.values()),
                    tuple(self.promote.items()), tuple(self.applied), self.messages)

    def stop(self, event: DdlEvent, why: str) -> None:
        raise _Resnapshot(f"{why} ({_at(event)})")

    def take(self, event: DdlEvent) -> None:
        facts = self.facts
        self.messages += 1
        if event.event == "error":
            self.stop(event, f"lakeslot's event trigger could not describe a command: "
                             f"{event.error}")
        elif event.event == "rewrite":
            if event.oid == facts.oid or event.oid in self.leaves:
                self.rewritten = True
        elif event.event == "drop":
            if event.oid == facts.oid:
                self.stop(event, "the table was dropped")
            if event.oid in self.leaves:
                self.stop(event, f"its partition {event.schema}.{event.name} was dropped with "
                                 "its rows, which no change in the stream deletes")
        elif event.event == "ddl":
            if event.oid == facts.oid:
                self._table(event)
            elif event.root == facts.oid and event.oid is not None:
                self._partition(event)
            elif (event.schema, event.name) == tuple(self.table):
                self.stop(event, f"another table (OID {event.oid}) now has this name: the table "
                                 "was dropped and created again, or another renamed to it")
        self.facts = replace(self.facts, stamp=event.position, partitions=tuple(
            sorted(self.leaves.items())))

    def _partition(self, event: DdlEvent) -> None:
        assert event.oid is not None  # checked by take
        if event.oid not in self.leaves and event.tag != "CREATE TABLE":
            self.stop(event, "a partition was attached: its rows never were in the stream")
        if self.rewritten:
            self.stop(event, f"partition {event.schema}.{event.name} was rewritten, which may "
                             "have changed values")
        if event.oid not in self.leaves:
            self.applied.append(f"new empty partition {event.schema}.{event.name} ({_at(event)})")
        self.leaves[event.oid] = event.relfilenode or self.leaves.get(event.oid, 0)

    def _table(self, event: DdlEvent) -> None:
        if (event.schema, event.name) != tuple(self.table):
            self.stop(event, f"the table was renamed to {event.schema}.{event.name}")
        rewritten, self.rewritten = self.rewritten, False
        facts = self.facts
        by_attnum = {attnum: name for name, attnum in facts.columns.items()}
        now = {c.attnum: c for c in event.columns}
        for attnum, column in now.items():
            old = by_attnum.get(attnum)
            if old is None:
                self._added(event, column, rewritten)
                continue
            if old != column.name:
                self._renamed(event, old, column.name)
            if (facts.types.get(old), facts.typmods.get(old, column.type_modifier)) != (
                    column.type_oid, column.type_modifier):
                self._retyped(event, column, facts.types.get(old), rewritten)
        if event.partitions is not None:
            after = dict(event.partitions)
            if set(self.leaves) - set(after):
                self.stop(event, "a partition was detached: its rows left the table without "
                                 "any change in the stream")
            if set(after) - set(self.leaves):
                self.stop(event, "a partition was attached: its rows never were in the stream")
            self.leaves = after
        self.facts = replace(
            self.facts, columns={c.name: a for a, c in now.items()},
            types={c.name: c.type_oid for c in now.values()},
            typmods={c.name: c.type_modifier for c in now.values()})

    def _added(self, event: DdlEvent, column: SourceColumn, rewritten: bool) -> None:
        name = column.name
        if name in self.excluded:
            return
        if name in self.mirror:
            self.stop(event, f"column {name!r} was dropped and added again: its values changed "
                             "without any row change")
        if column.generated or rewritten:
            self.stop(event, f"column {name!r} was added with values PostgreSQL computed for "
                             "every row (a volatile default or a generated column), which no "
                             "row change reports")
        iceberg = self._iceberg(event, column)
        missing = (typemap.parse_array(column.missing, column.delimiter)[0]
                   if column.missing is not None else None)
        self.add[name] = Added(name, iceberg, missing)
        self.mirror[name] = iceberg
        self.applied.append(f"column {name!r} added ({_at(event)})")

    def _renamed(self, event: DdlEvent, old: str, new: str) -> None:
        if {old, new} & self.excluded or (old in self.text) != (new in self.text):
            self.stop(event, f"column {old!r} was renamed to {new!r}, and only one of the names "
                             "is listed in excludeColumns or textColumns")
        if new in self.mirror:
            self.stop(event, f"column {old!r} was renamed to {new!r}, a name the mirror still "
                             "has for a dropped column")
        self.renames.append((old, new))
        self.facts = replace(self.facts, renames=(*self.facts.renames,
                                                  (event.lsn, event.seq, old, new)))
        if old in self.mirror:
            self.mirror[new] = self.mirror.pop(old)
        if old in self.add:
            self.add[new] = replace(self.add.pop(old), name=new)
        if old in self.promote:
            self.promote[new] = self.promote.pop(old)
        self.applied.append(f"column {old!r} renamed to {new!r} ({_at(event)})")

    def _retyped(self, event: DdlEvent, column: SourceColumn, was: int | None,
                 rewritten: bool) -> None:
        name = column.name
        current = self.mirror.get(name)
        if current is None or name in self.excluded:
            return
        iceberg = self._iceberg(event, column)
        preserved = not rewritten or (not event.using and (was, column.type_oid) in VALUE_PRESERVING)
        if preserved and same_type(current, iceberg):
            return
        if preserved and widens(current, iceberg):
            self.promote[name] = iceberg
            self.mirror[name] = iceberg
            self.applied.append(f"column {name!r} widened from {current} to {iceberg} "
                                f"({_at(event)})")
            return
        how = ("the table was rewritten with a USING expression, which may have changed values"
               if rewritten and event.using else
               "the table was rewritten, which may have changed values" if rewritten else
               f"Iceberg cannot promote {current} to {iceberg}")
        self.stop(event, f"column {name!r} changed type: {how}")

    def _iceberg(self, event: DdlEvent, column: SourceColumn) -> IcebergType:
        try:
            return self.iceberg_of(column)
        except typemap.MappingError as e:
            self.stop(event, f"column {column.name!r}: {e}")
            raise  # stop raised


def epoch(renames: Sequence[tuple[int, int, str, str]], lsn: int, seq: int) -> int:
    """The rename epoch of the change at (``lsn``, ``seq``): how many renames precede it."""
    return bisect.bisect_right([(r[0], r[1]) for r in renames], (lsn, seq))


def translations(relation: Relation, renames: Sequence[tuple[int, int, str, str]]
                 ) -> list[Relation]:
    """``relation`` as each rename epoch sees it, named as the mirror is after every rename
    (``renames``: (lsn, seq, old, new) in stream order): epoch ``e`` holds the changes after the
    first ``e`` renames, whose columns every rename from the ``e``-th on still renames."""
    result = []
    for epoch in range(len(renames) + 1):
        names = [c.name for c in relation.columns]
        for _, _, old, new in renames[epoch:]:
            names = [new if n == old else n for n in names]
        result.append(replace(relation, columns=tuple(
            replace(c, name=n) for c, n in zip(relation.columns, names, strict=True))))
    return result
