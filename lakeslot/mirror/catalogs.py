"""``sink.catalog`` translated for both readers of the mirror tables, side by side: Spark's
Iceberg ``SparkCatalog`` (the jobs) and pyiceberg (the operator, ``lakeslot status`` and
``lakeslot verify``, which read without a JVM).

Invariants:

- Both translations take the same spec and the same Secret-backed values (``secretProperties``,
  resolved by the caller: from the environment in jobs and local mode, from Kubernetes Secrets in
  the operator) and give the catalog the same properties.
- Secret values are never part of the static Spark conf (:func:`spark_conf`, which the operator
  writes into SparkApplications): the jobs set them on the running session
  (:func:`spark_secret_conf`), before the catalog's first use loads it.
- A hadoop catalog is read by pyiceberg from its metadata files (``version-hint.text`` names the
  current ``v<N>.metadata.json``): pyiceberg has no hadoop catalog, and cannot write one.

Failure modes: :func:`load_table` returns None for a table that does not exist; an unreachable
catalog or warehouse raises the library's error (callers report it as a condition).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import load_file_io
from pyiceberg.table import StaticTable, Table

from lakeslot.api.models import CatalogSpec

# How each sink.catalog.type is configured in Iceberg's SparkCatalog.
CATALOG_IMPLEMENTATIONS: dict[str, dict[str, str]] = {
    "hadoop": {"type": "hadoop"},
    "hive": {"type": "hive"},
    "rest": {"type": "rest"},
    "jdbc": {"catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog"},
    "glue": {"catalog-impl": "org.apache.iceberg.aws.glue.GlueCatalog",
             "io-impl": "org.apache.iceberg.aws.s3.S3FileIO"},
}


# Catalog types whose metastore stores table and column names case-insensitively (lower-cased):
# a table with columns that differ only in case cannot be mirrored there (preflight says so).
FOLDING_CATALOGS = ("glue", "hive")


def folding(catalog: CatalogSpec) -> str | None:
    """``catalog``'s type when it folds the case of names (:data:`FOLDING_CATALOGS`), else None."""
    return catalog.type if catalog.type in FOLDING_CATALOGS else None


def warehouse_uri(warehouse: str | Path) -> str:
    """A URI for the warehouse: URIs (``s3a://…``, ``file:/…``) unchanged, local paths made
    absolute ``file://`` URIs."""
    if isinstance(warehouse, str) and ":/" in warehouse:
        return warehouse
    return Path(warehouse).resolve().as_uri()


def hadoop_catalog(warehouse: str | Path, name: str = "lakeslot") -> CatalogSpec:
    return CatalogSpec(name=name, type="hadoop", warehouse=str(warehouse))


# Spark ---------------------------------------------------------------------------------------

def spark_conf(catalog: CatalogSpec) -> dict[str, str]:
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


def spark_secret_conf(catalog: CatalogSpec, secrets: Mapping[str, str]) -> dict[str, str]:
    """The Secret-backed properties (``secrets``: key → value) as runtime session conf."""
    return {f"spark.sql.catalog.{catalog.name}.{key}": value for key, value in secrets.items()}


# pyiceberg -----------------------------------------------------------------------------------

def pyiceberg_properties(catalog: CatalogSpec, secrets: Mapping[str, str]) -> dict[str, str]:
    """``load_catalog`` options for ``sink.catalog`` (the FileIO properties of a hadoop one)."""
    options = {**catalog.properties, **secrets}
    if catalog.type != "hadoop":
        options["type"] = catalog.type
        options.update({k: v for k, v in (("uri", catalog.uri), ("warehouse", catalog.warehouse))
                        if v})
    return options


def load_table(catalog: CatalogSpec, ident: tuple[str, ...],
               secrets: Mapping[str, str] | None = None) -> Table | None:
    """The current state of a mirror table, or None when it does not exist."""
    options = pyiceberg_properties(catalog, secrets or {})
    if catalog.type == "hadoop":
        assert catalog.warehouse is not None  # the API requires it for hadoop catalogs
        return load_hadoop_table(catalog.warehouse, ident, options)
    from pyiceberg.catalog import load_catalog

    try:
        return load_catalog(catalog.name, **options).load_table(ident)
    except NoSuchTableError:
        return None


def load_hadoop_table(warehouse: str, ident: tuple[str, ...],
                      properties: Mapping[str, str] | None = None) -> Table | None:
    """The current state of a hadoop-catalog table, or None when it does not exist."""
    location = "/".join([warehouse.rstrip("/"), *ident])
    io = load_file_io(dict(properties or {}), location)
    hint = io.new_input(f"{location}/metadata/version-hint.text")
    if not hint.exists():
        return None
    with hint.open() as f:
        version = int(f.read().decode().strip())
    return StaticTable.from_metadata(f"{location}/metadata/v{version}.metadata.json",
                                     dict(properties or {}))
