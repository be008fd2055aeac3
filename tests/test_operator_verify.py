"""The operator's verification: the ``lakeslot.io/verify`` annotation → a Job running ``lakeslot
verify`` → its result document in staging → the ``Verified`` condition, ``status.verification``
and events.

End to end with the real kopf operator (lakeslot's registry) on the Kubernetes API emulator, real
PostgreSQL 15 and 18 and real Spark + Iceberg. Simulated, because pods cannot run here: the Job
controller and kubelet — the test runs the Job's container command as a process with the
environment the kubelet would give it (Secret references resolved from the emulator's Secrets) —
and the reader Deployment and apply SparkApplication, whose work ``lakeslot run`` does in this
process (its reader is registered as the reader pod, so the operator leaves it the slot). The
Job's shape, the decisions and the verdicts are also checked on their own (pure functions).
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import kubernetes.client
import kubernetes_validate
import pytest
import yaml
from psycopg import sql

from lakeslot import workloads
from lakeslot.api.annotations import VERIFY, VERIFY_TABLES
from lakeslot.api.models import PostgresIngestion, VerificationStatus
from lakeslot.api.naming import TableName
from lakeslot.cli import build_parser
from lakeslot.local import reader_process
from lakeslot.verify.report import Keys, Round, TableResult, Verification, result_document
from lakeslot_operator import children, verification
from lakeslot_operator.handlers import build_registry
from lakeslot_operator.kube import Kube
from lakeslot_operator.reconcile import Context
from tests.support import local_support, operator_env
from tests.support.fixtures_kube import running_operator
from tests.support.odd_names import ODD_TABLES, create_odd_tables
from tests.support.pod_security import assert_restricted
from tests.support.waiting import wait_for

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

UID = "0f1e2d3c-0000-4000-8000-000000000002"
CONFIG = children.OperatorConfig(image="registry.example/lakeslot:test")
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
ODD = ODD_TABLES[1]  # "Sales ""EU"" 2024"."Line Items": quoting, and a comma-free odd name
LEDGER = TableName("public", "ledger")
DELETED = 7  # the ledger row deleted from the mirror behind the pipeline's back
JOB_DEADLINE_S = 300


# the Job ---------------------------------------------------------------------------------------

@pytest.fixture
def ingestion() -> PostgresIngestion:
    with open("examples/ingestion.yaml") as f:
        document = yaml.safe_load(f)
    document["metadata"]["namespace"] = "shop"
    document["spec"]["source"]["sslMode"] = "verify-full"
    document["spec"]["source"]["caSecretRef"] = {"name": "shop-ca", "key": "ca.pem"}
    document["spec"]["secretEnv"] = [
        {"name": "AWS_ACCESS_KEY_ID", "secretKeyRef": {"name": "shop-s3", "key": "id"}}]
    document["spec"]["sink"]["catalog"]["secretProperties"] = {
        "s3.secret-access-key": {"name": "shop-s3", "key": "secret"}}
    return PostgresIngestion.model_validate(document)


def test_the_job_runs_lakeslot_verify_once_with_credentials_by_reference(ingestion):
    tables = [TableName("public", "accounts"), ODD]
    invocation = workloads.verify_invocation(ingestion, tables, "t1")
    job = children.verify_job(ingestion, UID, CONFIG, workloads.verify_command(invocation), token="t1")
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    assert job["metadata"]["name"] == children.verify_name(ingestion, "t1") != children.verify_name(ingestion, "t2")
    assert len(job["metadata"]["name"]) <= 63 and job["metadata"]["annotations"] == {VERIFY: "t1"}
    assert job["metadata"]["ownerReferences"][0]["uid"] == UID  # deleted with the ingestion
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["template"]["spec"]["restartPolicy"]) == (0, "Never")
    assert spec["ttlSecondsAfterFinished"] == children.VERIFY_TTL_SECONDS
    assert spec["activeDeadlineSeconds"] == children.VERIFY_DEADLINE_SECONDS
    pod = spec["template"]["spec"]
    assert_restricted(pod)
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["image"] == CONFIG.image

    # The command is the real CLI's; the ingestion and the tables are in the job document,
    # mounted from the ConfigMap the Job owns (the command line holds no spec: it has a size limit).
    command = container["command"]
    assert command[:2] == ["lakeslot", "verify"]
    args = build_parser().parse_args(command[1:])
    assert args.input == workloads.JOB_INPUT_FILE and args.result_token == "t1"
    assert args.input_sha256 == workloads.digest(invocation.document)
    job_input = workloads.parse_input(invocation.document)
    assert (job_input.ingestion, job_input.tables) == (ingestion, tuple(tables))
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == workloads.JOB_INPUT_DIR]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == children.input_name(job["metadata"]["name"])
    config_map = children.job_input_config_map(job, invocation.document, "job-uid")
    kubernetes_validate.validate(config_map, kubernetes_validate.latest_version(), strict=True)
    assert config_map["data"] == {workloads.JOB_INPUT_KEY: invocation.document}
    assert config_map["metadata"]["ownerReferences"] == [{
        "apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": "job-uid",
        "controller": True, "blockOwnerDeletion": False}]  # deleted with the Job

    # Credentials only by reference; the one literal value is the CA file's path.
    env_vars = {e["name"]: e for e in container["env"]}
    assert {name: e["valueFrom"]["secretKeyRef"] for name, e in env_vars.items() if "valueFrom" in e} == {
        workloads.PASSWORD_ENV: {"name": "shop-postgres", "key": "password"},
        "LAKESLOT_CATALOG_S3_SECRET_ACCESS_KEY": {"name": "shop-s3", "key": "secret"},
        "AWS_ACCESS_KEY_ID": {"name": "shop-s3", "key": "id"}}
    assert {name: e["value"] for name, e in env_vars.items() if "value" in e} == {
        workloads.CA_FILE_ENV: workloads.CA_FILE}
    assert {"name": "source-ca", "mountPath": children.CA_MOUNT, "readOnly": True} in container["volumeMounts"]


# the decisions ---------------------------------------------------------------------------------

def _verifying(token: str = "t1", tables: tuple[str, ...] = ()) -> VerificationStatus:
    return VerificationStatus(token=token, state="Verifying", tables=list(tables), job=f"orders-verify-{token}",
                              started_at=NOW)


def test_a_request_is_started_refused_or_supersedes_the_running_one():
    started = verification.start(verification.Request("t1", 'public.accounts, "Sales, Inc".items'),
                                 None, "orders-verify-x", NOW)
    assert started.create == (TableName("public", "accounts"), TableName("Sales, Inc", "items"))
    assert started.verification is not None and started.verification.state == "Verifying"
    assert started.verification.tables == ["public.accounts", '"Sales, Inc".items']
    assert started.verdict == verification.Verdict(None, "Verifying", started.verification.message)
    assert [e.reason for e in started.events] == ["VerificationStarted"] and started.cancel is None

    newer = verification.start(verification.Request("t2"), _verifying(), "orders-verify-y", NOW)
    assert newer.create == () and newer.cancel == "orders-verify-t1"  # every table; t1 cancelled

    for request, wrong in [(verification.Request("no spaces allowed"), VERIFY),
                           (verification.Request("x" * 64), VERIFY),
                           (verification.Request("t3", "accounts"), VERIFY_TABLES),
                           (verification.Request("t3", "public.a,,public.b"), VERIFY_TABLES)]:
        refused = verification.start(request, _verifying(), "orders-verify-z", NOW)
        assert refused.create is None and refused.cancel == "orders-verify-t1"
        assert refused.verdict is not None and (refused.verdict.ok, refused.verdict.reason) == (False, "InvalidRequest")
        assert refused.verdict.message.startswith(f"{wrong}: ") and "new token" in refused.verdict.message
        assert refused.verification is not None and refused.verification.state == "InvalidRequest"


def test_a_running_request_is_followed_to_its_end():
    running = _verifying(tables=("public.accounts",))
    assert verification.follow(running, verification.Job(), None, None, "s3://b/staging") == \
        verification.Step(running)  # still running: nothing changes
    again = verification.follow(running, None, None, None, "s3://b/staging")
    assert again.create == (TableName("public", "accounts"),)  # its Job went away: created again
    other = {"token": "t0", "exitCode": 0, "result": {"equal": True, "tables": []}}
    assert verification.follow(running, verification.Job(), other, None, "s3://b/staging").verdict is None

    failed = verification.Job.of({"status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
         "message": "Job was active longer than specified deadline"}]}})
    step = verification.follow(running, failed, None, None, "s3://b/staging")
    assert step.verdict is not None and (step.verdict.ok, step.verdict.reason) == (False, "Failed")
    assert "DeadlineExceeded: Job was active longer" in step.verdict.message
    assert "kubectl logs job/orders-verify-t1" in step.verdict.message
    complete = verification.Job.of({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    step = verification.follow(running, complete, None, None, "s3://b/staging")
    assert step.verdict is not None and "completed without leaving its result in s3://b/staging" in step.verdict.message

    step = verification.follow(running, verification.Job(), None, "AWS Error ACCESS_DENIED", "s3://b/staging")
    assert step.verdict == verification.Verdict(None, "ResultUnreadable", step.verdict.message if step.verdict else "")
    assert step.verification == running and "keys that can read staging" in step.verdict.message


def _result(*tables: TableResult, error: str | None = None, code: int = 0) -> dict:
    return result_document("t1", started_at=NOW, finished_at=NOW, exit_code=code,
                           verification=Verification(list(tables)) if tables else None, error=error)


def test_verdicts_name_tables_counts_and_keys_but_no_values():
    equal = TableResult(TableName("public", "accounts"), 10, 10, compared=10)
    equal.rounds.append(Round(1, 0x1000, 0x1200, 9, 1))
    equal.not_compared.add([{"id": 1}])
    state, message, rows, lsn = verification.verdict(_result(equal))
    assert (state, lsn) == ("Equal", "0/1000")
    assert message == ("every table equals its source at 0/1000: 1 table(s), 10 rows compared; 1 key(s) "
                       "changed in every round and were not compared")
    assert rows[0].result == "equal" and rows[0].not_compared == 1

    diverged = TableResult(LEDGER, 10, 9, compared=10,
                           missing=Keys(1, [{"id": 7}]),
                           differing=Keys(2, [{"key": {"id": 2}, "columns": {"amount": ["2.50", "-7.00"]}}]))
    diverged.rounds.append(Round(1, 0x1000, 0x1200, 10, 0))
    behind = TableResult(ODD, problem="the mirror is behind: at 0/F00")
    behind.rounds.append(Round(1, 0x1000, None, 0, None, "the mirror is behind: at 0/F00"))
    state, message, rows, _ = verification.verdict(_result(equal, diverged, behind, code=1))
    assert state == "Diverged"
    assert "public.ledger: 1 missing, 2 differing (first: missing id=7; differing id=2 (amount))" in message
    assert f"not settled: {ODD}: the mirror is behind" in message and "resnapshotGeneration" in message
    assert "verify/t1.json" in message and "2.50" not in message and "-7.00" not in message
    ledger = next(r for r in rows if r.name == "ledger")
    assert (ledger.result, ledger.missing, ledger.differing, ledger.keys) == (
        "different", 1, 2, ["missing id=7", "differing id=2 (amount)"])

    state, message, _, _ = verification.verdict(_result(equal, behind, code=1))
    assert state == "NotCompared" and "Streaming: True" in message
    state, message, _, _ = verification.verdict(_result(error="not selected by this ingestion: public.x", code=2))
    assert state == "InvalidRequest" and "public.x" in message
    state, message, _, _ = verification.verdict(_result(error="the check could not complete: boom", code=1))
    assert state == "Failed" and message.startswith("the check could not complete: boom; set lakeslot.io/verify")


# end to end --------------------------------------------------------------------------------------

@pytest.fixture
def source(pgdb):
    with pgdb.connect() as conn:
        accounts = local_support.create_accounts(conn, 2_000)
        create_odd_tables(conn)
        conn.execute(sql.SQL("INSERT INTO {} (id, \"user\", \"ñ\") SELECT i, 'u' || i, 'ñ' "
                             "FROM generate_series(1, 500) AS i").format(ODD.sql()))
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, amount numeric(12,2) NOT NULL)")
        conn.execute("INSERT INTO ledger SELECT i, i * 1.25 FROM generate_series(1, 1000) AS i")
    return pgdb, [accounts, ODD, LEDGER]


def _annotate(api, name: str, annotations: dict[str, str | None]) -> None:
    kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *operator_env.CUSTOM, name, {"metadata": {"annotations": annotations}})


def _verification(api, name: str, token: str, state: str | None = None) -> dict | None:
    """The ingestion once status.verification answers ``token`` (in ``state``, else finished)."""
    resource = operator_env.get_ingestion(api, name)
    found = (resource or {}).get("status", {}).get("verification") or {}
    if found.get("token") != token:
        return None
    done = found["state"] != "Verifying"
    return resource if (found["state"] == state if state else done) else None


def _jobs(api) -> dict[str, dict]:
    jobs = kubernetes.client.BatchV1Api(api).list_namespaced_job(operator_env.NAMESPACE).items
    return {j.metadata.name: api.sanitize_for_serialization(j) for j in jobs if j.metadata and j.metadata.name}


def _run_job(api, job: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    """Simulated Job controller and kubelet: the container's command, as a process whose
    environment holds exactly the container's variables (Secret references resolved)."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    environ = operator_env.container_environment(api, container, home=tmp_path)
    command = operator_env.mounted(api, job, container["command"], tmp_path)
    return subprocess.run([local_support.LAKESLOT, *command[1:]], env=environ, capture_output=True,
                          text=True, timeout=JOB_DEADLINE_S, check=False)


@pytest.mark.slow
def test_verified_by_the_operator_for_an_equal_mirror_then_diverged_then_refused(
        kube, api, source, spark, spark_warehouse, tmp_path, monkeypatch):
    db, tables = source
    name = "shop"
    document, local = operator_env.operator_and_local(name, db, tables, tmp_path, warehouse=spark_warehouse)
    monkeypatch.setenv(workloads.PASSWORD_ENV, db.cluster.password)  # run.run exports it
    pod = reader_process.pod_identity()  # the reader of lakeslot run in this process
    registry = build_registry(Context(kube=Kube(api)), timer_interval=1.0, login_via_client=False)
    with running_operator(kube, registry):
        operator_env.create_ingestion(api, document, db.cluster.password)
        wait_for(lambda: f"{name}-reader" in operator_env.deployments(api), "the reader Deployment")
        operator_env.reader_pod_running(api, name, pod)  # so the operator takes that reader for its own
        first, _ = local_support.run_in_process(local, spark, once=True)
        assert first.caught_up
        local_support.commit_as_pipeline(spark, local, LEDGER,
                                         f"DELETE FROM {local_support.mirror_name(local, LEDGER)} WHERE id = {DELETED}")

        def checks() -> None:
            # 1. Two tables, one named with quotes: equal.
            _annotate(api, name, {VERIFY: "t1", VERIFY_TABLES: f"public.accounts, {ODD}"})
            resource = wait_for(lambda: _verification(api, name, "t1", "Verifying"), "the request t1")
            assert resource is not None and operator_env.required_condition(resource, "Verified")["status"] == "Unknown"
            job = _jobs(api)[resource["status"]["verification"]["job"]]
            assert db.cluster.password not in json.dumps(job)
            assert_restricted(job["spec"]["template"]["spec"])
            ran = _run_job(api, job, tmp_path)
            assert ran.returncode == 0, ran.stderr[-3000:] + ran.stdout
            resource = wait_for(lambda: _verification(api, name, "t1"), "the result of t1")
            assert resource is not None
            verified = operator_env.required_condition(resource, "Verified")
            status = resource["status"]["verification"]
            assert (verified["status"], verified["reason"], status["state"]) == ("True", "Equal", "Equal"), verified
            assert f"at {status['lsn']}: 2 table(s)" in verified["message"]
            assert {(r["schema"], r["name"], r["result"]) for r in status["results"]} == {
                ("public", "accounts", "equal"), (ODD.schema, ODD.name, "equal")}
            assert status["startedAt"] and status["finishedAt"] and status["tables"] == ["public.accounts", str(ODD)]

            # 2. Every table: the row deleted from the mirror is found, by key.
            _annotate(api, name, {VERIFY: "t2", VERIFY_TABLES: None})
            resource = wait_for(lambda: _verification(api, name, "t2", "Verifying"), "the request t2")
            assert resource is not None
            ran = _run_job(api, _jobs(api)[resource["status"]["verification"]["job"]], tmp_path)
            assert ran.returncode == 1, ran.stderr[-3000:] + ran.stdout
            resource = wait_for(lambda: _verification(api, name, "t2"), "the result of t2")
            assert resource is not None
            verified = operator_env.required_condition(resource, "Verified")
            assert (verified["status"], verified["reason"]) == ("False", "Diverged"), verified
            assert f"public.ledger: 1 missing (first: missing id={DELETED})" in verified["message"]
            results = {r["name"]: r for r in resource["status"]["verification"]["results"]}
            assert results["ledger"]["keys"] == [f"missing id={DELETED}"]
            assert results["accounts"]["result"] == results[ODD.name]["result"] == "equal"

            # 3. A table the ingestion does not select: refused by the check itself.
            _annotate(api, name, {VERIFY: "t3", VERIFY_TABLES: "public.nope"})
            resource = wait_for(lambda: _verification(api, name, "t3", "Verifying"), "the request t3")
            assert resource is not None
            ran = _run_job(api, _jobs(api)[resource["status"]["verification"]["job"]], tmp_path)
            assert ran.returncode == 2, ran.stderr[-3000:]
            resource = wait_for(lambda: _verification(api, name, "t3"), "the result of t3")
            assert resource is not None
            verified = operator_env.required_condition(resource, "Verified")
            assert verified["reason"] == "InvalidRequest" and "public.nope" in verified["message"], verified

            # 4. Malformed requests: refused without a Job.
            jobs = set(_jobs(api))
            _annotate(api, name, {VERIFY: "not a token"})
            resource = wait_for(lambda: _verification(api, name, "not a token", "InvalidRequest"),
                                "the malformed token refused")
            _annotate(api, name, {VERIFY: "t4", VERIFY_TABLES: "ledger"})
            resource = wait_for(lambda: _verification(api, name, "t4", "InvalidRequest"),
                                "the malformed table list refused")
            assert resource is not None
            verified = operator_env.required_condition(resource, "Verified")
            assert verified["message"].startswith(f"{VERIFY_TABLES}: 'ledger'")
            assert set(_jobs(api)) == jobs

            # 5. A newer token cancels the running verification's Job.
            _annotate(api, name, {VERIFY: "t5", VERIFY_TABLES: None})
            resource = wait_for(lambda: _verification(api, name, "t5", "Verifying"), "the request t5")
            assert resource is not None
            superseded = resource["status"]["verification"]["job"]
            _annotate(api, name, {VERIFY: "t6"})
            wait_for(lambda: _verification(api, name, "t6", "Verifying"), "the request t6")
            assert superseded not in _jobs(api)

            events = kubernetes.client.CoreV1Api(api).list_namespaced_event(operator_env.NAMESPACE).items
            assert {"VerificationStarted", "Equal", "Diverged", "InvalidRequest"} <= {e.reason for e in events}
            assert not any(db.cluster.password in (e.message or "") for e in events)

        local_support.run_in_process(local, spark, once=False, during=checks)
