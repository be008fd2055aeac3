"""The ``lakeslot reader`` command: its arguments (:func:`add_arguments`) and their translation
into a :class:`lakeslot.reader.reader.ReaderConfig` and a run of the reader process (:func:`run`).

Invariants:

- Light to import: every ``lakeslot`` command builds this parser, and the reader's start-up
  counts (``python -m bench.reader_bench`` times whole processes). At import this module needs
  only argparse and the defaults in :mod:`lakeslot.reader`; psycopg and the reader itself load
  in :func:`config` and :func:`run`. Nothing on the reader's path imports pydantic or the API
  models.
- No credential is ever an argument (it would show in ``ps`` and shell history): the password
  comes only from the environment, ``LAKESLOT_SOURCE_PASSWORD``, else libpq's own
  ``PGPASSWORD`` (or ``~/.pgpass``). ``--source-option`` carries ``spec.source.options``, which
  the API keeps free of passwords.
- The operator's container command (:func:`lakeslot.workloads.reader_command`) and local mode's
  child process (:mod:`lakeslot.local.reader_process`) both parse with this parser.

Failure modes: bad arguments (a ``--source-option`` without ``=``, an unparsable
``--stop-at-lsn``, a missing required flag) exit 2 through argparse before anything starts.
Otherwise the exit status is the reader's (:func:`lakeslot.reader.reader.main`): 0 stopped
cleanly, 1 crashed or transient errors persisted for ``--max-retry-seconds``, 3 definite error
(the status file says why).

Connection settings not given default to libpq's environment (``PGHOST``, ``PGPORT``,
``PGDATABASE``, ``PGUSER``, ``PGSSLMODE``; see
:func:`lakeslot.reader.reader.settings_from_environment`). The identity in ``application_name``
uses ``--pod``, else ``$POD_NAME``, else the host name.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from lakeslot.reader import (
    DEFAULT_HEALTH_INTERVAL_S,
    DEFAULT_MAX_RETRY_SECONDS,
    DEFAULT_SEGMENT_MAX_BYTES,
    DEFAULT_SEGMENT_MAX_SECONDS,
)

if TYPE_CHECKING:
    from lakeslot.reader.reader import ReaderConfig
    from lakeslot.source.connection import ConnectionSettings

HELP = "stream the replication slot into sealed segments in staging (one per ingestion)"
DESCRIPTION = (
    "The replication reader: pgoutput from the slot into LSN-named Parquet segments; confirms to "
    "PostgreSQL only what is sealed. The password comes only from the environment "
    "(LAKESLOT_SOURCE_PASSWORD, else PGPASSWORD). Exit codes: 0 stopped cleanly, 1 crashed or "
    "transient errors persisted, 2 bad arguments, 3 definite error (see --status-file).")


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _lsn(text: str) -> int:
    from lakeslot import lsn_text

    try:
        return lsn_text.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The reader's flags (what :func:`lakeslot.workloads.reader_command` passes, and more)."""
    p.add_argument("--ingestion", required=True, metavar="NS/NAME", help="the ingestion this reader serves")
    p.add_argument("--slot", required=True, help="the permanent logical replication slot")
    p.add_argument("--publication", required=True, help="the publication to stream")
    p.add_argument("--staging", required=True, metavar="URI", help="where segments go (file:///path, s3://...)")
    p.add_argument("--host", help="source host (default $PGHOST, else localhost)")
    p.add_argument("--port", type=int, help="source port (default $PGPORT, else 5432)")
    p.add_argument("--dbname", help="source database (default $PGDATABASE, else postgres)")
    p.add_argument("--user", help="source user (default $PGUSER, else postgres)")
    p.add_argument("--sslmode", help="libpq sslmode (default $PGSSLMODE, else prefer)")
    p.add_argument("--sslrootcert", metavar="FILE", help="CA certificate for verify-ca/verify-full")
    p.add_argument("--source-option", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="a further libpq parameter (spec.source.options; repeatable)")
    p.add_argument("--pod", help="identity in application_name (default $POD_NAME, else the host name)")
    p.add_argument("--metrics-port", type=int, metavar="N", help="serve /metrics and /healthz on this port")
    p.add_argument("--status-file", metavar="PATH",
                   help="write the status as JSON here: retrying a transient error (on a change, "
                        "at most every 2 s) and the outcome on exit")
    p.add_argument("--segment-max-bytes", type=int, metavar="N",
                   default=DEFAULT_SEGMENT_MAX_BYTES,
                   help="seal a segment after this much pgoutput data (default %(default)s)")
    p.add_argument("--segment-max-seconds", type=float, metavar="S",
                   default=DEFAULT_SEGMENT_MAX_SECONDS,
                   help="seal segments at least this often (default %(default)s)")
    p.add_argument("--feedback-interval-ms", type=int, metavar="N",
                   help="standby status interval (default min(1 s, wal_sender_timeout/2))")
    p.add_argument("--health-interval-seconds", type=float, metavar="S",
                   default=DEFAULT_HEALTH_INTERVAL_S,
                   help="check the source (publication, slot, WAL lag) this often while streaming "
                        "(default %(default)s)")
    p.add_argument("--stop-at-lsn", type=_lsn, metavar="LSN",
                   help="exit 0 once everything up to this LSN is sealed (like pg_recvlogical --endpos)")
    p.add_argument("--max-retry-seconds", type=float, metavar="S",
                   default=DEFAULT_MAX_RETRY_SECONDS,
                   help="exit 1 after this long without a successful start (default %(default)s)")


def connection_settings(args: argparse.Namespace) -> ConnectionSettings:
    """The source connection: the flags, else libpq's environment; the password only from the
    environment."""
    from lakeslot.reader import reader

    return reader.settings_from_environment(args.host, args.port, args.dbname, args.user,
                                            args.sslmode, args.sslrootcert,
                                            dict(args.source_option))


def config(args: argparse.Namespace) -> ReaderConfig:
    """The reader's configuration from parsed arguments (and the environment: see the module
    docstring)."""
    import os
    import socket

    from lakeslot.reader import reader

    return reader.ReaderConfig(
        ingestion=args.ingestion, slot=args.slot, publication=args.publication,
        staging_uri=args.staging, settings=connection_settings(args),
        pod=args.pod or os.environ.get("POD_NAME") or socket.gethostname(),
        segment_max_bytes=args.segment_max_bytes, segment_max_seconds=args.segment_max_seconds,
        feedback_interval=(None if args.feedback_interval_ms is None
                           else args.feedback_interval_ms / 1000),
        stop_at=args.stop_at_lsn, max_retry_seconds=args.max_retry_seconds,
        health_interval=args.health_interval_seconds)


def run(args: argparse.Namespace) -> int:
    """Run the reader process as ``args`` say; its exit status (see the module docstring)."""
    from lakeslot.reader import orphan, reader

    reader.configure_logging()
    orphan.watch()
    return reader.main(config(args), status_file=args.status_file, metrics_port=args.metrics_port)
