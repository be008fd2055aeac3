"""The permanent logical replication slot: ensure, health, loss, stale holders, drop.

The slot is the ingestion's bookmark in the WAL: PostgreSQL keeps every WAL byte after its
``restart_lsn`` and tells the reader to resume after its ``confirmed_flush_lsn``. It is created
before any snapshot (DESIGN.md rule 2), so its start LSN is at or below every snapshot LSN.

Invariants:

- :func:`ensure` is idempotent and safe under concurrent callers: exactly one creates the slot,
  the others find it. An existing slot with another plugin, database or type is an error,
  never reused.
- :func:`evict_stale_holders` never terminates the legitimate holder: the comparison with the
  legitimate ``application_name`` and the ``pg_terminate_backend`` happen in one statement on
  the same snapshot of ``pg_stat_activity``.
- :func:`drop` terminates whoever holds the slot first and retries while the terminated
  backend lets go; dropping an absent slot is a no-op.

Failure modes:

- Creating a slot waits until every transaction running at that moment has finished: a
  long-running transaction delays it (the session must have no statement/lock timeouts).
- A *lost* slot (``wal_status = lost``: its WAL was removed, e.g. by ``max_slot_wal_keep_size``;
  or invalidated by a conflict or ``idle_replication_slot_timeout``) can never be read again.
  :func:`lost_reason` says why; the ingestion's ``onSlotLost`` policy decides between a
  definite error and a recreate + re-snapshot (:func:`recreate`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg
from psycopg import errors

from lakeslot.source.connection import one_row

PLUGIN = "pgoutput"
DROP_TIMEOUT_S = 30.0


class SlotError(RuntimeError):
    """The slot cannot be used as it is; the message says why and what to do."""


@dataclass(frozen=True)
class EnsuredSlot:
    name: str
    created: bool
    creation_lsn: int | None  # the consistent point, known when this call created it


@dataclass(frozen=True)
class SlotHealth:
    name: str
    plugin: str
    slot_type: str
    database: str | None
    active: bool
    active_pid: int | None
    holder: str | None  # application_name of the backend holding the slot
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    wal_status: str | None
    safe_wal_size: int | None
    retained_bytes: int | None  # WAL kept for this slot: current LSN − restart_lsn
    lag_bytes: int | None  # current LSN − confirmed_flush_lsn
    conflicting: bool
    invalidation_reason: str | None
    failover: bool


@dataclass(frozen=True)
class Eviction:
    pid: int
    application_name: str | None
    terminated: bool


def health(conn: psycopg.Connection, name: str) -> SlotHealth | None:
    """Everything PostgreSQL knows about the slot, or None when it does not exist. Columns
    that only newer servers have (conflicting, invalidation_reason, failover) read as absent."""
    row = conn.execute(
        """WITH cur AS (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                                    ELSE pg_current_wal_lsn() END AS lsn)
           SELECT s.slot_name, s.plugin, s.slot_type, s.database, s.active, s.active_pid,
                  a.application_name,
                  (s.confirmed_flush_lsn - '0/0')::int8, (s.restart_lsn - '0/0')::int8,
                  s.wal_status, s.safe_wal_size,
                  (cur.lsn - s.restart_lsn)::int8, (cur.lsn - s.confirmed_flush_lsn)::int8,
                  coalesce((to_jsonb(s) ->> 'conflicting')::bool, false),
                  to_jsonb(s) ->> 'invalidation_reason',
                  coalesce((to_jsonb(s) ->> 'failover')::bool, false)
             FROM pg_replication_slots s CROSS JOIN cur
             LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
            WHERE s.slot_name = %s""", (name,)).fetchone()
    return SlotHealth(*row) if row else None


def ensure(conn: psycopg.Connection, name: str, *, failover: bool = False) -> EnsuredSlot:
    """Create the slot (pgoutput, in the connected database) unless it exists; verify it."""
    if failover and conn.info.server_version < 170000:
        raise SlotError("failover slots need PostgreSQL 17 or newer; set failover: false")
    created, creation_lsn = False, None
    if health(conn, name) is None:
        args = "%s, %s, false, false" + (", true" if failover else "")
        try:
            creation_lsn = one_row(conn.execute(
                f"SELECT (lsn - '0/0')::int8 FROM pg_create_logical_replication_slot({args})",
                (name, PLUGIN)))[0]
            created = True
        except errors.DuplicateObject:
            pass  # a concurrent caller created it first
    _verify(conn, health(conn, name), failover)
    return EnsuredSlot(name, created, creation_lsn)


def _verify(conn: psycopg.Connection, slot: SlotHealth | None, failover: bool) -> None:
    if slot is None:
        raise SlotError("the slot vanished right after it was ensured (dropped concurrently?)")
    database = conn.info.dbname
    if slot.slot_type != "logical" or slot.plugin != PLUGIN or slot.database != database:
        raise SlotError(
            f"slot {slot.name} exists but is a {slot.slot_type} slot for plugin {slot.plugin!r} "
            f"in database {slot.database!r}; lakeslot needs a logical {PLUGIN} slot in "
            f"{database!r}: choose another slot name, or drop that slot if it is unused")
    if failover and not slot.failover:
        raise SlotError(f"slot {slot.name} exists without failover; drop and recreate it, or set "
                        "failover: false")


def lost_reason(slot: SlotHealth) -> str | None:
    """Why the slot can never be read again, or None while it is usable."""
    if slot.invalidation_reason:
        return f"slot {slot.name} was invalidated by PostgreSQL: {slot.invalidation_reason}"
    if slot.wal_status == "lost":
        return (f"slot {slot.name} lost WAL it needed (wal_status = lost): PostgreSQL removed "
                "it, usually because max_slot_wal_keep_size was exceeded while the reader lagged")
    if slot.conflicting:
        return f"slot {slot.name} was invalidated by a recovery conflict"
    return None


def evict_stale_holders(conn: psycopg.Connection, name: str,
                        legitimate: str | None) -> list[Eviction]:
    """Terminate every backend holding the slot whose application_name is not ``legitimate``
    (None = no legitimate holder exists, e.g. no reader is running)."""
    rows = conn.execute(
        """SELECT a.pid, a.application_name, pg_terminate_backend(a.pid)
             FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
            WHERE s.slot_name = %s AND a.application_name IS DISTINCT FROM %s""",
        (name, legitimate)).fetchall()
    return [Eviction(*row) for row in rows]


def drop(conn: psycopg.Connection, name: str) -> str:
    """Drop the slot, terminating its holder first. Returns "dropped" or "absent"."""
    deadline = time.monotonic() + DROP_TIMEOUT_S
    while True:
        evict_stale_holders(conn, name, None)
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
            return "dropped"
        except errors.UndefinedObject:
            return "absent"
        except errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise SlotError(f"slot {name} stayed in use for {DROP_TIMEOUT_S:.0f} s although "
                                "its holder was terminated") from None
            time.sleep(0.1)


def recreate(conn: psycopg.Connection, name: str, *, failover: bool = False) -> EnsuredSlot:
    """The way out of a lost slot: drop it and create it anew. Everything before the new slot's
    creation LSN must then come from a re-snapshot."""
    drop(conn, name)
    return ensure(conn, name, failover=failover)
