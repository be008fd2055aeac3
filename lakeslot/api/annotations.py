"""The annotations a user sets on a PostgresIngestion to ask the operator for something once.

Annotations, not spec fields: they request an action (finish a deletion without PostgreSQL, run
a verification) rather than describe the desired pipeline, so they never change
``metadata.generation`` and never restart anything. Their names live here once; the reference
page lists them from :data:`ANNOTATIONS`.

kopf ignores every ``lakeslot.io/`` annotation in its diff (that prefix holds its own progress),
so setting one triggers no update handler: the operator's next reconcile (its timer, at most
30 s later) or the delete handler's retry serves it.
"""

from __future__ import annotations

from lakeslot.api.models import GROUP

SKIP_SOURCE_CLEANUP = f"{GROUP}/skip-source-cleanup"
VERIFY = f"{GROUP}/verify"
VERIFY_TABLES = f"{GROUP}/verify-tables"

ANNOTATIONS = {
    SKIP_SOURCE_CLEANUP: '`"true"` while deleting with `deletionPolicy: Delete`: finish the deletion '
    "without touching PostgreSQL (when it refuses or is unreachable: `Ready: CleanupBlocked`); the "
    "slot and publication are left behind (drop the slot by hand: it retains WAL).",
    VERIFY: "A token (1 to 63 letters, digits, `.`, `_`, `:` or `-`, starting and ending with a letter "
    "or digit, for example a timestamp): each new value requests one verification — a Job runs "
    "`lakeslot verify`, comparing every mirror table with its source at one LSN, every column of "
    "every row — reported in the `Verified` condition and `status.verification`. A running "
    "verification is cancelled by a newer token. The pipeline must be streaming.",
    VERIFY_TABLES: f"With `{VERIFY}`: the tables to check, `schema.table` quoted like psql and "
    'separated by commas (`public.accounts, "Sales"."Line Items"`); absent: every selected table.',
}
