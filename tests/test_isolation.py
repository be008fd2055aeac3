"""One table can never corrupt or stall another (issue 32, DESIGN.md "Isolation"), against real
PostgreSQL, the real reader, snapshot and apply jobs, Spark and Iceberg; every mirror is compared
row by row with its source through pyiceberg, not through the code under test.

- Failures planted in one table of three, each kind the apply job can meet: a statement Spark
  cannot resolve (a real AnalysisException, raised in that table's pass), a MERGE Iceberg's writer
  refuses pass after pass (a real table property it rejects), a maintenance run that fails, and
  the batch's reduction failing for that table (injected: no input makes the real reduction fail
  for one table alone, so ``spread.reduce`` is wrapped to fail whenever that table is among its
  tables, on the executors or the driver). While the table is failed the others are applied and
  equal their sources, and the failure is recorded on its mirror (every status shows it); after
  the fix it catches up exactly.
  On the same pipeline: passes failing as a whole (staging listing injected to fail) are counted
  and degraded, and a mirror recorded as another source table's is neither written nor replaced.
- Tables whose names differ only in case or script, columns that differ only in case, and two
  tables that would map to one mirror name, selected by schema, in ``lakeslot run``; there, one
  table's MERGE failing (a real table property Iceberg's writer refuses) leaves the others
  applied, and the next run after the fix catches it up.
"""

from __future__ import annotations

import datetime as dt
import random
import threading

import pytest

from lakeslot import workloads
from lakeslot.api.naming import TableName
from lakeslot.apply import isolation, spread
from lakeslot.apply import job as apply_job
from lakeslot.apply.job import Hooks
from lakeslot.local import observe
from lakeslot.mirror import progress
from lakeslot.mirror.contract import ERROR_PROPERTY, OWNER_PROPERTY, SOURCE_OID_PROPERTY, SOURCE_TABLE_PROPERTY
from lakeslot.staging import apply_status
from lakeslot.staging.store import Staging
from spark_jobs import snapshot as snapshot_entry
from tests.support import local_support
from tests.support.apply_support import assert_equal_to_source, assert_mirror_equals_source, workload_pipeline
from tests.support.apply_workload import IDLE, KEYLESS, MAIN, Workload

OTHERS = (KEYLESS, IDLE)


class _Planted:
    """One table's failures and what the others did meanwhile."""

    def __init__(self, pipeline, warehouse, pgdb) -> None:
        self.pipeline, self.warehouse, self.pgdb = pipeline, warehouse, pgdb
        self.rng = random.Random(32)

    def change(self, transactions: int = 6) -> None:
        with self.pgdb.connect() as conn:
            Workload(conn, self.rng).run(transactions)
        self.pipeline.seal()

    def failed_alone(self, result: apply_job.ApplyResult, state: str = "failed") -> str:
        outcomes = {t.source: t for t in result.tables}
        assert outcomes[MAIN].state == state, outcomes[MAIN]
        assert all(outcomes[t].state in ("applied", "advanced", "current") for t in OTHERS), \
            result.tables
        for table in OTHERS:
            assert_mirror_equals_source(self.pipeline, self.warehouse, table)
        recorded = progress.read(self.pipeline.ingestion, [MAIN])[MAIN]
        assert recorded.error is not None and recorded.error == outcomes[MAIN].error
        return recorded.error

    def caught_up(self) -> None:
        self.change()
        result = self.pipeline.apply()
        assert result.ok, result.tables
        for table in (MAIN, *OTHERS):
            assert_mirror_equals_source(self.pipeline, self.warehouse, table)
        assert progress.read(self.pipeline.ingestion, [MAIN])[MAIN].error is None


@pytest.mark.slow
@pytest.mark.one_version
def test_one_table_failing_never_stalls_or_corrupts_the_others(
        pgdb, spark, spark_warehouse, iceberg_namespace, tmp_path, monkeypatch):
    pipeline = workload_pipeline(spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path,
                                 monkeypatch, apply={"triggerIntervalSeconds": 1})
    pipeline.start_slot()
    pipeline.snapshot()
    planted = _Planted(pipeline, spark_warehouse, pgdb)

    # a statement of that table's pass Spark cannot resolve: failed at once, tried again later
    def unresolvable(point, table):
        if point == "before-merge" and table == MAIN:
            spark.sql(f"SELECT `no such column` FROM {pipeline.target(MAIN)}").collect()

    planted.change()
    error = planted.failed_alone(pipeline.apply(hooks=Hooks(unresolvable)))
    assert "AnalysisException" in error and "tried again at" in error
    planted.caught_up()

    # Iceberg's writer refuses the table's MERGE pass after pass (a Java error, which alone
    # looks transient): retried, then failed alone once it kept failing while others passed
    spark.sql(f"ALTER TABLE {pipeline.target(MAIN)} SET TBLPROPERTIES "
              "('write.parquet.compression-codec'='nonsense')")
    planted.change()
    stop, passes = threading.Event(), []

    def count(point, _table):
        if point == "after-tables":
            passes.append(point)
            if len(passes) == isolation.TRANSIENT_STREAK:
                stop.set()

    result = apply_job.run(spark, pipeline.job_input(), once=False, stop=stop, hooks=Hooks(count),
                           max_attempts=1)
    error = planted.failed_alone(result)
    assert "nonsense" in error or "Py4JJavaError" in error
    spark.sql(f"ALTER TABLE {pipeline.target(MAIN)} UNSET TBLPROPERTIES "
              "('write.parquet.compression-codec')")
    planted.caught_up()

    # its maintenance fails
    def broken_maintenance(point, table):
        if point == "before-maintenance" and table == MAIN:
            raise RuntimeError("planted: the compaction cannot run")

    planted.change()
    error = planted.failed_alone(pipeline.apply(hooks=Hooks(broken_maintenance)))
    assert "maintenance of" in error and "planted" in error
    planted.caught_up()

    # the batch's reduction fails for that table: narrowed down, the others are applied
    real_reduce = spread.reduce

    def reduce_failing_for_main(spark_, uri, batch, configs, **how):
        if any(c.table == MAIN for c in configs):
            raise RuntimeError("planted: the reduction fails for this table")
        return real_reduce(spark_, uri, batch, configs, **how)

    monkeypatch.setattr(spread, "reduce", reduce_failing_for_main)
    planted.change()
    error = planted.failed_alone(pipeline.apply())
    assert "planted: the reduction fails" in error
    monkeypatch.setattr(spread, "reduce", real_reduce)
    planted.caught_up()

    # (the same pipeline, to share its set-up: the suite's time)
    _passes_failing_as_a_whole_are_counted_and_degraded(pipeline, monkeypatch)
    _a_mirror_owned_by_another_source_table_is_never_written(pipeline, spark, spark_warehouse,
                                                             pgdb)


def _passes_failing_as_a_whole_are_counted_and_degraded(pipeline, monkeypatch) -> None:
    """Not one table's problem (here: staging cannot be listed): the job raises as before, and
    the status document counts the failures across runs, degraded after a few in a row; the
    first pass that works drops the count."""
    assert pipeline.apply().ok
    staging = Staging(pipeline.staging)
    real_scan = spread.scan

    def unreachable(*_args, **_kwargs):
        raise OSError("planted: staging unreachable")

    monkeypatch.setattr(spread, "scan", unreachable)
    for attempt in range(1, apply_status.DEGRADED_AFTER + 1):
        assert apply_status.degraded_message(staging.read_apply_status()) is None
        with pytest.raises(OSError, match="planted"):
            pipeline.apply()
        assert apply_status.PassFailures.of(staging.read_apply_status()).count == attempt
    message = apply_status.degraded_message(staging.read_apply_status())
    assert message is not None and "planted: staging unreachable" in message
    assert f"{apply_status.DEGRADED_AFTER} times in a row" in message
    monkeypatch.setattr(spread, "scan", real_scan)
    assert pipeline.apply().ok
    assert apply_status.PassFailures.of(staging.read_apply_status()).count == 0


def _a_mirror_owned_by_another_source_table_is_never_written(pipeline, spark, warehouse,
                                                             pgdb) -> None:
    target = pipeline.target(IDLE)

    def properties() -> dict[str, str]:
        return {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {target}").collect()}

    recorded = properties()
    assert recorded[OWNER_PROPERTY] == pipeline.job_input().names.owner
    assert recorded[SOURCE_TABLE_PROPERTY] == str(IDLE) and int(recorded[SOURCE_OID_PROPERTY]) > 0
    other = TableName("public", "Other")
    spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ('{SOURCE_TABLE_PROPERTY}'='{other}')")
    with pgdb.connect() as conn:
        conn.execute("INSERT INTO idle VALUES (2, 'new')")
        Workload(conn, random.Random(5)).run(3)
    pipeline.seal()
    before = pipeline.mirror_rows(IDLE, ["id", "v"])
    outcomes = {t.source: t for t in pipeline.apply().tables}
    assert outcomes[IDLE].state == "failed"
    error = outcomes[IDLE].error or ""
    assert str(other) in error and str(IDLE) in error and "mirrorName" in error
    assert pipeline.mirror_rows(IDLE, ["id", "v"]) == before  # not written
    assert ERROR_PROPERTY not in properties()  # nor marked: it is not this table's
    for table in (MAIN, KEYLESS):
        assert outcomes[table].state == "applied"
        assert_mirror_equals_source(pipeline, warehouse, table)
    resnapshot = pipeline.with_spec(snapshot={"resnapshotGeneration": 1})
    argv = pipeline.arguments(workloads.snapshot_invocation(resnapshot.ingestion, [IDLE]))
    assert snapshot_entry.main(argv, spark=spark) != 0  # the snapshot refuses to replace it
    assert pipeline.mirror_rows(IDLE, ["id", "v"]) == before
    spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ('{SOURCE_TABLE_PROPERTY}'='{IDLE}')")
    assert pipeline.apply().ok
    assert_mirror_equals_source(pipeline, warehouse, IDLE)


def test_pass_failures_count_since_the_first():
    now = dt.datetime(2026, 11, 27, 9, 0, tzinfo=dt.UTC)
    failures = apply_status.PassFailures()
    for minute in range(apply_status.DEGRADED_AFTER):
        assert not failures.degraded
        failures = failures.failed(f"OSError: {minute}", now + dt.timedelta(minutes=minute))
    assert failures.degraded and failures.since == "2026-11-27T09:00:00Z"
    assert failures.error == f"OSError: {apply_status.DEGRADED_AFTER - 1}"
    again = apply_status.PassFailures.of({apply_status.FAILED_PASSES: failures.document()})
    assert again == failures
    assert apply_status.PassFailures.of({}) == apply_status.PassFailures()


def test_a_failed_table_waits_longer_each_time_within_a_bound():
    delays = [isolation.retry_delay_s(n) for n in range(1, 10)]
    assert delays == sorted(delays) and delays[0] == isolation.RETRY_BASE_S
    assert max(delays) == isolation.RETRY_MAX_S
    halves = isolation.halves([1, 2, 3, 4, 5])
    assert list(halves[0]) + list(halves[1]) == [1, 2, 3, 4, 5] and len(halves[0]) == 2


# names ------------------------------------------------------------------------------------

USERS, users = TableName("app", "Users"), TableName("app", "users")
CASES = TableName("app", "cases")
CYRILLIC = (TableName("app", "таблица"), TableName("app", "столбец"))
AMBIGUOUS = (TableName("app__x", "y"), TableName("app", "x__y"))  # both read app__x__y: one is hashed


@pytest.mark.slow
def test_names_that_differ_in_case_or_script_or_meet_at_the_separator_get_their_own_mirrors(
        pgdb, spark, spark_warehouse, tmp_path):
    with pgdb.connect() as conn:
        conn.execute('CREATE SCHEMA app; CREATE SCHEMA "app__x"')
        for table in (USERS, users, *CYRILLIC):
            conn.execute(f'CREATE TABLE {table} (id int PRIMARY KEY, name text)')
        conn.execute(f'CREATE TABLE {CASES} ("Id" int PRIMARY KEY, id int, "ID" text)')
        for table in AMBIGUOUS:
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
            conn.execute(f"INSERT INTO {table} SELECT generate_series(1, 5)")
        conn.execute('INSERT INTO app."Users" SELECT i, \'U\' || i FROM generate_series(1, 50) i')
        conn.execute("INSERT INTO app.users SELECT i, 'u' || i FROM generate_series(1, 71) i")
        for i, table in enumerate(CYRILLIC):
            conn.execute(f"INSERT INTO {table} SELECT g, %s || g FROM generate_series(1, 20) g",
                         (f"т{i}",))
        conn.execute(f'INSERT INTO {CASES} SELECT g, -g, \'v\' || g FROM generate_series(1, 30) g')
    path = tmp_path / "ingestion.yaml"
    document = local_support.write_ingestion(path, pgdb, [], tmp_path, warehouse=spark_warehouse,
                                             source={"tables": [], "schemas": ["app", "app__x"]})
    assert document["spec"]["source"]["schemas"] == ["app", "app__x"]
    local = local_support.local(path, pgdb, tmp_path / "state")
    local_support.run_in_process(local, spark, once=True)
    with pgdb.connect() as conn:
        conn.execute('UPDATE app."Users" SET name = name || \'!\' WHERE id <= 10')
        conn.execute("DELETE FROM app.users WHERE id > 60")
        conn.execute("INSERT INTO app.users VALUES (100, 'new')")
        conn.execute(f'UPDATE {CASES} SET id = id * 10, "ID" = upper("ID") WHERE "Id" % 3 = 0')
        conn.execute(f'DELETE FROM {CASES} WHERE "Id" > 25')
        conn.execute(f"UPDATE {CYRILLIC[1]} SET name = 'ё' WHERE id < 5")
    # one table's MERGE fails in Iceberg's writer (a property it refuses): the run says so and
    # exits 1, the others are applied; after the fix the next run catches it up exactly
    broken = local_support.mirror_name(local, users)
    spark.sql(f"ALTER TABLE {broken} SET TBLPROPERTIES ('write.parquet.compression-codec'='bad')")
    result, _ = local_support.run_in_process(local, spark, once=True, expect=1)
    assert str(users) in result.message and "bad" in result.message, result.message
    for table in (USERS, CASES, *CYRILLIC):
        assert_equal_to_source(pgdb, spark_warehouse.as_uri(),
                               local.job.names.mirror_identifier(table), table)
    spark.sql(f"ALTER TABLE {broken} UNSET TBLPROPERTIES ('write.parquet.compression-codec')")
    local_support.run_in_process(local, spark, once=True)
    names = local.job.names
    mirrored = [USERS, users, CASES, *CYRILLIC, *AMBIGUOUS]
    assert len({names.mirror_table(t) for t in mirrored}) == len(mirrored)
    for table in mirrored:
        assert_equal_to_source(pgdb, spark_warehouse.as_uri(), names.mirror_identifier(table),
                               table)
    status = observe.observe(local, observe.Activity(run_active=False))
    rows = {TableName(r.schema_name, r.name): r for r in status.tables}
    for table in mirrored:
        assert rows[table].state == "Streaming", rows[table]
