"""The one skeleton of the Spark jobs' entry points: ``spark_jobs/snapshot.py`` and
``spark_jobs/apply.py`` are each an :class:`Entry` (what differs) and a ``main()`` calling
:meth:`Entry.main` (what does not).

Invariants:

- Arguments are the contract of :mod:`lakeslot.workloads` (``--input FILE``, the job document
  with the resource and the tables, and ``--input-sha256``), ``--master`` and the job's own
  flags. Nothing secret is ever an argument or in the document: the password, the CA file and
  Secret-backed catalog properties come from the environment.
- Bad input — an unreadable file, not JSON, an invalid resource, no table at all, a job flag —
  exits with status 2 through argparse, before a Spark session, a connection or a log line
  exists.
- Per-table errors go to stderr, one line each (``schema.table: error``); the last line on
  stdout is the job's JSON summary. Neither is printed when the job failed as a whole.
- Exit status (:mod:`lakeslot.exits`): ``EXIT_OK`` when every table is done (or only waits),
  ``EXIT_FAILED`` when a table failed or the job failed as a whole, ``EXIT_USAGE`` for bad
  arguments.

Failure modes: an exception from building the session (missing catalog secrets, no Java) or from
the job itself is logged as ``<name> job failed: <type>: <message>`` and exits ``EXIT_FAILED``;
the job has recorded what it could (the snapshot's progress document, the apply status) first.

The session is spark-submit's (the SparkApplication carries the Iceberg conf), a local one with
``--master`` (built from ``spec.sink.catalog``), or the one the caller passes (local mode, tests).
With ``stop_on_sigterm`` the job gets a stop event that SIGTERM sets (when ``main`` runs on the
main thread); other jobs keep Python's default SIGTERM behaviour.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from lakeslot import workloads
from lakeslot.api.naming import TableName
from lakeslot.exits import EXIT_FAILED, EXIT_OK

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class _Table(Protocol):
    @property
    def source(self) -> TableName: ...
    @property
    def state(self) -> str: ...
    @property
    def error(self) -> str | None: ...


class Result(Protocol):
    """What every job returns: whether it succeeded and one outcome per table."""

    @property
    def ok(self) -> bool: ...
    @property
    def tables(self) -> Sequence[_Table]: ...


R = TypeVar("R", bound=Result)


@dataclass(frozen=True)
class Entry(Generic[R]):
    """One Spark job's entry point: what differs between them."""

    name: str  # "snapshot": prog spark_jobs.snapshot, app lakeslot-snapshot, log lakeslot.snapshot
    description: str
    arguments: Callable[[argparse.ArgumentParser], None]  # the job's own flags
    run: Callable[[object, workloads.JobInput, argparse.Namespace, threading.Event], R]
    summary: Callable[[R], dict]  # the JSON summary printed last
    stop_on_sigterm: bool = False
    quiet_states: frozenset[str] = frozenset()  # a table in such a state is not failed: no stderr

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=f"spark_jobs.{self.name}",
                                         description=self.description)
        workloads.add_job_arguments(parser)
        self.arguments(parser)
        parser.add_argument("--master", metavar="URL", help=(
            "only for a standalone run: build a local session with this master from "
            "spec.sink.catalog instead of using spark-submit's"))
        return parser

    def main(self, argv: Sequence[str] | None = None, spark=None) -> int:
        """Parse ``argv``, run the job in ``spark`` (None: build the session), report, and
        return the exit status (bad arguments: SystemExit(2) from argparse)."""
        parser = self.parser()
        args = parser.parse_args(argv)
        job = workloads.job_input(parser, args)
        if not job.tables:
            parser.error(f"the job document lists no table: nothing to {self.name}")
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        log = logging.getLogger(f"lakeslot.{self.name}")
        stop = threading.Event()
        if self.stop_on_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            if spark is None:
                from lakeslot.spark.session import job_session

                spark = job_session(job, f"lakeslot-{self.name}", master=args.master)
            result = self.run(spark, job, args, stop)
        except Exception as e:  # noqa: BLE001 - reported, and the exit status says it failed
            log.error("%s job failed: %s: %s", self.name, type(e).__name__, e)
            return EXIT_FAILED
        for table in result.tables:
            if table.error and table.state not in self.quiet_states:
                print(f"{table.source}: {table.error}", file=sys.stderr)
        print(json.dumps(self.summary(result)))
        return EXIT_OK if result.ok else EXIT_FAILED


def positive_int(text: str) -> int:
    """An argparse type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
