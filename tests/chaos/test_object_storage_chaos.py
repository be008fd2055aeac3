"""The chaos suite's kill -9 on the production configuration — staging on S3, the mirrors in an
Iceberg REST catalog with ``S3FileIO`` (SeaweedFS ``weed mini``: tests/support/fixtures_s3.py) —
and a catalog commit conflict; afterwards every mirror equals its source, row by row.

``lakeslot run`` (a real process, kept running by the chaos suite's :class:`Supervisor`) streams
the chaos workload into S3 staging and commits to the REST catalog through
:class:`tests.support.rest_proxy.CommitProxy` (the real catalog behind a proxy that can act while
a commit is in flight). Two rounds:

1. SIGKILL of the run and its Spark JVM while an apply commit is in flight: the proxy holds the
   commit, kills them, then forwards it — the commit lands after its writer died, and the run the
   supervisor starts again must neither apply those changes a second time nor lose them;
2. another writer commits to a mirror between the apply job's read and its commit: right before
   the proxy forwards an apply commit, a data-neutral ``replace`` snapshot (a manifest rewrite,
   as a managed catalog's own maintenance makes) is committed to that table through the catalog
   itself, so the catalog answers the apply commit with a real 409; Iceberg's retry commits it on
   top of the other writer's snapshot.

Then the workload stops, the run catches up and is stopped with Ctrl-C (SIGINT: exit 0; no process
and no temporary slot left behind, the slot released), and each mirror, read by pyiceberg through
the REST catalog (not through lakeslot's code), is compared with its source row by row. One
PostgreSQL version: the faults are the catalog's and the process's, not the source's
(tests/chaos/test_chaos.py runs every fault, a SIGKILL of the run at a random moment among them,
on both versions and the default configuration). The workload is the
chaos suite's, seeded (``LAKESLOT_CHAOS_SEED`` replays it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import urllib.parse
import uuid

import pytest
import yaml
from pyiceberg.catalog import load_catalog

from lakeslot.local import config
from lakeslot.local.objectstore import REST_CATALOG, STAGING_BUCKET, ObjectStore
from lakeslot.local.tree import alive, descendants
from lakeslot.spark.tables import Catalog
from tests.chaos import harness
from tests.chaos.test_chaos import RECOVERY_DEADLINE_S, SEED
from tests.support import fixtures_s3, local_support
from tests.support.apply_support import assert_table_equals_source, lsn_now
from tests.support.apply_workload import IDLE, KEYLESS, MAIN
from tests.support.rest_proxy import CommitProxy
from tests.support.waiting import wait_for

pytestmark = pytest.mark.one_version

TABLES = [MAIN, KEYLESS, IDLE, local_support.ACCOUNTS]


def _pyiceberg_catalog(store: ObjectStore):
    """The REST catalog opened with pyiceberg's own settings, not lakeslot's translation."""
    document = store.catalog_document()
    return load_catalog("independent", **{**document["properties"], **store.catalog_secrets(),
                                          "type": "rest", "uri": store.rest_uri,
                                          "warehouse": document["warehouse"]})


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_kill_9_and_a_commit_conflict_on_s3_and_a_rest_catalog_lose_nothing(
        pgdb, rest_spark, object_store, tmp_path, monkeypatch):
    replay = f"chaos seed {SEED} (replay: LAKESLOT_CHAOS_SEED={SEED})"
    db, store = pgdb, object_store
    with db.connect() as conn:
        harness.create_tables(conn)
    proxy = CommitProxy(store.rest_uri)
    document = fixtures_s3.ingestion_document(db, f"s3://{STAGING_BUCKET}/{uuid.uuid4().hex[:12]}", TABLES,
                                              {**store.catalog_document(), "uri": proxy.uri})
    document["spec"]["source"]["tables"] = [
        {"schema": t.schema, "name": t.name, **({"keyColumns": ["a"]} if t == KEYLESS else {})}
        for t in TABLES]
    path, state_dir, log = tmp_path / "ingestion.yaml", tmp_path / "state", tmp_path / "run.log"
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    environment = fixtures_s3.run_environment(db, store, store.catalog_secrets())
    for name, value in store.environment().items():  # (this process reads staging too: the
        monkeypatch.setenv(name, value)  # apply job's status says how far idle tables are)
    local = config.load(str(path), state_dir=str(state_dir), environ=environment)
    secrets = local.job.catalog_secrets(environment)
    supervisor = harness.Supervisor(path, db, state_dir, log, environ=environment)
    namespace = local.job.names.sink_namespace
    other_writer = Catalog(rest_spark, REST_CATALOG)  # the catalog loaded here, not in the proxy's thread
    acted: dict[str, str] = {}  # round → the table whose commit the proxy acted on

    def recovered(what: str) -> None:
        target = lsn_now(db)
        wait_for(lambda: supervisor.ensure_running() and harness.applied_past(local, TABLES, target, secrets),
                 f"{what}: the mirrors to get past {target:X}; {replay}", deadline=RECOVERY_DEADLINE_S,
                 interval=2)
        print(f"{what}: recovered")

    def kill_while_committing(table: str) -> None:
        """The run and every process below it, its Spark JVM among them, die (as a pod does) while
        their commit waits here."""
        pids = {supervisor.run.pid} | descendants(supervisor.run.pid)
        supervisor.seen |= pids
        for pid in alive(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        acted["kill"] = table
        wait_for(lambda: not alive(pids - {supervisor.run.pid}), "the killed run's processes to be gone")

    def commit_first(table: str) -> None:
        """Another writer's data-neutral commit to ``table`` (a manifest rewrite: ``replace``)."""
        acted["conflict"] = table
        name = urllib.parse.unquote(table.split(".", 1)[1])
        other_writer.java_table(namespace, name).rewriteManifests().commit()

    with supervisor.abandoned_on_failure():
        writer = harness.Writer(db, SEED)
        try:
            supervisor.start()
            recovered("the snapshot and the first apply")

            supervisor.expected.add(-signal.SIGKILL)
            before = len(proxy.commits)
            proxy.arm(kill_while_committing)
            wait_for(proxy.fired.is_set, "an apply commit to kill the run during", deadline=RECOVERY_DEADLINE_S)
            recovered("round 1 (SIGKILL of the run and its JVM while its commit was in flight)")
            assert supervisor.exits[-signal.SIGKILL] == 1, dict(supervisor.exits)
            assert (acted["kill"], 200) in proxy.commits[before:], proxy.commits  # it landed

            before = len(proxy.commits)
            proxy.arm(commit_first)
            wait_for(proxy.fired.is_set, "an apply commit to conflict with", deadline=RECOVERY_DEADLINE_S)
            assert proxy.errors == [], proxy.errors
            recovered("round 2 (another writer committed between the apply's read and its commit)")
            after = proxy.commits[before:]
            assert (acted["conflict"], 409) in after, (acted, after)
            refused = after.index((acted["conflict"], 409))  # the catalog refused the commit...
            assert (acted["conflict"], 200) in after[refused + 1:], after  # ...and the retry landed
        finally:
            transactions = writer.stop()
        assert proxy.errors == [], proxy.errors
        recovered("the last changes")
        supervisor.finish(signal.SIGINT)  # Ctrl-C
        supervisor.close()
    proxy.close()

    catalog = _pyiceberg_catalog(store)
    for table in TABLES:
        assert_table_equals_source(db, catalog.load_table(local.job.names.mirror_identifier(table)), table)
    wait_for(lambda: not alive(supervisor.seen), f"no process left behind; {replay}")
    assert local_support.temporary_slots(db) == []
    with db.connect() as conn:
        assert conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                            (local.job.names.slot,)).fetchone() == (False,)
    text = log.read_text(errors="replace")
    assert store.secret_key not in text and db.cluster.password not in text
    print(f"{replay}: run exits {dict(supervisor.exits)}; {transactions} units of work; "
          f"{len(proxy.commits)} apply commits through the catalog; every table equal")
