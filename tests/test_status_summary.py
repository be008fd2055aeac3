"""The status summary (lakeslot.observability.status_report.summary), table-driven: ``Degraded``, ``Ready`` and the
phase from the other conditions, the tables, the slot and the snapshot. Pure, no I/O; the
operator and local mode both write what it returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from lakeslot.api.models import (
    SPEC_MAX_BYTES,
    ApplyStatus,
    Condition,
    ConditionStatus,
    PostgresIngestion,
    PostgresIngestionStatus,
    SlotStatus,
    SnapshotStatus,
    TableState,
    TableStatus,
)
from lakeslot.api.naming import TableName
from lakeslot.observability import status_report
from tests.support.operator_env import OfflineDatabase, ingestion_document

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
WAL_AT_RISK = ("the slot's WAL is beyond max_slot_wal_keep_size and about to be removed: the "
               "reader must catch up now")


def c(type_: str, status: ConditionStatus = "True", reason: str | None = None,
      message: str = "") -> Condition:
    return Condition(type=type_, status=status, reason=reason or type_, message=message,
                     last_transition_time=T0)


ALL_TRUE = [c("SourceReady", reason="PreflightPassed"), c("SlotReady", reason="SlotHealthy"),
            c("SnapshotComplete"), c("Streaming")]


def table(name: str, state: TableState = "Streaming") -> TableStatus:
    return TableStatus(schema_name="public", name=name, state=state)


@dataclass(frozen=True)
class Case:
    id: str
    status: PostgresIngestionStatus
    ready: tuple[bool, str, str]  # ok, reason, message
    phase: str
    degraded: tuple[bool, str] = (False, "Healthy")  # ok, reason
    degraded_message: str | None = None


CASES = [
    Case("every needed condition True",
         PostgresIngestionStatus(conditions=ALL_TRUE, tables=[table("a")]),
         (True, "Streaming", "every selected table is streaming"), "Streaming",
         degraded_message="nothing needs attention"),
    Case("nothing known yet", PostgresIngestionStatus(),
         (False, "Reconciling", "SourceReady is not known yet"), "Pending"),
    Case("a needed condition missing",
         PostgresIngestionStatus(conditions=ALL_TRUE[:3]),
         (False, "Reconciling", "Streaming is not known yet"), "Pending"),
    Case("a needed condition Unknown is not ready",
         PostgresIngestionStatus(conditions=[*ALL_TRUE[:3], c("Streaming", "Unknown", "Waiting",
                                                              "no news")]),
         (False, "Waiting", "Streaming: no news"), "Pending"),
    Case("the first failing needed one wins (needed order, not list order)",
         PostgresIngestionStatus(conditions=[
             c("Streaming", "False", "ReaderNotReady", "no reader"),
             c("SnapshotComplete", "False", "Snapshotting", "copying"),
             c("SlotReady", reason="SlotHealthy"),
             c("SourceReady", "False", "ConnectionFailed", "connection refused")]),
         (False, "ConnectionFailed", "SourceReady: connection refused"), "Pending"),
    Case("a missing needed one before a failing one wins",
         PostgresIngestionStatus(conditions=[
             c("SourceReady", reason="PreflightPassed"),
             c("SnapshotComplete", "False", "Snapshotting", "copying")]),
         (False, "Reconciling", "SlotReady is not known yet"), "Pending"),
    Case("SlotLost is definite: phase Failed",
         PostgresIngestionStatus(conditions=[
             c("SourceReady", reason="PreflightPassed"),
             c("SlotReady", "False", "SlotLost", "wal removed"),
             c("SnapshotComplete")],
             slot=SlotStatus(name="s", wal_status="lost")),
         (False, "SlotLost", "SlotReady: wal removed"), "Failed"),
    Case("SlotUnusable is definite too",
         PostgresIngestionStatus(conditions=[
             c("SourceReady", reason="PreflightPassed"),
             c("SlotReady", "False", "SlotUnusable", "wrong plugin")]),
         (False, "SlotUnusable", "SlotReady: wrong plugin"), "Failed"),
    Case("definite wins over a running snapshot",
         PostgresIngestionStatus(conditions=[
             c("SourceReady", reason="PreflightPassed"),
             c("SlotReady", "False", "SlotLost", "wal removed"),
             c("SnapshotComplete", "False", "Snapshotting", "copying")],
             snapshot=SnapshotStatus(state="RUNNING")),
         (False, "SlotLost", "SlotReady: wal removed"), "Failed"),
    Case("a Failed table: Degraded TablesFailed, Ready from the conditions",
         PostgresIngestionStatus(conditions=ALL_TRUE,
                                 tables=[table("a"), table("b", "Failed"), table("c", "Failed")]),
         (True, "Streaming", "every selected table is streaming"), "Streaming",
         degraded=(True, "TablesFailed"),
         degraded_message="2 table(s) failed (see status.tables)"),
    Case("wal_status unreserved: Degraded WalAtRisk",
         PostgresIngestionStatus(conditions=ALL_TRUE,
                                 slot=SlotStatus(name="s", wal_status="unreserved")),
         (True, "Streaming", "every selected table is streaming"), "Streaming",
         degraded=(True, "WalAtRisk"), degraded_message=WAL_AT_RISK),
    Case("failed tables and WAL at risk: both said, TablesFailed first",
         PostgresIngestionStatus(conditions=ALL_TRUE, tables=[table("b", "Failed")],
                                 slot=SlotStatus(name="s", wal_status="unreserved")),
         (True, "Streaming", "every selected table is streaming"), "Streaming",
         degraded=(True, "TablesFailed"),
         degraded_message=f"1 table(s) failed (see status.tables); {WAL_AT_RISK}"),
    Case("wal_status extended is not at risk yet",
         PostgresIngestionStatus(conditions=ALL_TRUE,
                                 slot=SlotStatus(name="s", wal_status="extended")),
         (True, "Streaming", "every selected table is streaming"), "Streaming"),
    Case("snapshot running: Snapshotting",
         PostgresIngestionStatus(conditions=[
             *ALL_TRUE[:2], c("SnapshotComplete", "False", "Snapshotting", "app: RUNNING"),
             c("Streaming", "False", "WaitingForSnapshot", "none yet")],
             snapshot=SnapshotStatus(application="app", state="RUNNING")),
         (False, "Snapshotting", "SnapshotComplete: app: RUNNING"), "Snapshotting"),
    Case("snapshot failed (waiting out its backoff) still counts as Snapshotting",
         PostgresIngestionStatus(conditions=[
             *ALL_TRUE[:2], c("SnapshotComplete", "False", "SnapshotFailed", "OOM")],
             snapshot=SnapshotStatus(application="app", state="FAILED")),
         (False, "SnapshotFailed", "SnapshotComplete: OOM"), "Snapshotting"),
    Case("a completed snapshot is not running: Pending while not streaming",
         PostgresIngestionStatus(conditions=[
             *ALL_TRUE[:3], c("Streaming", "False", "ReaderNotReady", "no reader")],
             snapshot=SnapshotStatus(application="app", state="COMPLETED")),
         (False, "ReaderNotReady", "Streaming: no reader"), "Pending"),
    Case("a snapshot record without a state is not running",
         PostgresIngestionStatus(conditions=ALL_TRUE[:2], snapshot=SnapshotStatus()),
         (False, "Reconciling", "SnapshotComplete is not known yet"), "Pending"),
    Case("stale Ready and Degraded are ignored (old verdicts)",
         PostgresIngestionStatus(conditions=[
             c("Ready", "True", "Streaming", "every selected table is streaming"),
             c("Degraded", "True", "TablesFailed", "1 table(s) failed"),
             *ALL_TRUE[:3], c("Streaming", "False", "ApplyNotRunning", "apply absent")]),
         (False, "ApplyNotRunning", "Streaming: apply absent"), "Pending"),
    Case("a stale definite Ready (InvalidSpec, since fixed) does not fail the phase",
         PostgresIngestionStatus(conditions=[c("Ready", "False", "InvalidSpec", "bad"),
                                             *ALL_TRUE]),
         (True, "Streaming", "every selected table is streaming"), "Streaming"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_summary(case):
    before = case.status.model_copy(deep=True)
    result = status_report.summary(case.status)
    degraded, ready = result.conditions
    assert (degraded.type, ready.type) == ("Degraded", "Ready")
    assert (ready.ok, ready.reason, ready.message) == case.ready
    assert (degraded.ok, degraded.reason) == case.degraded
    if case.degraded_message is not None:
        assert degraded.message == case.degraded_message
    assert result.phase == case.phase
    assert case.status == before, "summary is pure"


def test_summarize_writes_the_summary_into_the_report():
    report = status_report.Report(PostgresIngestionStatus(conditions=ALL_TRUE), 7, T0)
    report.summarize()
    written = {cond.type: cond for cond in report.status.conditions}
    assert (written["Ready"].status, written["Ready"].reason) == ("True", "Streaming")
    assert (written["Degraded"].status, written["Degraded"].reason) == ("False", "Healthy")
    assert written["Ready"].observed_generation == 7
    assert report.status.phase == "Streaming"


@pytest.mark.parametrize(("behind", "reason"), [(None, "Streaming"), (12, "Streaming"),
                                                (13, "CatchingUp"), (600, "CatchingUp")])
def test_streaming_says_when_the_mirrors_are_catching_up(behind, reason):
    """Streaming stays True (the data flows, Ready holds) but a mirror far behind — a backlog,
    or a new apply job's first passes — is reported as catching up, not as current."""
    report = status_report.Report(PostgresIngestionStatus(conditions=ALL_TRUE, lag_bytes=4096,
                                                          apply=ApplyStatus(lag_seconds=behind)), 7, T0)
    status_report.streaming(report, [100], reader_problem=None, apply_problem=None, catching_up_after=12)
    report.summarize()
    written = {cond.type: cond for cond in report.status.conditions}
    assert (written["Streaming"].status, written["Streaming"].reason) == ("True", reason)
    assert written["Ready"].status == "True"
    if reason == "CatchingUp":
        assert f"{behind} s behind the source" in written["Streaming"].message
        assert "within 12 s" in written["Streaming"].message


@pytest.mark.parametrize(("apply", "reader", "after"), [
    ({}, {}, 2 * (10 + 60)),  # the defaults: a 10 s seal, a pass a minute
    ({"triggerIntervalSeconds": 1}, {}, 10),  # 2 × (0.5 + 1) = 3: at least 10 s
    ({"triggerIntervalSeconds": 5}, {"segmentMaxSeconds": 4}, 18),
])
def test_catching_up_is_relative_to_what_a_change_waits(apply, reader, after):
    document = ingestion_document("orders", OfflineDatabase(), [TableName("public", "t")],
                                  warehouse="/tmp/wh", staging="file:///tmp/staging")
    document["spec"]["apply"], document["spec"]["reader"] = apply, reader
    assert status_report.catching_up_after_s(PostgresIngestion.model_validate(document).spec) == after


def test_a_failed_snapshot_is_shown_until_the_table_is_copied():
    """lakeslot.observability.status_report.snapshot_failures over a reconcile's rows (as table_rows left them)."""
    from lakeslot.mirror.progress import MirrorProgress

    a, b, d, e, f = (TableName("s", n) for n in "abdef")
    failures: dict[TableName, dict] = {a: {"error": "keys are not unique"}, b: {"error": "timeout", "transient": True},
                                       d: {"error": "old"}, e: {"error": "keys are not unique"},
                                       f: {"error": "keys are not unique"}}
    none, mirrored = MirrorProgress(None, None, None), MirrorProgress(5, 1, 1)
    old = PostgresIngestionStatus(tables=[
        TableStatus(schema_name="s", name="a", state="Pending"),
        TableStatus(schema_name="s", name="b", state="Pending"),
        TableStatus(schema_name="s", name="c", state="Snapshotting",
                    message="snapshot failed: gone (copying it again)"),  # copied since
        TableStatus(schema_name="s", name="d", state="Pending"),
        TableStatus(schema_name="s", name="e", state="Failed", message="no primary key; fix: …"),
        TableStatus(schema_name="s", name="f", state="Pending")])
    report = status_report.Report(old, 1, T0)
    progress = {a: none, b: none, TableName("s", "c"): mirrored, d: mirrored, e: none, f: none}
    status_report.snapshot_failures(report, failures, progress, snapshotting={f})
    assert [(r.name, r.state, r.message) for r in report.status.tables] == [
        ("a", "Failed", "snapshot failed: keys are not unique"),  # definite: a human acts
        ("b", "Pending", "snapshot failed: timeout"),  # transient: the next attempt may pass
        ("c", "Snapshotting", ""),  # it has a mirror now: the old failure is gone
        ("d", "Pending", ""),  # a mirror: an old failure record does not count
        ("e", "Failed", "no primary key; fix: …"),  # preflight's finding comes first
        ("f", "Pending", "snapshot failed: keys are not unique (copying it again)")]


def test_the_stored_status_of_a_thousand_tables_stays_bounded():
    """Every table keeps its row; beyond the first 100 (failed and pending first) only without
    the details, counted in tableDetailsOmitted. With the largest spec lakeslot accepts twice
    (the spec and kopf's copy in the status), the object stays under the API server's 1.5 MiB."""
    def row(i: int, state: str) -> dict:
        return TableStatus(
            schema_name=f"s{i % 10:02d}".ljust(63, "s"), name=f"t{i:05d}".ljust(63, "t"), state=state,  # type: ignore[arg-type]
            snapshot_lsn="1A2B/3C4D5E6F", applied_lsn="1A2B/3C4D5E6F", rows_known=123_456_789,
            rows_staged=1234, lag_seconds=3, data_files=120, delete_files=4,
            message="x" * 300 if state == "Failed" else "",
            last_maintenance="2026-11-28T12:00:00Z: compacted 120 data files and 4 delete files into 3",
            last_schema_change="ALTER TABLE … ADD COLUMN y int at 1A2B/3C4D5E6F").to_document()

    tables = [row(i, "Failed" if i in (7, 500, 999) else "Streaming") for i in range(1000)]
    document = PostgresIngestionStatus(last_handled_configuration="x" * SPEC_MAX_BYTES).to_document()
    document["tables"] = tables
    stored = status_report.stored(document)
    assert [(r["schema"], r["name"]) for r in stored["tables"]] == [(r["schema"], r["name"]) for r in tables]
    detailed = [r for r in stored["tables"] if "rowsKnown" in r]
    assert len(detailed) == status_report.TABLE_DETAILS_MAX
    assert stored["tableDetailsOmitted"] == 1000 - status_report.TABLE_DETAILS_MAX
    assert {r["name"][:6] for r in detailed if r["state"] == "Failed"} == {"t00007", "t00500", "t00999"}
    assert all(r["appliedLsn"] and r["lastSchemaChange"] for r in stored["tables"])  # kept: state
    PostgresIngestionStatus.model_validate(stored)
    size = SPEC_MAX_BYTES + len(json.dumps(stored, separators=(",", ":")).encode())
    assert size < 1.5 * (1 << 20) - 64 * 1024, size  # room for metadata and kopf's annotations
    small = status_report.stored({"tables": tables[:5]})
    assert small["tables"] == tables[:5] and small["tableDetailsOmitted"] is None
