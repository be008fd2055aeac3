"""``lakeslot run --metrics-port``: the operator's gauges of a local run, scraped over HTTP and
checked against PostgreSQL and the mirror while it streams; the chart's alerts evaluated on them.

Nothing is simulated: real PostgreSQL 18, the run in this process on the tests' Spark session
(its reader a real child process), Iceberg, HTTP. To make WAL pile up, the reader child is frozen
with SIGSTOP (as a reader stuck in a call would be) while the source is written, then thawed.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.error
from datetime import datetime

import pytest

from lakeslot.api.naming import TableName
from lakeslot.local import state
from lakeslot.local.pgcluster import free_port
from lakeslot.mirror import progress as mirror_progress
from lakeslot.observability.metrics import COUNTERS, GAUGES, PREFIX
from lakeslot.staging.store import Staging
from tests.support import chart, local_support, promql
from tests.support.prometheus import Scrape, scrape
from tests.support.waiting import wait_for

KEYLESS = TableName("public", "keyless")
ROWS = 2_000


def _wal(db, slot: str) -> tuple[int, int, int]:
    """PostgreSQL's own answer: current − restart_lsn, current − confirmed_flush_lsn, current."""
    with db.connect() as conn:
        row = conn.execute(
            "SELECT (pg_current_wal_lsn() - restart_lsn)::int8,"
            " (pg_current_wal_lsn() - confirmed_flush_lsn)::int8, (pg_current_wal_lsn() - '0/0')::int8"
            " FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    assert row is not None
    return row


@pytest.mark.slow
@pytest.mark.parametrize("pg", ["pg18"], indirect=True)
def test_a_local_runs_metrics_agree_with_postgresql_and_fire_the_alerts(pgdb, spark, spark_warehouse, tmp_path):
    with pgdb.connect() as conn:
        local_support.create_accounts(conn, ROWS)
        conn.execute("CREATE TABLE keyless (v int)")  # no replica identity: Failed, not replicated
    path = tmp_path / "ingestion.yaml"
    local_support.write_ingestion(path, pgdb, [local_support.ACCOUNTS, KEYLESS], tmp_path, warehouse=spark_warehouse)
    local = local_support.local(path, pgdb, tmp_path / "state")
    names = local.job.names
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    ingestion = frozenset({("namespace", names.namespace), ("ingestion", names.name)})
    accounts, keyless = str(local_support.ACCOUNTS), str(KEYLESS)
    alerts = chart.alert_rules(chart.render({**chart.SERVED, "metrics": {"prometheusRule": {
        "enabled": True, "walRetainedBytes": 256 << 10, "walGrowingMinutes": 1}}}))

    def mine(result: Scrape, name: str, **labels: str) -> float | None:
        return result.value(PREFIX + name, namespace=names.namespace, ingestion=names.name, **labels)

    def firing(name: str, scrapes: Scrape | promql.Timeline) -> dict:
        value = promql.evaluate(alerts[name]["expr"], scrapes)
        assert isinstance(value, dict)
        return value

    def during() -> None:
        timeline = promql.Timeline()

        def scraped() -> Scrape:
            return timeline.take(scrape(url), time.time())

        def serving() -> bool:  # (the run is active, its first step is to serve)
            try:
                scrape(url)
            except urllib.error.URLError:
                return False
            return True

        wait_for(serving, "the run to serve its metrics")

        # 1. Caught up: every row in the mirror, freshness 0, the applied LSN the mirror's own.
        def caught_up() -> Scrape:
            result = scraped()
            applied = mirror_progress.read(local.ingestion, [local_support.ACCOUNTS])[local_support.ACCOUNTS].lsn
            return result if applied is not None and mine(result, "table_applied_lsn", table=accounts) == applied \
                and mine(result, "table_rows", table=accounts) == ROWS \
                and mine(result, "table_freshness_seconds", table=accounts) == 0 else Scrape()

        result = wait_for(caught_up, "the mirror caught up, as a scrape says", deadline=local_support.RUN_DEADLINE_S)
        # the operator's series, nothing else: its gauges, and its counters once the apply job's
        # status has totals (whether a pass wrote them before this scrape is a race)
        assert result.names() <= {PREFIX + g for g in GAUGES} | {f"{PREFIX}{c}_total" for c in COUNTERS}
        assert mine(result, "freshness_seconds") == 0 and mine(result, "suspended") == 0
        assert mine(result, "tables", state="Streaming") == 1 and mine(result, "tables", state="Failed") == 1
        assert mine(result, "table_snapshot_rows", table=accounts) == ROWS
        assert mine(result, "table_snapshot_rows_estimated", table=accounts) == ROWS  # ANALYZEd
        assert mine(result, "table_failed", table=keyless) == 1 and mine(result, "table_failed", table=accounts) == 0
        assert mine(result, "table_rows", table=keyless) is None  # never copied
        assert mine(result, "slot_active") == 1 and mine(result, "slot_holder", kind="reader") == 1
        assert mine(result, "condition", type="SlotReady", status="True") == 1
        def last_pass_as_staging_says() -> bool:
            document = Staging(local.ingestion.spec.staging.uri).read_apply_status()
            if document is None:
                return False
            ended = datetime.fromisoformat(document["updatedAt"].replace("Z", "+00:00")).timestamp()
            return mine(scraped(), "apply_last_pass_timestamp_seconds") == ended

        wait_for(last_pass_as_staging_says, "the apply job's last pass in a scrape",
                 deadline=local_support.RUN_DEADLINE_S)
        assert firing("LakeslotTableFailed", result) == {ingestion | {("table", keyless)}: 1}
        assert firing("LakeslotSlotInactive", result) == {}
        assert firing("LakeslotDefiniteError", result) == {}

        def as_postgresql_says() -> Scrape:
            result, (retained, unconfirmed, _) = scraped(), _wal(pgdb, names.slot)
            return result if (mine(result, "slot_retained_wal_bytes"),
                              mine(result, "slot_confirmed_flush_lag_bytes")) == (retained, unconfirmed) \
                else Scrape()

        before = wait_for(as_postgresql_says, "retained WAL equal to pg_current_wal_lsn() - restart_lsn")

        # 2. The reader freezes while the source is written: WAL piles up, as PostgreSQL says.
        reader = state.read_run(local.state_dir)["readerPid"]
        os.kill(reader, signal.SIGSTOP)
        try:
            start = _wal(pgdb, names.slot)[2]
            with pgdb.connect() as conn:
                conn.execute("UPDATE accounts SET note = repeat('y', 400), balance = balance + 1")
            written = _wal(pgdb, names.slot)[2] - start
            assert written > 500_000
            def piled_up() -> Scrape:
                result = as_postgresql_says()
                return result if (mine(result, "slot_retained_wal_bytes") or 0) >= written else Scrape()

            result = wait_for(piled_up, "the retained WAL of the frozen reader in a scrape")
            peak = mine(result, "slot_retained_wal_bytes")
            assert firing("LakeslotWalRetainedHigh", result) == {ingestion: peak}
            assert (mine(before, "slot_retained_wal_bytes") or 0) < (peak or 0)
            growing = firing("LakeslotWalRetainedGrowing", timeline)  # over the last minute's scrapes
            assert set(growing) == {ingestion} and growing[ingestion] > 0, growing
            assert mine(result, "table_freshness_seconds", table=accounts) == 0  # nothing staged
        finally:
            os.kill(reader, signal.SIGCONT)

        # 3. Thawed, the reader stages the update and the apply job applies it: freshness 0 again,
        #    the WAL released (a CHECKPOINT logs the running transactions that move restart_lsn).
        target = _wal(pgdb, names.slot)[2]
        wait_for(lambda: (mine(scraped(), "table_applied_lsn", table=accounts) or 0) >= target - 1
                 and mine(timeline[-1][1], "table_freshness_seconds", table=accounts) == 0,
                 "the update applied and freshness 0", deadline=local_support.RUN_DEADLINE_S)
        falling = promql.Timeline([timeline[-1]])

        def released() -> bool:
            with pgdb.connect() as conn:
                conn.execute("CHECKPOINT")
            result = falling.take(scrape(url), time.time())
            return (mine(result, "slot_retained_wal_bytes") or 0) < 256 << 10

        wait_for(released, "the retained WAL released once the reader confirmed the update", interval=1)
        assert firing("LakeslotWalRetainedGrowing", falling) == {}
        assert firing("LakeslotWalRetainedHigh", falling[-1][1]) == {}

    local_support.run_in_process(local, spark, once=False, during=during, interval=1.0, metrics_port=port)
