"""``lakeslot run`` starts as documented: real PostgreSQL, the reader as a real child process, the
tests' Spark session with Iceberg, the mirrors read with pyiceberg and compared with the source.

- ``snapshot.mode: never``: the start copies no table — the mirror starts empty and holds exactly
  the rows changed after the slot was created —, as under the operator.
- Staging that cannot be reached at the start is waited for, with backoff and a line that says
  what the run waits for; once it is back the run goes on and catches up (it used to exit).
"""

from __future__ import annotations

import io
import threading

import pytest
import yaml

from lakeslot.api.naming import TableName
from lakeslot.local import apply_loop, outages, run
from lakeslot.mirror.catalogs import load_hadoop_table
from tests.support import local_support
from tests.support.apply_support import assert_table_equals_source
from tests.support.waiting import wait_for

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)


def _local(db, tmp_path, warehouse, **spec):
    path = tmp_path / "ingestion.yaml"
    with db.connect() as conn:
        table = local_support.create_accounts(conn, 50)
    document = local_support.write_ingestion(path, db, [table], tmp_path, warehouse=warehouse)
    for section, values in spec.items():
        document["spec"][section] = {**document["spec"].get(section, {}), **values}
    path.write_text(yaml.safe_dump(document))
    return local_support.local(path, db, tmp_path / "state"), table


def _mirror(local, table):
    warehouse = local.ingestion.spec.sink.catalog.warehouse
    assert warehouse is not None  # (a hadoop catalog)
    return load_hadoop_table(warehouse, local.job.names.mirror_identifier(table))


def test_never_mode_starts_the_mirror_empty_and_streams_what_changed_after_the_slot(
        pgdb, tmp_path, spark, spark_warehouse):
    local, table = _local(pgdb, tmp_path, spark_warehouse, snapshot={"mode": "never"})
    local_support.run_in_process(local, spark, once=True)
    mirror = _mirror(local, table)
    assert mirror is not None and mirror.scan().to_arrow().num_rows == 0  # no copy of the 50 rows
    assert "lakeslot.snapshot-lsn" not in mirror.properties

    with pgdb.connect() as conn:  # only rows written after the slot: inserts, then their changes
        conn.execute("CREATE TABLE after_slot AS SELECT * FROM accounts WHERE false")
        conn.execute("INSERT INTO accounts (id, balance, note) SELECT i, i, 'new' "
                     "FROM generate_series(1001, 1030) i")
        conn.execute("UPDATE accounts SET balance = -balance WHERE id > 1020")
        conn.execute("DELETE FROM accounts WHERE id BETWEEN 1001 AND 1005")
        conn.execute("INSERT INTO after_slot SELECT * FROM accounts WHERE id > 1000")
    local_support.run_in_process(local, spark, once=True)
    mirror = _mirror(local, table)
    assert mirror is not None
    expected = TableName("public", "after_slot")
    assert_table_equals_source(pgdb, mirror, expected)


def test_staging_unreachable_at_the_start_is_waited_for_and_the_run_goes_on(
        pgdb, tmp_path, spark, spark_warehouse):
    """Staging under a path that is a file (OSError, as an unreachable store gives): the run
    waits, says so, and catches up once the path can be created."""
    blocker = tmp_path / "outage"
    blocker.write_text("not a directory")
    local, table = _local(pgdb, tmp_path, spark_warehouse,
                          staging={"uri": (blocker / "staging").as_uri()})
    out = io.StringIO()

    def restore() -> None:
        wait_for(lambda: "waiting for staging" in out.getvalue(), "the run to wait for staging")
        wait_for(lambda: out.getvalue().count("waiting for staging") >= 2, "a second attempt")
        blocker.unlink()

    restorer = threading.Thread(target=restore, daemon=True)
    restorer.start()
    result = run.run(local, run.Options(once=True, spark=spark, out=out, interactive=False))
    restorer.join()
    assert result.code == 0, result.message + out.getvalue()[-3000:]
    waiting = [line for line in out.getvalue().splitlines() if "waiting for staging" in line]
    assert "spec.staging.uri" in waiting[0] and "retrying in 1 s" in waiting[0], waiting
    assert "retrying in 2 s" in waiting[1], waiting
    mirror = _mirror(local, table)
    assert mirror is not None
    assert_table_equals_source(pgdb, mirror, table)


def test_staging_unreachable_while_streaming_is_waited_out_past_the_restart_limit(
        pgdb, tmp_path, spark, spark_warehouse, monkeypatch):
    """Staging made unreachable under a streaming run (its directory replaced by a file: every
    listing fails with an OSError, as an unreachable store's does): the apply job's restarts are
    announced as waiting for staging, more of them than a transient failure gets before the run
    gives up, and once staging is back the run catches up, the mirror equal to its source. The
    backoff is shortened for the test (``OUTAGE_BACKOFF_S``); its doubling is the production one."""
    monkeypatch.setattr(outages, "OUTAGE_BACKOFF_S", 0.05)
    local, table = _local(pgdb, tmp_path, spark_warehouse, apply={"triggerIntervalSeconds": 1})
    staging = tmp_path / "staging"
    assert local.ingestion.spec.staging.uri == staging.as_uri()
    out = io.StringIO()

    def outage() -> None:
        wait_for(lambda: (staging / "apply-status.json").exists(), "the apply job's first pass")
        staging.rename(tmp_path / "staging-away")
        staging.write_text("not a directory")
        with pgdb.connect() as conn:  # changes while staging is away: the reader holds them
            conn.execute("UPDATE accounts SET balance = balance + 7 WHERE id <= 20")
            conn.execute("DELETE FROM accounts WHERE id > 45")
        wait_for(lambda: out.getvalue().count("waiting for staging") > apply_loop.APPLY_RESTARTS + 1,
                 "more outage restarts than the transient limit")
        staging.unlink()
        (tmp_path / "staging-away").rename(staging)

        def caught_up() -> bool:
            try:
                assert_table_equals_source(pgdb, _mirror(local, table), table)
            except AssertionError:
                return False
            return True

        wait_for(caught_up, "the mirror equal to its source after staging came back")

    local_support.run_in_process(local, spark, once=False, during=outage, out=out)
    waiting = [line for line in out.getvalue().splitlines() if "waiting for staging" in line]
    assert "spec.staging.uri" in waiting[0] and "NotADirectoryError" in waiting[0], waiting
