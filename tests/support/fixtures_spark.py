"""Spark fixtures: one SparkSession with an Iceberg hadoop catalog for the whole test session.

- ``spark_warehouse``: the catalog's warehouse directory (session-scoped temp dir).
- ``spark``: the SparkSession (catalog ``lakeslot`` on ``spark_warehouse``), stopped at the end.
  It is skipped, with the reason, when Java or the Iceberg jars are unavailable; any other failure
  to start Spark is an error.
- ``iceberg_namespace``: a fresh namespace per test, given qualified (``lakeslot.ns_<hex>``) so
  tests never collide. Namespaces are not dropped: the warehouse is a temp dir kept for debugging.
- ``static_table(warehouse, table)``: the current state of a table read with pyiceberg, independent
  of Spark (pyiceberg cannot write to a hadoop catalog, but reads it from the metadata files).

PySpark and pyiceberg are imported inside the fixtures: this plugin is loaded by every test session
and should not cost ~0.5 s of imports to sessions that never touch Spark.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakeslot.spark import jars

CATALOG = "lakeslot"


@pytest.fixture(scope="session")
def spark_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("warehouse")


@pytest.fixture(scope="session")
def spark(spark_warehouse: Path) -> Iterator:
    if shutil.which("java") is None:
        pytest.skip("Spark unavailable: java not found on PATH (apt-get install openjdk-17-jre-headless)")
    try:
        jars.ensure_jars()
    except jars.JarProvisioningError as e:
        pytest.skip(f"Spark unavailable: Iceberg jars: {e}")
    from lakeslot.spark.session import build_session

    session = build_session(spark_warehouse, app_name="lakeslot-tests", catalog=CATALOG)
    yield session
    session.stop()


@pytest.fixture
def iceberg_namespace(spark) -> str:
    namespace = f"{CATALOG}.ns_{uuid.uuid4().hex[:12]}"
    spark.sql(f"CREATE NAMESPACE {namespace}")
    return namespace


def static_table(warehouse: Path, table: str):
    """The latest committed state of ``catalog.namespace.table`` as a pyiceberg ``StaticTable``."""
    from lakeslot.mirror.catalogs import load_hadoop_table

    _catalog, namespace, name = table.split(".")
    return load_hadoop_table(warehouse.as_uri(), (namespace, name))
