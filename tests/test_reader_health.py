"""The reader's status while it runs, as pure functions and a fake clock: which reason a
transient error is, when a problem is reported and cleared, how often the status file is
written, and how local mode and the operator turn the document into ``Streaming`` (issue 18).
The same with real parts: tests/test_reader_retrying.py."""

from __future__ import annotations

import errno
import json
from datetime import UTC, datetime

import psycopg

from lakeslot.local import observe, reader_process
from lakeslot.observability import reader_status
from lakeslot.reader.health import Health, classify

URI = "s3://AKIA:secret@bucket/prefix?secret_key=x"
FULL = OSError(errno.ENOSPC, "No space left on device")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _health(tmp_path, clock: Clock, settle_s: float = 10.0) -> Health:
    return Health(str(tmp_path / "status.json"), settle_s=settle_s, staging_uri=URI,
                  clock=clock, wall=lambda: datetime(2026, 11, 25, tzinfo=UTC))


def _file(tmp_path) -> dict:
    return json.loads((tmp_path / "status.json").read_text())


def test_a_transient_error_is_classified_by_what_failed_and_never_shows_a_credential():
    reason, message = classify(OSError(errno.EACCES, f"cannot write {URI}/x.parquet"), URI)
    assert reason == reader_status.STAGING_UNWRITABLE
    assert "secret" not in message and "AKIA" not in message and "s3://bucket/prefix" in message
    assert classify(FULL)[0] == reader_status.STAGING_UNWRITABLE and "No space left on device" in classify(FULL)[1]
    assert classify(psycopg.OperationalError("connection refused\nmore"))[0] == reader_status.SOURCE_UNREACHABLE
    assert "more" not in classify(psycopg.OperationalError("connection refused\nmore"))[1]
    assert classify(psycopg.errors.ObjectInUse("slot is active")) == (
        reader_status.RETRYING_ERROR, "ObjectInUse: slot is active")


def test_a_problem_lasts_through_sessions_that_fail_again_and_clears_on_a_seal(tmp_path):
    clock = Clock()
    health = _health(tmp_path, clock)
    health.started()
    assert not (tmp_path / "status.json").exists() or _file(tmp_path)["state"] == "running"
    health.failed(FULL)
    assert health.document()["state"] == "retrying"  # served at once
    clock.now += 2
    health.tick()  # written once two seconds passed since the last write
    assert _file(tmp_path)["reason"] == reader_status.STAGING_UNWRITABLE
    since = health.document()["since"]
    for _ in range(5):  # the reader reconnects about once a second and fails at its first write
        clock.now += 1
        health.started()
        health.progress(0x100, sealed=False)
        clock.now += 0.2
        health.failed(FULL)
    assert health.document()["reason"] == reader_status.STAGING_UNWRITABLE
    assert health.document()["since"] == since  # the trouble began once
    health.started()
    health.progress(0x200, sealed=True)
    assert health.document()["state"] == "running"
    assert health.document()["lsn"] == "0/200"
    clock.now += 5
    health.tick()
    assert _file(tmp_path)["state"] == "running"


def test_a_problem_clears_after_streaming_without_an_error_when_nothing_is_written(tmp_path):
    clock = Clock()
    health = _health(tmp_path, clock, settle_s=10.0)
    health.failed(psycopg.OperationalError("connection refused"))
    health.started()
    clock.now += 9
    health.progress(0x100, sealed=False)
    assert health.retrying
    clock.now += 1
    health.progress(0x100, sealed=False)
    assert not health.retrying


def test_the_status_file_is_written_on_a_change_and_at_most_every_two_seconds(tmp_path, monkeypatch):
    clock = Clock()
    health = _health(tmp_path, clock, settle_s=0.0)
    writes: list[str] = []
    monkeypatch.setattr("lakeslot.reader.health.write_document",
                        lambda path, document: writes.append(document["state"]))
    health.started()
    for _ in range(100):  # streaming: housekeeping every tick, nothing to write
        clock.now += 0.1
        health.progress(0x100, sealed=False)
    assert writes == ["running"]
    for _ in range(20):  # failing and clearing as fast as it can, for 2 s
        clock.now += 0.05
        health.failed(FULL)
        clock.now += 0.05
        health.started()
        health.progress(0x100, sealed=True)
    assert len(writes) <= 3  # at t=0 and every 2 s since
    health.failed(FULL)
    clock.now += 2
    health.tick()  # the last change is written once the window ends
    assert writes[-1] == "retrying"


def test_the_document_maps_to_the_streaming_reason_and_message():
    now = datetime(2026, 11, 25, tzinfo=UTC)
    doc = reader_status.document("retrying", reason=reader_status.STAGING_UNWRITABLE, message="cannot write", since=now,
                                 now=now)
    reason, message = reader_status.problem(doc) or ("", "")
    assert reason == reader_status.STAGING_UNWRITABLE
    assert "since 2026-11-25T00:00:00+00:00" in message and "cannot write" in message
    assert reader_status.problem(reader_status.document("running", reason=reader_status.STREAMING, now=now)) is None
    assert reader_status.problem({}) is None and reader_status.problem(None) is None
    assert reader_status.problem({"state": "failed", "reason": "Crashed"}) is None  # an outcome, not a state
    retrying = reader_status.problem({"state": "retrying", "reason": "Whatever"})
    assert (retrying or ("",))[0] == reader_status.RETRYING_ERROR
    assert reader_status.is_final({"state": "stopped", "reason": "Stopped"})
    assert reader_status.is_final({"reason": "RetriesExhausted"})
    assert not reader_status.is_final(doc) and not reader_status.is_final({})


def test_local_mode_reports_a_running_readers_problem_and_its_end_apart():
    doc = {"state": "retrying", "reason": reader_status.STAGING_UNWRITABLE, "message": "disk full",
           "since": None}
    running = observe.Activity(run_active=True, reader_running=True, reader_outcome=doc)
    assert observe.reader_state(running) == (reader_status.STAGING_UNWRITABLE, "the reader retries: disk full")
    assert observe.reader_state(observe.Activity(run_active=True, reader_running=True)) is None
    gone = observe.Activity(run_active=True, reader_running=False, reader_outcome=doc)
    reason, message = observe.reader_state(gone) or ("", "")
    assert reason == "ReaderNotReady" and message == "the reader process is not running"
    # a reader killed while retrying left its running state: the exit says what it was doing
    assert reader_process.describe_exit(-9, doc) == (
        f"killed by SIGKILL; it was retrying: {reader_status.STAGING_UNWRITABLE}: the reader retries: disk full")
