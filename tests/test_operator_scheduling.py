"""The snapshot-scheduling decision (lakeslot_operator.scheduling), table-driven: which tables a
snapshot copies, its generation, and the step from the SparkApplication's reported state. Pure,
no cluster: tests/test_operator_reconcile.py runs the same decisions end to end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from lakeslot.api.models import PostgresIngestionStatus, SnapshotSpec, SnapshotStatus
from lakeslot.api.naming import TableName
from lakeslot_operator import scheduling
from lakeslot_operator.scheduling import Application, Plan, Request

A = TableName("public", "a")
B = TableName("public", "b")
C = TableName("Sales", "Orders 2024")
NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
NAME = "orders-snapshot-g0-3ce44fe8"


# plan: which tables, which generation ---------------------------------------------------------

@dataclass(frozen=True)
class PlanCase:
    id: str
    applied: dict[TableName, int | None]
    request: Request
    wanted: tuple[TableName, ...]
    clear_below: bool = False
    resnapshot: int | None = None
    again: dict[TableName, int] = field(default_factory=dict)
    min_snapshot_lsn: int | None = None  # None: the request's below_lsn


PLAN_CASES = [
    PlanCase("first snapshot: no mirror has lakeslot.lsn", {B: None, A: None}, Request(),
             wanted=(A, B)),
    PlanCase("all tables done", {A: 100, B: 200}, Request(), wanted=()),
    PlanCase("a table added later is copied alone", {A: 100, B: None}, Request(), wanted=(B,)),
    PlanCase("resnapshot requested: every table", {A: 100, B: 200},
             Request(resnapshot_generation=2, observed_generation=1), wanted=(A, B),
             resnapshot=2),
    PlanCase("resnapshot already observed", {A: 100, B: 200},
             Request(resnapshot_generation=2, observed_generation=2), wanted=()),
    PlanCase("cut off by resnapshotBelowLsn", {A: 100, B: 200}, Request(below_lsn=150),
             wanted=(A,)),
    PlanCase("a mirror exactly at the cut-off is not below it", {A: 150, B: 200},
             Request(below_lsn=150), wanted=(), clear_below=True),
    PlanCase("cut-off reached by every mirror: cleared", {A: 160, B: 200},
             Request(below_lsn=150), wanted=(), clear_below=True),
    PlanCase("a table without snapshot is not cut off: the cut-off is cleared", {A: None, B: 200},
             Request(below_lsn=150), wanted=(A,), clear_below=True),
    PlanCase("mode never copies nothing of its own accord", {A: None, B: None},
             Request(mode="never"), wanted=()),
    PlanCase("mode never still honours a resnapshot request", {A: None, B: 200},
             Request(mode="never", resnapshot_generation=1), wanted=(A, B), resnapshot=1),
    PlanCase("mode never still honours a cut-off (and copies the unsnapshotted too)",
             {A: 100, B: None}, Request(mode="never", below_lsn=150), wanted=(A, B)),
    PlanCase("resnapshot of no table is observed at once", {},
             Request(resnapshot_generation=3, observed_generation=1), wanted=(), resnapshot=3),
    PlanCase("one table copied again alone, from past its position", {A: 100, B: 200},
             Request(), wanted=(B,), again={B: 201}, min_snapshot_lsn=201),
    PlanCase("copied again with a cut-off: the higher LSN bounds the job", {A: 100, B: 200},
             Request(below_lsn=150), wanted=(A, B), again={B: 201}, min_snapshot_lsn=201),
    PlanCase("copied again with a first snapshot", {A: None, B: 200}, Request(),
             wanted=(A, B), again={B: 201}, min_snapshot_lsn=201),
    PlanCase("mode never still copies a table again", {A: 100, B: 200}, Request(mode="never"),
             wanted=(A,), again={A: 101}, min_snapshot_lsn=101),
    PlanCase("a table not selected any more is not copied again", {A: 100}, Request(),
             wanted=(), again={B: 201}),
]


@pytest.mark.parametrize("case", PLAN_CASES, ids=lambda case: case.id)
def test_plan(case):
    plan = scheduling.plan(list(case.applied), case.applied, case.request, case.again)
    minimum = case.request.below_lsn if case.min_snapshot_lsn is None else case.min_snapshot_lsn
    assert plan.wanted == case.wanted
    assert plan.idle == (not case.wanted)
    assert (plan.generation is None) == (not case.wanted)
    if case.wanted:
        assert plan.generation == scheduling.generation_of(
            case.request.resnapshot_generation, case.wanted, minimum)
    assert plan.min_snapshot_lsn == minimum
    assert plan.clear_below == case.clear_below
    assert plan.resnapshot == case.resnapshot


@pytest.mark.parametrize(("generation", "wanted", "below", "expected"), [
    (0, [A, B], 0, "g0-3ce44fe8"),
    (3, [C], 0x16B3780, "g3-11350e1d"),
], ids=["first", "resnapshot-with-cut-off"])
def test_the_generation_is_stable_across_versions(generation, wanted, below, expected):
    # Running snapshot applications are named by it: a changed digest resubmits them on upgrade.
    assert scheduling.generation_of(generation, wanted, below) == expected


@pytest.mark.parametrize(("left", "right", "same"), [
    ((0, [A, B], 0), (0, [A, B], 0), True),
    ((0, [A], 0), (0, [B], 0), False),
    ((0, [A, B], 0), (0, [A], 0), False),
    ((0, [A], 0), (1, [A], 0), False),
    ((0, [A], 0), (0, [A], 150), False),
], ids=["same-wish", "other-table", "fewer-tables", "other-resnapshot", "other-cut-off"])
def test_the_generation_is_one_per_wish(left, right, same):
    assert (scheduling.generation_of(*left) == scheduling.generation_of(*right)) == same


def test_the_table_order_does_not_change_the_plan():
    forward = scheduling.plan([A, B, C], {A: None, B: None, C: None}, Request())
    backward = scheduling.plan([C, B, A], {A: None, B: None, C: None}, Request())
    assert forward == backward and forward.wanted == tuple(sorted([A, B, C]))


@pytest.mark.parametrize(("spec", "status", "expected"), [
    (SnapshotSpec(), PostgresIngestionStatus(), Request("initial", 0, 0, 0)),
    (SnapshotSpec(mode="never", resnapshot_generation=4),
     PostgresIngestionStatus(observed_resnapshot_generation=3, resnapshot_below_lsn="1/2"),
     Request("never", 4, 3, 0x1_00000002)),
], ids=["defaults", "everything-set"])
def test_the_request_from_spec_and_status(spec, status, expected):
    assert Request.of(spec, status) == expected


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
    step = scheduling.advance(case.previous, case.plan, name, case.app, NOW)

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
    assert scheduling.advance(previous, FIRST, NAME, app, NOW).message == message


def test_a_long_error_is_cut():
    step = scheduling.advance(record(state="RUNNING"), FIRST, NAME,
                              Application("FAILED", "x" * 10_000), NOW)
    assert step.snapshot is not None
    assert step.snapshot.message == "x" * scheduling.MESSAGE_MAX


def test_a_new_record_lists_the_wanted_tables():
    step = scheduling.advance(None, FIRST, NAME, None, NOW)
    assert step.snapshot is not None
    assert step.snapshot.tables == ["public.a", "public.b"]
    assert step.snapshot.application == NAME and step.snapshot.generation == FIRST.generation


@pytest.mark.parametrize(("attempts", "finished", "over"), [
    (0, None, True),
    (1, 0, False),
    (1, 29, False),
    (1, 30, True),
    (2, 59, False),
    (2, 60, True),
    (3, 119, False),
    (3, 120, True),
    (8, 3599, False),
    (8, 3600, True),
    (50, 3600, True),
], ids=lambda value: str(value))
def test_backoff_over(attempts, finished, over):
    state = SnapshotStatus(state="FAILED", attempts=attempts,
                           finished_at=None if finished is None else ago(finished))
    assert scheduling.backoff_over(state, NOW) == over


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
    waiting = scheduling.hold(previous, plan, [A, B, C])
    if not held:
        assert waiting is None
        return
    assert waiting == Plan(wanted=(A,), generation="g0-aaaaaaaa", min_snapshot_lsn=7,
                           clear_below=True, resnapshot=None)  # serves no request
    assert scheduling.hold(previous, Plan((), None, 0, False, None), [A]) is None  # idle: none
