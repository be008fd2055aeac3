"""Spark sessions with an Iceberg catalog, and Iceberg commit properties for SQL statements.

Invariants:

- The conf comes from :mod:`lakeslot.spark.conf` (pure, shared with the operator's
  SparkApplications). Catalog properties that come from Secrets are never in it: a job's driver
  adds them from its environment as it starts its session (:func:`job_session`), so that they
  are in the SparkConf. Spark copies every session setting into the properties of each job a SQL
  statement runs, and its event log redacts only those of the SparkConf: a setting made on the
  running session is written there in clear when ``spark.eventLog.enabled``.
- ``build_session`` adds the local-mode settings and the jars from ``jars.ensure_jars()``
  (``spark.jars``; the JDBC driver also on the driver's system class path, where
  ``DriverManager`` finds it whichever thread uses it first) and, where they can be built,
  lakeslot's Java helpers (:mod:`lakeslot.spark.helpers`): the local file system that does not
  spawn ``chmod`` per file, the row delta's commit.
  It must create the process's SparkSession: like ``getOrCreate`` it would reuse a running one,
  on which the static settings (jars, extensions, JVM options) no longer take effect.
- py4j's replies are not held back (:func:`no_delay`): every session built here turns Nagle's
  algorithm off on the JVM's end of py4j's connections, those of threads to come included.
- ``with_commit_properties`` sets Iceberg snapshot summary properties on every Iceberg commit made
  by ``action`` on the calling thread (the only way to tag a SQL ``MERGE`` commit in Spark 3.5,
  which has no DataFrame merge API). It relies on PySpark's pinned-thread mode (the default): the
  JVM thread that calls back into Python is the one that runs ``action``'s SQL.

Failure modes: ``build_session`` raises ``jars.JarProvisioningError`` when the jars cannot be
provided and PySpark's errors when Java is missing or the JVM does not start.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar

from pyspark.java_gateway import ensure_callback_server_started
from pyspark.sql import SparkSession

from lakeslot.api.models import CatalogSpec
from lakeslot.mirror import catalogs
from lakeslot.spark import helpers, jars
from lakeslot.spark.conf import iceberg_conf
from lakeslot.spark.jvm import java

if TYPE_CHECKING:
    from lakeslot.workloads import JobInput

log = logging.getLogger(__name__)
T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
CLASS_PATH = "spark.driver.extraClassPath"

def build_session(
    warehouse: str | Path | CatalogSpec,
    *,
    app_name: str = "lakeslot",
    master: str = "local[2]",
    catalog: str = "lakeslot",
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession with an Iceberg catalog: ``warehouse`` is a ``sink.catalog`` spec, or a
    hadoop warehouse for a catalog named ``catalog`` (``extra_conf`` wins on conflicts)."""
    spec = warehouse if isinstance(warehouse, CatalogSpec) else catalogs.hadoop_catalog(warehouse, catalog)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    jar_paths = jars.ensure_jars()
    built = helpers.ensure_built()
    if built is not None:
        jar_paths = [*jar_paths, built.iceberg]
    conf = {
        **iceberg_conf(spec, jars=jar_paths),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "1g",
        **({helpers.FS_IMPL: helpers.FS_CLASS} if built else {}),
        **(extra_conf or {}),
    }
    # the JDBC driver (jars.system_class_path says why) and the helpers (Hadoop loads the file
    # system from there) on the system class path, after what ``extra_conf`` puts there
    if system_jars := [*jars.system_class_path(jar_paths), *([built.system] if built else [])]:
        conf[CLASS_PATH] = os.pathsep.join([*filter(None, [conf.get(CLASS_PATH)]), *map(str, system_jars)])
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    no_delay(session)
    return session


def job_session(job: JobInput, app_name: str, *, master: str | None = None) -> SparkSession:
    """The session of a Spark job: spark-submit's (the SparkApplication carries the Iceberg conf
    and ``spec.spark.sparkConf``) or, with ``master``, a local one built from ``sink.catalog``
    with ``spec.spark.sparkConf`` on top of the local defaults (the keys lakeslot sets itself are
    refused by the spec's validation, so they cannot be overridden); either way with the catalog's
    Secret-backed properties from the environment in its SparkConf."""
    spec = job.ingestion.spec
    catalog = spec.sink.catalog
    secrets = catalogs.spark_secret_conf(catalog, job.catalog_secrets())
    if master is not None:
        return build_session(catalog, app_name=app_name, master=master,
                             extra_conf={**spec.spark.spark_conf, **secrets})
    builder = SparkSession.builder.appName(app_name)
    for key, value in secrets.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    no_delay(session)
    return session


def iceberg_actions(spark: SparkSession):
    """Iceberg's Spark actions (``SparkActions``) on ``spark``; run them with :func:`execute`."""
    return java(_jvm(spark), "org.apache.iceberg.spark.actions.SparkActions.get")(spark._jsparkSession)


def _jvm(spark: SparkSession):
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # set while the SparkContext runs (spark is a live session)
    return jvm


def make_active(spark: SparkSession) -> None:
    """Make ``spark`` the active session of the calling JVM thread. Spark resolves catalogs
    through the active session's conf: on a JVM thread without one (a Python thread other than
    the one that built the session; and now and then the apply job's own thread, whose session
    it had set) loading a catalog fails ("spark.sql.catalog.<name> is not defined")."""
    # (resolved once: written out, the name cost a round trip per part, per table of a pass)
    java(_jvm(spark), "org.apache.spark.sql.SparkSession.setActiveSession")(spark._jsparkSession)


def on_threads(spark, threads: int, items: Sequence[K], work: Callable[[K], V], name: str) -> dict[K, V]:
    """``work`` for each of ``items``, on up to ``threads`` threads named ``name`` of the Spark
    application ``spark`` (its session made each thread's active one as the thread starts), in
    ``items``' order — one after the other with one thread or fewer than two items. An error is
    raised once the items in flight are done."""
    if threads == 1 or len(items) < 2:
        return {item: work(item) for item in items}
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix=name,
                            initializer=make_active, initargs=(spark,)) as pool:
        futures = {item: pool.submit(work, item) for item in items}
    return {item: future.result() for item, future in futures.items()}


def no_delay(spark: SparkSession) -> None:
    """Turn Nagle's algorithm off on the JVM's end of py4j's connections, those open and those
    to come (each Python thread that talks to the JVM has one), once per JVM: lakeslot's
    ``NoDelay`` (:mod:`lakeslot.spark.helpers`) listens to py4j's server. py4j writes a reply
    larger than its 8 KB buffer in two writes; with Nagle on, the second waits for the first's
    acknowledgement, which the Python end delays by up to 40 ms: a 10 KB reply (a manifest, a
    table's properties, a wide schema) took 45 ms, and 5 ms with it off. py4j offers no setting;
    without the helpers (no JDK) or with another py4j, replies are only slower."""
    jvm = _jvm(spark)
    listener = helpers.loaded(jvm, helpers.NO_DELAY)
    if listener is None:
        return
    try:
        listener.install(spark.sparkContext._gateway.java_gateway_server)  # type: ignore[union-attr]
    except Exception as e:  # noqa: BLE001 - only a matter of speed
        log.info("py4j's connections keep Nagle's algorithm: %s", e)


def each(iterable):
    """The elements of a Java ``Iterable`` (py4j does not iterate those)."""
    iterator = iterable.iterator()
    while iterator.hasNext():
        yield iterator.next()


def execute(spark: SparkSession, action):
    """``action.execute()`` (an Iceberg Spark action) with ``spark`` active (:func:`make_active`).
    Iceberg's rewrite reads each file group on a thread that inherits the caller's active
    session, through a catalog it registers in that session's conf: without one, every
    compaction failed with "Catalog 'default_cache_iceberg' plugin class not found" for as long
    as that lasted (seen in the apply job)."""
    make_active(spark)
    return action.execute()


def with_commit_properties(spark: SparkSession, properties: Mapping[str, str], action: Callable[[], T]) -> T:
    """Run ``action`` inside Iceberg's ``CommitMetadata.withCommitProperties``: its commits carry ``properties``.

    ``action``'s own exception (if any) is re-raised unchanged after the properties are cleared.
    """
    ensure_callback_server_started(spark.sparkContext._gateway)
    results: list[T] = []  # action's result, once it returned
    errors: list[BaseException] = []  # or what it raised

    class _Callable:
        def call(self) -> None:
            try:
                results.append(action())
            except BaseException as e:  # noqa: BLE001 - handed back to the caller below
                errors.append(e)

        class Java:
            implements: ClassVar[list[str]] = ["java.util.concurrent.Callable"]

    jvm = _jvm(spark)
    props = java(jvm, "java.util.HashMap")()
    for key, value in properties.items():
        props.put(key, value)
    java(jvm, "org.apache.iceberg.spark.CommitMetadata.withCommitProperties")(
        props, _Callable(), java(jvm, "java.lang.Class.forName")("java.lang.Exception"))
    if errors:
        raise errors[0]
    return results[0]


def error_summary(e: BaseException) -> str:
    """The first meaningful line of an error, Java stack frames left out (a py4j error's text is
    the Java exception and its whole stack)."""
    lines = [line.removeprefix(": ") for line in str(e).strip().splitlines()
             if line.strip() and not line.startswith(("\tat ", "An error occurred while calling"))]
    return (lines[0] if lines else repr(e))[:500]
