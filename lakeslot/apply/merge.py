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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.types import IcebergType
from pyspark import StorageLevel
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from lakeslot import errors
from lakeslot.apply import columns
from lakeslot.apply.changes import TableError
from lakeslot.mirror import typemap
from lakeslot.mirror.contract import LSN_COLUMN, OP_COLUMN, SEQ_COLUMN, TableState
from lakeslot.spark.tables import quote


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


def typed_source(rows, table: str, state: TableState, spark_schema: StructType,
                 keeps: Iterable[int], layout: Sequence[str], delimiters: Mapping[str, str],
                 absent: Mapping[str, str] | None = None, reused: bool = False) -> Source:
    """One table's reduced rows (:data:`lakeslot.apply.spread.REDUCED`, a DataFrame) parsed into
    the mirror's types on the executors and registered as a temporary view shaped for
    :func:`resolved_sql` (``keeps``: the columns some row keeps from the mirror; ``layout``: the
    column of each position of the rows' values; ``delimiters``:
    each array column's element delimiter in the source's text form; ``absent``: the value, as
    text, of a column a change does not carry — it came before the column was added, so the row
    holds the column's default — else NULL). The caller drops it with :func:`drop`. Persisted
    (parsed once, by its first use) when read more than once: when some row keeps a value from
    the mirror (:func:`missing_sql` reads it before the MERGE) or when ``reused`` (the caller
    reads it before the MERGE too); otherwise the MERGE parses the rows as it reads them
    (persisting 777k parsed rows took 2 s in one task, as long as their parse).
    Parsed in the JVM where Spark's casts are exact (:func:`_spark_parsed`: no Python worker,
    no rows crossing to Python and back), else in Python (:class:`_Parse`); either way an
    unmappable value fails the first Spark action on the view with the Python parser's message,
    marked as definite (:func:`lakeslot.errors.marked`, see :func:`definite_error`)."""
    data = state.data_columns()
    names = list(data)
    key = [names.index(k) for k in state.key]
    keeps = kept_columns(names, keeps, layout)
    by_name = {f.name: f.dataType for f in spark_schema.fields}
    schema = StructType(
        [StructField(f"c{i}", by_name[n]) for i, n in enumerate(names)]
        + [StructField(f"k{i}", BooleanType()) for i in keeps]
        + [StructField(f"s{j}", by_name[names[i]]) for j, i in enumerate(key)]
        + [StructField("op", StringType()), StructField("lsn", LongType()),
           StructField("seq", LongType())])
    positions = [layout.index(n) for n in names]
    texts = [(absent or {}).get(n) for n in names]
    frame = _spark_parsed(rows, table, schema, names, positions, key, keeps, texts)
    if frame is None:
        parse = _Parse(table, [(n, t, delimiters.get(n, ",")) for n, t in data.items()],
                       positions, key, keeps, texts, to_arrow_schema(schema))
        frame = rows.select("values", "flags", "source", "op", "lsn", "seq").mapInArrow(
            parse, schema)
    if keeps or reused:
        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    view = f"lakeslot_apply_{uuid.uuid4().hex}"
    frame.createOrReplaceTempView(view)
    return Source(view, names, keeps, key, bool(keeps))


def kept_columns(names: Sequence[str], keeps: Iterable[int], layout: Sequence[str]) -> list[int]:
    """The mirror columns (positions in ``names``) of the reduction's ``keeps`` (positions in
    ``layout``): those some row keeps from the mirror."""
    return sorted(names.index(layout[i]) for i in keeps if layout[i] in names)


def parsed_rows(rows: pa.Table, table: str, state: TableState, arrow: pa.Schema,
                keeps: Iterable[int], layout: Sequence[str], delimiters: Mapping[str, str],
                absent: Mapping[str, str] | None = None) -> pa.Table:
    """The driver's :func:`typed_source`: one table's reduced rows, collected (an Arrow table
    of :data:`lakeslot.apply.spread.REDUCED` columns), parsed by the same parser into
    ``arrow``'s types (the mirror's Arrow schema): the columns ``c<i>``, ``k<i>``, ``s<j>``,
    ``op``, ``lsn``, ``seq`` of the view :func:`typed_source` registers (the caller resolves
    the kept values)."""
    data = state.data_columns()
    names = list(data)
    key = [names.index(k) for k in state.key]
    kept = kept_columns(names, keeps, layout)
    types = {f.name: f.type for f in arrow}
    schema = pa.schema([pa.field(f"c{i}", types[n]) for i, n in enumerate(names)]
                       + [pa.field(f"k{i}", pa.bool_()) for i in kept]
                       + [pa.field(f"s{j}", types[names[i]]) for j, i in enumerate(key)]
                       + [pa.field("op", pa.string()), pa.field("lsn", pa.int64()),
                          pa.field("seq", pa.int64())])
    parse = _Parse(table, [(n, t, delimiters.get(n, ",")) for n, t in data.items()],
                   [layout.index(n) for n in names], key, kept,
                   [(absent or {}).get(n) for n in names], schema)
    selected = rows.select(["values", "flags", "source", "op", "lsn", "seq"])
    return pa.Table.from_batches(list(parse(iter(selected.to_batches()))), schema)


def _spark_parsed(rows, table: str, schema: StructType, names: Sequence[str],
                  positions: Sequence[int], key: Sequence[int], keeps: Sequence[int],
                  absent: Sequence[str | None]):
    """The typed rows parsed in the JVM (:func:`lakeslot.apply.columns.spark_parse`), or None
    when a column has no exact Spark cast. A value the Python parser rejects fails the first
    action on them with the Python parser's definite error, marked
    (:func:`lakeslot.errors.marked`). Three projections written as SQL text — the texts, their
    parsed values, the values checked — so each value is parsed once (one projection parsing and
    checking measured 1.6× as long), in a handful of Py4J calls, where building them as columns
    took ~600 (0.1 s of every pass); every text in them is :func:`~lakeslot.apply.columns.sql_text`."""
    fields = {f.name: f.dataType for f in schema.fields}
    columns_ = [(f"c{i}", f"t{i}", names[i]) for i in range(len(positions))]
    columns_ += [(f"s{j}", f"u{j}", names[key[j]]) for j in range(len(key))]
    found = [columns.spark_parse(fields[out], text, f"p_{out}") for out, text, _ in columns_]
    parses = [p for p in found if p is not None]
    if len(parses) < len(found):
        return None

    def checked(parse: columns.SparkParse, out: str, text: str, column: str) -> str:
        if parse.rejected is None:
            return f"p_{out}"
        # the Python parser's words around the value (its repr: quoted, as PostgreSQL prints
        # nothing to escape in these types) and the reason
        value, reason = "\x00", "\x01"
        words = errors.marked(f"{table}: {typemap.UnmappableValue(reason, 0, value, column)}")
        before, rest = words.split(repr(value))
        between, after = rest.split(reason)
        message = (f"concat({columns.sql_text(before + chr(39))}, `{text}`, "
                   f"{columns.sql_text(chr(39) + between)}, {parse.reason}, "
                   f"{columns.sql_text(after)})")
        return f"CASE WHEN {parse.rejected} THEN raise_error({message}) ELSE p_{out} END"

    def flag(i: int) -> str:
        return f"substring(flags, {positions[i] + 1}, 1)"

    texts = []
    for i, (position, text) in enumerate(zip(positions, absent, strict=True)):
        default = f" WHEN {flag(i)} = 'a' THEN {columns.sql_text(text)}" if text is not None else ""
        texts.append(f"CASE WHEN {flag(i)} = 'v' THEN try_element_at(`values`, {position + 1})"
                     f"{default} END AS t{i}")
    texts += [f"try_element_at(source, {j + 1}) AS u{j}" for j in range(len(key))]
    texts += [f"{flag(i)} = 'k' AS k{i}" for i in keeps]
    typed = [f"{checked(p, out, text, column)} AS {out}"
             for p, (out, text, column) in zip(parses, columns_, strict=True)]
    return rows.selectExpr(*texts, "op", "lsn", "seq").selectExpr(
        "*", *[f"{p.value} AS p_{out}" for p, (out, _, _) in zip(parses, columns_, strict=True)]
    ).selectExpr(*typed[:len(positions)], *[f"k{i}" for i in keeps], *typed[len(positions):],
                 "op", "lsn", "seq")


def definite_error(error: Exception) -> TableError | None:
    """The definite error an executor raised (an unmappable value), when ``error`` — as Spark
    delivers it to the driver — carries one."""
    message = errors.carried(error)
    return None if message is None else TableError(message)


def drop(spark, source: Source) -> None:
    """Release a source of :func:`typed_source`."""
    spark.table(source.view).unpersist()  # (nothing when it was not persisted)
    spark.catalog.dropTempView(source.view)


@dataclass(frozen=True)
class _Parse:
    """Executors: reduced rows → the positional typed columns (vectorised)."""

    table: str
    columns: list[tuple[str, IcebergType, str]]  # name, mirror type, array delimiter
    positions: list[int]  # each column's position in the rows' values and flags
    key: list[int]
    keeps: list[int]
    absent: list[str | None]
    schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parsers = [columns.parser(n, t, d) for n, t, d in self.columns]
        for batch in batches:
            values, flags, source = (batch.column(c) for c in ("values", "flags", "source"))
            out: list[pa.Array] = []
            flag_of = [pc.utf8_slice_codeunits(flags, p, p + 1) for p in self.positions]
            for i, parser in enumerate(parsers):
                flag = flag_of[i]
                text = pc.if_else(pc.equal(flag, "v"), pc.list_element(values, self.positions[i]),
                                  pa.scalar(None, pa.large_string()))
                if self.absent[i] is not None:
                    text = pc.if_else(pc.equal(flag, "a"), pa.scalar(self.absent[i], pa.large_string()), text)
                out.append(self._typed(parser, text.cast(pa.string()), len(out)))
            out += [pc.equal(flag_of[i], "k") for i in self.keeps]
            for j, i in enumerate(self.key):
                text = pc.list_element(pc.if_else(pc.is_null(source), pa.scalar([None] * len(
                    self.key), source.type), source), j)
                out.append(self._typed(parsers[i], text.cast(pa.string()), len(out)))
            out += [batch.column("op"), batch.column("lsn"), batch.column("seq")]
            yield pa.RecordBatch.from_arrays(out, schema=self.schema)

    def _typed(self, parser: typemap.ColumnMapping, texts: pa.Array, field: int) -> pa.Array:
        wanted = self.schema.field(field).type
        try:
            parsed = parser.from_text(texts)
        except typemap.UnmappableValue as e:
            raise RuntimeError(errors.marked(f"{self.table}: {e}")) from None
        if _has_uuid(parsed.type):
            return pa.array(_python(parsed), wanted)
        return parsed if parsed.type == wanted else parsed.cast(wanted)


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
