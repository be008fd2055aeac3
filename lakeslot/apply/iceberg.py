"""The apply job's Iceberg operations, through the Spark session's catalog (Java, via py4j) and
Spark SQL.

Invariants:

- Every commit that moves a table's position carries ``lakeslot.lsn`` in its snapshot summary
  (DESIGN.md rule 1): the MERGE (through ``with_commit_properties``), the changelog append, and
  the empty append that advances an idle table (:meth:`Tables.advance`, a snapshot with no data
  change: readers and ``lakeslot.mirror.progress`` see the new position, no data is rewritten).
  A MERGE that Iceberg turns into no commit at all (nothing changed) is followed by such an empty
  append, so the position always reaches the batch end.
- Schema changes (add column, promote type) are metadata commits without a snapshot; they are
  idempotent (a rerun after a crash finds them done and skips them). A column PostgreSQL added
  with a default holds that value in every existing row without any change being logged: the
  same commit that adds it records the value in ``lakeslot.backfill``, and the apply job fills
  the existing rows (one commit at the unchanged position) and then removes the marker, before
  applying any change after the ALTER — so a crash in between fills again, never over newer data.
- A definite error is recorded on the table itself: ``lakeslot.apply-error`` (the message),
  ``lakeslot.apply-error-lsn`` (the position the table stopped at) and, when the way out is a
  re-snapshot, ``lakeslot.resnapshot-required``. The error is in force while the table's
  position still equals ``lakeslot.apply-error-lsn`` (``lakeslot.mirror.apply_error``, which
  the operator and local mode read through ``lakeslot.mirror.progress``): a re-snapshot (which
  moves the position) lifts it, and the apply job then removes the stale properties.
- Tables are re-read (``refresh``) before every decision: another job (a re-snapshot) may have
  committed since, and Spark's catalog caches table objects.

Failure modes: catalog and Spark errors surface as ``py4j`` errors (``Py4JJavaError``): the caller
treats them as transient and retries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, ListType

from lakeslot import mirror as progress
from lakeslot.snapshot import mirror
from lakeslot.spark_session import with_commit_properties
from lakeslot.typemap import LSN_COLUMN

LSN_PROPERTY = mirror.LSN_PROPERTY
ERROR_PROPERTY, ERROR_LSN_PROPERTY = progress.ERROR_PROPERTY, progress.ERROR_LSN_PROPERTY
RESNAPSHOT_PROPERTY = progress.RESNAPSHOT_PROPERTY
BACKFILL_PROPERTY = "lakeslot.backfill"
OP_COLUMN, SEQ_COLUMN = "_lakeslot_op", "_lakeslot_seq"


def quote(name: str) -> str:
    """A Spark SQL identifier, backquoted with backquotes doubled."""
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class TableState:
    """A table as the catalog has it now."""

    lsn: int | None  # lakeslot.lsn of the current snapshot
    schema: Schema
    properties: dict[str, str]

    @property
    def error(self) -> str | None:
        """The recorded definite error, if still in force (see the module docstring)."""
        return progress.apply_error(self.properties, self.lsn)

    @property
    def resnapshot_required(self) -> bool:
        return self.properties.get(RESNAPSHOT_PROPERTY) == "true"

    @property
    def stale_error(self) -> bool:
        return ERROR_PROPERTY in self.properties and self.error is None

    @property
    def backfill(self) -> dict[str, str]:
        """Added columns whose existing rows still need their value (see ``Tables.evolve``)."""
        return json.loads(self.properties.get(BACKFILL_PROPERTY, "{}"))

    @property
    def key(self) -> list[str]:
        return [self.schema.find_column_name(i) for i in self.schema.identifier_field_ids]

    def data_columns(self) -> dict[str, IcebergType]:
        """Columns other than lakeslot's own, in order."""
        return {f.name: f.field_type for f in self.schema.fields
                if f.name not in (LSN_COLUMN, OP_COLUMN, SEQ_COLUMN)}


class Tables(mirror.Catalog):
    """The tables of one namespace."""

    def __init__(self, spark, catalog: str, namespace: str) -> None:
        super().__init__(spark, catalog)
        self.namespace = namespace

    def qualified(self, table: str) -> str:
        levels = [self._name, *self.namespace.split("."), table]
        return ".".join(quote(level) for level in levels)

    def _table(self, table: str):
        loaded = self._catalog.loadTable(self._identifier(self.namespace, table))
        loaded.refresh()
        return loaded

    def load(self, table: str) -> TableState | None:
        if not self._catalog.tableExists(self._identifier(self.namespace, table)):
            return None
        loaded = self._table(table)
        current = loaded.currentSnapshot()
        lsn = current.summary().get(LSN_PROPERTY) if current is not None else None
        schema = Schema.model_validate_json(
            self._jvm.org.apache.iceberg.SchemaParser.toJson(loaded.schema()))
        return TableState(int(lsn) if lsn is not None else None, schema,
                          dict(loaded.properties()))

    def create(self, table: str, schema: Schema, properties: dict[str, str], lsn: int) -> None:
        """Create the table empty, at position ``lsn``, in one commit."""
        write = self.begin(self.namespace, table, schema, properties, replace=False)
        write.commit([], lsn)

    def advance(self, table: str, lsn: int) -> None:
        """An empty commit recording that the table reflects ``lsn`` (no data changes)."""
        self._table(table).newAppend().set(LSN_PROPERTY, str(lsn)).commit()

    def lsn(self, table: str) -> int | None:
        current = self._table(table).currentSnapshot()
        value = current.summary().get(LSN_PROPERTY) if current is not None else None
        return int(value) if value is not None else None

    def evolve(self, table: str, add: list[tuple[str, IcebergType]],
               promote: list[tuple[str, IcebergType]],
               backfill: dict[str, str] | None = None) -> None:
        """Add optional columns and promote types; what is already done is skipped. ``backfill``
        (column → PostgreSQL text value) is recorded in the same commit, as
        :data:`BACKFILL_PROPERTY`: the value every existing row has in the source."""
        loaded = self._table(table)
        state = self.load(table).data_columns()
        add = [(n, t) for n, t in add if n not in state]
        promote = [(n, t) for n, t in promote if str(state.get(n)) != str(t)]
        if not add and not promote:
            return
        transaction = loaded.newTransaction()
        update = transaction.updateSchema()
        for name, iceberg in add:
            update.addColumn(name, self._java_type(iceberg))
        for name, iceberg in promote:
            update.updateColumn(name, self._java_type(iceberg))
        update.commit()
        added = {name for name, _ in add}
        backfill = {k: v for k, v in (backfill or {}).items() if k in added}
        if backfill:
            transaction.updateProperties().set(BACKFILL_PROPERTY, json.dumps(backfill)).commit()
        transaction.commitTransaction()

    def _java_type(self, iceberg: IcebergType):
        types = self._jvm.org.apache.iceberg.types.Types
        if isinstance(iceberg, ListType):
            # field ids of a new nested type are reassigned by the schema update
            return types.ListType.ofOptional(0, self._java_type(iceberg.element_type))
        return types.fromPrimitiveString(str(iceberg))

    def set_properties(self, table: str, values: dict[str, str], remove: tuple[str, ...] = ()) -> None:
        update = self._table(table).updateProperties()
        for key, value in values.items():
            update.set(key, value)
        for key in remove:
            update.remove(key)
        update.commit()

    def record_error(self, table: str, message: str, lsn: int | None, resnapshot: bool) -> None:
        values = {ERROR_PROPERTY: message, ERROR_LSN_PROPERTY: str(lsn)}
        if resnapshot:
            values[RESNAPSHOT_PROPERTY] = "true"
        self.set_properties(table, values, () if resnapshot else (RESNAPSHOT_PROPERTY,))

    def clear_error(self, table: str) -> None:
        self.set_properties(table, {}, (ERROR_PROPERTY, ERROR_LSN_PROPERTY, RESNAPSHOT_PROPERTY))

    def expire_snapshots(self, table: str) -> None:
        """Iceberg's expire_snapshots with the table's own history.expire.* settings."""
        name = ".".join([*self.namespace.split("."), table]).replace("'", "''")
        self._spark.sql(f"CALL {quote(self._name)}.system.expire_snapshots(table => '{name}')")

    def commit_sql(self, table: str, statement: str, lsn: int) -> None:
        """Run a SQL statement that commits to ``table``, its commit tagged ``lakeslot.lsn``;
        when it commits nothing, advance the table to ``lsn`` with an empty commit."""
        with_commit_properties(self._spark, {LSN_PROPERTY: str(lsn)},
                               lambda: self._spark.sql(statement))
        if self.lsn(table) != lsn:
            self.advance(table, lsn)
