"""The reduced changes of one table as a Spark source, and the SQL that applies them.

The source has positional column names (``c0``… the mirror's data columns in order, ``k<i>``:
the value of column i is the mirror's :data:`~lakeslot.apply.changes.KEEP`, ``s<j>``: the key
of the mirror row to keep it from, ``op``, ``lsn``, ``seq``), so no source identifier ever
appears in a generated name; the target's identifiers are backquoted and escaped.

Invariants:

- Values are parsed with the mirror column's own type (:func:`lakeslot.apply.columns.parser`);
  an unmappable value is a definite error of the table (never altered).
- Unchanged TOAST values are resolved in Spark by a left join with the mirror as it is before
  the MERGE (``CASE WHEN k<i> THEN m.<col> ELSE s.c<i> END``); :func:`missing_sql` counts the rows
  whose mirror row is absent, which the caller turns into a definite error before anything is
  written.
- Op I marks a key the batch inserted without deleting it first (:func:`duplicates_sql` finds
  one the mirror already holds: keys PostgreSQL does not keep unique); the MERGE treats it as U.
- The MERGE deletes (op D), updates every column (a column absent from the source description
  becomes NULL) and inserts; ``_lakeslot_lsn`` is the commit LSN of the key's last change. After
  a TRUNCATE, ``WHEN NOT MATCHED BY SOURCE THEN DELETE`` empties the rest of the table in the
  same commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from lakeslot import typemap
from lakeslot.apply import columns
from lakeslot.apply.changes import KEEP, Image, TableError
from lakeslot.mirror.catalog import TableState, quote
from lakeslot.mirror.contract import LSN_COLUMN, OP_COLUMN, SEQ_COLUMN


@dataclass(frozen=True)
class Record:
    """One source row: ``image`` None is a delete of ``key``."""

    key: tuple
    image: Image | None
    lsn: int
    op: str
    seq: int = 0


@dataclass(frozen=True)
class Source:
    view: str
    names: list[str]  # the mirror's data columns, in order (c<i> is names[i])
    keeps: list[int]  # columns with a k<i> flag
    key: list[int]  # positions of the key columns
    resolves: bool  # some row takes values from the mirror


def _has_uuid(type_: pa.DataType) -> bool:
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return _has_uuid(type_.value_type)
    return isinstance(type_, pa.BaseExtensionType) and type_.extension_name == "arrow.uuid"


def _uuid_text(value):
    if isinstance(value, list):
        return [_uuid_text(v) for v in value]
    return None if value is None else str(value)


def _python(values: pa.Array) -> list:
    """Python values for Spark, which takes an Iceberg uuid (also inside arrays) as a string."""
    if _has_uuid(values.type):
        return [_uuid_text(v) for v in values.to_pylist()]
    return values.to_pylist()


def _parse(table: str, parser: typemap.ColumnMapping, texts: list) -> list:
    try:
        return _python(parser.from_text(texts))
    except typemap.UnmappableValue as e:
        raise TableError(f"{table}: {e}") from None


def create_source(spark, table: str, state: TableState, spark_schema: StructType,
                  records: Sequence[Record], delimiters: Mapping[str, str],
                  absent: Mapping[str, str] | None = None) -> Source:
    """Register ``records`` as a temporary view shaped for :func:`resolved_sql`
    (``delimiters``: each array column's element delimiter in the source's text form;
    ``absent``: the value, as text, of a column an image does not carry — its change came before
    the column was added, so the row holds the column's default — else NULL)."""
    data = state.data_columns()
    names = list(data)
    key = [names.index(k) for k in state.key]
    parsers = [columns.parser(n, t, delimiters.get(n, ",")) for n, t in data.items()]
    keeps = [i for i, name in enumerate(names)
             if any(r.image is not None and r.image.values.get(name) is KEEP for r in records)]

    def text(record: Record, i: int):
        if record.image is None:
            return record.key[key.index(i)] if i in key else None
        if names[i] not in record.image.values:
            return (absent or {}).get(names[i])
        value = record.image.values[names[i]]
        return None if value is KEEP else value

    parsed = [_parse(table, parsers[i], [text(r, i) for r in records]) for i in range(len(names))]
    sources = [_parse(table, parsers[i],
                      [r.image.source[j] if r.image is not None and r.image.source is not None else None
                       for r in records]) for j, i in enumerate(key)]
    flags = [[r.image is not None and r.image.values.get(names[i]) is KEEP for r in records]
             for i in keeps]
    fields = spark_schema.fields
    by_name = {f.name: f.dataType for f in fields}
    schema = StructType(
        [StructField(f"c{i}", by_name[n]) for i, n in enumerate(names)]
        + [StructField(f"k{i}", BooleanType()) for i in keeps]
        + [StructField(f"s{j}", by_name[names[i]]) for j, i in enumerate(key)]
        + [StructField("op", StringType()), StructField("lsn", LongType()),
           StructField("seq", LongType())])
    rows = list(zip(*parsed, *flags, *sources, [r.op for r in records], [r.lsn for r in records],
                    [r.seq for r in records], strict=True))
    view = f"lakeslot_apply_{uuid.uuid4().hex}"
    spark.createDataFrame(rows, schema).createOrReplaceTempView(view)
    return Source(view, names, keeps, key, any(r.image is not None and r.image.keeps
                                               for r in records))


def _join_condition(source: Source, left: str) -> str:
    return " AND ".join(f"m.{quote(source.names[i])} = {left}.s{j}"
                        for j, i in enumerate(source.key))


def missing_sql(source: Source, target: str) -> str:
    """The keys whose unchanged TOAST values must come from a mirror row that does not exist."""
    first = ", ".join(f"s.s{j}" for j in range(len(source.key)))
    return (f"SELECT {first} FROM {source.view} s LEFT ANTI JOIN {target} m "
            f"ON {_join_condition(source, 's')} WHERE s.s0 IS NOT NULL LIMIT 1")


def duplicates_sql(source: Source, target: str) -> str:
    """A key the batch inserts (op I: not deleted first) that the mirror already holds."""
    keys = ", ".join(f"s.c{i}" for i in source.key)
    on = " AND ".join(f"m.{quote(source.names[i])} = s.c{i}" for i in source.key)
    return (f"SELECT {keys} FROM {source.view} s LEFT SEMI JOIN {target} m ON {on} "
            "WHERE s.op = 'I' LIMIT 1")


def resolved_sql(source: Source, target: str) -> str:
    """The source with every kept value taken from the mirror."""
    if not source.resolves:
        return f"SELECT * FROM {source.view}"
    values = [f"CASE WHEN s.k{i} THEN m.{quote(n)} ELSE s.c{i} END AS c{i}" if i in source.keeps
              else f"s.c{i}" for i, n in enumerate(source.names)]
    return (f"SELECT {', '.join(values)}, s.op, s.lsn, s.seq FROM {source.view} s "
            f"LEFT JOIN {target} m ON {_join_condition(source, 's')}")


def merge_sql(source: Source, target: str, truncated: bool) -> str:
    on = " AND ".join(f"t.{quote(source.names[i])} = s.c{i}" for i in source.key)
    sets = ", ".join([f"t.{quote(n)} = s.c{i}" for i, n in enumerate(source.names)]
                     + [f"t.{quote(LSN_COLUMN)} = s.lsn"])
    targets = ", ".join([quote(n) for n in source.names] + [quote(LSN_COLUMN)])
    values = ", ".join([f"s.c{i}" for i in range(len(source.names))] + ["s.lsn"])
    statement = (f"MERGE INTO {target} t USING ({resolved_sql(source, target)}) s ON {on} "
                 "WHEN MATCHED AND s.op = 'D' THEN DELETE "
                 f"WHEN MATCHED THEN UPDATE SET {sets} "
                 f"WHEN NOT MATCHED AND s.op <> 'D' THEN INSERT ({targets}) VALUES ({values})")
    if truncated:
        statement += " WHEN NOT MATCHED BY SOURCE THEN DELETE"
    return statement


def append_sql(source: Source, mirror: str, changelog: str) -> str:
    """Append every source row to the changelog (values resolved against the mirror)."""
    targets = ", ".join([quote(n) for n in source.names]
                        + [quote(LSN_COLUMN), quote(OP_COLUMN), quote(SEQ_COLUMN)])
    values = ", ".join([f"c{i}" for i in range(len(source.names))] + ["lsn", "op", "seq"])
    return (f"INSERT INTO {changelog} ({targets}) SELECT {values} "
            f"FROM ({resolved_sql(source, mirror)})")


def backfill_sql(spark, state: TableState, spark_schema: StructType, qualified: str,
                 values: Mapping[str, str]) -> tuple[str, str]:
    """A MERGE giving every row of ``qualified`` the text ``values`` of some columns (parsed by
    the columns' own types; a one-row source matched by every row), and the temporary view it
    reads (the caller drops it once the MERGE ran)."""
    data = state.data_columns()
    names = [n for n in values if n in data]
    parsed = [_parse(qualified, columns.parser(n, data[n]), [values[n]])[0] for n in names]
    by_name = {f.name: f.dataType for f in spark_schema.fields}
    view = f"lakeslot_backfill_{uuid.uuid4().hex}"
    spark.createDataFrame([tuple(parsed)], StructType(
        [StructField(f"c{i}", by_name[n]) for i, n in enumerate(names)])).createOrReplaceTempView(view)
    assignments = ", ".join(f"{quote(n)} = s.c{i}" for i, n in enumerate(names))
    return (f"MERGE INTO {qualified} t USING {view} s ON true WHEN MATCHED THEN UPDATE SET "
            f"{assignments}", view)
