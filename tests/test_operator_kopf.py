"""The real kopf operator (lakeslot's registry) on the Kubernetes API emulator with real
PostgreSQL 15 and 18: create → children and status, delete under each deletionPolicy, a blocked
cleanup and its documented way out, a restart without duplicate children, 50 ingestions, a spec
listing 1,000 tables.

Simulated (they cannot run here): the spark-operator and the Deployment controller (nothing
sets the children's status, so ingestions stay in Snapshotting — enough for these flows).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import kubernetes.client
import pytest
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.source import slot
from lakeslot_operator.handlers import SKIP_CLEANUP_ANNOTATION, build_registry
from lakeslot_operator.kube import Kube
from lakeslot_operator.reconcile import Context
from tests.support import operator_env
from tests.support.fixtures_kube import running_operator
from tests.support.waiting import wait_for

CUSTOM = operator_env.CUSTOM


def _operator(kube, api, reconciles: list | None = None):
    """The operator, its timer every second and a blocked deletion retried after 1 s (doubling);
    ``reconciles`` (when given) gets an entry at each reconcile it runs (the one call of
    ``Context.now`` a reconcile makes)."""
    def now() -> datetime:
        if reconciles is not None:
            reconciles.append(1)
        return datetime.now(UTC)

    registry = build_registry(Context(kube=Kube(api), now=now), timer_interval=1.0,
                              cleanup_retry_base=1.0, login_via_client=False)
    return running_operator(kube, registry)


def _document(name, pgdb, spark_warehouse, tmp_path, **spec):
    with pgdb.connect() as conn:
        conn.execute('CREATE TABLE IF NOT EXISTS "Orders" (id int PRIMARY KEY)')
    return operator_env.ingestion_document(name, pgdb, [TableName("public", "Orders")],
                                           warehouse=spark_warehouse.as_uri(),
                                           staging=(tmp_path / name).as_uri(), **spec)


def _status_ready(api, name, condition="SlotReady"):
    resource = operator_env.get_ingestion(api, name)
    found = resource and operator_env.condition(resource, condition)
    return resource if found and found["status"] == "True" else None


def _slot_exists(pgdb, name):
    with pgdb.connect() as conn:
        return slot.health(conn, name) is not None


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_create_reconciles_and_delete_follows_the_policy(kube, api, pgdb, spark_warehouse, tmp_path, policy):
    document = _document("orders", pgdb, spark_warehouse, tmp_path,
                         policies={"deletionPolicy": policy})
    with _operator(kube, api):
        operator_env.create_ingestion(api, document, pgdb.cluster.password)
        resource = wait_for(lambda: _status_ready(api, "orders"), "SlotReady")
        assert "lakeslot.io/finalizer" in resource["metadata"]["finalizers"]
        slot_name = resource["status"]["slot"]["name"]
        assert _slot_exists(pgdb, slot_name)
        assert set(operator_env.deployments(api)) == {"orders-reader"}
        wait_for(lambda: {e.reason for e in kubernetes.client.CoreV1Api(api).list_namespaced_event(
            operator_env.NAMESPACE).items} >= {"SlotCreated", "SnapshotStarted"},
            "Kubernetes events about the slot and the snapshot")

        kubernetes.client.CustomObjectsApi(api).delete_namespaced_custom_object(*CUSTOM, "orders")
        wait_for(lambda: operator_env.get_ingestion(api, "orders") is None, "the ingestion to be gone")
    assert operator_env.deployments(api) == {} and operator_env.spark_applications(api) == {}
    assert _slot_exists(pgdb, slot_name) == (policy == "Retain")
    with pgdb.connect() as conn:
        publications = conn.execute("SELECT count(*) FROM pg_publication").fetchone()[0]
    assert publications == (1 if policy == "Retain" else 0)


def test_unreachable_source_blocks_cleanup_until_the_skip_annotation(kube, api, pgdb, spark_warehouse, tmp_path):
    document = _document("orders", pgdb, spark_warehouse, tmp_path, policies={"deletionPolicy": "Delete"})
    with _operator(kube, api):
        operator_env.create_ingestion(api, document, pgdb.cluster.password)
        wait_for(lambda: _status_ready(api, "orders"), "SlotReady")
        # The password changes under us: PostgreSQL now refuses the operator.
        kubernetes.client.CoreV1Api(api).patch_namespaced_secret(
            "orders-pg", operator_env.NAMESPACE, {"stringData": {"password": "rotated-wrongly"}})
        kubernetes.client.CustomObjectsApi(api).delete_namespaced_custom_object(*CUSTOM, "orders")

        def blocked():
            resource = operator_env.get_ingestion(api, "orders")
            ready = resource and operator_env.condition(resource, "Ready")
            return resource if ready and ready["reason"] == "CleanupBlocked" else None

        resource = wait_for(blocked, "the CleanupBlocked condition")
        assert resource is not None  # wait_for returns only a truthy value
        assert resource["status"]["phase"] == "Deleting"
        ready = operator_env.condition(resource, "Ready")
        assert ready is not None
        assert SKIP_CLEANUP_ANNOTATION in ready["message"]
        assert "rotated-wrongly" not in str(resource)
        kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
            *CUSTOM, "orders", {"metadata": {"annotations": {SKIP_CLEANUP_ANNOTATION: "true"}}})
        wait_for(lambda: operator_env.get_ingestion(api, "orders") is None, "the forced deletion")
    assert _slot_exists(pgdb, "lakeslot_default_orders")  # left as documented


def test_an_operator_restart_converges_without_duplicate_children(kube, api, pgdb, spark_warehouse, tmp_path):
    document = _document("orders", pgdb, spark_warehouse, tmp_path)
    with _operator(kube, api):
        operator_env.create_ingestion(api, document, pgdb.cluster.password)
        wait_for(lambda: operator_env.spark_applications(api), "the snapshot application")
    before = {**operator_env.deployments(api), **operator_env.spark_applications(api)}
    reconciles: list[int] = []
    with _operator(kube, api, reconciles):
        wait_for(lambda: len(reconciles) >= 3, "three reconciles of the new operator")
        after = {**operator_env.deployments(api), **operator_env.spark_applications(api)}
    assert set(after) == set(before) and len(after) == 2
    assert {n: o["metadata"]["uid"] for n, o in after.items()} == \
        {n: o["metadata"]["uid"] for n, o in before.items()}


@pytest.mark.slow
def test_fifty_ingestions_reconcile(kube, api, pg_cluster_factory, spark_warehouse, tmp_path):
    cluster = pg_cluster_factory.get("pg18", max_replication_slots="64", max_wal_senders="64")
    from tests.support.fixtures_pg import Database

    cluster.create_database("fifty")
    db = Database(cluster, "fifty")
    try:
        names = [f"ingestion-{i:02d}" for i in range(50)]
        with _operator(kube, api):
            for name in names:
                operator_env.create_ingestion(api, _document(name, db, spark_warehouse, tmp_path),
                                              cluster.password)
            wait_for(lambda: all(_status_ready(api, n) for n in names), "50 ingestions", 180)
        with db.connect() as conn:
            slots = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE database = 'fifty'"
                                 ).fetchone()
        assert slots is not None and slots[0] == 50
        assert len(operator_env.deployments(api)) == 50
    finally:
        cluster.drop_database("fifty")


@pytest.mark.one_version  # (nothing here depends on the server version)
def test_a_spec_listing_a_thousand_tables_is_handled(kube, api, pgdb, spark_warehouse, tmp_path):
    """A spec the CRD accepts can be larger than one command-line argument (Linux: 128 KiB) and
    than all of an object's annotations (256 KiB, which the emulator enforces like the API
    server): the operator keeps kopf's diff base in status and hands the snapshot job its input
    in a Secret the job's SparkApplication owns, its arguments a few hundred bytes."""
    schema = "many"
    tables = [TableName(schema, f"table_with_a_rather_long_name_{i:04d}") for i in range(1000)]
    with pgdb.connect() as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        for t in tables:
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY)").format(t.sql()))
    document = operator_env.ingestion_document("many", pgdb, tables, warehouse=spark_warehouse.as_uri(),
                                               staging=(tmp_path / "many").as_uri())
    for i, entry in enumerate(document["spec"]["source"]["tables"]):
        entry["mirrorName"] = f"mirror_{i:04d}_" + "m" * 240
    assert len(json.dumps(document["spec"])) > 256 * 1024
    with _operator(kube, api):
        operator_env.create_ingestion(api, document, pgdb.cluster.password)
        def submitted() -> dict | None:
            found = operator_env.get_ingestion(api, "many")
            status = (found or {}).get("status") or {}
            handled = "lastHandledConfiguration" in status  # (kopf stores it after the handler)
            return found if handled and status.get("snapshot", {}).get("application") else None

        resource = wait_for(submitted, "the snapshot application", deadline=300, interval=1)
        assert resource is not None  # (wait_for returns only a truthy result)
    app = operator_env.spark_applications(api)[resource["status"]["snapshot"]["application"]]
    assert len(json.dumps(app["spec"]["arguments"])) < 512
    assert sorted(operator_env.job_input(api, app).tables) == sorted(tables)
    handled = json.loads(resource["status"]["lastHandledConfiguration"])["spec"]["source"]["tables"]
    assert [(t["name"], t["mirrorName"]) for t in handled] == [
        (t["name"], t["mirrorName"]) for t in document["spec"]["source"]["tables"]]
    annotations = resource["metadata"].get("annotations") or {}
    assert sum(len(k) + len(v) for k, v in annotations.items()) < 4096
