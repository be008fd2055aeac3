"""The snapshot-scheduling decision, pure: plain values in, a decision out, no Kubernetes call.

:func:`plan` decides which tables need a snapshot and under which generation; :func:`advance`
turns the snapshot SparkApplication's reported state into the new ``status.snapshot``, the
``SnapshotComplete`` condition and what to do with the application. ``reconcile`` executes the
decision (reads, creates and deletes the SparkApplication, writes conditions and events).

Invariants:

- A table is wanted when its mirror has no ``lakeslot.lsn`` yet (never snapshotted) or one below
  ``status.resnapshotBelowLsn`` (cut off: the slot was lost and recreated there, so the mirror
  misses changes); every table is wanted while ``spec.snapshot.resnapshotGeneration`` is above
  ``status.observedResnapshotGeneration``; and a table :mod:`lakeslot.control.resnapshot` wants copied
  again alone (``again``: the user's per-table request, or the apply job's automatic
  re-snapshot), with the job's ``min_snapshot_lsn`` raised to the LSN its new snapshot must reach.
  ``snapshot.mode: never`` wants no table of its own accord; a re-snapshot request or a cut-off
  still copies.
- The generation ``g<resnapshotGeneration>-<digest>`` (the digest covers the wanted tables and
  the cut-off LSN) names the SparkApplication: the same wish gives the same name, so a retried
  reconcile finds the job it submitted; a different wish gives a new name, so a re-snapshot
  never reuses a finished job.
- ``resnapshotBelowLsn`` is cleared once no mirror is below it. ``observedResnapshotGeneration``
  moves to the requested generation only when nothing is left to copy or the re-snapshot's
  application COMPLETED.
- ``status.snapshot`` belongs to one generation: a new generation starts a fresh record
  (``attempts`` 0); with nothing to copy only a COMPLETED record is kept.
- One snapshot at a time: while the recorded one runs (SUBMITTED or RUNNING), a new wish waits
  for it (:func:`hold`) and is planned when it has finished.
- An absent application is submitted (state SUBMITTED) unless its last attempt FAILED and the
  backoff is not over. A FAILED application is kept (its record says why) until the backoff is
  over — 30 s, doubled per failed attempt, at most an hour, counted from ``finishedAt`` — and
  then deleted, so the next reconcile submits it again.

Failure modes: none of its own (no I/O). A SparkApplication whose ``status`` is null, or whose
``errorMessage`` is null on failure, raises (TypeError/AttributeError) and kopf retries the
reconcile.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from lakeslot import lsn as lsnlib
from lakeslot.api.models import PostgresIngestionStatus, SnapshotSpec, SnapshotStatus
from lakeslot.api.naming import TableName

TERMINAL_SPARK_STATES = ("COMPLETED", "FAILED")
SNAPSHOT_BACKOFF_S = 30
SNAPSHOT_BACKOFF_MAX_S = 3600
MESSAGE_MAX = 4000


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
                   lsnlib.parse(below) if below else 0)


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


@dataclass(frozen=True)
class Application:
    """The snapshot SparkApplication as the spark-operator reports it."""

    state: str | None = None  # status.applicationState.state; None: not reported yet
    error_message: str = ""  # status.applicationState.errorMessage

    @classmethod
    def of(cls, app: Mapping) -> Application:
        reported = app.get("status", {}).get("applicationState", {})
        return cls(reported.get("state"), reported.get("errorMessage", ""))


@dataclass(frozen=True)
class Step:
    """What to write and what to do with the SparkApplication."""

    snapshot: SnapshotStatus | None  # the new status.snapshot
    complete: bool  # SnapshotComplete is True (nothing to copy); else False with reason/message
    reason: str = ""
    message: str = ""
    submit: bool = False  # create the SparkApplication (event SnapshotStarted)
    delete: bool = False  # delete the FAILED SparkApplication: backoff over, resubmitted next time
    observed_generation: int | None = None  # new status.observedResnapshotGeneration; None: keep
    snapshotting: frozenset[TableName] = frozenset()  # the tables being copied


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


def hold(previous: SnapshotStatus | None, plan: Plan, tables: Sequence[TableName]) -> Plan | None:
    """While the recorded snapshot of another generation is still in flight, the plan waits for
    it: the plan that follows that snapshot to its end (its tables being copied, no request
    served by it), or None when there is nothing to wait for. Without it, a table that appears
    while a snapshot runs (e.g. created in a selected schema) would start a second snapshot of
    every table not yet committed, next to the first. Whether the application still exists is
    for the caller to check (an absent one is not waited for)."""
    if (previous is None or plan.generation is None or previous.generation is None
            or previous.generation == plan.generation
            or previous.state is None or previous.state in TERMINAL_SPARK_STATES):
        return None
    copying = set(previous.tables)
    return Plan(wanted=tuple(t for t in tables if str(t) in copying),
                generation=previous.generation, min_snapshot_lsn=plan.min_snapshot_lsn,
                clear_below=plan.clear_below, resnapshot=None)


def backoff_over(state: SnapshotStatus, now: datetime) -> bool:
    """Whether a failed snapshot may be submitted again (True when it never finished)."""
    delay = min(SNAPSHOT_BACKOFF_S * 2 ** max(state.attempts - 1, 0), SNAPSHOT_BACKOFF_MAX_S)
    return state.finished_at is None or now >= state.finished_at + timedelta(seconds=delay)


def advance(previous: SnapshotStatus | None, plan: Plan, application: str | None,
            app: Application | None, now: datetime) -> Step:
    """The step from ``previous`` (the recorded ``status.snapshot``) given the ``plan``, the
    SparkApplication's name (``application``, None when the plan is idle) and its reported state
    (``app``; None: it does not exist). ``previous`` is not changed."""
    if plan.idle:
        kept = previous if previous is None or previous.state == "COMPLETED" else None
        return Step(kept, complete=True, observed_generation=plan.resnapshot)
    if previous is not None and previous.generation == plan.generation:
        state = previous.model_copy(deep=True)
    else:
        state = SnapshotStatus(application=application, generation=plan.generation,
                               tables=[str(t) for t in plan.wanted])
    submit = delete = False
    observed = None
    if app is None:
        if state.state != "FAILED" or backoff_over(state, now):
            state.state, submit = "SUBMITTED", True
    else:
        new_state = app.state or "SUBMITTED"
        if new_state in TERMINAL_SPARK_STATES and state.state != new_state:
            state.finished_at = now
            if new_state == "FAILED":
                state.attempts += 1
                state.message = app.error_message[:MESSAGE_MAX]
        state.state = new_state
        delete = new_state == "FAILED" and backoff_over(state, now)
        if new_state == "COMPLETED":
            observed = plan.resnapshot
    if state.state == "FAILED":
        reason = "SnapshotFailed"
        message = f"{application} failed (attempt {state.attempts}): {state.message}"
    else:
        reason = "Snapshotting"
        message = f"{application}: {state.state} for {len(plan.wanted)} table(s)"
    return Step(state, complete=False, reason=reason, message=message, submit=submit,
                delete=delete, observed_generation=observed, snapshotting=frozenset(plan.wanted))
