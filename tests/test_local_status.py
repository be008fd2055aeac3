"""``lakeslot status`` before, without and against a broken ingestion: the operator's status
model, computed from real PostgreSQL 15 and 18, changing nothing and never showing a secret."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from lakeslot.local import observe
from tests.support import local_support


def _status(path, db, state_dir, password=None) -> dict:
    env = {**os.environ, "LAKESLOT_SOURCE_PASSWORD": password or db.cluster.password}
    result = subprocess.run([local_support.LAKESLOT, "status", "-f", str(path), "--state-dir",
                             str(state_dir), "-o", "json"], capture_output=True, text=True,
                            env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert (password or db.cluster.password) not in result.stdout + result.stderr
    return json.loads(result.stdout)


def _conditions(document: dict) -> dict:
    return {c["type"]: (c["status"], c["reason"]) for c in document["conditions"]}


def test_before_any_run_status_says_what_is_missing_and_changes_nothing(pgdb, tmp_path):
    with pgdb.connect() as conn:
        table = local_support.create_accounts(conn, 10)
    path = tmp_path / "ingestion.yaml"
    local_support.write_ingestion(path, pgdb, [table], tmp_path)
    document = _status(path, pgdb, tmp_path / "state")
    conditions = _conditions(document)
    assert conditions["SourceReady"] == ("True", "PreflightPassed")
    assert conditions["SlotReady"] == ("False", "SlotMissing")
    assert conditions["SnapshotComplete"] == ("False", "NotSnapshotted")
    assert conditions["Streaming"][1] == "ReaderNotReady"
    assert conditions["Ready"][0] == "False"
    assert document["phase"] == "Pending"
    assert document["tables"] == [{"schema": "public", "name": "accounts", "state": "Pending"}]
    with pgdb.connect() as conn:  # observing created neither slot nor publication
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone()[0] == 0


def test_a_table_without_a_key_is_failed_with_its_fix(pgdb, tmp_path):
    with pgdb.connect() as conn:
        good = local_support.create_accounts(conn, 10)
        conn.execute("CREATE TABLE keyless (v int)")
    path = tmp_path / "ingestion.yaml"
    document = local_support.write_ingestion(path, pgdb, [good], tmp_path)
    document["spec"]["source"]["tables"].append({"name": "keyless"})
    path.write_text(yaml.safe_dump(document))
    status = _status(path, pgdb, tmp_path / "state")
    rows = {t["name"]: t for t in status["tables"]}
    assert rows["keyless"]["state"] == "Failed" and "fix:" in rows["keyless"]["message"]
    assert rows["accounts"]["state"] == "Pending"
    assert _conditions(status)["Degraded"] == ("True", "TablesFailed")


@pytest.mark.parametrize("pg", ["pg15"], indirect=True)
def test_a_wrong_password_is_a_condition_not_a_crash(pgdb, tmp_path):
    with pgdb.connect() as conn:
        table = local_support.create_accounts(conn, 10)
    path = tmp_path / "ingestion.yaml"
    local_support.write_ingestion(path, pgdb, [table], tmp_path)
    status = _status(path, pgdb, tmp_path / "state", password="not-the-password")
    assert _conditions(status)["SourceReady"] == ("False", "ConnectionFailed")
    assert status["phase"] == "Pending"


def test_activity_without_a_run(pgdb, tmp_path):
    with pgdb.connect() as conn:
        table = local_support.create_accounts(conn, 10)
    path = tmp_path / "ingestion.yaml"
    local_support.write_ingestion(path, pgdb, [table], tmp_path)
    activity = observe.activity(local_support.local(path, pgdb, tmp_path / "state"))
    assert not activity.run_active and not activity.reader_running


def _problem(activity: observe.Activity) -> str:
    problem = observe._reader_problem(activity)
    assert problem is not None, f"no reader problem for {activity}"
    return problem


def test_the_reader_problem_says_whether_a_run_stopped_cleanly_or_none_ran():
    stopped = observe.Activity(run_active=False, reader_outcome={"state": "stopped", "lsn": "0/16B3748"})
    assert "run has stopped" in _problem(stopped)
    assert "0/16B3748" in _problem(stopped)
    assert "no local run is active" in _problem(observe.Activity(run_active=False))
    definite = observe.Activity(run_active=False, reader_outcome={
        "state": "failed", "definite": True, "reason": "SlotLost", "message": "gone"})
    assert "definite error (SlotLost): gone" in _problem(definite)
    assert observe._reader_problem(observe.Activity(run_active=True, reader_running=True)) is None


def test_staged_changes_are_counted_once_per_segment_the_new_ones_at_once(tmp_path, monkeypatch):
    """The status's staged counts (observe.StagedCounter): each table's changes above its applied
    LSN in the sealed segments (a change per row whose op changes a table; a commit at or below
    the LSN applied is not counted), the new segments read at once — two reads meet at a barrier,
    which reads one after the other never pass — and each segment once."""
    import threading

    import pyarrow as pa

    from lakeslot.api.naming import TableName
    from lakeslot.reader.writer import SegmentWriter
    from lakeslot.staging import segments
    from lakeslot.staging.store import Staging

    staging = Staging(tmp_path.as_uri())
    source = segments.SourceIdentity("7", 1)
    names = []
    for k in range(4):  # segment k: k + 1 changes of a and one of b per commit, two commits
        start = 0x1000 * (k + 1)
        writer = SegmentWriter(staging, start, source)
        rows = [{"commit_lsn": start + c, "seq": n, "op": op, "schema": "s", "table": t}
                for c in (0x10, 0x20)
                for n, (op, t) in enumerate([("I", "a")] * (k + 1) + [("U", "b"), ("C", None)])]
        writer.write(pa.RecordBatch.from_pylist(rows, schema=segments.SCHEMA))
        names.append(writer.seal(start + 0x1000))
    a, b = TableName("s", "a"), TableName("s", "b")
    applied = {a: 0, b: 0x3010}  # b: applied up to the first commit of segment 3 (k = 2)
    expected = {a: 2 * (1 + 2 + 3 + 4), b: 1 + 2}

    reads: list[segments.SegmentName] = []
    met = threading.Barrier(2, timeout=30)
    counted = Staging.change_counts

    def reading(self, name):
        reads.append(name)
        if len(reads) <= 2:
            met.wait()
        return counted(self, name)

    monkeypatch.setattr(Staging, "change_counts", reading)
    counter = observe.StagedCounter(tmp_path.as_uri())
    assert counter.pending(applied) == expected
    assert sorted(reads) == sorted(names)
    reads.clear()
    assert counter.pending(applied) == expected and reads == []


@pytest.mark.parametrize("pg", ["pg15"], indirect=True)
def test_a_status_between_two_passes_takes_the_mirrors_as_read_since_the_last(pgdb, tmp_path,
                                                                            monkeypatch):
    """``lakeslot run``'s status while no apply pass finished since the re-snapshot decision read
    every mirror (observe's ``read``): the mirrors' progress as read then, no catalog load; a
    read without every table is not taken (the mirrors are read as always)."""
    from lakeslot.mirror import catalogs
    from lakeslot.mirror.progress import MirrorProgress

    with pgdb.connect() as conn:
        table = local_support.create_accounts(conn, 10)
    path = tmp_path / "ingestion.yaml"
    local_support.write_ingestion(path, pgdb, [table], tmp_path)
    local = local_support.local(path, pgdb, tmp_path / "state")
    loads = []

    def load_tables(catalog, idents, *args, **kwargs):
        loads.append(idents)
        return [None] * len(idents)

    monkeypatch.setattr(catalogs, "load_tables", load_tables)
    read = {table: MirrorProgress(lsn=0x16B3748, rows=10, committed_at_ms=None)}
    status = observe.observe(local, observe.activity(local), read=read)
    [row] = status.tables
    assert (row.applied_lsn, row.rows_known) == ("0/16B3748", 10) and loads == []
    status = observe.observe(local, observe.activity(local), read={})
    [row] = status.tables
    assert row.applied_lsn is None and len(loads) == 1  # (read: no mirror yet)
