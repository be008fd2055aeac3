"""Spark conf for Iceberg: pure functions shared by local sessions and the operator's
SparkApplications (no PySpark import, so the operator stays light).

Invariants: the same arguments give the same dict. ``iceberg_conf`` enables Iceberg's SQL
extensions, defines one catalog (``sink.catalog``, translated by
:func:`lakeslot.mirror.catalogs.spark_conf`), runs the session and the driver/executor JVMs in
UTC, starts Python workers through :mod:`lakeslot.spark.daemon` (a cheaper task start), and lets
a join build a hash table of its small side instead of sorting both (the apply job's MERGE).
Names resolve case-sensitively (``spark.sql.caseSensitive``): PostgreSQL and Iceberg both tell
``Id``, ``id`` and ``ID`` apart, and Spark's default (case-insensitive) would make a MERGE over
such a table fail with ``AMBIGUOUS_REFERENCE`` — or, with two tables whose names differ only in
case, resolve one to the other. It is not a tuning default: ``sparkConf`` cannot turn it off.
Secret-backed catalog properties are never part of it (a job's driver adds them to its session's
conf, :func:`lakeslot.spark.session.job_session`), and Spark is told to hide them: their keys are
redacted (``spark.redaction.regex``: Spark's own pattern and each key, :func:`redaction_regex`) —
Spark records a SQL statement's session settings in its event log and in the line it logs about a
slow event listener, redacting only keys or values that match that pattern, which ``credential``
(a REST catalog's OAuth2 client credentials) and ``s3.access-key-id`` do not (seen in a job's
output) — and slow events are not logged (``spark.scheduler.listenerbus.logSlowEvent``): that
line shows a job's properties, every session setting among them, without any redaction (Spark
3.5 redacts only an environment update there). A ``sparkConf`` may set neither (reserved,
:mod:`lakeslot.api.cluster`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from lakeslot.api.cluster import QUIET_SLOW_EVENTS, REDACTION_CONF, SPARK_REDACTION_REGEX, TUNING
from lakeslot.api.models import CatalogSpec
from lakeslot.mirror import catalogs

UTC_JVM_OPTIONS = "-Duser.timezone=UTC"


def iceberg_conf(catalog: CatalogSpec, *, jars: Sequence[str | Path] = ()) -> dict[str, str]:
    """Spark conf for Iceberg with ``catalog`` (``sink.catalog``), all in UTC."""
    conf = {
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        **catalogs.spark_conf(catalog),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.caseSensitive": "true",
        "spark.driver.extraJavaOptions": UTC_JVM_OPTIONS,
        "spark.executor.extraJavaOptions": UTC_JVM_OPTIONS,
        REDACTION_CONF: redaction_regex(catalog),
        **QUIET_SLOW_EVENTS,
        **TUNING,
    }
    if jars:
        conf["spark.jars"] = ",".join(str(j) for j in jars)
    return conf


def redaction_regex(catalog: CatalogSpec) -> str:
    """Spark's redaction pattern, extended by the session conf keys of ``catalog``'s Secret-backed
    properties."""
    keys = catalogs.spark_secret_conf(catalog, dict.fromkeys(catalog.secret_properties, ""))
    return "|".join([SPARK_REDACTION_REGEX, *(re.escape(key) for key in sorted(keys))])
