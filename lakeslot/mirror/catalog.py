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

Failure modes: :func:`load_table` returns None for a table that does not exist; a catalog or
warehouse that refuses or cannot be reached raises :class:`CatalogAccessError` naming the setting to
fix (REST: refused credentials, 401, 403, 404, no connection; the object store: refused keys, a
missing bucket, an unreachable endpoint), else the library's error; callers report it as a
condition. A SeaweedFS REST catalog answers an unknown warehouse like a missing table.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pyiceberg.exceptions import (
    ForbiddenError,
    NoSuchTableError,
    OAuthError,
    RESTError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from pyiceberg.io import load_file_io
from pyiceberg.table import StaticTable, Table

from lakeslot.api.models import CatalogSpec
from lakeslot.filesystems import explain

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


class CatalogAccessError(RuntimeError):
    """The catalog or the warehouse's storage refused or could not be reached; the message says
    which setting to fix."""


def load_table(catalog: CatalogSpec, ident: tuple[str, ...],
               secrets: Mapping[str, str] | None = None) -> Table | None:
    """The current state of a mirror table, or None when it does not exist."""
    options = pyiceberg_properties(catalog, secrets or {})
    try:
        if catalog.type == "hadoop":
            assert catalog.warehouse is not None  # the API requires it for hadoop catalogs
            return load_hadoop_table(catalog.warehouse, ident, options)
        from pyiceberg.catalog import load_catalog

        return load_catalog(catalog.name, **options).load_table(ident)
    except NoSuchTableError:
        return None
    except Exception as e:  # re-raised, explained where a setting is to blame
        if (message := explain_error(catalog, e)) is None:
            raise
        raise CatalogAccessError(message) from e


def explain_error(catalog: CatalogSpec, error: BaseException) -> str | None:
    """What a failure to read ``catalog`` means and which setting fixes it, or None."""
    uri, secret_keys = catalog.uri, ", ".join(sorted(catalog.secret_properties)) or "none set"
    credentials = f"sink.catalog.secretProperties ({secret_keys}: credential, token)"
    if isinstance(error, OAuthError):
        return (f"the catalog at {uri} refused the OAuth2 client credentials ({error}): fix the "
                f"credential (client id:secret) in {credentials}")
    if isinstance(error, UnauthorizedError):
        return (f"the catalog at {uri} answered 401 Unauthorized ({error}): set a valid credential or "
                f"token in {credentials}")
    if isinstance(error, ForbiddenError):
        return (f"the catalog at {uri} answered 403 Forbidden ({error}): grant the principal of "
                f"{credentials} access to warehouse {catalog.warehouse!r}, or fix the credential")
    if isinstance(error, RESTError) and ("NotFound" in str(error) or "404" in str(error)):
        return (f"sink.catalog.uri {uri} answered 404 ({error}): it is not an Iceberg REST catalog's "
                "base URI (the path before /v1/…); fix sink.catalog.uri")
    if isinstance(error, ServiceUnavailableError) or type(error).__name__ in ("ConnectionError", "ConnectTimeout"):
        return f"sink.catalog.uri {uri} cannot be reached ({type(error).__name__}): fix sink.catalog.uri"
    if isinstance(error, OSError):
        return explain(catalog.warehouse or "", error,
                       "sink.catalog.warehouse" if catalog.type == "hadoop" else
                       "the warehouse's object store (sink.catalog.properties s3.*, secretProperties)")
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
