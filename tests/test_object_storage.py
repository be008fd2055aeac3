"""The production configuration: staging on S3 and the mirrors in an Iceberg REST catalog with
``S3FileIO`` (tests/support/fixtures_s3.py: SeaweedFS ``weed mini`` serves both), end to end; and
the common small one, a JDBC catalog on PostgreSQL with its warehouse on S3.

``lakeslot run`` runs in this process on the tests' shared Spark session (the REST catalog defined
on it at runtime), against real PostgreSQL: ``--once`` for the snapshot, then for streamed changes
and maintenance; then streaming while a schema change Iceberg can follow (a column added) and one
it cannot (a rename: that table is copied again, online) happen and ``lakeslot verify`` checks
equality at one LSN. After each step every mirror, read by pyiceberg through the REST catalog,
equals its source row by row (:func:`lakeslot.verify.checksums.compare`), and at the end DuckDB
reads them through the same catalog (OAuth2) and S3 equal to their sources; ``lakeslot status``,
``cut`` and the mirror progress the operator reads go through the same catalog. Credentials come
from the environment only and show in no output. Also here: refused or unreachable settings name
what to fix, segments are sealed on S3 without a rename, and the driver's row delta makes only
the requests its commit needs (counted by proxies in front of S3 and the catalog).

The JDBC catalog lives in a database of its own on the test's PostgreSQL server, owned by a role
whose password needs URL-encoding: Spark writes through Iceberg's ``JdbcCatalog`` (the driver that
``lakeslot provision-jars`` provides), pyiceberg reads the same ``iceberg_tables`` rows through its
SQL catalog, the snapshot and a streamed pass of updates, inserts and deletes both equal their
sources, and neither the password nor the S3 secret key shows in any output.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets as random_secrets
import threading
import time
import urllib.parse
import uuid

import kubernetes.client
import pyarrow as pa
import pytest
import yaml
from psycopg import sql
from pyarrow import fs as pafs
from pyiceberg.exceptions import ForbiddenError

from bench.latency_proxy import LatencyProxy
from lakeslot import cli, lsn_text, workloads
from lakeslot.api.models import CatalogSpec, MaintenanceSpec
from lakeslot.api.naming import TableName
from lakeslot.apply import job as apply_job
from lakeslot.apply import spread
from lakeslot.filesystems import StorageError
from lakeslot.local import config, reader_process
from lakeslot.local.objectstore import STAGING_BUCKET, WAREHOUSE
from lakeslot.local.pgcluster import free_port
from lakeslot.mirror import catalogs, cuts
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.contract import LSN_PROPERTY
from lakeslot.spark import row_delta
from lakeslot.spark.helpers import ROW_DELTAS
from lakeslot.spark.jvm import java
from lakeslot.spark.maintenance import Maintainer
from lakeslot.spark.tables import Tables
from lakeslot.staging.segments import SegmentName
from lakeslot.staging.store import TEMP_PREFIX, Staging
from lakeslot.verify import checksums
from lakeslot_operator.handlers import build_registry
from lakeslot_operator.kube import Kube
from lakeslot_operator.reconcile import Context
from tests.support import duckdb_reader, fixtures_s3, local_support, operator_env
from tests.support.apply_support import Pipeline, assert_equal_to_source
from tests.support.fixtures_kube import running_operator
from tests.support.fixtures_pg import connection_settings
from tests.support.fixtures_s3 import WAREHOUSE_BUCKET, define_catalog
from tests.support.reader_support import current_lsn, prepare, read_until
from tests.support.rest_proxy import CommitProxy
from tests.support.waiting import wait_for

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

ITEMS = local_support.ITEMS


def _assert_equal(local: config.Local, db, tables: list[TableName], secrets: dict[str, str]) -> None:
    checks = checksums.compare(local.ingestion, connection_settings(db), tables, secrets=secrets)
    assert [c for c in checks if not c.equal] == [], checksums.render(checks)
    assert all(c.source_rows > 0 for c in checks)


@pytest.mark.slow
def test_s3_staging_and_a_rest_catalog_end_to_end(pgdb, rest_spark, object_store, tmp_path, monkeypatch,
                                                  capsys):
    db, store = pgdb, object_store
    with db.connect() as conn:
        tables = local_support.create_accounts_and_items(conn, 3000, 800)
    accounts = tables[0]
    prefix = f"{STAGING_BUCKET}/{uuid.uuid4().hex[:12]}"
    path, state_dir = tmp_path / "ingestion.yaml", tmp_path / "state"
    document = fixtures_s3.ingestion_document(db, f"s3://{prefix}", tables, store.catalog_document())
    # every apply pass that leaves a delete file makes its table due for compaction
    document["spec"]["sink"]["maintenance"] = {"deleteFileThreshold": 1, "maxTimeShare": 1}
    document["spec"]["source"]["ddlCapture"] = "Catalog"  # a column rename is a re-snapshot
    path.write_text(yaml.safe_dump(document))
    environment = fixtures_s3.run_environment(db, store, store.catalog_secrets())
    for name, value in environment.items():  # (restored at the end: run.run exports them)
        monkeypatch.setenv(name, value)
    local = config.load(str(path), state_dir=str(state_dir), environ=environment)
    secrets = local.job.catalog_secrets(environment)

    local_support.run_in_process(local, rest_spark, once=True)  # the snapshot
    _assert_equal(local, db, tables, secrets)
    snapshot_lsn = mirror_progress.read(local.ingestion, tables, secrets=secrets)[accounts].lsn

    with db.connect() as conn:  # streamed changes: updates, inserts, deletes
        local_support.change_accounts_and_items(conn)
    with monkeypatch.context() as executors:  # reduced by an executor task reading S3 staging
        executors.setattr(spread, "DRIVER_CHANGES", 0)  # (TaskSegments), on the latest-change
        executors.setattr(spread, "ONE_TASK_LATEST_CHANGES", 1)  # path: every unit read thrice
        local_support.run_in_process(local, rest_spark, once=True)
    _assert_equal(local, db, tables, secrets)
    progress = mirror_progress.read(local.ingestion, tables, secrets=secrets)  # what the operator reads
    applied = progress[accounts].lsn
    assert applied is not None and snapshot_lsn is not None and applied > snapshot_lsn
    assert "compacted (" in (progress[accounts].maintenance or "")  # maintenance ran, on S3

    def migrate_then_verify() -> str:
        """While the run streams: a column Iceberg can add, a rename it cannot follow (that table
        is copied again, online), more traffic; then the exact check, which needs a running
        pipeline, through the REST catalog."""
        with db.connect() as conn:
            conn.execute("ALTER TABLE items ADD COLUMN extra int DEFAULT 7")
            conn.execute("UPDATE items SET extra = id WHERE id <= 20")
            conn.execute("ALTER TABLE accounts RENAME COLUMN note TO memo")
            conn.execute("UPDATE accounts SET memo = 'renamed' WHERE id <= 30")
        wait_for(lambda: mirror_progress.read(local.ingestion, [accounts], secrets=secrets)[accounts]
                 .resnapshots_last_hour == 1, "the re-snapshot of public.accounts", deadline=300, interval=1)
        workload = local_support.Workload(db, tables, {accounts: "balance", ITEMS: "v"})
        time.sleep(2)
        assert workload.stop() > 0
        assert cli.main(["verify", "-f", str(path), "--rounds", "2", "--timeout", "180", "-o", "json"]) == 0
        return capsys.readouterr().out

    capsys.readouterr()
    _, verified = local_support.run_in_process(local, rest_spark, once=False, during=migrate_then_verify)
    assert verified is not None and json.loads(verified)["equal"] is True, verified
    _assert_equal(local, db, tables, secrets)  # (verify waited for every change: quiet now)
    progress = mirror_progress.read(local.ingestion, tables, secrets=secrets)
    assert progress[accounts].resnapshots_last_hour == 1, progress[accounts]
    assert progress[ITEMS].resnapshots_last_hour == 0, progress[ITEMS]
    mirror = catalogs.load_table(local.ingestion.spec.sink.catalog,
                                 local.job.names.mirror_identifier(ITEMS), secrets)
    assert mirror is not None and "extra" in mirror.schema().column_names
    assert mirror.metadata_location.startswith("s3://")
    # DuckDB reads the same mirrors through the REST catalog (OAuth2) and S3, row by row: the one
    # re-snapshotted after its rename, the one with an added column and compacted deletes
    reader = duckdb_reader.connect()
    duckdb_reader.attach_rest(reader, store, WAREHOUSE)
    for table in tables:
        names, rows = duckdb_reader.source_rows(db, table)
        read = duckdb_reader.catalog_rows(reader, "lake", local.job.names.mirror_identifier(table), names)
        duckdb_reader.assert_rows_equal(rows, read, table)

    staging = pafs.FileSystem.from_uri(f"s3://{prefix}")[0]
    names = [f.base_name for f in staging.get_file_info(pafs.FileSelector(prefix, recursive=True))]
    assert not [n for n in names if n.startswith(TEMP_PREFIX)], names  # nothing half-written

    # lakeslot status and cut read the mirrors through the REST catalog
    assert cli.main(["status", "-f", str(path), "--state-dir", str(state_dir), "-o", "json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert {t["state"] for t in status["tables"]} == {"Streaming"}
    assert all(t.get("appliedLsn") for t in status["tables"]), status["tables"]
    # (one table: after the re-snapshot the two mirrors share no LSN until their next common pass)
    assert cli.main(["cut", "-f", str(path), "--state-dir", str(state_dir), "--table", str(ITEMS),
                     "-o", "json"]) == 0
    cut = json.loads(capsys.readouterr().out)
    assert cut == cuts.document(local.ingestion, cuts.choose(
        cuts.read(local.ingestion, [ITEMS], secrets=secrets)))
    for text in (json.dumps(status), json.dumps(cut), verified, capsys.readouterr().err):
        assert store.secret_key not in text and db.cluster.password not in text
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == store.secret_key  # (from the environment only)


@pytest.mark.slow
def test_an_apply_commit_whose_answer_is_lost_after_it_landed_is_not_applied_twice(
        pgdb, rest_spark, object_store, tmp_path, monkeypatch, caplog):
    """A commit that timed out on the client but landed on the catalog (the proxy forwards it,
    then closes the connection without the answer; Iceberg's REST client reports an error): the
    apply job's retry finds the table's position already at the batch's end (the LSN rule) and
    applies nothing again — no second commit of the batch (before, the retry re-applied it on
    top of the landed one: harmless for a keyed mirror's rows, a doubled batch all the same) —
    and each change is in the mirror once, row by row."""
    db, store = pgdb, object_store
    with db.connect() as conn:
        tables = local_support.create_accounts_and_items(conn, 400, 200)
    proxy = CommitProxy(store.rest_uri)
    try:
        # (a catalog of its own on the shared session: Spark keeps the one it loaded per name)
        catalog = {**store.catalog_document(), "name": "lostanswer", "uri": proxy.uri}
        define_catalog(rest_spark, catalog, store.catalog_secrets())
        document = fixtures_s3.ingestion_document(db, f"s3://{STAGING_BUCKET}/{uuid.uuid4().hex[:12]}", tables,
                                                  catalog)
        local = fixtures_s3.local_config(db, store, document, tmp_path, monkeypatch)
        secrets = local.job.catalog_secrets(local.environ)
        local_support.run_in_process(local, rest_spark, once=True)  # the snapshot
        before = mirror_progress.read(local.ingestion, tables, secrets=secrets)

        with db.connect() as conn:
            local_support.change_accounts_and_items(conn)
        proxy.drop_answer()
        local_support.run_in_process(local, rest_spark, once=True)
        assert proxy.fired.is_set(), "no apply commit went through the proxy"
        [(table, status)] = proxy.dropped
        assert status == 200, f"the catalog refused the commit whose answer was dropped: {status}"
        assert any("landed though the attempt failed" in r.getMessage() for r in caplog.records), \
            "the retry did not look for the landed commit"
        local_support.run_in_process(local, rest_spark, once=True)  # whatever the first run left to do
        _assert_equal(local, db, tables, secrets)
        after = mirror_progress.read(local.ingestion, tables, secrets=secrets)
        assert all((after[t].lsn or 0) > (before[t].lsn or 0) for t in tables), (before, after)
        # the landed commit's changes are in its table once: no later commit re-added them
        mirror = catalogs.load_table(local.ingestion.spec.sink.catalog,
                                     local.job.names.mirror_identifier(
                                         next(t for t in tables if table.endswith(t.name))), secrets)
        assert mirror is not None
        lsns = [s.summary.additional_properties.get(LSN_PROPERTY) for s in mirror.snapshots()
                if s.summary is not None and s.summary.operation.value != "replace"]
        summaries = "\n".join(
            f"{s.snapshot_id} parent {s.parent_snapshot_id} {s.summary.operation.value} " + " ".join(
                f"{k}={v}" for k, v in s.summary.additional_properties.items()
                if k.startswith(("lakeslot", "added-records", "added-position", "deleted", "total-rec")))
            for s in mirror.snapshots() if s.summary)
        assert len([x for x in lsns if x is not None]) == len({x for x in lsns if x is not None}), summaries
    finally:
        proxy.close()


@pytest.mark.slow
def test_the_apply_driver_reads_each_segment_on_s3_once(pgdb, rest_spark, spark_warehouse,
                                                        iceberg_namespace, object_store, monkeypatch):
    """Staging on S3 through the benchmarks' proxy, every request recorded: an apply run over
    several segments, in several passes, fetches each segment once — one ``GET`` (before, a pass
    opened a segment for its footer, its small columns and its rows: a ``HEAD`` and a ``GET``
    each) — and the mirrors equal their sources row by row (pyiceberg)."""
    db = pgdb
    with db.connect() as conn:
        tables = local_support.create_accounts_and_items(conn, 0, 0)
        prepare(conn, tables)
    staging = f"s3://{STAGING_BUCKET}/{uuid.uuid4().hex[:12]}"
    job = workloads.JobInput(Pipeline.create(rest_spark, db, spark_warehouse, iceberg_namespace, staging,
                                             tables, snapshot={"mode": "never"}).ingestion, tuple(tables))
    with LatencyProxy(object_store.s3_endpoint, 0.0) as proxy:
        for name, value in {**object_store.environment(), "AWS_ENDPOINT_URL": proxy.uri,
                            workloads.PASSWORD_ENV: db.cluster.password}.items():
            monkeypatch.setenv(name, value)
        for round_ in range(3):  # a segment or more each
            with db.connect() as conn:
                conn.execute("INSERT INTO accounts (id, balance, note) SELECT g, g, 'x' "
                             "FROM generate_series(%s::int, %s::int) g", (round_ * 1000 + 1, round_ * 1000 + 300))
                conn.execute("INSERT INTO items SELECT g, 'i' || g FROM generate_series(%s::int, %s::int) g",
                             (round_ * 100 + 1, round_ * 100 + 100))
                local_support.change_accounts_and_items(conn)
                target = current_lsn(conn)
            read_until(db, staging, target)
        segments = {n.filename for n in Staging(staging).list()}
        assert len(segments) >= 3, segments
        proxy.recording.set()
        result = apply_job.run(rest_spark, job, once=True, max_segments=2)
        proxy.recording.clear()
    assert result.passes >= 2 and result.ok, result
    gets = dict.fromkeys(segments, 0)
    for r in proxy.requests:
        if r.method == "GET" and (name := r.path.rsplit("/", 1)[-1]) in gets:
            gets[name] += 1
    assert set(gets.values()) == {1}, gets
    for table in tables:
        assert_equal_to_source(db, spark_warehouse.as_uri(), job.names.mirror_identifier(table), table)


@pytest.mark.slow
def test_s3_staging_and_a_jdbc_catalog_on_postgresql_end_to_end(pgdb, rest_spark, object_store, tmp_path,
                                                                monkeypatch, capsys, caplog):
    db, store = pgdb, object_store
    suffix = uuid.uuid4().hex[:12]
    # the catalog's own database and role; a password that the SQLAlchemy URL must encode
    catalog_db, role = f"catalog_{suffix}", f"catalog_{suffix}"
    password = f"p@ss:w/rd?#% {random_secrets.token_urlsafe(12)}"
    with db.cluster.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(catalog_db), sql.Identifier(role)))
    try:
        with db.connect() as conn:
            tables = local_support.create_accounts_and_items(conn, 500, 200)
        accounts = tables[0]
        name = f"jdbc_{suffix}"  # (a catalog name keeps its first definition for the session)
        uri = f"jdbc:postgresql://{db.cluster.address}:{db.cluster.port}/{catalog_db}"
        catalog_document = fixtures_s3.jdbc_catalog_document(store, name, uri, role, f"jdbc-{suffix}")
        catalog_secrets = fixtures_s3.jdbc_catalog_secrets(store, password)
        define_catalog(rest_spark, catalog_document, catalog_secrets)
        # DriverManager hands the driver to a caller of the system class loader (py4j's) too: it
        # is on the system class path, not only in spark.jars (lakeslot.spark.jars.system_class_path)
        assert rest_spark.sparkContext._jvm.java.sql.DriverManager.getDriver(uri) is not None
        path, state_dir = tmp_path / "ingestion.yaml", tmp_path / "state"
        path.write_text(yaml.safe_dump(fixtures_s3.ingestion_document(
            db, f"s3://{STAGING_BUCKET}/{suffix}", tables, catalog_document, name="s3-jdbc")))
        environment = fixtures_s3.run_environment(db, store, catalog_secrets)
        for key, value in environment.items():  # (restored at the end: run.run exports them)
            monkeypatch.setenv(key, value)
        local = config.load(str(path), state_dir=str(state_dir), environ=environment)
        secrets = local.job.catalog_secrets(environment)
        caplog.set_level(logging.INFO)

        snapshot, _ = local_support.run_in_process(local, rest_spark, once=True)
        _assert_equal(local, db, tables, secrets)  # pyiceberg, through the SQL catalog
        snapshot_lsn = mirror_progress.read(local.ingestion, tables, secrets=secrets)[accounts].lsn
        with db.connect() as conn:
            local_support.change_accounts_and_items(conn)
        streamed, _ = local_support.run_in_process(local, rest_spark, once=True)
        _assert_equal(local, db, tables, secrets)
        applied = mirror_progress.read(local.ingestion, tables, secrets=secrets)[accounts].lsn
        assert applied is not None and snapshot_lsn is not None and applied > snapshot_lsn

        # Spark's JdbcCatalog and pyiceberg's SQL catalog share the rows of one catalog name
        with db.cluster.connect(catalog_db) as conn:
            rows = dict(conn.execute("SELECT table_name, metadata_location FROM iceberg_tables "
                                     "WHERE catalog_name = %s", (name,)).fetchall())
        for table in tables:
            ident = local.job.names.mirror_identifier(table)
            mirror = catalogs.load_table(local.ingestion.spec.sink.catalog, ident, secrets)
            assert mirror is not None and mirror.metadata_location == rows[ident[-1]]
            assert mirror.metadata_location.startswith(f"s3://{WAREHOUSE_BUCKET}/jdbc-{suffix}/")

        capsys.readouterr()
        assert cli.main(["status", "-f", str(path), "--state-dir", str(state_dir), "-o", "json"]) == 0
        out, err = capsys.readouterr()
        status = json.loads(out)
        assert {t["state"] for t in status["tables"]} == {"Streaming"}
        assert all(t.get("appliedLsn") for t in status["tables"]), status["tables"]

        # a refused password shows as the Streaming condition, naming the setting
        monkeypatch.setenv(workloads.catalog_secret_env("jdbc.password"), f"{password}-wrong")
        assert cli.main(["status", "-f", str(path), "--state-dir", str(state_dir), "-o", "json"]) == 0
        refused, refused_err = capsys.readouterr()
        streaming = {c["type"]: c for c in json.loads(refused)["conditions"]}["Streaming"]
        assert streaming["reason"] == "CatalogUnreachable", streaming
        assert "refused the credentials" in streaming["message"] and "jdbc.password" in streaming["message"]

        # credentials from the environment only: in no output, not in the static Spark conf
        spec = local.ingestion.spec.sink.catalog
        state_files = [f.read_text(errors="replace") for f in state_dir.rglob("*") if f.is_file()]
        for text in (out, err, refused, refused_err, caplog.text, snapshot.message, streamed.message,
                     json.dumps(catalogs.spark_conf(spec)), path.read_text(), *state_files):
            for secret in (password, urllib.parse.quote(password, safe=""), store.secret_key):
                assert secret not in (text or "")
    finally:
        db.cluster.drop_database(catalog_db)
        with db.cluster.connect() as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.slow
def test_the_operator_reads_the_mirrors_through_the_rest_catalog_with_credentials_only_in_secrets(
        kube, api, pgdb, rest_spark, object_store, tmp_path, monkeypatch):
    """The real kopf operator on the Kubernetes API emulator reconciles an S3 + REST ingestion: it
    reads every mirror's progress through the REST catalog with the credentials it resolves from
    the Secrets the spec names, and no credential shows in the resource, its status, its events or
    the children it writes (they refer to the Secrets). Simulated, because pods cannot run here:
    the reader Deployment and the SparkApplications, whose work ``lakeslot run`` does in this process
    (its reader registered as the reader pod, so the operator leaves it the slot)."""
    db, store = pgdb, object_store
    with db.connect() as conn:
        tables = local_support.create_accounts_and_items(conn, 500, 100)
    document = fixtures_s3.ingestion_document(db, f"s3://{STAGING_BUCKET}/{uuid.uuid4().hex[:12]}", tables,
                                              store.catalog_document())
    name = document["metadata"]["name"]
    path = tmp_path / "ingestion.yaml"
    path.write_text(yaml.safe_dump(document))
    environment = fixtures_s3.run_environment(db, store, store.catalog_secrets())
    for key, value in environment.items():  # (the apply job's, in this process)
        monkeypatch.setenv(key, value)
    local = config.load(str(path), state_dir=str(tmp_path / "state"), environ=environment)
    references = document["spec"]["sink"]["catalog"]["secretProperties"]
    operator_env.create_secret(api, "lake-credentials",
                               {ref["key"]: store.catalog_secrets()[key] for key, ref in references.items()})
    operator_env.create_secret(api, "s3", {
        k: store.environment()[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    registry = build_registry(Context(kube=Kube(api)), timer_interval=1.0, login_via_client=False)
    with running_operator(kube, registry):
        operator_env.create_ingestion(api, document, db.cluster.password)
        wait_for(lambda: f"{name}-reader" in operator_env.deployments(api), "the reader Deployment")
        operator_env.reader_pod_running(api, name, reader_process.pod_identity())
        local_support.run_in_process(local, rest_spark, once=True)  # snapshot, stream, apply: caught up, stopped
        progress = mirror_progress.read(local.ingestion, tables, secrets=local.job.catalog_secrets(environment))
        applied = {str(t): lsn_text.format(p.lsn) for t, p in progress.items() if p.lsn is not None}
        assert len(applied) == len(tables), progress

        def read_by_the_operator() -> dict | None:
            resource = operator_env.get_ingestion(api, name) or {}
            shown = {f"{t['schema']}.{t['name']}": t.get("appliedLsn")
                     for t in resource.get("status", {}).get("tables", [])}
            return resource if shown == applied else None

        resource = wait_for(read_by_the_operator, "the operator to show each mirror's applied LSN")
        children = {**operator_env.spark_applications(api), **operator_env.deployments(api)}
        assert children, "the operator wrote its children"
    events = kubernetes.client.CoreV1Api(api).list_namespaced_event(operator_env.NAMESPACE)
    written = json.dumps([resource, children, api.sanitize_for_serialization(events)])
    for secret in (store.secret_key, store.catalog_secrets()["credential"], db.cluster.password):
        assert secret not in written


def test_refused_or_unreachable_storage_and_catalog_name_the_setting_to_fix(object_store, pgdb, tmp_path,
                                                                            monkeypatch, capsys):
    store = object_store
    spec = CatalogSpec.model_validate(store.catalog_document())
    good = store.catalog_secrets()
    ident = ("nowhere", "nothing")
    assert catalogs.load_table(spec, ident, good) is None  # reachable, authorised: just no table
    refused = {  # what is wrong → what the message must name
        "OAuth2 client credentials.*fix the credential.*sink.catalog.secretProperties":
            (spec, {**good, "credential": f"{store.access_key}:wrong"}),
        "401 Unauthorized.*sink.catalog.secretProperties":
            (spec, {k: v for k, v in good.items() if k != "credential"}),
        "sink.catalog.uri .*/nope answered 404.*fix sink.catalog.uri":
            (spec.model_copy(update={"uri": f"{store.rest_uri}/nope"}), good),
        "sink.catalog.uri .* cannot be reached.*fix sink.catalog.uri":
            (spec.model_copy(update={"uri": f"http://127.0.0.1:{free_port()}"}), good),
    }
    for expected, (catalog, secrets) in refused.items():
        with pytest.raises(catalogs.CatalogAccessError, match=expected) as caught:
            catalogs.load_table(catalog, ident, secrets)
        assert store.secret_key not in str(caught.value)
    assert "403 Forbidden" in (catalogs.explain_error(spec, ForbiddenError("Forbidden: no grant")) or "")

    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)
    Staging(f"s3://{STAGING_BUCKET}/fine").list()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(StorageError, match=r"spec.staging.uri s3://stage/refused: .*refused the credentials.*"
                                           r"fix AWS_ACCESS_KEY_ID"):
        Staging(f"s3://{STAGING_BUCKET}/refused").list()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", store.secret_key)
    with pytest.raises(StorageError, match=r"spec.staging.uri s3://no-such-bucket/x: the bucket does not exist"):
        Staging("s3://no-such-bucket/x")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StorageError, match="endpoint cannot be reached: fix AWS_ENDPOINT_URL"):
        Staging(f"s3://{STAGING_BUCKET}/unreachable")
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.s3_endpoint)

    # lakeslot status shows it as its Streaming condition
    with pgdb.connect() as conn:
        table = local_support.create_accounts(conn, 10)
    path = tmp_path / "ingestion.yaml"
    path.write_text(yaml.safe_dump(fixtures_s3.ingestion_document(
        pgdb, f"s3://{STAGING_BUCKET}/status", [table], store.catalog_document())))
    for name, value in {**fixtures_s3.run_environment(pgdb, store, store.catalog_secrets()),
                        workloads.catalog_secret_env("credential"): f"{store.access_key}:wrong"}.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert cli.main(["status", "-f", str(path), "--state-dir", str(tmp_path / "state"), "-o", "json"]) == 0
    out = capsys.readouterr().out
    streaming = {c["type"]: c for c in json.loads(out)["conditions"]}["Streaming"]
    assert streaming["reason"] == "CatalogUnreachable"
    assert "fix the credential" in streaming["message"] and "sink.catalog.secretProperties" in streaming["message"]
    assert store.secret_key not in out


def test_a_jdbc_catalog_that_refuses_or_cannot_be_reached_names_the_setting_to_fix(pgdb):
    """pyiceberg's SQL catalog on the JDBC catalog's database: a refused password, a missing
    database, no server, a URI that is not PostgreSQL's — each names what to fix, never a
    password."""
    cluster = pgdb.cluster
    server = f"jdbc:postgresql://{cluster.address}:{cluster.port}"
    spec = CatalogSpec.model_validate({
        "name": "refusing", "type": "jdbc", "uri": f"{server}/{pgdb.name}",
        "properties": {"jdbc.user": cluster.superuser},
        "secretProperties": {"jdbc.password": {"name": "catalog", "key": "password"}}})
    good, wrong = {"jdbc.password": cluster.password}, {"jdbc.password": f"{cluster.password}-wrong"}
    ident = ("nowhere", "nothing")
    assert catalogs.load_table(spec, ident, good) is None  # reachable, authorised: just no table
    refused = {  # what is wrong → what the message must name
        r"at jdbc:postgresql://\S+ refused the credentials \(.*password authentication failed.*\): fix "
        r"jdbc\.user \(sink\.catalog\.properties\) or jdbc\.password \(sink\.catalog\.secretProperties\)":
            (spec, wrong),
        r"cannot be reached or refused the connection \(.*\"nodb\" does not exist.*\): fix sink\.catalog\.uri":
            (spec.model_copy(update={"uri": f"{server}/nodb"}), good),
        r"at jdbc:postgresql://127\.0\.0\.1:\d+/x cannot be reached .*: fix sink\.catalog\.uri":
            (spec.model_copy(update={"uri": f"jdbc:postgresql://127.0.0.1:{free_port()}/x"}), good),
        r"sink\.catalog\.uri jdbc:mysql:…: lakeslot reads a JDBC catalog on PostgreSQL .*: fix sink\.catalog\.uri":
            (spec.model_copy(update={"uri": f"jdbc:mysql://{cluster.address}/x?password={cluster.password}"}), good),
    }
    for expected, (catalog, secrets) in refused.items():
        with pytest.raises(catalogs.CatalogAccessError, match=expected) as caught:
            catalogs.load_table(catalog, ident, secrets)
        assert cluster.password not in str(caught.value)


def test_a_jdbc_catalog_whose_tables_java_creates_while_pyiceberg_starts_is_read(pgdb, monkeypatch):
    """Iceberg's Java JdbcCatalog creates the catalog's tables without ``iceberg_type`` (its
    default layout) after pyiceberg saw none and before it created them (simulated: its creation
    is preceded by Java's statements): the SQL catalog lakeslot keeps for the process must not
    go on filtering on a column that does not exist."""
    from pyiceberg.catalog.sql import SqlCatalog

    with pgdb.cluster.connect() as conn:
        conn.execute(f"CREATE DATABASE {pgdb.name}_race")
    uri = f"jdbc:postgresql://{pgdb.cluster.address}:{pgdb.cluster.port}/{pgdb.name}_race"
    spec = CatalogSpec.model_validate({
        "name": f"race_{pgdb.name}", "type": "jdbc", "uri": uri, "properties": {"jdbc.user": pgdb.cluster.superuser},
        "secretProperties": {"jdbc.password": {"name": "catalog", "key": "password"}}})
    create_tables = SqlCatalog.create_tables

    def java_first(self) -> None:
        with self.engine.begin() as connection:  # Iceberg 1.10's JdbcCatalog, schema V0
            connection.exec_driver_sql(
                "CREATE TABLE iceberg_tables (catalog_name VARCHAR(255) NOT NULL, table_namespace "
                "VARCHAR(255) NOT NULL, table_name VARCHAR(255) NOT NULL, metadata_location VARCHAR(1000), "
                "previous_metadata_location VARCHAR(1000), PRIMARY KEY (catalog_name, table_namespace, table_name))")
            connection.exec_driver_sql(
                "CREATE TABLE iceberg_namespace_properties (catalog_name VARCHAR(255) NOT NULL, namespace "
                "VARCHAR(255) NOT NULL, property_key VARCHAR(255), property_value VARCHAR(1000), "
                "PRIMARY KEY (catalog_name, namespace, property_key))")
        create_tables(self)

    monkeypatch.setattr(SqlCatalog, "create_tables", java_first)
    try:
        assert catalogs.load_table(spec, ("nowhere", "nothing"), {"jdbc.password": pgdb.cluster.password}) is None
    finally:
        catalogs._sql_catalog.cache_clear()  # (its pool holds connections to the database)
        with pgdb.cluster.connect() as conn:
            conn.execute(f"DROP DATABASE {pgdb.name}_race WITH (FORCE)")


def test_segments_on_s3_are_sealed_whole_without_a_rename_and_retention_deletes_them(object_store, monkeypatch):
    """Object stores have no rename: a segment is one upload of its final name, visible whole or
    not at all; an upload that fails half-way leaves no object under a sealed name; documents are
    one PUT; retention deletes on S3 too. (SIGKILL mid-upload relies on S3 itself: a multipart
    upload that is never completed is no object.) Every request is counted by a proxy in front
    of S3: a segment below 5 MB is sealed by one PUT and the HEAD that checks its size — not a
    multipart upload, three requests one after the other — and a document by one PUT."""
    with LatencyProxy(object_store.s3_endpoint, 0) as proxy:
        environment = {**object_store.environment(), "AWS_ENDPOINT_URL": proxy.uri}
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        prefix = f"{STAGING_BUCKET}/{uuid.uuid4().hex[:12]}"
        staging = Staging(f"s3://{prefix}")
        s3 = staging.fs

        def objects() -> list[str]:
            return sorted(f.base_name for f in s3.get_file_info(pafs.FileSelector(prefix, recursive=True))
                          if f.type == pafs.FileType.File)

        def requests(write) -> list[str]:
            proxy.requests.clear()
            proxy.recording.set()
            try:
                write()
            finally:
                proxy.recording.clear()
            return [r.method for r in proxy.requests]

        def seal(name: SegmentName) -> None:
            temp, local = staging.temporary(name.start)
            assert not temp.startswith(prefix)  # written locally, uploaded once
            with local.open_output_stream(temp) as out:
                out.write(os.urandom(3 << 20))
            staging.publish(temp, name)
            assert not os.path.exists(temp)

        first, second, third = SegmentName(0x10, 0x20), SegmentName(0x20, 0x30), SegmentName(0x30, 0x40)
        assert requests(lambda: seal(first)) == ["PUT", "HEAD"]
        assert staging.list() == [first] and objects() == [first.filename]

        def half_then_fail(source, destination, source_filesystem, destination_filesystem):
            with open(source, "rb") as f, destination_filesystem.open_output_stream(destination) as out:
                out.write(f.read(1 << 20))  # what a broken stream may leave behind on close
            raise OSError("connection reset during upload")

        monkeypatch.setattr(pafs, "copy_files", half_then_fail)
        with pytest.raises(OSError, match="connection reset"):
            seal(second)
        assert staging.list() == [first] and objects() == [first.filename]
        monkeypatch.undo()
        for name, value in environment.items():
            monkeypatch.setenv(name, value)

        seal(second)
        seal(third)
        assert requests(lambda: staging.write_apply_status({"passes": 1})) == ["PUT"]
        assert staging.read_apply_status() == {"passes": 1}
        assert objects() == sorted([first.filename, second.filename, third.filename, "apply-status.json"])
        # retention: below every table's position, never the furthest segment
        assert staging.delete_applied(staging.list(), floor=0x40, cutoff=time.time() + 60) == 2
        assert staging.list() == [third]


@contextlib.contextmanager
def _behind_proxies(spark, store, name: str, delay_s: float):
    """Spark's catalog ``name``: ``store``'s REST catalog and S3, each behind a
    :class:`LatencyProxy` adding ``delay_s`` (the catalog's answers name the S3 proxy as the
    tables' endpoint). Yields the proxies (S3's, the catalog's)."""
    with LatencyProxy(store.s3_endpoint, delay_s) as s3, \
            LatencyProxy(store.rest_uri, delay_s, {store.s3_endpoint: s3.uri}) as rest:
        document = store.catalog_document()
        define_catalog(spark, {**document, "name": name, "uri": rest.uri,
                               "properties": {**document["properties"], "s3.endpoint": s3.uri}},
                       store.catalog_secrets())
        yield s3, rest


def _merge_on_read_table(spark, catalog: str, rows: int) -> tuple[str, str, str]:
    """A new table ``t`` (id bigint NOT NULL, v string: the id as text) of ``rows`` rows in one
    data file, in a new namespace of Spark's ``catalog``; format v2, its deletes and updates
    merge-on-read. Returns its namespace, its name and its full name."""
    namespace, name = f"{catalog}_{uuid.uuid4().hex[:8]}", "t"
    table = f"{catalog}.{namespace}.{name}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.{namespace}")
    spark.sql(f"CREATE TABLE {table} (id bigint NOT NULL, v string) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read', "
              "'write.update.mode'='merge-on-read')")
    spark.sql(f"INSERT INTO {table} SELECT id, CAST(id AS string) FROM range(0, {rows}, 1, 1)")
    return namespace, name, table


def test_files_larger_than_one_read_are_read_in_parts_and_find_the_same_rows(
        rest_spark, object_store, monkeypatch):
    """Where the driver finds keys' rows on object storage, a file is read whole in one call only
    up to ``row_delta.WHOLE_BYTES``; a larger one — here every file, the limit set to 64 bytes —
    is read in parts (its size asked first where the metadata did not give it: the delete files
    Spark wrote), and the rows found are the same: the live rows (Spark's deletes applied)."""
    with _behind_proxies(rest_spark, object_store, "parts", 0) as (s3, _rest):
        namespace, name, table = _merge_on_read_table(rest_spark, "parts", 100)
        rest_spark.sql(f"DELETE FROM {table} WHERE id % 10 = 3")
        jvm = rest_spark._jvm
        java_table = Tables(rest_spark, "parts", namespace).iceberg_table(name)
        keys = pa.table({"1": pa.array(range(0, 100, 7), pa.int64())})

        def found(positions):
            s3.requests.clear()
            s3.recording.set()
            rows = positions.find(jvm, java_table, row_delta.describe(jvm, java_table),
                                  [(1, "id")], keys).rows
            s3.recording.clear()
            heads = sorted(r.path.rsplit(".", 1)[-1] for r in s3.requests if r.method == "HEAD")
            return sorted(rows["1"].to_pylist()), heads

        whole, whole_heads = found(row_delta.Positions())
        monkeypatch.setattr(row_delta, "WHOLE_BYTES", 64)
        parts, parts_heads = found(row_delta.Positions())
        assert whole == parts == [k for k in range(0, 100, 7) if k % 10 != 3]
        assert whole_heads == [] and parts_heads == ["parquet"], (whole_heads, parts_heads)
        rest_spark.sql(f"DROP TABLE {table} PURGE")


@pytest.mark.slow
def test_a_row_delta_on_object_storage_asks_only_what_its_commit_needs(rest_spark, object_store):
    """The driver's row delta against the REST catalog and S3, every request counted by proxies
    in front of both (the catalog's answers name the S3 proxy as the tables' endpoint): once the
    table is loaded (a pass's one request), a commit is five PUTs — its two files, its two
    manifests, its manifest list: no existence check, no read of the parent's manifest list
    (read once, to find the keys' rows), none of the new one after the commit — and one commit to
    the catalog, no reload before or after it (and a pass's load is one request, also where
    Spark's catalog held no object of the table); finding the rows of its keys reads nothing, and
    on the table's first commit one request for each file it reads (no size asked: the manifest
    list is read to its end, the manifest's and the data file's sizes are in the entries that
    name them). A commit that starts from a table another writer
    committed to since it was loaded is refused by the catalog (409), reloads, and lands on top
    of the other commit. Read back through the catalog by pyiceberg, the table equals the model
    of every change."""
    store = object_store
    namespace, name = f"counted_{uuid.uuid4().hex[:8]}", "t"
    key = [(1, "id")]
    fid = b"PARQUET:field_id"
    schema = pa.schema([pa.field("id", pa.int64(), False, {fid: b"1"}),
                        pa.field("v", pa.string(), True, {fid: b"2"}),
                        pa.field("_lakeslot_lsn", pa.int64(), True, {fid: b"3"})])
    with _behind_proxies(rest_spark, store, "counted", 0) as (s3, rest):
        rest_spark.sql(f"CREATE NAMESPACE IF NOT EXISTS counted.{namespace}")
        rest_spark.sql(f"CREATE TABLE counted.{namespace}.{name} (id bigint NOT NULL, v string, "
                       "_lakeslot_lsn bigint) USING iceberg TBLPROPERTIES ('format-version'='2')")
        rest_spark.sql(f"INSERT INTO counted.{namespace}.{name} SELECT id, CAST(id AS string), 1 "
                       "FROM range(1, 101, 1, 1) AS r(id)")
        model = {i: str(i) for i in range(1, 101)}
        tables = Tables(rest_spark, "counted", namespace)
        positions = row_delta.Positions()
        jvm = rest_spark._jvm
        for helper in ("manifestList", "read"):  # (resolved once per JVM: not counted below)
            java(jvm, f"{ROW_DELTAS}.{helper}")
        for lsn in range(2, 6):
            if lsn == 2:  # Spark's catalog holds no object of the table (as once its cache expired)
                rest_spark.sql(f"REFRESH TABLE counted.{namespace}.{name}")
            rest.requests.clear()
            rest.recording.set()
            table = tables.iceberg_table(name)  # (a pass's load: one request, the first one too)
            rest.recording.clear()
            assert [(r.method, r.status) for r in rest.requests] == [("GET", 200)], rest.requests
            keys = [lsn, 50 + lsn]
            described = row_delta.describe(jvm, table)
            s3.requests.clear()
            s3.recording.set()
            with _py4j_calls(rest_spark) as calls:
                found = positions.find(jvm, table, described, key,
                                       pa.table({"1": pa.array(keys, pa.int64())}))
            s3.recording.clear()
            if lsn == 2:  # the table's first: its manifest list, its manifest and its data
                # file, each whole in one read, no size asked — the list read to its end, the
                # manifest's length is in the list, the data file's in the manifest's entry
                kinds = [(r.method, "list" if "/snap-" in r.path else r.path.rsplit(".", 1)[-1])
                         for r in s3.requests]
                assert kinds == [("GET", "list"), ("GET", "avro"), ("GET", "parquet")], s3.requests
                # and each file is one call to the JVM (RowDeltas' manifestList and read)
                assert len(calls) == 3, calls
            else:  # (known from this job's commit: nothing read, nothing asked of the JVM)
                assert s3.requests == [] and calls == [], (s3.requests, calls)
            rows = pa.table([pa.array(keys, pa.int64()), pa.array([f"v{lsn}-{k}" for k in keys]),
                             pa.array([lsn] * 2, pa.int64())], schema=schema)
            advanced = None
            if lsn == 5:  # another writer's commit (a table object of its own) since the load
                rest_spark.sql(f"REFRESH TABLE counted.{namespace}.{name}")  # (a new one cached)
                writer = Tables(rest_spark, "counted", namespace)
                writer.advance(name, lsn)
                advanced = writer.iceberg_table(name).currentSnapshot().snapshotId()
            for proxy in (s3, rest):
                proxy.requests.clear()
                proxy.recording.set()
            row_delta.commit(jvm, table, positions, found, found.deletes(), rows, key, lsn, "zstd")
            for proxy in (s3, rest):
                proxy.recording.clear()
            model.update({k: f"v{lsn}-{k}" for k in keys})
            to_table = [r for r in rest.requests if r.path.endswith(f"/tables/{name}")]
            assert [r for r in rest.requests if r.path.endswith("/metrics")] == []  # (off)
            commits = [(r.method, r.status) for r in to_table if r.commit]
            if advanced is not None:
                assert commits == [("POST", 409), ("POST", 200)], rest.requests
                current = table.currentSnapshot()
                assert (current.parentId(), current.summary().get(LSN_PROPERTY)) == (advanced, str(lsn))
                continue
            assert commits == [("POST", 200)] and len(to_table) == 1, rest.requests  # no reload
            # (the first from a table loaded anew too: the parent's manifest list, read to find
            # the keys' rows, is the snapshot's already)
            assert sorted((r.method, r.path.rsplit(".", 1)[-1]) for r in s3.requests) == [
                ("PUT", "avro")] * 3 + [("PUT", "parquet")] * 2, s3.requests
        mirror = catalogs.load_table(CatalogSpec.model_validate(store.catalog_document()),
                                     (namespace, name), store.catalog_secrets())
        assert mirror is not None
        read_back = mirror.scan(selected_fields=("id", "v")).to_arrow()
        assert dict(zip(read_back["id"].to_pylist(), read_back["v"].to_pylist(), strict=True)) == model
        rest_spark.sql(f"DROP TABLE counted.{namespace}.{name} PURGE")


def test_many_mirrors_loaded_at_once_through_the_rest_catalog_reuse_their_connections(
        object_store, caplog):
    """`lakeslot status`, every operator reconcile and `lakeslot run`'s supervision load the
    mirrors :data:`catalogs.LOAD_WORKERS` at a time through one REST client: its HTTP session
    keeps that many connections, so none is thrown away and opened again (urllib3 keeps 10 per
    host unless told, and says "Connection pool is full" for each it discards)."""
    spec = CatalogSpec.model_validate(object_store.catalog_document())
    idents = [(f"pooled_{uuid.uuid4().hex[:8]}", f"t{i}") for i in range(8 * catalogs.LOAD_WORKERS)]
    with caplog.at_level("WARNING", logger="urllib3.connectionpool"):
        loaded = catalogs.load_tables(spec, idents, object_store.catalog_secrets())
    assert loaded == [None] * len(idents)
    assert catalogs.LOAD_WORKERS > 10
    assert [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()] == []


@contextlib.contextmanager
def _py4j_calls(spark):
    """The commands this thread sends to ``spark``'s JVM inside the block (each a py4j round
    trip: a call, a field, a proxy released), as their first two lines."""
    client, thread = spark.sparkContext._gateway._gateway_client, threading.get_ident()
    sent: list[list[str]] = []
    real = client.send_command

    def counting(command, *args, **kwargs):
        if threading.get_ident() == thread:
            sent.append(command.split("\n")[:2])
        return real(command, *args, **kwargs)

    client.send_command = counting
    try:
        yield sent
    finally:
        del client.send_command  # (the class's method again)


def _most_at_once(requests) -> int:
    """The most of ``requests`` in flight at one moment."""
    edges = sorted([(r.start, 1) for r in requests] + [(r.end, -1) for r in requests])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_a_small_table_compacted_on_the_driver_on_object_storage_reads_its_files_at_once(
        rest_spark, object_store):
    """A small mirror's compaction on the driver against the REST catalog and S3, behind proxies
    adding 50 ms to every request: after eight merge-on-read commits (a data file each, their
    deletes, their manifests) its manifests are read several at a time, as are its data files
    (with their delete files), not one after the other, and no file's size is asked; its
    commit and the manifests' rewrite after it are a request to the catalog each, with no load of
    the table before or between. Read back through the catalog by pyiceberg: the same rows, in
    one data file, no delete file left."""
    store = object_store
    with _behind_proxies(rest_spark, store, "compacting", 0.05) as (s3, rest):
        namespace, name, table = _merge_on_read_table(rest_spark, "compacting", 200)
        for n in range(7):
            rest_spark.sql(f"UPDATE {table} SET v = 'u{n}' WHERE id % 7 = {n}")
        spec = CatalogSpec.model_validate(store.catalog_document())

        def read_back():
            mirror = catalogs.load_table(spec, (namespace, name), store.catalog_secrets())
            assert mirror is not None
            return mirror, sorted(mirror.scan().to_arrow().to_pylist(), key=lambda r: r["id"])

        mirror, before = read_back()
        assert int(mirror.current_snapshot().summary["total-data-files"]) >= 8
        assert int(mirror.current_snapshot().summary["total-delete-files"]) >= 1
        java_table = Tables(rest_spark, "compacting", namespace).iceberg_table(name)
        for proxy in (s3, rest):
            proxy.requests.clear()
            proxy.recording.set()
        outcome = Maintainer(rest_spark, MaintenanceSpec(), row_delta.Positions()).maintain(
            java_table, name, idle=True)
        for proxy in (s3, rest):
            proxy.recording.clear()
        assert outcome is not None and "on the driver" in outcome, outcome
        gets = [r for r in s3.requests if r.method == "GET"]
        manifests = [r for r in gets if r.path.endswith(".avro") and "/snap-" not in r.path]
        data = [r for r in gets if r.path.endswith(".parquet")]
        assert len(manifests) >= 8 and _most_at_once(manifests) >= 4, s3.requests
        assert len(data) >= 8 and _most_at_once(data) >= 4, s3.requests
        # no file's size is asked: a data file's is in its manifest entry, a delete file is
        # read to its end
        assert [r for r in s3.requests if r.method == "HEAD"] == [], s3.requests
        to_table = [(r.method, r.status) for r in rest.requests
                    if r.path.endswith(f"/tables/{name}")]
        # its commit, then the manifests' rewrite: no load before or between them; the one load
        # is the maintenance record's property update, last
        assert to_table[:2] == [("POST", 200)] * 2 and to_table[2:] == [("GET", 200), ("POST", 200)], \
            rest.requests
        assert "manifests rewritten" in outcome, outcome
        mirror, after = read_back()
        assert after == before  # every column of every row
        summary = mirror.current_snapshot().summary
        assert (summary["total-data-files"], summary["total-delete-files"]) == ("1", "0")
        rest_spark.sql(f"DROP TABLE {table} PURGE")
