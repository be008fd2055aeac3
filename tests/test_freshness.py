"""Freshness from staging (lakeslot.observability.freshness): for each position, the commit time of the first
staged transaction above it — against real segments the reader sealed from PostgreSQL 15 and 18,
and the commit times PostgreSQL itself recorded (``track_commit_timestamp`` is off on the test
clusters, so the times are taken by the transactions themselves: ``now()`` is the start of the
transaction, at or before its commit)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lakeslot.api.models import ApplyStatus, PostgresIngestionStatus, TableStatus
from lakeslot.api.naming import TableName
from lakeslot.observability import freshness
from lakeslot.staging.store import Staging
from tests.support.reader_support import current_lsn, prepare, read_until


def test_the_first_pending_commit_per_position(pgdb, tmp_path):
    staging = (tmp_path / "staging").as_uri()
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        start = prepare(conn, [TableName("public", "t")])
        commits: list[tuple[int, datetime]] = []  # (LSN after the commit, a time before it)
        for i in range(3):
            with conn.transaction():
                began = conn.execute("INSERT INTO t VALUES (%s) RETURNING now()", (i,)).fetchone()
            assert began is not None
            commits.append((current_lsn(conn), began[0]))
        end = current_lsn(conn)
    read_until(pgdb, staging, end)
    positions = {"before all": start, "after one": commits[0][0], "after all": end}
    found = freshness.first_pending(Staging(staging), positions)
    assert found["after all"] is None
    for key, first in (("before all", 0), ("after one", 1)):
        pending = found[key]
        assert pending is not None
        began, committed_by = commits[first][1], (commits[first + 1][1] if first + 1 < 3 else None)
        assert began <= pending, key  # committed after its transaction started ...
        assert committed_by is None or pending <= committed_by, key  # ... and before the next began

    now = datetime.now(UTC)
    assert freshness.seconds_behind(None, now) == 0
    assert freshness.seconds_behind(now - timedelta(seconds=7.9), now) == 7
    assert freshness.seconds_behind(now + timedelta(seconds=3), now) == 0  # clock skew: never negative

    # Into a status: streaming tables get their value, the largest goes to status.apply.
    lsn = lambda v: f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"  # noqa: E731 - local shorthand
    status = PostgresIngestionStatus(apply=ApplyStatus(), tables=[
        TableStatus(schema_name="public", name="a", state="Streaming", applied_lsn=lsn(end)),
        TableStatus(schema_name="public", name="b", state="Streaming", applied_lsn=lsn(start)),
        TableStatus(schema_name="public", name="c", state="Snapshotting", lag_seconds=5)])
    later = commits[0][1] + timedelta(seconds=30)
    freshness.record(status, Staging(staging, create=False), later)
    assert [t.lag_seconds for t in status.tables] == [0, freshness.seconds_behind(found["before all"], later), None]
    assert status.apply is not None and status.apply.lag_seconds == status.tables[1].lag_seconds
    assert (status.apply.lag_seconds or 0) >= 29
    nothing = Staging("file:///nonexistent/staging/at/all", create=False)
    freshness.record(status, nothing, later)  # nothing staged: caught up
    assert status.apply.lag_seconds == 0
