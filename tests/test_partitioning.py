"""partitionBy's grammar and type rules (lakeslot.api.partitioning), pure: every accepted form,
every kind of bad entry with the message a user gets, and the API model refusing a bad entry."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from pyiceberg.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

from lakeslot.api.models import TableSpec
from lakeslot.api.partitioning import (
    PartitionField,
    PartitionSpecError,
    parse,
    parse_all,
    quote_column,
    type_problems,
)
from lakeslot.spark.partitions import field_name, spec_text


@pytest.mark.parametrize(("text", "expected"), [
    ("id", PartitionField("identity", "id")),
    ("  id  ", PartitionField("identity", "id")),
    ("identity(id)", PartitionField("identity", "id")),
    ("bucket(16, id)", PartitionField("bucket", "id", 16)),
    ("BUCKET( 16 ,id )", PartitionField("bucket", "id", 16)),
    ("truncate(4, code)", PartitionField("truncate", "code", 4)),
    ("years(created_at)", PartitionField("years", "created_at")),
    ("month(created_at)", PartitionField("months", "created_at")),
    ("Days(created_at)", PartitionField("days", "created_at")),
    ("hour(created_at)", PartitionField("hours", "created_at")),
    ('days("Created At")', PartitionField("days", "Created At")),
    ('bucket(8, "qu""ote")', PartitionField("bucket", 'qu"ote', 8)),
    ('"a,b(c)"', PartitionField("identity", "a,b(c)")),
    ("ñ", PartitionField("identity", "ñ")),
    ("CreatedAt", PartitionField("identity", "CreatedAt")),  # as stored: no case folding
    ("bucket(2147483647, id)", PartitionField("bucket", "id", 2**31 - 1)),
])
def test_every_form_parses(text, expected):
    assert parse(text) == expected
    assert parse(expected.canonical) == expected  # the canonical text reads back the same


@pytest.mark.parametrize(("text", "says"), [
    ("", "it is empty"),
    ("   ", "it is empty"),
    ("weeks(created_at)", "unknown transform 'weeks'"),
    ("bucket(id)", "bucket takes 2 arguments (N, column), got 1"),
    ("bucket(16, id, x)", "bucket takes 2 arguments (N, column), got 3"),
    ("days()", "days takes 1 argument (column), got 0"),
    ("days(a, b)", "days takes 1 argument (column), got 2"),
    ("truncate(0, code)", "truncate's W must be a whole number from 1 to 2147483647, got '0'"),
    ("bucket(-1, id)", "bucket's N must be a whole number from 1 to 2147483647, got '-1'"),
    ("bucket(1.5, id)", "bucket's N must be a whole number"),
    ("bucket(x, id)", "bucket's N must be a whole number"),
    ("bucket(2147483648, id)", "got '2147483648'"),
    ('bucket("16", id)', "bucket's N must be a whole number"),
    ("bucket(١٦, id)", "bucket's N must be a whole number"),  # Arabic-Indic digits
    ("days(created_at", "a closing parenthesis is missing"),
    ("days(created_at) x", "unexpected 'x' after the closing parenthesis"),
    ("created at", "unexpected 'at' after 'created'"),
    ('days("created_at)', "a double quote is not closed"),
    ('days("")', 'an empty quoted name ("")'),
    ("bucket(16,)", "an argument is missing"),
    ("bucket(, id)", "an argument is missing"),
    ('"days"(x)', "a transform name is not quoted"),
    (")", "unexpected ')' at the start"),
])
def test_a_bad_entry_says_what_is_wrong_and_the_accepted_forms(text, says):
    with pytest.raises(PartitionSpecError) as raised:
        parse(text)
    message = str(raised.value)
    assert says in message
    assert message.startswith(f"partitionBy entry {text!r}: ")
    assert "bucket(N, column), truncate(W, column), years(column)" in message


def test_the_spec_as_a_whole_refuses_duplicates_and_redundant_time_transforms():
    assert parse_all(["bucket(16, id)", "bucket(8, id)", "id", "days(ts)", "truncate(2, id)"])
    with pytest.raises(PartitionSpecError, match=r"lists bucket\(16, id\) twice"):
        parse_all(["bucket(16, id)", "BUCKET(16, id)"])
    with pytest.raises(PartitionSpecError, match=r"both days\(ts\) and hours\(ts\): Iceberg allows "
                       "one time transform per column"):
        parse_all(["days(ts)", "hour(ts)"])
    assert parse_all([]) == ()


def test_quoting_is_needed_only_where_a_bare_name_would_read_differently():
    assert quote_column("id") == "id"
    assert quote_column("ünï") == "ünï"
    assert quote_column("Mixed Case") == '"Mixed Case"'
    assert quote_column('qu"ote') == '"qu""ote"'
    assert quote_column("a,b") == '"a,b"'
    fields = parse_all(["bucket(4, \"Mixed Case\")", "days(ts)"])
    assert spec_text(fields) == 'bucket(4, "Mixed Case"), days(ts)'
    assert spec_text(()) == ""


COLUMNS = {"id": LongType(), "n": IntegerType(), "amount": DecimalType(12, 2), "code": StringType(),
           "day": DateType(), "ts": TimestampType(), "tstz": TimestamptzType(), "ok": BooleanType(),
           "ratio": DoubleType(), "u": UUIDType(), "tags": ListType(1, StringType())}


@pytest.mark.parametrize("entry", [
    "id", "bucket(16, id)", "bucket(4, code)", "bucket(4, amount)", "bucket(4, day)",
    "bucket(4, u)", "truncate(10, n)", "truncate(3, code)", "truncate(100, amount)", "years(day)",
    "months(ts)", "days(tstz)", "hours(ts)", "hours(tstz)", "ok",
])
def test_iceberg_decides_what_each_transform_takes(entry):
    assert type_problems(parse_all([entry]), COLUMNS) == []


@pytest.mark.parametrize(("entry", "says"), [
    ("days(code)", "column code is PostgreSQL text, mirrored as string, and days takes only date, "
                   "timestamp or timestamptz columns"),
    ("hours(day)", "hours takes only timestamp or timestamptz columns"),
    ("truncate(2, ts)", "truncate takes only integer, numeric, text/varchar or bytea columns"),
    ("bucket(4, ok)", "bucket takes only integer, numeric"),
    ("bucket(4, ratio)", "mirrored as double"),
    ("tags", "identity takes only any column that is not a list"),
])
def test_a_type_the_transform_cannot_take_is_named_with_the_fix(entry, says):
    [problem] = type_problems(parse_all([entry]), COLUMNS, source_types={"code": "text"})
    assert says in str(problem)
    assert str(problem).startswith(f"partitionBy {parse(entry)}: ")
    assert problem.fix == "choose another transform or column in partitionBy"


def test_a_missing_or_left_out_column_is_named():
    missing, excluded = type_problems(parse_all(["days(gone)", "bucket(2, secret)"]), COLUMNS,
                                      left_out={"secret": "excluded (excludeColumns)"})
    assert str(missing) == ("partitionBy days(gone): the table has no column gone (renamed or "
                            "dropped?) — fix: name an existing column in partitionBy, exactly as "
                            "PostgreSQL stores it")
    assert "column secret is excluded (excludeColumns), so the mirror has no such column" in str(excluded)


def test_partition_field_names_follow_iceberg_and_avoid_columns():
    bucket, day, ident = parse_all(["bucket(16, id)", "days(ts)", "id"])
    assert field_name(bucket, {"ts"}, set()) == "id_bucket_16"
    assert field_name(day, {"id", "ts_day"}, set()) == "ts_day_2"  # a column has that name
    assert field_name(day, {"id"}, {"ts_day"}) == "ts_day_2"
    assert field_name(ident, {"ts"}, set()) == "id"


def test_the_api_model_refuses_a_bad_entry_with_the_parsers_message():
    spec = TableSpec.model_validate({"name": "t", "partitionBy": ["bucket(16, id)", 'days("At")']})
    assert spec.partition_fields() == (PartitionField("bucket", "id", 16),
                                       PartitionField("days", "At"))
    assert TableSpec.model_validate({"name": "t"}).partition_fields() == ()
    with pytest.raises(ValidationError) as raised:
        TableSpec.model_validate({"name": "t", "partitionBy": ["weeks(ts)"]})
    assert "partitionBy entry 'weeks(ts)': unknown transform 'weeks'" in str(raised.value)
    with pytest.raises(ValidationError, match="twice"):
        TableSpec.model_validate({"name": "t", "partitionBy": ["id", "id"]})
