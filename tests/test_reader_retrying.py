"""A reader that retries a failing write says so while it lasts (issue 18, found by the chaos
suite): before, only its own log did, and the status went on showing ``Streaming``.

Real parts: PostgreSQL, the reader as a real process, staging made full (a tmpfs of its own
shrunk to what it holds: ``ENOSPC``) or unwritable (``chattr +i``) with the chaos harness's
helpers — both need root or ``CAP_SYS_ADMIN``.

- Local mode: ``lakeslot run`` as a real process (Spark snapshot and apply job included): what
  ``lakeslot status`` computes (``observe`` on the state directory) and the run's own log show
  ``Streaming: StagingUnwritable`` with the OS's error while staging is full, and ``Streaming``
  True again after, with every change written meanwhile applied.
- Kubernetes mode: the operator's reconcile (kmock) with the reader pod's ``/status`` served by
  the reader process the Deployment describes: ``Streaming: StagingUnwritable`` while staging is
  immutable, not after.

What is reported depends on the reader's retry loop, not on the server's version: one version
per test (``one_version``).
"""

from __future__ import annotations

import functools
import json
import subprocess

import kubernetes.client
import psycopg
import pytest

from lakeslot.api.models import PostgresIngestionStatus
from lakeslot.exits import EXIT_OK
from lakeslot.local import display, observe
from lakeslot.local.pgcluster import free_port
from lakeslot.observability import reader_status as observability_reader_status
from lakeslot.staging.store import Staging
from lakeslot_operator import reader_status
from lakeslot_operator.kube import Kube
from lakeslot_operator.reconcile import Context, reconcile
from tests.chaos import harness
from tests.support import local_support, operator_env
from tests.support.reader_support import current_lsn
from tests.support.waiting import wait_for

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

DEADLINE_S = 300  # a Spark JVM's start and a snapshot on a shared 2-core machine


def _streaming(status: PostgresIngestionStatus):
    return next((c for c in status.conditions if c.type == "Streaming"), None)


def _change(conn: psycopg.Connection) -> int:
    """One committed change to accounts (WAL moves, so the reader has something to write);
    its LSN."""
    conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
    return current_lsn(conn)


def _sealed_end(staging) -> int:
    last = Staging(staging.as_uri()).resume_point()
    return 0 if last is None else last.end


def test_a_run_shows_the_reader_retrying_on_a_full_staging_and_clears_after(pgdb, tmp_path):
    with pgdb.connect() as conn:
        local_support.create_accounts(conn, 100)
    path, staging, state_dir = tmp_path / "ingestion.yaml", tmp_path / "staging", tmp_path / "state"
    log = tmp_path / "run.log"
    with harness.staging_on_tmpfs(staging), pgdb.connect(autocommit=True) as conn:
        local_support.write_ingestion(path, pgdb, [local_support.ACCOUNTS], tmp_path)
        local = local_support.local(path, pgdb, state_dir)
        run = local_support.spawn_run(path, pgdb, state_dir, log)
        try:
            def status() -> PostgresIngestionStatus:
                return observe.observe(local, observe.activity(local))  # as lakeslot status does

            def streaming_again() -> bool:
                condition = _streaming(status())
                return condition is not None and condition.status == "True"

            wait_for(streaming_again, "the run to stream (snapshot copied, apply job running)",
                     deadline=DEADLINE_S, interval=1.0)
            before = _change(conn)
            wait_for(lambda: _sealed_end(staging) >= before, "the reader to seal a change")

            used = wait_for(lambda: harness.shrink_to_used(staging), "staging made full")

            def reported() -> PostgresIngestionStatus | None:
                _change(conn)
                now = status()
                condition = _streaming(now)
                return now if condition and condition.reason == observability_reader_status.STAGING_UNWRITABLE else None

            full = wait_for(reported, f"Streaming: StagingUnwritable while staging is full "
                            f"({used} bytes used)", deadline=120, interval=0.5)
            assert full is not None  # wait_for returns a truthy value
            condition = _streaming(full)
            assert condition is not None and condition.status == "False"
            assert "No space left on device" in condition.message, condition.message
            ready = next(c for c in full.conditions if c.type == "Ready")
            assert (ready.status, ready.reason) == ("False", observability_reader_status.STAGING_UNWRITABLE)
            frame = display.frame(local, full, 0.0, None)
            assert any(line.startswith("Streaming: StagingUnwritable: the reader retries")
                       for line in frame), frame

            def logged() -> bool:  # (the run computes its status less often than this test,
                # and the apply job's retention makes room in staging: it is kept full)
                harness.shrink_to_used(staging)
                _change(conn)
                return b"Streaming: StagingUnwritable" in log.read_bytes()

            wait_for(logged, "the run's log to say the reader retries (not only the reader's log)",
                     interval=0.5)
            assert run.poll() is None

            harness.restore_size(staging)
            last = _change(conn)
            wait_for(streaming_again, "Streaming True again once staging has room",
                     deadline=120, interval=0.5)
            document = json.loads((state_dir / "reader-status.json").read_text())
            assert document["state"] == observability_reader_status.RUNNING, document
            wait_for(lambda: harness.applied_past(local, [local_support.ACCOUNTS], last),
                     "every change written while staging was full applied", deadline=120)
        finally:
            if run.poll() is None:
                local_support.interrupt(run)
            code = run.wait(harness.STOP_DEADLINE_S)
    assert code == EXIT_OK, log.read_text()[-4000:]


def test_the_operator_reports_the_reader_retrying_on_an_unwritable_staging(
        api, pgdb, spark_warehouse, tmp_path):
    name = "retrying"
    with pgdb.connect() as conn:
        local_support.create_accounts(conn, 10)
    staging = tmp_path / "staging"
    document = operator_env.ingestion_document(name, pgdb, [local_support.ACCOUNTS], warehouse=spark_warehouse.as_uri(),
                                               staging=staging.as_uri(), reader={"segmentMaxSeconds": 1})
    operator_env.create_ingestion(api, document, pgdb.cluster.password)
    reader_port = free_port()
    context = Context(kube=Kube(api),
                      reader_status=functools.partial(reader_status.fetch, port=reader_port))

    def streaming() -> dict:
        body = operator_env.get_ingestion(api, name)
        assert body is not None
        outcome = reconcile(body, context)  # as the kopf handler: the status written back
        kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            *operator_env.CUSTOM, name, {"status": outcome.status})
        return operator_env.required_condition(operator_env.get_ingestion(api, name) or {}, "Streaming")

    streaming()  # the slot, the publication and the reader Deployment
    (container,) = operator_env.deployments(api)[f"{name}-reader"]["spec"]["template"]["spec"]["containers"]
    pod = f"{name}-reader-0"
    operator_env.reader_pod_running(api, name, pod)
    kubernetes.client.CoreV1Api(api).patch_namespaced_pod_status(
        pod, operator_env.NAMESPACE, {"status": {"podIP": "127.0.0.1"}})
    argv = [local_support.LAKESLOT, *container["command"][1:], "--metrics-port", str(reader_port)]
    with open(tmp_path / "reader.log", "wb") as log:
        reader = subprocess.Popen(argv, env=operator_env.container_environment(api, container, home=tmp_path,
                                                                               pod=pod),
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        with pgdb.connect(autocommit=True) as conn:
            first = _change(conn)
            wait_for(lambda: _sealed_end(staging) >= first, "the reader to seal a change")
            assert streaming()["reason"] == "WaitingForSnapshot"  # nothing wrong with the reader
            with harness.immutable(staging):
                def reported() -> dict | None:
                    _change(conn)
                    condition = streaming()
                    return condition if condition["reason"] == observability_reader_status.STAGING_UNWRITABLE else None

                condition = wait_for(reported, "Streaming: StagingUnwritable from the reader pod",
                                     deadline=120, interval=0.5)
                assert condition is not None  # wait_for returns a truthy value
                assert condition["status"] == "False"
                assert "Operation not permitted" in condition["message"], condition["message"]
                assert pgdb.cluster.password not in condition["message"]
                assert reader.poll() is None
            last = _change(conn)
            wait_for(lambda: _sealed_end(staging) >= last, "the reader to seal again")
            wait_for(lambda: streaming()["reason"] == "WaitingForSnapshot",
                     "the reader's problem to clear once staging is writable", interval=0.5)
    finally:
        reader.terminate()
        reader.wait(60)
