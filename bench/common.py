"""What the apply benchmarks share: a throwaway PostgreSQL holding the ``bench`` table (bigint
key, int, numeric, text, timestamptz) with a publication and slot, its ingestion, and the real
reader's command line for it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa

from lakeslot import workloads
from lakeslot.api.models import GROUP, VERSION, PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.local import pgcluster
from lakeslot.mirror.catalog import load_hadoop_table
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


def mirror_equals_source(cluster: pgcluster.Cluster, warehouse: str) -> bool:
    """Every column of every row of the mirror (read with pyiceberg, independently of the apply
    code) equals the source."""
    mirror = load_hadoop_table(Path(warehouse).as_uri(), ("bench", "public__bench"))
    assert mirror is not None
    mirrored = mirror.scan(selected_fields=tuple(COLUMNS)).to_arrow().sort_by("id")
    source = source_table(cluster)
    return mirrored.num_rows == source.num_rows and all(
        mirrored[c].cast(source[c].type).equals(source[c]) for c in COLUMNS)
