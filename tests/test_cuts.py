"""Consistent reads across mirror tables (``lakeslot cut``): reading every table at its snapshot of
one cut sees each source transaction whole, where reading each table's latest snapshot may not.

Real PostgreSQL 15 and 18, the real reader (``lakeslot reader``, as a process) and the apply job on
the tests' Spark session with Iceberg; the mirrors are read with pyiceberg, as a query engine
would read them. The source keeps an invariant across two tables (money moved between them in one
transaction); it must hold at every cut. On the way, ``lakeslot status`` (the local status model)
reports how far behind the staged, not yet applied transfers leave each table, and 0 once applied;
and a pass commits first the table whose first change in the batch is the older.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import time
import types

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from psycopg import sql

from lakeslot import workloads
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.apply import job as apply_job
from lakeslot.apply import upkeep
from lakeslot.apply.job import Applier
from lakeslot.apply.outcomes import Hooks
from lakeslot.local import observe
from lakeslot.local.pgcluster import free_port
from lakeslot.mirror import catalogs, contract, cuts
from tests.support import duckdb_reader, local_support
from tests.support.apply_support import Pipeline
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


def test_the_record_names_each_table_by_its_latest_row_since_the_last_full_listing():
    C = TableName("public", "c")

    def listed(table, snapshot, lsn, state="applied"):
        return cuts.Listed(table, table.name, snapshot, lsn, state)

    rows = pa.concat_tables([
        cuts.record_rows(5, 1_000, [listed(A, 9, 5)], full=False),  # (before any full listing)
        cuts.record_rows(10, 2_000, [listed(A, 1, 10), listed(B, 2, 8), listed(C, 3, 4)], full=True),
        cuts.record_rows(20, 3_000, [listed(A, 4, 20)], full=False),  # B, C idle: as before
        cuts.record_rows(30, 4_000, [listed(B, None, None, "failed")], full=False),
        cuts.record_rows(40, 5_000, [listed(A, 5, 40), listed(B, 6, 40)], full=True)])  # C gone
    assert cuts.recorded(rows, [A, B]) == [
        cuts.Cut(10, 2_000, {A: 1, B: 2}), cuts.Cut(20, 3_000, {A: 4, B: 2}),
        cuts.Cut(40, 5_000, {A: 5, B: 6})]  # (not at 30: B is absent from it)
    assert [c.lsn for c in cuts.recorded(rows, [A, C])] == [10, 20, 30]
    assert [c.lsn for c in cuts.recorded(rows, [A])] == [10, 20, 30, 40]
    # a recorded cut is used when each snapshot is in its table's lineage at or below the cut
    lineages: dict[TableName, cuts.Lineage] = {A: {1: 10, 4: 20, 5: 40}, B: {2: 8, 6: 40}}
    assert [c.lsn for c in cuts.recorded(rows, [A, B]) if cuts.valid(c, lineages)] == [10, 20, 40]
    assert not cuts.valid(cuts.Cut(20, 0, {A: 4, B: 6}), lineages)  # B's snapshot is later
    assert not cuts.valid(cuts.Cut(20, 0, {A: 7, B: 2}), lineages)  # A's is not in its lineage
    assert [c.lsn for c in cuts.merged([cuts.Cut(20, 1, {})], cuts.recorded(rows, [A, B]))] == [
        10, 20, 40]


def _transfers(db, count: int) -> None:
    """Transactions moving money from a row of A to a row of B (one statement per table)."""
    with db.connect() as conn:
        for i in range(count):
            with conn.transaction():
                conn.execute("UPDATE wallet_a SET balance = balance - %s WHERE id = %s", (i + 1, i % ROWS))
                conn.execute("UPDATE wallet_b SET balance = balance + %s WHERE id = %s", (i + 1, (i * 7) % ROWS))


def _total(local, snapshots: dict[TableName, int | None]) -> int:
    """The sum over both mirrors, each read at its snapshot (None: its latest)."""
    return _sum(local.ingestion, snapshots)


def _sum(ingestion, snapshots: dict[TableName, int | None]) -> int:
    names, catalog = IngestionNames.of(ingestion), ingestion.spec.sink.catalog
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

    # (the table committed first, the total over the latest snapshot of each table) read
    # between a pass's two commits
    torn: list[tuple[TableName, int]] = []
    merged: list[list[TableName]] = []  # each pass's commits, in order

    def between_commits(point: str, table: TableName | None) -> None:
        if point == "batch-read":
            merged.append([])
        elif point == "after-merge" and table is not None:
            merged[-1].append(table)
            if len(merged[-1]) == 1:  # one table committed, the other not yet
                torn.append((table, _total(local, {A: None, B: None})))

    for round_ in range(3):
        if round_ == 2:  # B changes first: its pass applies B first (its first change is older)
            with pgdb.connect() as conn:
                conn.execute("UPDATE wallet_b SET balance = balance WHERE id = 0")
        _transfers(pgdb, 25)
        _stage(local, pgdb, tmp_path)
        behind = wait_for(lambda: _behind(local) if min(_behind(local).values()) >= 1 else {},
                          "lakeslot status to show the staged transfers' age")
        assert set(behind) == {A, B}
        result = apply_job.run(spark, local.with_tables([A, B]), once=True,
                               hooks=apply_job.Hooks(point=between_commits))
        assert result.ok, result
    # a pass applies its tables oldest change first; in a tie (one transaction) in the job's order
    assert [m for m in merged if m] == [[A, B], [A, B], [B, A]]

    assert set(_behind(local).values()) == {0}  # everything staged is applied
    found = cuts.read(local.ingestion, [A, B])
    assert len(found) >= 4  # the snapshot, the first run's passes, three more passes
    for cut in found:
        assert _total(local, dict(cut.snapshots)) == TOTAL, cut
    # A already debited and B not credited yet, or (B first) B credited and A not debited yet
    assert torn and all(total < TOTAL if first == A else total > TOTAL for first, total in torn), torn
    assert {first for first, _ in torn} == {A, B}, torn

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


IDLE = tuple(TableName("public", f"quiet_{i}") for i in range(3))


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(ingestion) -> pa.Table:
    """The cuts record's rows, read with pyiceberg."""
    names = IngestionNames.of(ingestion)
    record = catalogs.load_table(ingestion.spec.sink.catalog, names.cuts_identifier())
    assert record is not None
    return record.scan().to_arrow()


@pytest.mark.slow
def test_a_cut_every_pass_while_idle_tables_keep_their_advances_in_memory(
        pgdb, spark, spark_warehouse, iceberg_namespace, tmp_path, monkeypatch):
    """Money moves between A and B while three tables stay untouched: a continuous job keeps
    their advances in memory and commits them when due, each at its own pass (300-600 s, spread
    by name; the coverage's clock moves 200 s a pass), so the tables' histories share no LSN
    after the snapshot but the snapshot's — the cuts record has one at every pass. The sum over
    A and B read at every cut (pyiceberg, at the cut's snapshots) is the source's invariant. A
    Failed table is absent from the cuts recorded while it fails: the cuts of every table stay at
    the last one it was part of, those without it go on; so is a table re-snapshotted past the
    passes' batch end, until they reach it."""
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)
    with pgdb.connect() as conn:
        for table in (A, B):
            conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, balance bigint NOT NULL)").format(table.sql()))
            conn.execute(sql.SQL("INSERT INTO {} SELECT i, %s FROM generate_series(0, %s) AS i").format(table.sql()),
                         (START, ROWS - 1))
        for table in IDLE:
            conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(table.sql()))
            conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'still')").format(table.sql()))
    tables = [A, B, *IDLE]
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), tables,
                               sink={"maintenance": {"smallFileThreshold": 2}})
    monkeypatch.setattr(upkeep, "MAINTENANCE_LOOK_S", 0.0)  # (the record looked at every pass)
    pipeline.start_slot()
    pipeline.snapshot()
    ingestion, clock = pipeline.ingestion, _Clock()
    job = Applier(spark, pipeline.job_input(), Hooks(), 256, 3, continuous=True)
    job.passes.work.coverage.clock = clock
    try:
        without_record, idle_committed = 0, set()
        for _ in range(5):
            _transfers(pgdb, 8)
            pipeline.seal()
            result = job.passes.run_pass()
            clock.now += 200.0
            assert result.end is not None
            idle = [o for o in result.tables if o.source in IDLE]
            assert all(o.state == "advanced" and o.lsn == result.end - 1 for o in idle), idle
            idle_committed.add(frozenset(o.source for o in idle if o.committed is None))
            found = cuts.read(ingestion, tables)
            assert found[-1].lsn == result.end - 1  # this pass's own cut
            for cut in found:
                assert _sum(ingestion, {t: cut.snapshots[t] for t in (A, B)}) == TOTAL, cut
            loaded = catalogs.load_tables(ingestion.spec.sink.catalog,
                                          [IngestionNames.of(ingestion).mirror_identifier(t) for t in tables])
            histories = {t: cuts.history(m) for t, m in zip(tables, loaded, strict=True)}
            without_record += cuts.cuts(histories)[-1].lsn < found[-1].lsn
        # the idle tables committed their advances at different passes: no common LSN but the
        # snapshot's in most passes, and still a cut at every one
        assert len(idle_committed - {frozenset()}) >= 2, idle_committed
        assert without_record >= 3
        rows = _record(ingestion)
        assert pc.sum(pc.equal(rows["kind"], "cut")).as_py() == 5  # one commit per pass
        # each later pass lists only what changed: A and B, and an idle table that committed
        assert pc.sum(pc.equal(rows["kind"], "table")).as_py() < 5 * len(tables)
        # the record's upkeep compacts its file per pass (compaction keeps its rows)
        kept = catalogs.load_table(ingestion.spec.sink.catalog,
                                   IngestionNames.of(ingestion).cuts_identifier())
        current = kept.current_snapshot() if kept is not None else None
        assert current is not None and current.summary is not None
        assert int(current.summary["total-data-files"] or 0) < 5

        # a Failed table: absent from the cuts recorded while it fails
        failing = IDLE[0]
        target = IngestionNames.of(ingestion).mirror_table(failing)
        job.passes.tables.record_error(target, "stopped by the test", job.passes.tables.lsn(target), False)
        before = cuts.read(ingestion, tables)[-1]
        _transfers(pgdb, 4)
        pipeline.seal()
        result = job.passes.run_pass()
        assert result.end is not None
        assert next(o for o in result.tables if o.source == failing).state == "failed"
        rows = _record(ingestion)
        latest = rows.filter(pc.equal(rows["cut_lsn"], result.end - 1))
        absent = latest.filter(pc.equal(latest["mirror"], target)).to_pylist()
        assert [(r["snapshot_id"], r["state"]) for r in absent] == [(None, "failed")]
        assert cuts.read(ingestion, tables)[-1] == before  # every table: the last cut with it
        others = [t for t in tables if t != failing]
        assert cuts.read(ingestion, others)[-1].lsn == result.end - 1
        job.passes.tables.clear_error(target)  # it works again: part of the next cut
        _transfers(pgdb, 2)
        pipeline.seal()
        result = job.passes.run_pass()
        assert result.end is not None
        assert cuts.read(ingestion, tables)[-1].lsn == result.end - 1

        # a table re-snapshotted past the batch end: absent ("ahead") until the passes reach it,
        # then part of the cuts again, at its new snapshot
        copied = IDLE[1]
        _transfers(pgdb, 2)
        pipeline.seal()
        dataclasses.replace(pipeline.with_spec(snapshot={"resnapshotGeneration": 1}),
                            tables=[copied]).snapshot()
        result = job.passes.run_pass()
        assert result.end is not None
        rows = _record(ingestion)
        latest = rows.filter(pc.equal(rows["cut_lsn"], result.end - 1))
        ahead = latest.filter(pc.equal(latest["source_table"], copied.name)).to_pylist()
        assert [(r["snapshot_id"], r["state"]) for r in ahead] == [(None, "ahead")]
        _transfers(pgdb, 2)
        pipeline.seal()
        result = job.passes.run_pass()
        assert result.end is not None
        latest_cut = cuts.read(ingestion, tables)[-1]
        assert latest_cut.lsn == result.end - 1
        assert latest_cut.snapshots[copied] == pipeline.snapshots(copied)[-1][0]
    finally:
        job.close()

    # a plain engine reads the latest cut with the documented SQL: DuckDB, without lakeslot
    names = IngestionNames.of(ingestion)
    connection = duckdb_reader.connect()
    directory = spark_warehouse.joinpath(*iceberg_namespace.split(".")[1:])
    record = f"iceberg_scan('{directory / names.cuts_table}')"
    chosen = {mirror: (snapshot, at) for mirror, snapshot, at in
              connection.execute(cuts.SQL.format(record=record, at=2 ** 63 - 1)).fetchall()}
    assert set(chosen) == {names.mirror_table(t) for t in tables}
    assert {at for _, at in chosen.values()} == {result.end - 1}
    total = 0
    for table in (A, B):
        name = names.mirror_table(table)
        total += connection.execute(f"SELECT sum(balance) FROM iceberg_scan('{directory / name}', "
                                    f"snapshot_from_id => {chosen[name][0]})").fetchone()[0]
    assert total == TOTAL


@pytest.mark.slow
def test_expiry_keeps_the_retained_cuts_snapshots_and_a_bounded_history(
        pgdb, spark, spark_warehouse, iceberg_namespace, tmp_path, monkeypatch):
    """What a mirror keeps (lakeslot.mirror.contract, "History"): every snapshot of the recent
    window — here none (RECENT_PASSES 0), so each expiry leaves the current snapshot and the
    tagged ones — and the snapshots of the retained cuts, tagged by the expiry after the pass
    that recorded them. The job's first cut is retained (the next one an hour later): after
    passes that each expire everything else, it still reads exactly what it read when recorded
    and keeps the sum invariant; the cuts in between are gone with their snapshots, and their
    rows from the cuts record."""
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)
    monkeypatch.setattr(contract, "RECENT_PASSES", 0)
    monkeypatch.setattr(cuts, "FULL_LISTING_S", 0.0)  # every cut a full listing
    monkeypatch.setattr(upkeep, "RECORD_TRIM_S", 0.0)  # the record trimmed at every pass
    monkeypatch.setattr(upkeep, "MAINTENANCE_LOOK_S", 0.0)
    pipeline = _wallets(pgdb, spark, spark_warehouse, iceberg_namespace, tmp_path)
    ingestion = pipeline.ingestion
    job = Applier(spark, pipeline.job_input(), Hooks(), 256, 3, expire_interval_s=0, continuous=True)
    try:
        ends = []
        for _ in range(4):
            _transfers(pgdb, 6)
            pipeline.seal()
            result = job.passes.run_pass()
            assert result.end is not None
            ends.append(result.end - 1)
            if len(ends) == 1:
                retained = cuts.read(ingestion, [A, B])[-1]
                assert retained.lsn == ends[0]
                seen = {t: _rows(ingestion, t, s) for t, s in retained.snapshots.items()}
        rows = _record(ingestion)
        marked = rows.filter(pc.equal(rows["kind"], "cut")).sort_by("cut_lsn").to_pylist()
        # the record keeps the retained cut and those from the latest full listing older than
        # the window on (here: the pass's own, recorded before its upkeep): the others are gone
        assert [(r["cut_lsn"], r["retained"]) for r in marked] == [(ends[0], True), (ends[3], False)]
    finally:
        job.close()
    found = cuts.read(ingestion, [A, B])
    assert [c.lsn for c in found if c.lsn in ends] == [ends[0], ends[-1]]  # 2nd, 3rd expired
    kept = next(c for c in found if c.lsn == ends[0])
    assert kept.snapshots == retained.snapshots
    assert {t: _rows(ingestion, t, s) for t, s in kept.snapshots.items()} == seen
    assert _sum(ingestion, dict(kept.snapshots)) == TOTAL
    for table in (A, B):  # the current snapshot, the retained cut's (tagged), the snapshot's
        assert len(pipeline.snapshots(table)) <= 3, pipeline.snapshots(table)


@pytest.mark.slow
def test_a_table_expires_after_a_passes_worth_of_commits_not_after_a_time_alone(
        pgdb, spark, spark_warehouse, iceberg_namespace, tmp_path, monkeypatch):
    """When passes are slower than the trigger (hundreds of busy tables), an expiry waits for as
    many commits as a table committing every pass makes between two expiries: here 3 (no recent
    window, at most one expiry per 180 s at the 60-s trigger), while the job's clock jumps 200 s
    a pass — by time alone every pass would expire. So each table's history grows by a snapshot
    a pass and falls back every third commit: bounded by commits, not paid at every pass."""
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)
    monkeypatch.setattr(contract, "RECENT_PASSES", 0)
    monkeypatch.setattr(upkeep, "EXPIRE_MIN_S", 180.0)
    jump = [0.0]
    monkeypatch.setattr(upkeep, "time", types.SimpleNamespace(
        monotonic=lambda: time.monotonic() + jump[0], time=time.time))
    pipeline = _wallets(pgdb, spark, spark_warehouse, iceberg_namespace, tmp_path)
    assert pipeline.ingestion.spec.apply.trigger_interval_seconds == 60
    job = Applier(spark, pipeline.job_input(), Hooks(), 256, 3, continuous=True)
    counts: dict[TableName, list[int]] = {A: [], B: []}
    try:
        for _ in range(7):
            _transfers(pgdb, 4)
            pipeline.seal()
            assert job.passes.run_pass().end is not None
            jump[0] += 200.0
            for table in (A, B):
                counts[table].append(len(pipeline.snapshots(table)))
    finally:
        job.close()
    for table, seen in counts.items():
        # (a pass that did not grow the history by its commit expired it)
        expired = [i for i in range(1, len(seen)) if seen[i] != seen[i - 1] + 1]
        assert len(expired) >= 2 and all(b - a == 3 for a, b in itertools.pairwise(expired)), (
            table, seen)


def _wallets(pgdb, spark, spark_warehouse, iceberg_namespace, tmp_path) -> Pipeline:
    """Tables A and B of ROWS rows holding START each, snapshotted by a new pipeline."""
    with pgdb.connect() as conn:
        for table in (A, B):
            conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, balance bigint NOT NULL)").format(table.sql()))
            conn.execute(sql.SQL("INSERT INTO {} SELECT i, %s FROM generate_series(0, %s) AS i").format(table.sql()),
                         (START, ROWS - 1))
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), [A, B])
    pipeline.start_slot()
    pipeline.snapshot()
    return pipeline


def _rows(ingestion, table: TableName, snapshot: int) -> list[tuple]:
    """The mirror's rows at ``snapshot`` (pyiceberg), by key."""
    names = IngestionNames.of(ingestion)
    mirror = catalogs.load_table(ingestion.spec.sink.catalog, names.mirror_identifier(table))
    assert mirror is not None
    read = mirror.scan(snapshot_id=snapshot, selected_fields=("id", "balance")).to_arrow()
    return sorted(zip(read["id"].to_pylist(), read["balance"].to_pylist(), strict=True))
