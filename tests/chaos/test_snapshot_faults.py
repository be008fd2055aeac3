"""Faults that land while the initial snapshot copies: the run finishes the snapshot (restarting
it, or retrying its ranges) and every mirror ends equal to its source, row by row, with no row
lost or duplicated, and no process or temporary slot left behind.

Invariants checked: after each fault the run (kept running by :class:`tests.chaos.harness.
Supervisor`, as systemd or Kubernetes would) commits the snapshot by itself; by itself it exits
only where the fault allows it (exit 1 after its Spark JVM was killed); once a concurrent writer
stopped and the stream got past the source's position, the mirror is read with pyiceberg,
independently of lakeslot, and compared with its source.

Each fault is injected while a snapshot job copies (its progress document in staging says
``running`` with a table ``copying``; after a kill, a new job's document, not the killed one's),
after a seeded delay of up to :data:`MAX_DELAY_S`. ``LAKESLOT_SNAPSHOT_FAULT_ROUNDS`` faults
(CI: 2, so that the test stays near a minute and a half; 4 or more inject every kind) from
:data:`FAULTS`, in a seeded order: SIGKILL of the run, SIGKILL of its Spark JVM,
``pg_terminate_backend`` of the followers' backends (the ranges' COPY sessions), and of the leader
(the session holding the exported snapshot and its temporary slot). After a fault the same job
must ride out (the two terminations), it must finish another range or commit a table before the
next fault, so that each fault's recovery is seen, not masked by the next kill (a fault that
strikes after the last table committed leaves nothing for the rounds after: they are reported not
injected, and the test goes on to its checks). A termination of
the followers that lands after the copy's last range (the delay can outlast a short copy on a busy
machine) finds nobody to end: the round prints "missed" rather than waiting for backends that
will not come; a termination of the leader while the last table commits leaves only the commit.

Failure modes it catches: a snapshot that never finishes (a deadline names the fault and the
seed), a run that exits where it must ride the fault out, a mirror with rows missing or twice
(an uncommitted attempt's files committed, a range copied twice), a temporary slot or a process
outliving the run. One PostgreSQL version (``one_version``): the snapshot's machinery does not
depend on it. ``LAKESLOT_CHAOS_SEED`` replays a seed (printed at the start and in every failure).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

import pytest

from lakeslot.local import config, observe
from lakeslot.local.tree import alive
from tests.chaos import harness
from tests.support import local_support
from tests.support.apply_support import assert_equal_to_source, lsn_now
from tests.support.fixtures_pg import Database
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.one_version]

ROWS = 60_000  # 6 ranges of 1 MiB at parallelism 2: a snapshot copies for a few seconds
SEED = os.environ.get("LAKESLOT_CHAOS_SEED")
ROUNDS = int(os.environ.get("LAKESLOT_SNAPSHOT_FAULT_ROUNDS", "2"))  # CI: 2 of the 4 kinds
MAX_DELAY_S = 1.0
DEADLINE_S = 300
FOLLOWERS = "lakeslot-snapshot %"  # application_name of the followers (not -leader, -plan)
LEADER = "lakeslot-snapshot-leader %"


def _backends(db, pattern: str) -> list[int]:
    """The pids of lakeslot's snapshot sessions whose application_name is like ``pattern``."""
    with db.connect() as conn:
        return [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s", (pattern,))]


def _terminate(local, db, pattern: str, what: str) -> str:
    """Terminate the backends like ``pattern``; they exist while the copy has ranges left (the
    leader: until the job releases its snapshot). A copy that finished its last range before the
    fault landed leaves nothing to terminate: the round says so ("missed") instead of waiting."""
    pids = wait_for(lambda: _backends(db, pattern) or _all_ranges_done(local), what)
    if not isinstance(pids, list):
        return f"pg_terminate_backend of {what}: missed (every range was copied already)"
    with db.connect() as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return f"pg_terminate_backend of {what} {pids}"


FAULTS: dict[str, Callable[[harness.Context, Database, config.Local], str]] = {
    "kill_run": lambda c, db, local: harness.kill_run(c),
    "kill_spark_jvm": lambda c, db, local: harness.kill_spark_jvm(c),
    "terminate_copies": lambda c, db, local: _terminate(local, db, FOLLOWERS, "the followers' backends"),
    "terminate_leader": lambda c, db, local: _terminate(local, db, LEADER, "the exported snapshot's holder")}
RESTARTS = {"kill_run", "kill_spark_jvm"}  # the faults after which a new snapshot job starts


def _copying(local, stale: str | None) -> tuple[str, bool] | None:
    """The snapshot job now — its id, and whether it is still copying — once its progress
    document says it copies or every table is committed (False: nothing is left to copy, even
    when the job was killed after its last commit, so no new one comes); a ``stale`` job (a
    killed run's document stays "running") copies no more."""
    document = observe.snapshot_document(local)
    if document is None:
        return None
    if all(t["state"] in ("committed", "skipped") for t in document["tables"]):
        return document["job"], False
    if (document["job"] != stale and document["state"] == "running"
            and any(t["state"] == "copying" for t in document["tables"])):
        return document["job"], True
    return None


def _position(local) -> tuple[str | None, int]:
    """The current snapshot job's snapshot LSN and its progress: ranges finished plus tables
    committed ((None, 0): no job yet)."""
    document = observe.snapshot_document(local)
    if document is None:
        return None, 0
    return document["snapshotLsn"], sum(t["rangesDone"] + (t["state"] == "committed")
                                        for t in document["tables"])


def _moved_on(local, at: tuple[str | None, int]) -> bool:
    """The snapshot job finished a range or committed a table since ``at`` (under the same
    snapshot, or a new one): a fault while the last range's table commits leaves only the commit."""
    lsn, done = _position(local)
    return done > at[1] if lsn == at[0] else done > 0


def _all_ranges_done(local) -> bool:
    """The current snapshot job has no range left to copy (it commits, or it finished)."""
    document = observe.snapshot_document(local)
    return document is not None and (document["state"] != "running" or all(
        t["rangesDone"] >= t["rangesTotal"] for t in document["tables"] if t["state"] == "copying"))


@pytest.mark.timeout(900)
def test_faults_while_the_snapshot_copies_lose_and_duplicate_nothing(restartable_pgdb, tmp_path):
    seed = int(SEED) if SEED else random.SystemRandom().randrange(2**32)
    replay = (f"snapshot-fault seed {seed} (replay: LAKESLOT_CHAOS_SEED={seed} "
              f"LAKESLOT_SNAPSHOT_FAULT_ROUNDS={ROUNDS})")
    print(f"\n{replay}")
    rng = random.Random(seed)
    db = restartable_pgdb
    with db.connect() as conn:
        local_support.create_accounts(conn, ROWS)
    path, state_dir, log = tmp_path / "ingestion.yaml", tmp_path / "state", tmp_path / "run.log"
    local_support.write_ingestion(path, db, [local_support.ACCOUNTS], tmp_path)
    local = local_support.local(path, db, state_dir)
    supervisor = harness.Supervisor(path, db, state_dir, log)
    context = harness.Context(supervisor, db.cluster, local.job.names.slot, tmp_path / "staging",
                              tmp_path / "warehouse", 5, rng)
    order = harness.cycle(rng, FAULTS, ROUNDS)
    started = time.monotonic()
    writer = local_support.Workload(db, [local_support.ACCOUNTS], {local_support.ACCOUNTS: "balance"})
    stale: str | None = None
    with supervisor.abandoned_on_failure():  # a failed round leaves nothing running
        try:
            supervisor.start()
            for number, kind in enumerate(order, 1):
                found = wait_for(
                    lambda: _copying(local, stale) if supervisor.ensure_running() else None,  # noqa: B023
                    f"round {number} ({kind}): a snapshot copying; {replay}", deadline=DEADLINE_S)
                assert found is not None  # (for mypy: wait_for returns a truthy value or fails)
                job, copying = found
                if not copying:  # the last fault struck after the last commit: nothing left to hit
                    print(f"round {number}: not injected, the snapshot finished after round {number - 1}")
                    break
                time.sleep(rng.uniform(0, MAX_DELAY_S))  # where in the copy it lands (its parameter)
                what = FAULTS[kind](context, db, local)
                print(f"round {number}: {what} at {time.monotonic() - started:.0f} s")
                stale = job if kind in RESTARTS else None
                if kind not in RESTARTS:  # the same job rides it out: it must copy on before the next
                    at = _position(local)
                    wait_for(lambda: supervisor.ensure_running() and _moved_on(local, at),  # noqa: B023
                             f"round {number} ({what}): the snapshot to copy on; {replay}",
                             deadline=DEADLINE_S)
        finally:
            transactions = writer.stop()
        target = lsn_now(db)
        wait_for(lambda: supervisor.ensure_running() and harness.applied_past(local, [local_support.ACCOUNTS], target),
                 f"the snapshot committed and the stream past {target:X}; {replay}", deadline=DEADLINE_S,
                 interval=1)
        supervisor.finish()
    supervisor.close()
    assert_equal_to_source(db, (tmp_path / "warehouse").as_uri(),
                           local.job.names.mirror_identifier(local_support.ACCOUNTS), local_support.ACCOUNTS)
    wait_for(lambda: not alive(supervisor.seen), f"no process left behind; {replay}")
    assert local_support.temporary_slots(db) == [], replay
    print(f"{replay}: faults {order} in {time.monotonic() - started:.0f} s on PostgreSQL "
          f"{db.cluster.major}; run exits {dict(supervisor.exits)}; {transactions} transactions "
          "during the snapshots; equal")
