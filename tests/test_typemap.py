"""The type mapping: every covered PostgreSQL type, both read paths, and the rules for values with
no faithful mapping.

Pure tests check the mapping table, the text parser (the apply job's path) and the Iceberg/Arrow
schemas. The PostgreSQL tests (15 and 18) copy a table holding every covered type through the
real snapshot follower (ADBC binary COPY, native reads) and parse the same rows' text forms (what
pgoutput sends): both must give exactly the expected values. Unmappable values must fail with the
column and the row's key on both paths, and be kept verbatim as text when the column is a text
column.
"""

from __future__ import annotations

import datetime as dt
import math
import pickle
import uuid
from decimal import Decimal

import pyarrow as pa
import pytest
from psycopg import sql
from pyiceberg.types import DecimalType, ListType, StringType, TimestampType, TimestamptzType

from lakeslot.api.naming import TableName
from lakeslot.mirror import typemap
from lakeslot.mirror.contract import LSN_COLUMN
from lakeslot.snapshot.plan import TableRequest
from lakeslot.source.columns import ColumnOptions
from lakeslot.spark import row_delta
from tests.support.snapshot_helpers import copy_without_spark, read_files

UTC = dt.UTC
T = TableName("public", "every_type")
U = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")

# column, type, SQL literal of row 1 (row 2 is all NULL), expected value of row 1
COLUMNS = [
    ("i2", "int2", "-32768", -32768),
    ("i4", "int4", "2147483647", 2147483647),
    ("i8", "int8", "-9223372036854775808", -9223372036854775808),
    ("o", "oid", "4000000000", 4000000000),
    ("n", "numeric(10,2)", "-12345678.9", Decimal("-12345678.90")),
    ("n30", "numeric(30,5)", "1234567890123456789012345.12345",
     Decimal("1234567890123456789012345.12345")),
    ("nneg", "numeric(3,-2)", "12345", Decimal("12300")),
    ("nu", "numeric", "'NaN'", "NaN"),
    ("nu2", "numeric", "0.000000000000000000000000000000000000000000001",
     "0.000000000000000000000000000000000000000000001"),
    ("f4", "float4", "'-Infinity'", -math.inf),
    ("f8", "float8", "'NaN'", math.nan),
    ("f8b", "float8", "0.1", 0.1),
    ("b", "bool", "true", True),
    ("t", "text", "E'multi\\nline \"quoted\" ünïcode'", 'multi\nline "quoted" ünïcode'),
    ("vc", "varchar(5)", "'ab'", "ab"),
    ("bp", "char(4)", "'ab'", "ab  "),
    ("nm", "name", "'a name'", "a name"),
    ("ch", '"char"', "'x'", "x"),
    ("by", "bytea", "'\\x00ff5c'", b"\x00\xff\\"),
    ("u", "uuid", f"'{U}'", U),
    ("d", "date", "'2024-02-29'", dt.date(2024, 2, 29)),
    ("d1", "date", "'0001-01-01'", dt.date(1, 1, 1)),
    ("tm", "time", "'24:00:00'", "24:00:00"),
    ("ttz", "timetz", "'12:00:00.5+05:30'", "12:00:00.5+05:30"),
    # timestamp without time zone: read back as the naive value it is
    ("ts", "timestamp", "'9999-12-31 23:59:59.999999'", dt.datetime(9999, 12, 31, 23, 59, 59, 999999)),  # noqa: DTZ001
    ("tz", "timestamptz", "'2024-01-02 03:04:05.123456+02'",
     dt.datetime(2024, 1, 2, 1, 4, 5, 123456, tzinfo=UTC)),
    ("iv", "interval", "'1 year 2 mons -3 days 04:05:06.5'", "1 year 2 mons -3 days +04:05:06.5"),
    ("j", "json", """'{"a":  1}'""", '{"a":  1}'),
    ("jb", "jsonb", """'{"b": [1,2], "a": null}'""", '{"a": null, "b": [1, 2]}'),
    ("e", "mood", "'ok'", "ok"),
    ("ip", "inet", "'192.168.1.1'", "192.168.1.1"),
    ("cidr", "cidr", "'10.0.0.0/8'", "10.0.0.0/8"),
    ("mac", "macaddr", "'08:00:2b:01:02:03'", "08:00:2b:01:02:03"),
    ("mac8", "macaddr8", "'08:00:2b:01:02:03:04:05'", "08:00:2b:01:02:03:04:05"),
    ("mo", "money", "12.34", "$12.34"),
    ("dom", "price", "7.5", Decimal("7.50")),
    ("rng", "int4range", "'[1,5)'", "[1,5)"),
    ("comp", "pair", "ROW(1, 'x y')", '(1,"x y")'),
    ("ia", "int4[]", "'{1,NULL,3}'", [1, None, 3]),
    ("ia0", "int4[]", "'{}'", []),
    ("i2a", "int2[]", "'{7}'", [7]),
    ("ta", "text[]", """ARRAY['a b', NULL, 'NULL', 'x"y', 'c,d']""", ["a b", None, "NULL", 'x"y', "c,d"]),
    ("na", "numeric(5,2)[]", "'{1.5,NULL}'", [Decimal("1.50"), None]),
    ("da", "date[]", "'{2020-01-01,NULL}'", [dt.date(2020, 1, 1), None]),
    ("tza", "timestamptz[]", "'{\"2020-01-01 00:00:00+00\"}'", [dt.datetime(2020, 1, 1, tzinfo=UTC)]),
    ("ua", "uuid[]", f"'{{{U}}}'", [U]),
    ("ea", "mood[]", "'{sad,ok}'", ["sad", "ok"]),
    ("ipa", "inet[]", "'{192.168.1.1,::1}'", ["192.168.1.1", "::1"]),
    ("bpa", "char(2)[]", "'{a,NULL}'", ["a ", None]),
    ("boxa", "box[]", "'{(1,1),(0,0);(2,2),(1,1)}'", ["(1,1),(0,0)", "(2,2),(1,1)"]),
    ("doma", "price[]", "'{1.25}'", [Decimal("1.25")]),
]
XML = ("x", "xml", "'<a>b</a>'", "<a>b</a>")


def _equal(actual, expected) -> bool:
    if isinstance(expected, float) and math.isnan(expected):
        return isinstance(actual, float) and math.isnan(actual)
    return actual == expected and type(actual) is type(expected)


def _create(conn, columns) -> None:
    _create_types(conn)
    _create_table(conn, columns)


def _create_types(conn) -> None:
    conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    conn.execute("CREATE DOMAIN price AS numeric(6,2)")
    conn.execute("CREATE TYPE pair AS (a int, b text)")


def _create_table(conn, columns, table: TableName = T) -> None:
    """``table`` with ``columns``: row 1 holds their literals, row 2 NULLs."""
    conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, {})").format(table.sql(), sql.SQL(", ").join(
        sql.SQL("{} " + type_).format(sql.Identifier(name)) for name, type_, _, _ in columns)))
    names = sql.SQL(", ").join(sql.Identifier(c[0]) for c in columns)
    conn.execute(sql.SQL("INSERT INTO {} (id, {}) VALUES (1, {}), (2, {})").format(
        table.sql(), names, sql.SQL(", ").join(sql.SQL(c[2]) for c in columns),
        sql.SQL(", ").join(sql.SQL("NULL") for _ in columns)))


def _columns(pgdb) -> list[tuple]:
    with pgdb.connect() as conn:
        try:
            conn.execute("SELECT '<a/>'::xml")
            return [*COLUMNS, XML]
        except Exception:  # noqa: BLE001 - a server built without libxml (the embedded 18)
            return COLUMNS


def _text_forms(pgdb, table_plan) -> dict[str, list]:
    """Each column's text form (the type's output function, what pgoutput sends), by id."""
    items = sql.SQL(", ").join(
        sql.SQL("pg_catalog.textin({}({}))").format(sql.Identifier(*m.pg.output), sql.Identifier(m.name))
        for m in table_plan.columns)
    with pgdb.connect() as conn:
        rows = conn.execute(sql.SQL("SELECT {} FROM {} ORDER BY id").format(items, T.sql())).fetchall()
    return {m.name: [row[i] for row in rows] for i, m in enumerate(table_plan.columns)}


def test_every_type_round_trips_through_both_read_paths(pgdb, tmp_path):
    columns = _columns(pgdb)
    with pgdb.connect() as conn:
        _create(conn, columns)
    table_plan, results = copy_without_spark(pgdb, TableRequest(T, "t"), tmp_path)
    copied = read_files(results).sort_by("id")
    texts = _text_forms(pgdb, table_plan)
    mappings = {m.name: m for m in table_plan.columns}
    for name, type_, _literal, expected in columns:
        mapping = mappings[name]
        snapshot_values = copied.column(name).to_pylist()
        text_values = mapping.from_text(texts[name]).to_pylist()
        assert _equal(snapshot_values[0], expected), (name, type_, snapshot_values[0], expected)
        assert snapshot_values[1] is None, (name, snapshot_values[1])
        assert len(text_values) == 2 and text_values[1] is None
        assert _equal(text_values[0], expected), (name, type_, "text path", text_values[0])
        assert copied.schema.field(name).type == mapping.arrow, name
    assert set(copied.column("_lakeslot_lsn").to_pylist()) == {results and copied.column(
        "_lakeslot_lsn")[0].as_py()}


def test_native_reads_cover_the_bulk_types(pgdb, tmp_path):
    """Which columns the snapshot decodes natively (fast) and which through their text form."""
    with pgdb.connect() as conn:
        _create(conn, COLUMNS)
    table_plan, _ = copy_without_spark(pgdb, TableRequest(T, "t"), tmp_path)
    native = {m.name for m in table_plan.columns if m.read is typemap.ReadMode.NATIVE}
    assert native == {"id", "i2", "i4", "i8", "o", "n", "nneg", "f4", "f8", "f8b", "b", "t", "vc", "by",
                      "u", "d", "d1", "ts", "tz", "dom", "ia", "ia0", "i2a", "ta", "da", "tza", "ua"}


UNMAPPABLE = [  # type, SQL literal, reason
    ("date", "'infinity'", typemap.OUT_OF_RANGE),
    ("date", "'0044-03-15 BC'", typemap.OUT_OF_RANGE),
    ("timestamp", "'10000-01-01 00:00'", typemap.OUT_OF_RANGE),
    ("timestamp", "'-infinity'", typemap.OUT_OF_RANGE),
    ("timestamptz", "'infinity'", typemap.OUT_OF_RANGE),
    ("timestamptz", "'0001-01-01 00:00:00+00 BC'", typemap.OUT_OF_RANGE),
    ("numeric(10,2)", "'NaN'", typemap.NUMERIC_NAN),
    ("numeric(30,2)", "'NaN'", typemap.NUMERIC_NAN),
    ("int4[]", "'{{1,2},{3,4}}'", typemap.ARRAY_SHAPE),
    ("int4[]", "'[0:1]={5,6}'", typemap.ARRAY_SHAPE),
    ("date[]", "'{2020-01-01,infinity}'", typemap.OUT_OF_RANGE),
    ("numeric(5,2)[]", "'{1,NaN}'", typemap.NUMERIC_NAN),
]


@pytest.mark.parametrize(("type_", "literal", "reason"), UNMAPPABLE, ids=[
    f"{t}={v}" for t, v, _ in UNMAPPABLE])
def test_unmappable_values_fail_with_column_and_key_and_are_kept_as_text_on_request(
        pgdb, tmp_path, type_, literal, reason):
    with pgdb.connect() as conn:
        conn.execute(f"CREATE TABLE {T.name} (id int PRIMARY KEY, v {type_}, w {type_})")
        conn.execute(f"INSERT INTO {T.name} VALUES (1, NULL, NULL), (42, {literal}, {literal})")
        text = conn.execute(f"SELECT v::text FROM {T.name} WHERE id = 42").fetchone()[0]
    table_plan, results = copy_without_spark(pgdb, TableRequest(T, "t", ColumnOptions(text_columns=("w",))),
                                             tmp_path / "a")
    (error,) = [r.error for r in results]
    assert error is not None and "'v'" in error and "(id)=(42)" in error and reason in error
    assert "spec.source.tables[].textColumns" in error  # the way out, named as in the spec

    mapping = next(m for m in table_plan.columns if m.name == "v")
    with pytest.raises(typemap.UnmappableValue) as raised:
        mapping.from_text([None, text])
    assert raised.value.index == 1 and raised.value.reason == reason and raised.value.value == text

    _, results = copy_without_spark(
        pgdb, TableRequest(T, "t", ColumnOptions(text_columns=("v", "w"))), tmp_path / "b")
    copied = read_files(results).sort_by("id")
    assert copied.column("v").to_pylist() == [None, text] == copied.column("w").to_pylist()


# pure ---------------------------------------------------------------------------------------


def test_classify_is_unchanged_for_preflight():
    assert typemap.classify("int4", "b")[0] is typemap.Kind.NATIVE
    assert typemap.classify("mood", "e")[0] is typemap.Kind.NATIVE
    assert typemap.classify("int4range", "r")[0] is typemap.Kind.TEXT
    assert typemap.classify("regclass", "b")[0] is typemap.Kind.UNSUPPORTED
    assert typemap.classify("anyelement", "p")[0] is typemap.Kind.UNSUPPORTED


@pytest.mark.parametrize(("typmod_of", "expected"), [
    ((10, 2), (10, 2)), ((38, 0), (38, 0)), ((3, -2), (3, -2)), ((3, 5), (3, 5)), ((1000, 1000), (1000, 1000)),
])
def test_numeric_typmod(typmod_of, expected):
    precision, scale = typmod_of
    assert typemap.numeric_precision_scale(((precision << 16) | (scale & 0x7FF)) + 4) == expected


def _numeric(precision: int, scale: int) -> typemap.PgType:
    return typemap.PgType("numeric", typmod=((precision << 16) | (scale & 0x7FF)) + 4)


@pytest.mark.parametrize(("pg", "iceberg"), [
    (_numeric(10, 2), DecimalType(10, 2)),
    (_numeric(3, -2), DecimalType(5, 0)),
    (_numeric(3, 5), DecimalType(5, 5)),
    (_numeric(38, 10), DecimalType(38, 10)),
    (_numeric(39, 2), StringType()),
    (typemap.PgType("numeric"), StringType()),
    (typemap.PgType("timestamp"), TimestampType()),
    (typemap.PgType("timestamptz"), TimestamptzType()),
    (typemap.PgType("time"), StringType()),
    (typemap.PgType("hstore"), StringType()),
    (typemap.PgType("public.uuid"), StringType()),  # a user type that only shares the name
])
def test_iceberg_types(pg, iceberg):
    assert typemap.map_column("c", pg).iceberg(99) == iceberg


def test_unsupported_and_bad_key_columns_are_mapping_errors():
    with pytest.raises(typemap.MappingError, match="unsupported type regclass"):
        typemap.map_column("c", typemap.PgType("regclass"))
    with pytest.raises(typemap.MappingError, match="identifier field"):
        typemap.map_column("c", typemap.PgType("float8"), key=True)
    with pytest.raises(typemap.MappingError, match="identifier field"):
        typemap.map_column("c", typemap.PgType("int4", array=True), key=True)
    with pytest.raises(typemap.MappingError, match="lakeslot's own column"):
        typemap.map_column(LSN_COLUMN, typemap.PgType("int8"))
    # a text column is the way out for a value, never for an unsupported type
    with pytest.raises(typemap.MappingError):
        typemap.map_column("c", typemap.PgType("regtype"), as_text=True)


def test_parse_array_text_forms():
    assert typemap.parse_array("{}") == []
    assert typemap.parse_array("{1,NULL,3}") == ["1", None, "3"]
    assert typemap.parse_array('{"a b",NULL,"NULL","x\\"y","back\\\\slash",""}') == [
        "a b", None, "NULL", 'x"y', "back\\slash", ""]
    assert typemap.parse_array("{(1,1),(0,0);(2,2),(1,1)}", ";") == ["(1,1),(0,0)", "(2,2),(1,1)"]


def test_text_path_parses_what_pgoutput_sends():
    def parse(pg, values, **kw):
        return typemap.map_column("c", pg, **kw).from_text(values).to_pylist()

    assert parse(typemap.PgType("bool"), ["t", "f", None]) == [True, False, None]
    assert parse(typemap.PgType("bytea"), ["\\x00ff", "a\\\\b\\000"]) == [b"\x00\xff", b"a\\b\x00"]
    assert parse(typemap.PgType("float4"), ["NaN", "Infinity", "1.5"])[1:] == [math.inf, 1.5]
    assert parse(typemap.PgType("timestamptz"), ["2024-01-02 03:04:05.5+00", "2024-01-02 03:04:05-03:30"]) == [
        dt.datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=UTC), dt.datetime(2024, 1, 2, 6, 34, 5, tzinfo=UTC)]
    assert parse(typemap.PgType("int4", array=True), ["{1,2}", None, "{}"]) == [[1, 2], None, []]
    assert parse(typemap.PgType("date"), ["infinity"], as_text=True) == ["infinity"]
    with pytest.raises(typemap.UnmappableValue) as raised:
        parse(typemap.PgType("date", array=True), ["{2020-01-01}", "{2020-01-01,infinity}"])
    assert raised.value.index == 1 and raised.value.value == "{2020-01-01,infinity}"


def test_mirror_schema_and_parquet_field_ids():
    columns = [typemap.map_column("id", typemap.PgType("int8"), key=True),
               typemap.map_column("tags", typemap.PgType("text", array=True)),
               typemap.map_column("Mixed \"Case\"", _numeric(10, 2))]
    schema = typemap.mirror_schema(columns)
    assert [f.name for f in schema.fields] == ["id", "tags", 'Mixed "Case"', "_lakeslot_lsn"]
    assert [f.required for f in schema.fields] == [True, False, False, True]
    assert schema.identifier_field_names() == {"id"}
    tags = schema.find_field("tags").field_type
    assert isinstance(tags, ListType) and tags.element_id not in {f.field_id for f in schema.fields}

    arrow = typemap.arrow_schema(schema, columns)
    assert arrow.names == ["id", "tags", 'Mixed "Case"', "_lakeslot_lsn"]
    assert arrow.field("tags").metadata[b"PARQUET:field_id"] == str(schema.find_field("tags").field_id).encode()
    assert arrow.field("tags").type.value_field.metadata[b"PARQUET:field_id"] == str(tags.element_id).encode()
    assert not arrow.field("id").nullable and arrow.field("Mixed \"Case\"").type == pa.decimal128(10, 2)


def test_mappings_survive_pickling():
    """Spark ships mappings to its tasks with pickle."""
    mapping = typemap.map_column("d", typemap.PgType("date", array=True), as_text=False)
    again = pickle.loads(pickle.dumps(mapping))
    assert again.arrow == mapping.arrow and again.read is mapping.read
    assert again.from_text(["{2020-01-01}"]).to_pylist() == [[dt.date(2020, 1, 1)]]


# Mapped types whose tables the driver's row delta does not write (lakeslot.spark.row_delta.TYPES):
# such a table is applied through Spark's MERGE, slower per pass. A type mapped later lands
# here or in TYPES, knowingly (docs/development.md, "Adding a type mapping").
THROUGH_MERGE = {"uuid": "the driver's writer does not write Iceberg's uuid (fixed[16]) yet"}


@pytest.mark.parametrize("name", sorted(typemap._CODECS))
def test_the_driver_writes_every_mapped_type_or_it_is_known_to_go_through_merge(name):
    for pg in (typemap.PgType(name), typemap.PgType(name, array=True)):
        iceberg = typemap.map_column("c", pg).codec.iceberg
        assert row_delta.writes(iceberg) == (name not in THROUGH_MERGE), (pg, iceberg)
    numeric = typemap.map_column("c", typemap.PgType("numeric", typmod=(12 << 16 | 2) + 4)).codec.iceberg
    assert isinstance(numeric, DecimalType) and row_delta.writes(numeric)
