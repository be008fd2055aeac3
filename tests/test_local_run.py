"""``lakeslot run`` end to end, as real processes: real PostgreSQL 15 and 18, the reader as a
child process, Spark ``local[*]`` + Iceberg, a concurrent write workload. Equality is checked
over every column of every row (:mod:`lakeslot.verify.checksums`); nothing is simulated."""

from __future__ import annotations

import json
import os
import subprocess

import pyarrow.parquet as pq
import pytest
import yaml
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.verify import checksums
from tests.support import local_support
from tests.support.fixtures_pg import connection_settings
from tests.support.odd_names import ODD_TABLES, create_odd_tables

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

RUN_DEADLINE_S = 420
ODD = [ODD_TABLES[0], ODD_TABLES[2]]  # a schema and a table name that need quoting


@pytest.fixture
def source(pgdb):
    with pgdb.connect() as conn:
        accounts = local_support.create_accounts(conn, 20_000)
        create_odd_tables(conn)
        for table in ODD:
            conn.execute(sql.SQL("INSERT INTO {} (id, \"user\", \"ñ\") SELECT i, 'u' || i, 'ñ' "
                                 "FROM generate_series(1, 2000) AS i").format(table.sql()))
    return pgdb, [accounts, *ODD]


def _workload(db, tables: list[TableName]) -> local_support.Workload:
    return local_support.Workload(db, tables, {t: "balance" if t == local_support.ACCOUNTS else "user" for t in tables})


def _finish(process: subprocess.Popen, log) -> int:
    try:
        return process.wait(RUN_DEADLINE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"lakeslot run did not finish; its log:\n{log.read_text()[-3000:]}")


def _run_once(path, db, state_dir, log) -> None:
    code = _finish(local_support.spawn_run(path, db, state_dir, log, "--once"), log)
    assert code == 0, log.read_text()[-3000:]


def _assert_equal(document_path, db, tables) -> None:
    from lakeslot.local import config

    ingestion = config.load_ingestion(str(document_path))
    checks = checksums.compare(ingestion, connection_settings(db), tables)
    assert [c for c in checks if not c.equal] == [], checksums.render(checks)
    assert all(c.source_rows > 0 for c in checks)


def _assert_codec(path, db, state_dir, tables, codec: str) -> None:
    """Every file Spark wrote into the mirrors — the apply job's data and delete files, not the
    snapshot's, which its workers write themselves (``lakeslot-…``) — is compressed with
    ``codec`` (read with pyiceberg and pyarrow)."""
    local = local_support.local(path, db, state_dir)
    warehouse = local.job.ingestion.spec.sink.catalog.warehouse
    assert warehouse is not None  # (a hadoop catalog)
    written = []
    for table in tables:
        mirror = load_hadoop_table(warehouse, local.job.names.mirror_identifier(table))
        assert mirror is not None, table
        for task in mirror.scan().plan_files():
            written += [f.file_path for f in (task.file, *task.delete_files)
                        if not f.file_path.rsplit("/", 1)[-1].startswith("lakeslot-")]
    assert written, "the workload's changes were applied: Spark wrote files"
    for file in written:
        metadata = pq.ParquetFile(file.removeprefix("file:")).metadata
        assert {metadata.row_group(g).column(c).compression
                for g in range(metadata.num_row_groups)
                for c in range(metadata.num_columns)} == {codec}, file


@pytest.mark.slow
def test_run_once_under_a_concurrent_workload_then_resume_equals_the_source(source, tmp_path):
    db, tables = source
    path, state_dir, log = tmp_path / "ingestion.yaml", tmp_path / "state", tmp_path / "run.log"
    document = local_support.write_ingestion(path, db, tables, tmp_path)
    # spec.spark.sparkConf reaches the local Spark session too (seen in the files it writes)
    document["spec"]["spark"] = {"sparkConf": {"spark.sql.iceberg.compression-codec": "gzip"}}
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    workload = _workload(db, tables)
    _run_once(path, db, state_dir, log)  # snapshot and streaming while the workload writes
    assert "caught up" in log.read_text()
    transactions = workload.stop()
    assert transactions > 0
    _run_once(path, db, state_dir, log)  # a restart resumes exactly and catches up
    _assert_equal(path, db, tables)
    _assert_codec(path, db, state_dir, tables, "GZIP")
    assert local_support.temporary_slots(db) == []
    assert db.cluster.password not in log.read_text()

    status = subprocess.run([local_support.LAKESLOT, "status", "-f", str(path), "--state-dir",
                             str(state_dir), "-o", "json"], capture_output=True, text=True,
                            env={**os.environ, "LAKESLOT_SOURCE_PASSWORD": db.cluster.password},
                            check=False)
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert {t["state"] for t in document["tables"]} == {"Streaming"}
    assert all(t["rowsStaged"] == 0 for t in document["tables"])
    conditions = {c["type"]: c for c in document["conditions"]}
    assert conditions["SourceReady"]["status"] == conditions["SlotReady"]["status"] == "True"
    assert conditions["SnapshotComplete"]["status"] == "True"
    assert conditions["Streaming"]["reason"] == "ReaderNotReady"  # no run is active any more
    assert document["slot"].get("activePid") is None
    assert db.cluster.password not in status.stdout
