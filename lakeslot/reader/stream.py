"""One replication session: the pgoutput stream in, sealed segments and feedback out.

:class:`Stream` runs after ``START_REPLICATION`` succeeded and the resume point was verified
(``lakeslot.reader.reader`` does that). It keeps these positions:

- ``segment.start``: where the open segment begins (the end of the last sealed one).
- ``pending_end``: how far the open segment may end if sealed now — the end LSN of the last
  commit received, or a keepalive's ``walEnd`` when no transaction is open.
- ``durable``: the end of the last sealed segment; the only LSN ever reported to PostgreSQL.
- ``received``: the furthest position the server reported (metrics only).

Invariants (DESIGN.md rules 4–6):

- Feedback write = flush = apply = ``durable``, with a reply requested, at least every
  ``feedback_interval`` (min(1 s, wal_sender_timeout/2) unless configured) — also in the middle
  of a huge transaction — and right after every seal or when the server asks.
- A keepalive's ``walEnd`` moves ``pending_end`` only while no transaction is open; ``durable``
  moves only when a segment is sealed, so everything below it is in staging.
- A segment is sealed only between transactions, when it holds ``segment_max_bytes`` of pgoutput
  data, at the wall clock's next multiple of ``segment_max_seconds`` after it opened (and
  ``pending_end`` moved: :mod:`lakeslot.cadence`), or when ``stop_at`` is reached.
- Stopping (SIGTERM): between transactions the open segment is sealed; inside one it is aborted
  (its temporary file removed: no half-written segment becomes visible). Then a final feedback.
- Relation messages always replace the cached description; when one differs, the rows received
  so far are written first, so each row is tied to the description in effect when it was sent.

Failure modes: connection problems raise ``psycopg.OperationalError`` (and a server error ending
the copy its ``psycopg`` exception); staging problems raise ``OSError``; a stream this decoder
does not understand raises :class:`lakeslot.reader.pgoutput.ProtocolError`. The caller decides
what is transient. ``check_health`` (called every ``health_interval``) raises the caller's
definite errors, e.g. when the publication was dropped while the database is idle.
``on_progress(durable, sealed=...)`` (optional) hears of every housekeeping tick and every seal:
the reader's health (:mod:`lakeslot.reader.health`) clears a reported problem on progress.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from lakeslot import cadence, lsn_text
from lakeslot.reader import DEFAULT_HEALTH_INTERVAL_S, DEFAULT_SEGMENT_MAX_BYTES, DEFAULT_SEGMENT_MAX_SECONDS, pgoutput
from lakeslot.reader.metrics import Metrics
from lakeslot.reader.protocol import HEADER, XLOGDATA, ReplicationConnection, keepalive
from lakeslot.reader.writer import BATCH_BYTES, BATCH_ROWS, Batch, SegmentWriter
from lakeslot.staging.segments import SourceIdentity
from lakeslot.staging.store import Staging

log = logging.getLogger("lakeslot.reader")

# How often the stream looks at the clock-driven duties (stop, seal by age), and the longest
# a message smaller than protocol.WAKE_BYTES waits in the socket.
TICK_S = 0.1


@dataclass(frozen=True)
class StreamSettings:
    feedback_interval: float
    segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES
    segment_max_seconds: float = DEFAULT_SEGMENT_MAX_SECONDS
    stop_at: int | None = None  # stop once everything up to here is sealed
    health_interval: float = DEFAULT_HEALTH_INTERVAL_S


class Stream:
    def __init__(self, repl: ReplicationConnection, staging: Staging,
                 cache: pgoutput.RelationCache, start: int, source: SourceIdentity,
                 settings: StreamSettings, metrics: Metrics, *,
                 should_stop: Callable[[], bool], check_health: Callable[[], None],
                 on_progress: Callable[..., None] | None = None) -> None:
        self.repl = repl
        self.staging = staging
        self.cache = cache
        self.source = source
        self.settings = settings
        self.metrics = metrics
        self.should_stop = should_stop
        self.check_health = check_health
        self.on_progress = on_progress
        self.durable = self.pending_end = self.received = start
        self.in_transaction = False
        self.batch = Batch()
        self._open_segment(time.monotonic())
        now = time.monotonic()
        self._next_feedback = self._next_tick = now
        self._next_health = now + settings.health_interval

    # the loop ----------------------------------------------------------------------------------

    def run(self) -> int:
        """Stream until stopped or ``stop_at`` is durable; returns the durable LSN."""
        get = self.repl.pgconn.get_copy_data
        batch = self.batch
        raw = batch.raw
        changes = pgoutput.CHANGES
        while True:
            nbytes, data = get(1)
            if nbytes > 0:
                if data[0] == XLOGDATA:
                    kind = data[HEADER]
                    if kind in changes:
                        raw.append(data)
                        batch.nbytes += nbytes
                        if batch.nbytes >= BATCH_BYTES or len(raw) >= BATCH_ROWS:
                            self._write_batch()
                            if self._housekeeping(time.monotonic()):
                                return self.durable
                    elif self._control(kind, data):
                        return self.durable
                elif self._keepalive(data):
                    return self.durable
            elif nbytes == 0:
                now = time.monotonic()
                if self._housekeeping(now):
                    return self.durable
                self.repl.wait_readable(self._next_tick - now)
            else:
                raise self.repl.end_of_copy_error()

    def _control(self, kind: int, data) -> bool:
        """Every pgoutput message but a row change; True when the stream should end."""
        batch = self.batch
        if kind == pgoutput.BEGIN:
            begin = pgoutput.decode_begin(data, HEADER)
            self.in_transaction = True
            batch.begin(begin.final_lsn, begin.xid)
        elif kind == pgoutput.COMMIT:
            end = pgoutput.decode_commit(data, HEADER).end_lsn
            batch.raw.append(data)
            batch.nbytes += len(data)
            self.in_transaction = False
            self.pending_end = end
            self.received = max(self.received, end)
            now, s = time.monotonic(), self.settings
            if (now >= self._next_tick or self.segment_bytes + batch.nbytes >= s.segment_max_bytes
                    or (s.stop_at is not None and end >= s.stop_at)):
                return self._housekeeping(now)
            return False
        elif kind == pgoutput.RELATION:
            relation = self.cache.resolve(pgoutput.decode_relation(data, HEADER))
            if self.cache.changes(relation):
                log.info("relation %s.%s changed", relation.schema, relation.table,
                         extra={"relation_oid": relation.oid})
                self._write_batch()  # rows so far belong to the previous description
            self.cache.add(relation)
        elif kind == pgoutput.TYPE:
            self.cache.add_type(pgoutput.decode_type(data, HEADER))
        elif kind == pgoutput.ORIGIN:
            batch.origin(pgoutput.decode_origin(data, HEADER).name)
        elif kind == pgoutput.TRUNCATE:
            batch.truncate(pgoutput.decode_truncate(data, HEADER).relation_oids)
            batch.nbytes += len(data)
        elif kind == pgoutput.MESSAGE:
            message = pgoutput.decode_message(data, HEADER)
            if message.transactional != self.in_transaction:
                raise pgoutput.ProtocolError("a logical message with transactional="
                                             f"{message.transactional} arrived "
                                             f"{'inside' if self.in_transaction else 'outside'} "
                                             "a transaction")
            if not message.transactional:
                batch.begin(message.lsn, None)
            batch.raw.append(data)
            batch.nbytes += len(data)
        else:
            raise pgoutput.ProtocolError(f"unexpected pgoutput message type {chr(kind)!r}")
        if batch.full:
            self._write_batch()
            return self._housekeeping(time.monotonic())
        return False

    def _keepalive(self, data) -> bool:
        wal_end, reply = keepalive(data)
        self.received = max(self.received, wal_end)
        if not self.in_transaction and wal_end > self.pending_end:
            self.pending_end = wal_end  # every transaction before wal_end was sent in full
        if reply:
            self._feedback(time.monotonic())
        return self._housekeeping(time.monotonic())

    # decisions -------------------------------------------------------------------------------

    def _housekeeping(self, now: float) -> bool:
        """Stop, seal, feedback and health checks that are due; True when the stream ends.
        A busy stream comes here at every batch and, between, whenever ``_next_tick`` passed."""
        self.metrics.beat()
        if self.should_stop():
            self._finish()
            return True
        if not self.in_transaction and self._between_transactions(now):
            return True
        if now >= self._next_feedback:
            self._feedback(now)
        if now >= self._next_health:
            self._next_health = now + self.settings.health_interval
            self.check_health()
        if self.on_progress is not None:
            self.on_progress(self.durable, sealed=False)
        # (a seal time that passed with nothing to seal is no deadline: the stream would wake
        # at once, again and again — a core spent on an idle source)
        sealable = not self.in_transaction and self.pending_end > self.durable
        self._next_tick = min(now + TICK_S, self._next_feedback, self._next_health,
                              self.seal_at if sealable else math.inf)
        return False

    def _between_transactions(self, now: float) -> bool:
        """Seal when a threshold is reached; True when ``stop_at`` is durable."""
        s = self.settings
        stop = s.stop_at is not None and self.pending_end >= s.stop_at
        moved = self.pending_end > self.durable
        if moved and (stop or self.segment_bytes + self.batch.nbytes >= s.segment_max_bytes
                      or now >= self.seal_at):
            self._seal(now)
        return stop

    def _seal(self, now: float) -> None:
        self._write_batch()
        name = self.segment.seal(self.pending_end)
        self.durable = self.pending_end
        self.metrics.segments_sealed.inc()
        if self.on_progress is not None:
            self.on_progress(self.durable, sealed=True)
        log.info("sealed segment %s", name.filename,
                 extra={"segment": name.filename, "rows": self.segment.rows,
                        "durable_lsn": lsn_text.format(self.durable)})
        self._open_segment(now)
        self._feedback(now)

    def _open_segment(self, now: float) -> None:
        self.segment = SegmentWriter(self.staging, self.durable, self.source)
        self.segment_bytes = 0
        # sealed (when WAL moved) at the wall clock's next multiple of the seal period, when the
        # apply job looks (lakeslot.cadence)
        self.seal_at = now + cadence.until_grid(time.time(), self.settings.segment_max_seconds)

    def _write_batch(self) -> None:
        self.segment_bytes += self.batch.nbytes
        record = self.batch.take(self.cache, self.segment.relations, self.in_transaction)
        if record is not None:
            self.segment.write(record)
            self.metrics.rows(record.column("op"))

    def _feedback(self, now: float) -> None:
        self.repl.send_status(self.durable, reply=True)
        self.metrics.received_lsn.set(self.received)
        self.metrics.durable_lsn.set(self.durable)
        self._next_feedback = now + self.settings.feedback_interval

    def _finish(self) -> None:
        """Stop: seal what is complete, drop what is not, tell the server where we are."""
        if self.in_transaction or self.pending_end == self.durable:
            self.segment.abort()
        else:
            self._seal(time.monotonic())
        self._feedback(time.monotonic())

    def abort(self) -> None:
        """The session failed: drop the open segment's unsealed rows."""
        self.segment.abort()
