"""A backlog of a million changes (PostgreSQL 15 and 18): the apply job reduces it on the
executors over several key partitions (lakeslot.apply.spread's parallel path: shuffle, sort,
fold per partition, key changes split between partitions), and the mirror then equals the
source, every column of every row, read with pyiceberg. The changes are what an application
does to a big table — 70% updates of random rows (a tenth of them changing the key), 20%
inserts, 10% deletes, in transactions of 1,000 — with a TOASTed column left unchanged by most
updates.

The same backlog also goes through the one-task path (``spread._OneTask``: the latest-change
path's steps in one task, no shuffle — what a job of few cores runs), and through that path
replicated over the cores (each task groups every key, reads back its share of the winners; the
first folds the entangled keys: what such a job runs for a large batch).

CI runs it with 200,000 changes on the parallel path and 20,000 on the one-task paths (within the
suite's time budget); the million, on both, is ``LAKESLOT_TEST_ALL_VERSIONS=1
LAKESLOT_BACKLOG_CHANGES=1000000 ./dev test tests/test_apply_backlog.py`` (PostgreSQL 15 and 18)."""

from __future__ import annotations

import os
import random

import pytest

from lakeslot.api.naming import TableName
from lakeslot.apply import spread
from tests.support.apply_support import Pipeline, assert_mirror_equals_source, lsn_now
from tests.support.reader_support import read_until

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

BIG = TableName("public", "big")
ROWS = 100_000
LONGER = os.environ.get("LAKESLOT_BACKLOG_CHANGES")
CHANGES = int(LONGER or "200000")


def _backlog(conn, rng: random.Random, changes: int) -> int:
    written, next_id = 0, ROWS + 1
    while written < changes:
        ids = [rng.randint(1, next_id) for _ in range(800)]
        updates, moved, deletes = ids[:630], ids[630:700], ids[700:]
        with conn.transaction():
            written += conn.execute(
                "UPDATE big SET qty = qty + 1, note = md5(id::text) WHERE id = ANY(%s)",
                (updates,)).rowcount
            written += conn.execute(  # key changes: the TOASTed doc stays unchanged
                "UPDATE big SET id = id + 10000000 WHERE id = ANY(%s) AND id < 10000000",
                (moved,)).rowcount
            written += conn.execute(
                "INSERT INTO big SELECT g, 0, 'new', NULL FROM generate_series(%s::int8, %s::int8) g",
                (next_id, next_id + 199)).rowcount
            written += conn.execute("DELETE FROM big WHERE id = ANY(%s)", (deletes,)).rowcount
        next_id += 200
    return written


@pytest.mark.slow
@pytest.mark.parametrize("copies", [0, 1, 2], ids=["parallel", "one-task", "replicated"])
def test_a_large_backlog_is_reduced_on_the_executors_and_the_mirror_equals_the_source(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch, copies):
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    one_task = copies > 0
    changes = 20_000 if one_task and not LONGER else CHANGES
    if one_task:  # (whatever this machine's cores)
        monkeypatch.setattr(spread, "ONE_TASK_LATEST_CHANGES", 1)
        monkeypatch.setattr(spread, "ONE_TASK_CORES", 1 << 20)
        monkeypatch.setattr(spread, "REPLICATED_CHANGES", 1 if copies > 1 else 1 << 40)
        assert copies == 1 or spark.sparkContext.defaultParallelism == copies  # (local[2])
    else:  # (on a machine of few cores, one task would take it)
        monkeypatch.setattr(spread, "ONE_TASK_CORES", 0)
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, qty int, note text, doc text)")
        conn.execute("ALTER TABLE big ALTER COLUMN doc SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO big SELECT g, 0, md5(g::text),"
                     " CASE WHEN g %% 100 = 0 THEN repeat(md5(g::text), 100) END"
                     " FROM generate_series(1, %s) g", (ROWS,))
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), [BIG],
                               staging={"retentionSeconds": 0})
    pipeline.start_slot()
    pipeline.snapshot()
    with pgdb.connect(autocommit=True) as conn:
        written = _backlog(conn, random.Random(5), changes)
    read_until(pgdb, pipeline.staging, lsn_now(pgdb))
    assert written >= changes
    if one_task:
        assert written <= max(spread.SERIAL_CHANGES, spread.ONE_TASK_MAX_CHANGES)  # one task
    else:
        assert written > spread.SERIAL_CHANGES  # the parallel path, over several partitions
    result = pipeline.apply()
    assert result.ok, result.tables
    assert_mirror_equals_source(pipeline, spark_warehouse, BIG)
