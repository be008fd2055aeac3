"""Every file of ``examples/`` runs to Ready, as written apart from host names, under an operator
whose process holds no credential (tests/support/operator_process.py), as an operator pod's.

Each example is loaded from disk and only where it points is changed: the source's host and port,
the catalog's URI (its host and port, for REST its whole endpoint URL), and the object store's
endpoint. The endpoint is an ``AWS_ENDPOINT_URL`` entry added to ``spec.secretEnv`` from the
Secret the example already names for its keys, with ``AWS_REGION`` (which an endpoint outside AWS
needs to be signed for; in a cluster on AWS the SDK finds the region itself): that counts as
pointing at a host. The names the example uses — namespace, Secrets and their keys, roles,
databases, buckets, catalog name and warehouse, publication, slot, tables — are created here as
the example expects them, with this test's credentials.

Simulated, because pods cannot run here: the spark-operator's controller and the pods (the reader
Deployment's Pod is created and reported running as the Deployment controller and kubelet would;
the SparkApplications' states are written as the spark-operator would). The pods' work runs as
``lakeslot run --once`` in a process of its own (its own JVM: the examples keep their catalog name
``lakeslot``, which the tests' shared Spark session uses for a hadoop catalog) whose environment is
exactly what the pods get from the example's Secret references (nothing of the test's own). The
mirrors are then read with pyiceberg through the catalog, independently of lakeslot, and compared
with the source row by row.

- ``examples/ingestion-full.yaml``: PostgreSQL 15 with TLS (``sslMode: verify-full`` against the CA
  in the example's ``caSecretRef`` Secret; the embedded PostgreSQL 18 has no SSL), a CDC role with
  REPLICATION and column-level SELECT only, the publication created by a DBA (the example's
  ``publicationManagement: Auto`` then verifies it), a JDBC catalog on its own database and role;
  after Ready, changes in every table (a text column set to 'infinity', a row moved to another
  partition, an excluded column changed, deletes, inserts) streamed and applied by the pods' work
  run once more, then compared.
- ``examples/ingestion.yaml``: PostgreSQL 18, a role that owns its tables (lakeslot creates the
  publication), the shared SeaweedFS REST catalog (warehouse ``lake``), in namespace ``shop`` as
  the getting-started page applies it (``kubectl apply -n shop``).

The examples' bucket ``lake`` holds staging (``s3://lake/staging/…``) beside the warehouse. The
shared object store's ``lake`` is a *table bucket* (the REST catalog's warehouse), which refuses
any other write; so each example has a store of its own with the shared store's keys and a plain bucket
``lake``: the full example's staging and warehouse are there; the minimal example's S3 endpoint
is a proxy over both stores (:func:`staging_router`): ``lake/staging/…`` in the example's store,
the rest of ``lake`` in the shared one — one endpoint, one bucket name, as on a real object store.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import re
import secrets
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import kubernetes.client
import pytest
import yaml
from psycopg import sql

from bench.latency_proxy import LatencyProxy
from lakeslot import lsn_text, workloads
from lakeslot.api.models import GROUP, PLURAL, VERSION
from lakeslot.filesystems import S3Access
from lakeslot.local.objectstore import REGION, WAREHOUSE, ObjectStore, ObjectStoreError, running
from lakeslot.source.connection import one_row
from tests.support import operator_env
from tests.support.local_support import LAKESLOT, RUN_DEADLINE_S
from tests.support.operator_process import KEPT, ROOT, scrubbed_operator
from tests.support.waiting import wait_for

EXAMPLES = ROOT / "examples"
STAGING_PREFIX = "staging/"  # the examples' staging: s3://lake/staging/…


def staging_router(staging_store: str) -> Callable[[str, str, bytes], str | None]:
    """A :class:`LatencyProxy` route: requests on ``lake/staging/…`` (by key, a listing's
    ``prefix`` or a bulk delete's keys) to ``staging_store``, the rest to the proxy's upstream."""

    def route(method: str, target: str, body: bytes) -> str | None:
        parts = urlsplit(target)
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        if bucket != WAREHOUSE:
            return None
        prefix = parse_qs(parts.query).get("prefix", [""])[0]
        deleted = re.findall(rb"<Key>([^<]*)</Key>", body) if method == "POST" else []
        staged = key.startswith(STAGING_PREFIX) or (not key and prefix.startswith(STAGING_PREFIX)) or (
            bool(deleted) and all(k.startswith(STAGING_PREFIX.encode()) for k in deleted))
        return staging_store if staged else None

    return route


@pytest.fixture(scope="module")
def example_store(object_store: ObjectStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    """An object store of the examples' own, with the shared store's keys, whose bucket ``lake``
    is a plain one; emptied after each test (both examples stage to
    ``s3://lake/staging/shop-orders``)."""
    try:
        with running(tmp_path_factory.mktemp("example-s3"), access_key=object_store.access_key,
                     secret_key=object_store.secret_key, plain_buckets=[WAREHOUSE], table_bucket=None) as store:
            yield store
    except ObjectStoreError as e:
        pytest.fail(str(e))


@pytest.fixture
def empty_example_store(example_store: ObjectStore) -> Iterator[ObjectStore]:
    yield example_store
    S3Access.of(example_store.environment()).filesystem(WAREHOUSE).delete_dir_contents(WAREHOUSE)


def _example(name: str) -> dict:
    (document,) = yaml.safe_load_all((EXAMPLES / name).read_text())
    return document


def _assert_as_written(document: dict, name: str) -> None:
    """``document`` is the example ``name`` but for where it points: the source's host and port,
    the catalog's URI, the endpoint's ``secretEnv`` entries, and the namespace it is applied in
    when the example names none (``kubectl apply -n``)."""
    written, pointed = _example(name), copy.deepcopy(document)
    written["metadata"].setdefault("namespace", document["metadata"]["namespace"])
    for each in (written, pointed):
        for key in ("host", "port"):
            each["spec"]["source"].pop(key, None)
        del each["spec"]["sink"]["catalog"]["uri"]
        each["spec"]["secretEnv"] = [v for v in each["spec"]["secretEnv"]
                                     if v["name"] not in ("AWS_ENDPOINT_URL", "AWS_REGION")]
    assert pointed == written


def _point_at_store(api, document: dict, store: ObjectStore, endpoint: str) -> None:
    """The example's object-store Secret (its keys: this store's) with the endpoint and region,
    which ``secretEnv`` gets from it too."""
    spec, namespace = document["spec"], document["metadata"]["namespace"]
    (secret,) = {v["secretKeyRef"]["name"] for v in spec["secretEnv"]}
    keys = {v["name"]: v["secretKeyRef"]["key"] for v in spec["secretEnv"]}
    assert set(keys) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}, keys
    spec["secretEnv"] += [{"name": variable, "secretKeyRef": {"name": secret, "key": key}}
                          for variable, key in (("AWS_ENDPOINT_URL", "endpoint"), ("AWS_REGION", "region"))]
    operator_env.create_secret(api, secret, {keys["AWS_ACCESS_KEY_ID"]: store.access_key,
                                             keys["AWS_SECRET_ACCESS_KEY"]: store.secret_key,
                                    "endpoint": endpoint, "region": REGION}, namespace=namespace)


def _secret_value(api, namespace: str, ref: dict) -> str:
    data = kubernetes.client.CoreV1Api(api).read_namespaced_secret(ref["name"], namespace).data or {}
    return base64.b64decode(data[ref["key"]]).decode()


def _pod_environment(api, document: dict, ca_file: Path | None) -> dict[str, str]:
    """What the example's pods get from its Secret references (simulated kubelet), as local mode
    reads it (lakeslot.local.config): nothing of this process's environment but :data:`KEPT`
    (and ``PYTHONPATH``: the image's code is this checkout's)."""
    namespace, spec = document["metadata"]["namespace"], document["spec"]
    environ = {k: os.environ[k] for k in KEPT if k in os.environ}
    environ["PYTHONPATH"] = str(ROOT)
    environ[workloads.PASSWORD_ENV] = _secret_value(api, namespace, spec["source"]["passwordSecretRef"])
    if ca_file is not None:
        environ[workloads.CA_FILE_ENV] = str(ca_file)
    for key, ref in spec["sink"]["catalog"].get("secretProperties", {}).items():
        environ[workloads.catalog_secret_env(key)] = _secret_value(api, namespace, ref)
    for variable in spec.get("secretEnv", []):
        environ[variable["name"]] = _secret_value(api, namespace, variable["secretKeyRef"])
    return environ


def _ready_and_streaming(api, name: str, namespace: str, tables: int, after: int = -1) -> dict | None:
    """The status once Ready with ``tables`` tables Streaming, each mirror past ``after``."""
    status = (operator_env.get_ingestion(api, name, namespace) or {}).get("status") or {}
    ready: dict = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
    rows = status.get("tables", [])
    done = ready.get("status") == "True" and [t["state"] for t in rows] == ["Streaming"] * tables and all(
        t.get("appliedLsn") and lsn_text.parse(t["appliedLsn"]) > after for t in rows)
    return status if done else None


@contextlib.contextmanager
def _applied(api, kube, document: dict, tmp_path: Path) -> Iterator[None]:
    """``document`` applied (as written to ``tmp_path``/example.yaml, for the pods' work) while
    the scrubbed operator runs."""
    (tmp_path / "example.yaml").write_text(yaml.safe_dump(document, allow_unicode=True, sort_keys=False))
    with scrubbed_operator(kube.url, tmp_path / "operator.log"):
        kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, document["metadata"]["namespace"], PLURAL, document)
        yield


def _run_pods(api, document: dict, tmp_path: Path, ca_file: Path | None = None) -> None:
    """The pods' work (see the module docstring): ``lakeslot run --once`` in a process of its own
    with the pods' environment; the reader Pod running (its identity: that process's reader), the
    snapshot application COMPLETED and the apply one RUNNING."""
    name, namespace = document["metadata"]["name"], document["metadata"]["namespace"]
    wait_for(lambda: f"{name}-reader" in operator_env.deployments(api, namespace), "the reader Deployment")
    with (tmp_path / "run.log").open("ab") as log:
        run = subprocess.Popen([LAKESLOT, "run", "--once", "--plain", "-f", str(tmp_path / "example.yaml"),
                                "--state-dir", str(tmp_path / "state")],
                               env=_pod_environment(api, document, ca_file), stdout=log, stderr=subprocess.STDOUT)
    try:
        operator_env.reader_pod_running(api, name, f"local-{socket.gethostname()}-{run.pid}", namespace=namespace)
        code = run.wait(RUN_DEADLINE_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert code == 0, (tmp_path / "run.log").read_text()[-5000:]
    wait_for(lambda: f"{name}-apply" in operator_env.spark_applications(api, namespace), "the apply SparkApplication")
    for application in operator_env.spark_applications(api, namespace):
        operator_env.set_spark_state(api, application, "RUNNING" if application == f"{name}-apply" else "COMPLETED",
                                     namespace=namespace)


def _ready(api, document: dict, tables: int, after: int = -1) -> dict:
    name, namespace = document["metadata"]["name"], document["metadata"]["namespace"]
    status = wait_for(lambda: _ready_and_streaming(api, name, namespace, tables, after),
                      "Ready, every table Streaming, read with the example's credentials")
    assert status is not None
    return status


def _mirror_rows(catalog, identifier: tuple[str, str], columns: list[str]) -> list[tuple]:
    rows = catalog.load_table(identifier).scan(selected_fields=tuple(columns)).to_arrow().to_pylist()
    return sorted((tuple(row[c] for c in columns) for row in rows), key=repr)


def _source_rows(conn, table: tuple[str, str], columns: list[str], text: tuple[str, ...] = ()) -> list[tuple]:
    """``columns`` of ``table``, those in ``text`` as PostgreSQL's text (textColumns)."""
    query = sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(
        sql.SQL("{}::text").format(sql.Identifier(c)) if c in text else sql.Identifier(c) for c in columns),
        sql.Identifier(*table))
    return sorted(conn.execute(query).fetchall(), key=repr)


def _create_role(conn, role: str, password: str, *attributes: str) -> None:
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN {} PASSWORD {}").format(
        sql.Identifier(role), sql.SQL(" ").join(map(sql.SQL, attributes)), sql.Literal(password)))


def _drop(cluster, databases: tuple[str, ...], roles: tuple[str, ...]) -> None:
    for database in databases:
        cluster.drop_database(database)
    with cluster.connect() as conn:
        for role in roles:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


# examples/ingestion-full.yaml ------------------------------------------------------------------

ORDER_LINE_COLUMNS = ["order_id", "line_no", "sku", "valid_until", "Shipped At"]  # internal_note excluded


def _create_full_source(cluster, replicator_password: str) -> None:
    """The source the full example names: database ``shop``, role ``lakeslot_replicator``
    (REPLICATION, SELECT on the mirrored columns only), tables ``public.orders``, ``"Sales"."Order
    Lines"`` (no primary key: keyColumns), every table of schema ``inventory``, and the DBA's
    publication ``lakeslot_shop_orders``."""
    with cluster.connect() as conn:
        _create_role(conn, "lakeslot_replicator", replicator_password, "REPLICATION")
        conn.execute("CREATE DATABASE shop")
    with cluster.connect("shop") as conn:
        conn.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, customer text NOT NULL,"
                     " total numeric(12, 2), placed_at timestamptz)")
        conn.execute("INSERT INTO public.orders SELECT g, 'customer ' || g, g * 1.25,"
                     " '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 hour' FROM generate_series(1, 100) g")
        conn.execute('CREATE SCHEMA "Sales"')
        conn.execute('CREATE TABLE "Sales"."Order Lines" (order_id bigint NOT NULL, line_no int NOT NULL, sku text,'
                     ' internal_note text, valid_until date, "Shipped At" timestamptz)')
        conn.execute('ALTER TABLE "Sales"."Order Lines" REPLICA IDENTITY FULL')
        conn.execute('INSERT INTO "Sales"."Order Lines" SELECT o, l, \'sku-\' || (o * l), \'do not copy\','
                     " CASE WHEN o % 5 = 0 THEN 'infinity'::date ELSE '2027-01-01'::date + o END,"
                     " CASE WHEN o % 7 = 0 THEN NULL"
                     "  ELSE '2026-02-01 12:00:00+00'::timestamptz + o * interval '1 minute' END"
                     " FROM generate_series(1, 100) o, generate_series(1, 2) l")
        conn.execute("CREATE SCHEMA inventory")
        conn.execute("CREATE TABLE inventory.stock (sku text PRIMARY KEY, quantity int NOT NULL)")
        conn.execute("INSERT INTO inventory.stock SELECT 'sku-' || g, g % 17 FROM generate_series(1, 40) g")
        conn.execute('GRANT USAGE ON SCHEMA public, "Sales", inventory TO lakeslot_replicator')
        conn.execute("GRANT SELECT ON public.orders, inventory.stock TO lakeslot_replicator")
        conn.execute(sql.SQL("GRANT SELECT ({}) ON {} TO lakeslot_replicator").format(
            sql.SQL(", ").join(map(sql.Identifier, ORDER_LINE_COLUMNS)), sql.Identifier("Sales", "Order Lines")))
        conn.execute('CREATE PUBLICATION lakeslot_shop_orders FOR TABLE ONLY public.orders,'
                     ' ONLY "Sales"."Order Lines", TABLES IN SCHEMA inventory'
                     " WITH (publish = 'insert, update, delete, truncate', publish_via_partition_root = true)")


def _change_full_source(conn) -> int:
    """Updates (a text column to 'infinity', a row to another partition), deletes and inserts in
    each table; the LSN before them."""
    (before,) = one_row(conn.execute("SELECT pg_current_wal_lsn()::text"))
    conn.execute("UPDATE public.orders SET total = total + 1 WHERE id % 10 = 0")
    conn.execute("DELETE FROM public.orders WHERE id BETWEEN 50 AND 60")
    conn.execute("INSERT INTO public.orders SELECT g, 'late ' || g, g, now() FROM generate_series(101, 110) g")
    conn.execute('UPDATE "Sales"."Order Lines" SET valid_until = \'infinity\', internal_note = \'changed\''
                 " WHERE order_id % 9 = 0")
    conn.execute('UPDATE "Sales"."Order Lines" SET "Shipped At" = "Shipped At" + interval \'3 days\''
                 " WHERE order_id % 11 = 0")
    conn.execute('DELETE FROM "Sales"."Order Lines" WHERE order_id BETWEEN 40 AND 45')
    conn.execute('INSERT INTO "Sales"."Order Lines" VALUES (101, 1, \'sku-new\', \'x\', \'-infinity\', NULL)')
    conn.execute("UPDATE inventory.stock SET quantity = quantity + 100 WHERE quantity < 3")
    conn.execute("DELETE FROM inventory.stock WHERE sku LIKE 'sku-3_'")
    conn.execute("INSERT INTO inventory.stock VALUES ('sku-new', 1)")
    return lsn_text.parse(before)


@pytest.mark.slow
def test_the_full_example_runs_to_ready_as_written_apart_from_host_names(
        kube, api, pg_cluster_factory, object_store, empty_example_store, tmp_path):
    """Its warehouse ``s3://lake/warehouse`` and staging both in ``example_store``."""
    cluster, example_store = pg_cluster_factory.get("pg15", tls=True), empty_example_store
    document = _example("ingestion-full.yaml")
    spec, namespace = document["spec"], document["metadata"]["namespace"]
    catalog = spec["sink"]["catalog"]
    # Where it points: the source, the catalog's database server (the object store: below).
    spec["source"].update(host="localhost", port=cluster.port)
    assert catalog["uri"] == "jdbc:postgresql://catalog-db.lake.svc:5432/iceberg"
    catalog["uri"] = f"jdbc:postgresql://127.0.0.1:{cluster.port}/iceberg"

    replicator_password, catalog_password = secrets.token_urlsafe(18), secrets.token_urlsafe(18)
    _create_full_source(cluster, replicator_password)
    with cluster.connect() as conn:  # the catalog's database, owned by its role
        _create_role(conn, "iceberg", catalog_password)
        conn.execute("CREATE DATABASE iceberg OWNER iceberg")
    try:
        kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})  # type: ignore[arg-type]
        source, (password_ref,) = spec["source"], catalog["secretProperties"].values()
        for ref, value in ((source["passwordSecretRef"], replicator_password),
                           (source["caSecretRef"], cluster.ca_cert.read_text()), (password_ref, catalog_password)):
            operator_env.create_secret(api, ref["name"], {ref["key"]: value}, namespace=namespace)
        _point_at_store(api, document, object_store, example_store.s3_endpoint)
        _assert_as_written(document, "ingestion-full.yaml")
        ca_file = tmp_path / "ca.crt"  # (mounted from the Secret, where the pods read it)
        ca_file.write_text(_secret_value(api, namespace, source["caSecretRef"]))

        with _applied(api, kube, document, tmp_path):
            _run_pods(api, document, tmp_path, ca_file)
            status = _ready(api, document, tables=3)
            assert (status["publicationName"], status["slot"]["name"]) == ("lakeslot_shop_orders",) * 2, status
            # Changes streamed: the pods' work once more (a reader Pod restarted: a new process).
            with cluster.connect("shop") as conn:
                before = _change_full_source(conn)
            _run_pods(api, document, tmp_path, ca_file)
            _ready(api, document, tables=3, after=before)

        from pyiceberg.catalog.sql import SqlCatalog

        mirrors = SqlCatalog(catalog.get("name", "lakeslot"), **{
            "uri": f"postgresql+psycopg://iceberg:{catalog_password}@127.0.0.1:{cluster.port}/iceberg",
            "warehouse": catalog["warehouse"], "s3.endpoint": example_store.s3_endpoint, "s3.region": REGION,
            "s3.access-key-id": object_store.access_key, "s3.secret-access-key": object_store.secret_key})
        with cluster.connect("shop") as conn:
            for table, mirror, columns, text in (
                    (("public", "orders"), "public__orders", ["id", "customer", "total", "placed_at"], ()),
                    (("Sales", "Order Lines"), "sales__order_lines", ORDER_LINE_COLUMNS, ("valid_until",)),
                    (("inventory", "stock"), "inventory__stock", ["sku", "quantity"], ())):
                assert _mirror_rows(mirrors, (spec["sink"]["namespace"], mirror), columns) == _source_rows(
                    conn, table, columns, text), table
        lines = mirrors.load_table((spec["sink"]["namespace"], "sales__order_lines"))
        assert "internal_note" not in lines.schema().column_names
        assert [f.transform for f in lines.spec().fields] != [], "partitionBy"
    finally:
        _drop(cluster, ("shop", "iceberg"), ("lakeslot_replicator", "iceberg"))


# examples/ingestion.yaml -----------------------------------------------------------------------

@pytest.mark.slow
def test_the_minimal_example_runs_to_ready_as_written_apart_from_host_names(
        kube, api, pg_cluster_factory, object_store, empty_example_store, tmp_path):
    """Its warehouse: the shared store's REST catalog (table bucket ``lake``); its staging
    ``s3://lake/staging/…`` in ``example_store``, both behind one endpoint (:func:`staging_router`)."""
    cluster, example_store = pg_cluster_factory.get("pg18"), empty_example_store
    document = _example("ingestion.yaml")
    spec = document["spec"]
    catalog = spec["sink"]["catalog"]
    document["metadata"]["namespace"] = "shop"  # kubectl apply -n shop (docs/getting-started/kubernetes.md)
    # Where it points: the source, the REST catalog (the object store: below).
    spec["source"].update(host="127.0.0.1", port=cluster.port)
    assert catalog["uri"] == "https://catalog.lake.svc:8181/api/catalog"
    catalog["uri"] = object_store.rest_uri

    password = secrets.token_urlsafe(18)
    with cluster.connect() as conn:  # the role owns its tables and may create the publication
        _create_role(conn, "lakeslot", password, "REPLICATION")
        conn.execute("CREATE DATABASE shop OWNER lakeslot")
    try:
        with cluster.connect("shop") as conn:
            conn.execute("SET ROLE lakeslot")
            conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, total numeric(12, 2))")
            conn.execute("INSERT INTO orders SELECT g, 'customer ' || g, g * 1.25 FROM generate_series(1, 200) g")
            conn.execute("CREATE TABLE order_items (order_id bigint, line_no int, sku text, quantity int,"
                         " PRIMARY KEY (order_id, line_no))")
            conn.execute("INSERT INTO order_items SELECT o, l, 'sku-' || (o * l), l FROM generate_series(1, 200) o,"
                         " generate_series(1, 2) l")
        namespace, source = document["metadata"]["namespace"], spec["source"]
        for ref, value in ((source["passwordSecretRef"], password),
                           (catalog["secretProperties"]["credential"], object_store.catalog_secrets()["credential"])):
            operator_env.create_secret(api, ref["name"], {ref["key"]: value}, namespace=namespace)
        with LatencyProxy(object_store.s3_endpoint, 0, route=staging_router(example_store.s3_endpoint)) as s3:
            _point_at_store(api, document, object_store, s3.uri)
            _assert_as_written(document, "ingestion.yaml")
            with _applied(api, kube, document, tmp_path):
                _run_pods(api, document, tmp_path)
                _ready(api, document, tables=2)

        from pyiceberg.catalog.rest import RestCatalog

        mirrors = RestCatalog("examples", **{
            "uri": object_store.rest_uri, "warehouse": catalog["warehouse"],
            "credential": object_store.catalog_secrets()["credential"], **object_store.s3_file_io(),
            "s3.access-key-id": object_store.access_key, "s3.secret-access-key": object_store.secret_key})
        with cluster.connect("shop") as conn:
            for table, columns in (("orders", ["id", "customer", "total"]),
                                   ("order_items", ["order_id", "line_no", "sku", "quantity"])):
                assert _mirror_rows(mirrors, (spec["sink"]["namespace"], f"public__{table}"), columns) == \
                    _source_rows(conn, ("public", table), columns), table
    finally:
        _drop(cluster, ("shop",), ("lakeslot",))
