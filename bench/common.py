"""What the apply benchmarks share: a throwaway PostgreSQL holding the ``bench`` table (bigint
key, int, numeric, text, timestamptz) with a publication and slot, its ingestion, and the real
reader's command line for it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from bench.latency_proxy import ProxyProcess
from lakeslot import workloads
from lakeslot.api.models import GROUP, VERSION, PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.local import objectstore, pgcluster
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.source import slot
from lakeslot.spark.session import job_session

LAKESLOT = str(Path(sys.executable).with_name("lakeslot"))
TABLE = TableName("public", "bench")
COLUMNS = ["id", "qty", "amount", "note", "created"]
TABLE_DDL = ("CREATE TABLE bench (id bigint PRIMARY KEY, qty int, amount numeric(12,2), note text,"
             " created timestamptz)")


def cluster(pg: str) -> pgcluster.Cluster:
    """A cluster of PostgreSQL ``pg`` (15: Debian's, 18: the embedded wheel), not started."""
    install = pgcluster.debian_install(15) if pg == "15" else pgcluster.embedded_install()
    if install is None:
        raise SystemExit(f"PostgreSQL {pg} is not installed")
    return pgcluster.Cluster(install)


def create_source(source: pgcluster.Cluster, rows: int = 0) -> None:
    """Database ``bench`` with the table (``rows`` rows), publication ``p`` and slot ``s``."""
    source.create_database("bench")
    with source.connect("bench") as conn:
        conn.execute(TABLE_DDL)
        if rows:
            conn.execute("INSERT INTO bench SELECT g, g %% 100, g / 100.0, md5(g::text), now()"
                         " FROM generate_series(1, %s::int8) g", (rows,))
        conn.execute("CREATE PUBLICATION p FOR TABLE bench")
        slot.ensure(conn, "s")
        conn.commit()


def ingestion(source: pgcluster.Cluster, staging: str, warehouse: str, *,
              source_spec: dict | None = None, **spec) -> PostgresIngestion:
    """The ingestion of ``bench`` into ``warehouse`` (hadoop catalog); ``spec``: more sections."""
    return PostgresIngestion.model_validate({
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PostgresIngestion",
        "metadata": {"name": "bench", "namespace": "default"},
        "spec": {"source": {"host": "127.0.0.1", "port": source.port, "database": "bench",
                            "user": source.superuser, "tables": [{"name": "bench"}],
                            **(source_spec or {})},
                 "sink": {"catalog": {"type": "hadoop", "warehouse": warehouse},
                          "namespace": "bench", **spec.pop("sink", {})},
                 "staging": {"uri": staging}, "apply": {"triggerIntervalSeconds": 1}, **spec}})


def apply_setup(cluster: pgcluster.Cluster, rows: int, staging: str, warehouse: str, app: str,
                sink: dict):
    """The source with ``rows`` rows, its ingestion (``sink``: more of ``spec.sink``; DDL seen
    through the catalog, as most benchmarks' users would not install the trigger first), and a
    local[2] Spark session for it: ``(job input, session)``."""
    create_source(cluster, rows)
    spec = ingestion(cluster, staging, warehouse, source_spec={"ddlCapture": "Catalog"},
                     sink=sink)
    os.environ[workloads.PASSWORD_ENV] = cluster.password
    job = workloads.JobInput(spec, (TABLE,))
    return job, job_session(job, app, master="local[2]")


def reader_command(source: pgcluster.Cluster, staging: str, segment_seconds: float) -> list[str]:
    """The real reader for ``bench`` (the password comes from LAKESLOT_SOURCE_PASSWORD)."""
    return [LAKESLOT, "reader", "--ingestion", "default/bench", "--slot", "s", "--publication",
            "p", "--staging", staging, "--host", "127.0.0.1", "--port", str(source.port),
            "--dbname", "bench", "--user", source.superuser, "--pod", "bench",
            "--segment-max-seconds", str(segment_seconds)]


def source_table(cluster: pgcluster.Cluster, where: str = "", args: tuple = ()) -> pa.Table:
    """The ``bench`` rows (``where``: a filter), in key order."""
    with cluster.connect("bench") as conn:
        rows = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM bench {where} ORDER BY id",
                            args).fetchall()
    return pa.Table.from_pylist([dict(zip(COLUMNS, r, strict=True)) for r in rows])


def mirror_equals_source(cluster: pgcluster.Cluster, warehouse: str, catalog=None) -> bool:
    """Every column of every row of the mirror (read with pyiceberg, independently of the apply
    code: from ``catalog``, else the hadoop catalog at ``warehouse``) equals the source."""
    identifier = ("bench", "public__bench")
    mirror = catalog.load_table(identifier) if catalog is not None else \
        load_hadoop_table(Path(warehouse).as_uri(), identifier)
    assert mirror is not None
    mirrored = mirror.scan(selected_fields=tuple(COLUMNS)).to_arrow().sort_by("id")
    source = source_table(cluster)
    return mirrored.num_rows == source.num_rows and all(
        mirrored[c].cast(source[c].type).equals(source[c]) for c in COLUMNS)


@dataclass(frozen=True)
class Network:
    """The production configuration on this machine: S3 staging and an Iceberg REST catalog
    (``weed mini``), each behind a :class:`~bench.latency_proxy.ProxyProcess` adding the same
    delay to every request (the catalog's answers name the S3 proxy as the tables' endpoint).
    lakeslot is given the proxies; a benchmark's independent reads go to ``store`` directly. The
    catalog's own writes of metadata files are not delayed."""

    store: objectstore.ObjectStore
    s3: ProxyProcess
    rest: ProxyProcess

    @property
    def staging(self) -> str:
        return f"s3://{objectstore.STAGING_BUCKET}/bench"

    def catalog_document(self) -> dict:
        """``sink.catalog``: the REST catalog and ``S3FileIO``, both through the proxies."""
        document = self.store.catalog_document()
        document["uri"] = self.rest.uri
        document["properties"] = {**document["properties"], "s3.endpoint": self.s3.uri,
                                  "oauth2-server-uri": f"{self.rest.uri}/v1/oauth/tokens"}
        return document

    def environment(self) -> dict[str, str]:
        """What the run reads from its environment: the keys, the S3 endpoint (the proxy's), the
        catalog's secrets."""
        return {**self.store.environment(), "AWS_ENDPOINT_URL": self.s3.uri,
                **workloads.catalog_secret_environment(self.store.catalog_secrets())}

    def secret_env(self) -> list[dict]:
        """``spec.secretEnv`` for the keys (a run reads them from its environment)."""
        return [{"name": key, "secretKeyRef": {"name": "bench-s3", "key": key}}
                for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")]

    def pyiceberg_catalog(self):
        """The REST catalog opened by pyiceberg with its own settings, not through the proxies:
        the benchmark's reads cost lakeslot nothing and are not counted."""
        from pyiceberg.catalog import load_catalog

        document = self.store.catalog_document()
        return load_catalog("bench-reader", **{**document["properties"],
                                               **self.store.catalog_secrets(), "type": "rest",
                                               "uri": self.store.rest_uri,
                                               "warehouse": document["warehouse"]})


@contextlib.contextmanager
def network(directory: Path, delay_s: float) -> Iterator[Network]:
    """A throwaway ``weed mini`` in ``directory`` and the two proxies, while inside; the
    process environment holds :meth:`Network.environment` meanwhile (the Spark session and its
    workers read it there, as a run's do)."""
    try:
        with objectstore.running(directory) as store, \
                ProxyProcess(store.s3_endpoint, delay_s) as s3, \
                ProxyProcess(store.rest_uri, delay_s, {store.s3_endpoint: s3.uri}) as rest:
            net = Network(store, s3, rest)
            saved = {k: os.environ.get(k) for k in net.environment()}
            os.environ.update(net.environment())
            try:
                yield net
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
    except objectstore.ObjectStoreError as e:
        raise SystemExit(str(e)) from e
