"""How PostgreSQL column types land in Iceberg: the one place that decides it.

Both the snapshot (COPY through the ADBC driver) and the apply job (pgoutput text values) use this
module, so a value lands the same way whichever path carried it.

Classification (used by preflight): a column type, after resolving domains to their base type and
arrays to their element type, is one of

- ``NATIVE``: a faithful Arrow/Iceberg type exists (integers, numerics, floats, bool, strings,
  bytea, uuid, dates and times, json/jsonb, enums as strings, inet/cidr/macaddr/money/xml as
  strings, arrays of these as lists).
- ``TEXT``: no Arrow type carries the value faithfully, so the column is kept as PostgreSQL's
  own text form (ranges, multiranges, composite types, geometric types, bit strings, tsvector,
  tsquery, pg_lsn, and types from extensions such as hstore or ltree). Text is lossless:
  PostgreSQL can read every such value back from it.
- ``UNSUPPORTED``: the text form is not a stable rendering of the value. The ``reg*`` OID alias
  types (``regclass``, ``regtype``…) print a name looked up in the catalog at decode time, so the
  snapshot and the stream could write different text for the same stored OID. Pseudo-types
  cannot be column types at all.

Failure mode: an unknown base type is ``TEXT`` (never silently dropped, never guessed).

Mapping (:func:`map_column`; Iceberg type / Arrow type; "text form" means the type's output
function, i.e. exactly what ``psql`` and pgoutput print in a session with ``TimeZone=UTC``,
``DateStyle=ISO``, ``IntervalStyle=postgres``, ``extra_float_digits=3``):

=====================================  =======================  ================================
PostgreSQL                             Iceberg                  values with no faithful mapping
=====================================  =======================  ================================
int2, int4                             int                      —
int8, oid                              long                     —
float4 / float8                        float / double           NaN, ±Infinity kept (IEEE 754)
bool                                   boolean                  —
numeric(p,s), p' ≤ 38 (see below)      decimal(p',s')           NaN, ±Infinity → definite error
numeric (unconstrained) or p' > 38     string (text form)       NaN, ±Infinity kept as text
text, varchar                          string                   —
char(n) / bpchar, name, "char"         string (text form)       padding of char(n) kept
bytea                                  binary                   —
uuid                                   uuid                     —
date                                   date                     ±infinity, BC, year > 9999 → error
timestamp                              timestamp (no zone)      ±infinity, BC, year > 9999 → error
timestamptz                            timestamptz (UTC)        ±infinity, BC, year > 9999 → error
time                                   string (text form)       Spark has no time type; 24:00:00
timetz                                 string (text form)       the offset has no Iceberg type
interval                               string (text form)       months/days/µs are not a duration
json, jsonb, xml                       string (text form)       —
money                                  string (text form)       text follows the server's lc_monetary
inet, cidr, macaddr, macaddr8          string (text form)       —
enum                                   string (label)           —
TEXT kind (ranges, composite, …)       string (text form)       —
arrays of the above                    list<element>            more than one dimension or a
                                                                lower bound other than 1 → error
=====================================  =======================  ================================

``p'``/``s'``: ``numeric(p,s)`` becomes ``decimal(max(p,s) - min(s,0), max(s,0))`` (PostgreSQL 15
allows a negative scale and a scale above the precision). ±Infinity cannot reach a decimal:
PostgreSQL rejects it in a ``numeric(p,s)`` ("numeric field overflow"), and a column altered to
unconstrained ``numeric`` no longer maps to the mirror's decimal (a type change); the parsers
still flag it (:data:`NUMERIC_INFINITY`) rather than trust that.

The rule for a value with no faithful mapping is always the same: it is never altered. The
conversion raises :class:`UnmappableValue` naming the column, the reason and (where known) the
value; the caller turns that into a definite error for the table whose fix is to list the column
in the table's ``spec.source.tables[].textColumns`` (``as_text``: the column is then kept as its
text form, which every value has, on the snapshot and the apply path alike) or in its
``excludeColumns``. Key columns become Iceberg identifier fields, which Iceberg requires to be
non-null primitives other than float/double: a key column of another type is a :class:`MappingError`.

Two ways to read a column, one result (:class:`ColumnMapping`):

- ``NATIVE`` read: the snapshot selects :meth:`ColumnMapping.select` (a cast the ADBC driver
  decodes from binary COPY) and converts with :meth:`ColumnMapping.from_native`. The driver is
  not trusted with values it decodes wrongly: ``oid`` and ``int2`` are cast up first, infinite and
  out-of-range dates/timestamps (which it turns into wrapped-around numbers) are caught by a range
  check, numerics arrive as scaled ``int8`` (NaN flagged by a check column), and arrays carry a
  check column for their shape (the driver flattens multi-dimensional arrays).
- ``TEXT`` read: the column's text form is parsed by :meth:`ColumnMapping.from_text`. This is the
  path the apply job uses for every value, and the snapshot uses for every column that has no
  native read.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

from lakeslot.mirror.contract import LSN_COLUMN

NATIVE_TYPES = frozenset({
    "int2", "int4", "int8", "numeric", "float4", "float8", "bool", "text", "varchar", "bpchar",
    "char", "name", "bytea", "uuid", "date", "time", "timetz", "timestamp", "timestamptz",
    "interval", "json", "jsonb", "inet", "cidr", "macaddr", "macaddr8", "money", "xml", "oid",
})
UNSUPPORTED_TYPES = frozenset({
    "regclass", "regcollation", "regconfig", "regdictionary", "regnamespace", "regoper",
    "regoperator", "regproc", "regprocedure", "regrole", "regtype",
})

MAX_DECIMAL_PRECISION = 38
MAX_INT8_DECIMAL_PRECISION = 18  # 10**18 < 2**63: the scaled value of such a decimal fits in int8

# Years 1..9999: what Spark, Python and most engines can read (Iceberg itself stores any int64).
_DATE_MIN, _DATE_END = -719162, 2932897  # days since 1970-01-01 of 0001-01-01 and 10000-01-01
_TS_MIN, _TS_END = _DATE_MIN * 86_400_000_000, _DATE_END * 86_400_000_000  # microseconds
OUT_OF_RANGE = "outside 0001-01-01 .. 9999-12-31 (±infinity, BC, or a year after 9999)"
NUMERIC_NAN = "NaN, which a decimal cannot hold"
NUMERIC_INFINITY = "±Infinity (PostgreSQL 14 and later), which a decimal cannot hold"
ARRAY_SHAPE = "an array with more than one dimension or a lower bound other than 1"


class Kind(enum.Enum):
    NATIVE = "native"
    TEXT = "text"
    UNSUPPORTED = "unsupported"


def classify(base_type: str, typtype: str) -> tuple[Kind, str]:
    """Kind and reason for a base (domain-resolved, array-element) type.

    ``typtype`` is ``pg_type.typtype``: b(ase), c(omposite), d(omain), e(num), p(seudo),
    r(ange), m(ultirange)."""
    if typtype == "e":
        return Kind.NATIVE, "enum values are stored as strings"
    if base_type in UNSUPPORTED_TYPES:
        return Kind.UNSUPPORTED, (
            f"{base_type} prints a catalog name looked up when the value is read, so the same "
            "stored OID could land as different text; cast it (e.g. a generated column of type "
            "oid or text) or exclude the column")
    if typtype == "p":
        return Kind.UNSUPPORTED, f"{base_type} is a pseudo-type"
    if base_type in NATIVE_TYPES:
        return Kind.NATIVE, ""
    return Kind.TEXT, f"{base_type} has no faithful Iceberg type: kept as PostgreSQL text"


class MappingError(ValueError):
    """A column cannot be mapped at all (unsupported type, unusable key column)."""


TEXT_COLUMNS_SETTING = "spec.source.tables[].textColumns"
EXCLUDE_COLUMNS_SETTING = "spec.source.tables[].excludeColumns"


class UnmappableValue(ValueError):
    """A value the column's Iceberg type cannot hold faithfully; ``index`` is its row in the
    converted array."""

    def __init__(self, reason: str, index: int, value: str | None = None, column: str = "") -> None:
        self.reason, self.index, self.value, self.column = reason, index, value, column
        shown = f" ({value!r})" if value is not None else ""
        super().__init__(f"column {column!r} holds a value{shown} {reason}; fix: keep the "
                         f"column as PostgreSQL text by listing it in {TEXT_COLUMNS_SETTING}, or "
                         f"leave it out with {EXCLUDE_COLUMNS_SETTING} (either takes effect when "
                         "the table is snapshotted again)")


class ReadMode(enum.Enum):
    NATIVE = "native"
    TEXT = "text"


@dataclass(frozen=True)
class PgType:
    """A column's type as the catalog describes it, domains resolved.

    ``name``/``typtype``/``typmod`` describe the base type, or for an array its element's base
    type; ``output`` is the (schema, function) that prints the column's own type."""

    name: str
    typtype: str = "b"
    typmod: int = -1
    array: bool = False
    delimiter: str = ","
    output: tuple[str, str] = ("pg_catalog", "textout")

    def __str__(self) -> str:
        modifier = ""
        if self.name == "numeric" and self.typmod >= 0:
            modifier = "({},{})".format(*numeric_precision_scale(self.typmod))
        return self.name + modifier + ("[]" if self.array else "")


def numeric_precision_scale(typmod: int) -> tuple[int, int]:
    """(precision, scale) of a ``numeric`` typmod; the scale is 11-bit signed (PostgreSQL 15)."""
    value = typmod - 4
    return (value >> 16) & 0xFFFF, ((value & 0x7FF) ^ 1024) - 1024


class _Unmappable(Exception):
    def __init__(self, reason: str, index: int) -> None:
        self.reason, self.index = reason, index


# vectorised helpers ---------------------------------------------------------------------------

def _first(mask: pa.Array) -> int | None:
    """Index of the first true value of a boolean array (nulls count as false)."""
    mask = pc.fill_null(mask, False)
    if not pc.any(mask).as_py():
        return None
    return int(pc.index(mask, True).as_py())


def _check_range(values: pa.Array, low: int, end: int) -> pa.Array:
    """Raise for the first value outside [low, end) (the ADBC driver wraps ±infinity around)."""
    as_int = values.view(pa.int64() if pa.types.is_timestamp(values.type) else pa.int32())
    if len(as_int) - as_int.null_count:
        bounds = pc.min_max(as_int)
        if bounds["min"].as_py() < low or bounds["max"].as_py() >= end:
            bad = _first(pc.or_(pc.less(as_int, low), pc.greater_equal(as_int, end)))
            assert bad is not None, "the bounds say a value is out of range"
            raise _Unmappable(OUT_OF_RANGE, bad)
    return values


def _strings(values: pa.Array | Sequence[str | None]) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(values, pa.string())
    return values.cast(pa.string())


def _per_value(values: pa.Array, parse: Callable[[str], object], arrow: pa.DataType) -> pa.Array:
    return pa.array([None if v is None else parse(v) for v in values.to_pylist()], arrow)


def _bytea(text: str) -> bytes:
    """bytea output: hex (``\\x…``, the default) or the escape format (``bytea_output=escape``)."""
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    out, i = bytearray(), 0
    while i < len(text):
        if text[i] != "\\":
            out += text[i].encode()
            i += 1
        elif text[i + 1] == "\\":
            out.append(0x5C)
            i += 2
        else:
            out.append(int(text[i + 1:i + 4], 8))
            i += 4
    return bytes(out)


def parse_array(text: str, delimiter: str = ",") -> list[str | None]:
    """Elements (text form, None for NULL) of a one-dimensional array in PostgreSQL's output form.

    Raises ``_Unmappable`` for arrays with a dimension decoration (lower bound other than 1) or
    nested braces (more than one dimension)."""
    if text.startswith("["):
        raise _Unmappable(ARRAY_SHAPE, 0)
    body = text[1:-1]
    if not body:
        return []
    if body.startswith("{"):
        raise _Unmappable(ARRAY_SHAPE, 0)
    if '"' not in body:
        return [None if item == "NULL" else item for item in body.split(delimiter)]
    items: list[str | None] = []
    i, end = 0, len(body)
    while True:
        if body[i] == '"':
            i += 1
            chars = []
            while body[i] != '"':
                if body[i] == "\\":
                    i += 1
                chars.append(body[i])
                i += 1
            items.append("".join(chars))
            i += 1
        else:
            j = body.find(delimiter, i)
            j = end if j < 0 else j
            items.append(None if body[i:j] == "NULL" else body[i:j])
            i = j
        if i >= end:
            return items
        i += 1  # the delimiter


# scalar codecs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Codec:
    """How one base type maps: Iceberg and Arrow types, the native read and the text parser."""

    iceberg: IcebergType
    arrow: pa.DataType
    from_text: Callable[[pa.Array], pa.Array]
    native_type: str | None = None  # SQL type the ADBC driver decodes faithfully; None: text read
    from_native: Callable[[pa.Array], pa.Array] = lambda values: values


def _cast_to(arrow: pa.DataType) -> Callable[[pa.Array], pa.Array]:
    return lambda values: values.cast(arrow)


def _date_text(values: pa.Array) -> pa.Array:
    bad = _first(pc.not_equal(pc.utf8_length(values), 10))
    if bad is not None:
        raise _Unmappable(OUT_OF_RANGE, bad)
    return values.cast(pa.date32())


def _timestamp_text(arrow: pa.DataType) -> Callable[[pa.Array], pa.Array]:
    def parse(values: pa.Array) -> pa.Array:
        bad = _first(pc.or_(pc.not_equal(pc.utf8_slice_codeunits(values, 4, 5), "-"),
                            pc.ends_with(values, " BC")))
        if bad is not None:
            raise _Unmappable(OUT_OF_RANGE, bad)
        return values.cast(arrow)
    return parse


def _uuid_text(values: pa.Array) -> pa.Array:
    storage = _per_value(values, lambda v: uuid.UUID(v).bytes, pa.binary(16))
    return pa.ExtensionArray.from_storage(pa.uuid(), storage)


STRING = _Codec(StringType(), pa.string(), _cast_to(pa.string()))
_TS_UTC = pa.timestamp("us", tz="UTC")
_CODECS: dict[str, _Codec] = {
    "int2": _Codec(IntegerType(), pa.int32(), _cast_to(pa.int32()), "int4"),
    "int4": _Codec(IntegerType(), pa.int32(), _cast_to(pa.int32()), "int4"),
    "int8": _Codec(LongType(), pa.int64(), _cast_to(pa.int64()), "int8"),
    "oid": _Codec(LongType(), pa.int64(), _cast_to(pa.int64()), "int8"),
    "float4": _Codec(FloatType(), pa.float32(), _cast_to(pa.float32()), "float4"),
    "float8": _Codec(DoubleType(), pa.float64(), _cast_to(pa.float64()), "float8"),
    "bool": _Codec(BooleanType(), pa.bool_(), lambda values: pc.equal(values, "t"), "bool"),
    "text": _Codec(StringType(), pa.string(), _cast_to(pa.string()), "text"),
    "varchar": _Codec(StringType(), pa.string(), _cast_to(pa.string()), "text"),
    "bytea": _Codec(BinaryType(), pa.binary(), lambda v: _per_value(v, _bytea, pa.binary()), "bytea"),
    "uuid": _Codec(UUIDType(), pa.uuid(), _uuid_text, "uuid"),
    "date": _Codec(DateType(), pa.date32(), _date_text, "date",
                   lambda values: _check_range(values, _DATE_MIN, _DATE_END)),
    "timestamp": _Codec(TimestampType(), pa.timestamp("us"), _timestamp_text(pa.timestamp("us")),
                        "timestamp", lambda values: _check_range(values, _TS_MIN, _TS_END)),
    "timestamptz": _Codec(TimestamptzType(), _TS_UTC, _timestamp_text(_TS_UTC), "timestamptz",
                          lambda values: _check_range(values, _TS_MIN, _TS_END)),
}


def _decimal_codec(precision: int, scale: int) -> _Codec:
    arrow = pa.decimal128(precision, scale)

    def from_text(values: pa.Array) -> pa.Array:
        bad = _first(pc.equal(values, "NaN"))
        if bad is not None:
            raise _Unmappable(NUMERIC_NAN, bad)
        bad = _first(pc.is_in(values, pa.array(["Infinity", "-Infinity"])))
        if bad is not None:
            raise _Unmappable(NUMERIC_INFINITY, bad)
        return values.cast(arrow)

    def from_native(values: pa.Array) -> pa.Array:
        """Scaled int8 → decimal128: the same integer, sign-extended to 128 bits."""
        words = np.frombuffer(values.buffers()[1], np.int64)
        wide = np.empty((len(words), 2), np.int64)
        wide[:, 0] = words
        wide[:, 1] = words >> 63
        return pa.Array.from_buffers(arrow, len(values), [values.buffers()[0], pa.py_buffer(wide)],
                                     null_count=values.null_count, offset=values.offset)

    native = "int8" if precision <= MAX_INT8_DECIMAL_PRECISION else None
    return _Codec(DecimalType(precision, scale), arrow, from_text, native, from_native)


def _codec(pg: PgType, as_text: bool) -> _Codec:
    if as_text:
        return STRING
    if pg.typtype == "b" and pg.name in _CODECS:
        return _CODECS[pg.name]
    if pg.name == "numeric" and pg.typmod >= 0:
        precision, scale = numeric_precision_scale(pg.typmod)
        precision = max(precision, scale) - min(scale, 0)
        if precision <= MAX_DECIMAL_PRECISION:
            return _decimal_codec(precision, max(scale, 0))
    return STRING


# column mappings -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ColumnMapping:
    """One source column: its Iceberg/Arrow types and how to read and convert its values."""

    name: str
    pg: PgType
    codec: _Codec
    read: ReadMode
    required: bool = False  # a key column: an Iceberg identifier field
    as_text: bool = False  # kept as its text form by request

    @property
    def is_list(self) -> bool:
        """An array kept as a list (a text column keeps the whole array's text form)."""
        return self.pg.array and not self.as_text

    def __reduce__(self) -> tuple:
        """Pickled as its inputs (Spark ships mappings to its tasks; codecs hold functions)."""
        return _rebuild, (self.name, self.pg, self.required, self.as_text)

    @property
    def arrow(self) -> pa.DataType:
        if self.is_list:
            return pa.list_(pa.field("element", self.codec.arrow))
        return self.codec.arrow

    def iceberg(self, element_id: int) -> IcebergType:
        """The Iceberg type (``element_id`` names a list's element field)."""
        if self.is_list:
            return ListType(element_id, self.codec.iceberg, element_required=False)
        return self.codec.iceberg

    def _scaled(self) -> int:
        return 10 ** self.codec.arrow.scale if pa.types.is_decimal(self.codec.arrow) else 1

    def select(self, column: sql.Composable) -> sql.Composable:
        """What the snapshot selects for this column."""
        if self.read is ReadMode.TEXT:
            schema, function = self.pg.output
            return sql.SQL("pg_catalog.textin({}({}))").format(sql.Identifier(schema, function),
                                                               column)
        native_type = self.codec.native_type
        assert native_type is not None, "read natively only with a native type (map_column)"
        cast = sql.SQL(native_type + ("[]" if self.is_list else ""))
        if pa.types.is_decimal(self.codec.arrow):
            return sql.SQL("CAST(NULLIF({}, 'NaN') * {} AS int8)").format(
                column, sql.Literal(self._scaled()))
        return sql.SQL("CAST({} AS {})").format(column, cast)

    def check(self, column: sql.Composable) -> sql.Composable | None:
        """A boolean the snapshot also selects for a native read: true marks an unmappable value
        the driver would otherwise decode wrongly or not see (NaN numerics, array shapes)."""
        if self.read is ReadMode.TEXT:
            return None
        if self.is_list:
            return sql.SQL("(array_ndims({0}) > 1 OR array_lower({0}, 1) <> 1)").format(column)
        if pa.types.is_decimal(self.codec.arrow):
            return sql.SQL("({} = 'NaN')").format(column)
        return None

    def check_reason(self) -> str:
        return ARRAY_SHAPE if self.is_list else NUMERIC_NAN

    def from_native(self, values: pa.Array) -> pa.Array:
        """Convert what the ADBC driver decoded from :meth:`select` (native reads only)."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        try:
            if not self.is_list:
                return self.codec.from_native(values)
            offsets = values.offsets
            try:
                elements = self.codec.from_native(values.values)
            except _Unmappable as e:
                raise _Unmappable(e.reason, _row_of(np.asarray(offsets), e.index)) from None
            return self._list(offsets, elements, values)
        except _Unmappable as e:
            raise UnmappableValue(e.reason, e.index, None, self.name) from None

    def from_text(self, values: pa.Array | Sequence[str | None]) -> pa.Array:
        """Convert text forms (None for NULL) — what pgoutput sends and a text read selects."""
        values = _strings(values)
        try:
            if not self.is_list:
                return self.codec.from_text(values)
            offsets, elements = [0], []
            for i, text in enumerate(values.to_pylist()):
                try:
                    elements += parse_array(text, self.pg.delimiter) if text is not None else []
                except _Unmappable as e:
                    raise _Unmappable(e.reason, i) from None
                offsets.append(len(elements))
            try:
                parsed = self.codec.from_text(pa.array(elements, pa.string()))
            except _Unmappable as e:
                raise _Unmappable(e.reason, _row_of(np.asarray(offsets), e.index)) from None
            return self._list(pa.array(offsets, pa.int32()), parsed, values)
        except _Unmappable as e:
            raise UnmappableValue(e.reason, e.index, values[e.index].as_py(), self.name) from None

    def _list(self, offsets: pa.Array, elements: pa.Array, lists: pa.Array) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, elements, type=self.arrow, mask=lists.is_null())


def _row_of(offsets: np.ndarray, element: int) -> int:
    """The list (row) holding flattened element number ``element``."""
    return int(np.searchsorted(offsets, element, side="right")) - 1


def map_column(name: str, pg: PgType, *, key: bool = False, as_text: bool = False) -> ColumnMapping:
    """The mapping of column ``name`` of type ``pg`` (``key``: an identifier field; ``as_text``:
    keep its text form whatever the type). Raises :class:`MappingError`."""
    kind, reason = classify(pg.name, pg.typtype)
    if kind is Kind.UNSUPPORTED:
        raise MappingError(f"column {name!r}: unsupported type {pg}: {reason}")
    if name == LSN_COLUMN:
        raise MappingError(f"column {name!r} has the name of lakeslot's own column; rename it or "
                           "exclude it")
    codec = _codec(pg, as_text)
    if key and ((pg.array and not as_text) or isinstance(codec.iceberg, (FloatType, DoubleType))):
        raise MappingError(f"key column {name!r} has type {pg}, which Iceberg does not accept in "
                           "an identifier field (arrays and floating point); choose other key "
                           "columns")
    native = codec.native_type is not None and not (pg.array and pa.types.is_decimal(codec.arrow))
    return ColumnMapping(name, pg, codec, ReadMode.NATIVE if native else ReadMode.TEXT, key, as_text)


def _rebuild(name: str, pg: PgType, key: bool, as_text: bool) -> ColumnMapping:
    return map_column(name, pg, key=key, as_text=as_text)


# the mirror table ------------------------------------------------------------------------------

def mirror_schema(columns: Sequence[ColumnMapping]) -> Schema:
    """The Iceberg schema of a mirror table: the columns in order (key columns required, the
    others optional), then ``_lakeslot_lsn long`` (required); identifier fields = key columns.
    Field ids are provisional: a catalog reassigns them, so writers take ids from the table."""
    fields, next_id = [], len(columns) + 2
    for field_id, column in enumerate(columns, start=1):
        fields.append(NestedField(field_id, column.name, column.iceberg(next_id),
                                  required=column.required))
        next_id += column.is_list
    fields.append(NestedField(len(columns) + 1, LSN_COLUMN, LongType(), required=True))
    return Schema(*fields, identifier_field_ids=[
        f.field_id for f, c in zip(fields, columns, strict=False) if c.required])


def arrow_schema(table_schema: Schema, columns: Sequence[ColumnMapping]) -> pa.Schema:
    """The Arrow schema to write Parquet for a table with ``table_schema`` (the catalog's, with its
    field ids), carrying ``PARQUET:field_id`` on every field as Iceberg requires."""

    def field_id(field_id: int) -> dict[str, str]:
        return {"PARQUET:field_id": str(field_id)}

    fields = []
    for column in columns:
        field = table_schema.find_field(column.name)
        arrow = column.arrow
        if column.is_list:
            list_type = field.field_type
            assert isinstance(list_type, ListType), f"{column.name} is a list in iceberg_schema"
            arrow = pa.list_(pa.field("element", column.codec.arrow, metadata=field_id(list_type.element_id)))
        fields.append(pa.field(column.name, arrow, nullable=not column.required,
                               metadata=field_id(field.field_id)))
    lsn = table_schema.find_field(LSN_COLUMN)
    fields.append(pa.field(LSN_COLUMN, pa.int64(), nullable=False, metadata=field_id(lsn.field_id)))
    return pa.schema(fields)
