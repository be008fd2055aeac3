"""Helpers for the snapshot tests: jobs against a test database, and reading both sides."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from psycopg import sql

from lakeslot.api.naming import TableName
from lakeslot.mirror import typemap
from lakeslot.snapshot import plan
from lakeslot.snapshot.follower import (
    RangeResult,
    RangeTask,
    run_task,
    without_password,
)
from lakeslot.snapshot.job import SnapshotJob
from lakeslot.snapshot.plan import TableRequest
from lakeslot.source.connection import PASSWORD_ENV, connect
from lakeslot.source.exported_snapshot import SLOT_PREFIX, exported_snapshot, import_statements
from tests.support.fixtures_pg import connection_settings
from tests.support.fixtures_spark import static_table


def target_name(table: TableName) -> str:
    """A distinct Iceberg table name for any source name (odd identifiers included)."""
    readable = re.sub(r"[^a-z0-9_]", "_", f"{table.schema}__{table.name}".lower())
    return f"{readable}_{hashlib.sha256(str(table).encode()).hexdigest()[:6]}"


def make_job(pgdb, namespace: str, tables, **options) -> SnapshotJob:
    """A job for :func:`lakeslot.snapshot.job.copy` copying ``tables`` (TableName or
    TableRequest) into ``namespace`` (``catalog.ns`` as the ``iceberg_namespace`` fixture gives
    it)."""
    catalog, ns = namespace.split(".", 1)
    requests = tuple(t if isinstance(t, TableRequest) else TableRequest(t, target_name(t))
                     for t in tables)
    options.setdefault("parallelism", 2)
    return SnapshotJob(source=connection_settings(pgdb), tables=requests, namespace=ns,
                       catalog=catalog, ingestion="test", **options)


def mirror(spark_warehouse, namespace: str, table: TableName | str):
    name = table if isinstance(table, str) else target_name(table)
    return static_table(spark_warehouse, f"{namespace}.{name}")


def mirror_rows(spark_warehouse, namespace: str, table: TableName | str, key: str = "id") -> list[dict]:
    """The mirror table's rows as dicts, ordered by ``key`` (``_lakeslot_lsn`` included)."""
    arrow: pa.Table = mirror(spark_warehouse, namespace, table).scan().to_arrow()
    return arrow.sort_by(key).to_pylist() if arrow.num_rows else []


def source_rows(conn, table: TableName, key: str = "id") -> list[dict]:
    cursor = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY {}").format(table.sql(),
                                                                         sql.Identifier(key)))
    names = [d.name for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def rows_as_of(pgdb, snapshot_name: str, table: TableName, key: str = "id") -> list[dict]:
    """The table's rows seen by a second session importing the exported snapshot."""
    with pgdb.connect(autocommit=True) as conn:
        for statement in import_statements(snapshot_name):
            conn.execute(statement)
        return source_rows(conn, table, key)


def without_lsn(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "_lakeslot_lsn"} for row in rows]


def snapshot_slots(pgdb) -> list[str]:
    with pgdb.connect() as conn:
        return [r[0] for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE %s",
            (SLOT_PREFIX + "%",))]


@contextlib.contextmanager
def password_in_env(pgdb):
    """Followers read the password from the environment (as executors do)."""
    saved = os.environ.get(PASSWORD_ENV)
    os.environ[PASSWORD_ENV] = pgdb.cluster.password
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(PASSWORD_ENV, None)
        else:
            os.environ[PASSWORD_ENV] = saved


def copy_without_spark(pgdb, request: TableRequest, directory: Path,
                       target_range_bytes: int = 1 << 30) -> tuple[plan.TablePlan, list[RangeResult]]:
    """Leader, plan and followers of one table, run in this process (no Spark, no Iceberg): the
    followers' Parquet files land under ``directory``."""
    settings = connection_settings(pgdb)
    with password_in_env(pgdb), exported_snapshot(settings, "lakeslot-test") as snapshot:
        with connect(settings, "lakeslot-test-plan") as conn:
            for statement in import_statements(snapshot.name):
                conn.execute(statement)
            (table_plan,) = plan.inspect(conn, [request], target_range_bytes=target_range_bytes)
            conn.execute("COMMIT")
        if isinstance(table_plan, plan.TableFailure):
            raise AssertionError(table_plan.message)
        schema = typemap.arrow_schema(typemap.mirror_schema(table_plan.columns), table_plan.columns)
        results = [run_task(RangeTask(
            settings=without_password(settings), ingestion="test", label=f"r{i}",
            snapshot=snapshot.name, lsn=snapshot.lsn, table=request.source, heap=heap, range=r,
            columns=table_plan.columns, schema=schema, location=str(directory / f"r{i}")))
            for i, (heap, r) in enumerate(table_plan.ranges)]
    return table_plan, results


def read_files(results: list[RangeResult]) -> pa.Table:
    errors = [r.error for r in results if r.error]
    if errors:
        raise AssertionError(errors)
    return pa.concat_tables([pq.read_table(f) for r in results for f in r.files])
