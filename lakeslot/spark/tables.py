"""The mirror tables through the Spark session's Iceberg catalog (Java, via py4j) and Spark SQL:
how the snapshot and apply jobs create, replace, evolve and commit to them. Works with any catalog
type Spark is configured with, since it goes through Spark's own catalog object.

Invariants:

- Every commit that moves a table's position carries ``lakeslot.lsn`` in its snapshot summary
  (DESIGN.md rule 1): the snapshot's create/replace transaction (:meth:`MirrorWrite.commit`), the
  MERGE (:meth:`Tables.commit_sql`, through ``with_commit_properties``), the changelog append,
  and the empty append that advances an idle table (:meth:`Tables.advance`, a snapshot with no
  data change: readers and :mod:`lakeslot.mirror.progress` see the new position, no data is
  rewritten). A statement that Iceberg turns into no commit at all (nothing changed) is followed
  by such an empty append, so the position always reaches the batch end.
- A snapshot of a table is ONE Iceberg transaction: ``createTransaction`` when the table does
  not exist, ``replaceTransaction`` when it does (a re-snapshot, or an empty table created
  beforehand). It sets the schema (:func:`lakeslot.mirror.typemap.mirror_schema`: format v2, identifier
  fields = the key, ``_lakeslot_lsn``), the table properties, and appends every data file the
  followers wrote, then sets the partition spec of ``partitionBy``
  (:mod:`lakeslot.spark.partitions`). Readers see either the old table (or none) or the
  complete copy; a job that dies before the commit leaves nothing behind in the catalog.
- Which tables are snapshotted (:meth:`Catalog.state`): generation ``g`` when the property
  ``lakeslot.snapshot-generation`` is ``g`` (set in the same commit as the data), or generation
  0 when its snapshot lineage carries ``lakeslot.lsn`` (a table snapshotted before the property
  existed).
- Schema changes (add column, promote type) are metadata commits without a snapshot; they are
  idempotent (a rerun after a crash finds them done and skips them). A column PostgreSQL added
  with a default holds that value in every existing row without any change being logged: the
  same commit that adds it records the value in ``lakeslot.backfill`` (:meth:`Tables.evolve`);
  the apply job fills the existing rows and then removes the marker.
- A definite error of the apply job is recorded on the table itself (:meth:`Tables.record_error`,
  see :mod:`lakeslot.mirror.contract` for when it is in force).
- Spark's catalog caches table objects — the objects every read and commit here goes through,
  Spark's too —, and this job's commits leave them as the catalog's answers said. A table is
  re-read with one request to the catalog (:meth:`Catalog.java_table`: ``refresh`` of the object
  Spark's catalog holds — Iceberg keeps the metadata it holds, and the manifest lists it read
  with it, when no one committed since —, or, where the catalog may have dropped it, unused
  here for half its cache's expiry, a load of a new one: not a load and then a refresh, two
  requests where the first answered already) where another job (a re-snapshot) may have
  committed since and the caller cannot tell: the apply job reads a table
  it knows from its own last pass as that pass left it (:meth:`Tables.load` without refresh, see
  :mod:`lakeslot.apply.table_pass`), and its commits then check that the table is still where
  it was read: the driver's row delta from the table as held (:meth:`Tables.held`) — the
  catalog checks the commit's requirements against the table, and Iceberg re-reads and retries
  a commit that fails them only from the position it was planned from (``CommitOperations``) —,
  the advance of an idle table and the MERGE after a refresh (:meth:`Tables.advance`,
  :meth:`Tables.expect`): :class:`lakeslot.mirror.contract.Moved` otherwise, nothing
  committed.

Failure modes: an existing table with data and no lakeslot marks is refused by the snapshot (it
is not ours: replacing it would destroy someone's data); a concurrent commit to the same table
makes Iceberg retry or fail; catalog and Spark errors surface as ``py4j`` errors
(``Py4JJavaError``) with Iceberg's message: callers treat them as transient and retry.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from py4j.protocol import Py4JJavaError
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, ListType

from lakeslot.api.models import MiB
from lakeslot.api.partitioning import PartitionField, PartitionSpecError, type_problems
from lakeslot.mirror.catalogs import TABLE_CACHE_EXPIRY_PROPERTY
from lakeslot.mirror.contract import (
    BACKFILL_PROPERTY,
    ERROR_LSN_PROPERTY,
    ERROR_PROPERTIES,
    ERROR_PROPERTY,
    FAILURES_PROPERTY,
    GENERATION_PROPERTY,
    LSN_PROPERTY,
    MAX_SNAPSHOT_AGE_PROPERTY,
    PARTITION_PROPERTY,
    RESNAPSHOT_AUTOMATIC,
    RESNAPSHOT_PROPERTY,
    RESNAPSHOT_SUMMARY,
    RETRY_AT_PROPERTY,
    SNAPSHOT_LSN_PROPERTY,
    Moved,
    TableState,
)
from lakeslot.spark import helpers, partitions
from lakeslot.spark.jvm import java
from lakeslot.spark.session import with_commit_properties

CODECS = {"uncompressed": "none"}
EXPIRY_THREADS = 16  # the JVM's threads reading manifest lists and deleting files for expiries
_expiry_pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # gateway → its pool
_expiry_pools_lock = threading.Lock()


@dataclass(frozen=True)
class WriteOptions:
    """How data files of a table are written (from its ``write.*`` properties)."""

    compression: str = "zstd"
    compression_level: int | None = None
    row_group_bytes: int = 128 * MiB
    target_file_bytes: int = 512 * MiB


@dataclass(frozen=True)
class MirrorState:
    exists: bool
    generation: int | None = None  # the snapshot generation, None when never snapshotted
    has_data: bool = False
    snapshot_lsn: int | None = None  # lakeslot.snapshot-lsn: where the last snapshot was taken
    properties: Mapping[str, str] = field(default_factory=dict)  # the table's, when it exists


class Catalog:
    def __init__(self, spark, name: str) -> None:
        self._spark, self._name = spark, name
        self._gateway = spark.sparkContext._gateway
        self._jvm = spark.sparkContext._jvm
        self._catalog = (spark._jsparkSession.sessionState().catalogManager().catalog(name)
                         .icebergCatalog())
        self._identifiers: dict[tuple[str, str], object] = {}
        self._hold_s = cache_hold_s(spark.conf, name)
        self._accessed: dict[tuple[str, str], float] = {}  # (monotonic) the last load through here

    def _namespace(self, namespace: str):
        levels = namespace.split(".")
        array = self._gateway.new_array(java(self._jvm, "java.lang.String"), len(levels))
        for i, level in enumerate(levels):
            array[i] = level
        return java(self._jvm, "org.apache.iceberg.catalog.Namespace.of")(array)

    def _identifier(self, namespace: str, table: str):
        identifier = self._identifiers.get((namespace, table))
        if identifier is None:  # (built once: a dozen py4j calls)
            identifier = java(self._jvm, "org.apache.iceberg.catalog.TableIdentifier.of")(
                self._namespace(namespace), table)
            self._identifiers[(namespace, table)] = identifier
        return identifier

    def ensure_namespace(self, namespace: str) -> None:
        levels = ".".join(f"`{level.replace('`', '``')}`" for level in namespace.split("."))
        self._spark.sql(f"CREATE NAMESPACE IF NOT EXISTS `{self._name}`.{levels}")

    def state(self, namespace: str, table: str) -> MirrorState:
        ident = self._identifier(namespace, table)
        if not self._catalog.tableExists(ident):
            return MirrorState(False)
        loaded = self.java_table(namespace, table, fresh=False)  # (what tableExists just loaded)
        current = loaded.currentSnapshot()
        properties = python_dict(self._jvm, loaded.properties())
        generation = properties.get(GENERATION_PROPERTY)
        if generation is not None:
            taken = properties.get(SNAPSHOT_LSN_PROPERTY)
            return MirrorState(True, int(generation), current is not None,
                               int(taken) if taken is not None else None, properties)
        snapshot = current
        while snapshot is not None:
            if snapshot.summary().get(LSN_PROPERTY) is not None:
                return MirrorState(True, 0, True, properties=properties)
            parent = snapshot.parentId()
            snapshot = loaded.snapshot(parent) if parent is not None else None
        return MirrorState(True, None, current is not None, properties=properties)

    def java_table(self, namespace: str, table: str, *, fresh: bool = True):
        """The Java Iceberg table: ``fresh``, as the catalog has it now, with one request — the
        object Spark's catalog holds, refreshed, or a new one where it may hold none (see the
        module docstring); else as Spark's catalog holds it (loaded when it holds none)."""
        ident, key, now = self._identifier(namespace, table), (namespace, table), time.monotonic()
        held = now - self._accessed.get(key, -math.inf) < self._hold_s
        if fresh and not held:  # (an object it holds all the same is dropped, not trusted)
            self._catalog.invalidateTable(ident)
        loaded = self._catalog.loadTable(ident)
        if fresh and held:
            loaded.refresh()
        self._accessed[key] = now
        return loaded

    def begin(self, namespace: str, table: str, schema: Schema, properties: dict[str, str],
              replace: bool, partition: Sequence[PartitionField] = ()) -> MirrorWrite:
        """An open create (or ``replace``) transaction; ``partition``: the spec the commit sets
        (after appending the unpartitioned files, see :mod:`lakeslot.spark.partitions`)."""
        jvm = self._jvm
        props = jvm.java.util.HashMap()
        for key, value in properties.items():
            props.put(key, value)
        builder = self._catalog.buildTable(
            self._identifier(namespace, table),
            jvm.org.apache.iceberg.SchemaParser.fromJson(schema.model_dump_json()),
        ).withProperties(props)
        return MirrorWrite(jvm, builder.replaceTransaction() if replace
                           else builder.createTransaction(), tuple(partition))


class MirrorWrite:
    """An open create/replace transaction of one mirror table."""

    def __init__(self, jvm, transaction, partition: tuple[PartitionField, ...] = ()) -> None:
        self._jvm, self._txn, self._partition = jvm, transaction, partition
        self._table = transaction.table()

    def schema(self) -> Schema:
        """The schema with the field ids the catalog assigned."""
        return schema_of(self._jvm, self._table)

    def data_location(self, name: str) -> str:
        return self._table.locationProvider().newDataLocation(name)

    def write_options(self) -> WriteOptions:
        props, default = self._table.properties(), WriteOptions()
        codec = (props.get("write.parquet.compression-codec") or default.compression).lower()
        level = props.get("write.parquet.compression-level")
        return WriteOptions(
            compression=CODECS.get(codec, codec),
            compression_level=int(level) if level else None,
            row_group_bytes=int(props.get("write.parquet.row-group-size-bytes")
                                or default.row_group_bytes),
            target_file_bytes=int(props.get("write.target-file-size-bytes")
                                  or default.target_file_bytes))

    def commit(self, files: list[str], lsn: int, *, resnapshot: bool = False) -> None:
        """Append ``files`` (metrics read from their footers) and commit, tagged ``lakeslot.lsn``
        (and ``lakeslot.control.resnapshot`` when this replaces a table that had been snapshotted: what
        the re-snapshot loop guard counts)."""
        iceberg = self._jvm.org.apache.iceberg
        io, spec = self._table.io(), self._table.spec()
        config = iceberg.MetricsConfig.forTable(self._table)
        append = self._txn.newAppend()
        for uri in files:
            data = io.newInputFile(uri)
            append.appendFile(
                iceberg.DataFiles.builder(spec).withInputFile(data).withFormat("PARQUET")
                .withMetrics(iceberg.parquet.ParquetUtil.fileMetrics(data, config)).build())
        append.set(LSN_PROPERTY, str(lsn))
        if resnapshot:
            append.set(RESNAPSHOT_SUMMARY, "true")
        append.commit()
        partitions.evolve(self._jvm, self._txn, self._txn.table(), self._partition)
        self._txn.commitTransaction()


def cache_hold_s(conf, catalog: str) -> float:
    """How long after a table's last load Spark's catalog ``catalog`` surely still holds its
    object (Iceberg's ``CachingCatalog`` drops one ``cache.expiration-interval-ms`` after its
    last access: 30 s by default, never at -1): half that interval; 0 when it holds none
    (``cache-enabled`` false, or an interval of 0). ``conf``: the session's ``spark.conf``."""
    prefix = f"spark.sql.catalog.{catalog}."
    if str(conf.get(prefix + "cache-enabled", "true")).strip().lower() != "true":
        return 0.0
    interval_ms = int(conf.get(prefix + TABLE_CACHE_EXPIRY_PROPERTY, "30000"))
    return math.inf if interval_ms < 0 else interval_ms / 2000


def python_dict(jvm, java_map) -> dict[str, str]:
    """A Java ``Map<String, String>`` (table properties, a snapshot's summary) as a dict, in one
    py4j call (py4j's own conversion makes a few per entry: ≈ 100 calls, 20 ms, per table)."""
    return json.loads(java(jvm, "org.apache.iceberg.util.JsonUtil.mapper()").writeValueAsString(
        java_map))


@functools.lru_cache(maxsize=4096)
def _schema(text: str) -> Schema:
    """A schema's JSON parsed (pyiceberg's schemas are immutable: shared by every state read
    with the same schema, parsed once)."""
    return Schema.model_validate_json(text)


def schema_of(jvm, table) -> Schema:
    """The Java Iceberg ``table``'s current schema, as pyiceberg's (field IDs kept)."""
    return _schema(java(jvm, "org.apache.iceberg.SchemaParser.toJson")(table.schema()))


def position_of(table) -> int | None:
    """The ``lakeslot.lsn`` of the Java ``table``'s current snapshot; a ``replace`` snapshot
    without one (a compaction lakeslot did not run) has its parent's (as
    :func:`lakeslot.mirror.progress.position`)."""
    snapshot = table.currentSnapshot()
    while (snapshot is not None and snapshot.summary().get(LSN_PROPERTY) is None
           and snapshot.operation() == "replace" and snapshot.parentId() is not None):
        snapshot = table.snapshot(snapshot.parentId())
    value = snapshot.summary().get(LSN_PROPERTY) if snapshot is not None else None
    return int(value) if value is not None else None


def _still_at(since: int | None, now: int | None) -> None:
    """:class:`Moved` unless a table read at position ``since`` is at ``now``."""
    if now != since:
        raise Moved(f"the table moved from position {since} to {now} since it was read")


def _no_such_table(error: Py4JJavaError) -> bool:
    return error.java_exception.getClass().getName().endswith(".NoSuchTableException")


def quote(name: str) -> str:
    """A Spark SQL identifier, backquoted with backquotes doubled."""
    return "`" + name.replace("`", "``") + "`"


class Tables(Catalog):
    """The tables of one namespace."""

    def __init__(self, spark, catalog: str, namespace: str) -> None:
        super().__init__(spark, catalog)
        self.namespace = namespace

    def qualified(self, table: str) -> str:
        levels = [self._name, *self.namespace.split("."), table]
        return ".".join(quote(level) for level in levels)

    def _expiry_pool(self):
        """The JVM's pool for expiries (one per JVM, :data:`EXPIRY_THREADS` daemon threads):
        Iceberg's default is a pool of as many threads as cores, which on object storage leaves
        an expiry's reads one after the other."""
        with _expiry_pools_lock:
            pool = _expiry_pools.get(self._gateway)
            if pool is None:
                pool = java(self._jvm, "org.apache.iceberg.util.ThreadPools.newWorkerPool")(
                    "lakeslot-expiry", EXPIRY_THREADS)
                _expiry_pools[self._gateway] = pool
            return pool

    def iceberg_table(self, table: str):
        """The Java Iceberg table, refreshed (Iceberg's ``NoSuchTableException`` when there is
        no such table)."""
        return self.java_table(self.namespace, table)

    def held(self, table: str):
        """The Java Iceberg table as Spark's catalog holds it — as this job last read or
        committed it —, without a request (loaded when it holds none): for a commit whose
        requirements the catalog checks (see the module docstring)."""
        return self.java_table(self.namespace, table, fresh=False)

    def snapshot_at(self, table: str, position: int | None) -> int | None:
        """The ID of the current snapshot of ``table`` as Spark's catalog holds it (:meth:`held`)
        when the table is at ``position`` (:func:`position_of`); if it is not, refreshed once (a
        request) and asked again; None when it is not then either. Two py4j calls (the lookup,
        the question) where asking Python's proxies made a dozen."""
        loaded = self.held(table)
        if helpers.loaded(self._jvm, helpers.TABLE_STATES) is not None:
            return java(self._jvm, f"{helpers.TABLE_STATES}.snapshotAt")(
                loaded, LSN_PROPERTY, None if position is None else str(position))
        for refresh in (False, True):
            if refresh:
                loaded.refresh()
            current = loaded.currentSnapshot()
            if current is not None and position_of(loaded) == position:
                return int(current.snapshotId())
        return None

    def load(self, table: str, *, refresh: bool = True) -> TableState | None:
        """The table's state, read from the catalog; without ``refresh``, as this job last read
        or committed it (:meth:`held`: no request)."""
        try:
            loaded = self.iceberg_table(table) if refresh else self.held(table)
        except Py4JJavaError as e:
            if _no_such_table(e):
                return None
            raise
        if helpers.loaded(self._jvm, helpers.TABLE_STATES) is None:
            return TableState(position_of(loaded), schema_of(self._jvm, loaded),
                              python_dict(self._jvm, loaded.properties()))
        read = json.loads(java(self._jvm, f"{helpers.TABLE_STATES}.of")(loaded, LSN_PROPERTY))
        return TableState(None if read["position"] is None else int(read["position"]),
                          _schema(read["schema"]), read["properties"])

    def create(self, table: str, schema: Schema, properties: dict[str, str], lsn: int,
               partition: Sequence[PartitionField] = ()) -> None:
        """Create the table empty, at position ``lsn``, partitioned by ``partition``, in one
        commit."""
        write = self.begin(self.namespace, table, schema, properties, replace=False,
                           partition=partition)
        write.commit([], lsn)

    def partition(self, table: str, fields: Sequence[PartitionField],
                  properties: Mapping[str, str]) -> bool:
        """Evolve the table's partition spec to ``fields`` when the ``partitionBy`` recorded in its
        ``properties`` (as just loaded: :data:`PARTITION_PROPERTY`) differs (a metadata commit: no
        snapshot, the position stays); a table never given one keeps its spec while ``fields`` is
        empty. Whether it changed anything. :class:`PartitionSpecError` when the mirror's
        columns cannot take ``fields`` (e.g. a textColumns change not yet re-snapshotted)."""
        if properties.get(PARTITION_PROPERTY, "") == partitions.spec_text(fields):
            return False
        state = self.load(table)
        assert state is not None  # the caller just loaded it
        problems = type_problems(fields, state.data_columns())
        if problems:
            raise PartitionSpecError(f"mirror {table}: " + "; ".join(map(str, problems)))
        loaded = self.iceberg_table(table)
        return partitions.evolve(self._jvm, loaded, loaded, fields)

    def advance(self, table: str, lsn: int, since: int | None = None) -> None:
        """An empty commit recording that the table reflects ``lsn`` (no data changes);
        :class:`Moved` when the table is no longer at ``since`` (None: not checked)."""
        loaded = self.iceberg_table(table)
        if since is not None:
            _still_at(since, position_of(loaded))
        loaded.newAppend().set(LSN_PROPERTY, str(lsn)).commit()

    def expect(self, table: str, since: int | None) -> None:
        """:class:`Moved` unless the table, as the catalog has it now, is at ``since`` (one
        request: the table is refreshed, for whatever reads it next)."""
        _still_at(since, self.lsn(table))

    def lsn(self, table: str) -> int | None:
        return position_of(self.iceberg_table(table))

    def evolve(self, table: str, add: list[tuple[str, IcebergType]],
               promote: list[tuple[str, IcebergType]] | None = None,
               backfill: dict[str, str] | None = None,
               properties: dict[str, str] | None = None,
               renames: list[tuple[str, str]] | None = None) -> None:
        """Rename columns (in order), add optional columns and promote types, in one commit;
        what is already done is skipped (a rename whose old name is gone). ``backfill`` (column
        → PostgreSQL text value: what every existing row has in the source) is recorded in the
        same commit, as :data:`BACKFILL_PROPERTY`, and so are ``properties``."""
        loaded = self.iceberg_table(table)
        current = self.load(table)
        assert current is not None  # _table just loaded it (it raises for a missing table)
        state = dict(current.data_columns())
        todo_renames = []
        for old, new in renames or []:
            if old in state and new not in state:
                state[new] = state.pop(old)
                todo_renames.append((old, new))
        add = [(n, t) for n, t in add if n not in state]
        promote = [(n, t) for n, t in promote or [] if str(state.get(n)) != str(t)]
        values = dict(properties or {})
        added = {name for name, _ in add}
        backfill = {k: v for k, v in (backfill or {}).items() if k in added}
        if backfill:
            values[BACKFILL_PROPERTY] = json.dumps(backfill)
        if not add and not promote and not todo_renames and all(
                current.properties.get(k) == v for k, v in values.items()):
            return
        transaction = loaded.newTransaction()
        for old, new in todo_renames:  # one update each: a swap goes through a third name
            transaction.updateSchema().renameColumn(old, new).commit()
        if add or promote:
            update = transaction.updateSchema()
            for name, iceberg in add:
                update.addColumn(name, self._java_type(iceberg))
            for name, iceberg in promote:
                update.updateColumn(name, self._java_type(iceberg))
            update.commit()
        if values:
            update_properties = transaction.updateProperties()
            for key, value in values.items():
                update_properties.set(key, value)
            update_properties.commit()
        transaction.commitTransaction()

    def _java_type(self, iceberg: IcebergType):
        types = self._jvm.org.apache.iceberg.types.Types
        if isinstance(iceberg, ListType):
            # field ids of a new nested type are reassigned by the schema update
            return types.ListType.ofOptional(0, self._java_type(iceberg.element_type))
        return types.fromPrimitiveString(str(iceberg))

    def set_properties(self, table: str, values: dict[str, str], remove: tuple[str, ...] = ()) -> None:
        update = self.iceberg_table(table).updateProperties()
        for key, value in values.items():
            update.set(key, value)
        for key in remove:
            update.remove(key)
        update.commit()

    def record_error(self, table: str, message: str, lsn: int | None, resnapshot: bool,
                     automatic: bool = False, retry: tuple[float, int] | None = None) -> None:
        """Record a definite error (``resnapshot``: the way out is a re-snapshot) or, with
        ``retry`` = (when, failures in a row), a retryable one (:mod:`lakeslot.apply.isolation`)."""
        values = {ERROR_PROPERTY: message, ERROR_LSN_PROPERTY: str(lsn)}
        if resnapshot:
            values[RESNAPSHOT_PROPERTY] = RESNAPSHOT_AUTOMATIC if automatic else "true"
        if retry is not None:
            values[RETRY_AT_PROPERTY], values[FAILURES_PROPERTY] = f"{retry[0]:.3f}", str(retry[1])
        self.set_properties(table, values, tuple(k for k in ERROR_PROPERTIES
                                                 if k not in values and k != ERROR_PROPERTY))

    def clear_error(self, table: str) -> None:
        self.set_properties(table, {}, ERROR_PROPERTIES)

    def expire_snapshots(self, table: str, default_age_s: float,
                         tags: Mapping[str, int] | None = None, tag_age_s: float = 0.0) -> None:
        """Expire old snapshots (and delete the files only they referenced) by the table's own
        history.expire.* settings; snapshots older than ``default_age_s`` when the table sets no
        maximum age. ``tags`` (name → snapshot id) are set first, each kept ``tag_age_s`` from
        its snapshot's commit (a snapshot already expired, or a tag already set, is skipped):
        expiry keeps tagged snapshots. Iceberg's Java action on the driver, not the Spark
        procedure: for the few hundred snapshots a mirror keeps it costs milliseconds where the
        procedure's Spark jobs cost seconds (measured 1-3 s on 2 cores), a stall in the pass's
        freshness. It reads the manifest lists and deletes the files on :meth:`_expiry_pool`."""
        loaded = self.iceberg_table(table)
        if tags:
            existing = set(loaded.refs().keySet())
            wanted = {name: snapshot for name, snapshot in tags.items()
                      if name not in existing and loaded.snapshot(snapshot) is not None}
            if wanted:
                manage = loaded.manageSnapshots()
                for name, snapshot in wanted.items():
                    manage = manage.createTag(name, snapshot).setMaxRefAgeMs(
                        name, int(tag_age_s * 1000))
                manage.commit()
        pool = self._expiry_pool()
        expire = loaded.expireSnapshots().planWith(pool).executeDeleteWith(pool)
        if MAX_SNAPSHOT_AGE_PROPERTY not in loaded.properties():
            older = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=default_age_s)
            expire = expire.expireOlderThan(int(older.timestamp() * 1000))
        expire.commit()

    def commit_sql(self, table: str, statement: str, lsn: int) -> None:
        """Run a SQL statement that commits to ``table``, its commit tagged ``lakeslot.lsn``;
        when it commits nothing, advance the table to ``lsn`` with an empty commit."""
        with_commit_properties(self._spark, {LSN_PROPERTY: str(lsn)},
                               lambda: self._spark.sql(statement))
        if self.lsn(table) != lsn:
            self.advance(table, lsn)

    def exists(self, table: str) -> bool:
        return bool(self._catalog.tableExists(self._identifier(self.namespace, table)))
