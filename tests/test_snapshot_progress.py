"""The snapshot job's progress document (lakeslot.snapshot.progress), on local disk as the
operator and local mode read it: rewritten at most every ``WRITE_INTERVAL_S`` — a change within
the interval is written at its end by a timer, with no further change —, the first document and
the job's end at once, and a timer's write that fails raised by the next change. The module's
clock is made to stand still, so which changes fall within an interval does not depend on the
machine's speed."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from lakeslot.api.naming import TableName
from lakeslot.snapshot import progress as snapshot_progress
from tests.support.waiting import wait_for


def test_changes_within_an_interval_are_written_once_at_its_end(tmp_path, monkeypatch):
    written: list[dict] = []
    real_write = snapshot_progress._write

    def write(location: str, data: dict) -> None:
        real_write(location, data)
        written.append(data)

    clock = [1000.0]
    monkeypatch.setattr(snapshot_progress, "_write", write)
    monkeypatch.setattr(snapshot_progress, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    tables = [TableName("public", f"t{i}") for i in range(50)]
    location = tmp_path / snapshot_progress.STAGING_FILE
    progress = snapshot_progress.Progress(str(location), [(t, f"ns.{t.name}") for t in tables])
    assert len(written) == 1  # the first document: at once

    def document() -> dict:
        return json.loads(location.read_text())

    for table in tables:
        progress.table(table, state="copying", ranges_total=1)
        progress.table(table, state="committed", ranges_done=1, lsn=7)
    assert len(written) == 1  # a hundred changes within the interval (the clock stands still)
    wait_for(lambda: len(written) == 2, "the changes written at the interval's end")
    assert {t["state"] for t in document()["tables"]} == {"committed"}

    clock[0] += snapshot_progress.WRITE_INTERVAL_S  # a change an interval after the last write: at once
    progress.table(tables[0], rows_staged=5)
    assert len(written) == 3 and document()["tables"][0]["rowsStaged"] == 5
    progress.table(tables[1], rows_staged=6)  # (within the interval: pending)
    progress.finish()  # the end: at once, the pending change with it
    assert len(written) == 4 and document()["state"] == "succeeded"
    assert document()["tables"][1]["rowsStaged"] == 6

    refused: list[str] = []

    def full(location: str, data: bytes) -> None:
        refused.append(location)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshot_progress, "_write", full)
    progress.table(tables[2], rows_staged=7)  # within the interval: the timer's write fails...
    wait_for(lambda: refused, "the timer's write")
    with pytest.raises(OSError, match="No space left"):  # ... and the next change says so
        progress.table(tables[3], rows_staged=8)
    assert Path(location).exists() and document()["tables"][2]["rowsStaged"] == 0
