"""partitionBy end to end, with a real PostgreSQL, the real snapshot job, reader and apply job on
Spark with Iceberg: a table with odd identifiers (quotes, spaces, unicode) is mirrored with
``bucket``, ``days`` and ``truncate`` partition fields. Read back with pyiceberg, independently of
the Spark code: the mirror's partition spec, the spec every data file was written under, and the
mirror against the source row by row — after the snapshot, after streamed changes, after a
change of partitionBy (evolved in place) and after a re-snapshot. A bad spec (a missing column,
days() of a text column, a renamed column) fails the table in status with the reason and fix, and
nothing is written."""

from __future__ import annotations

import datetime as dt

import pytest
from psycopg import sql

from lakeslot.api.models import PostgresIngestion, PostgresIngestionStatus
from lakeslot.api.naming import TableName
from lakeslot.control import steps
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.mirror.contract import PARTITION_PROPERTY
from lakeslot.observability.status_report import Report
from lakeslot.snapshot import job as snapshot_job
from tests.support.apply_support import Pipeline, assert_mirror_equals_source
from tests.support.operator_env import ingestion_document

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

T = TableName('Sales "EU"', "Line Items ñ")
AT, CODE = "Created At", 'co"de'
SPEC = ["bucket(4, id)", 'days("Created At")', 'truncate(2, "co""de")']
START = dt.datetime(2026, 3, 1, 10, 30, tzinfo=dt.UTC)


def _create(conn) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(T.schema)))
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, {} timestamptz NOT NULL, "
                         "{} text, amount numeric(12,2), note text)").format(
        T.sql(), sql.Identifier(AT), sql.Identifier(CODE)))
    _insert(conn, range(1, 41))


def _insert(conn, ids) -> None:
    with conn.cursor() as cursor:
        cursor.executemany(
            sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s)").format(T.sql()),
            [(i, START + dt.timedelta(hours=7 * i), f"{'xyz'[i % 3]}{i}" if i % 5 else None,
              f"{i}.25", f"row {i}") for i in ids])


def _pipeline(spark, pgdb, warehouse, namespace, tmp_path, partition_by) -> Pipeline:
    return Pipeline.create(spark, pgdb, warehouse, namespace, (tmp_path / "staging").as_uri(), [T],
                           table_options={T: {"partitionBy": partition_by}})


def _with_partition_by(pipeline: Pipeline, partition_by: list[str], **sections) -> Pipeline:
    tables = pipeline.ingestion.to_document()["spec"]["source"]["tables"]
    for entry in tables:
        entry["partitionBy"] = partition_by
    return pipeline.with_spec(source={"tables": tables}, **sections)


def _mirror(pipeline: Pipeline, warehouse):
    table = load_hadoop_table(warehouse.as_uri(), pipeline.job_input().names.mirror_identifier(T))
    assert table is not None
    return table


def _spec(table) -> list[tuple[str, str]]:
    """The current partition spec as (transform, source column) pairs, as pyiceberg reads it."""
    schema = table.schema()
    return [(str(f.transform), schema.find_column_name(f.source_id)) for f in table.spec().fields]


def _file_specs(table) -> dict[int, int]:
    """How many live data files were written under each partition spec id."""
    counts: dict[int, int] = {}
    for task in table.scan().plan_files():
        counts[task.file.spec_id] = counts.get(task.file.spec_id, 0) + 1
    return counts


def _change(pipeline: Pipeline) -> None:
    with pipeline.pgdb.connect() as conn:
        _insert(conn, range(41, 51))
        conn.execute(sql.SQL("UPDATE {} SET {} = {} + interval '3 days', note = 'moved' "
                             "WHERE id % 4 = 0").format(T.sql(), sql.Identifier(AT),
                                                        sql.Identifier(AT)))
        conn.execute(sql.SQL("UPDATE {} SET id = id + 1000 WHERE id IN (3, 7)").format(T.sql()))
        conn.execute(sql.SQL("UPDATE {} SET {} = 'zz' WHERE id = 11").format(
            T.sql(), sql.Identifier(CODE)))
        conn.execute(sql.SQL("DELETE FROM {} WHERE id IN (5, 6, 45)").format(T.sql()))


@pytest.mark.slow
def test_a_partitioned_mirror_through_snapshot_apply_evolution_and_resnapshot(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    with pgdb.connect() as conn:
        _create(conn)
    pipeline = _pipeline(spark, pgdb, spark_warehouse, iceberg_namespace, tmp_path, SPEC)
    pipeline.start_slot()
    pipeline.snapshot()

    mirror = _mirror(pipeline, spark_warehouse)
    assert _spec(mirror) == [("bucket[4]", "id"), ("day", AT), ("truncate[2]", CODE)]
    assert [f.name for f in mirror.spec().fields] == ["id_bucket_4", "Created At_day", 'co"de_trunc_2']
    assert mirror.properties[PARTITION_PROPERTY] == 'bucket(4, id), days("Created At"), truncate(2, "co""de")'
    # the snapshot's files were laid out by the spec: every file is in it, one partition each,
    # by a rewrite that keeps the snapshot's position
    assert set(_file_specs(mirror)) == {mirror.spec().spec_id}
    assert len(list(mirror.scan().plan_files())) > 1
    laid_out = mirror.current_snapshot().summary
    assert laid_out["operation"].value == "replace"
    assert laid_out["lakeslot.maintenance"] == "partitioning"
    assert laid_out["lakeslot.lsn"] == mirror.properties["lakeslot.snapshot-lsn"]
    for task in mirror.scan().plan_files():
        assert task.file.partition[0] is not None and 0 <= task.file.partition[0] < 4
    assert_mirror_equals_source(pipeline, spark_warehouse, T)
    # partition pruning works on the laid-out copy: one day's files only
    day = START + dt.timedelta(hours=7 * 10)
    pruned = mirror.scan(row_filter=f""""{AT}" >= '{day:%Y-%m-%d}T00:00:00+00:00' and """
                                    f""""{AT}" < '{day:%Y-%m-%d}T23:59:59+00:00'""")
    assert 0 < len(list(pruned.plan_files())) < len(list(mirror.scan().plan_files()))

    _change(pipeline)
    pipeline.seal()
    [outcome] = pipeline.apply().tables
    assert outcome.state == "applied", outcome.error
    mirror = _mirror(pipeline, spark_warehouse)
    assert set(_file_specs(mirror)) == {mirror.spec().spec_id}  # the MERGE wrote partitioned files
    assert_mirror_equals_source(pipeline, spark_warehouse, T)

    # a changed partitionBy evolves the spec in place at the next pass; the old files stay
    evolved = _with_partition_by(pipeline, ["bucket(8, id)", 'months("Created At")'])
    with pgdb.connect() as conn:
        _insert(conn, range(51, 56))
    evolved.seal()
    [outcome] = evolved.apply().tables
    assert outcome.state == "applied", outcome.error
    mirror = _mirror(pipeline, spark_warehouse)
    assert _spec(mirror) == [("bucket[8]", "id"), ("month", AT)]
    assert mirror.properties[PARTITION_PROPERTY] == 'bucket(8, id), months("Created At")'
    assert len(_file_specs(mirror)) == 2  # old files in the old spec, the new rows in the new
    assert_mirror_equals_source(pipeline, spark_warehouse, T)

    # a re-snapshot copies the table into the current spec alone
    again = _with_partition_by(pipeline, ["bucket(8, id)", 'months("Created At")'],
                               snapshot={"resnapshotGeneration": 1})
    again.snapshot()
    mirror = _mirror(pipeline, spark_warehouse)
    assert _spec(mirror) == [("bucket[8]", "id"), ("month", AT)]
    assert mirror.properties["lakeslot.snapshot-generation"] == "1"
    assert set(_file_specs(mirror)) == {mirror.spec().spec_id}
    assert_mirror_equals_source(pipeline, spark_warehouse, T)


def _check(pgdb, tmp_path, partition_by: list[str]) -> Report:
    document = ingestion_document("parts", pgdb, [T], warehouse=str(tmp_path / "w"),
                                  staging=(tmp_path / "s").as_uri())
    document["spec"]["source"]["tables"][0]["partitionBy"] = partition_by
    ingestion = PostgresIngestion.model_validate(document)
    report = Report(PostgresIngestionStatus(), 1, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    with pgdb.connect(autocommit=True) as conn:
        assert steps.check_source(conn, ingestion, report) is None  # no usable table
        published = conn.execute("SELECT count(*) FROM pg_publication_tables").fetchone()
        assert published == (0,)  # nothing was added to a publication
    return report


def test_a_bad_spec_fails_the_table_with_the_reason_and_nothing_is_written(pgdb, tmp_path):
    with pgdb.connect() as conn:
        _create(conn)
    report = _check(pgdb, tmp_path, ["bucket(4, ID)", "days(note)"])
    [row] = report.status.tables
    assert row.state == "Failed"
    assert (f"{T}: partitionBy bucket(4, ID): the table has no column ID (renamed or dropped?); "
            "partitionBy days(note): column note is PostgreSQL text, mirrored as string, and days "
            "takes only date, timestamp or timestamptz columns — fix: name an existing column in "
            "partitionBy, exactly as PostgreSQL stores it; choose another transform or column in "
            "partitionBy (spec.source.tables[].partitionBy of this table)") in row.message

    # a column of the spec renamed at the source: the table stops, saying so, until fixed
    with pgdb.connect(autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO created").format(
            T.sql(), sql.Identifier(AT)))
    [row] = _check(pgdb, tmp_path, SPEC).status.tables
    assert row.state == "Failed" and 'days("Created At"): the table has no column "Created At"' in row.message


def test_the_snapshot_refuses_a_spec_the_table_cannot_take_and_writes_nothing(
        spark, spark_warehouse, iceberg_namespace, pgdb, tmp_path, monkeypatch):
    monkeypatch.setenv("LAKESLOT_SOURCE_PASSWORD", pgdb.cluster.password)
    with pgdb.connect() as conn:
        _create(conn)
    pipeline = _pipeline(spark, pgdb, spark_warehouse, iceberg_namespace, tmp_path,
                         ["hours(amount)"])
    pipeline.start_slot()
    result = snapshot_job.run(spark, pipeline.job_input())
    [outcome] = result.tables
    assert outcome.state == "failed"
    assert ("partitionBy hours(amount): column amount is PostgreSQL numeric, mirrored as "
            "decimal(12, 2), and hours takes only timestamp or timestamptz columns") in (outcome.error or "")
    assert load_hadoop_table(spark_warehouse.as_uri(),
                             pipeline.job_input().names.mirror_identifier(T)) is None
