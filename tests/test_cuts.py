"""Consistent reads across mirror tables (``lakeslot cut``): reading every table at its snapshot of
one cut sees each source transaction whole, where reading each table's latest snapshot may not.

Real PostgreSQL 15 and 18, the real reader (``lakeslot reader``, as a process) and the apply job on
the tests' Spark session with Iceberg; the mirrors are read with pyiceberg, as a query engine
would read them. The source keeps an invariant across two tables (money moved between them in one
transaction); it must hold at every cut. On the way, ``lakeslot status`` (the local status model)
reports how far behind the staged, not yet applied transfers leave each table, and 0 once applied.
"""

from __future__ import annotations

import json
import subprocess

import pyarrow.compute as pc
import pytest
import yaml
from psycopg import sql

from lakeslot import workloads
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.apply import job as apply_job
from lakeslot.local import observe
from lakeslot.local.pgcluster import free_port
from lakeslot.mirror import catalogs, cuts
from tests.support import local_support
from tests.support.reader_support import current_lsn
from tests.support.waiting import wait_for

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

A, B = TableName("public", "wallet_a"), TableName("public", "wallet_b")
ROWS, START = 40, 1_000
TOTAL = 2 * ROWS * START


def test_cuts_are_the_lsns_every_table_holds():
    histories = {A: {10: (1, 100), 20: (2, 200), 30: (3, 300)},
                 B: {10: (11, 150), 30: (13, 350), 40: (14, 400)}}
    found = cuts.cuts(histories)
    assert found == [cuts.Cut(10, 150, {A: 1, B: 11}), cuts.Cut(30, 350, {A: 3, B: 13})]
    assert cuts.choose(found).lsn == 30
    assert cuts.choose(found, at_lsn=29).lsn == 10 and cuts.choose(found, at_lsn=30).lsn == 30
    assert cuts.choose(found, at_ms=349).lsn == 10  # the cut at 30 became readable at 350
    with pytest.raises(cuts.NoCut, match="the oldest is at LSN 10"):
        cuts.choose(found, at_lsn=9)
    assert cuts.cuts({A: histories[A], B: {}}) == []


def _transfers(db, count: int) -> None:
    """Transactions moving money from a row of A to a row of B (one statement per table)."""
    with db.connect() as conn:
        for i in range(count):
            with conn.transaction():
                conn.execute("UPDATE wallet_a SET balance = balance - %s WHERE id = %s", (i + 1, i % ROWS))
                conn.execute("UPDATE wallet_b SET balance = balance + %s WHERE id = %s", (i + 1, (i * 7) % ROWS))


def _total(local, snapshots: dict[TableName, int | None]) -> int:
    """The sum over both mirrors, each read at its snapshot (None: its latest)."""
    names, catalog = IngestionNames.of(local.ingestion), local.ingestion.spec.sink.catalog
    total = 0
    for table, snapshot in snapshots.items():
        mirror = catalogs.load_table(catalog, names.mirror_identifier(table))
        assert mirror is not None, table
        rows = mirror.scan(snapshot_id=snapshot).to_arrow()  # None: the current snapshot
        total += pc.sum(rows["balance"]).as_py()
    return total


def _behind(local) -> dict[TableName, int]:
    """Each table's freshness as ``lakeslot status`` reports it (``status.tables[].lagSeconds``)."""
    status = observe.observe(local, observe.activity(local))
    return {TableName(t.schema_name, t.name): t.lag_seconds for t in status.tables if t.lag_seconds is not None}


def _stage(local, db, tmp_path) -> None:
    """The reader, as a process, seals everything up to the source's current LSN, then exits."""
    with db.connect() as conn:
        target = current_lsn(conn)
    command = workloads.reader_command(local.ingestion)
    ran = subprocess.run([local_support.LAKESLOT, *command[1:], "--metrics-port", str(free_port()),
                          "--stop-at-lsn", f"{target >> 32:X}/{target & 0xFFFFFFFF:X}"],
                         env=local_support.run_env(db), capture_output=True, text=True,
                         timeout=local_support.RUN_DEADLINE_S,
                         check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]


@pytest.mark.slow
def test_every_cut_keeps_the_cross_table_invariant_that_latest_reads_break(
        pgdb, spark, spark_warehouse, tmp_path, monkeypatch):
    with pgdb.connect() as conn:
        for table in (A, B):
            conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, balance bigint NOT NULL)").format(table.sql()))
            conn.execute(sql.SQL("INSERT INTO {} SELECT i, %s FROM generate_series(0, %s) AS i").format(table.sql()),
                         (START, ROWS - 1))
    path = tmp_path / "ingestion.yaml"
    document = local_support.write_ingestion(path, pgdb, [A, B], tmp_path, warehouse=spark_warehouse)
    document["spec"]["apply"]["tableParallelism"] = 1  # A's commit, then B's: a read between is torn
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    local = local_support.local(path, pgdb, tmp_path / "state")
    first, _ = local_support.run_in_process(local, spark, once=True)  # the snapshot, then caught up
    assert first.caught_up
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)  # the apply job's, in process

    torn: list[int] = []  # the latest snapshot of each table, read between a pass's two commits

    def between_commits(point: str, table: TableName | None) -> None:
        if point == "after-merge" and table == A:
            torn.append(_total(local, {A: None, B: None}))

    for _ in range(3):
        _transfers(pgdb, 25)
        _stage(local, pgdb, tmp_path)
        behind = wait_for(lambda: _behind(local) if min(_behind(local).values()) >= 1 else {},
                          "lakeslot status to show the staged transfers' age")
        assert set(behind) == {A, B}
        result = apply_job.run(spark, local.with_tables([A, B]), once=True,
                               hooks=apply_job.Hooks(point=between_commits))
        assert result.ok, result

    assert set(_behind(local).values()) == {0}  # everything staged is applied
    found = cuts.read(local.ingestion, [A, B])
    assert len(found) >= 4  # the snapshot, the first run's passes, three more passes
    for cut in found:
        assert _total(local, dict(cut.snapshots)) == TOTAL, cut
    assert torn and all(total < TOTAL for total in torn), torn  # A already debited, B not credited yet

    # The command prints the latest cut, with what Spark reads.
    ran = subprocess.run([local_support.LAKESLOT, "cut", "-f", str(path), "--state-dir", str(tmp_path / "state"),
                          "-o", "json"], env=local_support.run_env(pgdb), capture_output=True, text=True, check=False,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr
    printed = json.loads(ran.stdout)
    latest = found[-1]
    assert printed["lsn"] == f"{latest.lsn >> 32:X}/{latest.lsn & 0xFFFFFFFF:X}"
    assert {(t["schema"], t["name"]): t["snapshotId"] for t in printed["tables"]} == {
        (t.schema, t.name): s for t, s in latest.snapshots.items()}
    earlier = subprocess.run([local_support.LAKESLOT, "cut", "-f", str(path), "--state-dir", str(tmp_path / "state"),
                              "--at-lsn", printed["lsn"].split("/")[0] + "/0"], env=local_support.run_env(pgdb),
                             capture_output=True, text=True, check=False, timeout=120)
    assert earlier.returncode == 1 and "no cut at or before" in earlier.stderr
