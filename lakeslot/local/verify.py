"""``lakeslot verify``: the command line of the exact check (:mod:`lakeslot.verify.exact`).

It only translates: the tables named on the command line (:func:`lakeslot.verify.request.parse_table`)
are checked against those the ingestion selects, the secrets come from the environment, the
result goes to stdout as text or JSON (:mod:`lakeslot.verify.report`), progress and problems to
stderr. The ingestion comes from a file (``-f``) or, in the operator's verification Job, from
``--ingestion-json`` like the Spark jobs'; with ``--result-token`` the outcome — the result, or
the error that kept the check from one — is also written to staging as the document the operator
reads (:func:`lakeslot.verify.report.result_document`), whatever the exit code.

Failure modes, as exit codes (:mod:`lakeslot.exits`): 2 for bad input (an unknown or malformed
``--table``, a missing secret, an ingestion selecting no table); 1 when the source cannot be
read or the check could not complete (connection, storage, a gap in staging, an unmappable
value: the first line of the error is printed), when a table is not equal, or when the result
document cannot be written to staging.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime

import psycopg

from lakeslot.api.models import PostgresIngestion
from lakeslot.exits import EXIT_FAILED, EXIT_USAGE
from lakeslot.mirror import typemap
from lakeslot.source.connection import application_name, connect
from lakeslot.source.tables import selected
from lakeslot.staging.segments import GapError
from lakeslot.staging.store import Staging
from lakeslot.verify.exact import DEFAULT_ROUNDS, DEFAULT_TIMEOUT_S, verify
from lakeslot.verify.report import Verification, render_text, result_document, to_document
from lakeslot.verify.request import parse_table
from lakeslot.workloads import JobInput


def command(ingestion: PostgresIngestion, environ: Mapping[str, str], table_args: list[str], *,
            output: str = "text", timeout: float = DEFAULT_TIMEOUT_S, rounds: int = DEFAULT_ROUNDS,
            result_token: str | None = None) -> int:
    """``lakeslot verify``: prints the result (stdout), progress and problems (stderr); with
    ``result_token`` also writes the result document to staging; returns the exit code
    (:mod:`lakeslot.exits`)."""
    started = datetime.now(UTC)

    def finish(code: int, verification: Verification | None = None,
               error: str | None = None) -> int:
        if error is not None:
            print(f"lakeslot verify: {error}", file=sys.stderr)
        if result_token is None:
            return code
        document = result_document(result_token, started_at=started, finished_at=datetime.now(UTC),
                                   exit_code=code, verification=verification, error=error)
        try:
            Staging(ingestion.spec.staging.uri).write_verify_result(result_token, document)
        except OSError as e:
            print(f"lakeslot verify: cannot write the result to staging: {e}", file=sys.stderr)
            return EXIT_FAILED
        return code

    try:
        wanted = [parse_table(t) for t in table_args]
    except ValueError as e:
        return finish(EXIT_USAGE, error=f"--table {e}")
    job = JobInput(ingestion, ())
    try:
        secrets = job.catalog_secrets(environ)
    except ValueError as e:
        return finish(EXIT_USAGE, error=str(e))
    settings = job.source(environ)
    try:
        with connect(settings, application_name("verify", job.names.owner)) as conn:
            chosen = selected(conn, ingestion.spec.source)
    except psycopg.Error as e:
        return finish(EXIT_FAILED, error=f"cannot read the source: {str(e).strip().splitlines()[0]}")
    unknown = [t for t in wanted if t not in chosen]
    if unknown:
        return finish(EXIT_USAGE, error=f"not selected by this ingestion: "
                      f"{', '.join(map(str, unknown))}; it selects: "
                      f"{', '.join(map(str, chosen)) or 'no table'}")
    tables = wanted or chosen
    if not tables:
        return finish(EXIT_USAGE, error="the ingestion selects no table")

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:
        verification = verify(ingestion, settings, tables, secrets=secrets, timeout=timeout,
                              rounds=rounds, say=say)
    except (psycopg.Error, OSError, GapError, typemap.UnmappableValue) as e:
        return finish(EXIT_FAILED,
                      error=f"the check could not complete: {str(e).strip().splitlines()[0]}")
    if output == "json":
        print(json.dumps(to_document(verification), indent=2, ensure_ascii=False))
    else:
        print("\n".join(render_text(verification)))
    return finish(verification.exit_code, verification)
