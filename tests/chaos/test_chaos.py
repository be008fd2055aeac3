"""The chaos suite: ``lakeslot run`` streams a seeded concurrent workload while faults strike at
random moments; afterwards every mirror equals its source, every column of every row, and no
process is left behind.

One test per PostgreSQL version (15 and 18), each on a cluster tests may restart
(``restartable_pgdb``: the faults restart and stop it) with ``wal_sender_timeout = 5s``. Each
round: a seeded delay, one fault (:data:`tests.chaos.harness.FAULTS`: SIGKILL of the whole run,
of the reader alone, of the Spark JVM alone; SIGTERM of the run; ``pg_terminate_backend`` of the
walsender; PostgreSQL fast and immediate restart; the source down for longer than
``wal_sender_timeout``; the reader frozen until the walsender times out on it; staging
unwritable; staging full — ENOSPC from a tmpfs mounted for staging when that fault is scheduled;
the Iceberg catalog unavailable — the hadoop catalog's metadata made immutable; the last two last
until the run or its reader logged a failed attempt), then the mirrors must get past the source's
WAL position taken after the fault (the pipeline recovered by itself; a run that exited is
started again, as a supervisor would — but by itself it may exit only where the fault allows it:
exit 1 after its Spark JVM was killed). After
the rounds: the workload stops, the run is stopped with SIGTERM (exit 0), ``lakeslot run --once``
catches up (exit 0), and each mirror is read with pyiceberg, independently of lakeslot's readers,
and compared with its source row by row. Besides the workload's tables, the many-tables round's
small tables (:data:`tests.chaos.harness.MANY_TABLES`, ``LAKESLOT_CHAOS_MANY_TABLES``, default 12)
take transactions that change several of them at once: a pass commits table after table, so
faults strike between two tables' commits of one pass, and each table must recover from its own
position.

Environment: ``LAKESLOT_CHAOS_ROUNDS`` rounds per version (CI: 6, a fresh seed per test session,
shared by both versions: they take the seeded order of the 12 fault kinds from opposite ends, so
CI injects every kind exactly once per run); ``LAKESLOT_CHAOS_SEED`` replays a seed (printed at the start
and in every failure message); ``LAKESLOT_CHAOS_FAULTS`` (comma-separated names) restricts the
kinds.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import time
from collections import Counter

import pytest

from lakeslot.local.tree import alive, descendants
from tests.chaos import harness
from tests.support import local_support
from tests.support.apply_support import assert_equal_to_source, lsn_now
from tests.support.apply_workload import IDLE, KEYLESS, MAIN
from tests.support.fixtures_pg import RESTARTABLE_SETTINGS
from tests.support.waiting import wait_for

ROUNDS = int(os.environ.get("LAKESLOT_CHAOS_ROUNDS", "6"))
SEED = int(os.environ.get("LAKESLOT_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
ONLY = [k for k in os.environ.get("LAKESLOT_CHAOS_FAULTS", "").split(",") if k]
WAL_SENDER_TIMEOUT_S = 5
assert RESTARTABLE_SETTINGS["wal_sender_timeout"] == f"'{WAL_SENDER_TIMEOUT_S}s'"
RECOVERY_DEADLINE_S = 300  # a fault's recovery (a run restart includes a JVM start)
CATCH_UP_DEADLINE_S = 600
MAX_DELAY_S = 6.0  # a fault strikes up to this long after the previous round recovered
TABLES = [MAIN, KEYLESS, IDLE, local_support.ACCOUNTS, *harness.MANY_TABLES]


@pytest.mark.slow
@pytest.mark.timeout(900 + 240 * ROUNDS)
def test_faults_at_random_moments_under_write_load_lose_nothing(restartable_pgdb, tmp_path):
    replay = f"chaos seed {SEED} (replay: LAKESLOT_CHAOS_SEED={SEED} LAKESLOT_CHAOS_ROUNDS={ROUNDS})"
    print(f"\n{replay}")
    rng = random.Random(SEED)
    db = restartable_pgdb
    with db.connect() as conn:
        harness.create_tables(conn)
        harness.create_many_tables(conn)
    path, state_dir, log = tmp_path / "ingestion.yaml", tmp_path / "state", tmp_path / "run.log"
    local_support.write_ingestion(path, db, TABLES, tmp_path, source={"tables": [
        {"schema": t.schema, "name": t.name, **({"keyColumns": ["a"]} if t == KEYLESS else {})}
        for t in TABLES]})
    local = local_support.local(path, db, state_dir)
    supervisor = harness.Supervisor(path, db, state_dir, log)
    context = harness.Context(supervisor, db.cluster, local.job.names.slot, tmp_path / "staging",
                              tmp_path / "warehouse", WAL_SENDER_TIMEOUT_S, rng)
    offset = 0 if db.cluster.major < 18 else len(harness.FAULTS) // 2
    faults = harness.schedule(random.Random(SEED), ROUNDS, offset, ONLY)  # (both versions' order)
    injected: Counter = Counter()
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if "staging_full" in faults:  # a filesystem that can be made full
            stack.enter_context(harness.staging_on_tmpfs(context.staging))
        stack.enter_context(supervisor.abandoned_on_failure())  # a failed round leaves nothing
        writer = harness.Writer(db, SEED, harness.ManyTablesWorkload)
        try:
            supervisor.start()
            first = lsn_now(db)
            wait_for(lambda: supervisor.ensure_running() and harness.applied_past(local, TABLES, first),
                     f"the first snapshot and apply; {replay}", deadline=RECOVERY_DEADLINE_S, interval=2)
            print(f"snapshot and first apply done at {time.monotonic() - started:.0f} s")
            for number, kind in enumerate(faults, 1):
                time.sleep(rng.uniform(0, MAX_DELAY_S))  # when the fault strikes (its parameter)
                what = harness.FAULTS[kind](context)
                injected[kind] += 1
                target = lsn_now(db)
                wait_for(lambda: supervisor.ensure_running() and harness.applied_past(local, TABLES, target),  # noqa: B023
                         f"round {number} ({what}): the mirrors to get past {target:X}; {replay}",
                         deadline=RECOVERY_DEADLINE_S, interval=2)
                print(f"round {number}: {what}; recovered at {time.monotonic() - started:.0f} s")
        finally:
            transactions = writer.stop()
        supervisor.ensure_running()
        supervisor.finish()
        assert supervisor.once(CATCH_UP_DEADLINE_S) == 0, f"{replay}\n{supervisor.tail()}"
        supervisor.close()

    for table in TABLES:
        assert_equal_to_source(db, (tmp_path / "warehouse").as_uri(),
                               local.job.names.mirror_identifier(table), table)
    wait_for(lambda: not alive(supervisor.seen), f"no process left behind; {replay}")
    assert supervisor.seen, "the sampler saw the runs' processes"
    assert local_support.temporary_slots(db) == []
    with db.connect() as conn:
        assert conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                            (local.job.names.slot,)).fetchone() == (False,)
    print(f"{replay}: {ROUNDS} rounds in {time.monotonic() - started:.0f} s on PostgreSQL "
          f"{db.cluster.major}; faults {dict(sorted(injected.items()))}; run exits "
          f"{dict(supervisor.exits)}; {transactions} units of work ({writer.lost} lost to "
          "faults); every table equal")


def test_the_schedule_covers_every_fault_across_the_two_versions():
    rng = random.Random(7)
    half = len(harness.FAULTS) // 2
    first, second = (harness.schedule(random.Random(7), half, offset) for offset in (0, half))
    assert sorted(first + second) == sorted(harness.FAULTS)
    assert harness.schedule(rng, 3, 0) == harness.schedule(random.Random(7), 3, 0)  # seeded


def test_a_failure_inside_leaves_no_run_process_alive(tmp_path):
    """A failed round kills what the runs started (a real process tree stands in for a run)."""
    supervisor = harness.Supervisor(tmp_path / "ingestion.yaml", None, tmp_path, tmp_path / "log")  # type: ignore[arg-type]
    supervisor.process = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])
    child = wait_for(lambda: descendants(supervisor.run.pid), "the stand-in run's child")
    with pytest.raises(AssertionError, match="a round failed"), supervisor.abandoned_on_failure():
        raise AssertionError("a round failed")
    supervisor.run.wait(10)
    wait_for(lambda: not alive(child), "the run's child to be gone")
