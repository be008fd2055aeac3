"""The grammar of ``spec.source.tables[].partitionBy``: Iceberg partition transforms of a mirror
table, parsed into :class:`PartitionField` rows, and checked against the mirror's column types.

One entry is one partition field::

    id                   identity: the column's value
    bucket(16, id)       Iceberg's 32-bit Murmur3 hash of the value modulo N (1 ≤ N ≤ 2^31 − 1)
    truncate(4, code)    strings cut to W code points, integers and decimals down to a multiple of W
    years(created_at)    also months, days, hours (singular forms and any case are accepted)
    identity(id)         the same as ``id``

A column is written bare when it is a plain name (no space, comma, parenthesis, double quote) and
then taken exactly as PostgreSQL stores it (no case folding, like ``keyColumns``), or in double
quotes with ``""`` for a quote, like SQL: ``days("Created At")``, ``bucket(8, "a""b")``.

Invariants:

- :func:`parse` is pure and total: it returns a field or raises :class:`PartitionSpecError` whose
  message names the entry, what is wrong and the accepted forms; it never guesses.
- :func:`parse_all` also rejects what Iceberg would refuse for the spec as a whole: the same field
  twice, and two time transforms of one column (Iceberg calls them redundant).
- :func:`type_problems` decides what a transform accepts by pyiceberg's own ``can_transform`` on
  the mirror column's Iceberg type (the type the snapshot and apply jobs write), so the answer is
  Iceberg's, including ``textColumns`` (mirrored as strings) and list columns (refused).
- :attr:`PartitionField.canonical` is the stable text of a field (plural names, quoted column when
  needed): what ``lakeslot.partition-by`` records on the mirror and what status messages show.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import IcebergType

MAX_WIDTH = 2**31 - 1
TIME_TRANSFORMS = ("years", "months", "days", "hours")
# transform → (name of its number, or None when it takes none)
ARITY: dict[str, str | None] = {"identity": None, "bucket": "N", "truncate": "W",
                                **dict.fromkeys(TIME_TRANSFORMS)}
ALIASES = {"year": "years", "month": "months", "day": "days", "hour": "hours"}
FORMS = ("a column name (identity), bucket(N, column), truncate(W, column), years(column), "
         "months(column), days(column) or hours(column)")
WHAT_TAKES = {
    "identity": "any column that is not a list",
    "bucket": "integer, numeric, text/varchar, date, time, timestamp, timestamptz, uuid or bytea "
              "columns (not boolean, real, double precision or lists)",
    "truncate": "integer, numeric, text/varchar or bytea columns",
    "years": "date, timestamp or timestamptz columns",
    "months": "date, timestamp or timestamptz columns",
    "days": "date, timestamp or timestamptz columns",
    "hours": "timestamp or timestamptz columns",
}
_SPECIAL = set('(),"')


class PartitionSpecError(ValueError):
    """An entry of partitionBy that is not a partition transform lakeslot can create."""


@dataclass(frozen=True)
class PartitionField:
    """One partition field: ``transform`` of ``column`` (``width``: bucket's N, truncate's W)."""

    transform: str  # identity | bucket | truncate | years | months | days | hours
    column: str
    width: int | None = None

    @property
    def canonical(self) -> str:
        column = quote_column(self.column)
        if self.transform == "identity":
            return column
        if self.width is not None:
            return f"{self.transform}({self.width}, {column})"
        return f"{self.transform}({column})"

    @property
    def iceberg(self) -> Transform:
        """The transform as pyiceberg knows it (its ``str`` is Iceberg's: ``bucket[16]``, ``day``)."""
        if self.transform == "bucket":
            assert self.width is not None  # parse() sets it for bucket
            return BucketTransform(self.width)
        if self.transform == "truncate":
            assert self.width is not None  # parse() sets it for truncate
            return TruncateTransform(self.width)
        return {"identity": IdentityTransform(), "years": YearTransform(),
                "months": MonthTransform(), "days": DayTransform(),
                "hours": HourTransform()}[self.transform]

    @property
    def name_suffix(self) -> str:
        """Iceberg's partition field name is the column plus this (its own naming convention)."""
        return {"identity": "", "bucket": f"_bucket_{self.width}", "truncate": f"_trunc_{self.width}",
                "years": "_year", "months": "_month", "days": "_day", "hours": "_hour"}[self.transform]

    def __str__(self) -> str:
        return self.canonical


def quote_column(name: str) -> str:
    """``name`` as partitionBy writes it: bare when that reads back the same, else double-quoted."""
    if name and not any(c in _SPECIAL or c.isspace() for c in name):
        return name
    return '"' + name.replace('"', '""') + '"'


class _Reader:
    """A cursor over one entry, for the recursive-descent parse below."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def fail(self, problem: str) -> PartitionSpecError:
        return PartitionSpecError(f"partitionBy entry {self.text!r}: {problem}; write {FORMS}")

    def skip_space(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.at] if self.at < len(self.text) else ""

    def rest(self) -> str:
        self.skip_space()
        return self.text[self.at:]

    def take(self, char: str) -> bool:
        if self.peek() == char:
            self.at += 1
            return True
        return False

    def word(self) -> tuple[str, bool]:
        """The next name or number, and whether it was double-quoted."""
        if self.peek() == '"':
            self.at += 1
            out = []
            while True:
                end = self.text.find('"', self.at)
                if end < 0:
                    raise self.fail("a double quote is not closed")
                out.append(self.text[self.at:end])
                self.at = end + 1
                if not self.text.startswith('"', self.at):
                    break
                out.append('"')
                self.at += 1
            name = "".join(out)
            if not name:
                raise self.fail('an empty quoted name ("")')
            return name, True
        start = self.at
        while (self.at < len(self.text) and self.text[self.at] not in _SPECIAL
               and not self.text[self.at].isspace()):
            self.at += 1
        return self.text[start:self.at], False

    def arguments(self) -> list[tuple[str, bool]]:
        """The comma-separated words up to the closing parenthesis (the opening one is taken)."""
        if self.take(")"):
            return []
        found = []
        while True:
            word = self.word()
            if not word[0] and not word[1]:
                raise self.fail("an argument is missing" if self.peek() in (",", ")")
                                else f"unexpected {self.peek()!r}")
            found.append(word)
            if self.take(")"):
                return found
            if not self.take(","):
                raise self.fail("a closing parenthesis is missing" if not self.peek()
                                else f"expected ',' or ')' but found {self.peek()!r}")


def parse(text: str) -> PartitionField:
    """One partitionBy entry as a :class:`PartitionField` (see the module docstring)."""
    reader = _Reader(text)
    if not reader.peek():
        raise reader.fail("it is empty")
    head, quoted = reader.word()
    if not head:
        raise reader.fail(f"unexpected {reader.peek()!r} at the start")
    if not reader.take("("):
        if reader.peek():
            raise reader.fail(f"unexpected {reader.rest()!r} after {head!r} (a column name with "
                              'spaces or punctuation is written in double quotes: "my column")')
        return PartitionField("identity", head)
    if quoted:
        raise reader.fail(f"a transform name is not quoted, found \"{head}\"(")
    transform = ALIASES.get(head.lower(), head.lower())
    if transform not in ARITY:
        raise reader.fail(f"unknown transform {head!r}")
    arguments = reader.arguments()
    if reader.peek():
        raise reader.fail(f"unexpected {reader.rest()!r} after the closing parenthesis")
    number = ARITY[transform]
    wanted = ["column"] if number is None else [number, "column"]
    if len(arguments) != len(wanted):
        raise reader.fail(f"{transform} takes {len(wanted)} argument{'s' * (len(wanted) > 1)} "
                          f"({', '.join(wanted)}), got {len(arguments)}")
    column = arguments[-1][0]
    if number is None:
        return PartitionField(transform, column)
    value, value_quoted = arguments[0]
    if value_quoted or not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_WIDTH:
        raise reader.fail(f"{transform}'s {number} must be a whole number from 1 to {MAX_WIDTH}, "
                          f"got {value!r}")
    return PartitionField(transform, column, int(value))


def parse_all(entries: Iterable[str]) -> tuple[PartitionField, ...]:
    """Every entry parsed, in order; also refuses duplicates and redundant time transforms."""
    fields = tuple(parse(entry) for entry in entries)
    seen: dict[tuple[str, str], PartitionField] = {}
    for field in fields:
        kind = "time" if field.transform in TIME_TRANSFORMS else field.transform
        if kind == "identity" or field.transform == "bucket" or field.transform == "truncate":
            kind = field.canonical  # several buckets or truncations of one column are legal
        earlier = seen.get((kind, field.column))
        if earlier is not None:
            if earlier == field:
                raise PartitionSpecError(f"partitionBy lists {field} twice; list it once")
            raise PartitionSpecError(
                f"partitionBy has both {earlier} and {field}: Iceberg allows one time transform "
                f"per column; keep the finer or the coarser one")
        seen[(kind, field.column)] = field
    return fields


FIXES = {"left out": "partition by another column",
         "missing": "name an existing column in partitionBy, exactly as PostgreSQL stores it",
         "type": "choose another transform or column in partitionBy"}


@dataclass(frozen=True)
class Problem:
    """Why one partition field cannot be created on a mirror (``kind``: a key of :data:`FIXES`,
    which says what to do)."""

    field: PartitionField
    kind: str
    problem: str

    @property
    def fix(self) -> str:
        return FIXES[self.kind]

    def __str__(self) -> str:
        return f"partitionBy {self.field}: {self.problem} — fix: {self.fix}"


def type_problems(fields: Sequence[PartitionField], columns: Mapping[str, IcebergType], *,
                  left_out: Mapping[str, str] | None = None,
                  source_types: Mapping[str, str] | None = None) -> list[Problem]:
    """What is wrong with ``fields`` for a mirror whose columns are ``columns`` (name → Iceberg
    type); ``left_out``: columns the source has but the mirror does not, each with why (e.g.
    "excluded (excludeColumns)"); ``source_types``: PostgreSQL type names, for the messages.
    Empty when every field can be created."""
    left_out, source_types = left_out or {}, source_types or {}
    problems = []
    for field in fields:
        column = quote_column(field.column)
        if field.column in left_out:
            problems.append(Problem(field, "left out", f"column {column} is "
                                    f"{left_out[field.column]}, so the mirror has no such column"))
        elif field.column not in columns:
            problems.append(Problem(field, "missing", f"the table has no column {column} (renamed "
                                    "or dropped?)"))
        elif not field.iceberg.can_transform(columns[field.column]):
            source = source_types.get(field.column)
            problems.append(Problem(
                field, "type", f"column {column} is "
                + (f"PostgreSQL {source}, " if source else "")
                + f"mirrored as {columns[field.column]}, and {field.transform} takes only "
                f"{WHAT_TAKES[field.transform]}"))
    return problems
