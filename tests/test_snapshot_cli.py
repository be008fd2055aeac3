"""The entry point's argument contract (``lakeslot.workloads``: the job document — the ingestion
and the tables — in a file, the password only from the environment), exit status and summary; and runs through ``main``
with the shared Spark session, including with the exact arguments the operator puts into the
snapshot SparkApplication."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lakeslot import workloads
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.snapshot.job import SnapshotJob
from spark_jobs import snapshot as entry
from tests.support.operator_env import NAMESPACE, OfflineDatabase, ingestion_document
from tests.support.snapshot_helpers import snapshot_slots

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

ROOT = Path(__file__).resolve().parents[1]


def _ingestion(**spec) -> PostgresIngestion:
    document = ingestion_document("orders", OfflineDatabase(), [TableName('Sales "EU"', "Order Lines")],
                                  warehouse="/tmp/wh", staging="file:///tmp/staging", **spec)
    document["spec"]["source"]["tables"][0].update(keyColumns=["id"], excludeColumns=["secret"])
    document["spec"]["source"]["tables"].append({"schema": "public", "name": "plain"})
    return PostgresIngestion.model_validate(document)


def test_the_ingestion_decides_the_job_and_the_password_comes_only_from_the_environment(tmp_path):
    ingestion = _ingestion(snapshot={"parallelism": 8, "resnapshotGeneration": 3},
                           sink={"catalog": {"type": "hadoop", "warehouse": "/tmp/wh"},
                                 "namespace": "mirror",
                                 "tableProperties": {"write.parquet.compression-codec": "zstd"}})
    argv = workloads.snapshot_invocation(ingestion, [TableName('Sales "EU"', "Order Lines"),
                                                     TableName("public", "plain")]).write(tmp_path / "job.json")
    parser = entry.build_parser()
    inputs = workloads.job_input(parser, parser.parse_args(argv))
    job = SnapshotJob.of(inputs, environ={"LAKESLOT_SOURCE_PASSWORD": "ours"})
    assert job.source.password == "ours" and "ours" not in repr(job.source)
    assert SnapshotJob.of(inputs, environ={}).source.password is None
    assert (job.parallelism, job.resnapshot_generation, job.namespace) == (8, 3, "mirror")
    assert job.ingestion == f"{NAMESPACE}/orders"
    first, second = job.tables
    assert first.source == TableName('Sales "EU"', "Order Lines")
    assert first.target == "sales__eu___order_lines_95436ecc"
    assert (first.options.key_columns, first.options.exclude_columns) == (("id",), ("secret",))
    assert second.source == TableName("public", "plain") and second.options.key_columns == ()
    assert job.table_properties == {"write.parquet.compression-codec": "zstd"}
    with pytest.raises(SystemExit):
        entry.build_parser().parse_args([*argv, "--password", "x"])


def _document(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("input_text", "flags", "message"), [
    (None, [], "--input FILE is required"),
    ("not json", [], "is not a job document"),
    ('{"ingestion": {"kind": "PostgresIngestion"}, "tables": []}', [],
     "not a valid PostgresIngestion"),
    ('{"ingestion": {}, "tables": ["public.t"]}', [], "is not a job document"),
    (workloads.snapshot_invocation(_ingestion(), []).document, [], "lists no table"),
    (workloads.job_document(_ingestion(), [TableName("public", "t")]), ["--input-sha256", "0" * 64],
     "is not the document this job was started for"),
])
def test_bad_input_exits_2_naming_the_problem(input_text, flags, message, capsys, tmp_path,
                                              monkeypatch):
    monkeypatch.setattr(workloads, "INPUT_WAIT_S", 0.0)  # (a mounted file that never changes)
    argv = ([] if input_text is None else ["--input", _document(tmp_path, input_text)]) + flags
    with pytest.raises(SystemExit) as exit_:
        entry.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_job_flag_out_of_range_exits_2(capsys, tmp_path):
    argv = workloads.snapshot_invocation(_ingestion(), [TableName("public", "t")]).write(
        tmp_path / "job.json")
    with pytest.raises(SystemExit) as exit_:
        entry.build_parser().parse_args([*argv, "--max-attempts", "0"])
    assert exit_.value.code == 2 and "--max-attempts: must be at least 1" in capsys.readouterr().err


def test_the_job_waits_for_its_mounted_document(tmp_path):
    """A mounted Secret is refreshed by the kubelet a while after it changed: the job reads the
    file until it is the document its ``--input-sha256`` names."""
    path = tmp_path / "job.json"
    old = workloads.job_document(_ingestion(), [TableName("public", "old")])
    new = workloads.job_document(_ingestion(), [TableName("public", "new")])
    path.write_text(old)
    slept: list[float] = []

    def refresh(seconds: float) -> None:  # the kubelet's refresh, during the job's wait
        slept.append(seconds)
        path.write_text(new)

    job = workloads.read_input(str(path), workloads.digest(new), sleep=refresh)
    assert job.tables == (TableName("public", "new"),) and len(slept) == 1


@pytest.mark.parametrize("how", [["-m", "spark_jobs.snapshot"], [str(ROOT / "spark_jobs" / "snapshot.py")]],
                         ids=["module", "main-file"])
def test_runnable_as_a_module_and_as_the_spark_applications_main_file(how, tmp_path):
    result = subprocess.run([sys.executable, *how, "--help"], capture_output=True, text=True,
                            check=True, cwd=tmp_path if how[0] != "-m" else ROOT)
    assert "LAKESLOT_SOURCE_PASSWORD" in result.stdout and "--input FILE" in result.stdout


def test_main_with_the_operators_arguments(spark, spark_warehouse, iceberg_namespace, pgdb,
                                           monkeypatch, capsys, tmp_path):
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items VALUES (1, 'a'), (2, 'b')")
        conn.execute("CREATE TABLE broken (id int PRIMARY KEY, r regclass)")
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)
    catalog, namespace = iceberg_namespace.split(".", 1)
    document = ingestion_document("orders", pgdb, [TableName("public", "items")],
                                  warehouse=str(spark_warehouse), staging="file:///unused")
    document["spec"]["sink"].update(namespace=namespace, tableNameTemplate="{table}")
    document["spec"]["sink"]["catalog"]["name"] = catalog
    ingestion = PostgresIngestion.model_validate(document)
    argv = workloads.snapshot_invocation(ingestion, [TableName("public", "items")]).write(
        tmp_path / "job.json")
    assert entry.main([*argv, "--progress", str(tmp_path / "p.json")], spark=spark) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["ok"] and summary["tables"][0]["state"] == "committed"
    assert summary["tables"][0]["rows"] == 2
    rows = spark.sql(f"SELECT id, name FROM {iceberg_namespace}.items ORDER BY id").collect()
    assert [tuple(r) for r in rows] == [(1, "a"), (2, "b")]
    assert json.loads((tmp_path / "p.json").read_text())["tables"]
    assert snapshot_slots(pgdb) == []

    argv = workloads.snapshot_invocation(ingestion, [TableName("public", "broken")]).write(
        tmp_path / "job.json")
    assert entry.main(argv, spark=spark) == 1
    assert "unsupported type regclass" in capsys.readouterr().err
