"""Entry point of the consistent parallel snapshot: :func:`lakeslot.snapshot.job.run` behind the
shared skeleton of :mod:`lakeslot.control.jobs` (see ``lakeslot.snapshot`` for how the snapshot works).

Exit status: 0 when every table committed or was skipped; 1 when a table failed (the progress
document and stderr say why and how to fix it) or the job failed as a whole; 2 for bad arguments
(nothing was started). The last line on stdout is a JSON summary: ``ok``, ``snapshotLsn`` and per
table ``schema``, ``name``, ``target``, ``state``, ``rows``, ``error``.

Run it as ``spark-submit spark_jobs/snapshot.py ARGS`` (the SparkApplication's
``mainApplicationFile``; the Iceberg catalog comes from the Spark conf the operator sets), as
``python -m spark_jobs.snapshot --master 'local[*]' ARGS`` (builds a local session from
``spec.sink.catalog``), or call :func:`main` with an existing session (tests). Local mode calls
:func:`lakeslot.snapshot.job.run` itself.

Arguments follow ``lakeslot.workloads`` (the one contract shared with the operator and local
mode; nothing secret is ever an argument):

``--input FILE`` (and ``--input-sha256 HEX``: wait until FILE is that document)
    The job document: the PostgresIngestion — source, sink (catalog, namespace, table names,
    table properties), snapshot settings (parallelism, target range size, statement timeout,
    resnapshotGeneration) and per-table options (keyColumns, excludeColumns) — and the tables to
    copy (at least one). Each is copied unless its mirror already holds a snapshot of
    generation ≥ ``spec.snapshot.resnapshotGeneration``: so a rerun after a crash resumes with
    the tables not yet done, and raising the counter re-snapshots every listed table once.
Password and CA
    ``LAKESLOT_SOURCE_PASSWORD`` (none: password-less authentication) and, when
    ``source.caSecretRef`` is set, the CA file at ``LAKESLOT_SOURCE_CA_FILE`` (default the path
    where the operator mounts it). Executors read the same variables.
``--min-snapshot-lsn N`` (0)
    A table whose snapshot was taken below this LSN is copied again (the operator passes the
    creation LSN of a slot it recreated after the old one was lost).
``--progress PATH|URI``
    Where the progress JSON is written (see ``lakeslot.snapshot.progress``). Default:
    ``snapshot-progress.json`` in staging, where the operator reads it (rows copied and estimated
    per table, exported as metrics).
``--max-attempts N`` (3, at least 1)
    Attempts per range for transient failures.
``--master URL``
    Only for a standalone run: build a session with this master instead of spark-submit's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lakeslot import lsn_text
from lakeslot.control import jobs
from lakeslot.snapshot import job as snapshot_job
from lakeslot.snapshot import progress as snapshot_progress


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--min-snapshot-lsn", type=int, default=0, metavar="N",
                        help="copy again a table whose snapshot was taken below this LSN")
    parser.add_argument("--progress", metavar="PATH|URI",
                        help="where the progress JSON goes (default: snapshot-progress.json in staging)")
    parser.add_argument("--max-attempts", type=jobs.positive_int, default=3, metavar="N",
                        help="attempts per range for transient failures (default %(default)s)")


def _run(spark, job, args: argparse.Namespace, stop) -> snapshot_job.JobResult:
    progress = args.progress or snapshot_progress.in_staging(job.ingestion.spec.staging.uri)
    return snapshot_job.run(spark, job, progress=progress, max_attempts=args.max_attempts,
                            min_snapshot_lsn=args.min_snapshot_lsn)


def summary(result: snapshot_job.JobResult) -> dict:
    return {"ok": result.ok,
            "snapshotLsn": None if result.snapshot_lsn is None else lsn_text.format(result.snapshot_lsn),
            "tables": [{"schema": t.source.schema, "name": t.source.name, "target": t.target,
                        "state": t.state, "rows": t.rows, "error": t.error} for t in result.tables]}


ENTRY = jobs.Entry(
    "snapshot", description=(
        "Copy PostgreSQL tables into Iceberg mirror tables as of one exported snapshot. The "
        "password comes from LAKESLOT_SOURCE_PASSWORD."),
    arguments=_arguments, run=_run, summary=summary)


def build_parser() -> argparse.ArgumentParser:
    return ENTRY.parser()


def main(argv: Sequence[str] | None = None, spark=None) -> int:
    return ENTRY.main(argv, spark)


if __name__ == "__main__":
    sys.exit(main())
