"""More than one executor: the snapshot and apply jobs' entry points, submitted as the operator's
SparkApplications say, on Spark's ``local-cluster[2,1,1024]`` master — two executors, each a JVM of
its own (started by a worker inside the driver's process) with Python workers of its own — against
the production configuration: staging on S3 and the mirrors in an Iceberg REST catalog with
``S3FileIO`` (SeaweedFS, tests/support/fixtures_s3.py).

What it proves: nothing the jobs do on executors relies on the driver's JVM or process — the
snapshot's range copies (reading PostgreSQL, writing data files to S3) and the apply job's reading
of sealed segments on S3, its reduction, its shuffles and its MERGE (of the table whose batch is
too big for the driver's row delta; the other table's small batch is committed by the driver,
through the same ``S3FileIO``) ran in the executors' JVMs,
given only what Spark carries to them (tasks, broadcasts, shuffle data, Iceberg's serialized
tables and ``S3FileIO``) and their environment; the Iceberg jars reach them on the class path as in
the image. After the snapshot, the reader's changes and one apply pass, every mirror, read by
pyiceberg through the REST catalog, equals its source row by row; and each job's Spark event log
shows both executors added and successful tasks on them, none on the driver — the snapshot's on
each of the two (on a ``local[N]`` master every task runs in the driver's JVM as executor
``driver``: these assertions fail there).

What is real: PostgreSQL, SeaweedFS, the reader (in this process, sealing segments on S3), and for
each job ``spark-submit`` with the SparkApplication's ``sparkConf``, main file and arguments (the
job document in a file with its sha256), in the environment the operator wires into the driver
pod from Secrets and nothing else of this process's (tests/support/spark_operator.py): credentials
are in neither argv, nor the jobs' output, nor their event logs.

Not proven here (one machine): executors share the driver's file system — a task opening a path
only the driver's pod has would still succeed here; what keeps that from mattering is that staging
and the warehouse are object-store URIs and that only the driver reads the job document. They also
inherit the driver's environment, where Kubernetes gives each executor pod its own from the
Secrets; the test checks that the operator wires the same variables into both pods, so that one
environment stands for both.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lakeslot import workloads
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.apply import small_batches
from lakeslot.local.objectstore import STAGING_BUCKET, ObjectStore
from lakeslot.spark import jars
from lakeslot.verify import checksums
from lakeslot_operator import children
from tests.support import fixtures_s3, local_support, spark_operator
from tests.support.fixtures_pg import connection_settings
from tests.support.reader_support import current_lsn, prepare, read_until

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

ROOT = Path(__file__).resolve().parents[1]
NAME = "multi-executor"
MASTER = "local-cluster[2,1,1024]"  # two executors (workers) of one core and 1024 MiB each
EXECUTORS = {"0", "1"}
JOB_DEADLINE_S = 600  # a hung job fails the test instead of the suite


def _ingestion(db, store: ObjectStore, tables: list[TableName]) -> PostgresIngestion:
    document = fixtures_s3.ingestion_document(db, f"s3://{STAGING_BUCKET}/{uuid.uuid4().hex[:12]}",
                                              tables, store.catalog_document(), name=NAME)
    # the endpoint and region too: a Spark pod has no environment but what the operator wires
    document["spec"]["secretEnv"] = [{"name": name, "secretKeyRef": {"name": "s3", "key": name}}
                                     for name in store.environment()]
    return PostgresIngestion.model_validate(document)


def _secrets(ingestion: PostgresIngestion, password: str, store: ObjectStore) -> dict[str, dict[str, str]]:
    """The Secrets ``ingestion`` names, as a user would create them: name → key → value."""
    spec = ingestion.spec
    assert spec.source.password_secret_ref is not None
    values = [(spec.source.password_secret_ref, password),
              *((v.secret_key_ref, store.environment()[v.name]) for v in spec.secret_env),
              *((ref, store.catalog_secrets()[key]) for key, ref in spec.sink.catalog.secret_properties.items())]
    secrets: dict[str, dict[str, str]] = {}
    for ref, value in values:
        secrets.setdefault(ref.name, {})[ref.key] = value
    return secrets


def _image_environment(home: Path) -> dict[str, str]:
    """What the image's environment holds (Dockerfile: SPARK_HOME, PYSPARK_PYTHON,
    PYTHONUNBUFFERED), with this machine's Python, Java and checkout, and Spark on loopback."""
    environment = {"SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1",
                   "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}
    return {**{k: os.environ[k] for k in ("PATH", "HOME", "JAVA_HOME", "TMPDIR") if k in os.environ},
            **environment}


def _submit(app: dict, secrets: dict[str, dict[str, str]], credentials: list[str], home: Path,
            events: Path) -> dict:
    """Run ``app``'s driver with ``spark-submit`` on :data:`MASTER`, its event log in ``events``,
    ``credentials`` in neither its command line nor its output nor its event log; returns the
    job's JSON summary."""
    pod = spark_operator.pod_environment(app, "driver", secrets)
    assert pod == spark_operator.pod_environment(app, "executor", secrets)  # (one environment here)
    events.mkdir()
    command = spark_operator.submit_command(
        app, spark_submit=str(home / "bin" / "spark-submit"), master=MASTER, root=ROOT, conf={
            "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            # start the work once both executors are there (the SparkContext waits at most this
            # long; a standalone master expects spark.cores.max cores, without it none)
            "spark.cores.max": "2", "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "300s"})
    assert not [c for c in credentials if c in " ".join(command)]
    done = subprocess.run(command, env={**_image_environment(home), **pod}, cwd=events.parent,
                          capture_output=True, text=True, timeout=JOB_DEADLINE_S, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (log,) = events.iterdir()
    for text in (done.stdout, done.stderr, log.read_text()):  # (Spark's event log shows settings)
        assert not [c for c in credentials if c in text]
    # (the job's last line on stdout — spark-submit merges the Python driver's stderr into its
    # stdout, and py4j's INFO lines as it shuts down follow)
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def _tasks_by_executor(events: Path) -> tuple[str, set[str], collections.Counter[str]]:
    """From a job's event log: its master, the executors added, and how many tasks succeeded on
    each executor."""
    (log,) = events.iterdir()
    master, added, tasks = "", set(), collections.Counter[str]()
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event["Event"] == "SparkListenerEnvironmentUpdate":
            master = event["Spark Properties"]["spark.master"]
        elif event["Event"] == "SparkListenerExecutorAdded":
            added.add(event["Executor ID"])
        elif event["Event"] == "SparkListenerTaskEnd" and event["Task End Reason"]["Reason"] == "Success":
            tasks[event["Task Info"]["Executor ID"]] += 1
    return master, added, tasks


def _assert_ran_on_executors(events: Path, *, both: bool = True) -> None:
    """The job's tasks ran on the executors, none on the driver; on each of them (``both``)."""
    master, added, tasks = _tasks_by_executor(events)
    assert (master, added) == (MASTER, EXECUTORS)
    assert set(tasks) == EXECUTORS if both else tasks and set(tasks) <= EXECUTORS, tasks


@pytest.mark.slow
def test_the_jobs_run_on_two_executors_of_their_own(pgdb, object_store, tmp_path, monkeypatch):
    db, store = pgdb, object_store
    with db.connect() as conn:
        tables = local_support.create_accounts_and_items(conn, 30_000, 400)  # accounts: 3-4 ranges of 1 MiB
    ingestion = _ingestion(db, store, tables)
    names = IngestionNames.of(ingestion)
    with db.connect() as conn:  # the operator's first steps: the publication, the slot (rule 2)
        prepare(conn, tables, slot_name=names.slot, publication=names.publication)
    secrets = _secrets(ingestion, db.cluster.password, store)
    # (not the access key's ID, an identifier: Spark copies AWS_ACCESS_KEY_ID into Hadoop's
    # fs.s3.awsAccessKeyId, which its event log shows)
    credentials = [db.cluster.password, store.secret_key]
    home = spark_operator.spark_home(tmp_path / "spark-home", jars.ensure_jars())
    config = children.OperatorConfig()

    snapshot = workloads.snapshot_invocation(ingestion, tables)
    app = children.snapshot_application(ingestion, "uid", config, snapshot.write(tmp_path / "snapshot.json"),
                                        generation="g0")
    summary = _submit(app, secrets, credentials, home, tmp_path / "snapshot-events")
    assert summary["ok"] and {t["state"] for t in summary["tables"]} == {"committed"}, summary
    _assert_ran_on_executors(tmp_path / "snapshot-events")

    with db.connect() as conn:  # changes, sealed on S3 by the reader
        local_support.change_accounts_and_items(conn)
        # every account changed once more: a batch too big for the driver's row delta, so the
        # accounts take the MERGE on the executors; the items' few changes the driver's path
        conn.execute("UPDATE accounts SET balance = balance - 1")
        assert conn.execute("SELECT count(*) FROM accounts").fetchone()[0] > small_batches.SMALL_CHANGES
        target = current_lsn(conn)
    for variable, value in store.environment().items():
        monkeypatch.setenv(variable, value)
    read_until(db, ingestion.spec.staging.uri, target, slot=names.slot, publication=names.publication)

    apply = workloads.apply_invocation(ingestion, tables)
    app = children.apply_application(ingestion, "uid", config,
                                     [*apply.write(tmp_path / "apply.json"), "--once"])
    summary = _submit(app, secrets, credentials, home, tmp_path / "apply-events")
    assert summary["ok"] and summary["batchEnd"] is not None, summary
    # (its stages are small, one task each, and follow the persisted reduction's locality: which
    # executors run them is the scheduler's choice — all on one in some runs)
    _assert_ran_on_executors(tmp_path / "apply-events", both=False)

    checks = checksums.compare(ingestion, connection_settings(db), tables, secrets=store.catalog_secrets())
    assert [c for c in checks if not c.equal] == [], checksums.render(checks)
    assert all(c.source_rows > 0 for c in checks)
