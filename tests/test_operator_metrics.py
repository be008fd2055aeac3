"""The operator's Prometheus metrics: what a scrape of the operator pod's ``/metrics`` says, checked
against PostgreSQL itself while an ingestion streams.

End to end with the real kopf operator (lakeslot's registry, its metrics served over HTTP) on the
Kubernetes API emulator, real PostgreSQL 15 and 18 and real Spark + Iceberg. Simulated, because
pods cannot run here (tests/support/operator_env.py): the spark-operator (the snapshot is taken
by ``lakeslot run --once`` in this process, whose reader is registered as the reader pod; the
apply SparkApplication's job is run in this process from its own arguments) and the Deployment
controller and kubelet (the reader Deployment's container command runs as a process, with the
environment the kubelet would give it).
"""

from __future__ import annotations

import signal
import subprocess
from datetime import UTC, datetime

import kubernetes.client
import pytest

from lakeslot import workloads
from lakeslot.api.models import Condition, PostgresIngestionStatus, ReaderStatus, SlotStatus, TableStatus
from lakeslot.apply import job as apply_job
from lakeslot.local import reader_process
from lakeslot.local.pgcluster import free_port
from lakeslot.observability.metrics import Sample, samples
from lakeslot.source import connection
from lakeslot.staging.store import Staging
from lakeslot_operator.handlers import build_registry
from lakeslot_operator.kube import Kube
from lakeslot_operator.metrics import OperatorMetrics
from lakeslot_operator.reconcile import Context, Outcome, reconcile
from spark_jobs import snapshot as snapshot_entry
from tests.support import chart, local_support, operator_env, promql
from tests.support.fixtures_kube import running_operator
from tests.support.prometheus import Scrape, scrape
from tests.support.waiting import wait_for

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
NAME = "shop"
TABLE = str(local_support.ACCOUNTS)
RETRY_DEADLINE_S = 180.0  # kopf retries a handler that raised after 60 s


# the values, from a status ------------------------------------------------------------------

def _condition(type_: str, status: str, reason: str) -> Condition:
    return Condition(type=type_, status=status, reason=reason, last_transition_time=NOW)  # type: ignore[arg-type]


def test_samples_are_the_status_in_numbers():
    reader = connection.application_name("reader", "shop/orders", "orders-reader-1")
    status = PostgresIngestionStatus(
        slot=SlotStatus(name="s", active_pid=42, holder=reader, wal_status="unreserved",
                        retained_bytes=5000, safe_wal_size=None),
        reader=ReaderStatus(pod="orders-reader-1", lag_bytes=300),
        lag_bytes=7000,
        conditions=[_condition("SlotReady", "False", "SlotLost"), _condition("Streaming", "Unknown", "X")],
        tables=[TableStatus(schema_name="public", name="a", state="Streaming", applied_lsn="0/10",
                            rows_known=3, lag_seconds=4),
                TableStatus(schema_name="Odd \"s\"", name="b", state="Failed"),
                TableStatus(schema_name="public", name="gone", state="Removed", applied_lsn="0/5")])
    got = {(s.metric, s.labels): s.value for s in samples(status, owner="shop/orders", suspended=False)}
    assert got[("slot_retained_wal_bytes", ())] == 5000 and ("slot_safe_wal_size_bytes", ()) not in got
    assert {k[1][0]: v for k, v in got.items() if k[0] == "slot_wal_status"} == {
        "reserved": 0, "extended": 0, "unreserved": 1, "lost": 0}
    assert {k[1][0]: v for k, v in got.items() if k[0] == "slot_holder"} == {"reader": 1, "other": 0, "none": 0}
    assert got[("slot_active", ())] == 1 and got[("slot_confirmed_flush_lag_bytes", ())] == 300
    assert got[("definite_error", ())] == 1 and got[("suspended", ())] == 0
    assert got[("condition", ("SlotReady", "False"))] == 1 and got[("condition", ("SlotReady", "True"))] == 0
    assert got[("condition", ("Streaming", "Unknown"))] == 1
    assert {k[1][0]: v for k, v in got.items() if k[0] == "tables"} == {
        "Pending": 0, "Snapshotting": 0, "Streaming": 1, "Failed": 1, "Removed": 1}
    assert got[("table_applied_lsn", ("public.a",))] == 0x10
    assert got[("table_freshness_seconds", ("public.a",))] == 4 and got[("table_rows", ("public.a",))] == 3
    assert got[("table_failed", ('"Odd ""s""".b',))] == 1 and got[("table_failed", ("public.a",))] == 0
    assert not any(k[1] == ("public.gone",) for k in got)  # a Removed table has no series

    # Another backend holds the slot (the reader is someone else), then nobody does.
    status.slot = SlotStatus(active_pid=7, holder="pg_recvlogical")
    kinds = {s.labels[0]: s.value for s in samples(status, owner="shop/orders", suspended=True)
             if s.metric == "slot_holder"}
    assert kinds == {"reader": 0, "other": 1, "none": 0}
    status.slot = SlotStatus()
    assert Sample("slot_holder", ("none",), 1.0) in samples(status, owner="shop/orders", suspended=True)


def test_the_apply_jobs_last_pass_in_numbers():
    document = {"updatedAt": "2026-11-25T12:00:00.250000Z", "tables": [
        {"schema": "public", "name": "a", "state": "applied", "changes": 12},
        {"schema": "public", "name": "b", "state": "advanced", "changes": 0},
        {"schema": "public", "name": "c", "state": "failed", "changes": 0}]}
    got = {(s.metric, s.labels): s.value
           for s in samples(PostgresIngestionStatus(), owner="shop/orders", suspended=False, apply_pass=document)}
    assert got[("apply_last_pass_timestamp_seconds", ())] == NOW.timestamp() + 0.25
    assert {k[1][0]: v for k, v in got.items() if k[0] == "apply_pass_tables"} == {
        "applied": 1, "advanced": 1, "current": 0, "waiting": 0, "failed": 1, "retrying": 0}
    assert got[("apply_pass_changes", ("public.a",))] == 12 and got[("apply_pass_changes", ("public.b",))] == 0
    assert not any(m.startswith("apply_") for m, _ in
                   {(s.metric, s.labels) for s in samples(PostgresIngestionStatus(), owner="shop/orders",
                                                          suspended=False)})  # no document: no series


def test_the_apply_jobs_totals_are_counters_from_its_start():
    document = {"updatedAt": "2026-11-25T12:00:00.250000Z", "tables": [], "totals": {
        "startedAt": "2026-11-25T11:00:00.000000Z", "passes": 7,
        "seconds": {"merge": 3.5, "reduce": 1.25, "a-new-step": 9.0},
        "changes": {"public.a": {"I": 5, "U": 2}, '"odd name".b': {"T": 1}},
        "retries": {"public.a": 2, "reading lakeslot's DDL messages": 1},
        "maintenance": {"ran": 3}}}
    got = {(s.metric, s.labels): s.value for s in samples(
        PostgresIngestionStatus(), owner="shop/orders", suspended=False, apply_pass=document)}
    assert got[("apply_started_timestamp_seconds", ())] == NOW.timestamp() - 3600
    assert got[("apply_passes", ())] == 7 and got[("apply_retries", ())] == 3
    steps = {k[1][0]: v for k, v in got.items() if k[0] == "apply_pass_seconds"}
    assert steps["merge"] == 3.5 and steps["reduce"] == 1.25 and steps["status"] == 0
    assert "a-new-step" not in steps  # only the documented steps: bounded label values
    assert {k[1]: v for k, v in got.items() if k[0] == "apply_changes" and v} == {
        ("public.a", "insert"): 5, ("public.a", "update"): 2, ('"odd name".b', "truncate"): 1}
    assert got[("apply_maintenance_runs", ("ran",))] == 3
    assert got[("apply_maintenance_runs", ("failed",))] == 0
    # exported as counters: a restarted job's smaller values are a reset, not a fall
    metrics = OperatorMetrics()
    metrics.observe("shop", "orders", {}, suspended=False, events=[], apply_pass=document)
    assert metrics.registry.get_sample_value(
        "lakeslot_apply_changes_total",
        {"namespace": "shop", "ingestion": "orders", "table": "public.a", "op": "insert"}) == 5
    assert metrics.registry.get_sample_value(
        "lakeslot_apply_passes_total", {"namespace": "shop", "ingestion": "orders"}) == 7


def test_series_of_a_deleted_or_silent_ingestion_disappear():
    clock = [0.0]
    metrics = OperatorMetrics(max_age=60, clock=lambda: clock[0])
    status = {"lagBytes": 5}
    metrics.observe("a", "one", status, suspended=False, events=[])
    metrics.observe("a", "two", status, suspended=False, events=[])
    with pytest.raises(RuntimeError), metrics.reconciling("a", "two"):
        raise RuntimeError("boom")

    def ingestions() -> set[str]:
        return {s.labels["ingestion"] for m in metrics.registry.collect() for s in m.samples
                if s.name == "lakeslot_lag_bytes"}

    assert ingestions() == {"one", "two"}
    assert metrics.registry.get_sample_value("lakeslot_reconcile_errors_total",
                                             {"namespace": "a", "ingestion": "two"}) == 1
    metrics.forget("a", "two")
    assert ingestions() == {"one"}
    assert metrics.registry.get_sample_value("lakeslot_reconcile_errors_total",
                                             {"namespace": "a", "ingestion": "two"}) is None
    clock[0] = 61  # no reconcile refreshed "one" for longer than max_age (e.g. a paused replica)
    assert ingestions() == set()


def test_the_snapshots_progress_in_numbers():
    document = {"tables": [
        {"schema": "public", "name": "a", "state": "copying", "rowsEstimated": 1000, "rowsStaged": 250},
        {"schema": "public", "name": "b", "state": "committed", "rowsEstimated": None, "rowsStaged": 7},
        {"schema": "public", "name": "c", "state": "skipped", "rowsEstimated": 5, "rowsStaged": 0}]}
    got = {(s.metric, s.labels): s.value for s in samples(PostgresIngestionStatus(), owner="shop/orders",
                                                          suspended=False, snapshot=document)}
    assert {k: v for k, v in got.items() if k[0].startswith("table_snapshot")} == {
        ("table_snapshot_rows", ("public.a",)): 250, ("table_snapshot_rows_estimated", ("public.a",)): 1000,
        ("table_snapshot_rows", ("public.b",)): 7}  # never analyzed: no estimate; skipped: not copied


# end to end ----------------------------------------------------------------------------------


def _reconciled(api, metrics: OperatorMetrics) -> Outcome:
    """One reconcile of the ingestion, its status written back and its outcome observed, as the
    kopf handler does (lakeslot_operator.handlers.change)."""
    body = operator_env.get_ingestion(api, NAME) or {}
    outcome = reconcile(body, Context(kube=Kube(api)))
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        *operator_env.CUSTOM, NAME, {"status": outcome.status})
    metrics.observe(operator_env.NAMESPACE, NAME, outcome.status, events=outcome.events,
                    suspended=bool(body.get("spec", {}).get("suspend")), apply_pass=outcome.apply_pass,
                    snapshot=outcome.snapshot)
    return outcome


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)
def test_slot_inactive_and_not_ready_fire_unless_the_ingestion_is_suspended(api, pgdb, tmp_path):
    """Nobody streams from the slot (no reader runs) and the ingestion is not Ready: both alerts
    fire, and both hold their fire once it is suspended (then nothing streams by design); retained
    WAL still alerts while suspended."""
    with pgdb.connect() as conn:
        local_support.create_accounts(conn, 10)
    document = operator_env.ingestion_document(NAME, pgdb, [local_support.ACCOUNTS],
                                               warehouse=(tmp_path / "warehouse").as_uri(),
                                               staging=(tmp_path / "staging").as_uri())
    operator_env.create_ingestion(api, document, pgdb.cluster.password)
    metrics = OperatorMetrics()
    server = metrics.serve(0, "127.0.0.1")
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        _reconciled(api, metrics)
        alerts = _alerts(walRetainedBytes=int(_mine(scrape(url), "lakeslot_slot_retained_wal_bytes") or 0) + 100_000)
        result = scrape(url)
        assert _mine(result, "lakeslot_slot_active") == 0 and _mine(result, "lakeslot_suspended") == 0
        assert _firing(alerts, "LakeslotSlotInactive", result) == {INGESTION: 0}
        assert _firing(alerts, "LakeslotNotReady", result) == {INGESTION: 0}

        kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
            *operator_env.CUSTOM, NAME, {"spec": {"suspend": True}})
        with pgdb.connect() as conn:
            conn.execute("INSERT INTO accounts (id, balance, note) SELECT i, 0, repeat(md5(i::text), 10)"
                         " FROM generate_series(1000, 5000) AS i")  # retained while suspended
        _reconciled(api, metrics)
        result = scrape(url)
        assert _mine(result, "lakeslot_suspended") == 1 and _mine(result, "lakeslot_slot_active") == 0
        assert _mine(result, "lakeslot_condition", type="Ready", status="True") == 0
        assert _firing(alerts, "LakeslotSlotInactive", result) == {}
        assert _firing(alerts, "LakeslotNotReady", result) == {}
        assert _firing(alerts, "LakeslotWalRetainedHigh", result) == {
            INGESTION: _mine(result, "lakeslot_slot_retained_wal_bytes")}
    finally:
        server.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("pg", ["pg15"], indirect=True)
def test_the_snapshot_jobs_rows_reach_the_operators_metrics(api, pgdb, spark, spark_warehouse, tmp_path,
                                                            monkeypatch):
    """The snapshot SparkApplication's job, run here from its own arguments (simulated
    spark-operator), writes its progress where the next reconcile reads it."""
    with pgdb.connect() as conn:
        local_support.create_accounts(conn, 3_000)
        estimated = conn.execute("SELECT reltuples::int8 FROM pg_class WHERE oid = 'accounts'::regclass").fetchone()
    document = operator_env.ingestion_document(NAME, pgdb, [local_support.ACCOUNTS], warehouse=spark_warehouse.as_uri(),
                                               staging=(tmp_path / "staging").as_uri(),
                                               snapshot={"parallelism": 2, "targetRangeBytes": 1 << 20})
    operator_env.create_ingestion(api, document, pgdb.cluster.password)

    metrics = OperatorMetrics()
    assert _reconciled(api, metrics).snapshot is None  # no snapshot ran yet
    (application,) = operator_env.spark_applications(api).values()
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)
    arguments = operator_env.mounted(api, application, application["spec"]["arguments"], tmp_path)
    assert snapshot_entry.main(arguments, spark=spark) == 0
    assert _reconciled(api, metrics).snapshot is not None
    labels = {"namespace": operator_env.NAMESPACE, "ingestion": NAME, "table": TABLE}
    assert metrics.registry.get_sample_value("lakeslot_table_snapshot_rows", labels) == 3_000
    assert estimated is not None and estimated[0] == 3_000
    assert metrics.registry.get_sample_value("lakeslot_table_snapshot_rows_estimated", labels) == 3_000

INGESTION = frozenset({("namespace", operator_env.NAMESPACE), ("ingestion", NAME)})


def _alerts(**thresholds: int) -> dict[str, dict]:
    return chart.alerts(**thresholds)


def _dashboard() -> dict:
    return chart.dashboard(chart.render({**chart.SERVED, "metrics": {"dashboard": {"enabled": True}}}))


def _firing(alerts: dict[str, dict], name: str, result: Scrape) -> dict:
    return promql.firing(alerts, name, result, INGESTION)

def _wal(db) -> tuple[int, int, int, int]:
    """PostgreSQL's own answer: retained bytes (current − restart_lsn), current − confirmed_flush,
    safe_wal_size and the current LSN."""
    with db.connect() as conn:
        row = conn.execute(
            "SELECT (pg_current_wal_lsn() - restart_lsn)::int8,"
            " (pg_current_wal_lsn() - confirmed_flush_lsn)::int8, safe_wal_size,"
            " (pg_current_wal_lsn() - '0/0')::int8"
            " FROM pg_replication_slots WHERE slot_name = %s", (f"lakeslot_default_{NAME}",)).fetchone()
    assert row is not None
    return row


def _keep_slot_wal(db, size: str | None) -> None:
    """``max_slot_wal_keep_size`` (a reload suffices); None: the server's default (no limit)."""
    with db.connect() as conn:
        conn.execute(f"ALTER SYSTEM SET max_slot_wal_keep_size = '{size}'" if size
                     else "ALTER SYSTEM RESET max_slot_wal_keep_size")
        conn.execute("SELECT pg_reload_conf()")


def _mine(result: Scrape, name: str, **labels: str) -> float | None:
    return result.value(name, namespace=operator_env.NAMESPACE, ingestion=NAME, **labels)


def _status_table(api) -> dict:
    resource = operator_env.get_ingestion(api, NAME) or {}
    return next((t for t in resource.get("status", {}).get("tables", []) if t["name"] == "accounts"), {})


@pytest.mark.slow
def test_a_scrape_agrees_with_postgresql_while_an_ingestion_streams(
        kube, api, pgdb, spark, spark_warehouse, tmp_path, monkeypatch):
    with pgdb.connect() as conn:
        local_support.create_accounts(conn, 2_000)
    document, local = operator_env.operator_and_local(NAME, pgdb, [local_support.ACCOUNTS], tmp_path,
                                                      warehouse=spark_warehouse)
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)  # the apply job's, in process
    metrics = OperatorMetrics()
    server = metrics.serve(0, "127.0.0.1")
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    registry = build_registry(Context(kube=Kube(api)), timer_interval=1.0, login_via_client=False,
                              metrics=metrics)
    reader: subprocess.Popen | None = None
    _keep_slot_wal(pgdb, "10GB")  # so that the slot has a safe_wal_size (a reload, for this test)
    try:
        with running_operator(kube, registry):
            operator_env.create_ingestion(api, document, pgdb.cluster.password)
            wait_for(lambda: f"{NAME}-reader" in operator_env.deployments(api), "the reader Deployment")
            operator_env.reader_pod_running(api, NAME, reader_process.pod_identity())
            local_support.run_in_process(local, spark, once=True)  # snapshot, stream, apply: caught up, stopped
            snapshot = (operator_env.get_ingestion(api, NAME) or {})["status"].get("snapshot") or {}
            if snapshot.get("application") in operator_env.spark_applications(api):
                operator_env.set_spark_state(api, snapshot["application"], "COMPLETED")

            # 1. Caught up, nothing running: freshness 0, the table where its mirror is, no holder.
            def caught_up() -> Scrape:
                result, row = scrape(url), _status_table(api)
                applied = _mine(result, "lakeslot_table_applied_lsn", table=TABLE)
                done = row.get("state") == "Streaming" and applied is not None and \
                    f"{int(applied) >> 32:X}/{int(applied) & 0xFFFFFFFF:X}" == row.get("appliedLsn")
                return result if done and _mine(result, "lakeslot_table_freshness_seconds", table=TABLE) == 0 \
                    else Scrape()

            result = wait_for(caught_up, "the applied LSN of the mirror and freshness 0 in a scrape")
            assert _mine(result, "lakeslot_freshness_seconds") == 0
            assert _mine(result, "lakeslot_table_rows", table=TABLE) == 2_000
            assert _mine(result, "lakeslot_table_snapshot_rows", table=TABLE) == 2_000  # (staging's document)
            assert _mine(result, "lakeslot_tables", state="Streaming") == 1
            assert _mine(result, "lakeslot_slot_active") == 0
            assert _mine(result, "lakeslot_slot_holder", kind="none") == 1
            assert _mine(result, "lakeslot_definite_error") == 0 and _mine(result, "lakeslot_suspended") == 0
            assert _mine(result, "lakeslot_condition", type="SlotReady", status="True") == 1
            assert (_mine(result, "lakeslot_reconcile_duration_seconds_count") or 0) > 0

            # The chart's alerts, with thresholds just above what is retained now and 1 s behind.
            alerts = _alerts(walRetainedBytes=int(_mine(result, "lakeslot_slot_retained_wal_bytes") or 0) + (256 << 10),
                             freshnessSeconds=1)
            assert _firing(alerts, "LakeslotWalRetainedHigh", result) == {}
            assert _firing(alerts, "LakeslotFreshnessHigh", result) == {}

            # 2. The source is written while no reader runs: WAL piles up, exactly as PostgreSQL says.
            before = _wal(pgdb)
            with pgdb.connect() as conn:
                conn.execute("UPDATE accounts SET note = repeat('y', 400), balance = balance + 1")
            written = _wal(pgdb)[3] - before[3]
            assert written > 500_000

            def retained_as_postgresql_says() -> Scrape:
                result, (retained, unconfirmed, safe, _) = scrape(url), _wal(pgdb)
                return result if (_mine(result, "lakeslot_slot_retained_wal_bytes"),
                                  _mine(result, "lakeslot_slot_confirmed_flush_lag_bytes"),
                                  _mine(result, "lakeslot_slot_safe_wal_size_bytes")) == \
                    (retained, unconfirmed, safe) else Scrape()

            result = wait_for(retained_as_postgresql_says, "retained WAL equal to pg_current_wal_lsn() - restart_lsn")
            assert _firing(alerts, "LakeslotWalRetainedHigh", result) == {INGESTION: _mine(
                result, "lakeslot_slot_retained_wal_bytes")}
            assert _firing(alerts, "LakeslotSlotInactive", result) == {INGESTION: 0}
            assert (_mine(result, "lakeslot_slot_retained_wal_bytes") or 0) >= written
            assert (_mine(result, "lakeslot_slot_confirmed_flush_lag_bytes") or 0) >= written
            assert _mine(result, "lakeslot_table_freshness_seconds", table=TABLE) == 0  # nothing staged

            # 3. The reader (the Deployment's container, as the kubelet would run it) stages the
            #    changes while the apply job is stopped: freshness rises.
            deployment = operator_env.deployments(api)[f"{NAME}-reader"]
            (container,) = deployment["spec"]["template"]["spec"]["containers"]
            pod = f"{NAME}-reader-2"
            operator_env.reader_pod_running(api, NAME, pod)
            reader_port = free_port()
            with open(tmp_path / "reader.log", "wb") as log:
                reader = subprocess.Popen(
                    [local_support.LAKESLOT, *container["command"][1:], "--metrics-port", str(reader_port)],
                    env=operator_env.container_environment(api, container, home=tmp_path, pod=pod),
                    stdout=log, stderr=subprocess.STDOUT)
            first = wait_for(lambda: (_mine(scrape(url), "lakeslot_table_freshness_seconds", table=TABLE) or 0),
                             "freshness above 0 once the update is staged")
            wait_for(lambda: (_mine(scrape(url), "lakeslot_table_freshness_seconds", table=TABLE) or 0) > first,
                     "freshness rising while the apply job is stopped")
            def held_by_the_reader() -> Scrape:
                result = scrape(url)
                return result if _mine(result, "lakeslot_slot_holder", kind="reader") == 1 else Scrape()

            result = wait_for(held_by_the_reader, "the reader holding the slot")
            assert _firing(alerts, "LakeslotSlotInactive", result) == {}
            wait_for(lambda: _firing(alerts, "LakeslotFreshnessHigh", scrape(url)),
                     "the freshness alert's expression true on a scrape")
            # Every metric the alerts and the dashboard read is in the real scrapes.
            exported = result.names() | scrape(f"http://127.0.0.1:{reader_port}/metrics").names()
            for expr in [r["expr"] for r in alerts.values()] + chart.dashboard_queries(_dashboard()):
                assert promql.metrics(expr) <= exported, (expr, promql.metrics(expr) - exported)
            assert _mine(result, "lakeslot_slot_active") == 1
            assert (_mine(result, "lakeslot_freshness_seconds") or 0) >= first
            wait_for(retained_as_postgresql_says, "retained WAL released by the reader, as PostgreSQL says")

            # 4. The apply job catches up: freshness falls back to 0.
            application = operator_env.spark_applications(api)[f"{NAME}-apply"]
            passed = apply_job.run(spark, operator_env.job_input(api, application), once=True)
            assert passed.ok, passed
            last_pass = Staging(local.ingestion.spec.staging.uri).read_apply_status()
            assert last_pass is not None
            (outcome,) = last_pass["tables"]
            ended = datetime.fromisoformat(last_pass["updatedAt"].replace("Z", "+00:00")).timestamp()
            wait_for(lambda: _mine(scrape(url), "lakeslot_apply_last_pass_timestamp_seconds") == ended,
                     "the apply job's last pass in the operator's metrics")
            assert _mine(scrape(url), "lakeslot_apply_pass_changes", table=TABLE) == outcome["changes"]
            totals = last_pass["totals"]  # the job's counters since it started
            assert _mine(scrape(url), "lakeslot_apply_passes_total") == totals["passes"] >= 1
            assert sum(_mine(scrape(url), "lakeslot_apply_changes_total", table=TABLE, op=op) or 0
                       for op in ("insert", "update", "delete", "truncate")) == outcome["changes"]
            wait_for(lambda: _mine(scrape(url), "lakeslot_table_freshness_seconds", table=TABLE) == 0,
                     "freshness 0 after the apply job caught up")

            # 5. Ready, then the apply application fails (simulated spark-operator): not Ready. (A
            #    status write racing the operator's update of the application is a 409, after which
            #    kopf retries the timer a minute later: hence the longer deadlines.)
            operator_env.set_spark_state(api, f"{NAME}-apply", "RUNNING")
            wait_for(lambda: _firing(alerts, "LakeslotNotReady", scrape(url)) == {} and
                     _mine(scrape(url), "lakeslot_condition", type="Ready", status="True") == 1, "Ready",
                     deadline=RETRY_DEADLINE_S)
            operator_env.set_spark_state(api, f"{NAME}-apply", "FAILED", "driver OOMKilled")
            wait_for(lambda: _firing(alerts, "LakeslotNotReady", scrape(url)) == {INGESTION: 0},
                     "the not-Ready alert's expression true once the apply job failed", deadline=RETRY_DEADLINE_S)
            assert reader.poll() is None, (tmp_path / "reader.log").read_text()[-3000:]

            # 6. The reader stops and the source writes past max_slot_wal_keep_size: at the next
            #    checkpoint PostgreSQL removes the slot's WAL (wal_status lost), a definite error.
            reader.send_signal(signal.SIGTERM)
            assert reader.wait(60) == 0, (tmp_path / "reader.log").read_text()[-3000:]
            reader = None
            _keep_slot_wal(pgdb, "1MB")
            with pgdb.connect() as conn:
                conn.execute("UPDATE accounts SET note = repeat('z', 400)")
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
            wait_for(lambda: _firing(alerts, "LakeslotWalUnreserved", scrape(url)) == {INGESTION: 1},
                     "the WAL-unreserved alert's expression true once the slot lost its WAL")
            wait_for(lambda: _firing(alerts, "LakeslotDefiniteError", scrape(url)) == {INGESTION: 1},
                     "the definite-error alert's expression true (SlotLost)", deadline=RETRY_DEADLINE_S)
    finally:
        if reader is not None:
            reader.send_signal(signal.SIGTERM)
            reader.wait(60)
        server.shutdown()
        _keep_slot_wal(pgdb, None)
