"""Entry point of the consistent parallel snapshot (see ``lakeslot.snapshot`` for how it works).

Run it as ``spark-submit spark_jobs/snapshot.py ARGS`` (the SparkApplication's
``mainApplicationFile``; the Iceberg catalog comes from the Spark conf the operator sets), as
``python -m spark_jobs.snapshot --master 'local[*]' ARGS`` (builds a local session from
``spec.sink.catalog``), or call :func:`main` with an existing session (local mode, tests).

Arguments follow ``lakeslot.workloads`` (the one contract shared with the operator and local
mode; nothing secret is ever an argument):

``--ingestion-json JSON``
    The PostgresIngestion: source, sink (catalog, namespace, table names, table properties),
    snapshot settings (parallelism, target range size, statement timeout, resnapshotGeneration)
    and per-table options (keyColumns, excludeColumns) all come from it.
``--table '["schema","name"]'`` (repeatable, at least one)
    The tables to copy. Each is copied unless its mirror already holds a snapshot of generation
    ≥ ``spec.snapshot.resnapshotGeneration``: so a rerun after a crash resumes with the tables
    not yet done, and raising the counter re-snapshots every listed table once.
Password and CA
    ``LAKESLOT_SOURCE_PASSWORD`` (none: password-less authentication) and, when
    ``source.caSecretRef`` is set, the CA file at ``LAKESLOT_SOURCE_CA_FILE`` (default the path
    where the operator mounts it). Executors read the same variables.
``--min-snapshot-lsn N`` (0)
    A table whose snapshot was taken below this LSN is copied again (the operator passes the
    creation LSN of a slot it recreated after the old one was lost).
``--progress PATH|URI``
    Where the progress JSON is written (see ``lakeslot.snapshot.progress``).
``--master URL``
    Only for a standalone run: build a session with this master instead of spark-submit's.
``--max-attempts N`` (3)
    Attempts per range for transient failures.

Exit status: 0 when every table committed or was skipped; 1 when a table failed (the progress
document and stderr say why and how to fix it) or the job failed as a whole; 2 for bad arguments.
The last line on stdout is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence

from lakeslot import lsn, workloads
from lakeslot.snapshot.job import JobResult, SnapshotJob, run
from lakeslot.snapshot.plan import TableRequest
from lakeslot.source.tables import TableName
from lakeslot.spark_session import job_session

log = logging.getLogger("lakeslot.snapshot")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spark_jobs.snapshot", description=(
        "Copy PostgreSQL tables into Iceberg mirror tables as of one exported snapshot. The "
        "password comes from LAKESLOT_SOURCE_PASSWORD."))
    workloads.add_job_arguments(p)
    p.add_argument("--min-snapshot-lsn", type=int, default=0, metavar="N")
    p.add_argument("--progress", metavar="PATH|URI")
    p.add_argument("--master", metavar="URL")
    p.add_argument("--max-attempts", type=int, default=3, metavar="N")
    return p


def snapshot_job(job: workloads.JobInput, *, progress: str | None = None, max_attempts: int = 3,
                 min_snapshot_lsn: int = 0, environ: Mapping[str, str] | None = None) -> SnapshotJob:
    """The snapshot of ``job.tables`` that the ingestion asks for."""
    if not job.tables:
        raise ValueError("no --table given: nothing to snapshot")
    if max_attempts < 1:
        raise ValueError("--max-attempts must be at least 1")
    spec = job.ingestion.spec

    def request(table: TableName) -> TableRequest:
        options = job.table_spec(table)
        return TableRequest(table, job.names.mirror_table(table),
                            tuple(options.key_columns) if options else (),
                            tuple(options.exclude_columns) if options else ())

    return SnapshotJob(
        source=job.source(environ), tables=tuple(request(t) for t in job.tables),
        namespace=spec.sink.namespace, catalog=spec.sink.catalog.name, ingestion=job.names.owner,
        table_properties=dict(spec.sink.table_properties),
        parallelism=spec.snapshot.parallelism, target_range_bytes=spec.snapshot.target_range_bytes,
        statement_timeout_seconds=spec.snapshot.statement_timeout_seconds,
        resnapshot_generation=spec.snapshot.resnapshot_generation,
        min_snapshot_lsn=min_snapshot_lsn, progress=progress, max_attempts=max_attempts)


def summary(result: JobResult) -> dict:
    return {"ok": result.ok,
            "snapshotLsn": None if result.snapshot_lsn is None else lsn.format(result.snapshot_lsn),
            "tables": [{"schema": t.source.schema, "name": t.source.name, "target": t.target,
                        "state": t.state, "rows": t.rows, "error": t.error} for t in result.tables]}


def main(argv: Sequence[str] | None = None, spark=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    inputs = workloads.job_input(args)
    try:
        job = snapshot_job(inputs, progress=args.progress, max_attempts=args.max_attempts,
                           min_snapshot_lsn=args.min_snapshot_lsn)
    except ValueError as e:
        parser.error(str(e))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        if spark is None:
            spark = job_session(inputs, "lakeslot-snapshot", master=args.master)
        result = run(spark, job)
    except Exception as e:  # noqa: BLE001 - reported, and the exit status says it failed
        log.error("snapshot job failed: %s: %s", type(e).__name__, e)
        return 1
    for table in result.tables:
        if table.error:
            print(f"{table.source}: {table.error}", file=sys.stderr)
    print(json.dumps(summary(result)))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
