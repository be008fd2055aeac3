"""The operator's reconcile, called directly (no kopf) against the Kubernetes API emulator, real
PostgreSQL 15 and 18, and real Spark + Iceberg.

Simulated (they cannot run here): the spark-operator (tests set SparkApplication states), the
Deployment controller and kubelet (tests create the reader Pod), and the snapshot job's Iceberg
commit (tests commit mirror tables with lakeslot.lsn through real Spark) — see
tests/support/operator_env.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import kubernetes.client
import pytest

from lakeslot import lsn_text
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.api.validation import parse_resource
from lakeslot.mirror.contract import ERROR_LSN_PROPERTY, ERROR_PROPERTY, RESNAPSHOT_AUTOMATIC, RESNAPSHOT_PROPERTY
from lakeslot.snapshot import progress as snapshot_progress
from lakeslot.source import connection, slot
from lakeslot.source.slot import SlotHealth
from lakeslot_operator.kube import Kube
from lakeslot_operator.reconcile import Context, reconcile
from tests.support import operator_env
from tests.support.fixtures_pg import Database, connection_settings
from tests.support.odd_names import create_odd_tables

CUSTOM = operator_env.CUSTOM


@pytest.fixture
def source(pgdb):
    with pgdb.connect() as conn:
        tables = create_odd_tables(conn)
    return pgdb, tables


def _document(name, source, spark_warehouse, tmp_path, **spec):
    db, tables = source
    return operator_env.ingestion_document(name, db, tables, warehouse=spark_warehouse.as_uri(),
                                           staging=(tmp_path / "staging").as_uri(), **spec)


def _reconcile(api, name):
    """One reconcile, with its status written back like the kopf handler does."""
    body = operator_env.get_ingestion(api, name)
    assert body is not None, f"ingestion {name} does not exist"
    outcome = reconcile(body, Context(kube=Kube(api)))
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        *CUSTOM, name, {"status": outcome.status})
    return operator_env.get_ingestion(api, name), outcome.events


def _source_conn(db):
    return db.connect()


def _health(conn, name: str) -> SlotHealth:
    health = slot.health(conn, name)
    assert health is not None, f"slot {name} does not exist"
    return health


def test_create_then_snapshot_then_stream(api, source, spark, spark_warehouse, tmp_path):
    db, tables = source
    document = _document("orders", source, spark_warehouse, tmp_path)
    operator_env.create_ingestion(api, document, db.cluster.password)

    resource, events = _reconcile(api, "orders")
    status = resource["status"]
    assert operator_env.required_condition(resource, "SourceReady")["status"] == "True"
    assert operator_env.required_condition(resource, "SlotReady")["status"] == "True"
    assert operator_env.required_condition(resource, "SnapshotComplete")["reason"] == "Snapshotting"
    assert operator_env.required_condition(resource, "Ready")["status"] == "False"
    assert status["phase"] == "Snapshotting"
    assert status["observedGeneration"] == resource["metadata"]["generation"]
    slot_name = status["slot"]["name"]
    assert slot_name == "lakeslot_default_orders" == status["publicationName"]
    assert status["publicationManagedBy"] == "Lakeslot"  # (Auto: it did not exist, lakeslot made it)
    assert {e.reason for e in events} >= {"SlotCreated", "SnapshotStarted", "TableAdded"}
    with db.connect() as conn:
        assert _health(conn, slot_name).plugin == "pgoutput"
        published = {TableName(*r) for r in conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
            (slot_name,))}
    assert published == set(tables)

    deployments = operator_env.deployments(api)
    assert list(deployments) == ["orders-reader"]
    command = deployments["orders-reader"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["lakeslot", "reader"] and "--slot" in command
    apps = operator_env.spark_applications(api)
    [snapshot_name] = apps
    assert snapshot_name == status["snapshot"]["application"]
    job = operator_env.job_input(api, apps[snapshot_name])
    assert sorted(job.tables) == sorted(tables) and job.ingestion.metadata.name == "orders"
    assert job.ingestion.spec.snapshot.resnapshot_generation == 0

    # Reconciling again changes nothing: same children, same resourceVersions.
    versions = {n: a["metadata"]["resourceVersion"] for n, a in operator_env.spark_applications(api).items()}
    resource, events = _reconcile(api, "orders")
    assert {n: a["metadata"]["resourceVersion"] for n, a in operator_env.spark_applications(api).items()} == versions
    assert [e for e in events if e.reason in ("SnapshotStarted", "SlotCreated")] == []

    # The (simulated) snapshot job commits every table and the spark-operator reports success.
    with db.connect() as conn:
        snapshot_lsn = _health(conn, slot_name).confirmed_flush_lsn
    assert snapshot_lsn is not None
    operator_env.commit_snapshot(spark, document, tables, snapshot_lsn)
    operator_env.set_spark_state(api, snapshot_name, "COMPLETED")
    resource, _ = _reconcile(api, "orders")
    assert operator_env.required_condition(resource, "SnapshotComplete")["status"] == "True"
    assert {t["state"] for t in resource["status"]["tables"]} == {"Streaming"}
    assert {t["appliedLsn"] for t in resource["status"]["tables"]} == {lsn_text.format(snapshot_lsn)}
    apply_app = operator_env.spark_applications(api)["orders-apply"]
    assert sorted(operator_env.job_input(api, apply_app).tables) == sorted(tables)
    assert not operator_env.job_arguments(apply_app).once  # long-running
    assert operator_env.required_condition(resource, "Streaming")["reason"] == "ReaderNotReady"

    # Reader pod and apply job running (simulated controllers) → Ready.
    operator_env.reader_pod_running(api, "orders", "orders-reader-7d9f-x1")
    operator_env.set_spark_state(api, "orders-apply", "RUNNING")
    resource, events = _reconcile(api, "orders")
    assert operator_env.required_condition(resource, "Ready")["status"] == "True", resource["status"]["conditions"]
    assert resource["status"]["phase"] == "Streaming"
    assert resource["status"]["reader"]["pod"] == "orders-reader-7d9f-x1"
    assert resource["status"]["tableCount"] == len(tables)
    assert any(e.reason == "Streaming" and e.type == "Normal" for e in events)


def test_a_broken_table_fails_alone_and_a_missing_secret_is_a_condition(api, pgdb, spark_warehouse, tmp_path):
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE good (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE keyless (a int)")
    tables = [TableName("public", "good"), TableName("public", "keyless")]
    document = operator_env.ingestion_document("mixed", pgdb, tables, warehouse=spark_warehouse.as_uri(),
                                               staging=(tmp_path / "s").as_uri())
    kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(*CUSTOM[:3], CUSTOM[3], document)
    resource, _ = _reconcile(api, "mixed")
    ready = operator_env.required_condition(resource, "SourceReady")
    assert (ready["status"], ready["reason"]) == ("False", "SecretNotFound")
    assert "Secret default/mixed-pg does not exist" in ready["message"]
    assert operator_env.deployments(api) == {}

    operator_env.create_secret(api, "mixed-pg", {"password": pgdb.cluster.password})
    resource, _ = _reconcile(api, "mixed")
    rows = {t["name"]: t for t in resource["status"]["tables"]}
    assert rows["keyless"]["state"] == "Failed"
    assert 'ALTER TABLE "public"."keyless" ADD PRIMARY KEY' in rows["keyless"]["message"]
    assert rows["good"]["state"] == "Snapshotting"
    assert operator_env.required_condition(resource, "Degraded")["reason"] == "TablesFailed"
    with pgdb.connect() as conn:  # the keyless table stayed out of the publication
        assert conn.execute("SELECT tablename FROM pg_publication_tables").fetchall() == [("good",)]


def test_an_unreachable_source_and_an_invalid_spec_are_conditions(api, pgdb, spark_warehouse, tmp_path):
    document = operator_env.ingestion_document("far", pgdb, [TableName("public", "t")],
                                               warehouse=spark_warehouse.as_uri(), staging=(tmp_path / "s").as_uri())
    document["spec"]["source"]["port"] = 1  # nothing listens there
    operator_env.create_ingestion(api, document, "whatever")
    resource, _ = _reconcile(api, "far")
    failed = operator_env.required_condition(resource, "SourceReady")
    assert (failed["status"], failed["reason"]) == ("False", "ConnectionFailed")
    assert "127.0.0.1" in failed["message"] and "whatever" not in json.dumps(resource)

    body = operator_env.get_ingestion(api, "far")
    assert body is not None
    body["spec"]["source"]["sslMode"] = "sometimes"  # as if stored before validation was tightened
    outcome = reconcile(body, Context(kube=Kube(api)))
    invalid = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert invalid["reason"] == "InvalidSpec" and "spec.source.sslMode" in invalid["message"]
    assert outcome.status["phase"] == "Failed"


def test_a_stale_slot_holder_is_evicted(api, source, spark_warehouse, tmp_path):
    db, _ = source
    operator_env.create_ingestion(api, _document("orders", source, spark_warehouse, tmp_path), db.cluster.password)
    resource, _ = _reconcile(api, "orders")
    slot_name = resource["status"]["slot"]["name"]
    operator_env.reader_pod_running(api, "orders", "orders-reader-abc")
    dsn = (f"host=127.0.0.1 port={db.cluster.port} dbname={db.name} user=postgres"
           " application_name='lakeslot-reader default/orders orders-reader-OLD'")
    zombie = subprocess.Popen(
        [str(db.cluster.tool("pg_recvlogical")), "-d", dsn, "--slot", slot_name, "--start",
         "--no-loop", "-o", "proto_version=1", "-o", f"publication_names={slot_name}",
         "-f", "/dev/null"],
        env={**os.environ, "PGPASSWORD": db.cluster.password}, stderr=subprocess.PIPE)
    assert zombie.stderr is not None  # stderr=PIPE
    try:
        with db.connect() as conn:
            deadline = time.monotonic() + 30
            while not _health(conn, slot_name).active:
                assert time.monotonic() < deadline and zombie.poll() is None, zombie.stderr.read()
                time.sleep(0.1)
        resource, events = _reconcile(api, "orders")
        evicted = [e for e in events if e.reason == "StaleHolderEvicted"]
        assert len(evicted) == 1 and "orders-reader-OLD" in evicted[0].message
        assert "lakeslot-reader default/orders orders-reader-abc" in evicted[0].message
        assert zombie.wait(timeout=30) != 0
    finally:
        zombie.kill()


def test_suspend_keeps_the_slot_and_reports_retained_wal(api, source, spark_warehouse, tmp_path):
    db, tables = source
    operator_env.create_ingestion(api, _document("orders", source, spark_warehouse, tmp_path), db.cluster.password)
    _reconcile(api, "orders")
    if "orders-apply" in operator_env.spark_applications(api):
        operator_env.set_spark_state(api, "orders-apply", "RUNNING")
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *CUSTOM, "orders", {"spec": {"suspend": True}})
    with db.connect() as conn:
        conn.execute(f"INSERT INTO {tables[0]} (id) SELECT g FROM generate_series(1, 2000) g")
    resource, _ = _reconcile(api, "orders")
    assert resource["status"]["phase"] == "Suspended"
    assert operator_env.deployments(api)["orders-reader"]["spec"]["replicas"] == 0
    assert "orders-apply" not in operator_env.spark_applications(api)
    assert resource["status"]["slot"]["retainedBytes"] > 0
    with db.connect() as conn:
        assert slot.health(conn, resource["status"]["slot"]["name"]) is not None

    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *CUSTOM, "orders", {"spec": {"suspend": False}})
    _reconcile(api, "orders")
    assert operator_env.deployments(api)["orders-reader"]["spec"]["replicas"] == 1


def test_adding_a_table_snapshots_only_it_and_resnapshot_takes_all(api, source, spark, spark_warehouse, tmp_path):
    db, tables = source
    document = _document("orders", source, spark_warehouse, tmp_path)
    operator_env.create_ingestion(api, document, db.cluster.password)
    resource, _ = _reconcile(api, "orders")
    first = resource["status"]["snapshot"]["application"]
    operator_env.commit_snapshot(spark, document, tables, 100)
    operator_env.set_spark_state(api, first, "COMPLETED")
    _reconcile(api, "orders")

    with db.connect() as conn:
        conn.execute('CREATE TABLE "New Table" (id int PRIMARY KEY)')
    new = TableName("public", "New Table")
    spec_tables = document["spec"]["source"]["tables"] + [{"schema": "public", "name": "New Table"}]
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *CUSTOM, "orders", {"spec": {"source": {"tables": spec_tables}}})
    resource, events = _reconcile(api, "orders")
    second = resource["status"]["snapshot"]["application"]
    assert second != first
    assert operator_env.job_input(api, operator_env.spark_applications(api)[second]).tables == (new,)
    assert any(e.reason == "TableAdded" and "New Table" in e.message for e in events)

    # Remove a table: out of the publication, its mirror kept (nothing drops Iceberg tables); its
    # row says so.
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *CUSTOM, "orders", {"spec": {"source": {"tables": spec_tables[1:]}}})
    resource, events = _reconcile(api, "orders")
    assert any(e.reason == "TableRemoved" for e in events)
    rows = {(t["schema"], t["name"]): t for t in resource["status"]["tables"]}
    assert rows[tuple(tables[0])]["state"] == "Removed"
    assert "is kept" in rows[tuple(tables[0])]["message"]
    assert resource["status"]["tableCount"] == len(spec_tables) - 1

    # One snapshot at a time: the re-snapshot of every table waits for the one copying New Table.
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *CUSTOM, "orders", {"spec": {"snapshot": {"resnapshotGeneration": 1}}})
    resource, _ = _reconcile(api, "orders")
    assert resource["status"]["snapshot"]["application"] == second
    assert "waiting for it to finish" in operator_env.required_condition(resource, "SnapshotComplete")["message"]
    assert not [n for n in operator_env.spark_applications(api) if n.startswith("orders-snapshot-g1-")]
    operator_env.set_spark_state(api, second, "COMPLETED")
    resource, _ = _reconcile(api, "orders")
    third = resource["status"]["snapshot"]["application"]
    assert third.startswith("orders-snapshot-g1-")
    job = operator_env.job_input(api, operator_env.spark_applications(api)[third])
    assert job.ingestion.spec.snapshot.resnapshot_generation == 1
    assert len(job.tables) == len(spec_tables) - 1
    operator_env.set_spark_state(api, third, "COMPLETED")
    resource, _ = _reconcile(api, "orders")
    assert resource["status"]["observedResnapshotGeneration"] == 1


def test_a_failed_snapshot_is_reported_and_retried_after_backoff(api, source, spark_warehouse, tmp_path):
    db, _ = source
    operator_env.create_ingestion(api, _document("orders", source, spark_warehouse, tmp_path), db.cluster.password)
    resource, _ = _reconcile(api, "orders")
    name = resource["status"]["snapshot"]["application"]
    operator_env.set_spark_state(api, name, "FAILED", "driver OOM")
    resource, _ = _reconcile(api, "orders")
    failed = operator_env.required_condition(resource, "SnapshotComplete")
    assert (failed["reason"], resource["status"]["snapshot"]["attempts"]) == ("SnapshotFailed", 1)
    assert "driver OOM" in failed["message"]
    assert name in operator_env.spark_applications(api)  # kept until the backoff is over


def test_a_table_whose_snapshot_failed_stays_failed_with_its_reason_in_the_cr(
        api, source, spark, spark_warehouse, tmp_path):
    """The snapshot job's per-table failure reaches status.tables: while the operator copies the
    table again the row says what failed last time, and while the failed attempt waits out its
    backoff the table is Failed with the reason, reconcile after reconcile, until a copy passes
    (simulated job: its progress documents are written by the job's own code)."""
    db, tables = source
    broken, fine = tables[0], tables[1:]
    document = _document("orders", source, spark_warehouse, tmp_path)
    operator_env.create_ingestion(api, document, db.cluster.password)
    resource, _ = _reconcile(api, "orders")
    location = snapshot_progress.in_staging(document["spec"]["staging"]["uri"])
    with db.connect() as conn:
        lsn = _health(conn, resource["status"]["slot"]["name"]).confirmed_flush_lsn
    assert lsn is not None
    why = "keyColumns (k) are not unique; fix: choose others"

    def attempt(copied: list[TableName], application: str) -> None:
        """The snapshot job of ``application`` copies ``copied``: ``broken`` fails, the others
        commit, and the application fails (a table failed)."""
        job = snapshot_progress.Progress(location, [(t, str(t)) for t in copied])
        for table in copied:
            job.table(table, **{"state": "failed", "error": why} if table == broken
                      else {"state": "committed"})
        job.finish()
        operator_env.commit_snapshot(spark, document, [t for t in copied if t != broken], lsn)
        operator_env.set_spark_state(api, application, "FAILED", "1 table failed")

    def rows() -> dict[TableName, dict]:
        resource, _ = _reconcile(api, "orders")
        return {TableName(t["schema"], t["name"]): t for t in resource["status"]["tables"]}

    attempt(tables, resource["status"]["snapshot"]["application"])
    seen = rows()  # the others are done: the broken one is copied again at once, alone
    assert seen[broken]["state"] == "Snapshotting"
    assert seen[broken]["message"] == f"snapshot failed: {why} (copying it again)"
    assert {seen[t]["state"] for t in fine} == {"Streaming"}
    current = operator_env.get_ingestion(api, "orders")
    assert current is not None
    retry = current["status"]["snapshot"]
    assert retry["tables"] == [str(broken)]

    attempt([broken], retry["application"])
    for _ in range(2):  # the failed retry waits out its backoff: Failed, and it stays so
        seen = rows()
        assert seen[broken]["state"] == "Failed" and seen[broken]["message"] == f"snapshot failed: {why}"
        assert {seen[t]["state"] for t in fine} == {"Streaming"}

    fixed = snapshot_progress.Progress(location, [(broken, str(broken))])  # a copy that passes
    fixed.table(broken, state="committed")
    fixed.finish()
    operator_env.commit_snapshot(spark, document, [broken], lsn)
    seen = rows()
    assert seen[broken]["state"] == "Streaming" and not seen[broken].get("message")


@pytest.mark.parametrize("version", ["pg15", "pg18"])
def test_a_lost_slot_is_recreated_staging_emptied_and_every_table_snapshotted_again(
        api, pg_cluster_factory, version, spark, spark_warehouse, tmp_path):
    cluster = pg_cluster_factory.get(version, max_slot_wal_keep_size="1MB", min_wal_size="32MB",
                                     max_wal_size="64MB")
    name = "t_lost"
    cluster.create_database(name)
    db = Database(cluster, name)
    try:
        with db.connect() as conn:
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
            conn.execute("CREATE TABLE filler (v text)")
        tables = [TableName("public", "orders")]
        document = operator_env.ingestion_document(
            "lost", db, tables, warehouse=spark_warehouse.as_uri(),
            staging=(tmp_path / "staging").as_uri(), policies={"onSlotLost": "Resnapshot"})
        operator_env.create_ingestion(api, document, cluster.password)
        resource, _ = _reconcile(api, "lost")
        operator_env.commit_snapshot(spark, document, tables, 100)
        operator_env.set_spark_state(api, resource["status"]["snapshot"]["application"], "COMPLETED")
        resource, _ = _reconcile(api, "lost")
        assert operator_env.required_condition(resource, "SnapshotComplete")["status"] == "True"
        staged = tmp_path / "staging" / "0000000000000064-00000000000000C8.parquet"
        staged.parent.mkdir()
        staged.write_bytes(b"changes of the slot that is about to be lost")

        with db.connect() as conn:
            for _ in range(6):  # push the slot's restart_lsn out of the 1 MB it may keep
                conn.execute("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 3000)")
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
        # Staging that cannot be emptied blocks the recreation with a condition, nothing else.
        blocked = tmp_path / "not-a-directory"
        blocked.write_text("")
        good_uri = document["spec"]["staging"]["uri"]
        kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
            *CUSTOM, "lost", {"spec": {"staging": {"uri": (blocked / "staging").as_uri()}}})
        resource, events = _reconcile(api, "lost")
        unreachable = operator_env.required_condition(resource, "SlotReady")
        assert (unreachable["status"], unreachable["reason"]) == ("False", "StagingUnreachable")
        assert "delete the segments there by hand" in unreachable["message"]
        assert staged.exists() and not any(e.reason == "SlotRecreated" for e in events)
        kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
            *CUSTOM, "lost", {"spec": {"staging": {"uri": good_uri}}})

        resource, events = _reconcile(api, "lost")
        below = resource["status"]["resnapshotBelowLsn"]
        assert any(e.reason == "SlotRecreated" and below in e.message for e in events)
        assert not staged.exists()
        assert operator_env.required_condition(resource, "SlotReady")["status"] == "True"
        application = resource["status"]["snapshot"]["application"]
        arguments = operator_env.job_arguments(operator_env.spark_applications(api)[application])
        assert operator_env.job_input(api, operator_env.spark_applications(api)[application]).tables == tuple(tables)
        assert arguments.min_snapshot_lsn == lsn_text.parse(below)
        assert operator_env.required_condition(resource, "SnapshotComplete")["reason"] == "Snapshotting"

        operator_env.commit_snapshot(spark, document, tables, lsn_text.parse(below) + 10)
        operator_env.set_spark_state(api, application, "COMPLETED")
        resource, _ = _reconcile(api, "lost")
        assert operator_env.required_condition(resource, "SnapshotComplete")["status"] == "True"
        assert "resnapshotBelowLsn" not in resource["status"]
    finally:
        with connection.connect(connection_settings(db), "lakeslot-test") as conn:
            slot.drop(conn, "lakeslot_default_lost")
        cluster.drop_database(name)


def _stop_table(spark, document, table: TableName, lsn: int, *, automatic: bool) -> None:
    """What the apply job records when it stops a table (simulated: no apply job runs here)."""
    names = IngestionNames.of(parse_resource(document))
    quoted = ".".join(f"`{p}`" for p in ("lakeslot", *names.mirror_identifier(table)))
    spark.sql(f"ALTER TABLE {quoted} SET TBLPROPERTIES ("
              f"'{ERROR_PROPERTY}' = 'column a was renamed to b', "
              f"'{ERROR_LSN_PROPERTY}' = '{lsn}', "
              f"'{RESNAPSHOT_PROPERTY}' = '{RESNAPSHOT_AUTOMATIC if automatic else 'true'}')")


def test_a_table_is_copied_again_alone_automatically_on_request_and_within_the_guard(
        api, source, spark, spark_warehouse, tmp_path):
    db, tables = source
    document = _document("again", source, spark_warehouse, tmp_path)
    operator_env.create_ingestion(api, document, db.cluster.password)
    resource, _ = _reconcile(api, "again")
    operator_env.commit_snapshot(spark, document, tables, 100)
    operator_env.set_spark_state(api, resource["status"]["snapshot"]["application"], "COMPLETED")
    resource, _ = _reconcile(api, "again")
    assert operator_env.required_condition(resource, "SnapshotComplete")["status"] == "True"
    first, second = tables[0], tables[1]

    # the apply job stopped one table for an automatic re-snapshot: it alone is copied again,
    # from past its position, and the event says why
    _stop_table(spark, document, first, 100, automatic=True)
    resource, events = _reconcile(api, "again")
    name = resource["status"]["snapshot"]["application"]
    arguments = operator_env.job_arguments(operator_env.spark_applications(api)[name])
    assert operator_env.job_input(api, operator_env.spark_applications(api)[name]).tables == (first,)
    assert arguments.min_snapshot_lsn == 101
    assert any(e.reason == "TableResnapshot" and "renamed" in e.message and str(first) in e.message
               for e in events)
    rows = {(r["schema"], r["name"]): r for r in resource["status"]["tables"]}
    assert rows[(first.schema, first.name)]["state"] == "Snapshotting"
    assert rows[(second.schema, second.name)]["state"] == "Streaming"

    # the loop guard: none allowed per hour → the table stops, and its row says why
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *CUSTOM, "again", {"spec": {"policies": {"maxResnapshotsPerHour": 0}}})
    resource, _ = _reconcile(api, "again")
    row = {(r["schema"], r["name"]): r for r in resource["status"]["tables"]}[(first.schema, first.name)]
    assert row["state"] == "Failed" and "maxResnapshotsPerHour" in row["message"]
    assert operator_env.required_condition(resource, "Degraded")["reason"] == "TablesFailed"

    # an error that needs a human (not automatic) is shown, never retried by itself
    _stop_table(spark, document, second, 100, automatic=False)
    resource, _ = _reconcile(api, "again")
    row = {(r["schema"], r["name"]): r for r in resource["status"]["tables"]}[(second.schema, second.name)]
    assert row["state"] == "Failed" and "renamed" in row["message"]

    # the user's request copies it alone, once: recorded with the LSN it must reach
    spec_tables = [dict(t) for t in document["spec"]["source"]["tables"]]
    spec_tables[1]["resnapshotGeneration"] = 1
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *CUSTOM, "again", {"spec": {"source": {"tables": spec_tables}}})
    resource, events = _reconcile(api, "again")
    row = {(r["schema"], r["name"]): r for r in resource["status"]["tables"]}[(second.schema, second.name)]
    assert row["observedResnapshotGeneration"] == 1 and row["resnapshotBelowLsn"] == lsn_text.format(101)
    name = resource["status"]["snapshot"]["application"]
    assert second in operator_env.job_input(api, operator_env.spark_applications(api)[name]).tables
    assert any(e.reason == "TableResnapshot" and "as requested" in e.message for e in events)
    resource, events = _reconcile(api, "again")  # asked once: not again
    assert not any(e.reason == "TableResnapshot" and "as requested" in e.message for e in events)


def test_schemas_a_table_created_joins_a_keyless_one_fails_alone_a_dropped_one_is_removed(
        api, pgdb, spark, spark_warehouse, tmp_path):
    orders, fresh = TableName("app", "orders"), TableName("app", "fresh")
    keyless = TableName("app", "keyless")
    with pgdb.connect() as conn:
        conn.execute("CREATE SCHEMA app")
        conn.execute("CREATE TABLE app.orders (id int PRIMARY KEY)")
    document = operator_env.ingestion_document("shop", pgdb, [], warehouse=spark_warehouse.as_uri(),
                                               staging=(tmp_path / "staging").as_uri())
    document["spec"]["source"]["schemas"] = ["app"]
    operator_env.create_ingestion(api, document, pgdb.cluster.password)
    resource, _ = _reconcile(api, "shop")
    first = resource["status"]["snapshot"]["application"]
    operator_env.commit_snapshot(spark, document, [orders], 100)
    operator_env.set_spark_state(api, first, "COMPLETED")
    _reconcile(api, "shop")

    def published() -> set[TableName]:
        with pgdb.connect() as conn:
            return {TableName(*r) for r in conn.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (resource["status"]["publicationName"],))}

    def rows(resource) -> dict[TableName, dict]:
        return {TableName(t["schema"], t["name"]): t for t in resource["status"]["tables"]}

    # While streaming: a table is created in the schema (with rows), and one without a key.
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE app.fresh (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO app.fresh SELECT g, 'v' FROM generate_series(1, 10) g")
        conn.execute("CREATE TABLE app.keyless (a int)")
    resource, events = _reconcile(api, "shop")
    assert published() == {orders, fresh}  # never the keyless one: its UPDATEs would fail
    assert any(e.reason == "TableAdded" and "app.fresh" in e.message for e in events)
    assert rows(resource)[fresh]["state"] == "Snapshotting"
    assert rows(resource)[keyless]["state"] == "Failed"
    assert "no primary key" in rows(resource)[keyless]["message"]
    assert rows(resource)[orders]["state"] == "Streaming"
    assert "1 failed" in operator_env.required_condition(resource, "SourceReady")["message"]
    second = resource["status"]["snapshot"]["application"]
    assert operator_env.job_input(api, operator_env.spark_applications(api)[second]).tables == (fresh,)
    applied = operator_env.job_input(api, operator_env.spark_applications(api)["shop-apply"])
    assert sorted(applied.tables) == [fresh, orders]
    with pgdb.connect() as conn:
        conn.execute("UPDATE app.keyless SET a = 1")  # the application is not broken

    operator_env.commit_snapshot(spark, document, [fresh], 200)
    operator_env.set_spark_state(api, second, "COMPLETED")
    resource, _ = _reconcile(api, "shop")
    assert rows(resource)[fresh]["state"] == "Streaming"
    assert rows(resource)[fresh].get("resnapshotBelowLsn") is None

    # Dropped: out of the apply job, its row Removed, its mirror kept.
    with pgdb.connect() as conn:
        conn.execute("DROP TABLE app.fresh")
    resource, events = _reconcile(api, "shop")
    assert rows(resource)[fresh]["state"] == "Removed"
    assert "no longer in schema app" in rows(resource)[fresh]["message"]
    assert any(e.reason == "TableRemoved" and "app.fresh" in e.message for e in events)
    assert operator_env.job_input(api, operator_env.spark_applications(api)["shop-apply"]).tables == (orders,)
    assert resource["status"]["tableCount"] == 2  # orders, keyless
    assert published() == {orders}

    # Created again under that name: its old mirror missed everything in between, so it is
    # copied again, from a snapshot taken after it joined the publication.
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE app.fresh (id int PRIMARY KEY, v text)")
    resource, events = _reconcile(api, "shop")
    assert published() == {orders, fresh}
    below = rows(resource)[fresh]["resnapshotBelowLsn"]
    third = resource["status"]["snapshot"]["application"]
    assert third not in (first, second)
    arguments = operator_env.job_arguments(operator_env.spark_applications(api)[third])
    assert operator_env.job_input(api, operator_env.spark_applications(api)[third]).tables == (fresh,)
    assert arguments.min_snapshot_lsn == lsn_text.parse(below)
