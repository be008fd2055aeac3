"""The source tables as one apply pass sees them: their options in the spec, and what the source
database's catalog says about them — read once per pass, over one connection the job keeps.

What it answers (:class:`SourceTables`): each table's column options (``excludeColumns``,
``textColumns``); the Iceberg type of a source column, as the snapshot maps it (types that are
not built in resolve through the catalog); every table's source facts
(:mod:`lakeslot.source.facts`); the value existing rows hold in columns added since
(PostgreSQL's "missing value", :meth:`SourceTables.missing_values`); and lakeslot's event
trigger now, with its DDL messages in the batch (:meth:`SourceTables.read_events`).

Invariants:

- One pass, one view: the facts, the missing values and the DDL messages are read at most once
  per pass (:meth:`SourceTables.new_pass` forgets them), so every table of a pass is judged
  against the same catalog reads, and an idle pass costs one facts query, not one per table.
- A DDL message's missing value wins over the catalog's (:meth:`SourceTables.record_missing`):
  it is exact as of the ``ADD COLUMN``, where a later rewrite may have cleared the catalog's.
- Nothing here writes: not to the source, not to a mirror.

Threads: a pass's tables are prepared and applied from several threads; they share the one
connection (made under a lock; psycopg runs one statement at a time on it).

Failure modes: a connection error (``psycopg.OperationalError``) propagates — transient, the
caller's retries handle it (:mod:`lakeslot.apply.failures`); the next use connects again. The
connection is closed with the job (:meth:`SourceTables.close`).
"""

from __future__ import annotations

import threading

import psycopg

from lakeslot.api.naming import TableName
from lakeslot.apply import columns, spread
from lakeslot.mirror import typemap
from lakeslot.source import ddl_capture, facts
from lakeslot.source.columns import ColumnOptions, TypeCache
from lakeslot.source.connection import ConnectionSettings, application_name, connect
from lakeslot.staging.relations import Column, Relation
from lakeslot.workloads import JobInput


class SourceTables:
    """The source tables of one apply job: options, types (cached for the job) and this pass's
    catalog reads (cached for the pass)."""

    def __init__(self, job: JobInput, settings: ConnectionSettings) -> None:
        self.job = job
        self._settings = settings
        self._conn: psycopg.Connection | None = None
        self._connecting = threading.Lock()
        self.types = columns.RelationTypes(self._resolve_type, self._relation_text_columns)
        self._facts: dict[TableName, facts.TableFacts | None] | None = None  # this pass's
        # this pass's: column → (missing value, written by a rewrite) — see missing_values
        self._defaults: dict[TableName, dict[str, tuple[str | None, bool]]] = {}
        # this pass's: lakeslot's event trigger now, and its messages in the batch
        self.capture: ddl_capture.Capture | None = None
        self.events: list[ddl_capture.DdlEvent] = []

    def new_pass(self) -> None:
        """Forget what the last pass read from the catalog."""
        self._facts, self._defaults, self.capture, self.events = None, {}, None, []

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def connection(self) -> psycopg.Connection:
        with self._connecting:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self._settings, application_name("apply", self.job.names.owner))
            return self._conn

    # the tables' options and types ------------------------------------------------------------

    def _resolve_type(self, column: Column) -> typemap.PgType:
        return TypeCache(self.connection()).pg_type(column.type_oid, column.type_modifier)

    def _excluded(self, table: TableName) -> tuple[str, ...]:
        return ColumnOptions.of(self.job.table_spec(table)).exclude_columns

    def _text_columns(self, table: TableName) -> tuple[str, ...]:
        """The table's ``textColumns``: kept as text, as the snapshot keeps them."""
        return ColumnOptions.of(self.job.table_spec(table)).text_columns

    def _relation_text_columns(self, relation: Relation) -> tuple[str, ...]:
        return self._text_columns(TableName(relation.schema, relation.table))

    def iceberg_of(self, table: TableName, column: ddl_capture.SourceColumn):
        """The Iceberg type of a source column of ``table``, as the snapshot maps it."""
        pg = TypeCache(self.connection()).pg_type(column.type_oid, column.type_modifier)
        return typemap.map_column(column.name, pg, as_text=column.name in
                                  self._text_columns(table)).iceberg(0)

    # this pass's catalog ----------------------------------------------------------------------

    def current_facts(self) -> dict[TableName, facts.TableFacts | None]:
        """The source facts of every table, read once per pass."""
        if self._facts is None:
            self._facts = facts.read(self.connection(), self.job.tables)
        return self._facts

    def read_events(self, batch: spread.Batch) -> None:
        """lakeslot's event trigger now, and the batch's DDL messages parsed with its key."""
        if batch.end is None:
            return
        self.capture = ddl_capture.state(self.connection())
        if self.capture is None:
            return
        key = self.capture.key
        self.events = [e for lsn, seq, content in batch.messages
                       if (e := ddl_capture.parse(lsn, seq, content, key)) is not None]

    def missing_values(self, table: TableName, added: list[str]) -> tuple[dict[str, str], list[str]]:
        """The value (text form) existing rows have in each added column — PostgreSQL's "missing
        value" of a column added with a non-volatile default, as long as no rewrite stored the
        values and cleared it (none: NULL) — and the added columns whose existing rows hold a
        value that is not known that way (a default without a missing value: written by a
        rewrite; or a generated column)."""
        if table not in self._defaults:  # every column of the table, read once per pass
            rows = self.connection().execute(
                "SELECT a.attname, a.atthasmissing, a.attmissingval::text, t.typdelim,"
                " a.atthasdef OR a.attgenerated <> '' FROM pg_catalog.pg_attribute a"
                " JOIN pg_catalog.pg_class c ON c.oid = a.attrelid"
                " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
                " JOIN pg_catalog.pg_type t ON t.oid = a.atttypid"
                " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0"
                " AND NOT a.attisdropped",
                (table.schema, table.name)).fetchall()
            self._defaults[table] = {
                name: (typemap.parse_array(array, delimiter)[0] if has_missing else None,
                       not has_missing and has_default)
                for name, has_missing, array, delimiter, has_default in rows}
        known = self._defaults[table]
        values = {n: value for n in added if n in known and (value := known[n][0]) is not None}
        return values, [n for n in added if n in known and known[n][1]]

    def record_missing(self, table: TableName, values: dict[str, str | None]) -> None:
        """The missing values DDL messages carried for columns they added: they win over the
        catalog's for the rest of the pass (exact at the ``ADD COLUMN``)."""
        self.missing_values(table, [])
        self._defaults[table].update({name: (value, False) for name, value in values.items()})
