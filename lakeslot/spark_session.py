"""Spark sessions with an Iceberg catalog, and Iceberg commit properties for SQL statements.

Invariants:

- ``iceberg_conf`` is pure: the same arguments give the same dict, usable for a local session and
  for a SparkApplication spec alike. It enables Iceberg's SQL extensions, defines one hadoop
  catalog on the warehouse, and runs the session and the driver/executor JVMs in UTC.
- ``build_session`` adds the local-mode settings and the jars from ``iceberg_jars.ensure_jars()``.
  It must create the process's SparkSession: like ``getOrCreate`` it would reuse a running one,
  on which the static settings (jars, extensions, JVM options) no longer take effect.
- ``with_commit_properties`` sets Iceberg snapshot summary properties on every Iceberg commit made
  by ``action`` on the calling thread (the only way to tag a SQL ``MERGE`` commit in Spark 3.5,
  which has no DataFrame merge API). It relies on PySpark's pinned-thread mode (the default): the
  JVM thread that calls back into Python is the one that runs ``action``'s SQL.

Failure modes: ``build_session`` raises ``iceberg_jars.JarProvisioningError`` when the jars cannot be
provided and PySpark's errors when Java is missing or the JVM does not start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from pyspark.java_gateway import ensure_callback_server_started
from pyspark.sql import SparkSession

from lakeslot import iceberg_jars

T = TypeVar("T")

UTC_JVM_OPTIONS = "-Duser.timezone=UTC"


def warehouse_uri(warehouse: str | Path) -> str:
    """A URI for the warehouse: URIs (``s3a://…``, ``file:/…``) unchanged, local paths made absolute ``file://`` URIs."""
    if isinstance(warehouse, str) and ":/" in warehouse:
        return warehouse
    return Path(warehouse).resolve().as_uri()


def iceberg_conf(warehouse: str | Path, *, catalog: str = "lakeslot", jars: Sequence[str | Path] = ()) -> dict[str, str]:
    """Spark conf for Iceberg with a hadoop catalog named ``catalog`` on ``warehouse``, all in UTC."""
    conf = {
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        f"spark.sql.catalog.{catalog}": "org.apache.iceberg.spark.SparkCatalog",
        f"spark.sql.catalog.{catalog}.type": "hadoop",
        f"spark.sql.catalog.{catalog}.warehouse": warehouse_uri(warehouse),
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": UTC_JVM_OPTIONS,
        "spark.executor.extraJavaOptions": UTC_JVM_OPTIONS,
    }
    if jars:
        conf["spark.jars"] = ",".join(str(j) for j in jars)
    return conf


def build_session(
    warehouse: str | Path,
    *,
    app_name: str = "lakeslot",
    master: str = "local[2]",
    catalog: str = "lakeslot",
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession with the Iceberg catalog ``catalog`` on ``warehouse`` (``extra_conf`` wins on conflicts)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = {
        **iceberg_conf(warehouse, catalog=catalog, jars=iceberg_jars.ensure_jars()),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "1g",
        **(extra_conf or {}),
    }
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def with_commit_properties(spark: SparkSession, properties: Mapping[str, str], action: Callable[[], T]) -> T:
    """Run ``action`` inside Iceberg's ``CommitMetadata.withCommitProperties``: its commits carry ``properties``.

    ``action``'s own exception (if any) is re-raised unchanged after the properties are cleared.
    """
    ensure_callback_server_started(spark.sparkContext._gateway)
    outcome: dict[str, object] = {}

    class _Callable:
        def call(self) -> None:
            try:
                outcome["result"] = action()
            except BaseException as e:  # noqa: BLE001 - handed back to the caller below
                outcome["error"] = e

        class Java:
            implements = ["java.util.concurrent.Callable"]

    jvm = spark.sparkContext._jvm
    props = jvm.java.util.HashMap()
    for key, value in properties.items():
        props.put(key, value)
    jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(
        props, _Callable(), jvm.java.lang.Class.forName("java.lang.Exception")
    )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
