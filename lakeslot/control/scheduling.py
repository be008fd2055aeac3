"""Which tables a snapshot copies, from which LSN, and when a failed copy is tried again — one
decision for the operator and ``lakeslot run`` (pure: plain values in, a decision out, no I/O).

:func:`plan` decides which tables need a snapshot and under which generation; :func:`backoff_s`
says how long a copy that failed waits before it is tried again. The operator's reconcile takes
both for its snapshot SparkApplication (:mod:`lakeslot_operator.snapshot_lifecycle` follows the
application's reported state); local mode takes them for the tables it copies, online, while it
streams (:mod:`lakeslot.local.schedule`).

Invariants:

- A table is wanted when its mirror has no ``lakeslot.lsn`` yet (never snapshotted) or one below
  ``status.resnapshotBelowLsn`` (cut off: the slot was lost and recreated there, so the mirror
  misses changes); every table is wanted while ``spec.snapshot.resnapshotGeneration`` is above
  ``status.observedResnapshotGeneration``; and a table :mod:`lakeslot.control.resnapshot` wants
  copied again alone (``again``: the user's per-table request, or the apply job's automatic
  re-snapshot), with the job's ``min_snapshot_lsn`` raised to the LSN its new snapshot must reach.
  ``snapshot.mode: never`` wants no table of its own accord; a re-snapshot request or a cut-off
  still copies. Only the given tables are ever wanted (an ``again`` table outside them is not).
- The generation ``g<resnapshotGeneration>-<digest>`` (the digest covers the wanted tables and
  the cut-off LSN) names the operator's SparkApplication: the same wish gives the same name, so a
  retried reconcile finds the job it submitted; a different wish gives a new name, so a
  re-snapshot never reuses a finished job. The table order does not change the plan.
- ``resnapshotBelowLsn`` is cleared once no mirror is below it (:attr:`Plan.clear_below`).
- A failed copy is tried again after 30 s, doubled per failure in a row, at most an hour
  (:func:`backoff_s`); the operator counts the attempts of its application, local mode the
  failures of each table.

Failure modes: none (no I/O).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from lakeslot import lsn_text
from lakeslot.api.models import PostgresIngestionStatus, SnapshotSpec, SnapshotStatus
from lakeslot.api.naming import TableName

SNAPSHOT_BACKOFF_S = 30
SNAPSHOT_BACKOFF_MAX_S = 3600


@dataclass(frozen=True)
class Request:
    """What the spec and the recorded status ask for."""

    mode: str = "initial"  # spec.snapshot.mode: initial | never
    resnapshot_generation: int = 0  # spec.snapshot.resnapshotGeneration
    observed_generation: int = 0  # status.observedResnapshotGeneration (absent: 0)
    below_lsn: int = 0  # status.resnapshotBelowLsn (absent: 0, no cut-off)

    @classmethod
    def of(cls, spec: SnapshotSpec, status: PostgresIngestionStatus) -> Request:
        below = status.resnapshot_below_lsn
        return cls(spec.mode, spec.resnapshot_generation,
                   status.observed_resnapshot_generation or 0,
                   lsn_text.parse(below) if below else 0)


@dataclass(frozen=True)
class Plan:
    """Which tables to copy, and under which generation."""

    wanted: tuple[TableName, ...]  # sorted; empty when nothing is to be copied
    generation: str | None  # the snapshot generation; None: nothing to copy
    min_snapshot_lsn: int  # the job's cut-off (resnapshotBelowLsn; 0: none)
    clear_below: bool  # no mirror is below resnapshotBelowLsn (any more): clear it
    resnapshot: int | None  # the requested resnapshotGeneration this plan serves; None: no request

    @property
    def idle(self) -> bool:
        return self.generation is None


def generation_of(resnapshot_generation: int, wanted: Sequence[TableName], below_lsn: int) -> str:
    """``g<resnapshotGeneration>-<8 hex digits>``: a digest of the wanted tables and the cut-off."""
    text = "\0".join([*map(str, wanted), str(below_lsn)])
    return f"g{resnapshot_generation}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def plan(tables: Sequence[TableName], applied: Mapping[TableName, int | None],
         request: Request, again: Mapping[TableName, int] | None = None) -> Plan:
    """The tables to copy given each mirror's ``lakeslot.lsn`` (``applied``; None: no snapshot
    yet) and the ``request`` (see the module docstring); ``again``: tables to copy again alone
    (:func:`lakeslot.control.resnapshot.decide`), each with the LSN its new snapshot must reach."""
    resnapshot = request.resnapshot_generation > request.observed_generation
    below = request.below_lsn
    cut_off = [t for t in tables if (lsn := applied[t]) is not None and lsn < below]
    again = {t: lsn for t, lsn in (again or {}).items() if t in tables}
    wanted = tuple(sorted(tables if resnapshot else
                          {t for t in tables if applied[t] is None or t in cut_off} | set(again)))
    idle = not wanted or (request.mode == "never" and not resnapshot and not cut_off and not again)
    min_snapshot_lsn = max([below, *again.values()])
    return Plan(
        wanted=() if idle else wanted,
        generation=None if idle else generation_of(request.resnapshot_generation, wanted,
                                                   min_snapshot_lsn),
        min_snapshot_lsn=min_snapshot_lsn,
        clear_below=bool(below) and not cut_off,
        resnapshot=request.resnapshot_generation if resnapshot else None)


def backoff_s(failures: int) -> int:
    """Seconds a copy that failed ``failures`` times in a row waits before it is tried again:
    30, doubled per failure, at most an hour."""
    return min(SNAPSHOT_BACKOFF_S * 2 ** max(failures - 1, 0), SNAPSHOT_BACKOFF_MAX_S)


def backoff_over(state: SnapshotStatus, now: datetime) -> bool:
    """Whether a failed snapshot may be submitted again (True when it never finished)."""
    return state.finished_at is None or now >= state.finished_at + timedelta(
        seconds=backoff_s(state.attempts))
