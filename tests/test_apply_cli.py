"""The apply entry point: the workloads argument contract (exactly what the operator passes),
``--once``, the exit status and the JSON summary."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from lakeslot import workloads
from lakeslot.api.models import PostgresIngestion
from spark_jobs import apply as entry
from tests.support.apply_support import Pipeline
from tests.support.apply_workload import IDLE, MAIN, Workload, create_tables
from tests.support.operator_env import OfflineDatabase, ingestion_document

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("how", [["-m", "spark_jobs.apply"], [str(ROOT / "spark_jobs" / "apply.py")]],
                         ids=["module", "main-file"])
def test_runnable_as_a_module_and_as_the_spark_applications_main_file(how, tmp_path):
    result = subprocess.run([sys.executable, *how, "--help"], capture_output=True, text=True,
                            check=True, cwd=tmp_path if how[0] != "-m" else ROOT)
    assert "--once" in result.stdout and "--input FILE" in result.stdout


def test_no_table_is_a_usage_error(capsys, tmp_path):
    document = ingestion_document("apply", OfflineDatabase(), [MAIN], warehouse="/tmp/wh",
                                  staging="file:///tmp/staging")
    argv = workloads.apply_invocation(PostgresIngestion.model_validate(document), []).write(
        tmp_path / "job.json")
    with pytest.raises(SystemExit) as exit_:
        entry.main(argv)
    assert exit_.value.code == 2 and "lists no table" in capsys.readouterr().err


def test_once_with_the_operators_arguments(spark, spark_warehouse, iceberg_namespace, pgdb,
                                           tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)
    with pgdb.connect() as conn:
        create_tables(conn, rows=2)
    pipeline = Pipeline.create(spark, pgdb, spark_warehouse, iceberg_namespace,
                               (tmp_path / "staging").as_uri(), [MAIN, IDLE])
    pipeline.start_slot()
    pipeline.snapshot()
    with pgdb.connect() as conn:
        Workload(conn, random.Random(9)).run(5)
    pipeline.seal()
    capsys.readouterr()
    argv = workloads.apply_invocation(pipeline.ingestion, [MAIN, IDLE]).write(tmp_path / "job.json")
    assert entry.main([*argv, "--once"], spark=spark) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["ok"] and [t["state"] for t in summary["tables"]] == ["applied", "advanced"]
    assert summary["tables"][0]["lsn"] == summary["tables"][1]["lsn"] is not None

    with pgdb.connect() as conn:
        conn.execute(f"TRUNCATE {MAIN}")
    pipeline.seal()
    strict = pipeline.with_spec(policies={"onTruncate": "Error"})
    strict_argv = workloads.apply_invocation(strict.ingestion, [MAIN, IDLE]).write(
        tmp_path / "strict.json")
    assert entry.main([*strict_argv, "--once"], spark=spark) == 1
    assert "onTruncate is Error" in capsys.readouterr().err
