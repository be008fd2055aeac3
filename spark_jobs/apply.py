"""Entry point of the apply job: :func:`lakeslot.apply.job.run` behind the shared skeleton of
:mod:`lakeslot.control.jobs` (see ``lakeslot.apply.job`` for what it does and guarantees).

Exit status: 0 when every table applied (or waits for its snapshot), 1 when a table failed or the
job failed as a whole, 2 for bad arguments (nothing was started). SIGTERM stops the long-running
job after the current pass. The last line on stdout is a JSON summary of the last pass: ``ok``,
``passes``, ``batchEnd`` and each table's document. Progress and errors: each table's position is
its ``lakeslot.lsn``; a table's definite error is in its table properties
(``lakeslot.apply-error``) and in ``<staging>/apply-status.json``; stderr has one line per table
that failed (a table waiting for its snapshot is not reported).

Run it as ``spark-submit spark_jobs/apply.py ARGS`` (the SparkApplication's
``mainApplicationFile``; the Iceberg catalog comes from the Spark conf the operator sets), as
``python -m spark_jobs.apply --master 'local[2]' ARGS`` (builds a local session from
``spec.sink.catalog``), or call :func:`main` with an existing session.

Arguments follow ``lakeslot.workloads`` (``apply_invocation``):

``--input FILE`` (and ``--input-sha256 HEX``: wait until FILE is that document)
    The job document: the PostgresIngestion — staging URI and retention, sink (catalog,
    namespace, table names, changelog, table properties), ``apply.triggerIntervalSeconds``,
    ``policies.onTruncate`` / ``onSchemaChange``, ``snapshot.mode`` and per-table
    keyColumns/excludeColumns — and the tables to apply (at least one).
``--once``
    One pass over everything sealed now, then exit (local mode loops such passes).
``--master URL``
    Only for a standalone run: build a session with this master instead of spark-submit's.
Password and CA
    ``LAKESLOT_SOURCE_PASSWORD`` / ``LAKESLOT_SOURCE_CA_FILE``: the job reads the source catalog
    only to create a mirror in snapshot mode ``never`` and to resolve non-built-in column types.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lakeslot import lsn_text
from lakeslot.apply import job as apply_job
from lakeslot.control import jobs


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--once", action="store_true",
                        help="one pass over what is sealed, then exit")


def _run(spark, job, args: argparse.Namespace, stop) -> apply_job.ApplyResult:
    return apply_job.run(spark, job, once=args.once, stop=stop)


def summary(result: apply_job.ApplyResult) -> dict:
    end = result.last.end if result.last else None
    return {"ok": result.ok, "passes": result.passes,
            "batchEnd": None if end is None else lsn_text.format(end),
            "tables": [t.document() for t in result.tables]}


ENTRY = jobs.Entry(
    "apply", description=(
        "Apply sealed change segments to the Iceberg mirror tables. The password comes from "
        "LAKESLOT_SOURCE_PASSWORD."),
    arguments=_arguments, run=_run, summary=summary, stop_on_sigterm=True,
    quiet_states=frozenset({"waiting"}))


def build_parser() -> argparse.ArgumentParser:
    return ENTRY.parser()


def main(argv: Sequence[str] | None = None, spark=None) -> int:
    return ENTRY.main(argv, spark)


if __name__ == "__main__":
    sys.exit(main())
