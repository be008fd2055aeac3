"""Maintenance of the mirror tables (lakeslot.mirror.maintenance_policy): what is due (pure), and, on
PostgreSQL 15 and 18 with real Spark and Iceberg, that the apply job's compaction of a
merge-on-read mirror removes its delete files in a commit that keeps the table's position, while
the mirror — read with pyiceberg — stays equal to the source through further changes."""

from __future__ import annotations

import math
import os
import random
import threading
import time
import types
from pathlib import Path

import pytest
from psycopg import sql

from lakeslot.api.models import MaintenanceSpec
from lakeslot.apply import job as apply_job
from lakeslot.apply import upkeep
from lakeslot.mirror import maintenance_policy
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.mirror.contract import (
    LSN_PROPERTY,
    MAINTENANCE_AT_PROPERTY,
    MAINTENANCE_SUMMARY,
    ORPHANS_AT_PROPERTY,
)
from lakeslot.mirror.maintenance_policy import Health, Record, due
from lakeslot.spark import maintenance as spark_maintenance
from lakeslot.spark.maintenance import Maintainer
from lakeslot.spark.session import with_commit_properties
from tests.support.apply_support import Pipeline, assert_mirror_equals_source, workload_pipeline
from tests.support.apply_workload import IDLE, KEYLESS, MAIN, Workload

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

SPEC = MaintenanceSpec()
MiB = 1 << 20
NOW = 1_000_000.0
QUIET = Health(data_files=3, delete_files=0, records=1000, position_deletes=0, bytes=3 * MiB)


MESSY = Health(data_files=3, delete_files=SPEC.delete_file_threshold, records=1000,
               position_deletes=10, bytes=3 * MiB)


def test_nothing_is_due_on_a_healthy_table_or_within_the_interval():
    assert not due(QUIET, Record(), SPEC, 512 * MiB, NOW)
    assert due(MESSY, Record(), SPEC, 512 * MiB, NOW).why == f"{MESSY.delete_files} delete files"
    hourly = SPEC.model_copy(update={"interval_seconds": 3600})
    recently = Record(at=NOW - 3600 + 1)
    assert not due(MESSY, recently, hourly, 512 * MiB, NOW)
    assert due(MESSY, Record(at=NOW - 3600), hourly, 512 * MiB, NOW)
    assert not due(MESSY, Record(), SPEC.model_copy(update={"enabled": False}), 512 * MiB, NOW)


def test_maintenance_takes_at_most_its_share_of_the_time():
    """After a run of d seconds, the next waits d × (1 − share) ÷ share (share 0.2: 4 d), or
    intervalSeconds if that is longer: a table that compacts fast is compacted often."""
    assert SPEC.max_time_share == 0.2 and SPEC.interval_seconds == 0
    took_2s = Record(at=NOW - 7.9, took=2.0)  # 2 s of compaction: 8 s later at the earliest
    assert not due(MESSY, took_2s, SPEC, 512 * MiB, NOW)
    assert due(MESSY, Record(at=NOW - 8.0, took=2.0), SPEC, 512 * MiB, NOW)
    took_60s = Record(at=NOW - 200, took=60.0)  # a big table: 4 minutes later
    assert not due(MESSY, took_60s, SPEC, 512 * MiB, NOW)
    assert due(MESSY, Record(at=NOW - 240, took=60.0), SPEC, 512 * MiB, NOW)
    half = SPEC.model_copy(update={"max_time_share": 0.5})
    assert due(MESSY, Record(at=NOW - 60, took=60.0), half, 512 * MiB, NOW)
    assert not due(MESSY, Record(at=NOW - 59, took=60.0), half, 512 * MiB, NOW)
    slow_interval = SPEC.model_copy(update={"interval_seconds": 600})
    assert not due(MESSY, Record(at=NOW - 300, took=1.0), slow_interval, 512 * MiB, NOW)


def test_an_idle_table_has_any_delete_file_compacted_away():
    """Below every threshold a table in use keeps its few delete files; once a pass finds it idle
    they go, so readers of a quiet table merge nothing."""
    few = Health(data_files=3, delete_files=2, records=1000, position_deletes=10, bytes=3 * MiB)
    assert not due(few, Record(), SPEC, 512 * MiB, NOW)
    assert due(few, Record(), SPEC, 512 * MiB, NOW, idle=True).why == "idle with 2 delete files"
    assert not due(few, Record(at=NOW - 1, took=1.0), SPEC, 512 * MiB, NOW, idle=True)
    assert not due(QUIET, Record(), SPEC, 512 * MiB, NOW, idle=True)  # nothing to merge
    assert not due(few, Record(), SPEC.model_copy(update={"enabled": False}), 512 * MiB, NOW,
                   idle=True)


def test_deleted_rows_and_surplus_small_files_make_compaction_due():
    deleted = Health(data_files=2, delete_files=1, records=100_000, position_deletes=30_000,
                     bytes=8 * MiB)
    assert "30000 deleted rows of 100000" in due(deleted, Record(), SPEC, 512 * MiB, NOW).why
    few = Health(data_files=2, delete_files=1, records=100, position_deletes=90, bytes=MiB)
    assert not due(few, Record(), SPEC, 512 * MiB, NOW)  # a few deletes cost a reader nothing
    # 40 MiB at 4 MiB per file needs 10 files: 25 is 15 too many (threshold 16), 26 is 16
    small = Health(data_files=25, delete_files=0, records=1, position_deletes=0, bytes=40 * MiB)
    assert not due(small, Record(), SPEC, 4 * MiB, NOW)
    more = Health(data_files=26, delete_files=0, records=1, position_deletes=0, bytes=40 * MiB)
    assert due(more, Record(), SPEC, 4 * MiB, NOW).why == "26 data files where 10 would do"


def test_orphan_files_are_looked_for_with_a_compaction_at_most_daily():
    """A day after the first compaction at the earliest (it starts the clock: a new table's
    orphans are younger than orphanFileAgeHours), then at most daily."""
    messy = Health(data_files=3, delete_files=50, records=10, position_deletes=5, bytes=MiB)
    first = due(messy, Record(), SPEC, 512 * MiB, NOW)
    assert first and not first.orphans
    a_day_ago = Record(at=-math.inf, orphans_at=NOW - maintenance_policy.ORPHAN_INTERVAL_S)
    assert due(messy, a_day_ago, SPEC, 512 * MiB, NOW).orphans
    yesterday = Record(at=-math.inf, orphans_at=NOW - maintenance_policy.ORPHAN_INTERVAL_S + 1)
    assert not due(messy, yesterday, SPEC, 512 * MiB, NOW).orphans
    never = SPEC.model_copy(update={"orphan_file_age_hours": 0})
    assert not due(messy, a_day_ago, never, 512 * MiB, NOW).orphans
    assert not due(QUIET, a_day_ago, SPEC, 512 * MiB, NOW).orphans


def test_the_record_survives_on_the_table_and_nonsense_reads_as_never():
    assert Record.of({}) == Record()
    assert Record.of({"lakeslot.last-maintenance-at": "soon"}) == Record()
    assert Record.of({"lakeslot.last-maintenance-at": "12.5",
                      "lakeslot.last-orphan-removal-at": "3"}) == Record(12.5, 3.0)
    assert Record.of({"lakeslot.last-maintenance-at": "12.5",
                      "lakeslot.last-maintenance-seconds": "2.250"}) == Record(12.5, took=2.25)
    assert Record.of({"lakeslot.last-maintenance-seconds": "nan"}).took == 0.0


@pytest.fixture
def pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    return workload_pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path,
                             monkeypatch, sink={"maintenance": {"deleteFileThreshold": 2,
                                                                "intervalSeconds": 3600}})


def _snapshots(spark_warehouse, pipeline: Pipeline, table) -> list:
    loaded = load_hadoop_table(spark_warehouse.as_uri(),
                               pipeline.job_input().names.mirror_identifier(table))
    assert loaded is not None
    return sorted(loaded.snapshots(), key=lambda s: s.sequence_number)


def _live_rows(snapshot) -> int:
    """Rows a reader sees: records of the data files less the rows position deletes remove."""
    return (int(snapshot.summary.get("total-records"))
            - int(snapshot.summary.get("total-position-deletes")))


def test_the_apply_job_compacts_delete_files_away_and_keeps_the_position(pipeline, spark_warehouse):
    off = pipeline.with_spec(sink={"maintenance": {"enabled": False}})
    off.start_slot()
    off.snapshot()
    with pipeline.pgdb.connect() as conn:
        workload = Workload(conn, random.Random(21))
        for _ in range(3):  # merge-on-read: each pass adds delete files, nothing compacts them
            workload.run(6)
            off.seal()
            assert off.apply().ok
        before = mirror_progress.read(off.ingestion, [MAIN])[MAIN]
        assert before.delete_files is not None and before.delete_files >= 2
        assert before.maintenance is None

        workload.run(6)
        pipeline.seal()
        assert pipeline.apply().ok  # maintenance on: due (≥ 2 delete files), so it runs
        history = _snapshots(spark_warehouse, pipeline, MAIN)
        maintained = [i for i, s in enumerate(history) if s.summary.get(MAINTENANCE_SUMMARY)]
        assert [history[i].summary.get(MAINTENANCE_SUMMARY) for i in maintained][:1] == \
            ["compaction"], [s.summary for s in history]
        before_it, last = history[maintained[0] - 1], history[maintained[-1]]
        # maintenance rewrote files, not rows, and kept the position of the commit before it
        for i in maintained:
            assert history[i].summary.get(LSN_PROPERTY) == before_it.summary.get(LSN_PROPERTY)
        assert last.summary.get("total-delete-files") == "0"
        assert _live_rows(last) == _live_rows(before_it)
        after = mirror_progress.read(pipeline.ingestion, [MAIN])[MAIN]
        assert after.maintenance is not None and "compacted (" in after.maintenance
        assert "delete files removed" in after.maintenance
        assert_mirror_equals_source(pipeline, spark_warehouse, MAIN)
        assert_mirror_equals_source(pipeline, spark_warehouse, KEYLESS)

        workload.run(6)  # changes on top of the compacted files; within the interval: no rerun
        pipeline.seal()
        assert pipeline.apply().ok
        history = _snapshots(spark_warehouse, pipeline, MAIN)
        assert [s.summary.get(MAINTENANCE_SUMMARY) for s in history].count("compaction") == 1

        # a compaction lakeslot did not run (by hand, or a managed catalog's): no lakeslot.lsn
        # on its snapshot, and yet the table keeps its position and goes on streaming
        position = mirror_progress.read(pipeline.ingestion, [MAIN])[MAIN].lsn
        assert position is not None
        name = ".".join(pipeline.job_input().names.mirror_identifier(MAIN))
        pipeline.spark.sql(f"CALL {pipeline.namespace.split('.')[0]}.system.rewrite_data_files("
                           f"table => '{name}', options => map('rewrite-all', 'true'))")
        foreign = _snapshots(spark_warehouse, pipeline, MAIN)[-1]
        assert foreign.summary.operation.value == "replace"
        assert foreign.summary.get(LSN_PROPERTY) is None
        assert mirror_progress.read(pipeline.ingestion, [MAIN])[MAIN].lsn == position
        workload.run(6)
        pipeline.seal()
        assert pipeline.apply().ok
    assert (mirror_progress.read(pipeline.ingestion, [MAIN])[MAIN].lsn or 0) > position
    assert_mirror_equals_source(pipeline, spark_warehouse, MAIN)
    assert_mirror_equals_source(pipeline, spark_warehouse, KEYLESS)


def test_a_quiet_source_leaves_its_mirror_without_delete_files(pipeline, spark_warehouse):
    """Below every threshold, the delete files a busy mirror keeps are compacted away by the
    first pass that finds nothing new for it — also when nothing at all was sealed, as when the
    source is quiet — so readers of a quiet mirror merge nothing."""
    busy = pipeline.with_spec(sink={"maintenance": {"deleteFileThreshold": 1000,
                                                    "intervalSeconds": 0}})
    busy.start_slot()
    busy.snapshot()
    with busy.pgdb.connect() as conn:
        workload = Workload(conn, random.Random(5))
        for _ in range(2):
            workload.run(6)
            busy.seal()
            assert busy.apply().ok
    busy_now = _snapshots(spark_warehouse, busy, MAIN)[-1]
    assert int(busy_now.summary.get("total-delete-files")) >= 1  # below the threshold: kept
    assert busy_now.summary.get(MAINTENANCE_SUMMARY) is None

    assert busy.apply().ok  # nothing sealed since: the table is idle
    history = _snapshots(spark_warehouse, busy, MAIN)
    since = [s.summary.get(MAINTENANCE_SUMMARY) for s in history
             if s.sequence_number > busy_now.sequence_number]
    assert since and since[0] == "compaction" and None not in since, since
    quiet = history[-1]
    assert quiet.summary.get("total-delete-files") == "0"
    assert quiet.summary.get(LSN_PROPERTY) == busy_now.summary.get(LSN_PROPERTY)
    assert _live_rows(quiet) == _live_rows(busy_now)
    assert "idle with" in (mirror_progress.read(busy.ingestion, [MAIN])[MAIN].maintenance or "")
    assert_mirror_equals_source(busy, spark_warehouse, MAIN)


def test_an_idle_settled_mirror_is_not_looked_at_again_until_a_pass_changes_it(
        pipeline, spark_warehouse, monkeypatch):
    """A look at a table's health loads it (a catalog call). A long-running apply job looks at
    an idle table until a look finds it settled — no delete file, nothing that could fall due
    whatever the time — and then no more until a pass changes it: the change's pass looks, the
    next (idle) one compacts the delete file it left, the one after finds it settled again."""
    monkeypatch.setattr(upkeep, "MAINTENANCE_LOOK_S", 0.0)  # (else every 5 s at most)
    looks: list[tuple[int, bool]] = []  # (pass, idle) of each look at MAIN's mirror
    passes: list[apply_job.PassResult] = []
    main = pipeline.job_input().names.mirror_table(MAIN)
    maintain = Maintainer.maintain

    def counted(self, table, name, **options):  # the real maintenance, counted
        if name.endswith(main):
            looks.append((len(passes) + 1, options["idle"]))
        return maintain(self, table, name, **options)

    monkeypatch.setattr(Maintainer, "maintain", counted)
    fast = pipeline.with_spec(apply={"triggerIntervalSeconds": 1})
    fast.start_slot()
    fast.snapshot()
    stop = threading.Event()

    def on_pass(result) -> None:
        passes.append(result)
        if len(passes) == 4:  # an update (a delete file in the mirror), sealed before pass 5
            with fast.pgdb.connect() as conn:
                conn.execute(sql.SQL("UPDATE {0} SET amount = amount + 1 WHERE id = (SELECT min(id) "
                                     "FROM {0})").format(MAIN.sql()))
            fast.seal()
        if len(passes) == 9:
            stop.set()

    assert apply_job.run(fast.spark, fast.job_input(), once=False, stop=stop,
                         on_pass=on_pass).ok
    assert looks == [(1, True), (5, False), (6, True), (7, True)], looks
    history = _snapshots(spark_warehouse, fast, MAIN)
    assert [s.summary.get(MAINTENANCE_SUMMARY) for s in history].count("compaction") == 1
    assert history[-1].summary.get("total-delete-files") == "0"
    assert_mirror_equals_source(fast, spark_warehouse, MAIN)


def test_a_busy_pass_maintains_within_its_share_and_the_tables_take_turns(pipeline, monkeypatch):
    """In a pass that applied changes, maintenance gets at most maxTimeShare of the job's time:
    once that is spent no further table starts, and the next pass starts with the table it
    stopped before. Upkeep's clock is made to jump a thousand seconds whenever a table's
    maintenance starts (so each busy pass has time for exactly one), deterministically."""
    monkeypatch.setattr(upkeep, "MAINTENANCE_LOOK_S", 0.0)
    jump = [0.0]
    monkeypatch.setattr(upkeep, "time", types.SimpleNamespace(
        monotonic=lambda: time.monotonic() + jump[0], time=time.time))
    started: list[list] = [[]]  # per pass, the tables whose maintenance started

    def point(name, table) -> None:
        if name == "before-maintenance":
            started[-1].append(table)
            jump[0] += 1000.0

    passes: list[apply_job.PassResult] = []
    stop = threading.Event()
    fast = pipeline.with_spec(apply={"triggerIntervalSeconds": 1})  # (the default waits 60 s)

    def change() -> None:
        with fast.pgdb.connect() as conn:
            Workload(conn, random.Random(len(passes))).run(3)
        fast.seal()

    def on_pass(result) -> None:
        passes.append(result)
        started.append([])
        if len(passes) == 4:
            stop.set()
        else:
            change()

    fast.start_slot()
    fast.snapshot()
    change()
    assert apply_job.run(fast.spark, fast.job_input(), once=False, stop=stop,
                         hooks=apply_job.Hooks(point), on_pass=on_pass).ok
    assert all(any(t.state == "applied" for t in p.tables) for p in passes)
    assert started[:4] == [[MAIN], [KEYLESS], [IDLE], [MAIN]], started


def test_an_idle_pass_maintains_no_further_table_once_changes_wait_or_the_job_stops(
        pipeline, spark_warehouse, monkeypatch):
    """A pass that applied nothing may maintain for budgetSeconds (two minutes by default),
    table after table. In a continuous job it starts no further table once new segments are
    sealed — a change must not wait behind the others' compactions — nor once the job is
    stopping. Here the second pass of each run is idle with two mirrors to look at (both
    changed in the first): a change sealed as its first look starts, and then a stop set as its
    first look starts, leave it at that one look."""
    monkeypatch.setattr(upkeep, "MAINTENANCE_LOOK_S", 0.0)  # (else each table every 5 s)
    fast = pipeline.with_spec(apply={"triggerIntervalSeconds": 1})

    updates = {MAIN: "UPDATE {0} SET amount = amount + 1 WHERE id = (SELECT min(id) FROM {0})",
               KEYLESS: "UPDATE {0} SET b = coalesce(b, '') || 'x' WHERE a = (SELECT min(a) FROM {0})"}

    def change(*tables) -> None:
        with fast.pgdb.connect() as conn:
            for table in tables:
                conn.execute(sql.SQL(updates[table]).format(table.sql()))
        fast.seal()

    applied: list[set] = []  # per pass, the tables it applied changes to

    def run(in_idle_pass) -> list[list]:
        looks: list[list] = [[]]  # per pass, the tables maintenance looked at
        applied.clear()
        stop = threading.Event()

        def point(name, table) -> None:
            if name == "before-maintenance":
                looks[-1].append(table)
                if len(looks) == 2 and len(looks[-1]) == 1:
                    in_idle_pass(stop)

        def on_pass(result) -> None:
            looks.append([])
            applied.append({t.source for t in result.tables if t.state == "applied"})
            if len(looks) == 4:
                stop.set()

        change(MAIN, KEYLESS)
        assert apply_job.run(fast.spark, fast.job_input(), once=False, stop=stop,
                             hooks=apply_job.Hooks(point), on_pass=on_pass).ok
        return looks

    fast.start_slot()
    fast.snapshot()
    looks = run(lambda stop: change(MAIN))
    assert len(looks[1]) == 1, looks  # (without the seal: both mirrors)
    assert applied == [{MAIN, KEYLESS}, set(), {MAIN}], applied  # the change in the next pass
    looks = run(lambda stop: stop.set())
    assert len(looks) == 3 and len(looks[1]) == 1, looks  # (the run ended with that pass)
    assert applied == [{MAIN, KEYLESS}, set()], applied
    for table in (MAIN, KEYLESS):
        assert_mirror_equals_source(fast, spark_warehouse, table)


def test_orphan_files_older_than_the_age_are_removed_a_day_after_the_first_compaction(
        pipeline, spark_warehouse):
    """The first compaction starts the orphan clock and deletes nothing; a compaction a day
    later deletes the files under the table's location that no snapshot references and that are
    older than orphanFileAgeHours — a younger one (a write not yet committed) stays."""
    pipeline.start_slot()
    pipeline.snapshot()
    with pipeline.pgdb.connect() as conn:
        workload = Workload(conn, random.Random(8))
        while not (mirror_progress.read(pipeline.ingestion, [MAIN])[MAIN].maintenance or ""):
            workload.run(6)
            pipeline.seal()
            assert pipeline.apply().ok
        first = mirror_progress.read(pipeline.ingestion, [MAIN])[MAIN].maintenance
        assert first is not None and "compacted (" in first and "orphan" not in first
        loaded = load_hadoop_table(spark_warehouse.as_uri(),
                                   pipeline.job_input().names.mirror_identifier(MAIN))
        assert loaded is not None
        started = float(loaded.properties[ORPHANS_AT_PROPERTY])  # the clock started
        data = Path(loaded.location().removeprefix("file:")) / "data"
        old, young = data / "failed-write-old.parquet", data / "failed-write-young.parquet"
        for orphan in (old, young):
            orphan.write_bytes(b"never committed")
        hours_100 = time.time() - 100 * 3600  # older than orphanFileAgeHours (72)
        os.utime(old, (hours_100, hours_100))
        a_day_earlier = started - maintenance_policy.ORPHAN_INTERVAL_S
        pipeline.spark.sql(  # as if both happened a day ago (the fixture's interval is an hour)
            f"ALTER TABLE {pipeline.target(MAIN)} SET TBLPROPERTIES ("
            f"'{ORPHANS_AT_PROPERTY}' = '{a_day_earlier!r}', "
            f"'{MAINTENANCE_AT_PROPERTY}' = '{a_day_earlier!r}')")
        for _ in range(10):  # until the delete files call for the next compaction
            workload.run(6)
            pipeline.seal()
            assert pipeline.apply().ok
            if (later := mirror_progress.read(pipeline.ingestion, [MAIN])[MAIN].maintenance) != first:
                break
    assert later is not None and "compacted (" in later and "1 orphan files removed" in later, later
    assert not old.exists() and young.exists()
    assert_mirror_equals_source(pipeline, spark_warehouse, MAIN)


def test_a_compaction_runs_from_a_thread_without_an_active_spark_session(spark, iceberg_namespace):
    """Regression: the apply job's thread sometimes had no active Spark session, and every
    compaction then failed ("Catalog 'default_cache_iceberg' plugin class not found"): Iceberg's
    rewrite registers that catalog in the active session's conf. Here a thread clears it first."""
    table = f"{iceberg_namespace}.messy"
    spark.sql(f"CREATE TABLE {table} (id bigint, v string) USING iceberg TBLPROPERTIES ("
              "'format-version' = '2', 'write.delete.mode' = 'merge-on-read')")
    spark.sql(f"INSERT INTO {table} SELECT id, 'x' FROM range(100)")
    spark.sql(f"DELETE FROM {table} WHERE id < 10")
    java_table = spark._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
        spark._jsparkSession, table)
    outcome: list[str | None | BaseException] = []

    def compact() -> None:
        spark._jvm.org.apache.spark.sql.SparkSession.clearActiveSession()
        try:
            outcome.append(Maintainer(spark, SPEC).maintain(java_table, table,
                                                            idle=True))
        except BaseException as e:  # noqa: BLE001 - handed to the assertion below
            outcome.append(e)

    thread = threading.Thread(target=compact)
    thread.start()
    thread.join()
    assert len(outcome) == 1 and isinstance(outcome[0], str), outcome
    assert "compacted (idle with 1 delete files)" in outcome[0]
    assert spark.sql(f"SELECT count(*) FROM {table}").first()[0] == 90
    assert spark.sql(f"SELECT summary['total-delete-files'] FROM {table}.snapshots "
                     "ORDER BY committed_at DESC LIMIT 1").first()[0] == "0"


def test_a_compaction_rewrites_many_manifests_and_every_commit_keeps_the_position(
        spark, iceberg_namespace, monkeypatch):
    """More than MANIFESTS_PER_SNAPSHOT manifests left after a compaction are rewritten with it,
    on the driver for an unpartitioned table (lakeslot's ``Manifests``: one group); every commit
    of the maintenance — the compaction, the delete files it left, the manifests — carries the
    table's ``lakeslot.lsn`` and says what it is, and no row changes. Here twelve appends, a
    delete in each file, and the threshold at 0 (how many manifests a compaction leaves is
    Iceberg's business)."""
    monkeypatch.setattr(spark_maintenance, "MANIFESTS_PER_SNAPSHOT", 0)
    table = f"{iceberg_namespace}.manifold"
    spark.sql(f"CREATE TABLE {table} (id bigint, v string) USING iceberg TBLPROPERTIES ("
              "'format-version' = '2', 'write.delete.mode' = 'merge-on-read')")
    for i in range(12):
        spark.sql(f"INSERT INTO {table} VALUES ({2 * i}, 'a{i}'), ({2 * i + 1}, 'b{i}')")
    with_commit_properties(spark, {LSN_PROPERTY: "42"},
                           lambda: spark.sql(f"DELETE FROM {table} WHERE id % 2 = 1"))
    java_table = spark._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
        spark._jsparkSession, table)
    outcome = Maintainer(spark, SPEC).maintain(java_table, table, idle=True)
    assert outcome is not None and "manifests rewritten into" in outcome, outcome
    snapshots = spark.sql(f"SELECT operation, summary FROM {table}.snapshots "
                          "ORDER BY committed_at").collect()
    maintained = [s.summary for s in snapshots[13:]]  # (after the appends and the delete)
    assert [s.get(MAINTENANCE_SUMMARY) for s in maintained] == \
        ["compaction", "delete-files", "manifests"], maintained
    assert {s.get(LSN_PROPERTY) for s in maintained} == {"42"}
    assert spark.sql(f"SELECT count(*) FROM {table}.manifests WHERE content = 0").first()[0] == 1
    assert [tuple(r) for r in spark.sql(f"SELECT id, v FROM {table} ORDER BY id").collect()] == \
        [(2 * i, f"a{i}") for i in range(12)]
