"""The replication reader process: sessions, retries, definite errors, signals, exit codes.

One reader runs per ingestion (the operator's single-replica Deployment, or a child process in
local mode). Its identity towards PostgreSQL is ``application_name`` =
``connection.application_name("reader", ingestion, pod)``: the operator treats the slot holder
with that name as legitimate and terminates any other.

The command line is :mod:`lakeslot.reader.command` (arguments, defaults, connection settings
from libpq's environment; the password only from ``LAKESLOT_SOURCE_PASSWORD`` or libpq's own).

Exit codes (:mod:`lakeslot.exits`): ``0`` stopped cleanly (SIGTERM/SIGINT, or ``--stop-at-lsn`` reached); ``1`` crashed,
or transient errors persisted for ``--max-retry-seconds``; ``2`` bad arguments; ``3`` definite
error — restarting cannot help, a human or the operator must act (the status file says why).

Status document (:mod:`lakeslot.observability.reader_status`): while the reader runs, ``state`` is
``running``, or ``retrying`` with a reason (``StagingUnwritable``, ``SourceUnreachable``,
``ReaderRetrying``) and the error while a transient error keeps it from making progress
(:mod:`lakeslot.reader.health`: written to the status file on a change, at most every 2 s, and
served at ``/status`` with the metrics); at exit the outcome is written atomically:
``{"state": "stopped" | "failed", "definite": bool, "reason": str, "message": str, "lsn":
durable LSN text or null, "time": ISO-8601}``. Reasons of definite errors: ``PublicationMissing``,
``SlotMissing``, ``SlotLost``, ``SlotAhead``, ``TimelineChanged``, ``SystemChanged``,
``ProtocolError``; of others: ``Stopped``, ``RetriesExhausted``, ``Crashed``.

A session (DESIGN.md rules 4–7): connect (a metadata connection and a replication connection);
verify the publication and the slot (exists, not lost); resume at the end of the last sealed
segment (the slot's ``confirmed_flush_lsn`` when staging is empty) after checking that segment's
system identifier and timeline against ``IDENTIFY_SYSTEM`` — another timeline (a failover) is
accepted only when staging ends at or before the point where the staged timeline ended in the
server's history (``TIMELINE_HISTORY``), which a failover slot with ``synchronized_standby_slots``
guarantees; a slot missing on a new timeline is ``SlotLost`` (a failover lost it); evict any
other holder of the slot (:func:`lakeslot.source.slot.evict_stale_holders`); ``START_REPLICATION``; re-read the slot —
``confirmed_flush_lsn`` beyond the resume point means someone advanced the slot past data staging
does not have (PostgreSQL ≥ 15 would silently fast-forward): definite error; then stream
(:mod:`lakeslot.reader.stream`).

Transient errors (:data:`lakeslot.errors.TRANSIENT_IN_READER`: connection lost, backend
terminated, slot still held for a moment after an eviction, staging I/O) end the session; the
next one starts after an exponential backoff and resumes from staging, so nothing is lost or
duplicated. Every session start re-verifies the publication and the slot, so a
transient-looking failure caused by a dropped publication or an invalidated slot becomes the
definite error it is.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
from psycopg import errors

from lakeslot import lsn_text
from lakeslot.errors import TRANSIENT_IN_READER, DefiniteError
from lakeslot.exits import EXIT_DEFINITE, EXIT_FAILED, EXIT_OK
from lakeslot.observability import reader_status
from lakeslot.reader import (
    DEFAULT_HEALTH_INTERVAL_S,
    DEFAULT_MAX_RETRY_SECONDS,
    DEFAULT_SEGMENT_MAX_BYTES,
    DEFAULT_SEGMENT_MAX_SECONDS,
    pgoutput,
)
from lakeslot.reader.health import Health, describe, redact, write_document
from lakeslot.reader.metrics import Metrics
from lakeslot.reader.protocol import ReplicationConnection, quote_list
from lakeslot.reader.stream import Stream, StreamSettings
from lakeslot.source import connection, failover, slot
from lakeslot.source.connection import PASSWORD_ENV, ConnectionSettings
from lakeslot.staging.segments import SourceIdentity
from lakeslot.staging.store import Staging

log = logging.getLogger("lakeslot.reader")

BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 30.0


class ReaderError(DefiniteError):
    """The reader's definite error: ``reason`` is a stable CamelCase word for status and events,
    ``lsn`` the durable LSN when known."""

    def __init__(self, reason: str, message: str, lsn: int | None = None) -> None:
        super().__init__(message)
        self.reason, self.lsn = reason, lsn


class RetriesExhausted(Exception):
    pass


@dataclass(frozen=True)
class ReaderConfig:
    ingestion: str
    slot: str
    publication: str
    staging_uri: str
    settings: ConnectionSettings
    pod: str
    segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES
    segment_max_seconds: float = DEFAULT_SEGMENT_MAX_SECONDS
    feedback_interval: float | None = None  # None: min(1 s, wal_sender_timeout / 2)
    stop_at: int | None = None
    max_retry_seconds: float = DEFAULT_MAX_RETRY_SECONDS
    health_interval: float = DEFAULT_HEALTH_INTERVAL_S

    @property
    def app_name(self) -> str:
        return connection.application_name("reader", self.ingestion, self.pod)


def feedback_interval(wal_sender_timeout_ms: int) -> float:
    """min(1 s, wal_sender_timeout / 2); a disabled timeout (0) leaves 1 s."""
    return min(1.0, wal_sender_timeout_ms / 2000) if wal_sender_timeout_ms > 0 else 1.0


def backoff(attempt: int) -> float:
    """Exponential from 0.5 s to 30 s, with ±20 % jitter."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** attempt) * random.uniform(0.8, 1.2)


# checks --------------------------------------------------------------------------------------

def check_source(meta: psycopg.Connection, config: ReaderConfig,
                 staging: Staging | None = None) -> slot.SlotHealth:
    """The publication exists and the slot is usable; returns the slot's health. With
    ``staging`` (at a session's start) a missing slot that a failover lost says so
    (:func:`lakeslot.source.failover.lost_by_failover`)."""
    if meta.execute("SELECT 1 FROM pg_publication WHERE pubname = %s",
                    (config.publication,)).fetchone() is None:
        raise ReaderError("PublicationMissing",
                          f"publication {config.publication} does not exist (dropped?); "
                          "recreate it (the operator does so for publications it manages) "
                          "and re-snapshot the tables whose changes were missed")
    health = slot.health(meta, config.slot)
    lost = None if health is not None or staging is None else failover.lost_by_failover(
        meta, config.slot, staging)
    if lost is not None:
        raise ReaderError("SlotLost", f"{lost}; recreate the slot and re-snapshot "
                          "(policies.onSlotLost: Resnapshot does both)")
    if health is None:
        raise ReaderError("SlotMissing", f"replication slot {config.slot} does not exist "
                          "(dropped?); the changes since it was dropped are lost: re-snapshot")
    reason = slot.lost_reason(health)
    if reason is not None:
        raise ReaderError("SlotLost", f"{reason}; recreate the slot and re-snapshot",
                          health.confirmed_flush_lsn)
    return health


def check_resume(staging: Staging, health: slot.SlotHealth, source: SourceIdentity,
                 switchpoints: Callable[[], Mapping[int, int]] = dict) -> int:
    """Where to resume: the end of the last sealed segment, whose source must be this system
    and a timeline whose WAL up to that end is this server's too; the slot's
    confirmed_flush_lsn when staging is empty. ``switchpoints``: the current timeline's history
    (ancestor → where it ended, :meth:`ReplicationConnection.switchpoints`), asked only when the
    timeline changed."""
    last = staging.resume_point()
    if last is None:
        # check_source found the slot; a logical slot has a confirmed_flush_lsn once created
        # (NULL only for physical slots and while pg_create_logical_replication_slot runs).
        assert health.confirmed_flush_lsn is not None
        return health.confirmed_flush_lsn
    recorded = staging.metadata(last).source
    if recorded.system_id != source.system_id:
        raise ReaderError("SystemChanged",
                          f"staging was written from PostgreSQL system {recorded.system_id}, "
                          f"the source is now system {source.system_id}; use a new staging "
                          "location and re-snapshot", last.end)
    if recorded.timeline != source.timeline:
        ended = switchpoints().get(recorded.timeline)
        if ended is None:
            raise ReaderError("TimelineChanged",
                              f"the source moved from timeline {recorded.timeline} to "
                              f"{source.timeline}, which does not descend from it "
                              "(point-in-time recovery, or a standby of another history?): "
                              f"what was staged up to {lsn_text.format(last.end)} may differ "
                              "from its WAL; re-snapshot", last.end)
        if last.end > ended:
            raise ReaderError("TimelineChanged",
                              f"the source moved from timeline {recorded.timeline} to "
                              f"{source.timeline} at {lsn_text.format(ended)} (failover or "
                              f"point-in-time recovery), but staging ends at "
                              f"{lsn_text.format(last.end)}: what was staged after the switch "
                              "may be missing from the promoted server (only a failover slot "
                              "with the standby in synchronized_standby_slots holds the reader "
                              "back to what the standby has); re-snapshot", last.end)
        # A failover slot's consumer gets only WAL the standby has (synchronized_standby_slots):
        # everything staged is on the new timeline too.
        log.info("the source moved from timeline %d to %d at %s, after the end of staging: "
                 "resuming", recorded.timeline, source.timeline, lsn_text.format(ended))
    return last.end


def check_not_ahead(health: slot.SlotHealth | None, resume: int) -> None:
    """After START_REPLICATION (we hold the slot, nobody can move it): the slot must not be past
    the resume point."""
    if health is None:
        raise ReaderError("SlotMissing", "the replication slot vanished after the start")
    # We hold the slot, so it is a created logical slot: it has a confirmed_flush_lsn.
    assert health.confirmed_flush_lsn is not None
    if health.confirmed_flush_lsn > resume:
        raise ReaderError(
            "SlotAhead",
            f"slot {health.name} was advanced to {lsn_text.format(health.confirmed_flush_lsn)} "
            f"but staging ends at {lsn_text.format(resume)}: the changes in between were "
            "released without being staged (pg_replication_slot_advance or another consumer); "
            "re-snapshot", resume)


# one session ----------------------------------------------------------------------------------

class Session:
    """One pair of connections and one replication stream."""

    def __init__(self, config: ReaderConfig, metrics: Metrics, stop: threading.Event,
                 health: Health) -> None:
        self.config, self.metrics, self.stop, self.health = config, metrics, stop, health
        self.started = False
        self.durable: int | None = None

    def run(self) -> int:
        config = self.config
        settings = config.settings
        self.staging = Staging(config.staging_uri)
        meta = connection.connect(settings, config.app_name, long_running=True)
        repl = None
        try:
            health = check_source(meta, config, self.staging)
            repl = stream_conn = ReplicationConnection(
                connection.connect(settings, config.app_name, replication=True))
            source = repl.identify_system()
            resume = check_resume(self.staging, health, source,
                                  lambda: stream_conn.switchpoints(source.timeline))
            self.durable = resume
            if health.active and health.holder != config.app_name:
                for e in slot.evict_stale_holders(meta, config.slot, config.app_name):
                    log.warning("evicted stale slot holder pid %s (%s)", e.pid,
                                e.application_name, extra={"pid": e.pid})
            try:
                repl.start(config.slot, resume, self._options(meta))
            except errors.ObjectInUse:
                slot.evict_stale_holders(meta, config.slot, config.app_name)
                raise
            check_not_ahead(slot.health(meta, config.slot), resume)
            self.started = True
            self.health.started()
            removed = self.staging.remove_temporaries()
            log.info("streaming from %s", lsn_text.format(resume),
                     extra={"slot": config.slot, "resume_lsn": lsn_text.format(resume),
                            "timeline": source.timeline, "removed_temporaries": removed})
            stream = Stream(
                repl, self.staging, pgoutput.RelationCache(self._type_names(meta)), resume,
                source, self._stream_settings(meta), self.metrics,
                should_stop=self.stop.is_set, check_health=lambda: self._health(meta),
                on_progress=self.health.progress)
            try:
                self.durable = stream.run()
            except BaseException:
                stream.abort()
                self.durable = stream.durable
                raise
            return self.durable
        finally:
            if repl is not None:
                repl.close()
            meta.close()

    def _options(self, meta: psycopg.Connection) -> dict[str, str]:
        options = {"proto_version": "1", "publication_names": quote_list([self.config.publication])}
        if meta.info.server_version >= 140000:
            options["messages"] = "true"
        return options

    def _stream_settings(self, meta: psycopg.Connection) -> StreamSettings:
        c = self.config
        interval = c.feedback_interval
        if interval is None:
            timeout_ms = connection.one_row(meta.execute(
                "SELECT setting::int FROM pg_settings WHERE name = 'wal_sender_timeout'"
            ))[0]
            interval = feedback_interval(timeout_ms)
        return StreamSettings(interval, c.segment_max_bytes, c.segment_max_seconds, c.stop_at,
                              c.health_interval)

    def _health(self, meta: psycopg.Connection) -> None:
        health = check_source(meta, self.config)
        if health.lag_bytes is not None:
            self.metrics.lag_bytes.set(health.lag_bytes)

    @staticmethod
    def _type_names(meta: psycopg.Connection):
        def names(oids) -> dict[int, str]:
            return dict(meta.execute("SELECT oid::int8, typname FROM pg_type WHERE oid = ANY(%s)",
                                     (sorted(oids),)).fetchall())
        return names


# the process ----------------------------------------------------------------------------------

def run(config: ReaderConfig, *, stop: threading.Event, metrics: Metrics,
        health: Health | None = None) -> int | None:
    """Sessions until stopped; returns the durable LSN (None if no session ever started).
    Raises :class:`ReaderError`, or :class:`RetriesExhausted` when no session could start for
    ``max_retry_seconds``. ``health`` hears of every transient error and every session start
    (:mod:`lakeslot.reader.health`)."""
    health = health or Health(None, settle_s=settle_seconds(config))
    attempt, last_start, durable = 0, time.monotonic(), None
    while True:
        session = Session(config, metrics, stop, health)
        try:
            return session.run()
        except TRANSIENT_IN_READER as e:
            error = e
            health.failed(e)
        except pgoutput.ProtocolError as e:
            raise ReaderError("ProtocolError", f"the replication stream could not be decoded: "
                              f"{e}", session.durable) from e
        finally:
            durable = session.durable if session.durable is not None else durable
        if session.started:
            attempt, last_start = 0, time.monotonic()
        if time.monotonic() - last_start > config.max_retry_seconds:
            raise RetriesExhausted(
                f"no replication session could start for {config.max_retry_seconds:.0f} s; "
                f"last error: {describe(error)}") from error
        delay = backoff(attempt)
        attempt += 1
        log.warning("transient error, retrying in %.1f s: %s", delay, describe(error),
                    extra={"error": type(error).__name__})
        resume_at = time.monotonic() + delay
        while not stop.is_set() and time.monotonic() < resume_at:
            metrics.beat()
            health.tick()
            stop.wait(min(1.0, resume_at - time.monotonic()))
        if stop.is_set():
            return durable
        metrics.reconnects.inc()


def settle_seconds(config: ReaderConfig) -> float:
    """How long a session must stream without an error to clear a reported problem when nothing
    was sealed: longer than a segment may stay open while WAL moves (so a write was due), and a
    health check of the source ran."""
    return config.segment_max_seconds + config.health_interval


def write_status(path: str, state: str, *, definite: bool, reason: str, message: str,
                 lsn: int | None) -> None:
    """Write the outcome atomically (temporary file + rename)."""
    write_document(path, reader_status.document(
        state, definite=definite, reason=reason, message=message,
        lsn=None if lsn is None else lsn_text.format(lsn), now=datetime.now(UTC)))


def main(config: ReaderConfig, *, status_file: str | None = None,
         metrics_port: int | None = None) -> int:
    """Run the reader as a process: signals, metrics endpoint, status file, exit code."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    metrics = Metrics()
    health = Health(status_file, settle_s=settle_seconds(config), staging_uri=config.staging_uri)
    log.info("reader starting as %r", config.app_name,
             extra={"ingestion": config.ingestion, "slot": config.slot,
                    "publication": config.publication, "staging": redact(config.staging_uri)})
    outcome: tuple[str, bool, str, str, int | None, int]
    try:
        if metrics_port is not None:
            metrics.serve(metrics_port, status=health.document)
        durable = run(config, stop=stop, metrics=metrics, health=health)
        outcome = ("stopped", False, "Stopped", "the reader stopped cleanly", durable,
                   EXIT_OK)
    except ReaderError as e:
        log.error("definite error %s: %s", e.reason, e.message, extra={"reason": e.reason})
        outcome = ("failed", True, e.reason, e.message, e.lsn, EXIT_DEFINITE)
    except RetriesExhausted as e:
        log.error("%s", e)
        outcome = ("failed", False, "RetriesExhausted", str(e), None, EXIT_FAILED)
    except Exception as e:
        log.exception("the reader crashed")
        outcome = ("failed", False, "Crashed", describe(e), None, EXIT_FAILED)
    state, definite, reason, message, lsn, code = outcome
    if status_file:
        write_status(status_file, state, definite=definite, reason=reason, message=message,
                     lsn=lsn)
    return code


def settings_from_environment(host: str | None, port: int | None, dbname: str | None,
                              user: str | None, sslmode: str | None,
                              sslrootcert: str | None,
                              options: dict[str, str] | None = None) -> ConnectionSettings:
    """Connection settings from arguments, else libpq's environment; the password only from
    ``LAKESLOT_SOURCE_PASSWORD`` (None lets libpq use ``PGPASSWORD`` or ``~/.pgpass``);
    ``options`` are further libpq parameters (``spec.source.options``)."""
    env = os.environ
    return ConnectionSettings(
        host=host or env.get("PGHOST", "localhost"), port=port or int(env.get("PGPORT", "5432")),
        dbname=dbname or env.get("PGDATABASE", "postgres"),
        user=user or env.get("PGUSER", "postgres"),
        password=env.get(PASSWORD_ENV), sslmode=sslmode or env.get("PGSSLMODE", "prefer"),
        sslrootcert=sslrootcert, extra={**(options or {}), "client_encoding": "UTF8"})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any ``extra`` fields."""

    _STANDARD = frozenset(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(),
                 "level": record.levelname.lower(), "logger": record.name,
                 "message": record.getMessage()}
        entry.update((k, v) for k, v in vars(record).items()
                     if k not in self._STANDARD and k not in ("message", "asctime"))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
