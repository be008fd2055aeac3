"""A slot PostgreSQL 18 invalidates while no ``lakeslot run`` is active (the reader down): by
``idle_replication_slot_timeout`` (idle longer than it, at a checkpoint) or by
``max_slot_wal_keep_size`` (more WAL retained than allowed, removed at a checkpoint). The next run
follows ``policies.onSlotLost``: ``Error`` stops with exit 3 saying why; ``Resnapshot`` recreates
the slot and copies every table again, ending equal to the source (read with pyiceberg), the
changes made while the slot was lost included."""

from __future__ import annotations

import io

import pytest
import yaml

from lakeslot.exits import EXIT_DEFINITE
from lakeslot.local import run
from tests.support import local_support
from tests.support.apply_support import assert_equal_to_source
from tests.support.fixtures_pg import Database
from tests.support.waiting import wait_for

SETTINGS = {
    "idle_replication_slot_timeout": {"idle_replication_slot_timeout": "'1s'"},
    "max_slot_wal_keep_size": {"max_slot_wal_keep_size": "'1MB'", "wal_keep_size": "0",
                               "min_wal_size": "'32MB'", "max_wal_size": "'64MB'"},
}


@pytest.fixture(params=sorted(SETTINGS))
def invalidating_db(request, pg_cluster_factory):
    cluster = pg_cluster_factory.get("pg18", **SETTINGS[request.param])
    name = "slot_lost"
    cluster.create_database(name)
    yield request.param, Database(cluster, name)
    cluster.drop_database(name)


def _invalidated(db, slot: str, setting: str) -> str | None:
    """One push towards invalidation (WAL for max_slot_wal_keep_size, then a checkpoint, where
    PostgreSQL invalidates); the slot's invalidation_reason once it is set."""
    with db.connect() as conn:
        if setting == "max_slot_wal_keep_size":
            conn.execute("INSERT INTO accounts (id, balance) SELECT i, 0 FROM "
                         "generate_series(1000000, 1005000) i ON CONFLICT (id) DO UPDATE "
                         "SET balance = accounts.balance + 1")
            conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")
        row = conn.execute("SELECT invalidation_reason FROM pg_replication_slots "
                           "WHERE slot_name = %s", (slot,)).fetchone()
    assert row is not None, "the slot is gone"
    return row[0]


@pytest.mark.slow
def test_a_slot_invalidated_while_the_reader_is_down_follows_on_slot_lost(
        invalidating_db, tmp_path, spark, spark_warehouse):
    setting, db = invalidating_db
    with db.connect() as conn:
        local_support.create_accounts(conn, 500)
    path = tmp_path / "ingestion.yaml"
    document = local_support.write_ingestion(path, db, [local_support.ACCOUNTS], tmp_path, warehouse=spark_warehouse)
    local = local_support.local(path, db, tmp_path / "state")
    options = run.Options(once=True, spark=spark, out=io.StringIO(), interactive=False)
    assert run.run(local, options).code == 0
    with db.connect() as conn:  # changes while no reader runs: they will be in no stream
        conn.execute("UPDATE accounts SET balance = -1 WHERE id <= 100")
        conn.execute("DELETE FROM accounts WHERE id > 450")

    reason = wait_for(lambda: _invalidated(db, local.job.names.slot, setting),
                      f"PostgreSQL to invalidate the slot ({setting})", interval=1.5)
    assert reason == ("idle_timeout" if setting == "idle_replication_slot_timeout"
                      else "wal_removed")

    stopped = run.run(local, options)  # onSlotLost: Error (the default)
    assert stopped.code == EXIT_DEFINITE, stopped.message
    assert "invalidated" in stopped.message and reason in stopped.message

    document["spec"]["policies"] = {"onSlotLost": "Resnapshot"}
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    local = local_support.local(path, db, tmp_path / "state")
    recovered = run.run(local, options)
    assert recovered.code == 0, recovered.message
    assert_equal_to_source(db, spark_warehouse.as_uri(),
                           local.job.names.mirror_identifier(local_support.ACCOUNTS), local_support.ACCOUNTS)
