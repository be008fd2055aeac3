"""``lakeslot run`` copies a table again on its own, alone and online, when a migration changed
it in a way the stream does not show (policies.onSchemaChange: Resnapshot, the default), and a
``--once`` run still ends caught up with every table equal to its source. Real PostgreSQL 15 and
18, the reader as a child process, the run in this process on the tests' Spark session
(``local[*]`` + Iceberg: no JVM to start for each of its four runs)."""

from __future__ import annotations

import logging

import pytest
import yaml

from lakeslot import workloads
from lakeslot.api.naming import TableName
from lakeslot.local import config, state
from lakeslot.mirror import progress as mirror_progress
from lakeslot.verify import checksums
from tests.support import local_support
from tests.support.fixtures_pg import connection_settings

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

RENAMED, STEADY = TableName("public", "renamed"), TableName("public", "steady")


def _run_once(path, db, state_dir, spark, caplog) -> str:
    """``lakeslot run --once`` (the ingestion file read anew, as a new run would) and what it
    logged."""
    caplog.clear()
    local_support.run_in_process(local_support.local(path, db, state_dir), spark, once=True)
    return caplog.text


@pytest.mark.slow
def test_a_renamed_column_is_copied_again_by_the_run_and_the_mirror_equals_the_source(
        pgdb, spark, spark_warehouse, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="lakeslot")
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)  # the apply job's, in process
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE renamed (id int PRIMARY KEY, a text)")
        conn.execute("CREATE TABLE steady (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO renamed SELECT g, 'r' || g FROM generate_series(1, 500) g")
        conn.execute("INSERT INTO steady SELECT g, 's' || g FROM generate_series(1, 500) g")
    path, state_dir = tmp_path / "ingestion.yaml", tmp_path / "state"
    # without lakeslot's event trigger (its mode: tests/test_ddl_capture.py), a rename is a
    # re-snapshot
    local_support.write_ingestion(path, pgdb, [RENAMED, STEADY], tmp_path, warehouse=spark_warehouse,
                                  source={"ddlCapture": "Catalog"})
    _run_once(path, pgdb, state_dir, spark, caplog)

    with pgdb.connect() as conn:
        conn.execute("ALTER TABLE renamed RENAME COLUMN a TO b")
        conn.execute("UPDATE renamed SET b = 'after' WHERE id <= 10")
        conn.execute("UPDATE steady SET v = 'after' WHERE id <= 10")
    text = _run_once(path, pgdb, state_dir, spark, caplog)
    assert "TableResnapshot: copying public.renamed again" in text and "renamed to 'b'" in text

    ingestion = config.load_ingestion(str(path))
    checks = checksums.compare(ingestion, connection_settings(pgdb), [RENAMED, STEADY])
    assert [c for c in checks if not c.equal] == [], checksums.render(checks)
    progress = mirror_progress.read(ingestion, [RENAMED, STEADY])
    assert progress[RENAMED].resnapshots_last_hour == 1 and progress[RENAMED].error is None
    assert progress[STEADY].resnapshots_last_hour == 0

    # the user's request copies one table again, once: a later run does not repeat it
    document = yaml.safe_load(path.read_text())
    for entry in document["spec"]["source"]["tables"]:
        if entry["name"] == STEADY.name:
            entry["resnapshotGeneration"] = 1
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    text = _run_once(path, pgdb, state_dir, spark, caplog)
    assert text.count("TableResnapshot: copying public.steady again") == 1
    assert "requested (resnapshotGeneration)" in text
    # recorded as the operator records it in status.tables (resnapshot.serve_requests): the
    # generation observed, the request served (the copy's snapshot reached it)
    [row] = [r for r in state.read_tables(state_dir) if r.name == STEADY.name]
    assert row.observed_resnapshot_generation == 1 and row.resnapshot_below_lsn is None
    assert "TableResnapshot" not in _run_once(path, pgdb, state_dir, spark, caplog)
    progress = mirror_progress.read(ingestion, [RENAMED, STEADY])
    assert progress[STEADY].resnapshots_last_hour == 1
    checks = checksums.compare(ingestion, connection_settings(pgdb), [RENAMED, STEADY])
    assert [c for c in checks if not c.equal] == [], checksums.render(checks)
