"""The snapshot SparkApplication's lifecycle, pure: plain values in, a step out, no Kubernetes call.

What to copy is :func:`lakeslot.control.scheduling.plan`'s decision (shared with local mode); here
is what the operator makes of it with a SparkApplication: :func:`hold` keeps one snapshot at a time,
and :func:`advance` turns the application's reported state into the new ``status.snapshot``, the
``SnapshotComplete`` condition and what to do with the application. ``reconcile`` executes the
step (reads, creates and deletes the SparkApplication, writes conditions and events).

Invariants:

- ``observedResnapshotGeneration`` moves to the requested generation only when nothing is left to
  copy or the re-snapshot's application COMPLETED.
- ``status.snapshot`` belongs to one generation: a new generation starts a fresh record
  (``attempts`` 0); with nothing to copy only a COMPLETED record is kept.
- One snapshot at a time: while the recorded one runs (SUBMITTED or RUNNING), a new wish waits
  for it (:func:`hold`) and is planned when it has finished.
- An absent application is submitted (state SUBMITTED) unless its last attempt FAILED and the
  backoff is not over. A FAILED application is kept (its record says why) until the backoff is
  over — :func:`lakeslot.control.scheduling.backoff_over`: 30 s, doubled per failed attempt, at
  most an hour, counted from ``finishedAt`` — and then deleted, so the next reconcile submits it
  again.

Failure modes: none of its own (no I/O). A SparkApplication whose ``status`` is null, or whose
``errorMessage`` is null on failure, raises (TypeError/AttributeError) and kopf retries the
reconcile.
"""


from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from lakeslot.api.models import SnapshotStatus
from lakeslot.api.naming import TableName
from lakeslot.control.scheduling import Plan, backoff_over

TERMINAL_SPARK_STATES = ("COMPLETED", "FAILED")
MESSAGE_MAX = 4000


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
