"""From sealed segments to, per table, the changes to apply and their reduction (pure Python).

Invariants:

- One apply rule (DESIGN.md rule 3): table T takes exactly the changes whose commit LSN is above
  its position ``L_T`` (the ``lakeslot.lsn`` it reflects). A batch reads the chain of sealed
  segments (:func:`lakeslot.staging.segments.chain`) from the lowest position of the tables, so
  every table sees every change above its own position, whole transactions, in commit order
  (``commit_lsn``, then ``seq``). Rows of a zombie's overlapping segment below the previous
  segment's end are skipped (they were in the previous segment).
- A batch ends at the end of its last segment: segments hold the commits in ``[start, end)``, so
  after the batch a table reflects every commit ``≤ end - 1``; that is the ``lakeslot.lsn`` its
  commit records (the snapshot's ``s_T`` uses the same inclusive meaning).
- The reduction keeps the latest change per key: an insert or update leaves the row's full image,
  a delete leaves nothing, a key change is a delete of the old key and an image at the new key; a
  TRUNCATE drops everything before it (the mirror is then emptied of every row the batch does not
  write). An unchanged TOAST value (``u``) is never written as a placeholder: it takes the value an
  earlier change of the batch set, or the old tuple's value (REPLICA IDENTITY FULL), or else stays
  :data:`KEEP` — "the value the mirror holds for key ``source``" — resolved against the mirror.

Failure modes (:class:`TableError`, definite for that table): a change that does not carry the
mirror's key columns (key columns other than the replica identity need REPLICA IDENTITY FULL), an
unchanged TOAST value for a row the batch deleted or truncated, an unchanged TOAST key column.
A gap in staging (no sealed segment covers a needed LSN) raises
:class:`lakeslot.staging.segments.GapError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.errors import DefiniteError
from lakeslot.staging.relations import Relation
from lakeslot.staging.segments import NOT_IN_KEY, UNCHANGED_TOAST, SegmentName


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()
TOAST_FIX = ("set REPLICA IDENTITY FULL on the table (the old tuple then carries every value), "
             "then re-snapshot it")


class TableError(DefiniteError):
    """A definite error of one table; the message says why and what to do."""

    def __init__(self, message: str, *, resnapshot: bool = False, automatic: bool = False) -> None:
        super().__init__(message)
        self.resnapshot = resnapshot  # the way out is a re-snapshot of the table
        self.automatic = automatic  # ... which lakeslot starts by itself (onSchemaChange: Resnapshot)


@dataclass(frozen=True)
class Change:
    """One change of a table: op I/U/D/T with tuples ``{column: text | None | marker}``."""

    lsn: int
    seq: int
    op: str
    relation: Relation
    new: Mapping | None
    old: Mapping | None


def start_position(names: Sequence[SegmentName], position: int) -> int:
    """Where reading starts for a table at ``position``: the first LSN above it, or the first
    staged LSN for position 0 (a table created empty takes everything staged)."""
    if position == 0 and names:
        return names[0].start
    return position + 1


# the reduction ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Image:
    """A row's values as text (None for NULL, :data:`KEEP`: the mirror's value for ``source``).
    Columns absent from ``values`` are NULL (e.g. dropped from the source)."""

    values: Mapping[str, object]
    source: tuple | None = None

    @property
    def keeps(self) -> bool:
        return self.source is not None


@dataclass(frozen=True)
class Final:
    """The latest state of one key: ``image`` None means deleted."""

    key: tuple
    image: Image | None
    lsn: int
    fresh: bool = False  # the batch inserted the key without deleting it first: the mirror
    # before the batch must not hold it (checked for keys PostgreSQL does not keep unique)


class DuplicateKey(Exception):
    """An insert (or key change) of a key the batch already holds a row for."""

    def __init__(self, key: tuple, lsn: int) -> None:
        super().__init__(key, lsn)
        self.key, self.lsn = key, lsn


@dataclass(frozen=True)
class Event:
    """One change as the changelog records it (the image at that point; D: the old tuple)."""

    lsn: int
    seq: int
    op: str
    image: Image


@dataclass
class Reduction:
    finals: dict[tuple, Final]
    truncated: bool  # the mirror's rows not in ``finals`` are deleted
    events: list[Event]
    relations: list[Relation]  # distinct descriptions, in order of first use


def _key(table: TableName, key_columns: Sequence[str], values: Mapping | None, change: Change,
         what: str) -> tuple:
    if values is None:
        raise TableError(f"{table}: a {what} at {lsn_text.format(change.lsn)} carries no tuple")
    key = []
    for column in key_columns:
        value = values.get(column, NOT_IN_KEY)
        if value is NOT_IN_KEY:
            raise TableError(
                f"{table}: a change at {lsn_text.format(change.lsn)} does not carry key column "
                f"{column!r} (REPLICA IDENTITY {change.relation.replica_identity.upper()}); key "
                "columns other than the replica identity need REPLICA IDENTITY FULL: "
                f"ALTER TABLE {table} REPLICA IDENTITY FULL, then re-snapshot the table", resnapshot=True)
        if value is UNCHANGED_TOAST:
            raise TableError(f"{table}: key column {column!r} arrived as an unchanged TOAST value "
                             f"at {lsn_text.format(change.lsn)}; {TOAST_FIX}", resnapshot=True)
        if value is None:
            raise TableError(f"{table}: key column {column!r} is NULL at "
                             f"{lsn_text.format(change.lsn)}; choose non-null key columns")
        key.append(value)
    return tuple(key)


BOTH, OLD_SIDE, NEW_SIDE = 0, 1, 2  # roles of a change (see Reducer.take)


class Reducer:
    """The latest change per key, fed change by change in commit order (see the module
    docstring). Executors run one per table and key partition (:mod:`lakeslot.apply.spread`):
    a key change then reaches the old key's partition as ``OLD_SIDE`` (a delete of the old key)
    and the new key's as ``NEW_SIDE`` (the new image, with unchanged TOAST values kept from the
    mirror's old row); :meth:`take` returns True when that split is not exact — the old key had
    an image earlier in the batch that the new one needs — and the table must be reduced in one
    partition instead. ``check_unique`` (keys PostgreSQL does not keep unique): an insert or key
    change onto a key the batch holds a row for raises :class:`DuplicateKey`."""

    def __init__(self, table: TableName, key_columns: Sequence[str], *,
                 check_unique: bool = False, events: bool = True) -> None:
        self.table, self.key_columns, self.check_unique = table, key_columns, check_unique
        self.finals: dict[tuple, Final] = {}
        self.events: list[Event] | None = [] if events else None
        self.relations: list[Relation] = []
        self.truncated = False
        self.count = 0

    def result(self) -> Reduction:
        return Reduction(self.finals, self.truncated, self.events or [], self.relations)

    def take(self, change: Change, role: int = BOTH) -> bool:
        table, key_columns, finals = self.table, self.key_columns, self.finals
        relations = self.relations
        if (not relations or relations[-1] != change.relation) and change.relation not in relations:
            relations.append(change.relation)
        if role != OLD_SIDE:
            self.count += 1
        if change.op == "T":
            finals.clear()
            self.truncated = True
            self._event(Event(change.lsn, change.seq, "T", Image({})), role)
            return False
        if change.op == "I":
            key = _key(table, key_columns, change.new, change, "insert")
            assert change.new is not None  # _key raised otherwise
            image = Image(dict(change.new))
            before = finals.get(key)
            if self.check_unique and before is not None and before.image is not None:
                raise DuplicateKey(key, change.lsn)
            finals[key] = Final(key, image, change.lsn, fresh=before is None)
        elif change.op == "U":
            key = _key(table, key_columns, change.new, change, "update")
            old_key = (_key(table, key_columns, change.old, change, "update")
                       if change.old is not None else key)
            previous = finals.get(old_key)
            if old_key != key and role == OLD_SIDE:
                finals[old_key] = Final(old_key, None, change.lsn)
                return previous is not None and _needs_previous(change)
            if old_key != key and role == NEW_SIDE:
                previous = None  # in the old key's partition: kept from the mirror's old row
            image = _updated(table, change, previous, old_key, self.truncated)
            if old_key != key:
                before = finals.get(key)
                if self.check_unique and before is not None and before.image is not None:
                    raise DuplicateKey(key, change.lsn)
                if role == BOTH:
                    finals[old_key] = Final(old_key, None, change.lsn)
                fresh = before is None
            else:
                fresh = previous is not None and previous.fresh
            finals[key] = Final(key, image, change.lsn, fresh)
        elif change.op == "D":
            key = _key(table, key_columns, change.old, change, "delete")
            assert change.old is not None  # _key raised otherwise
            finals[key] = Final(key, None, change.lsn)
            image = Image({c: v for c, v in change.old.items() if v is not NOT_IN_KEY})
        else:
            return False
        self._event(Event(change.lsn, change.seq, change.op, image), role)
        return False

    def _event(self, event: Event, role: int) -> None:
        if self.events is not None and role != OLD_SIDE:
            self.events.append(event)


def _needs_previous(change: Change) -> bool:
    """Whether an update's new image takes a value from the row's previous image: an unchanged
    TOAST value the old tuple does not carry."""
    assert change.new is not None
    old = change.old or {}
    return any(v is UNCHANGED_TOAST and old.get(c, NOT_IN_KEY) in (NOT_IN_KEY, UNCHANGED_TOAST)
               for c, v in change.new.items())


def reduce(table: TableName, key_columns: Sequence[str], changes: Iterable[Change], *,
           check_unique: bool = False) -> Reduction:
    """The latest change per key of ``changes`` (in commit order), see :class:`Reducer`."""
    reducer = Reducer(table, key_columns, check_unique=check_unique)
    for change in changes:
        reducer.take(change)
    return reducer.result()


def _updated(table: TableName, change: Change, previous: Final | None, old_key: tuple,
             truncated: bool) -> Image:
    """The image an update leaves, its unchanged TOAST values resolved as far as the batch can."""
    values: dict[str, object] = {}
    source = None
    assert change.new is not None  # reduce took the key from it (_key raises on no tuple)
    for column, value in change.new.items():
        if value is not UNCHANGED_TOAST:
            values[column] = value
            continue
        old = change.old.get(column, NOT_IN_KEY) if change.old is not None else NOT_IN_KEY
        if old is not NOT_IN_KEY and old is not UNCHANGED_TOAST:
            values[column] = old  # REPLICA IDENTITY FULL: the old tuple carries the value
        elif previous is None and not truncated:
            values[column], source = KEEP, old_key
        elif previous is None or previous.image is None:
            raise TableError(
                f"{table}: column {column!r} arrived as an unchanged TOAST value at "
                f"{lsn_text.format(change.lsn)} for a row that was deleted or truncated before; "
                f"the value cannot be recovered: {TOAST_FIX}", resnapshot=True)
        else:
            values[column] = previous.image.values.get(column)
            if values[column] is KEEP:
                source = previous.image.source
    return Image(values, source)
