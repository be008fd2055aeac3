"""Spark conf for Iceberg: pure functions shared by local sessions and the operator's
SparkApplications (no PySpark import, so the operator stays light).

Invariants: the same arguments give the same dict. ``iceberg_conf`` enables Iceberg's SQL
extensions, defines one catalog (``sink.catalog`` of the spec, or a hadoop catalog on a
warehouse) and runs the session and the driver/executor JVMs in UTC. Secret-backed catalog
properties are never part of it (see ``spark_session.set_catalog_secrets``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lakeslot.api.models import CatalogSpec

UTC_JVM_OPTIONS = "-Duser.timezone=UTC"


def warehouse_uri(warehouse: str | Path) -> str:
    """A URI for the warehouse: URIs (``s3a://…``, ``file:/…``) unchanged, local paths made absolute ``file://`` URIs."""
    if isinstance(warehouse, str) and ":/" in warehouse:
        return warehouse
    return Path(warehouse).resolve().as_uri()


# How each sink.catalog.type is configured in Iceberg's SparkCatalog.
CATALOG_IMPLEMENTATIONS: dict[str, dict[str, str]] = {
    "hadoop": {"type": "hadoop"},
    "hive": {"type": "hive"},
    "rest": {"type": "rest"},
    "jdbc": {"catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog"},
    "glue": {"catalog-impl": "org.apache.iceberg.aws.glue.GlueCatalog",
             "io-impl": "org.apache.iceberg.aws.s3.S3FileIO"},
}


def hadoop_catalog(warehouse: str | Path, name: str = "lakeslot") -> CatalogSpec:
    return CatalogSpec(name=name, type="hadoop", warehouse=str(warehouse))


def catalog_conf(catalog: CatalogSpec) -> dict[str, str]:
    """``spark.sql.catalog.<name>.*`` for ``sink.catalog`` (without its Secret-backed properties)."""
    prefix = f"spark.sql.catalog.{catalog.name}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog"}
    settings = {**CATALOG_IMPLEMENTATIONS[catalog.type], **catalog.properties}
    if catalog.uri:
        settings["uri"] = catalog.uri
    if catalog.warehouse:
        settings["warehouse"] = (warehouse_uri(catalog.warehouse) if catalog.type == "hadoop"
                                 else catalog.warehouse)
    conf.update({f"{prefix}.{key}": value for key, value in settings.items()})
    return conf


def iceberg_conf(catalog: CatalogSpec, *, jars: Sequence[str | Path] = ()) -> dict[str, str]:
    """Spark conf for Iceberg with ``catalog`` (``sink.catalog``), all in UTC."""
    conf = {
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        **catalog_conf(catalog),
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": UTC_JVM_OPTIONS,
        "spark.executor.extraJavaOptions": UTC_JVM_OPTIONS,
    }
    if jars:
        conf["spark.jars"] = ",".join(str(j) for j in jars)
    return conf


