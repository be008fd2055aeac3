"""An idle table's advance kept in memory (lakeslot.apply.coverage), end to end: real PostgreSQL,
the reader, Spark and Iceberg; the mirrors read back with pyiceberg.

A continuous apply job does not commit an idle table every pass; it says in its status document
how far the table is covered, readers of progress report that, retention keeps what the mirror's
committed position still needs, a change to the table commits it as usual, the advance is
committed when due, and a restarted job (memory lost) starts again from the committed position
and loses nothing."""

from __future__ import annotations

import random

import pytest
from psycopg import sql

from lakeslot.apply.coverage import COMMIT_AFTER_S
from lakeslot.apply.job import Applier
from lakeslot.apply.outcomes import Hooks, PassResult, TableOutcome
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.progress import MirrorProgress
from lakeslot.source import ddl_capture
from lakeslot.staging import apply_status
from lakeslot.staging.store import Staging
from lakeslot.verify import mirror as verify_mirror
from tests.support.apply_support import assert_mirror_equals_source, outcome, workload_pipeline
from tests.support.apply_workload import IDLE, KEYLESS, MAIN, Workload


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)  # (no version-specific part)
def test_an_idle_table_is_covered_in_memory_and_committed_when_due(
        pgdb, spark, spark_warehouse, iceberg_namespace, tmp_path, monkeypatch):
    pipeline = workload_pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path,
                                 monkeypatch, staging={"retentionSeconds": 0})
    pipeline.start_slot()
    pipeline.snapshot()
    snapshotted = pipeline.snapshots(IDLE)
    committed = snapshotted[-1][1]
    ingestion, staging = pipeline.ingestion, Staging(pipeline.staging)
    clock = _Clock()

    def applier() -> Applier:
        made = Applier(spark, pipeline.job_input(), Hooks(), 256, 3, continuous=True)
        made.passes.work.coverage.clock = clock
        return made

    def busy_pass(job: Applier, transactions: int = 6) -> tuple[PassResult, int]:
        """A pass after changes of MAIN and KEYLESS; with the position it took them to."""
        with pgdb.connect() as conn:
            Workload(conn, random.Random(transactions)).run(transactions)
        sealed = pipeline.seal()
        result = job.passes.run_pass()
        assert result.end is not None and result.end >= sealed
        assert outcome(result, MAIN).state == "applied"
        return result, result.end - 1

    def assert_equal() -> None:
        for table in (MAIN, KEYLESS, IDLE):
            assert_mirror_equals_source(pipeline, spark_warehouse, table)

    job = applier()
    try:
        # passes that do not touch IDLE: no commit on it, covered to each batch end
        for round_ in (1, 2):
            result, end = busy_pass(job, 4 + round_)
            idle = outcome(result, IDLE)
            assert (idle.state, idle.committed, idle.lsn) == ("advanced", committed,
                                                              end), idle
            assert pipeline.snapshots(IDLE) == snapshotted
            document = staging.read_apply_status()
            assert apply_status.covered(document) == {IDLE: (committed, end)}
            # the readers of progress see the covered position, the mirror alone its own
            assert mirror_progress.read(ingestion, [IDLE])[IDLE].lsn == committed
            read = mirror_progress.read(ingestion, [IDLE, MAIN],
                                        covered=apply_status.covered(document))
            assert read[IDLE].lsn == end
            assert read[MAIN].lsn == outcome(result, MAIN).lsn
            # retention (0 s) keeps every segment above the committed position
            assert staging.list()[0].start <= committed + 1
            assert_equal()
        # lakeslot verify's wait takes the covered position as reached, without a commit
        reached = verify_mirror.wait_for_mirror(pipeline.job_input(), IDLE, end, 0.0,
                                                None, 0.0, print)
        assert isinstance(reached, verify_mirror.Reached) and reached.lsn == end
        assert reached.snapshot.snapshot_id == snapshotted[-1][0]

        # a restarted job has lost the memory: it reads staging again from the committed
        # position (nothing of IDLE there) and covers it anew
        job.close()
        job = applier()
        result, end = busy_pass(job)
        idle = outcome(result, IDLE)
        assert (idle.state, idle.committed) == ("advanced", committed)
        assert pipeline.snapshots(IDLE) == snapshotted
        assert_equal()

        # a change of IDLE is committed in its pass, as any table's
        with pgdb.connect() as conn:
            conn.execute(sql.SQL("UPDATE {} SET v = 'moved' WHERE id = 1").format(IDLE.sql()))
        result, end = busy_pass(job)
        idle = outcome(result, IDLE)
        assert (idle.state, idle.committed, idle.lsn) == ("applied", None, end)
        assert pipeline.snapshots(IDLE)[-1][1] == end
        committed = end
        assert_equal()

        # idle again: covered; once due (300-600 s later), its advance is committed
        result, end = busy_pass(job)
        assert outcome(result, IDLE).committed == committed
        assert pipeline.snapshots(IDLE)[-1][1] == committed
        clock.now += 2 * COMMIT_AFTER_S
        result, end = busy_pass(job)
        idle = outcome(result, IDLE)
        assert (idle.state, idle.committed, idle.lsn) == ("advanced", None, end)
        assert pipeline.snapshots(IDLE)[-1][1] == end
        assert apply_status.covered(staging.read_apply_status()) == {}
        assert all(s.start > committed for s in staging.list())  # retention moved on with it
        assert_equal()
    finally:
        job.close()

    # a --once run commits every advance (nothing outlives it)
    with pgdb.connect() as conn:
        Workload(conn, random.Random(7)).run(3)
    pipeline.seal()
    once = pipeline.apply().last
    assert once is not None
    idle = outcome(once, IDLE)
    assert (idle.state, idle.committed) == ("advanced", None)
    assert pipeline.snapshots(IDLE)[-1][1] == idle.lsn
    assert_equal()


def test_a_covered_position_counts_only_while_the_mirror_is_where_the_document_says():
    document = {"tables": [TableOutcome(IDLE, "idle", "advanced", 20, committed=10).document(),
                           TableOutcome(KEYLESS, "plain", "advanced", 20, committed=10).document(),
                           TableOutcome(MAIN, "main", "applied", 20).document()]}
    assert apply_status.covered(document) == {IDLE: (10, 20), KEYLESS: (10, 20)}
    progress = {IDLE: MirrorProgress(10, 1, None),  # still at the committed position
                KEYLESS: MirrorProgress(25, 1, None),  # committed since (or re-snapshotted)
                MAIN: MirrorProgress(20, 1, None)}
    moved = mirror_progress.with_coverage(progress, apply_status.covered(document))
    assert {t: p.lsn for t, p in moved.items()} == {IDLE: 20, KEYLESS: 25, MAIN: 20}


def test_with_the_event_trigger_an_idle_table_is_covered_in_memory_too(
        pgdb, spark, spark_warehouse, iceberg_namespace, tmp_path, monkeypatch):
    """Regression: with lakeslot's event trigger installed every table's pass has a DDL plan, and
    an idle table's advance was committed every pass as if the plan had replayed something (in
    the 200-table benchmark about one commit in five was such an empty commit)."""
    with pgdb.connect(autocommit=True) as conn:
        assert ddl_capture.ensure(conn, "Auto").mode == "EventTrigger"
    pipeline = workload_pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path,
                                 monkeypatch)
    pipeline.start_slot()
    pipeline.snapshot()
    snapshotted = pipeline.snapshots(IDLE)
    job = Applier(spark, pipeline.job_input(), Hooks(), 256, 3, continuous=True)
    try:
        for round_ in (1, 2):
            with pgdb.connect() as conn:
                Workload(conn, random.Random(round_)).run(4 + round_)
            pipeline.seal()
            result = job.passes.run_pass()
            assert job.sources.capture is not None  # (the trigger's messages are replayed)
            assert outcome(result, MAIN).state == "applied"
            idle = outcome(result, IDLE)
            assert (idle.state, idle.committed) == ("advanced", snapshotted[-1][1]), idle
            assert pipeline.snapshots(IDLE) == snapshotted  # no commit on it
    finally:
        job.close()
    for table in (MAIN, KEYLESS, IDLE):
        assert_mirror_equals_source(pipeline, spark_warehouse, table)
