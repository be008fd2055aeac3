"""Column types on the apply path: how a text value becomes the mirror's value, and what a new
relation description means for the mirror's schema.

Invariants:

- Values are parsed by the type the mirror column HAS (:func:`parser`), through the shared
  :mod:`lakeslot.mirror.typemap` (same parsers as the snapshot's text reads). So a column the snapshot
  kept as text stays text, a column promoted to ``long`` parses as ``int8``, and one mapping
  decides both paths.
- A relation description is compared with the mirror by the Iceberg type each column maps to
  (:class:`RelationTypes`, the snapshot's mapping; built-in types resolve without the catalog,
  others — domains, enums, composites — through the source catalog). A column listed in the
  table's ``textColumns`` maps to ``string`` as in the snapshot, so it never looks like a type
  change and its values parse as text.
- Schema evolution (:func:`plan_schema`): a column the mirror lacks is added (optional); a column
  whose Iceberg type widens the mirror's (int→long, float→double, decimal precision up at the same
  scale: what Iceberg allows) is a promotion — which the apply job still re-snapshots, since the
  rewrite behind it may have changed values; a mirror column absent from the description is kept
  and written NULL by every later change. Anything else is incompatible.
- ``onSchemaChange: Error`` turns every change into a definite error; otherwise added columns
  are added and everything else marks the table for re-snapshot.
- :func:`spark_parse` is the same parse as :func:`parser`'s, in the JVM, for the types where a
  Spark cast is exact on PostgreSQL's text form (numbers, bool, strings, dates, timestamps):
  every value it accepts gets the value the Python parser gives, and every value the Python
  parser rejects it flags, with the same reason (``tests/test_spark_parse.py`` checks the two
  side by side).

Failure mode: :class:`lakeslot.mirror.typemap.MappingError` (unsupported type) becomes a definite error of
the table, marked for re-snapshot with the column excluded or fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from pyiceberg.types import DecimalType, IcebergType, ListType
from pyspark.sql import types as spark_types

from lakeslot.mirror import typemap
from lakeslot.staging.relations import Column, Relation

# The PostgreSQL type whose text parser yields each Iceberg primitive (typemap's codecs).
_PG_OF_ICEBERG = {
    "int": "int4", "long": "int8", "float": "float4", "double": "float8", "boolean": "bool",
    "string": "text", "binary": "bytea", "uuid": "uuid", "date": "date",
    "timestamp": "timestamp", "timestamptz": "timestamptz",
}
_WIDER = {("int", "long"), ("float", "double")}


def _pg_of(iceberg: IcebergType) -> typemap.PgType:
    """The PostgreSQL type parsing into a primitive ``iceberg`` (KeyError for any other type)."""
    if isinstance(iceberg, DecimalType):
        return typemap.PgType("numeric", typmod=((iceberg.precision << 16) | iceberg.scale) + 4)
    return typemap.PgType(_PG_OF_ICEBERG[str(iceberg)])


def parser(name: str, iceberg: IcebergType, delimiter: str = ",") -> typemap.ColumnMapping:
    """The mapping that parses text into a mirror column of type ``iceberg``; ``delimiter``
    separates array elements in the source type's text form (``;`` for ``box[]``)."""
    if isinstance(iceberg, ListType):
        element = _pg_of(iceberg.element_type)
        return typemap.map_column(name, typemap.PgType(element.name, typmod=element.typmod,
                                                       array=True, delimiter=delimiter))
    return typemap.map_column(name, _pg_of(iceberg))


_SPARK_CASTS = (spark_types.IntegerType, spark_types.LongType, spark_types.FloatType,
                spark_types.DoubleType)  # PostgreSQL's text form of these casts exactly
_SPARK_TIMESTAMPS = (spark_types.TimestampNTZType, spark_types.TimestampType)


@dataclass(frozen=True)
class SparkParse:
    """A text column parsed in the JVM (:func:`spark_parse`): Spark SQL expressions."""

    value: str
    rejected: str | None  # true where :func:`parser` rejects the value; None: it never does
    reason: str  # a string: why, in :class:`lakeslot.mirror.typemap.UnmappableValue`'s words


def sql_text(value: str) -> str:
    """A Spark SQL expression for the string ``value``, whatever it holds (hex: nothing to
    escape; Spark folds it to a constant)."""
    return f"decode(unhex('{value.encode().hex()}'), 'UTF-8')"


def spark_parse(spark_type: spark_types.DataType, name: str,
                parsed: str | None = None) -> SparkParse | None:
    """The string column ``name`` (one lakeslot named) parsed in the JVM into a mirror column of
    ``spark_type`` as :func:`parser` parses it (see the module docstring); None where no Spark
    cast is exact (binary, uuid, lists: they parse in Python). ``try_cast``: NULL, never an
    error, whatever ``spark.sql.ansi.enabled`` says. ``parsed``: a column holding ``value``
    already, which ``rejected`` then reads instead of parsing again (Spark does not share a cast
    between a CASE's condition and its result: measured, that parsed every value twice).

    A timestamptz text ends in ``+00`` (the reader's sessions run in UTC, as lakeslot's Spark
    sessions do: ``spark.sql.session.timeZone`` is reserved): such a text is cast without its
    offset, which parsing took half the time of the cast."""
    text = f"`{name}`"
    if isinstance(spark_type, spark_types.StringType):
        return SparkParse(text, None, "''")
    if isinstance(spark_type, spark_types.BooleanType):  # typemap: 't' is true, all else false
        return SparkParse(f"({text} = 't')", None, "''")
    kind = spark_type.simpleString()
    value = f"try_cast({text} AS {kind})"
    if isinstance(spark_type, spark_types.TimestampType):
        value = (f"CASE WHEN {text} LIKE '%+00' THEN try_cast(substring({text}, 1, "
                 f"length({text}) - 3) AS {kind}) ELSE {value} END")
    rejected, reason = f"{parsed or value} IS NULL", sql_text(f"which is not a {kind}")
    if isinstance(spark_type, spark_types.DecimalType):  # PostgreSQL prints the column's scale:
        # more digits would be rounded by the cast; NaN and ±Infinity are not decimals
        digits = f"([.][0-9]{{0,{spark_type.scale}}})?" if spark_type.scale else ""
        rejected += f" OR NOT {text} RLIKE '^-?[0-9]+{digits}$'"
        reason = (f"CASE WHEN {text} = 'NaN' THEN {sql_text(typemap.NUMERIC_NAN)} "
                  f"WHEN {text} IN ('Infinity', '-Infinity') THEN "
                  f"{sql_text(typemap.NUMERIC_INFINITY)} "
                  f"ELSE {sql_text(f'which {kind} cannot hold')} END")
    elif isinstance(spark_type, spark_types.DateType):  # BC, ±infinity, and years after 9999,
        rejected += f" OR length({text}) <> 10"  # which Spark would take
        reason = sql_text(typemap.OUT_OF_RANGE)
    elif isinstance(spark_type, _SPARK_TIMESTAMPS):
        rejected += f" OR substring({text}, 5, 1) <> '-' OR {text} LIKE '% BC'"
        reason = sql_text(typemap.OUT_OF_RANGE)
    elif not isinstance(spark_type, _SPARK_CASTS):
        return None
    return SparkParse(value, f"({text} IS NOT NULL AND ({rejected}))", reason)


FIRST_NORMAL_OID = 16384  # PostgreSQL's FirstNormalObjectId: below it, only built-in objects
BUILTIN_DELIMITERS = {"box": ";"}  # pg_type.typdelim of the built-in types whose isn't ","


def builtin_pg_type(column: Column) -> typemap.PgType | None:
    """The type of a column of a built-in type (arrays are ``_<element>``); None otherwise.

    The OID decides, not the name: pgoutput's Type message names a domain by its base type
    (``pg_catalog.numeric``) while the column's typmod is the domain's -1, so a
    ``numeric(6,2)`` domain would pass for unconstrained numeric; it must be resolved through
    the catalog like the snapshot does."""
    if (column.type_oid >= FIRST_NORMAL_OID or column.type_schema != "pg_catalog"
            or column.type_name is None):
        return None
    if column.type_name.startswith("_"):
        element = column.type_name[1:]
        return typemap.PgType(element, typmod=column.type_modifier, array=True,
                              delimiter=BUILTIN_DELIMITERS.get(element, ","))
    return typemap.PgType(column.type_name, typmod=column.type_modifier)


def same_type(a: IcebergType, b: IcebergType) -> bool:
    if isinstance(a, ListType) and isinstance(b, ListType):
        return same_type(a.element_type, b.element_type)
    return a == b


def widens(old: IcebergType, new: IcebergType) -> bool:
    """Whether Iceberg can promote a column of type ``old`` to ``new``."""
    if (str(old), str(new)) in _WIDER:
        return True
    return (isinstance(old, DecimalType) and isinstance(new, DecimalType)
            and new.scale == old.scale and new.precision > old.precision)


@dataclass(frozen=True)
class SchemaPlan:
    add: tuple[tuple[str, IcebergType], ...] = ()
    promote: tuple[tuple[str, IcebergType], ...] = ()
    dropped: tuple[str, ...] = ()
    incompatible: tuple[str, ...] = ()

    @property
    def changes(self) -> bool:
        return bool(self.add or self.promote or self.dropped or self.incompatible)

    def describe(self) -> str:
        parts = [f"added {[n for n, _ in self.add]}" if self.add else "",
                 f"widened {[n for n, _ in self.promote]}" if self.promote else "",
                 f"dropped {list(self.dropped)}" if self.dropped else "",
                 "; ".join(self.incompatible)]
        return "; ".join(p for p in parts if p)


def _no_text_columns(relation: Relation) -> Collection[str]:
    return ()


@dataclass
class RelationTypes:
    """Iceberg types of relation descriptions, each description resolved once.

    ``text_columns(relation)``: the columns of that table kept as PostgreSQL text
    (``spec.source.tables[].textColumns``): they map to ``string`` whatever their type, as the
    snapshot maps them, so a text column never looks like a type change."""

    resolve: Callable[[Column], typemap.PgType]  # a non-built-in type, through the catalog
    text_columns: Callable[[Relation], Collection[str]] = _no_text_columns
    _cache: dict = field(default_factory=dict)

    def of(self, relation: Relation, excluded: Sequence[str]) -> dict[str, IcebergType | str]:
        """Column → Iceberg type, or the reason the column cannot be mapped."""
        return {name: iceberg for name, (iceberg, _) in self._resolved(relation, excluded).items()}

    def delimiters(self, relation: Relation, excluded: Sequence[str]) -> dict[str, str]:
        """Column → the array delimiter of its type's text form."""
        return {name: delimiter for name, (_, delimiter) in self._resolved(relation, excluded).items()}

    def _resolved(self, relation: Relation, excluded: Sequence[str]) -> dict[str, tuple]:
        cache_key = (relation, tuple(excluded))
        if cache_key not in self._cache:
            types: dict[str, tuple[IcebergType | str, str]] = {}
            text = set(self.text_columns(relation))
            for column in relation.columns:
                if column.name in excluded:
                    continue
                try:
                    pg = builtin_pg_type(column) or self.resolve(column)
                    mapped = typemap.map_column(column.name, pg, as_text=column.name in text)
                    types[column.name] = (mapped.iceberg(0), pg.delimiter)
                except typemap.MappingError as e:
                    types[column.name] = (str(e), ",")
            self._cache[cache_key] = types
        return self._cache[cache_key]


def plan_schema(mirror: Mapping[str, IcebergType],
                relations: Sequence[Mapping[str, IcebergType | str]], *,
                widened_in_place: bool = False) -> SchemaPlan:
    """What the descriptions ``relations`` (column → Iceberg type or reason, in order) ask of a
    mirror with columns ``mirror`` (``_lakeslot_lsn`` excluded). ``widened_in_place``: the
    table's type changes were already judged from lakeslot's DDL messages (which know whether a
    rewrite kept the values), so a column described narrower than the mirror has it is a
    narrowing only in its latest description: an earlier one is from before a widening. Without
    them, any narrower description is incompatible (a rewrite may have changed the values)."""
    current = dict(mirror)
    add: list[tuple[str, IcebergType]] = []
    promote: list[tuple[str, IcebergType]] = []
    incompatible: list[str] = []
    seen: set[str] = set()
    last = {name: i for i, relation in enumerate(relations) for name in relation}
    for i, relation in enumerate(relations):
        for name, iceberg in relation.items():
            seen.add(name)
            if isinstance(iceberg, str):
                incompatible.append(iceberg)
            elif name not in current:
                add.append((name, iceberg))
                current[name] = iceberg
            elif same_type(current[name], iceberg):
                continue
            elif widens(current[name], iceberg):
                promote.append((name, iceberg))
                current[name] = iceberg
            elif widened_in_place and widens(iceberg, current[name]) and i < last[name]:
                continue  # described before a widening the mirror already has: the values fit
            else:
                incompatible.append(f"column {name!r} changed type from {current[name]} to "
                                    f"{iceberg}, which Iceberg cannot promote")
    dropped = tuple(n for n in mirror if relations and n not in seen)
    return SchemaPlan(tuple(add), tuple(promote), dropped, tuple(dict.fromkeys(incompatible)))

