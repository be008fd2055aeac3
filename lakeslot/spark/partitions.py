"""A mirror table's partition spec, set from ``spec.source.tables[].partitionBy``
(:mod:`lakeslot.api.partitioning`) through Iceberg's Java API (py4j): column names go to Iceberg
as plain strings, never through SQL text, so any identifier works unquoted and unescaped.

How a spec gets onto a mirror:

- **Snapshot (create or replace).** The followers write unpartitioned Parquet files, so the
  snapshot's transaction appends them under the unpartitioned spec and then, in the same
  transaction, evolves the spec to ``partitionBy`` (:func:`evolve`): readers see the complete
  copy and the partitioned spec in one commit, and every later write (the apply job's MERGE) is
  partitioned. :func:`lay_out` then rewrites the files written under an older spec into the
  current one (Iceberg's ``rewriteDataFiles`` on Spark's executors; a ``replace`` snapshot that
  keeps the table's ``lakeslot.lsn``, like maintenance's compaction), so the copy is laid out by
  partition too.
- **Apply.** A table lakeslot creates empty (``snapshot.mode: never``) gets the spec in its
  creating commit; an existing mirror whose recorded ``lakeslot.partition-by`` differs from the
  spec's ``partitionBy`` is evolved in place (:func:`evolve`: remove the fields no longer listed,
  add the new ones; a metadata commit with no snapshot, so the table's position and content are
  untouched). Files written before keep their layout until rewritten (``lay_out``, Iceberg's
  ``rewrite_data_files``) or re-snapshotted: Iceberg plans each file by its own spec, so reads
  stay correct either way.

Field names follow Iceberg's own convention (``id_bucket_16``, ``created_at_day``, the column for
identity), with ``_2``, ``_3``... appended when that name is taken by a column (Iceberg refuses a
partition name equal to another column's). Fields are matched by transform and source column
(field ids), not by name, so a column renamed in place (an Iceberg rename keeps the field id)
keeps its partition field.

Failure modes: a field Iceberg refuses (a column missing from the mirror, a type the transform
cannot take) raises ``Py4JJavaError`` from the commit; callers check :func:`lakeslot.api.partitioning.type_problems`
first so users see that message instead. A failing :func:`lay_out` (e.g. a conflict with a
concurrent MERGE) is logged by its caller: the data stays correct, only its layout waits.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from lakeslot.api.partitioning import PartitionField
from lakeslot.mirror.contract import LSN_PROPERTY, MAINTENANCE_SUMMARY, PARTITION_PROPERTY
from lakeslot.spark.session import each, execute, iceberg_actions


def spec_text(fields: Sequence[PartitionField]) -> str:
    """What :data:`PARTITION_PROPERTY` records for ``fields`` (empty: unpartitioned)."""
    return ", ".join(f.canonical for f in fields)


def field_name(field: PartitionField, columns: Collection[str], taken: Collection[str]) -> str:
    """The partition field's name: Iceberg's convention, made unique against the table's other
    ``columns`` and the partition names already ``taken``."""
    base = field.column + field.name_suffix
    if field.transform == "identity" and base not in taken:
        return base
    name, n = base, 1
    while name in columns or name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def _term(jvm, field: PartitionField):
    expressions = jvm.org.apache.iceberg.expressions.Expressions
    if field.transform == "identity":
        return expressions.ref(field.column)
    if field.transform == "bucket":
        return expressions.bucket(field.column, field.width)
    if field.transform == "truncate":
        return expressions.truncate(field.column, field.width)
    return getattr(expressions, field.transform[:-1])(field.column)  # years → year, ...


def evolve(jvm, operations, table, fields: Sequence[PartitionField]) -> bool:
    """Make the partition spec of ``operations`` (a Java ``Table`` or ``Transaction``: what
    ``updateSpec()`` and ``updateProperties()`` are called on; ``table`` is how it looks now,
    the table itself or the transaction's ``table()``) equal ``fields``, and record them in
    :data:`PARTITION_PROPERTY`; nothing is changed when both already agree. Whether anything
    changed."""
    schema = table.schema()
    columns = {f.name() for f in each(schema.columns())}
    wanted = {(str(f.iceberg), f.column): f for f in fields}
    current = {}
    for part in each(table.spec().fields()):
        if str(part.transform()) == "void":
            continue
        current[(str(part.transform()), schema.findColumnName(part.sourceId()))] = part.name()
    text = spec_text(fields)
    if set(current) == set(wanted) and table.properties().get(PARTITION_PROPERTY, "") == text:
        return False
    if set(current) != set(wanted):
        update = operations.updateSpec()
        taken = {name for key, name in current.items() if key in wanted}
        for key, name in current.items():
            if key not in wanted:
                update = update.removeField(name)
        for key, field in wanted.items():
            if key not in current:
                name = field_name(field, columns - {field.column}, taken)
                taken.add(name)
                update = update.addField(name, _term(jvm, field))
        update.commit()
    properties = operations.updateProperties()
    (properties.set(PARTITION_PROPERTY, text) if text
     else properties.remove(PARTITION_PROPERTY)).commit()
    return True


def lay_out(spark, table, lsn: int | None) -> int:
    """Rewrite the data files of the Java ``table`` written under an older partition spec into its
    current one (Iceberg's ``rewriteDataFiles``, on Spark's executors). The commit is a
    ``replace`` tagged with ``lsn`` (the position it keeps) and ``lakeslot.maintenance =
    partitioning``. The number of files rewritten (0: nothing to do, no commit)."""
    table.refresh()
    current = table.currentSnapshot()
    spec_id = table.spec().specId()
    if current is None or not table.spec().isPartitioned():
        return 0
    outdated = 0
    tasks = table.newScan().planFiles()
    try:
        outdated = sum(1 for task in each(tasks) if task.file().specId() != spec_id)
    finally:
        tasks.close()
    if not outdated:
        return 0
    action = (iceberg_actions(spark).rewriteDataFiles(table).option("rewrite-all", "true")
              .snapshotProperty(MAINTENANCE_SUMMARY, "partitioning"))
    if lsn is not None:
        action = action.snapshotProperty(LSN_PROPERTY, str(lsn))
    return execute(spark, action).rewrittenDataFilesCount()
