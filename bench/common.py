"""What the apply benchmarks share: a throwaway PostgreSQL holding the ``bench`` table (bigint
key, int, numeric, text, timestamptz) with a publication and slot, its ingestion, and the real
reader's command line for it."""

from __future__ import annotations

import sys
from pathlib import Path

from lakeslot import pgcluster
from lakeslot.api.models import GROUP, VERSION, PostgresIngestion
from lakeslot.source import slot

LAKESLOT = str(Path(sys.executable).with_name("lakeslot"))
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


def reader_command(source: pgcluster.Cluster, staging: str, segment_seconds: float) -> list[str]:
    """The real reader for ``bench`` (the password comes from LAKESLOT_SOURCE_PASSWORD)."""
    return [LAKESLOT, "reader", "--ingestion", "default/bench", "--slot", "s", "--publication",
            "p", "--staging", staging, "--host", "127.0.0.1", "--port", str(source.port),
            "--dbname", "bench", "--user", source.superuser, "--pod", "bench",
            "--segment-max-seconds", str(segment_seconds)]
