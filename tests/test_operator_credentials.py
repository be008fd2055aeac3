"""The operator in the production configuration, with credentials only where a cluster has them.

S3 staging (SeaweedFS) and an Iceberg REST catalog, or a JDBC catalog whose warehouse is on S3;
the object store's keys, endpoint and region in a Secret that ``spec.secretEnv`` names, the
catalog's in ``secretProperties``. The operator runs in a process of its own whose environment
holds no credential at all (tests/support/operator_process.py), as an operator pod's does: what
it shows — each mirror's applied LSN from the catalog, ``lagSeconds`` from staging, the
freshness alert on its metrics, a verification's result, ``Ready`` — it can only have read with
what it resolved from the ingestion's Secrets.

Simulated, because pods cannot run here: the reader Deployment, the SparkApplications and the
verification Job. Their work runs in the test's process (``lakeslot run`` with the environment the
pods get from ``secretEnv``) or as processes started with the container's environment exactly
(Secret references resolved; nothing of the test's). A Spark session started before the keys
were in the test's environment reads them from the JVM's system properties (``aws.*``), where the
AWS SDK's default chain looks before the environment: that stands in for the pod's variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest
import yaml

from lakeslot import lsn_text
from lakeslot.api.annotations import VERIFY
from lakeslot.api.models import GROUP, PLURAL, VERSION, CatalogSpec
from lakeslot.filesystems import StorageError
from lakeslot.local import config, reader_process
from lakeslot.local.objectstore import STAGING_BUCKET, ObjectStore
from lakeslot.mirror import catalogs
from lakeslot.mirror import progress as mirror_progress
from lakeslot.staging.store import Staging
from tests.support import chart, fixtures_s3, local_support, operator_env, promql
from tests.support.fixtures_pg import Database
from tests.support.operator_process import scrubbed_operator
from tests.support.prometheus import scrape
from tests.support.waiting import wait_for

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

STORAGE_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION")


def _storage_in_secret_env(api, document: dict, store: ObjectStore) -> None:
    """The object store's keys, endpoint and region in the Secret ``s3``, named by secretEnv."""
    operator_env.create_secret(api, "s3", {k: store.environment()[k] for k in STORAGE_VARIABLES})
    document["spec"]["secretEnv"] = [{"name": k, "secretKeyRef": {"name": "s3", "key": k}}
                                     for k in STORAGE_VARIABLES]


@pytest.fixture
def jvm_keys(rest_spark, object_store: ObjectStore) -> Iterator[None]:
    """The object store's keys as the shared JVM's ``aws.*`` system properties (see the module
    docstring), removed afterwards."""
    system = rest_spark.sparkContext._jvm.java.lang.System
    properties = {"aws.accessKeyId": object_store.access_key, "aws.secretAccessKey": object_store.secret_key,
                  "aws.region": "us-east-1"}
    for key, value in properties.items():
        system.setProperty(key, value)
    try:
        yield
    finally:
        for key in properties:
            system.clearProperty(key)


def _status(api, name: str) -> dict:
    return (operator_env.get_ingestion(api, name) or {}).get("status") or {}


def _ready_with_lag(api, name: str, applied: dict[str, str]) -> dict | None:
    """The status once Ready and showing each table at its mirror's LSN with ``lagSeconds``."""
    status = _status(api, name)
    ready: dict = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
    shown = {f"{t['schema']}.{t['name']}": (t.get("appliedLsn"), t.get("lagSeconds"))
             for t in status.get("tables", [])}
    done = ready.get("status") == "True" and {k: v[0] for k, v in shown.items()} == applied \
        and all(v[1] is not None for v in shown.values())
    return status if done else None


def _start_pipeline(api, name: str, local: config.Local, spark, tables) -> dict[str, str]:
    """What the pods would do, run here: the snapshot, streaming and one apply pass (caught up);
    the snapshot application then COMPLETED and the apply one RUNNING, as the spark-operator
    reports them. The mirrors' LSNs by table."""
    wait_for(lambda: f"{name}-reader" in operator_env.deployments(api), "the reader Deployment")
    operator_env.reader_pod_running(api, name, reader_process.pod_identity())
    first, _ = local_support.run_in_process(local, spark, once=True)
    assert first.caught_up, first
    wait_for(lambda: f"{name}-apply" in operator_env.spark_applications(api), "the apply SparkApplication")
    for application in operator_env.spark_applications(api):
        operator_env.set_spark_state(api, application, "RUNNING" if application == f"{name}-apply" else "COMPLETED")
    progress = mirror_progress.read(local.ingestion, tables,
                                    secrets=local.job.catalog_secrets(local.environ))
    assert all(p.lsn is not None for p in progress.values()), progress
    return {str(t): lsn_text.format(p.lsn) for t, p in progress.items() if p.lsn is not None}


def _run_container(api, child: dict, command: list[str], tmp_path: Path, pod: str = "",
                   **popen) -> subprocess.Popen:
    """Simulated kubelet: ``command`` (the child's container's) as a process with the
    container's environment exactly (Secret references resolved) and its job input mounted."""
    template = child["spec"]["template"]["spec"]
    (container,) = template["containers"]
    environ = operator_env.container_environment(api, container, home=tmp_path, pod=pod)
    if "--input" in command:
        command = operator_env.mounted(api, child, command, tmp_path)
    return subprocess.Popen([local_support.LAKESLOT, *command[1:]], env=environ, **popen)


def _rest_ingestion(api, db, store: ObjectStore, tables, tmp_path: Path, monkeypatch, name: str = "s3-rest",
                    **spec: dict) -> tuple[dict, config.Local]:
    """An S3 + REST ingestion of ``tables`` (``spec``: sections merged into its spec), its Secrets
    on the emulator, and the pods' environment for the work done here: the document and the
    local run of it."""
    document = fixtures_s3.ingestion_document(db, f"s3://{STAGING_BUCKET}/{uuid.uuid4().hex[:12]}", tables,
                                              store.catalog_document(), name=name)
    for section, values in spec.items():
        document["spec"][section] = {**document["spec"].get(section, {}), **values}
    _storage_in_secret_env(api, document, store)
    references = document["spec"]["sink"]["catalog"]["secretProperties"]
    operator_env.create_secret(api, "lake-credentials",
                               {ref["key"]: store.catalog_secrets()[key] for key, ref in references.items()})
    path = tmp_path / "ingestion.yaml"
    path.write_text(yaml.safe_dump(document))
    environment = fixtures_s3.run_environment(db, store, store.catalog_secrets())
    for key, value in environment.items():  # the pods' environment, for their work done here
        monkeypatch.setenv(key, value)
    return document, config.load(str(path), state_dir=str(tmp_path / "state"), environ=environment)


@pytest.mark.slow
def test_an_operator_without_credentials_reads_s3_staging_and_a_rest_catalog_with_the_ingestions(
        kube, api, pgdb, rest_spark, object_store, tmp_path, monkeypatch):
    db, store = pgdb, object_store
    with db.connect() as conn:
        tables = local_support.create_accounts_and_items(conn, 300, 50)
    document, local = _rest_ingestion(api, db, store, tables, tmp_path, monkeypatch)
    name = document["metadata"]["name"]

    with scrubbed_operator(kube.url, tmp_path / "operator.log") as metrics:
        operator_env.create_ingestion(api, document, db.cluster.password)
        applied = _start_pipeline(api, name, local, rest_spark, tables)
        status = wait_for(lambda: _ready_with_lag(api, name, applied),
                          "Ready, each mirror's LSN and lagSeconds, read with the ingestion's credentials")
        assert status is not None and {t["lagSeconds"] for t in status["tables"]} == {0}, status

        # A verification: its Job leaves the result in S3 staging, where the operator reads it.
        kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GROUP, VERSION, operator_env.NAMESPACE, PLURAL, name, {"metadata": {"annotations": {VERIFY: "v1"}}})
        job_name = wait_for(lambda: (_status(api, name).get("verification") or {}).get("job"), "the Job")
        assert isinstance(job_name, str)
        job = api.sanitize_for_serialization(kubernetes.client.BatchV1Api(api).read_namespaced_job(
            job_name, operator_env.NAMESPACE))
        (container,) = job["spec"]["template"]["spec"]["containers"]

        def verify() -> tuple[int, str]:  # (a verification needs the pipeline streaming)
            ran = _run_container(api, job, container["command"], tmp_path, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            output, _ = ran.communicate(timeout=300)
            return ran.returncode, output

        _, verified_by_job = local_support.run_in_process(local, rest_spark, once=False, during=verify)
        assert verified_by_job is not None and verified_by_job[0] == 0, verified_by_job
        verified = wait_for(lambda: (v := _status(api, name).get("verification") or {}).get("state") != "Verifying"
                            and v, "the verification's result read from S3 staging")
        assert isinstance(verified, dict) and verified["state"] == "Equal", verified

        # Lag: the source is written, the reader (its container, as the kubelet would run it)
        # stages the change, no apply job runs: lagSeconds rises and the freshness alert fires.
        with db.connect() as conn:
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        deployment = operator_env.deployments(api)[f"{name}-reader"]
        pod = f"{name}-reader-2"
        operator_env.reader_pod_running(api, name, pod)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        with (tmp_path / "reader.log").open("wb") as log:
            reader = _run_container(api, deployment, container["command"], tmp_path, pod=pod,
                                    stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: any((t.get("lagSeconds") or 0) > 1 for t in _status(api, name).get("tables", [])),
                     "lagSeconds above 1 s once the change is staged and not applied")
            alerts = chart.alerts(freshnessSeconds=1)
            labels = frozenset({("namespace", operator_env.NAMESPACE), ("ingestion", name)})
            wait_for(lambda: promql.firing(alerts, "LakeslotFreshnessHigh", scrape(metrics), labels),
                     "the freshness alert's expression true on a scrape of the operator")
        finally:
            local_support.interrupt(reader)
        written = json.dumps([_status(api, name), operator_env.spark_applications(api), operator_env.deployments(api)])
    for secret in (store.secret_key, store.catalog_secrets()["credential"], db.cluster.password):
        assert secret not in written


@pytest.mark.slow
def test_an_operator_without_credentials_reads_a_jdbc_catalog_whose_warehouse_is_on_s3(
        kube, api, pgdb, rest_spark, object_store, jvm_keys, tmp_path, monkeypatch):
    """The issue's case: keys only in ``secretEnv`` (not in the catalog's ``secretProperties``),
    which Java's S3FileIO takes from its environment — and the operator from the Secrets."""
    db, store = pgdb, object_store
    with db.connect() as conn:
        tables = local_support.create_accounts_and_items(conn, 200, 30)
    catalog_name = f"jdbc_{uuid.uuid4().hex[:8]}"  # (a catalog's own database, and a Spark name of its own)
    with db.cluster.connect() as conn:
        conn.execute(f"CREATE DATABASE {catalog_name}")
    catalog = fixtures_s3.jdbc_catalog_document(
        store, catalog_name, f"jdbc:postgresql://{db.cluster.address}:{db.cluster.port}/{catalog_name}",
        db.cluster.superuser, catalog_name)
    catalog["secretProperties"] = {"jdbc.password": {"name": "lake-credentials", "key": "jdbc-password"}}
    document = fixtures_s3.ingestion_document(db, f"s3://{STAGING_BUCKET}/{uuid.uuid4().hex[:12]}", tables,
                                              catalog, name="s3-jdbc")
    name = document["metadata"]["name"]
    _storage_in_secret_env(api, document, store)
    operator_env.create_secret(api, "lake-credentials", {"jdbc-password": db.cluster.password})
    path = tmp_path / "ingestion.yaml"
    path.write_text(yaml.safe_dump(document))
    environment = fixtures_s3.run_environment(db, store, {"jdbc.password": db.cluster.password})
    for key, value in environment.items():  # the pods' environment, for their work done here
        monkeypatch.setenv(key, value)
    local = config.load(str(path), state_dir=str(tmp_path / "state"), environ=environment)
    fixtures_s3.define_catalog(rest_spark, catalog, {"jdbc.password": db.cluster.password})

    with scrubbed_operator(kube.url, tmp_path / "operator.log"):
        operator_env.create_ingestion(api, document, db.cluster.password)
        applied = _start_pipeline(api, name, local, rest_spark, tables)
        status = wait_for(lambda: _ready_with_lag(api, name, applied),
                          "Ready, each mirror's LSN from the JDBC catalog and lagSeconds")
        assert status is not None and {t["lagSeconds"] for t in status["tables"]} == {0}, status
        assert not [c for c in status["conditions"] if c.get("reason") == "CatalogUnreachable"]


@pytest.mark.slow
def test_an_operator_without_credentials_empties_s3_staging_when_a_lost_slot_is_recreated(
        kube, api, pg_cluster_factory, rest_spark, object_store, tmp_path, monkeypatch):
    """``onSlotLost: Resnapshot`` on S3 staging: the slot PostgreSQL 18 invalidates (idle longer
    than ``idle_replication_slot_timeout``) is recreated by the operator only after it emptied
    staging, which it can only do with the ingestion's keys (before: ``StagingUnreachable``)."""
    cluster = pg_cluster_factory.get("pg18", idle_replication_slot_timeout="'1s'")
    db = Database(cluster, f"t_{uuid.uuid4().hex[:12]}")
    cluster.create_database(db.name)
    store = object_store
    with db.connect() as conn:
        tables = [local_support.create_accounts(conn, 100)]
    document, local = _rest_ingestion(  # (applied segments stay in staging: some to empty)
        api, db, store, tables, tmp_path, monkeypatch, name="slot-lost", staging={"retentionSeconds": 3600},
        policies={"onSlotLost": "Resnapshot"})
    name = document["metadata"]["name"]
    staging = Staging(document["spec"]["staging"]["uri"], create=False, environ=store.environment())
    try:
        with scrubbed_operator(kube.url, tmp_path / "operator.log"):
            operator_env.create_ingestion(api, document, db.cluster.password)
            _start_pipeline(api, name, local, rest_spark, tables)
            with db.connect() as conn:
                conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id <= 10")
            local_support.run_in_process(local, rest_spark, once=True)  # streamed, applied, retained
            assert staging.list(), "segments in staging before the slot is lost"

            def recreated() -> str | None:
                with db.connect() as conn:
                    conn.execute("CHECKPOINT")  # (where PostgreSQL invalidates an idle slot)
                return _status(api, name).get("resnapshotBelowLsn")

            below = wait_for(recreated, "the operator to recreate the invalidated slot", interval=1.5)
            assert below is not None
            assert staging.list() == [], "the operator emptied S3 staging before recreating the slot"
            events = kubernetes.client.CoreV1Api(api).list_namespaced_event(operator_env.NAMESPACE).items
            assert any(e.reason == "SlotRecreated" and below in (e.message or "") for e in events), \
                [(e.reason, e.message) for e in events]
            slot_ready = next(c for c in _status(api, name)["conditions"] if c["type"] == "SlotReady")
            assert slot_ready["reason"] != "StagingUnreachable", slot_ready
    finally:
        cluster.drop_database(db.name)


def test_each_ingestions_storage_settings_are_its_own_in_one_process_without_any(object_store, monkeypatch):
    """Fast, no operator: what the operator does per ingestion, two at once. With no AWS variable
    in this process, staging opened with one ingestion's settings lists; with another's (wrong
    keys, or a half pair) it is refused naming what to fix — the first still lists, nothing of
    either leaks into the process or the other. Catalog FileIO properties follow the same
    settings, below the catalog's own."""
    store = object_store
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    good = {k: store.environment()[k] for k in STORAGE_VARIABLES}
    wrong = {**good, "AWS_SECRET_ACCESS_KEY": "wrong"}
    Staging(f"s3://{STAGING_BUCKET}/mine", environ=good).write_apply_status({"mine": True})
    with pytest.raises(StorageError, match=r"s3://stage/other: .*refused the credentials.*spec.secretEnv"):
        Staging(f"s3://{STAGING_BUCKET}/other", environ=wrong).list()
    assert Staging(f"s3://{STAGING_BUCKET}/mine", create=False, environ=good).read_apply_status() == {"mine": True}
    with pytest.raises(StorageError, match="sets one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY without"):
        Staging(f"s3://{STAGING_BUCKET}/half", environ={"AWS_ACCESS_KEY_ID": store.access_key})
    assert not [k for k in os.environ if k.startswith("AWS_")]

    spec = CatalogSpec.model_validate(store.catalog_document())
    io = catalogs.pyiceberg_properties(spec, {}, good)
    assert (io["s3.access-key-id"], io["s3.secret-access-key"], io["s3.region"]) == (
        store.access_key, store.secret_key, good["AWS_REGION"])
    assert io["s3.endpoint"] == store.s3_file_io()["s3.endpoint"]  # the catalog's own wins
    assert "s3.access-key-id" not in catalogs.pyiceberg_properties(spec, {}, {})  # workload identity
