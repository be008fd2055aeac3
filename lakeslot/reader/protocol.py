"""The streaming replication protocol around pgoutput: COPY_BOTH framing and standby feedback.

After ``START_REPLICATION`` the connection is in COPY_BOTH mode. The server sends CopyData
messages of two kinds; the client sends one:

- ``w`` XLogData: ``dataStart`` (8), ``walEnd`` (8), ``sendTime`` (8), then one pgoutput message
  (:data:`HEADER` = 25 bytes precede it). For logical replication both LSN fields are the
  position of the decoded change, not the server's progress.
- ``k`` primary keepalive: ``walEnd`` (8), ``sendTime`` (8), ``replyRequested`` (1). ``walEnd``
  is the end of the WAL the walsender has read (its *sent* LSN): every transaction that committed
  before it has been sent in full before the keepalive (Materialize's finding). That is what lets
  an idle or unrelated-write database advance (DESIGN.md rule 4).
- ``r`` standby status update (client → server): ``write``, ``flush``, ``apply`` (8 each),
  ``clientTime`` (8), ``replyRequested`` (1).

Invariants:

- The only LSN this module ever reports is the one the caller passes: the reader passes its
  durable (sealed) LSN for write, flush and apply alike. Nothing here decides what is durable.
- Replication connections speak the simple query protocol only; commands are sent with
  ``pgconn.send_query`` and identifiers/literals rendered by ``psycopg.sql``.
- Waiting is always bounded by the caller's timeout. Once streaming, the socket's receive
  low-water mark is :data:`WAKE_BYTES` (``SO_RCVLOWAT``): a busy stream wakes the reader once
  per that many bytes instead of once per few messages (the walsender is usually the slower
  side: a bare receive loop spent half its CPU in system calls without it, the reader ≈ 10 %
  more CPU); anything smaller is picked up when the wait times out (the stream's tick, 0.1 s).

``TIMELINE_HISTORY`` (:meth:`ReplicationConnection.switchpoints`) answers where each ancestor
timeline of the server's current one ended: after a failover (a promotion starts a new timeline),
WAL below the point where the old timeline ended is the same on both, WAL above it may differ.

Failure modes: a server-side error during COPY (backend terminated, publication dropped, slot
invalidated) ends the copy; :meth:`ReplicationConnection.end_of_copy_error` turns the final
result into the matching ``psycopg`` exception (with its SQLSTATE) so the caller can classify it.
A connection that dies raises :class:`psycopg.OperationalError` from ``get_copy_data``.
"""

from __future__ import annotations

import select
import socket
import struct
import time

import psycopg
from psycopg import errors, pq, sql

from lakeslot import lsn_text
from lakeslot.source.connection import one_row
from lakeslot.staging.segments import SourceIdentity

XLOGDATA = ord("w")
KEEPALIVE = ord("k")
HEADER = 25  # 'w' + dataStart + walEnd + sendTime: where the pgoutput message begins
WAKE_BYTES = 64 << 10
POSTGRES_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in microseconds since 1970-01-01

_KEEPALIVE = struct.Struct("!Qq?")
_STATUS = struct.Struct("!cQQQq?")


def keepalive(data) -> tuple[int, bool]:
    """``(walEnd, replyRequested)`` of a primary keepalive message."""
    wal_end, _, reply = _KEEPALIVE.unpack_from(data, 1)
    return wal_end, reply


def standby_status(lsn: int, *, reply: bool, now: float | None = None) -> bytes:
    """A standby status update reporting ``lsn`` as written, flushed and applied."""
    now_us = int((time.time() if now is None else now) * 1_000_000) - POSTGRES_EPOCH_US
    return _STATUS.pack(b"r", lsn, lsn, lsn, now_us, reply)


def quote_list(names: list[str]) -> str:
    """A comma-separated list of double-quoted names, as ``publication_names`` expects (the
    server splits it like ``SplitIdentifierString``, so any name survives)."""
    return ",".join('"' + n.replace('"', '""') + '"' for n in names)


class ReplicationConnection:
    """A ``replication=database`` connection: identify, start streaming, exchange CopyData."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn

    def identify_system(self) -> SourceIdentity:
        system_id, timeline, _, _ = one_row(self.conn.execute("IDENTIFY_SYSTEM"))
        return SourceIdentity(str(system_id), int(timeline))

    def switchpoints(self, timeline: int) -> dict[int, int]:
        """Every ancestor of ``timeline`` → the LSN where it ended (where its successor in this
        history begins), from the server's history file (``TIMELINE_HISTORY``; timeline 1 has
        none). Lines are ``<parent timeline> <switchpoint LSN> <reason>``; ``#`` comments."""
        if timeline <= 1:
            return {}
        content = one_row(self.conn.execute(
            sql.SQL(f"TIMELINE_HISTORY {int(timeline)}")))[1]
        if isinstance(content, bytes):
            content = content.decode()
        ends = {}
        for line in content.splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2:
                ends[int(fields[0])] = lsn_text.parse(fields[1])
        return ends

    def start(self, slot: str, start_lsn: int, options: dict[str, str]) -> None:
        """``START_REPLICATION SLOT <slot> LOGICAL <lsn> (<options>)``; raises the server's error
        (e.g. :class:`psycopg.errors.ObjectInUse` while another backend holds the slot)."""
        command = sql.SQL("START_REPLICATION SLOT {} LOGICAL {} ({})").format(
            sql.Identifier(slot), sql.SQL(lsn_text.format(start_lsn)),
            sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(k), sql.Literal(v))
                               for k, v in options.items()))
        self.pgconn.send_query(command.as_bytes(self.conn))
        result = self.pgconn.get_result()
        if result is None:  # libpq answers every query sent, even on a broken connection
            raise psycopg.OperationalError("START_REPLICATION got no result from libpq")
        if result.status != pq.ExecStatus.COPY_BOTH:
            while self.pgconn.get_result() is not None:
                pass
            raise errors.error_from_result(result, encoding=self.conn.info.encoding)
        sock = socket.socket(fileno=self.pgconn.socket)  # borrowed: detached, never closed
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, WAKE_BYTES)
        finally:
            sock.detach()

    def wait_readable(self, timeout: float) -> None:
        """Block until the server sent something (once streaming: :data:`WAKE_BYTES`) or
        ``timeout`` passed, then buffer whatever arrived."""
        select.select([self.pgconn.socket], [], [], max(timeout, 0.0))
        self.pgconn.consume_input()

    def send_status(self, lsn: int, *, reply: bool) -> None:
        self.pgconn.put_copy_data(standby_status(lsn, reply=reply))
        self.pgconn.flush()

    def end_of_copy_error(self) -> psycopg.Error:
        """The error that ended the copy (the server never ends it without one)."""
        result = self.pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.FATAL_ERROR:
            return psycopg.OperationalError("the server ended the replication stream")
        return errors.error_from_result(result, encoding=self.conn.info.encoding)

    def close(self) -> None:
        """Close without ``with``-semantics: a COMMIT sent into COPY_BOTH would fail."""
        self.conn.close()
