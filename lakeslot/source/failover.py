"""Failover: does the slot survive a promotion of a standby, and was it lost by one?

A logical slot lives in one server. Before PostgreSQL 17 a promoted standby has none of its
primary's logical slots. From 17 on, a slot created with ``failover`` (``source.failoverSlot``)
is copied to standbys that run with ``sync_replication_slots = on`` (and ``hot_standby_feedback``,
``primary_slot_name``, ``dbname`` in ``primary_conninfo``); the primary's
``synchronized_standby_slots`` makes its logical walsenders wait until those standbys have
flushed the WAL they send, so nothing the reader staged is missing from a promoted standby
(:func:`lakeslot.reader.reader.check_resume` verifies that against the timeline history).

Invariants:

- :func:`safety` only reads the primary's catalog and settings: what the primary can know. It
  says *safe* only for a failover slot on 17+ with at least one physical slot listed in
  ``synchronized_standby_slots`` and every listed one present and streaming. Whether a given
  standby has synchronized the slot is visible on that standby only
  (``pg_replication_slots.synced AND NOT temporary``): the message says so.
- :func:`lost_by_failover` calls a missing slot lost only on evidence: staging's last segment was
  read on another timeline than the one the server writes now. A slot missing
  without that evidence is not called lost here (a first start creates it).

Failure modes: a server in recovery has no current timeline to compare (``None``: no evidence);
staging that cannot be read raises ``OSError`` to the caller, which decides (the operator may
lack staging credentials).
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from lakeslot import lsn_text
from lakeslot.source.connection import one_row
from lakeslot.staging.store import Staging

FAILOVER_SLOTS_VERSION = 170000


@dataclass(frozen=True)
class Safety:
    safe: bool
    message: str


def safety(conn: psycopg.Connection, name: str, *, failover: bool,
           on_slot_lost: str) -> Safety:
    """Whether slot ``name`` (created with ``failover`` as the spec asks) survives a failover,
    and if not what happens then (``on_slot_lost``: the ingestion's ``policies.onSlotLost``)."""
    version = conn.info.server_version
    then = (f"a failover to a standby loses slot {name}: the reader then stops with SlotLost, "
            + ("and the next start creates a new slot and copies every table again "
               "(policies.onSlotLost: Resnapshot)" if on_slot_lost == "Resnapshot" else
               "and lakeslot stays stopped until policies.onSlotLost is set to Resnapshot "
               "(a new slot and a copy of every table)"))
    if version < FAILOVER_SLOTS_VERSION:
        return Safety(False, f"PostgreSQL {version // 10000} keeps logical slots on the primary "
                      f"only: {then}; PostgreSQL 17+ failover slots (source.failoverSlot) avoid it")
    if not failover:
        return Safety(False, f"slot {name} is not a failover slot: {then}; set "
                      "source.failoverSlot: true to have standbys synchronize it")
    listed = one_row(conn.execute(
        "SELECT current_setting('synchronized_standby_slots', true)"))[0] or ""
    names = [n.strip().strip('"') for n in listed.split(",") if n.strip()]
    if not names:
        return Safety(False, f"slot {name} is a failover slot, but synchronized_standby_slots is "
                      "empty: the reader may receive changes a standby does not have yet, which a "
                      "failover to it would lose; set synchronized_standby_slots to the standbys' "
                      "physical slots")
    streaming = {r[0] for r in conn.execute(
        "SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'physical' AND active"
        " AND slot_name = ANY(%s)", (names,))}
    idle = [n for n in names if n not in streaming]
    if idle:
        return Safety(False, f"slot {name} is a failover slot, but standby slot(s) "
                      f"{', '.join(idle)} of synchronized_standby_slots are not streaming: the "
                      "reader waits for them, and a standby that is behind may lack the slot")
    return Safety(True, f"slot {name} is a failover slot and standby slot(s) {', '.join(names)} "
                  "(synchronized_standby_slots) are streaming: a standby with "
                  "sync_replication_slots = on carries it through a failover once it shows it "
                  "synced and not temporary in its pg_replication_slots")


def current_timeline(conn: psycopg.Connection) -> int | None:
    """The timeline the server writes WAL on (the first 8 hex digits of the current WAL file's
    name); None while it is in recovery."""
    name = one_row(conn.execute(
        "SELECT CASE WHEN NOT pg_is_in_recovery() THEN pg_walfile_name(pg_current_wal_lsn()) END"
    ))[0]
    return None if name is None else int(name[:8], 16)


def lost_by_failover(conn: psycopg.Connection, name: str, staging: Staging) -> str | None:
    """Why the missing slot ``name`` was lost by a failover (see the module docstring), or None
    without that evidence. Raises ``OSError`` when staging cannot be read."""
    last = staging.resume_point()
    timeline = current_timeline(conn)
    if last is None or timeline is None:
        return None
    staged = staging.metadata(last).source.timeline
    if staged == timeline:
        return None
    return (f"slot {name} does not exist on this server, which writes timeline {timeline} while "
            f"staging was read on timeline {staged}: a failover (or point-in-time recovery) lost "
            "the slot — PostgreSQL before 17 keeps logical slots on the primary only, and from 17 "
            "on a standby keeps only failover slots it synchronized (source.failoverSlot, "
            f"sync_replication_slots). The changes after {lsn_text.format(last.end)} are lost")
