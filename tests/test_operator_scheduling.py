"""The snapshot SparkApplication's lifecycle (lakeslot_operator.snapshot_lifecycle), table-driven:
the step from the application's reported state, one snapshot at a time. Pure, no cluster:
tests/test_operator_reconcile.py runs the same decisions end to end. Which tables a snapshot
copies is tests/test_scheduling.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from lakeslot.api.models import SnapshotStatus
from lakeslot.api.naming import TableName
from lakeslot.control import scheduling
from lakeslot.control.scheduling import Plan, Request
from lakeslot_operator import snapshot_lifecycle
from lakeslot_operator.snapshot_lifecycle import Application

A = TableName("public", "a")
B = TableName("public", "b")
C = TableName("Sales", "Orders 2024")
NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
NAME = "orders-snapshot-g0-3ce44fe8"


# advance: what the SparkApplication's state means ---------------------------------------------

FIRST = scheduling.plan([A, B], {A: None, B: None}, Request())
RESNAPSHOT = scheduling.plan([A, B], {A: 1, B: 2},
                             Request(resnapshot_generation=2, observed_generation=1))
IDLE = scheduling.plan([A, B], {A: 1, B: 2}, Request())
IDLE_RESNAPSHOT = scheduling.plan([], {}, Request(resnapshot_generation=5, observed_generation=4))


def record(plan: Plan = FIRST, **fields) -> SnapshotStatus:
    """A recorded status.snapshot of ``plan``'s generation."""
    return SnapshotStatus(application=NAME, generation=plan.generation,
                          tables=[str(t) for t in plan.wanted], **fields)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


@dataclass(frozen=True)
class StepCase:
    id: str
    previous: SnapshotStatus | None
    app: Application | None
    state: str | None  # expected status.snapshot.state (None: no record)
    plan: Plan = FIRST
    submit: bool = False
    delete: bool = False
    reason: str = "Snapshotting"  # "" when SnapshotComplete is True
    attempts: int = 0
    finished_at: datetime | None = None
    observed: int | None = None
    extra: dict = field(default_factory=dict)  # further expected fields of status.snapshot


STEP_CASES = [
    StepCase("first snapshot: submitted", None, None, "SUBMITTED", submit=True),
    StepCase("submitted, not reported yet", record(state="SUBMITTED"), Application(), "SUBMITTED"),
    StepCase("running", record(state="SUBMITTED"), Application("RUNNING"), "RUNNING"),
    StepCase("completed", record(state="RUNNING"), Application("COMPLETED"), "COMPLETED",
             finished_at=NOW),
    StepCase("completed earlier keeps its finish time",
             record(state="COMPLETED", finished_at=ago(50)), Application("COMPLETED"),
             "COMPLETED", finished_at=ago(50)),
    StepCase("completed resnapshot updates the observed generation",
             record(RESNAPSHOT, state="RUNNING"), Application("COMPLETED"), "COMPLETED",
             plan=RESNAPSHOT, finished_at=NOW, observed=2),
    StepCase("running resnapshot does not observe yet", record(RESNAPSHOT, state="SUBMITTED"),
             Application("RUNNING"), "RUNNING", plan=RESNAPSHOT),
    StepCase("failed: counted once, kept during the backoff", record(state="RUNNING"),
             Application("FAILED", "driver OOM"), "FAILED", reason="SnapshotFailed", attempts=1,
             finished_at=NOW, extra={"message": "driver OOM"}),
    StepCase("failed + backoff not over: not counted again, kept",
             record(state="FAILED", attempts=1, finished_at=ago(29), message="driver OOM"),
             Application("FAILED", "driver OOM"), "FAILED", reason="SnapshotFailed", attempts=1,
             finished_at=ago(29)),
    StepCase("failed + backoff over: deleted for resubmission",
             record(state="FAILED", attempts=1, finished_at=ago(30), message="driver OOM"),
             Application("FAILED", "driver OOM"), "FAILED", delete=True, reason="SnapshotFailed",
             attempts=1, finished_at=ago(30)),
    StepCase("failed again after a retry",
             record(state="RUNNING", attempts=1, finished_at=ago(300)),
             Application("FAILED", "again"), "FAILED", reason="SnapshotFailed", attempts=2,
             finished_at=NOW, extra={"message": "again"}),
    StepCase("deleted after failing, backoff (doubled) not over: waits",
             record(state="FAILED", attempts=2, finished_at=ago(59)), None, "FAILED",
             reason="SnapshotFailed", attempts=2, finished_at=ago(59)),
    StepCase("deleted after failing, backoff over: resubmitted, attempts kept",
             record(state="FAILED", attempts=2, finished_at=ago(60)), None, "SUBMITTED",
             submit=True, attempts=2, finished_at=ago(60)),
    StepCase("backoff is capped at an hour",
             record(state="FAILED", attempts=30, finished_at=ago(3600)), None, "SUBMITTED",
             submit=True, attempts=30, finished_at=ago(3600)),
    StepCase("a vanished running application is submitted again", record(state="RUNNING"), None,
             "SUBMITTED", submit=True),
    StepCase("a record of another generation starts afresh",
             SnapshotStatus(application="orders-snapshot-g0-00000000", generation="g0-00000000",
                            tables=["public.a"], state="FAILED", attempts=3,
                            finished_at=ago(1), message="old"),
             None, "SUBMITTED", submit=True, extra={"message": "", "application": NAME}),
    StepCase("all tables done: an unfinished record is dropped", record(state="RUNNING"), None,
             None, plan=IDLE, reason=""),
    StepCase("all tables done: the completed record stays", record(state="COMPLETED"), None,
             "COMPLETED", plan=IDLE, reason=""),
    StepCase("resnapshot with nothing to copy is observed", None, None, None,
             plan=IDLE_RESNAPSHOT, reason="", observed=5),
]


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda case: case.id)
def test_advance(case):
    before = case.previous.model_copy(deep=True) if case.previous else None
    name = None if case.plan.idle else NAME
    step = snapshot_lifecycle.advance(case.previous, case.plan, name, case.app, NOW)

    assert (step.submit, step.delete) == (case.submit, case.delete)
    assert step.observed_generation == case.observed
    assert step.complete == (case.reason == "")
    assert step.reason == case.reason
    assert step.snapshotting == frozenset(case.plan.wanted)
    if case.state is None:
        assert step.snapshot is None
    else:
        assert step.snapshot is not None
        assert step.snapshot.state == case.state
        assert step.snapshot.attempts == case.attempts
        assert step.snapshot.finished_at == case.finished_at
        assert step.snapshot.generation == (case.previous.generation if case.previous and case.plan.idle
                                            else case.plan.generation)
        for key, value in case.extra.items():
            assert getattr(step.snapshot, key) == value, key
    assert case.previous == before, "the recorded status must not be changed in place"


@pytest.mark.parametrize(("previous", "app", "message"), [
    (None, None, f"{NAME}: SUBMITTED for 2 table(s)"),
    (record(state="SUBMITTED"), Application("RUNNING"), f"{NAME}: RUNNING for 2 table(s)"),
    (record(state="RUNNING"), Application("FAILED", "driver OOM"),
     f"{NAME} failed (attempt 1): driver OOM"),
], ids=["submitted", "running", "failed"])
def test_the_condition_message(previous, app, message):
    assert snapshot_lifecycle.advance(previous, FIRST, NAME, app, NOW).message == message


def test_a_long_error_is_cut():
    step = snapshot_lifecycle.advance(record(state="RUNNING"), FIRST, NAME,
                                      Application("FAILED", "x" * 10_000), NOW)
    assert step.snapshot is not None
    assert step.snapshot.message == "x" * snapshot_lifecycle.MESSAGE_MAX


def test_a_new_record_lists_the_wanted_tables():
    step = snapshot_lifecycle.advance(None, FIRST, NAME, None, NOW)
    assert step.snapshot is not None
    assert step.snapshot.tables == ["public.a", "public.b"]
    assert step.snapshot.application == NAME and step.snapshot.generation == FIRST.generation


@pytest.mark.parametrize(("app", "expected"), [
    ({}, Application(None, "")),
    ({"status": {}}, Application(None, "")),
    ({"status": {"applicationState": {"state": "RUNNING"}}}, Application("RUNNING", "")),
    ({"status": {"applicationState": {"state": "FAILED", "errorMessage": "OOM"}}},
     Application("FAILED", "OOM")),
], ids=["no-status", "empty-status", "running", "failed"])
def test_the_reported_state(app, expected):
    assert Application.of(app) == expected


# hold: one snapshot at a time -------------------------------------------------------------------

def _running(state: str | None, tables=(A,), generation: str = "g0-aaaaaaaa") -> SnapshotStatus:
    return SnapshotStatus(application=f"orders-snapshot-{generation}", generation=generation,
                          tables=[str(t) for t in tables], state=state)


@pytest.mark.parametrize(("previous", "held"), [
    (None, False),
    (_running("SUBMITTED"), True),
    (_running("RUNNING"), True),
    (_running(None), False),  # never submitted: nothing runs
    (_running("COMPLETED"), False),
    (_running("FAILED"), False),  # its retry is the new plan's business
    (_running("RUNNING", generation="g0-bbbbbbbb"), False),  # the plan's own generation
])
def test_a_new_wish_waits_for_the_snapshot_in_flight(previous, held):
    plan = Plan(wanted=(A, C), generation="g0-bbbbbbbb", min_snapshot_lsn=7, clear_below=True,
                resnapshot=1)
    waiting = snapshot_lifecycle.hold(previous, plan, [A, B, C])
    if not held:
        assert waiting is None
        return
    assert waiting == Plan(wanted=(A,), generation="g0-aaaaaaaa", min_snapshot_lsn=7,
                           clear_below=True, resnapshot=None)  # serves no request
    assert snapshot_lifecycle.hold(previous, Plan((), None, 0, False, None), [A]) is None  # idle: none
