"""A mirror the apply job went through in its last pass is taken as that pass left it, without
reading it from the catalog (lakeslot.apply.table_pass); another job's commit in between — a
re-snapshot — is found by the commit, which commits nothing; the next pass reads the table and
applies from where the copy left it. Real PostgreSQL, the reader, the snapshot and apply jobs,
Spark and Iceberg; the re-snapshot goes through a second Spark catalog on the same warehouse,
as another job's would (its own catalog client: the apply job's cached table objects do not see
it); the mirrors are compared row by row with their sources through pyiceberg.

``Tables.load`` of the running job is wrapped to record, per call, whether it read the catalog:
what it answers is the real one's."""

from __future__ import annotations

import random

import pytest
from psycopg import sql

from lakeslot.apply import table_pass
from lakeslot.apply.job import Applier
from lakeslot.apply.outcomes import Hooks, PassResult
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.mirror.contract import LSN_PROPERTY, Moved
from lakeslot.snapshot import job as snapshot_job
from lakeslot.spark import row_delta
from tests.support.apply_support import assert_mirror_equals_source, lsn_now, outcome, workload_pipeline
from tests.support.apply_workload import IDLE, KEYLESS, MAIN, Workload
from tests.support.fixtures_spark import CATALOG

OTHER = "other_job"  # the second Spark catalog: another job's client of the same warehouse


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)  # (no version-specific part)
def test_a_mirror_copied_again_by_another_job_is_found_by_the_commit_and_applied_next_pass(
        pgdb, spark, spark_warehouse, iceberg_namespace, tmp_path, monkeypatch):
    pipeline = workload_pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path,
                                 monkeypatch)
    monkeypatch.setattr(table_pass, "REREAD_S", 3600.0)  # (none read again for its age here)
    pipeline.start_slot()
    pipeline.snapshot()

    def last(table) -> tuple[int, int]:
        """The (snapshot id, lakeslot.lsn) of the table's last snapshot with a position, read
        with pyiceberg (not through the Spark catalog the job's objects are cached in)."""
        loaded = load_hadoop_table(spark_warehouse.as_uri(),
                                   pipeline.job_input().names.mirror_identifier(table))
        assert loaded is not None
        placed = [(s.timestamp_ms, s.sequence_number, s.snapshot_id, int(value))
                  for s in loaded.metadata.snapshots
                  if s.summary is not None and (value := s.summary.get(LSN_PROPERTY)) is not None]
        *_, snapshot, position = max(placed)
        return snapshot, position

    prefix = f"spark.sql.catalog.{CATALOG}"
    for key, value in spark.sparkContext.getConf().getAll():
        if key == prefix or key.startswith(prefix + "."):
            spark.conf.set(f"spark.sql.catalog.{OTHER}" + key[len(prefix):], value)
    catalog = pipeline.ingestion.to_document()["spec"]["sink"]["catalog"]
    other = pipeline.with_spec(sink={"catalog": {**catalog, "name": OTHER}})

    job = Applier(spark, pipeline.job_input(), Hooks(), 256, 3, continuous=True)
    reads: list[tuple[str, bool]] = []  # (mirror, read from the catalog), per Tables.load call
    load = job.passes.work.tables.load

    def recorded(table: str, *, refresh: bool = True):
        reads.append((table, refresh))
        return load(table, refresh=refresh)

    job.passes.work.tables.load = recorded  # type: ignore[method-assign]
    refused: list[str] = []  # the mirrors whose row delta found the table moved
    commit = row_delta.commit

    def watched(jvm, table, *rest, **named):
        try:
            return commit(jvm, table, *rest, **named)
        except Moved:
            refused.append(str(table.name()).rsplit(".", 1)[-1])
            raise

    monkeypatch.setattr(row_delta, "commit", watched)

    def changes(seed: int) -> None:
        with pgdb.connect() as conn:
            workload = Workload(conn, random.Random(seed))
            workload.run(5)
            workload.insert_keyless()  # (every table changes in every pass)
            conn.execute(sql.SQL("UPDATE {} SET v = v || '+' WHERE id = 1").format(IDLE.sql()))
            conn.execute(sql.SQL('UPDATE {0} SET "select" = {1} WHERE id = (SELECT min(id) FROM {0})')
                         .format(MAIN.sql(), sql.Literal(f"pass {seed}")))
            conn.execute(sql.SQL("INSERT INTO {} VALUES ({}, 'new')").format(
                IDLE.sql(), sql.Literal(100 + seed)))

    def next_pass() -> PassResult:
        pipeline.seal()
        reads.clear()
        return job.passes.run_pass()

    def prepared(table) -> list[bool]:
        """Whether the pass's first read of the table (its prepare's) went to the catalog."""
        target = pipeline.job_input().names.mirror_table(table)
        return [refresh for name, refresh in reads if name == target][:1]

    try:
        changes(1)
        first = next_pass()  # every mirror read from the catalog: the job knows none yet
        assert all(outcome(first, t).state == "applied" for t in (MAIN, KEYLESS, IDLE))
        assert all(prepared(t) == [True] for t in (MAIN, KEYLESS, IDLE))

        changes(2)
        second = next_pass()  # taken as the first pass left them: no read
        assert all(prepared(t) == [False] for t in (MAIN, KEYLESS, IDLE))
        assert all(outcome(second, t).state == "applied" for t in (MAIN, KEYLESS, IDLE))
        for table in (MAIN, KEYLESS, IDLE):
            assert_mirror_equals_source(pipeline, spark_warehouse, table)

        # another job copies MAIN and IDLE again, between passes, at a later position; more
        # changes of them follow
        changes(3)
        pipeline.seal()
        before = {t: last(t) for t in (MAIN, IDLE)}
        copied = snapshot_job.run(spark, type(other.job_input())(other.ingestion, (MAIN, IDLE)),
                                  min_snapshot_lsn=lsn_now(pgdb))
        assert {t.source: t.state for t in copied.tables} == {MAIN: "committed", IDLE: "committed"}
        moved = {t: last(t) for t in (MAIN, IDLE)}
        assert all(moved[t][1] > before[t][1] for t in (MAIN, IDLE))
        changes(4)

        third = next_pass()  # planned from the held state: each commit finds the table moved
        assert all(prepared(t) == [False] for t in (MAIN, KEYLESS, IDLE))
        for table in (MAIN, IDLE):
            refusal = outcome(third, table)
            assert refusal.state == "retrying" and "moved" in (refusal.error or ""), refusal
            assert last(table) == moved[table]  # nothing committed
        assert outcome(third, KEYLESS).state == "applied"
        # IDLE's small batch takes the driver's row delta: the catalog refused its first attempt,
        # and the retry's reload found the table moved (not Iceberg's validation, then a MERGE)
        assert pipeline.job_input().names.mirror_table(IDLE) in refused

        fourth = next_pass()  # read again, applied from the copy's position
        assert prepared(MAIN) == prepared(IDLE) == [True] and prepared(KEYLESS) == [False]
        assert fourth.end is not None
        for table in (MAIN, IDLE):
            assert outcome(fourth, table).state == "applied"
            assert last(table)[1] == fourth.end - 1
        assert outcome(fourth, KEYLESS).state in ("current", "advanced")  # (applied in the third)
        for table in (MAIN, KEYLESS, IDLE):
            assert_mirror_equals_source(pipeline, spark_warehouse, table)
    finally:
        job.close()


def test_a_job_of_many_tables_reads_the_ones_it_knows_again_at_a_bounded_rate():
    """Each known table is read again at least every REREAD_S on average — less often in a job
    of more tables than the catalog would then answer REREADS_PER_S loads a second for."""
    for tables in (1, 10, 200, 300, 301, 1000, 10_000):
        every = table_pass.reread_every_s(tables)
        assert every >= table_pass.REREAD_S
        assert tables / every <= table_pass.REREADS_PER_S
        if tables <= table_pass.REREAD_S * table_pass.REREADS_PER_S:
            assert every == table_pass.REREAD_S
    assert table_pass.reread_every_s(1000) == 200.0
