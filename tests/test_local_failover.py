"""Failover under write load: a primary and a physical standby on this machine
(:mod:`tests.support.failover_support`), ``lakeslot run`` streaming through the libpq host list
``127.0.0.1,127.0.0.2`` (lakeslot adds ``target_session_attrs=read-write``), the chaos suite's
concurrent workload writing through the same list; the primary is killed (``pg_ctl stop -m
immediate``) mid-stream and the standby promoted.

- PostgreSQL 18, ``source.failoverSlot: true``: the standby synchronizes the slot
  (``sync_replication_slots``; the primary waits for it through ``synchronized_standby_slots``).
  Before the failover the status says the slot is failover-safe. After it the reader resumes on
  the promoted server's new timeline from staging (no re-snapshot: the mirrors keep their
  snapshot LSN), the run never exits by itself, and once the mirrors caught up with the new
  primary each of them, read with pyiceberg, equals it row by row: nothing lost, nothing twice.
- PostgreSQL 15: the status warns beforehand that a failover loses the slot and what
  ``onSlotLost`` (Error) will do. After the failover the reader finds the slot missing on the new
  timeline: the run stops with exit 3 and ``SlotLost`` saying a failover lost it; ``lakeslot
  status`` says the same (not "does not exist yet"); a new run with ``onSlotLost: Error`` stops
  again without creating a slot over the gap; with ``Resnapshot`` it recreates the slot, copies
  every table again and ends equal to the new primary.
"""

from __future__ import annotations

import io

import pytest
import yaml

from lakeslot import lsn_text
from lakeslot.exits import EXIT_DEFINITE
from lakeslot.local import observe, run, state
from lakeslot.mirror import progress as mirror_progress
from lakeslot.reader import reader
from lakeslot.reader.writer import SegmentWriter
from lakeslot.source import failover, preflight
from lakeslot.source.connection import ConnectionSettings
from lakeslot.staging.segments import SourceIdentity
from lakeslot.staging.store import Staging
from tests.chaos import harness
from tests.support import local_support
from tests.support.apply_support import assert_equal_to_source, lsn_now
from tests.support.apply_workload import IDLE, KEYLESS, MAIN
from tests.support.failover_support import HaDatabase, SteadyWorkload, failover_ready, ha_pair
from tests.support.waiting import wait_for
from tests.test_reader_segments import _slot

TABLES = [MAIN, KEYLESS, IDLE, local_support.ACCOUNTS]
DEADLINE_S = 300
WRITES_AFTER_PROMOTION = 30  # units of work the workload commits on the promoted server


def test_a_new_timeline_is_resumed_only_if_staging_ends_before_the_old_one_ended(tmp_path):
    staging = Staging(tmp_path.as_uri())
    SegmentWriter(staging, 77, SourceIdentity("7", 1)).seal(300)
    promoted = SourceIdentity("7", 2)
    for ended in ({1: 300}, {1: 400}):  # the standby had everything staged: resume at its end
        assert reader.check_resume(staging, _slot(77), promoted, ended.copy) == 300
    with pytest.raises(reader.ReaderError, match=r"at 0/12B .* staging ends at 0/12C") as e:
        reader.check_resume(staging, _slot(77), promoted, lambda: {1: 299})
    assert (e.value.reason, e.value.lsn) == ("TimelineChanged", 300)
    with pytest.raises(reader.ReaderError, match="does not descend from it"):
        reader.check_resume(staging, _slot(77), SourceIdentity("7", 3), lambda: {2: 400})


def test_a_host_list_connects_only_to_a_server_that_accepts_writes():
    def params(host: str, **extra: str) -> dict[str, str]:
        return ConnectionSettings(host, 5432, "db", "u", extra=extra).params()

    assert "target_session_attrs" not in params("pg")
    assert params("pg-a,pg-b")["target_session_attrs"] == "read-write"
    assert params("pg-a,pg-b", target_session_attrs="primary")["target_session_attrs"] == "primary"


def test_preflight_and_status_say_what_a_failover_does_to_the_slot(pgdb, tmp_path):
    with pgdb.connect() as conn:
        major = conn.info.server_version // 10000
        [wanted] = [f for f in preflight.run(conn, [], slot_name="s", failover_slot=True)
                    if f.check == "failover"]
        if major < 17:
            assert not wanted.ok and "needs PostgreSQL 17" in wanted.message
            safety = failover.safety(conn, "s", failover=False, on_slot_lost="Resnapshot")
            assert not safety.safe and f"PostgreSQL {major} keeps logical slots" in safety.message
            assert "the next start creates a new slot and copies every table" in safety.message
        else:  # a failover slot, but no standby listed: not safe, and why
            assert wanted.ok and "synchronized_standby_slots is empty" in wanted.message
            safety = failover.safety(conn, "s", failover=False, on_slot_lost="Error")
            assert not safety.safe and "is not a failover slot" in safety.message
            assert "stays stopped until policies.onSlotLost is set to Resnapshot" in safety.message

        staging = Staging(tmp_path.as_uri())
        timeline = failover.current_timeline(conn)
        assert timeline is not None  # a primary
        assert failover.lost_by_failover(conn, "s", staging) is None  # nothing staged: no evidence
        SegmentWriter(staging, 77, SourceIdentity("7", timeline)).seal(300)
        assert failover.lost_by_failover(conn, "s", staging) is None  # same timeline: dropped
        SegmentWriter(staging, 300, SourceIdentity("7", timeline + 1)).seal(400)
        lost = failover.lost_by_failover(conn, "s", staging)
        assert lost is not None and "changes after 0/190 are lost" in lost
        assert f"writes timeline {timeline} while staging was read on timeline {timeline + 1}" in lost


@pytest.fixture
def ha(request):
    with ha_pair(request.param) as pair:
        yield pair


def _setup(ha, tmp_path, warehouse, **source):
    """A database of the HA pair with the chaos tables, and a local ingestion through the host
    list (spec.source fields ``source`` on top)."""
    primary, standby = ha
    primary.create_database("shop")
    db = HaDatabase(primary, standby, "shop")
    with db.connect() as conn:
        harness.create_tables(conn)
    path = tmp_path / "ingestion.yaml"
    document = local_support.write_ingestion(path, db, TABLES, tmp_path, warehouse=warehouse, source={
        "host": db.hosts, **source, "tables": [
            {"schema": t.schema, "name": t.name, **({"keyColumns": ["a"]} if t == KEYLESS else {})}
            for t in TABLES]})
    return db, path, document


def _failover(db: HaDatabase, writer: harness.Writer) -> None:
    """Kill the primary, promote the standby, and let the workload commit on it."""
    db.cluster.stop("immediate")
    db.standby.promote()
    after = writer.done
    wait_for(lambda: writer.done >= after + WRITES_AFTER_PROMOTION,
             "the workload to write on the promoted server", deadline=DEADLINE_S)


def _once(local, spark) -> run.Result:
    return run.run(local, run.Options(once=True, spark=spark, out=io.StringIO(), interactive=False))


@pytest.mark.slow
@pytest.mark.parametrize("ha", ["pg18"], indirect=True)
def test_a_failover_slot_survives_a_promotion_mid_stream_and_nothing_is_lost_or_doubled(
        ha, tmp_path, spark, spark_warehouse):
    db, path, _ = _setup(ha, tmp_path, spark_warehouse, failoverSlot=True)
    local = local_support.local(path, db, tmp_path / "state")
    slot = local.job.names.slot
    writer = harness.Writer(db, 18, SteadyWorkload)
    snapshots, promoted = {}, []

    def scenario() -> None:
        first = lsn_now(db)
        wait_for(lambda: harness.applied_past(local, TABLES, first), "the snapshot and a first apply",
                 deadline=DEADLINE_S, interval=1)
        snapshots.update({t: p.snapshot_lsn for t, p in
                          mirror_progress.read(local.ingestion, TABLES).items()})
        status = observe.observe(local, observe.activity(local))
        assert status.slot is not None and status.slot.failover_safe is True, status.slot
        wait_for(lambda: failover_ready(db.standby, slot),
                 "the standby to synchronize the failover slot", deadline=DEADLINE_S,
                 interval=0.5)
        _failover(db, writer)
        promoted.append(lsn_now(db))
        writer.stop()
        end = lsn_now(db)
        wait_for(lambda: harness.applied_past(local, TABLES, end),
                 "the mirrors to catch up with the promoted server", deadline=DEADLINE_S,
                 interval=1)

    try:
        local_support.run_in_process(local, spark, once=False, during=scenario)
    finally:
        writer.stop()

    with db.connect() as conn:  # the reader streamed from the promoted server's copy of the slot
        failover, confirmed = conn.execute(
            "SELECT failover, confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots"
            " WHERE slot_name = %s", (lsn_text.format(promoted[0]), slot)).fetchone()
    assert failover and confirmed
    progress = mirror_progress.read(local.ingestion, TABLES)
    assert {t: p.snapshot_lsn for t, p in progress.items()} == snapshots  # no re-snapshot
    for table in TABLES:
        assert_equal_to_source(db, spark_warehouse.as_uri(),
                               local.job.names.mirror_identifier(table), table)


@pytest.mark.slow
@pytest.mark.parametrize("ha", ["pg15"], indirect=True)
def test_before_17_a_failover_loses_the_slot_and_on_slot_lost_decides(
        ha, tmp_path, spark, spark_warehouse):
    db, path, document = _setup(ha, tmp_path, spark_warehouse)
    local = local_support.local(path, db, tmp_path / "state")
    slot = local.job.names.slot
    writer = harness.Writer(db, 15, SteadyWorkload)

    def scenario() -> None:
        first = lsn_now(db)
        wait_for(lambda: harness.applied_past(local, TABLES, first), "the snapshot and a first apply",
                 deadline=DEADLINE_S, interval=1)
        status = observe.observe(local, observe.activity(local))
        assert status.slot is not None and status.slot.failover_safe is False
        [ready] = [c for c in status.conditions if c.type == "SlotReady"]
        assert ready.status == "True"
        assert "PostgreSQL 15 keeps logical slots on the primary only" in ready.message
        assert "stays stopped until policies.onSlotLost is set to Resnapshot" in ready.message
        _failover(db, writer)
        wait_for(lambda: not state.run_active(local.state_dir),
                 "the run to stop by itself", deadline=DEADLINE_S)

    try:
        stopped, _ = local_support.run_in_process(local, spark, once=False, during=scenario,
                                                  expect=EXIT_DEFINITE)
    finally:
        writer.stop()
    assert "(SlotLost)" in stopped.message and "a failover" in stopped.message, stopped.message

    status = observe.observe(local, observe.activity(local))
    [ready] = [c for c in status.conditions if c.type == "SlotReady"]
    assert (ready.status, ready.reason) == ("False", "SlotLost"), ready
    assert "a failover (or point-in-time recovery) lost the slot" in ready.message
    assert "policies.onSlotLost: Resnapshot" in ready.message

    again = _once(local, spark)  # onSlotLost: Error — no slot is created over the gap
    assert again.code == EXIT_DEFINITE and "lost the slot" in again.message, again.message
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                            (slot,)).fetchone() == (0,)

    document["spec"]["policies"] = {"onSlotLost": "Resnapshot"}
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    local = local_support.local(path, db, tmp_path / "state")
    recovered = _once(local, spark)
    assert recovered.code == 0, recovered.message
    for table in TABLES:
        assert_equal_to_source(db, spark_warehouse.as_uri(),
                               local.job.names.mirror_identifier(table), table)
