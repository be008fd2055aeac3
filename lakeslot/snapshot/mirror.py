"""The Iceberg mirror tables, through the Spark session's Iceberg catalog (Java, via py4j).

A snapshot of a table is ONE Iceberg transaction: ``createTransaction`` when the table does not
exist, ``replaceTransaction`` when it does (a re-snapshot, or an empty table created beforehand).
The transaction sets the schema (:func:`lakeslot.typemap.mirror_schema`: format v2, identifier
fields = the key, ``_lakeslot_lsn``), the table properties, and appends every data file the
followers wrote, with the snapshot summary property ``lakeslot.lsn = s`` (DESIGN invariant 1).
Readers therefore see either the old table (or none) or the complete copy as of ``s``; a job that
dies before the commit leaves nothing behind in the catalog. Works with any catalog type Spark is
configured with, since it goes through Spark's own catalog object.

Which tables are snapshotted (:meth:`Catalog.state`): a table counts as snapshotted at generation
``g`` when its property ``lakeslot.snapshot-generation`` is ``g`` (set in the same commit as the
data), or at generation 0 when its snapshot lineage carries ``lakeslot.lsn`` (a table snapshotted
before the property existed). Table properties survive compaction and snapshot expiry, which a
summary property of the current snapshot does not.

Failure modes: an existing table with data and no lakeslot marks is refused (it is not ours;
replacing it would destroy someone's data); a concurrent commit to the same table makes Iceberg
retry or fail the replace; catalog errors surface as ``py4j`` errors with Iceberg's message.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.schema import Schema

from lakeslot import mirror as progress  # the properties' one definition, read by the operator
from lakeslot.snapshot.follower import WriteOptions

LSN_PROPERTY, SNAPSHOT_LSN_PROPERTY = progress.LSN_PROPERTY, progress.SNAPSHOT_LSN_PROPERTY
GENERATION_PROPERTY = progress.GENERATION_PROPERTY
CODECS = {"uncompressed": "none"}


@dataclass(frozen=True)
class MirrorState:
    exists: bool
    generation: int | None = None  # the snapshot generation, None when never snapshotted
    has_data: bool = False
    snapshot_lsn: int | None = None  # lakeslot.snapshot-lsn: where the last snapshot was taken


class Catalog:
    def __init__(self, spark, name: str) -> None:
        self._spark, self._name = spark, name
        self._gateway = spark.sparkContext._gateway
        self._jvm = spark.sparkContext._jvm
        self._catalog = (spark._jsparkSession.sessionState().catalogManager().catalog(name)
                         .icebergCatalog())

    def _namespace(self, namespace: str):
        levels = namespace.split(".")
        array = self._gateway.new_array(self._jvm.java.lang.String, len(levels))
        for i, level in enumerate(levels):
            array[i] = level
        return self._jvm.org.apache.iceberg.catalog.Namespace.of(array)

    def _identifier(self, namespace: str, table: str):
        return self._jvm.org.apache.iceberg.catalog.TableIdentifier.of(self._namespace(namespace),
                                                                       table)

    def ensure_namespace(self, namespace: str) -> None:
        levels = ".".join(f"`{level.replace('`', '``')}`" for level in namespace.split("."))
        self._spark.sql(f"CREATE NAMESPACE IF NOT EXISTS `{self._name}`.{levels}")

    def state(self, namespace: str, table: str) -> MirrorState:
        ident = self._identifier(namespace, table)
        if not self._catalog.tableExists(ident):
            return MirrorState(False)
        loaded = self._catalog.loadTable(ident)
        current = loaded.currentSnapshot()
        generation = loaded.properties().get(GENERATION_PROPERTY)
        if generation is not None:
            taken = loaded.properties().get(SNAPSHOT_LSN_PROPERTY)
            return MirrorState(True, int(generation), current is not None,
                               int(taken) if taken is not None else None)
        snapshot = current
        while snapshot is not None:
            if snapshot.summary().get(LSN_PROPERTY) is not None:
                return MirrorState(True, 0, True)
            parent = snapshot.parentId()
            snapshot = loaded.snapshot(parent) if parent is not None else None
        return MirrorState(True, None, current is not None)

    def begin(self, namespace: str, table: str, schema: Schema, properties: dict[str, str],
              replace: bool) -> MirrorWrite:
        jvm = self._jvm
        props = jvm.java.util.HashMap()
        for key, value in properties.items():
            props.put(key, value)
        builder = self._catalog.buildTable(
            self._identifier(namespace, table),
            jvm.org.apache.iceberg.SchemaParser.fromJson(schema.model_dump_json()),
        ).withProperties(props)
        return MirrorWrite(jvm, builder.replaceTransaction() if replace
                           else builder.createTransaction())


class MirrorWrite:
    """An open create/replace transaction of one mirror table."""

    def __init__(self, jvm, transaction) -> None:
        self._jvm, self._txn = jvm, transaction
        self._table = transaction.table()

    def schema(self) -> Schema:
        """The schema with the field ids the catalog assigned."""
        return Schema.model_validate_json(self._jvm.org.apache.iceberg.SchemaParser.toJson(
            self._table.schema()))

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

    def commit(self, files: list[str], lsn: int) -> None:
        """Append ``files`` (metrics read from their footers) and commit, tagged ``lakeslot.lsn``."""
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
        append.commit()
        self._txn.commitTransaction()
