"""Entry point of the apply job (see ``lakeslot.apply.job`` for what it does and guarantees).

Run it as ``spark-submit spark_jobs/apply.py ARGS`` (the SparkApplication's
``mainApplicationFile``; the Iceberg catalog comes from the Spark conf the operator sets), as
``python -m spark_jobs.apply --master 'local[2]' ARGS`` (builds a local session from
``spec.sink.catalog``), or call :func:`main` with an existing session.

Arguments follow ``lakeslot.workloads`` (``apply_arguments``):

``--ingestion-json JSON``
    The PostgresIngestion: staging URI and retention, sink (catalog, namespace, table names,
    changelog, table properties), ``apply.triggerIntervalSeconds``, ``policies.onTruncate`` /
    ``onSchemaChange``, ``snapshot.mode`` and per-table keyColumns/excludeColumns.
``--table '["schema","name"]'`` (repeatable, at least one)
    The tables to apply.
``--once``
    One pass over everything sealed now, then exit (local mode loops such passes).
``--master URL``
    Only for a standalone run: build a session with this master instead of spark-submit's.
Password and CA
    ``LAKESLOT_SOURCE_PASSWORD`` / ``LAKESLOT_SOURCE_CA_FILE``: the job reads the source catalog
    only to create a mirror in snapshot mode ``never`` and to resolve non-built-in column types.

Progress and errors: each table's position is its ``lakeslot.lsn``; a table's definite error is
in its table properties (``lakeslot.apply-error``) and in ``<staging>/apply-status.json``. The
last line on stdout is a JSON summary of the last pass. Exit status: 0 when every table applied
(or waits for its snapshot), 1 when a table failed or the job failed as a whole, 2 for bad
arguments. SIGTERM stops the long-running job after the current pass.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from lakeslot import lsn, workloads
from lakeslot.apply.job import ApplyResult, run
from lakeslot.spark_session import job_session

log = logging.getLogger("lakeslot.apply")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spark_jobs.apply", description=(
        "Apply sealed change segments to the Iceberg mirror tables. The password comes from "
        "LAKESLOT_SOURCE_PASSWORD."))
    workloads.add_job_arguments(p)
    p.add_argument("--once", action="store_true", help="one pass over what is sealed, then exit")
    p.add_argument("--master", metavar="URL")
    return p


def summary(result: ApplyResult) -> dict:
    end = result.last.end if result.last else None
    return {"ok": result.ok, "passes": result.passes,
            "batchEnd": None if end is None else lsn.format(end),
            "tables": [t.document() for t in result.tables]}


def main(argv: Sequence[str] | None = None, spark=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    inputs = workloads.job_input(args)
    if not inputs.tables:
        parser.error("no --table given: nothing to apply")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if spark is None:
            spark = job_session(inputs, "lakeslot-apply", master=args.master)
        result = run(spark, inputs, once=args.once, stop=stop)
    except Exception as e:  # noqa: BLE001 - reported, and the exit status says it failed
        log.error("apply job failed: %s: %s", type(e).__name__, e)
        return 1
    for table in result.tables:
        if table.error and table.state != "waiting":
            print(f"{table.source}: {table.error}", file=sys.stderr)
    print(json.dumps(summary(result)))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
