"""Every file of ``examples/`` runs to Ready, as written apart from host names, under an operator
whose process holds no credential (tests/support/operator_process.py), as an operator pod's.

Each example is loaded from disk and only where it points is changed: the source's host and port,
the catalog's URI (its host and port), and the object store's endpoint. The endpoint is an
``AWS_ENDPOINT_URL`` entry added to ``spec.secretEnv`` from the Secret the example already names
(with ``AWS_REGION``, which an endpoint outside AWS needs to be signed for: in a cluster on AWS the
SDK finds the region itself), which counts as pointing at a host. The names the example uses —
namespace, Secrets and their keys, roles, databases, buckets, catalog name, publication, slot,
tables — are created here as the example expects them, with this test's credentials.

Simulated, because pods cannot run here: the spark-operator's controller and the pods (the reader
Deployment's Pod is created and reported running as the Deployment controller and kubelet would;
the SparkApplications' states are written as the spark-operator would). The pods' work runs as
``lakeslot run --once`` in a process of its own (its own JVM: the example keeps its catalog name
``lakeslot``, which the tests' shared Spark session uses for a hadoop catalog) whose environment is
exactly what the pods get from the example's Secret references (nothing of the test's own).
The mirrors are then read with pyiceberg through the catalog, independently of lakeslot, and
compared with the source row by row.

``examples/ingestion-full.yaml``: PostgreSQL 15 with TLS (``sslMode: verify-full`` against the CA in
the example's ``caSecretRef`` Secret; the embedded PostgreSQL 18 has no SSL), a CDC role with
REPLICATION and column-level SELECT only, the publication created by a DBA (the example's
``publicationManagement: Auto`` then verifies it), a JDBC catalog on its own database and role, and
the example's buckets as plain buckets of an object store of its own (the shared one's ``lake`` is a
table bucket, which refuses staging writes).
"""

from __future__ import annotations

import base64
import copy
import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest
import yaml
from psycopg import sql

from lakeslot import workloads
from lakeslot.api.models import GROUP, PLURAL, VERSION
from lakeslot.local.objectstore import REGION, WAREHOUSE, ObjectStore, ObjectStoreError, running, weed
from tests.support import operator_env as env
from tests.support.local_support import LAKESLOT, RUN_DEADLINE_S
from tests.support.operator_process import KEPT, ROOT, scrubbed_operator
from tests.support.waiting import wait_for

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def example_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    """An object store whose bucket ``lake`` (the examples' staging and warehouse) is a plain one."""
    if weed() is None:
        pytest.skip("object storage unavailable: no `weed` binary")
    try:
        with running(tmp_path_factory.mktemp("example-s3"), plain_buckets=[WAREHOUSE], table_bucket=None) as store:
            yield store
    except ObjectStoreError as e:
        pytest.fail(str(e))


def _example(name: str) -> dict:
    (document,) = yaml.safe_load_all((EXAMPLES / name).read_text())
    return document


def _secret(api, namespace: str, name: str, values: dict[str, str]) -> None:
    env.create_secret(api, name, values, namespace=namespace)


def _secret_values(api, namespace: str, ref: dict) -> str:
    data = kubernetes.client.CoreV1Api(api).read_namespaced_secret(ref["name"], namespace).data or {}
    return base64.b64decode(data[ref["key"]]).decode()


def _pod_environment(api, document: dict, ca_file: Path | None) -> dict[str, str]:
    """What the example's pods get from its Secret references (simulated kubelet), as local mode
    reads it (lakeslot.local.config): nothing of this process's environment but :data:`KEPT`
    (and ``PYTHONPATH``: the image's code is this checkout's)."""
    namespace, spec = document["metadata"].get("namespace", "default"), document["spec"]
    environ = {k: os.environ[k] for k in KEPT if k in os.environ}
    environ["PYTHONPATH"] = str(ROOT)
    environ[workloads.PASSWORD_ENV] = _secret_values(api, namespace, spec["source"]["passwordSecretRef"])
    if ca_file is not None:
        environ[workloads.CA_FILE_ENV] = str(ca_file)
    for key, ref in spec["sink"]["catalog"].get("secretProperties", {}).items():
        environ[workloads.catalog_secret_env(key)] = _secret_values(api, namespace, ref)
    for variable in spec.get("secretEnv", []):
        environ[variable["name"]] = _secret_values(api, namespace, variable["secretKeyRef"])
    return environ


def _status(api, name: str, namespace: str) -> dict:
    return (env.get_ingestion(api, name, namespace) or {}).get("status") or {}


def _ready_and_streaming(api, name: str, namespace: str, tables: int) -> dict | None:
    status = _status(api, name, namespace)
    ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
    states = [t["state"] for t in status.get("tables", [])]
    return status if ready.get("status") == "True" and states == ["Streaming"] * tables else None


def _run_pipeline(api, document: dict, environ: dict[str, str], tmp_path: Path, tables: int) -> dict:
    """The pods' work for ``document`` (as written to ``tmp_path``): ``lakeslot run --once`` in a
    process of its own with ``environ``; the reader Pod running (its identity: that process's
    reader), the snapshot application COMPLETED and the apply one RUNNING. The Ready status."""
    name, namespace = document["metadata"]["name"], document["metadata"].get("namespace", "default")
    path = tmp_path / "example.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True, sort_keys=False))
    wait_for(lambda: f"{name}-reader" in env.deployments(api, namespace), "the reader Deployment")
    with (tmp_path / "run.log").open("wb") as log:
        run = subprocess.Popen([LAKESLOT, "run", "--once", "--plain", "-f", str(path), "--state-dir",
                                str(tmp_path / "state")], env=environ, stdout=log, stderr=subprocess.STDOUT)
    try:
        env.reader_pod_running(api, name, f"local-{socket.gethostname()}-{run.pid}", namespace=namespace)
        code = run.wait(RUN_DEADLINE_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert code == 0, (tmp_path / "run.log").read_text()[-5000:]
    wait_for(lambda: f"{name}-apply" in env.spark_applications(api, namespace), "the apply SparkApplication")
    for application in env.spark_applications(api, namespace):
        env.set_spark_state(api, application, "RUNNING" if application == f"{name}-apply" else "COMPLETED",
                            namespace=namespace)
    status = wait_for(lambda: _ready_and_streaming(api, name, namespace, tables),
                      "Ready, every table Streaming, read with the example's credentials")
    assert status is not None
    return status


# examples/ingestion-full.yaml ------------------------------------------------------------------

ORDER_LINE_COLUMNS = ["order_id", "line_no", "sku", "valid_until", "Shipped At"]  # internal_note excluded


def _create_shop(cluster, replicator_password: str) -> None:
    """The source the full example names: database ``shop``, role ``lakeslot_replicator``
    (REPLICATION, SELECT on the mirrored columns only), tables ``public.orders``, ``"Sales"."Order
    Lines"`` (no primary key: keyColumns), every table of schema ``inventory``, and the DBA's
    publication ``lakeslot_shop_orders``."""
    with cluster.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE lakeslot_replicator LOGIN REPLICATION PASSWORD {}").format(
            sql.Literal(replicator_password)))
        conn.execute("CREATE DATABASE shop")
    with cluster.connect("shop") as conn:
        conn.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, customer text NOT NULL,"
                     " total numeric(12, 2), placed_at timestamptz)")
        conn.execute("INSERT INTO public.orders SELECT g, 'customer ' || g, g * 1.25,"
                     " '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 hour' FROM generate_series(1, 300) g")
        conn.execute('CREATE SCHEMA "Sales"')
        conn.execute('CREATE TABLE "Sales"."Order Lines" (order_id bigint NOT NULL, line_no int NOT NULL, sku text,'
                     ' internal_note text, valid_until date, "Shipped At" timestamptz)')
        conn.execute('ALTER TABLE "Sales"."Order Lines" REPLICA IDENTITY FULL')
        conn.execute('INSERT INTO "Sales"."Order Lines" SELECT o, l, \'sku-\' || (o * l), \'do not copy\','
                     " CASE WHEN o % 5 = 0 THEN 'infinity'::date ELSE '2027-01-01'::date + o END,"
                     " CASE WHEN o % 7 = 0 THEN NULL ELSE '2026-02-01 12:00:00+00'::timestamptz + o * interval '1 day' END"
                     " FROM generate_series(1, 300) o, generate_series(1, 3) l")
        conn.execute("CREATE SCHEMA inventory")
        conn.execute("CREATE TABLE inventory.stock (sku text PRIMARY KEY, quantity int NOT NULL)")
        conn.execute("INSERT INTO inventory.stock SELECT 'sku-' || g, g % 17 FROM generate_series(1, 120) g")
        conn.execute('GRANT USAGE ON SCHEMA public, "Sales", inventory TO lakeslot_replicator')
        conn.execute("GRANT SELECT ON public.orders, inventory.stock TO lakeslot_replicator")
        conn.execute(sql.SQL("GRANT SELECT ({}) ON {} TO lakeslot_replicator").format(
            sql.SQL(", ").join(map(sql.Identifier, ORDER_LINE_COLUMNS)), sql.Identifier("Sales", "Order Lines")))
        conn.execute('CREATE PUBLICATION lakeslot_shop_orders FOR TABLE ONLY public.orders,'
                     ' ONLY "Sales"."Order Lines", TABLES IN SCHEMA inventory'
                     " WITH (publish = 'insert, update, delete, truncate', publish_via_partition_root = true)")


def _create_catalog_database(cluster, password: str) -> None:
    """The JDBC catalog's database ``iceberg``, owned by its role ``iceberg``."""
    with cluster.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE iceberg LOGIN PASSWORD {}").format(sql.Literal(password)))
        conn.execute("CREATE DATABASE iceberg OWNER iceberg")


def _drop_full(cluster) -> None:
    for database in ("shop", "iceberg"):
        cluster.drop_database(database)
    with cluster.connect() as conn:
        conn.execute("DROP ROLE IF EXISTS lakeslot_replicator")
        conn.execute("DROP ROLE IF EXISTS iceberg")


def _mirror_rows(catalog, identifier: tuple[str, str], columns: list[str]) -> list[tuple]:
    table = catalog.load_table(identifier)
    rows = table.scan(selected_fields=tuple(columns)).to_arrow().to_pylist()
    return sorted((tuple(row[c] for c in columns) for row in rows), key=repr)


def _source_rows(conn, table: sql.Composable, columns: list[str], text: tuple[str, ...] = ()) -> list[tuple]:
    """``columns`` of ``table``, those in ``text`` as PostgreSQL's text (textColumns)."""
    query = sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(
        sql.SQL("{}::text").format(sql.Identifier(c)) if c in text else sql.Identifier(c) for c in columns), table)
    return sorted(conn.execute(query).fetchall(), key=repr)


@pytest.mark.slow
def test_the_full_example_runs_to_ready_as_written_apart_from_host_names(
        kube, api, pg_cluster_factory, example_store, tmp_path):
    cluster = pg_cluster_factory.get("pg15", tls=True)
    store = example_store
    document = _example("ingestion-full.yaml")
    original = copy.deepcopy(document)
    spec, namespace, name = document["spec"], document["metadata"]["namespace"], document["metadata"]["name"]

    # Where it points: the source, the catalog's database server, the object store.
    spec["source"].update(host="localhost", port=cluster.port)
    catalog = spec["sink"]["catalog"]
    assert catalog["uri"] == "jdbc:postgresql://catalog-db.lake.svc:5432/iceberg"
    catalog["uri"] = f"jdbc:postgresql://127.0.0.1:{cluster.port}/iceberg"
    (s3_secret,) = {v["secretKeyRef"]["name"] for v in spec["secretEnv"]}
    spec["secretEnv"] += [{"name": variable, "secretKeyRef": {"name": s3_secret, "key": key}}
                          for variable, key in (("AWS_ENDPOINT_URL", "endpoint"), ("AWS_REGION", "region"))]
    changed = {"source": spec["source"], "sink": spec["sink"], "secretEnv": spec["secretEnv"]}
    assert {**original["spec"], **changed} == spec

    replicator_password, catalog_password = secrets.token_urlsafe(18), secrets.token_urlsafe(18)
    _create_shop(cluster, replicator_password)
    _create_catalog_database(cluster, catalog_password)
    try:
        kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})  # type: ignore[arg-type]
        _secret(api, namespace, spec["source"]["passwordSecretRef"]["name"],
                {spec["source"]["passwordSecretRef"]["key"]: replicator_password})
        _secret(api, namespace, spec["source"]["caSecretRef"]["name"],
                {spec["source"]["caSecretRef"]["key"]: cluster.ca_cert.read_text()})
        (password_ref,) = catalog["secretProperties"].values()
        _secret(api, namespace, password_ref["name"], {password_ref["key"]: catalog_password})
        keys = {v["name"]: v["secretKeyRef"]["key"] for v in spec["secretEnv"]}
        _secret(api, namespace, s3_secret, {
            keys["AWS_ACCESS_KEY_ID"]: store.access_key, keys["AWS_SECRET_ACCESS_KEY"]: store.secret_key,
            "endpoint": store.s3_endpoint, "region": REGION})
        ca_file = tmp_path / "ca.crt"
        ca_file.write_text(_secret_values(api, namespace, spec["source"]["caSecretRef"]))

        with scrubbed_operator(kube.url, tmp_path / "operator.log"):
            kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, document)
            environ = _pod_environment(api, document, ca_file)
            status = _run_pipeline(api, document, environ, tmp_path, tables=3)
        assert status["publicationName"] == "lakeslot_shop_orders", status
        assert status["slot"]["name"] == "lakeslot_shop_orders", status

        from pyiceberg.catalog.sql import SqlCatalog

        mirrors = SqlCatalog(catalog.get("name", "lakeslot"), **{
            "uri": f"postgresql+psycopg://iceberg:{catalog_password}@127.0.0.1:{cluster.port}/iceberg",
            "warehouse": catalog["warehouse"], "s3.endpoint": store.s3_endpoint, "s3.region": REGION,
            "s3.access-key-id": store.access_key, "s3.secret-access-key": store.secret_key})
        with cluster.connect("shop") as conn:
            conn.execute("SET TimeZone = 'UTC'")
            orders = ["id", "customer", "total", "placed_at"]
            assert _mirror_rows(mirrors, ("shop", "public__orders"), orders) == _source_rows(
                conn, sql.Identifier("public", "orders"), orders)
            lines = _mirror_rows(mirrors, ("shop", "sales__order_lines"), ORDER_LINE_COLUMNS)
            assert lines == _source_rows(conn, sql.Identifier("Sales", "Order Lines"), ORDER_LINE_COLUMNS,
                                          text=("valid_until",))
            stock = ["sku", "quantity"]
            assert _mirror_rows(mirrors, ("shop", "inventory__stock"), stock) == _source_rows(
                conn, sql.Identifier("inventory", "stock"), stock)
        assert "internal_note" not in mirrors.load_table(("shop", "sales__order_lines")).schema().column_names
    finally:
        _drop_full(cluster)
