"""Benchmark: what ``lakeslot status`` and each operator reconcile read over N tables — the
source's checks in PostgreSQL and every mirror's progress in an Iceberg REST catalog.

    .venv/bin/python -m bench.status_tables [--tables 1000] [--repeat 3] [--pg 15]

The source: a throwaway PostgreSQL gets ``--tables`` tables of four columns in a publication
a DBA created; then, ``--repeat`` times each, the preflight checks
(``lakeslot.source.preflight.run``) and the verification of that publication
(``lakeslot.source.publication.sync``, not managed), against the limit measured the same way:
one catalog query reading every column of those tables (what the checks must read at least).

The mirrors: a throwaway SeaweedFS (``lakeslot.local.objectstore``: S3 and an Iceberg REST catalog on
loopback) gets ``--tables`` one-row tables (pyiceberg). Then, ``--repeat`` times each:

- ``lakeslot.mirror.progress.read`` of every table (the status's and the reconcile's read: one
  catalog client, ``lakeslot.mirror.catalogs.LOAD_WORKERS`` loads at a time, each table's metadata
  parsed);
- the limit, same run: the catalog answering the same ``loadTable`` requests as raw HTTP GETs
  from as many threads, nothing parsed.

Printed: the median of each and their ratio. Numbers, not assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
from psycopg import sql

from bench import common
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.local import objectstore
from lakeslot.mirror import catalogs, progress
from lakeslot.source import preflight, publication

NAMESPACE = "bench"
READY_S = 30


def _catalog(store: objectstore.ObjectStore):
    from pyiceberg.catalog import load_catalog

    document = store.catalog_document()
    properties = {**document["properties"], **store.catalog_secrets(), "type": "rest",
                  "uri": store.rest_uri, "warehouse": document["warehouse"]}
    deadline = time.monotonic() + READY_S
    while True:  # (the table bucket is made in the background)
        try:
            catalog = load_catalog("bench", **properties)
            catalog.create_namespace_if_not_exists(NAMESPACE)
            return catalog
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _raw_gets(store: objectstore.ObjectStore, names: list[str]) -> float:
    """Seconds for the catalog to answer a GET of each table's metadata, LOAD_WORKERS at a time."""
    token_request = urllib.parse.urlencode({
        "grant_type": "client_credentials", "client_id": store.access_key,
        "client_secret": store.secret_key, "scope": "catalog"}).encode()
    with urllib.request.urlopen(f"{store.rest_uri}/v1/oauth/tokens", token_request) as r:
        token = json.load(r)["access_token"]
    with urllib.request.urlopen(f"{store.rest_uri}/v1/config?warehouse={objectstore.WAREHOUSE}") as r:
        prefix = json.load(r).get("overrides", {}).get("prefix", "")
    base = f"{store.rest_uri}/v1/{prefix + '/' if prefix else ''}namespaces/{NAMESPACE}/tables/"

    def get(name: str) -> int:
        request = urllib.request.Request(base + name, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request) as r:
            return len(r.read())

    started = time.monotonic()
    with ThreadPoolExecutor(catalogs.LOAD_WORKERS) as pool:
        assert all(pool.map(get, names))
    return time.monotonic() - started


def _timed(repeat: int, action) -> tuple[float, list[float]]:
    """The median of ``repeat`` timings of ``action()``, and the timings."""
    times = []
    for _ in range(repeat):
        started = time.monotonic()
        action()
        times.append(time.monotonic() - started)
    return statistics.median(times), times


def _source(tables: int, repeat: int, pg: str) -> None:
    """The source's checks over ``tables`` tables, against reading their columns once."""
    names = [TableName("app", f"t{i}") for i in range(tables)]
    with common.cluster(pg) as cluster, cluster.connect() as conn:
        conn.autocommit = True
        conn.execute("CREATE SCHEMA app")
        for table in names:
            conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, qty int, note text, "
                                 "created timestamptz)").format(table.sql()))
        conn.execute(sql.SQL("CREATE PUBLICATION dba_pub FOR TABLE {} WITH "
                             "(publish_via_partition_root = true)").format(
            sql.SQL(", ").join(t.sql() for t in names)))

        def checks() -> None:
            assert not preflight.failures(preflight.run(conn, names, manage_publication=False))

        def verify() -> None:
            assert publication.sync(conn, "dba_pub", names, owner="bench", manage=False).ok

        def columns() -> None:
            conn.execute("SELECT attrelid, attname, atttypid FROM pg_catalog.pg_attribute"
                         " WHERE attrelid = ANY(%s::regclass[]) AND attnum > 0",
                         ([str(t) for t in names],)).fetchall()

        limit, limits = _timed(repeat, columns)
        for what, action in (("preflight checks", checks), ("publication verified", verify)):
            took, times = _timed(repeat, action)
            print(f"{what} of {tables} tables: {took:.3f} s (median of {repeat}: "
                  f"{', '.join(f'{t:.3f}' for t in times)}); ratio {took / limit:.1f}x the limit")
        print(f"limit: one query reading the {tables} tables' columns: {limit:.3f} s (median of "
              f"{repeat}: {', '.join(f'{t:.3f}' for t in limits)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pg", default="15", choices=["15", "18"])
    args = parser.parse_args()
    _source(args.tables, args.repeat, args.pg)
    with objectstore.running(Path(tempfile.mkdtemp(prefix="lakeslot-bench-"))) as store:
        catalog = _catalog(store)
        schema = pa.schema([pa.field("id", pa.int32())])
        started = time.monotonic()
        for i in range(args.tables):
            catalog.create_table((NAMESPACE, f"public__t{i}"), schema).append(
                pa.table({"id": pa.array([i], pa.int32())}))
        print(f"{args.tables} tables created in {time.monotonic() - started:.1f} s")
        tables = [TableName("public", f"t{i}") for i in range(args.tables)]
        ingestion = PostgresIngestion.model_validate({
            "apiVersion": "lakeslot.io/v1alpha1", "kind": "PostgresIngestion",
            "metadata": {"name": "bench", "namespace": "bench"},
            "spec": {"source": {"host": "localhost", "database": "app", "user": "bench",
                                "tables": [{"schema": t.schema, "name": t.name} for t in tables]},
                     "sink": {"catalog": store.catalog_document(), "namespace": NAMESPACE},
                     "staging": {"uri": f"s3://{objectstore.STAGING_BUCKET}/bench"}}})
        reads, limits = [], []
        for _ in range(args.repeat):
            started = time.monotonic()
            read = progress.read(ingestion, tables, secrets=store.catalog_secrets())
            reads.append(time.monotonic() - started)
            assert all(p.lsn is None and p.rows == 1 for p in read.values())  # (no lakeslot.lsn here)
            limits.append(_raw_gets(store, [f"public__t{i}" for i in range(args.tables)]))
        read_s, limit_s = statistics.median(reads), statistics.median(limits)
        print(f"progress of {args.tables} tables (lakeslot status, a reconcile): {read_s:.2f} s "
              f"(median of {args.repeat}: {', '.join(f'{r:.2f}' for r in reads)})")
        print(f"limit: the catalog answering {args.tables} loadTable GETs, {catalogs.LOAD_WORKERS} at "
              f"a time: {limit_s:.2f} s; ratio {read_s / limit_s:.2f}x")


if __name__ == "__main__":
    main()
