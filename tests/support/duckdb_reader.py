"""DuckDB as a reader of the mirrors, the way an analyst points it at them (docs/reading-mirrors.md).

- :func:`connect`: an in-memory DuckDB with the ``iceberg``, ``avro`` and ``httpfs`` extensions
  loaded from their PyPI packages (``duckdb-extension-*``, the same version as ``duckdb``, pinned
  in pyproject's test extras), so that nothing is downloaded. Skips the test, with the reason, when
  they are not installed.
- :func:`hadoop_rows`: a hadoop-layout table read with ``iceberg_scan('<table directory>')``
  (DuckDB follows ``metadata/version-hint.text``).
- :func:`attach_rest`: the object store's REST catalog attached with OAuth2 client credentials, the
  data files read from S3 with an S3 secret (SeaweedFS vends no credentials: access delegation
  ``none``).
- :func:`catalog_rows`: a table of the attached catalog.
- :func:`assert_rows_equal`: every row and column of a source table equals DuckDB's reading,
  compared the way tests/support/apply_support.py compares pyiceberg's (:func:`normal`).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.local.objectstore import REGION, ObjectStore
from tests.support.apply_support import normal
from tests.support.fixtures_pg import Database

EXTENSIONS = ("avro", "iceberg", "httpfs")  # (avro: Iceberg's manifests)


def connect():
    """An in-memory DuckDB connection with the Iceberg extensions loaded from their packages."""
    try:
        import duckdb
        packages = [importlib.import_module(f"duckdb_extension_{name}") for name in EXTENSIONS]
    except ImportError as e:
        pytest.skip(f"DuckDB unavailable: {e} (pip install -e '.[test]')")
    connection = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    for name, package in zip(EXTENSIONS, packages, strict=True):
        path = Path(package.__path__[0]) / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
        assert path.is_file(), f"{package.__name__} does not match duckdb {duckdb.__version__}: no {path}"
        connection.execute(f"LOAD '{path}'")
    connection.execute("SET TimeZone = 'UTC'")
    return connection


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def hadoop_rows(connection, table_directory: Path, columns: list[str]) -> list[tuple]:
    """``columns`` of every row of the hadoop-layout table in ``table_directory``."""
    select = ", ".join(quoted(c) for c in columns)
    return connection.execute(f"SELECT {select} FROM iceberg_scan(?)", [str(table_directory)]).fetchall()


def attach_rest(connection, store: ObjectStore, warehouse: str, alias: str = "lake") -> None:
    """Attach the object store's REST catalog ``warehouse`` as ``alias``."""
    host = store.s3_endpoint.removeprefix("http://")
    connection.execute("CREATE SECRET lake_s3 (TYPE s3, KEY_ID ?, SECRET ?, ENDPOINT ?, REGION ?, "
                       "URL_STYLE 'path', USE_SSL false)",
                       [store.access_key, store.secret_key, host, REGION])
    connection.execute("CREATE SECRET lake_catalog (TYPE iceberg, CLIENT_ID ?, CLIENT_SECRET ?, "
                       "OAUTH2_SERVER_URI ?)",
                       [store.access_key, store.secret_key, f"{store.rest_uri}/v1/oauth/tokens"])
    connection.execute(f"ATTACH '{warehouse}' AS {quoted(alias)} (TYPE iceberg, SECRET lake_catalog, "
                       f"ENDPOINT '{store.rest_uri}', ACCESS_DELEGATION_MODE 'none')")


def catalog_rows(connection, alias: str, identifier: tuple[str, ...], columns: list[str]) -> list[tuple]:
    """``columns`` of every row of the attached catalog's table ``identifier`` (namespace, name)."""
    select = ", ".join(quoted(c) for c in columns)
    name = ".".join(quoted(p) for p in (alias, *identifier))
    return connection.execute(f"SELECT {select} FROM {name}").fetchall()


def source_rows(pgdb: Database, table: TableName) -> tuple[list[str], list[tuple]]:
    with pgdb.connect() as conn:
        cursor = conn.execute(sql.SQL("SELECT * FROM {}").format(table.sql()))
        assert cursor.description is not None
        return [d.name for d in cursor.description], cursor.fetchall()


def assert_rows_equal(source: list[tuple], read: list[tuple], table: TableName) -> None:
    expected = sorted(tuple(normal(v) for v in row) for row in source)
    mirrored = sorted(tuple(normal(v) for v in row) for row in read)
    assert len(mirrored) == len(expected), (table, len(mirrored), len(expected))
    assert mirrored == expected, table
