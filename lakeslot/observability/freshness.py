"""Freshness: how many seconds each mirror table is behind its source.

A mirror table at position ``L`` (its ``lakeslot.lsn``) holds every source transaction committed
at or below ``L`` (DESIGN.md invariant 1). It therefore reflects the source as of just before the
*first transaction above* ``L``; so its freshness is ``now − commit time of the first source
transaction not yet applied to it``, and 0 when none is pending. The commit times come from
staging: the reader writes each transaction's commit row (``op = 'C'``) with the commit timestamp
of its pgoutput Begin/Commit message (:mod:`lakeslot.staging.segments`), so nothing else has to
carry them.

Why the first *pending* transaction and not the last *applied* one (the issue's wording): in a
steady stream they differ by one commit interval, but after an idle hour the last applied
commit is an hour old while the table is current up to the first change after it; measuring
from the pending one never reports an idle gap as lag, and is 0 exactly when nothing is waiting.

Invariants and limits:

- Only what is sealed in staging counts as pending: changes the reader has not received yet
  (reader stopped or behind) do not raise freshness — they show as the slot's confirmed-flush
  lag and retained WAL (the operator's metrics and alerts), not here.
- A transaction counts as pending for every table whose position is below its commit LSN, even
  if it did not touch that table: all tables of an ingestion move together (one batch end),
  and reading which tables each transaction touched would cost a pass over the change rows.
- Reading is bounded: segments are read from the lowest position forward (three small columns
  of each row group) and the scan stops once every table has found its first pending commit
  (usually in the first segment read).
- The clock is the reader of this module's (``now``); commit times are the source server's. A
  skew between the two shifts the value; it is clamped at 0.

Failure modes: an unreachable staging raises ``OSError`` (the operator then leaves freshness
out of the status, it does not fail the reconcile).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from datetime import datetime
from typing import TypeVar

import pyarrow.compute as pc

from lakeslot import lsn_text
from lakeslot.api.models import PostgresIngestionStatus
from lakeslot.staging.store import Staging

K = TypeVar("K", bound=Hashable)
_COLUMNS = ["commit_lsn", "op", "commit_time"]


def first_pending(staging: Staging, positions: Mapping[K, int]) -> dict[K, datetime | None]:
    """For each key's position, the commit time of the first staged transaction above it
    (None: nothing staged above it)."""
    found: dict[K, datetime | None] = dict.fromkeys(positions)
    if not positions:
        return found
    waiting = dict(positions)
    lowest = min(waiting.values())
    for name in staging.list():
        if name.end <= lowest + 1:  # every commit in it is at or below the lowest position
            continue
        _, groups = staging.row_groups(name)
        for group in range(groups):
            rows = staging.read_row_group(name, group, _COLUMNS)
            commits = rows.filter(pc.equal(rows["op"], "C"))
            for lsn, time in zip(commits["commit_lsn"].to_pylist(),
                                 commits["commit_time"].to_pylist(), strict=True):
                for key in [k for k, position in waiting.items() if lsn > position]:
                    found[key] = time
                    del waiting[key]
                if not waiting:
                    return found
    return found


def seconds_behind(pending: datetime | None, now: datetime) -> int:
    """Whole seconds since the first pending commit (0: nothing pending; never negative)."""
    if pending is None:
        return 0
    return max(int((now - pending).total_seconds()), 0)


def record(status: PostgresIngestionStatus, staging: Staging, now: datetime) -> None:
    """``lagSeconds`` of each streaming table and the largest in ``status.apply``; other
    tables have none. Staging that cannot be read leaves every value out (never an error)."""
    streaming = [(r, lsn_text.parse(r.applied_lsn)) for r in status.tables
                 if r.state == "Streaming" and r.applied_lsn is not None]
    for row in status.tables:  # (assigned only when set: an unset field stays out of the document)
        if row.lag_seconds is not None:
            row.lag_seconds = None
    if status.apply is not None and status.apply.lag_seconds is not None:
        status.apply.lag_seconds = None
    try:
        pending = first_pending(staging, {i: position for i, (_, position) in enumerate(streaming)})
    except OSError:
        return
    behind = [seconds_behind(pending[i], now) for i in range(len(streaming))]
    for (row, _), seconds in zip(streaming, behind, strict=True):
        row.lag_seconds = seconds
    if status.apply is not None and behind:
        status.apply.lag_seconds = max(behind)
