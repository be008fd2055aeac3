"""The catalog types lakeslot writes mirrors through (``sink.catalog.type``): one entry per type,
and everything else about a type is derived from it — the API's rules (which settings a type
needs), the Spark catalog settings (:func:`lakeslot.mirror.catalogs.spark_conf`), the pyiceberg
catalog lakeslot reads with (:func:`lakeslot.mirror.catalogs.pyiceberg_properties`) and whether
names are stored case-insensitively (preflight).

Invariants:

- :data:`CATALOG_TYPES` has exactly the names of :data:`lakeslot.api.models.CatalogType` (a
  ``Literal``, so that the CRD's enum and the type checker see them; tests/test_api_models.py
  ties the two), and every type has both translations: Spark settings and a pyiceberg reading.
- A type whose catalog commits by renaming a metadata file (``renames_metadata``: hadoop) is
  refused a warehouse on an object store, where no rename is atomic.

Adding a type: an entry here and its name in ``CatalogType``; then ``lakeslot crd --write``
(the CRD's enum and rules) and a test of both translations (docs/development.md, "Adding a
catalog type").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogKind:
    """What lakeslot knows about one catalog type."""

    needs_uri: bool  # sink.catalog.uri is required (the catalog's endpoint)
    needs_warehouse: bool  # sink.catalog.warehouse is required
    spark: Mapping[str, str]  # Iceberg's SparkCatalog settings that select the type (and its
    # defaults; sink.catalog.properties win)
    # how pyiceberg opens it: load_catalog's "type", or None: read the table's files in the
    # warehouse (a hadoop catalog, which pyiceberg has no catalog for)
    pyiceberg: str | None
    folds_case: bool = False  # the metastore stores table and column names lower-cased
    renames_metadata: bool = False  # commits by renaming a metadata file (no object store)
    warehouse_path: bool = False  # the warehouse may be a local path (given to Spark as a file:// URI)


CATALOG_TYPES: Mapping[str, CatalogKind] = {
    "hadoop": CatalogKind(needs_uri=False, needs_warehouse=True, spark={"type": "hadoop"},
                          pyiceberg=None, renames_metadata=True, warehouse_path=True),
    # (a commit's and a scan's metrics report is a request of its own, on the committing thread,
    # after the commit: off unless the properties turn it on)
    "rest": CatalogKind(needs_uri=True, needs_warehouse=False,
                        spark={"type": "rest", "rest-metrics-reporting-enabled": "false"},
                        pyiceberg="rest"),
    # pyiceberg's SQL catalog reads the tables Iceberg's Java JdbcCatalog keeps (its JDBC URL
    # and jdbc.* options translated: lakeslot.mirror.catalogs.sql_catalog_uri)
    "jdbc": CatalogKind(needs_uri=True, needs_warehouse=False,
                        spark={"catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog"}, pyiceberg="sql"),
    "glue": CatalogKind(needs_uri=False, needs_warehouse=True,
                        spark={"catalog-impl": "org.apache.iceberg.aws.glue.GlueCatalog",
                               "io-impl": "org.apache.iceberg.aws.s3.S3FileIO"},
                        pyiceberg="glue", folds_case=True),
    "hive": CatalogKind(needs_uri=True, needs_warehouse=False, spark={"type": "hive"},
                        pyiceberg="hive", folds_case=True),
}


def needing(attribute: str) -> tuple[str, ...]:
    """The types for which ``attribute`` of :class:`CatalogKind` is true, in registry order."""
    return tuple(name for name, kind in CATALOG_TYPES.items() if getattr(kind, attribute))


def listed(names: tuple[str, ...]) -> str:
    """``a, b and c``: types named in a message."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def cel_type_in(names: tuple[str, ...]) -> str:
    """A CEL condition on the catalog object: its type is one of ``names``."""
    return f"self.type in [{', '.join(repr(n) for n in names)}]"
