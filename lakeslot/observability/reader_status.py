"""The replication reader's status document: the contract between the reader, which writes it,
and those who read it — local mode (``lakeslot run``, ``lakeslot status``) and the operator.

Where it lives: the reader's ``--status-file`` (local mode: ``reader-status.json`` in the state
directory) and, while the reader runs, ``GET /status`` on its metrics port (the operator asks the
reader pod there: staging may be the very thing that fails, so the document cannot live there).

The document (JSON object)::

    {"state": "running" | "retrying" | "stopped" | "failed",
     "definite": bool, "reason": str, "message": str,
     "lsn": durable LSN text or null, "since": ISO-8601 or null, "time": ISO-8601}

- ``running``: streaming (reason ``Streaming``), or starting (``Starting``).
- ``retrying``: a transient error keeps the reader from making progress and it retries; the
  reason says what fails (:data:`RETRY_REASONS`), the message is the error's first line and what
  to do, ``since`` when the trouble began. It ends when the reader seals a segment again (or
  streams for a while with nothing to write).
- ``stopped`` / ``failed``: the outcome, written once at exit (:data:`FINAL_STATES`); reasons as
  :mod:`lakeslot.reader.reader` lists them (``definite`` true: a human must act).

Invariants: a document never carries a credential (the reader's messages are libpq's, pyarrow's
and its own, with the staging URI's user info and query removed); a consumer needs only the
functions here, never the reader's internals; an unknown or empty document means "nothing known",
never a problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

FINAL_STATES = ("stopped", "failed")
RUNNING, RETRYING = "running", "retrying"
STREAMING, STARTING = "Streaming", "Starting"
STAGING_UNWRITABLE = "StagingUnwritable"  # staging refuses writes (full, read-only, permissions)
SOURCE_UNREACHABLE = "SourceUnreachable"  # the replication connection fails or breaks
RETRYING_ERROR = "ReaderRetrying"  # any other transient error (e.g. the slot held a moment)
RETRY_REASONS = (STAGING_UNWRITABLE, SOURCE_UNREACHABLE, RETRYING_ERROR)


def document(state: str, *, reason: str, message: str = "", definite: bool = False,
             lsn: str | None = None, since: datetime | None = None,
             now: datetime) -> dict:
    """One status document (see the module docstring)."""
    return {"state": state, "definite": definite, "reason": reason, "message": message,
            "lsn": lsn, "since": None if since is None else since.isoformat(),
            "time": now.isoformat()}


def is_final(doc: Mapping) -> bool:
    """Whether ``doc`` is an exit outcome (written when the reader ended), not a running state
    (nor empty)."""
    return bool(doc.get("reason")) and doc.get("state") not in (RUNNING, RETRYING)


def problem(doc: Mapping | None) -> tuple[str, str] | None:
    """What a running reader's document says keeps the changes from flowing: the ``Streaming``
    condition's reason and message, or None (streaming, starting, nothing known, or an exit
    outcome, which the caller reports as the reader's end). Pure."""
    if not doc or doc.get("state") != RETRYING:
        return None
    reason = doc.get("reason")
    reason = reason if reason in RETRY_REASONS else RETRYING_ERROR
    since = f" since {doc['since']}" if doc.get("since") else ""
    return reason, f"the reader retries{since}: {doc.get('message') or 'a transient error'}"
