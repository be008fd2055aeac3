"""PostgreSQL's text form parsed in the JVM (:func:`lakeslot.apply.columns.spark_parse`) gives
what the shared Python parser (:mod:`lakeslot.mirror.typemap`, the reference) gives, value for value,
and flags every value the Python parser rejects; :func:`lakeslot.apply.merge.typed_source`
parses in the JVM when every column has an exact Spark cast, in Python otherwise or when a value
is flagged — the same typed rows either way, and the Python parser's definite error for a value
no mirror type holds. Real Spark (local mode), nothing mocked."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import DataType, StructField, StructType

from lakeslot.apply import columns, merge, spread
from lakeslot.errors import transient_in_spark
from lakeslot.mirror import typemap
from lakeslot.mirror.contract import TableState
from lakeslot.spark.tables import Tables
from tests.support.fixtures_spark import CATALOG

# Iceberg type → values as pgoutput sends them (TimeZone UTC, DateStyle ISO, extra_float_digits 3)
ACCEPTED: list[tuple[IcebergType, list[str | None]]] = [
    (IntegerType(), ["0", "-2147483648", "2147483647", "42", None]),
    (LongType(), ["-9223372036854775808", "9223372036854775807", "7", None]),
    (FloatType(), ["NaN", "Infinity", "-Infinity", "1e-45", "3.4028235e+38", "1.1754944e-38",
                   "-0", "0.1", "1.0000001", "123456.79", None]),
    (DoubleType(), ["NaN", "Infinity", "-Infinity", "5e-324", "1.7976931348623157e+308", "0.1",
                    "-0", "2.2250738585072014e-308", "0.30000000000000004", None]),
    (BooleanType(), ["t", "f", None]),
    (StringType(), ["", "a b", "é ✓ 日本", "'quoted' \"double\"", "  padded  ", "NULL", None]),
    (DecimalType(10, 2), ["0.00", "-12345678.90", "99999999.99", "0.01", "-0.01", None]),
    (DecimalType(38, 0), ["99999999999999999999999999999999999999", "-1", "0", None]),
    (DecimalType(38, 12), ["12345678901234567890123456.123456789012", "-0.000000000001", None]),
    (DecimalType(5, 5), ["0.12345", "-0.99999", None]),
    (DateType(), ["0001-01-01", "9999-12-31", "2024-02-29", "1970-01-01", None]),
    (TimestampType(), ["0001-01-01 00:00:00", "9999-12-31 23:59:59.999999",
                       "2024-02-29 12:34:56.5", "1969-12-31 23:59:59.000001", None]),
    (TimestamptzType(), ["0001-01-01 00:00:00+00", "2024-02-29 12:34:56.789+00",
                         "9999-12-31 23:59:59.999999+00", "1969-12-31 23:59:59.999999+00",
                         "2000-01-01 00:00:00.5+00", None,
                         # (the reader's sessions print +00; another offset takes the full cast)
                         "2024-06-01 12:00:00+05:30", "2024-06-01 12:00:00.25-08"]),
]
# values the Python parser rejects (a definite error of the table): the JVM must flag each
REJECTED: list[tuple[IcebergType, list[str]]] = [
    (DecimalType(10, 2), ["NaN", "Infinity", "-Infinity", "1.005", "123456789.00"]),
    (DateType(), ["infinity", "-infinity", "2024-01-01 BC", "10000-01-01"]),
    (TimestampType(), ["infinity", "-infinity", "2024-01-01 00:00:00 BC", "10000-01-01 00:00:00"]),
    (TimestamptzType(), ["infinity", "-infinity", "0001-12-31 23:00:00+00 BC",
                         "10000-01-01 00:00:00+00"]),
]


@pytest.fixture(scope="module")
def spark_types(spark) -> dict[str, DataType]:
    """Iceberg type → the Spark type of a column of that type in a real Iceberg table."""
    namespace = f"ns_{uuid.uuid4().hex[:12]}"
    spark.sql(f"CREATE NAMESPACE {CATALOG}.{namespace}")
    kinds = {str(t): t for t in [*(t for t, _ in ACCEPTED + REJECTED), *TYPES, BinaryType()]}
    mapped = [columns.parser(f"c{i}", t) for i, t in enumerate(kinds.values())]
    tables = Tables(spark, CATALOG, namespace)
    tables.create("types", typemap.mirror_schema(mapped), {}, 0)
    schema = spark.table(tables.qualified("types")).schema
    return {name: schema[f"c{i}"].dataType for i, name in enumerate(kinds)}


def _jvm(spark, spark_types, iceberg: IcebergType, values: list
         ) -> tuple[pa.Array, list[bool], list[str]]:
    """The values parsed in the JVM, whether each is rejected, and why."""
    parse = columns.spark_parse(spark_types[str(iceberg)], "t")
    assert parse is not None, f"{iceberg} has a Spark cast"
    frame = spark.createDataFrame([(v,) for v in values], "t string").selectExpr(
        f"{parse.value} AS v", f"{parse.rejected or 'false'} AS r", f"{parse.reason} AS why")
    table = pa.Table.from_batches(frame._collect_as_arrow())
    return table["v"].combine_chunks(), table["r"].to_pylist(), table["why"].to_pylist()


@pytest.mark.parametrize(("iceberg", "values"), ACCEPTED, ids=[str(t) for t, _ in ACCEPTED])
def test_the_jvm_parses_every_value_as_the_python_parser_does(spark, spark_types, iceberg,
                                                              values):
    expected = columns.parser("v", iceberg).from_text(values)
    got, rejected, _ = _jvm(spark, spark_types, iceberg, values)
    assert rejected == [False] * len(values)
    got = got.cast(expected.type)  # (the JVM's timestamps come in the session's zone)
    assert [repr(v) for v in got.to_pylist()] == [repr(v) for v in expected.to_pylist()]


@pytest.mark.parametrize(("iceberg", "values"), REJECTED, ids=[str(t) for t, _ in REJECTED])
def test_the_jvm_rejects_every_value_the_python_parser_rejects_for_the_same_reason(
        spark, spark_types, iceberg, values):
    parser = columns.parser("v", iceberg)
    _, rejected, reasons = _jvm(spark, spark_types, iceberg, values)
    assert rejected == [True] * len(values)
    for value, reason in zip(values, reasons, strict=True):
        with pytest.raises((typemap.UnmappableValue, pa.ArrowInvalid)) as raised:
            parser.from_text([value])
        if isinstance(raised.value, typemap.UnmappableValue):  # (else: digits a cast would round)
            assert reason == raised.value.reason, value


def test_types_without_an_exact_spark_cast_parse_in_python(spark_types):
    assert columns.spark_parse(spark_types[str(BinaryType())], "t") is None


# typed_source: both parsers, the same rows ------------------------------------------------------

NAMES = ["id", "amount", "at", "note", "day"]
TYPES: list[IcebergType] = [LongType(), DecimalType(10, 2), TimestamptzType(), StringType(),
                            DateType()]


def _state(types: list[IcebergType]) -> TableState:
    mapped = [columns.parser(n, t) for n, t in zip(NAMES, types, strict=True)]
    mapped[0] = typemap.map_column("id", mapped[0].pg, key=True)
    return TableState(5, typemap.mirror_schema(mapped), {})


def _spark_schema(spark_types, types: list[IcebergType]) -> StructType:
    return StructType([StructField(n, spark_types[str(t)])
                       for n, t in zip(NAMES, types, strict=True)])


def _reduced(spark, rows: list[tuple]):
    """REDUCED ``F`` rows: (values, flags, source, op, lsn)."""
    return spark.createDataFrame(
        [(0, "F", lsn, 0, op, values, flags, source, None)
         for values, flags, source, op, lsn in rows], from_arrow_schema(spread.REDUCED))


# (values, flags, source, op, lsn); flags: v value, n NULL, k kept from the mirror (the key in
# source), a absent (the column's default)
ROWS: list[tuple[list[str | None], str, list[str] | None, str, int]] = [
    (["1", "12.50", "2024-02-29 12:34:56.789+00", "x", "2024-02-29"], "vvvvv", None, "I", 10),
    (["2", None, None, "y", None], "vnkva", ["2"], "U", 11),
    (["3", None, None, None, None], "vnnnn", None, "D", 12),
]
EXPECTED = [
    ("1", "12.50", "2024-02-29 12:34:56.789", "x", "2024-02-29", False, None, "I", 10),
    ("2", None, None, "y", "1999-01-01", True, "2", "U", 11),
    ("3", None, None, None, None, False, None, "D", 12),
]


def _typed(spark, spark_types, types: list[IcebergType], rows: list[tuple]
           ) -> tuple[list[tuple], bool]:
    """The view typed_source registers, as text (timestamps in UTC), and whether it was
    parsed in the JVM (its plan runs no Python)."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    source = merge.typed_source(_reduced(spark, rows), "public.t", _state(types),
                                _spark_schema(spark_types, types), [2], NAMES, {},
                                {"day": "1999-01-01"})
    try:
        frame = spark.table(source.view)
        shown = frame.select(*[F.col(c).cast("string") for c in
                               ["c0", "c1", "c2", "c3", "c4", "k2", "s0", "op", "lsn"]])
        plan = frame._jdf.queryExecution().executedPlan().toString()
        return [tuple(r) for r in shown.orderBy("lsn").collect()], "MapInArrow" not in plan
    finally:
        merge.drop(spark, source)


def _text(rows: list[tuple]) -> list[tuple]:
    return [tuple(None if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                  for v in row) for row in rows]


def test_typed_source_parses_in_the_jvm_when_every_column_casts_exactly(spark, spark_types):
    rows, jvm = _typed(spark, spark_types, TYPES, ROWS)
    assert jvm
    assert rows == _text(EXPECTED)


def test_a_column_without_a_spark_cast_parses_the_table_in_python_with_the_same_rows(
        spark, spark_types):
    types = [*TYPES[:3], BinaryType(), TYPES[4]]  # note as bytea: Python parses the table
    rows = [([*values[:3], None if values[3] is None else "\\x" + values[3].encode().hex(),
              values[4]], flags, source, op, lsn) for values, flags, source, op, lsn in ROWS]
    got, jvm = _typed(spark, spark_types, types, rows)
    assert not jvm
    assert got == _text(EXPECTED)  # (the bytes of "x", shown as a string, are "x")


@pytest.mark.parametrize("value", ["NaN", "-Infinity"])
@pytest.mark.parametrize("jvm", [True, False], ids=["jvm", "python"])
def test_a_value_no_mirror_type_holds_is_the_python_parsers_definite_error(spark, spark_types,
                                                                           jvm, value):
    types = TYPES if jvm else [*TYPES[:3], BinaryType(), TYPES[4]]
    bad = [(["4", value, None, None, None], "vvnnn", None, "I", 13)]
    with pytest.raises(typemap.UnmappableValue) as python:
        columns.parser("amount", DecimalType(10, 2)).from_text([value])
    with pytest.raises(transient_in_spark()) as raised:  # (as Spark delivers an executor's error)
        _typed(spark, spark_types, types, bad)
    assert str(merge.definite_error(raised.value)) == f"public.t: {python.value}"
