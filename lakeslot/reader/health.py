"""What the running reader reports about itself: streaming, or retrying a transient error — the
document of :mod:`lakeslot.observability.reader_status`, served at ``/status`` and written to the status file.

The reader's retry loop (:func:`lakeslot.reader.reader.run`) tells :class:`Health` about every
transient error (:meth:`Health.failed`) and every session that starts streaming
(:meth:`Health.started`); the stream tells it about progress (:meth:`Health.progress`, at every
housekeeping tick, ``sealed`` when a segment was sealed).

Invariants:

- A problem is reported from the first failed attempt and clears only on progress: a segment
  sealed, or a session that streamed :attr:`Health.settle_s` (longer than a segment may stay
  open) without an error — so there was nothing to write. A session that starts and then fails
  again at its first write (staging full: the reader reconnects about once a second) does not
  clear it in between.
- The status file is written only when the state, reason or message changed, and at most once
  every :data:`WRITE_EVERY_S` seconds (a change inside that window is written when it ends, at
  the next call); never for positions alone. ``/status`` always answers with the current state.
- Messages are the error's first line (libpq's, pyarrow's, the OS's) — never a credential: the
  staging URI's user info and query, where credentials can hide, are removed from them.

Failure mode: the status file cannot be written (it may live on the full disk) — logged once per
state, the reader goes on; the exit outcome is still attempted at the end.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from urllib.parse import urlsplit, urlunsplit

import psycopg

from lakeslot import lsn_text
from lakeslot.observability import reader_status

log = logging.getLogger("lakeslot.reader")

WRITE_EVERY_S = 2.0


def redact(uri: str) -> str:
    """A staging URI fit for logs: without user info and query (where credentials can hide)."""
    parts = urlsplit(uri)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def describe(e: BaseException) -> str:
    """An error in one line: its type and its message's first line."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def classify(error: BaseException, staging_uri: str = "") -> tuple[str, str]:
    """The retry reason and message for a transient error (pure): ``OSError`` is staging's
    (the reader's only file I/O; psycopg's errors are not ``OSError``), a connection that
    cannot be made or was lost is the source's, anything else (e.g. the slot still held a moment
    after an eviction) a plain retry."""
    text = describe(error)
    if staging_uri and staging_uri != redact(staging_uri):
        text = text.replace(staging_uri, redact(staging_uri))
    if isinstance(error, OSError):
        return reader_status.STAGING_UNWRITABLE, (
            f"cannot write to staging ({text}); nothing is confirmed to PostgreSQL until it is "
            "sealed, so the slot retains the WAL meanwhile: free space on staging or make it "
            "writable again")
    if isinstance(error, psycopg.OperationalError) and _connection_lost(error):
        return reader_status.SOURCE_UNREACHABLE, (
            f"cannot stream from PostgreSQL ({text}); check that the source is up and accepts "
            "replication connections from the reader")
    return reader_status.RETRYING_ERROR, text


# server-side connection ends: administrator or crash shutdown, the server starting up
_SERVER_GONE = ("57P01", "57P02", "57P03")


def _connection_lost(error: psycopg.Error) -> bool:
    """libpq's own connection failures carry no SQLSTATE; the server's are class 08 or 57P0x."""
    state = error.sqlstate
    return state is None or state.startswith("08") or state in _SERVER_GONE


class Health:
    """The reader's current state; writes it to ``path`` (None: only served) as bounded above."""

    def __init__(self, path: str | None, *, settle_s: float, staging_uri: str = "",
                 write_every_s: float = WRITE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.path, self.settle_s, self.staging_uri = path, settle_s, staging_uri
        self.write_every_s, self.clock, self.wall = write_every_s, clock, wall
        # (state, reason, message, since): replaced whole, so /status reads one consistent value
        self.current: tuple[str, str, str, datetime | None] = (reader_status.RUNNING, reader_status.STARTING, "", None)
        self.durable: int | None = None
        self._streaming_since: float | None = None
        self._written: tuple | None = None  # what the file holds (None: nothing written)
        self._written_at = -float("inf")
        self._write_failed = False

    @property
    def retrying(self) -> bool:
        return self.current[0] == reader_status.RETRYING

    def failed(self, error: BaseException) -> None:
        """A transient error ended a session or kept one from starting."""
        reason, message = classify(error, self.staging_uri)
        since = self.current[3] if self.retrying else self.wall()
        self.current = (reader_status.RETRYING, reason, message, since)
        self._streaming_since = None
        self.tick()

    def started(self) -> None:
        """A session streams (START_REPLICATION succeeded)."""
        self._streaming_since = self.clock()
        if not self.retrying:
            self.current = (reader_status.RUNNING, reader_status.STREAMING, "", None)
        self.tick()

    def progress(self, durable: int, *, sealed: bool) -> None:
        """The stream's housekeeping: ``sealed`` when a segment was sealed just now."""
        self.durable = durable
        if self.retrying and (sealed or (
                self._streaming_since is not None
                and self.clock() - self._streaming_since >= self.settle_s)):
            log.info("the reader makes progress again (%s)", "a segment sealed" if sealed
                     else f"streamed {self.settle_s:g} s without an error")
            self.current = (reader_status.RUNNING, reader_status.STREAMING, "", None)
        self.tick()

    def document(self) -> dict:
        state, reason, message, since = self.current
        return reader_status.document(state, reason=reason, message=message, since=since,
                                      lsn=None if self.durable is None else lsn_text.format(self.durable),
                                      now=self.wall())

    def tick(self) -> None:
        """Write the file if the state changed and the last write is old enough."""
        if self.path is None or self.current == self._written:
            return
        now = self.clock()
        if now - self._written_at < self.write_every_s:
            return
        self._written, self._written_at = self.current, now
        try:
            write_document(self.path, self.document())
            self._write_failed = False
        except OSError as e:
            if not self._write_failed:
                log.warning("cannot write the status file %s: %s", self.path, e)
            self._write_failed = True


def write_document(path: str, document: dict) -> None:
    """Write ``document`` to ``path`` atomically (temporary file + rename)."""
    temp = f"{path}.tmp-{os.getpid()}"
    with open(temp, "w") as f:
        json.dump(document, f)
        f.write("\n")
    os.replace(temp, path)
