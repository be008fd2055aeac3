"""``lakeslot verify``: the command line of the exact check (:mod:`lakeslot.verify.exact`).

It only translates: the tables named on the command line (:func:`lakeslot.verify.request.parse_table`)
are checked against those the ingestion selects, the secrets come from the environment, the
result goes to stdout as text or JSON (:mod:`lakeslot.verify.report`), progress and problems to
stderr.

Failure modes, as exit codes (:mod:`lakeslot.exits`): 2 for bad input (an unknown or malformed
``--table``, a missing secret, an ingestion selecting no table); 1 when the source cannot be
read or the check could not complete (connection, storage, a gap in staging, an unmappable
value: the first line of the error is printed), or when a table is not equal.
"""

from __future__ import annotations

import json
import sys

import psycopg

from lakeslot import typemap
from lakeslot.exits import EXIT_FAILED, EXIT_USAGE
from lakeslot.local.config import Local
from lakeslot.source.connection import application_name, connect
from lakeslot.source.tables import selected
from lakeslot.staging.format import GapError
from lakeslot.verify.exact import DEFAULT_ROUNDS, DEFAULT_TIMEOUT_S, verify
from lakeslot.verify.report import render_text, to_document
from lakeslot.verify.request import parse_table


def command(local: Local, table_args: list[str], *, output: str = "text",
            timeout: float = DEFAULT_TIMEOUT_S, rounds: int = DEFAULT_ROUNDS) -> int:
    """``lakeslot verify``: prints the result (stdout), progress and problems (stderr); returns
    the exit code (:mod:`lakeslot.exits`)."""

    def fail(message: str, code: int) -> int:
        print(f"lakeslot verify: {message}", file=sys.stderr)
        return code

    try:
        wanted = [parse_table(t) for t in table_args]
    except ValueError as e:
        return fail(str(e), EXIT_USAGE)
    job = local.job
    try:
        secrets = job.catalog_secrets(local.environ)
    except ValueError as e:
        return fail(str(e), EXIT_USAGE)
    settings = job.source(local.environ)
    try:
        with connect(settings, application_name("verify", job.names.owner)) as conn:
            chosen = selected(conn, local.ingestion.spec.source)
    except psycopg.Error as e:
        return fail(f"cannot read the source: {str(e).strip().splitlines()[0]}", EXIT_FAILED)
    unknown = [t for t in wanted if t not in chosen]
    if unknown:
        return fail(f"not selected by this ingestion: {', '.join(map(str, unknown))}; it selects: "
                    f"{', '.join(map(str, chosen)) or 'no table'}", EXIT_USAGE)
    tables = wanted or chosen
    if not tables:
        return fail("the ingestion selects no table", EXIT_USAGE)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:
        verification = verify(local.ingestion, settings, tables, secrets=secrets, timeout=timeout,
                              rounds=rounds, say=say)
    except (psycopg.Error, OSError, GapError, typemap.UnmappableValue) as e:
        return fail(f"the check could not complete: {str(e).strip().splitlines()[0]}",
                    EXIT_FAILED)
    if output == "json":
        print(json.dumps(to_document(verification), indent=2, ensure_ascii=False))
    else:
        print("\n".join(render_text(verification)))
    return verification.exit_code
