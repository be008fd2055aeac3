"""The apply job end to end, on PostgreSQL 15 and 18: the real snapshot job (taken while writes
run), the real reader sealing segments, the apply job MERGEing into Iceberg. The mirror must equal
the source row for row, column for column — at quiescence, and at intermediate commits read by
Iceberg time travel against the source state recorded at known LSNs — and a crash at any of the
injected points followed by a restart must end equal, with the changelog holding every change
exactly once."""

from __future__ import annotations

import random
import threading

import pytest
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.apply import job as apply_job
from lakeslot.apply import spread
from lakeslot.apply.job import Hooks
from lakeslot.apply.spread import routes
from lakeslot.mirror import contract
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.contract import ERROR_PROPERTY, RESNAPSHOT_PROPERTY
from lakeslot.spark.tables import Tables
from lakeslot.staging.store import Staging
from tests.support.apply_support import (
    Pipeline,
    assert_mirror_equals_source,
    lsn_now,
    source_rows,
    workload_pipeline,
)
from tests.support.apply_workload import IDLE, KEYLESS, MAIN, Workload, create_tables
from tests.support.snapshot_helpers import mirror_rows
from tests.test_typemap import T, _columns, _create, _equal

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

CHANGES = "__changes"


@pytest.fixture
def pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    return workload_pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path,
                             monkeypatch, sink={"changelog": {"enabled": True}},
                             staging={"retentionSeconds": 0})


def _snapshot_while_writing(pipeline: Pipeline) -> None:
    pipeline.start_slot()
    stop = threading.Event()

    def write():
        with pipeline.pgdb.connect() as conn:
            workload = Workload(conn, random.Random(1))
            while not stop.is_set():
                workload.transaction(2)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        pipeline.snapshot()
    finally:
        stop.set()
        writer.join(60)


def _source(pipeline: Pipeline, table, key: str):
    with pipeline.pgdb.connect() as conn:
        return source_rows(conn, table, key)


def _assert_equal(pipeline: Pipeline, table, key: str) -> None:
    names, rows = _source(pipeline, table, key)
    assert pipeline.mirror_rows(table, names, key) == rows


@pytest.mark.slow
def test_mirror_follows_a_random_workload_through_truncate_and_schema_changes(pipeline):
    _snapshot_while_writing(pipeline)
    checkpoints = []
    with pipeline.pgdb.connect() as conn:
        workload = Workload(conn, random.Random(2))
        for phase in range(5):
            workload.run(25)
            if phase == 1:
                workload.truncate()
            if phase == 2:
                workload.add_column()
                workload.run(10)
            if phase == 3:
                workload.drop_column()
                workload.run(10)
            checkpoints.append((lsn_now(pipeline.pgdb), _source(pipeline, MAIN, "id")))
            pipeline.seal()
            result = pipeline.apply()
            assert result.ok, result.tables
    _assert_equal(pipeline, MAIN, "id")
    _assert_equal(pipeline, KEYLESS, "a")
    _assert_equal(pipeline, IDLE, "id")

    # intermediate commits equal the source as of their lakeslot.lsn
    history = pipeline.snapshots(MAIN)
    for phase, (lsn, (names, rows)) in enumerate(checkpoints):
        # the first commit reflecting every commit before ``lsn`` (lakeslot.lsn ≥ lsn - 1)
        snapshot_id, _ = min((s for s in history if s[1] >= lsn - 1), key=lambda s: s[1])
        assert pipeline.mirror_rows(MAIN, names, version=snapshot_id) == rows, f"phase {phase}"

    # the idle table advanced with the others, without data commits
    positions = {t: pipeline.snapshots(t)[-1][1] for t in (MAIN, KEYLESS, IDLE)}
    assert positions[IDLE] == positions[MAIN] == positions[KEYLESS] >= checkpoints[-1][0] - 1

    _assert_changelog_exactly_once(pipeline)


def _assert_changelog_exactly_once(pipeline: Pipeline) -> None:
    """Every staged change of MAIN above the snapshot is in the changelog once, with no value
    left as a placeholder for an unchanged TOAST column."""
    start = pipeline.snapshots(MAIN)[0][1]
    rows = [row for name in sorted(pipeline.staged) for row in pipeline.staged[name]]
    expected = sorted((r.commit_lsn, r.seq, r.op) for r in rows
                      if r.relation is not None and r.relation.table == MAIN.name
                      and r.commit_lsn > start)
    logged = pipeline.spark.sql(
        f"SELECT _lakeslot_lsn, _lakeslot_seq, _lakeslot_op, big IS NULL AS no_big "
        f"FROM {pipeline.target(MAIN, CHANGES)}").collect()
    assert sorted((r[0], r[1], r[2]) for r in logged) == expected
    assert not [r for r in logged if r[2] in ("I", "U") and r[3]]


class Crash(BaseException):
    """A simulated process death at an injection point."""


def _crash_at(point: str, table=None):
    fired: list[str] = []

    def hook(name, at):
        if name == point and (table is None or at == table) and not fired:
            fired.append(name)
            raise Crash(point)
    return Hooks(hook), fired


CRASH_POINTS = [("batch-read", None), ("after-evolve", MAIN), ("after-changelog", MAIN),
                ("before-merge", MAIN), ("after-merge", MAIN), ("after-changelog", KEYLESS),
                ("after-tables", None), ("after-retention", None)]


@pytest.mark.slow
def test_a_crash_at_any_point_then_a_restart_loses_and_duplicates_nothing(pipeline):
    pipeline.start_slot()
    pipeline.snapshot()
    with pipeline.pgdb.connect() as conn:
        workload = Workload(conn, random.Random(3))
        for point, table in CRASH_POINTS:
            workload.run(8)
            if point == "after-evolve":
                workload.add_column()
                workload.run(3)
            pipeline.seal()
            hooks, fired = _crash_at(point, table)
            with pytest.raises(Crash):
                pipeline.apply(hooks=hooks)
            assert fired == [point]
            assert pipeline.apply().ok  # the restart
            _assert_equal(pipeline, MAIN, "id")
            _assert_equal(pipeline, KEYLESS, "a")
    _assert_changelog_exactly_once(pipeline)
    # retention (0 s) removed what every table applied, but kept where the reader resumes
    assert len(Staging(pipeline.staging).list()) == 1


def test_idle_tables_advance_and_progress_sees_it(pipeline):
    pipeline.start_slot()
    pipeline.snapshot()
    with pipeline.pgdb.connect() as conn:
        Workload(conn, random.Random(4)).insert()
    sealed = pipeline.seal()
    ended: list[apply_job.PassResult] = []
    result = pipeline.apply(on_pass=ended.append)
    assert ended == [result.last]  # each pass's outcome as it ends (benchmarks time passes so)
    states = {t.source: t.state for t in result.tables}
    assert states == {MAIN: "applied", KEYLESS: "advanced", IDLE: "advanced"}
    seen = mirror_progress.read(pipeline.ingestion, [MAIN, KEYLESS, IDLE])
    # lakeslot.lsn = L: every commit at or below L is applied; everything before ``sealed`` is
    assert {t: p.lsn >= sealed - 1 for t, p in seen.items()} == {MAIN: True, KEYLESS: True,
                                                                 IDLE: True}
    assert seen[IDLE].rows == 1
    status = Staging(pipeline.staging).read_apply_status()
    assert status is not None
    assert [t["state"] for t in status["tables"]] == ["applied", "advanced", "advanced"]
    totals = status["totals"]  # counters since the job started (the operator exports them)
    assert (totals["passes"], totals["changes"], totals["retries"]) == (1, {str(MAIN): {"I": 1}}, {})
    assert totals["seconds"]["merge"] > 0 and totals["startedAt"] <= status["updatedAt"]
    # the pass's wall time holds its steps run on the pass's own thread
    assert totals["wallSeconds"] >= totals["seconds"]["reduce"] + totals["seconds"]["scan"] > 0


def test_a_key_change_keeping_a_toast_value_set_earlier_in_the_batch_is_exact(pipeline, caplog,
                                                                              monkeypatch):
    """The executors split a key change between the old and the new key's partition; when the
    new row needs the TOASTed value an earlier change of the batch set, the table is reduced
    again in one partition (lakeslot.apply.spread) — the mirror gets that value, not the old
    one."""
    monkeypatch.setattr(spread, "SERIAL_CHANGES", 0)  # a batch this small is folded serially
    monkeypatch.setattr(spread, "ONE_TASK_CORES", 0)  # (... as are bigger ones on few cores)
    pipeline.start_slot()
    pipeline.snapshot()
    with pipeline.pgdb.connect() as conn:
        old = conn.execute(sql.SQL("SELECT min(id) FROM {}").format(MAIN.sql())).fetchone()[0]
    partitions = pipeline.spark.sparkContext.defaultParallelism
    assert partitions > 1  # else nothing is split
    new = next(k for k in range(10**6, 10**6 + 100)  # MAIN is the only table with changes: t=0
               if len({p for p, _ in routes(0, "U", str(old), str(k), partitions)}) == 2)
    with pipeline.pgdb.connect() as conn:
        conn.execute(sql.SQL("UPDATE {} SET big = repeat('N', 9000) WHERE id = %s").format(
            MAIN.sql()), (old,))
        conn.execute(sql.SQL('UPDATE {} SET id = %s, "select" = \'moved\' WHERE id = %s').format(
            MAIN.sql()), (new, old))
    pipeline.seal()
    with caplog.at_level("INFO", logger="lakeslot.apply.spread"):
        assert pipeline.apply().ok
    assert "in one partition" in caplog.text
    _assert_equal(pipeline, MAIN, "id")


def test_definite_errors_stop_their_table_only(pipeline):
    pipeline.start_slot()
    pipeline.snapshot()
    strict = pipeline.with_spec(policies={"onTruncate": "Error", "onSchemaChange": "Error"})
    with pipeline.pgdb.connect() as conn:
        workload = Workload(conn, random.Random(5))
        workload.truncate()
        workload.insert_keyless()
        conn.execute("ALTER TABLE idle ADD COLUMN w int")
        conn.execute("INSERT INTO idle VALUES (2, 'b', 3)")
    pipeline.seal()
    result = strict.apply()
    outcome = {t.source: t for t in result.tables}
    assert outcome[MAIN].state == "failed" and "onTruncate is Error" in outcome[MAIN].error
    assert outcome[IDLE].state == "failed" and "onSchemaChange is Error" in outcome[IDLE].error
    assert "added ['w']" in outcome[IDLE].error
    assert outcome[KEYLESS].state == "applied"
    _assert_equal(pipeline, KEYLESS, "a")
    properties = dict(pipeline.spark.sql(f"SHOW TBLPROPERTIES {pipeline.target(MAIN)}").collect())
    assert "onTruncate is Error" in properties[ERROR_PROPERTY]
    assert properties[RESNAPSHOT_PROPERTY] == "true"
    status = Staging(pipeline.staging).read_apply_status()
    assert status is not None
    assert status["tables"][0]["state"] == "failed" and status["tables"][0]["resnapshotRequired"]
    seen = mirror_progress.read(pipeline.ingestion, [MAIN, KEYLESS])
    main_error = seen[MAIN].error
    assert main_error is not None
    assert "onTruncate is Error" in main_error and seen[MAIN].resnapshot_required
    assert seen[KEYLESS].error is None

    # the error stays in force on the next pass; the other tables keep going
    with pipeline.pgdb.connect() as conn:
        Workload(conn, random.Random(6)).insert_keyless()
    pipeline.seal()
    again = {t.source: t for t in strict.apply().tables}
    assert again[MAIN].state == "failed" and again[KEYLESS].state == "applied"

    # a recorded error stays in force under another policy too: the way out is a re-snapshot
    assert {t.source: t for t in pipeline.apply().tables}[IDLE].state == "failed"


def test_type_changes_mark_the_table_for_resnapshot_even_a_widening(pipeline):
    """A widening (int → bigint) would be promotable in Iceberg, but ALTER … TYPE rewrites the
    table and a USING expression may have changed every value without a row change: without
    the event trigger's knowledge of the statement, both go to a re-snapshot."""
    pipeline.start_slot()
    pipeline.snapshot()
    with pipeline.pgdb.connect() as conn:
        conn.execute("ALTER TABLE idle ADD COLUMN n int")
        conn.execute("INSERT INTO idle VALUES (2, 'b', 7)")
        conn.execute("ALTER TABLE idle ALTER COLUMN n TYPE bigint")
        conn.execute("INSERT INTO idle VALUES (3, 'c', 8000000000)")
        conn.execute(f'ALTER TABLE {KEYLESS} ALTER COLUMN b TYPE int USING length(b)')
        conn.execute(f"UPDATE {KEYLESS} SET b = 5 WHERE a = 1")
    pipeline.seal()
    outcome = {t.source: t for t in pipeline.apply().tables}
    for table in (IDLE, KEYLESS):
        error = outcome[table].error
        assert outcome[table].state == "failed" and outcome[table].resnapshot, outcome[table]
        assert error is not None and "changed type" in error, error
    assert outcome[MAIN].state in ("applied", "advanced")


def test_never_mode_creates_empty_mirrors_and_a_missing_toast_value_is_a_definite_error(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    with pgdb.connect() as conn:
        create_tables(conn, rows=3)
    staging = (tmp_path / "staging").as_uri()
    pipeline = Pipeline.create(
        spark, pgdb, spark_warehouse, iceberg_namespace, staging, [MAIN, KEYLESS],
        table_options={KEYLESS: {"keyColumns": ["a"]}}, snapshot={"mode": "never"})
    pipeline.start_slot()
    with pgdb.connect() as conn:
        workload = Workload(conn, random.Random(7))
        workload.insert()
        workload.update_keyless()  # REPLICA IDENTITY FULL: the old tuple carries big
        conn.execute(f'UPDATE {MAIN} SET "select" = \'z\' WHERE id = 1')  # row not mirrored
    pipeline.seal()
    outcome = {t.source: t for t in pipeline.apply().tables}
    main_error = outcome[MAIN].error
    assert main_error is not None
    assert outcome[MAIN].state == "failed" and "REPLICA IDENTITY FULL" in main_error
    assert outcome[KEYLESS].state == "applied"
    names, rows = _source(pipeline, KEYLESS, "a")
    changed = [r for r in rows if r[1].startswith("c")]
    assert pipeline.mirror_rows(KEYLESS, names, "a") == changed  # only rows changed since


def test_initial_mode_waits_for_the_snapshot_and_keeps_every_segment(pipeline):
    pipeline.start_slot()
    with pipeline.pgdb.connect() as conn:
        Workload(conn, random.Random(8)).run(3)
    pipeline.seal()
    result = pipeline.apply()
    assert {t.state for t in result.tables} == {"waiting"} and result.ok
    assert Staging(pipeline.staging).list()  # retention waits for the snapshot
    pipeline.snapshot()
    assert pipeline.apply().ok
    _assert_equal(pipeline, MAIN, "id")


@pytest.mark.all_versions  # (each server version writes some types' text differently)
def test_every_type_streams_into_iceberg_value_by_value(spark, spark_warehouse, iceberg_namespace,
                                                        pgdb, tmp_path, monkeypatch):
    """The same values as the snapshot's type test, but through pgoutput text and MERGE (or
    the driver's row delta: tests/test_small_batches.py)."""
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    columns = _columns(pgdb)
    with pgdb.connect() as conn:
        _create(conn, columns)
    stream_every_type(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, columns)


def stream_every_type(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, columns
                      ) -> Pipeline:
    """Table ``T`` with the type test's ``columns`` (rows 1 and 2 in it), snapshotted; then row 3
    streams row 1's values, row 4 NULLs and row 2 turns into row 1, one apply pass applies
    them, and the mirror (read by pyiceberg) holds each value with its type."""
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), [T])
    pipeline.start_slot()
    pipeline.snapshot()
    names = sql.SQL(", ").join(sql.Identifier(c[0]) for c in columns)
    with pgdb.connect() as conn:
        conn.execute(sql.SQL("INSERT INTO {} (id, {}) SELECT id + 2, {} FROM {} WHERE id IN (1, 2)")
                     .format(T.sql(), names, names, T.sql()))
        conn.execute(sql.SQL("UPDATE {} t SET ({}) = (SELECT {} FROM {} WHERE id = 1) WHERE t.id = 2")
                     .format(T.sql(), names, names, T.sql()))
    pipeline.seal()
    [outcome] = pipeline.apply().tables
    assert outcome.state == "applied", outcome.error
    rows = mirror_rows(spark_warehouse, iceberg_namespace, pipeline.job_input().names.mirror_table(T))
    assert [r["id"] for r in rows] == [1, 2, 3, 4]
    for name, type_, _literal, expected in columns:
        for row in (rows[1], rows[2]):
            assert _equal(row[name], expected), (name, type_, row["id"], row[name])
        assert rows[3][name] is None, (name, type_)
    return pipeline


def test_a_table_cut_off_from_staging_stops_until_its_resnapshot(pipeline):
    """Changes between a table's position and the first staged segment are gone (a recreated
    slot, segments deleted by hand): each such table stops with the way out, nothing is applied
    across the hole, and a re-snapshot brings it back equal."""
    pipeline.start_slot()
    pipeline.snapshot()
    store = Staging(pipeline.staging)
    with pipeline.pgdb.connect() as conn:
        workload = Workload(conn, random.Random(11))
        workload.transaction(3)
        pipeline.seal()
        assert pipeline.apply().ok
        kept = set(store.list())
        workload.transaction(3)
        pipeline.seal()
        lost = set(store.list()) - kept
        workload.transaction(3)
        pipeline.seal()
    for name in kept | lost:
        store.delete(name)
    before = pipeline.snapshots(MAIN)
    outcome = {t.source: t for t in pipeline.apply().tables}
    assert {t: o.state for t, o in outcome.items()} == {MAIN: "failed", KEYLESS: "failed",
                                                        IDLE: "failed"}
    assert "the changes in between are gone" in outcome[MAIN].error and outcome[MAIN].resnapshot
    assert pipeline.snapshots(MAIN) == before  # nothing applied across the hole

    resnapshot = pipeline.with_spec(snapshot={"resnapshotGeneration": 1})
    resnapshot.snapshot()
    resnapshot.seal()
    assert {t.state for t in resnapshot.apply().tables} <= {"applied", "advanced", "current"}
    _assert_equal(pipeline, MAIN, "id")
    _assert_equal(pipeline, KEYLESS, "a")


def test_old_snapshots_are_expired_by_the_tables_own_settings(pipeline):
    """A commit per pass must not pile up: snapshots older than the table's
    history.expire.max-snapshot-age-ms go (the last one always stays), metadata files are
    rotated, and the data is untouched."""
    keep_briefly = {"history.expire.max-snapshot-age-ms": "1", "history.expire.min-snapshots-to-keep": "2"}
    pipeline = pipeline.with_spec(sink={"tableProperties": keep_briefly})
    pipeline.start_slot()
    pipeline.snapshot()

    def passes(pipeline: Pipeline, seed: int, count: int) -> None:
        with pipeline.pgdb.connect() as conn:
            workload = Workload(conn, random.Random(seed))
            for _ in range(count):
                workload.transaction(2)
                pipeline.seal()
                assert pipeline.apply(expire_interval_s=0).ok

    passes(pipeline, 12, 4)
    properties = pipeline.spark.sql(f"SHOW TBLPROPERTIES {pipeline.target(MAIN)}").collect()
    assert {r.key: r.value for r in properties}["write.metadata.delete-after-commit.enabled"] == "true"
    # (each run's first cut is retained: its snapshots are tagged, and kept beside the others)
    assert len(_untagged(pipeline, MAIN)) <= 2 and len(_untagged(pipeline, IDLE)) <= 2
    _assert_equal(pipeline, MAIN, "id")
    assert pipeline.snapshots(MAIN, CHANGES) and len(pipeline.snapshots(MAIN, CHANGES)) <= 2
    # Without a maximum age of its own, a table keeps every snapshot of RECENT_PASSES passes
    # (100 s at a trigger of 1 s): the fresh snapshots stay; asked for an age of 0, all but
    # min-snapshots-to-keep (and the tagged ones) go.
    pipeline.spark.sql(f"ALTER TABLE {pipeline.target(MAIN)} UNSET TBLPROPERTIES "
                       "('history.expire.max-snapshot-age-ms')")
    fast = pipeline.with_spec(apply={"triggerIntervalSeconds": 1})
    before = pipeline.snapshots(MAIN)
    passes(fast, 13, 2)
    after = pipeline.snapshots(MAIN)
    assert set(before) <= set(after) and len(after) == len(before) + 2
    assert contract.history_age_s(1) == 100 and contract.history_age_s(60) == 6000
    assert contract.history_age_s(86400) == contract.ICEBERG_MAX_SNAPSHOT_AGE_S
    Tables(pipeline.spark, *pipeline.namespace.split(".", 1)).expire_snapshots(
        fast.job_input().names.mirror_table(MAIN), 0)
    assert len(_untagged(pipeline, MAIN)) <= 2
    _assert_equal(pipeline, MAIN, "id")


def _untagged(pipeline: Pipeline, table: TableName) -> list[tuple[int, int]]:
    """The table's snapshots but those lakeslot tagged for a retained cut."""
    tagged = {r.snapshot_id for r in pipeline.spark.sql(
        f"SELECT snapshot_id FROM {pipeline.target(table)}.refs "
        f"WHERE name LIKE '{contract.CUT_TAG_PREFIX}%'").collect()}
    return [s for s in pipeline.snapshots(table) if s[0] not in tagged]


def test_columns_added_with_a_default_get_it_in_existing_rows_even_after_a_crash(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    """PostgreSQL gives existing rows an added column's default without logging a change (its
    "missing value"); the mirror must show it too, and a crash right after the column was added
    must not lose it (nor, after the fill, overwrite newer values)."""
    table = TableName("public", "Defaults")
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    with pgdb.connect() as conn:
        conn.execute('CREATE TABLE "Defaults" (id int PRIMARY KEY, v text)')
        conn.execute("""INSERT INTO "Defaults" SELECT g, 'v' || g FROM generate_series(1, 5) g""")
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), [table])
    pipeline.start_slot()
    pipeline.snapshot()
    with pgdb.connect() as conn:
        conn.execute('ALTER TABLE "Defaults" ADD COLUMN n numeric(6,2) DEFAULT 1.5,'
                     ' ADD COLUMN "a b" text[] DEFAULT \'{"x y",z}\', ADD COLUMN plain int')
        conn.execute("""INSERT INTO "Defaults" VALUES (6, 'new', 2.25, '{q}', 7)""")
        conn.execute("""UPDATE "Defaults" SET n = 9 WHERE id = 2""")
    pipeline.seal()

    def crash(point, _table):
        if point == "after-evolve":
            raise Crash("crash right after the columns were added")

    with pytest.raises(Crash):
        pipeline.apply(hooks=Hooks(crash))
    assert pipeline.apply().ok
    names, rows = _source(pipeline, table, "id")
    assert pipeline.mirror_rows(table, names, "id") == rows
    assert [r[names.index("n")] for r in rows][:3] == [pytest.approx(1.5), 9, pytest.approx(1.5)]


@pytest.mark.slow
@pytest.mark.parametrize("restartable_pgdb", ["pg18"], indirect=True)
def test_a_postgresql_restart_between_passes_is_ridden_out(restartable_pgdb, spark, spark_warehouse,
                                                           iceberg_namespace, tmp_path,
                                                           monkeypatch):
    """The long-running apply job's source connection dies with PostgreSQL restarting between
    two passes; the next pass reconnects (reading lakeslot's DDL messages is retried like a
    table's work) instead of the job failing with AdminShutdown — the chaos suite found it."""
    db = restartable_pgdb
    pipeline = workload_pipeline(spark, spark_warehouse, iceberg_namespace, db, tmp_path,
                                 monkeypatch, apply={"triggerIntervalSeconds": 1})
    pipeline.start_slot()
    pipeline.snapshot()
    with db.connect() as conn:
        Workload(conn, random.Random(31)).run(4)
    pipeline.seal()
    stop, passes = threading.Event(), []

    def point(name, _table):
        if name != "after-tables":
            return
        passes.append(name)
        if len(passes) == 1:  # the pass used the connection; PostgreSQL restarts under it
            db.cluster.restart()
            with db.connect() as conn:
                Workload(conn, random.Random(32)).run(4)
            pipeline.seal()
        else:
            stop.set()

    result = apply_job.run(spark, pipeline.job_input(), once=False, stop=stop, hooks=Hooks(point))
    assert len(passes) == 2 and result.ok, result.tables
    for table in (MAIN, KEYLESS):
        assert_mirror_equals_source(pipeline, spark_warehouse, table)


def _threads_at(point: str) -> tuple[Hooks, set[str]]:
    """Hooks recording the names of the threads that reach ``point``."""
    seen: set[str] = set()

    def hook(name, at):
        if name == point:
            seen.add(threading.current_thread().name)
    return Hooks(hook), seen


@pytest.mark.slow
def test_tables_applied_at_once_each_stay_exact_through_crashes(spark, spark_warehouse,
                                                                iceberg_namespace, pgdb, tmp_path,
                                                                monkeypatch):
    """``apply.tableParallelism``: the tables' MERGEs and commits in flight together, each its
    own; a crash in one table's thread ends the pass once the others are done, and the restart
    takes exactly what each table lacks (its own position), the changelog included."""
    pipeline = workload_pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path,
                                 monkeypatch, sink={"changelog": {"enabled": True}},
                                 staging={"retentionSeconds": 0}, apply={"tableParallelism": 3})
    pipeline.start_slot()
    pipeline.snapshot()
    with pipeline.pgdb.connect() as conn:
        workload = Workload(conn, random.Random(5))
        for point, table in [("before-merge", KEYLESS), ("after-merge", MAIN),
                             ("after-changelog", MAIN), (None, None)]:
            workload.run(10)
            pipeline.seal()
            if point is not None:
                hooks, fired = _crash_at(point, table)
                with pytest.raises(Crash):
                    pipeline.apply(hooks=hooks)
                assert fired == [point]
            hooks, threads = _threads_at("before-merge")  # where each table's MERGE ran
            result = pipeline.apply(hooks=hooks)
            assert result.ok, result.tables
            if point is None:  # (after a crash, the restart may have one table left to merge)
                assert len(threads) >= 2 and all(t.startswith("lakeslot-apply") for t in threads), threads
            for each, key in ((MAIN, "id"), (KEYLESS, "a"), (IDLE, "id")):
                _assert_equal(pipeline, each, key)
    _assert_changelog_exactly_once(pipeline)
    for each in (MAIN, KEYLESS, IDLE):  # every commit, from whichever thread, records its position
        unmarked = pipeline.spark.sql(f"SELECT count(*) FROM {pipeline.target(each)}.snapshots "
                                      "WHERE summary['lakeslot.lsn'] IS NULL").collect()[0][0]
        assert unmarked == 0, each
