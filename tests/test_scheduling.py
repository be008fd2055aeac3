"""The snapshot-scheduling decision shared by the operator and local mode
(lakeslot.control.scheduling), table-driven: which tables a snapshot copies, from which LSN, its
generation, and how long a failed copy waits; and the one rule for recording and serving a
table's re-snapshot request (lakeslot.control.resnapshot.serve_requests). Pure:
tests/test_operator_reconcile.py runs the same decisions end to end, and
tests/test_local_new_tables.py and tests/test_local_resnapshot.py in ``lakeslot run``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from lakeslot.api.models import PostgresIngestionStatus, SnapshotSpec, SnapshotStatus, TableStatus
from lakeslot.api.naming import TableName
from lakeslot.control import resnapshot, scheduling
from lakeslot.control.scheduling import Request
from lakeslot.mirror.progress import MirrorProgress

A = TableName("public", "a")
B = TableName("public", "b")
C = TableName("Sales", "Orders 2024")
NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


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


# backoff: when a failed copy is tried again ----------------------------------------------------

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


@pytest.mark.parametrize(("failures", "seconds"), [
    (0, 30), (1, 30), (2, 60), (3, 120), (7, 1920), (8, 3600), (50, 3600),
], ids=lambda value: str(value))
def test_the_backoff_doubles_per_failure_up_to_an_hour(failures, seconds):
    # The operator's snapshot application (backoff_over) and local mode's per-table copy retries
    # (lakeslot.local.schedule.Schedule.copy_due) wait this long.
    assert scheduling.backoff_s(failures) == seconds


# serve_requests: one rule for recording and serving a table's re-snapshot request -------------

def _row(table: TableName, observed: int = 0, below: str | None = None) -> TableStatus:
    return TableStatus.model_validate({"schema": table.schema, "name": table.name,
                                       "state": "Streaming", "observedResnapshotGeneration": observed,
                                       "resnapshotBelowLsn": below})


def test_a_request_is_recorded_at_once_asked_once_and_served_by_the_copy():
    """The operator (reconcile._again) and lakeslot run (schedule.next_copy) both call it on
    their status rows: a raised resnapshotGeneration is recorded in the row at once, with the
    position + 1 the copy must reach; it stays requested until the snapshot LSN gets there."""
    rows = [_row(A), _row(B, observed=2), _row(C, below="0/64")]
    progress = {A: MirrorProgress(0x100, 5, None, snapshot_lsn=0x10),
                B: MirrorProgress(0x200, 5, None, snapshot_lsn=0x10),
                C: MirrorProgress(None, None, None)}  # no mirror: its first snapshot copies it
    served = resnapshot.serve_requests(rows, progress, {A: 1, B: 2})
    assert served.new == {A} and served.below == {A: 0x101} and served.changed
    assert (rows[0].observed_resnapshot_generation, rows[0].resnapshot_below_lsn) == (1, "0/101")
    assert rows[1].resnapshot_below_lsn is None and rows[2].resnapshot_below_lsn is None

    progress[A] = MirrorProgress(0x180, 5, None, snapshot_lsn=0x10)  # streamed on, not copied
    again = resnapshot.serve_requests(rows, progress, {A: 1, B: 2})
    assert again.new == frozenset() and again.below == {A: 0x101} and not again.changed

    progress[A] = MirrorProgress(0x190, 5, None, snapshot_lsn=0x185)  # the copy reached it
    done = resnapshot.serve_requests(rows, progress, {A: 1, B: 2})
    assert done.below == {} and done.changed and rows[0].resnapshot_below_lsn is None
    assert rows[0].observed_resnapshot_generation == 1  # asked once: not again


def test_a_running_copy_keeps_the_request_of_a_table_without_a_mirror():
    rows = [_row(C, below="0/64")]
    served = resnapshot.serve_requests(rows, {C: MirrorProgress(None, None, None)}, {},
                                       copying=lambda table: table == C)
    assert rows[0].resnapshot_below_lsn == "0/64" and served.below == {} and not served.changed
