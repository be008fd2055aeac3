"""Helpers for the apply tests: a source database with a publication and slot, the real reader
sealing segments, the real snapshot job, the apply job, and both sides read back for comparison."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from psycopg import sql

from lakeslot import workloads
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.apply import job as apply_job
from lakeslot.apply.outcomes import PassResult, TableOutcome
from lakeslot.mirror.catalogs import load_hadoop_table
from lakeslot.staging.store import Staging
from spark_jobs import apply as apply_entry
from spark_jobs import snapshot as snapshot_entry
from tests.support.apply_workload import IDLE, KEYLESS, MAIN, create_tables
from tests.support.fixtures_pg import Database
from tests.support.operator_env import ingestion_document
from tests.support.reader_support import current_lsn, prepare, read_until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class Pipeline:
    """One ingestion under test: source ``pgdb``, staging directory, mirrors in ``namespace``."""

    spark: SparkSession
    pgdb: Database
    staging: str
    namespace: str  # catalog.ns, as the iceberg_namespace fixture gives it
    tables: list[TableName]
    ingestion: PostgresIngestion
    staged: dict = field(default_factory=dict)  # segment name → its rows, kept past retention

    @classmethod
    def create(cls, spark, pgdb, warehouse, namespace: str, staging_uri: str,
               tables: list[TableName], table_options: dict | None = None, **spec) -> Pipeline:
        """``spec``: sections of the spec, merged into the defaults (camelCase keys)."""
        catalog, ns = namespace.split(".", 1)
        document = ingestion_document("apply", pgdb, tables, warehouse=str(warehouse),
                                      staging=staging_uri)
        for key, value in spec.items():
            document["spec"][key] = {**document["spec"].get(key, {}), **value}
        document["spec"]["sink"].update(namespace=ns)
        document["spec"]["sink"]["catalog"]["name"] = catalog
        for entry in document["spec"]["source"]["tables"]:
            entry.update((table_options or {}).get(TableName(entry["schema"], entry["name"]), {}))
        return cls(spark, pgdb, staging_uri, namespace, tables,
                   PostgresIngestion.model_validate(document))

    def with_spec(self, **changes) -> Pipeline:
        document = self.ingestion.to_document()
        for key, value in changes.items():
            document["spec"][key] = {**document["spec"].get(key, {}), **value}
        return Pipeline(self.spark, self.pgdb, self.staging, self.namespace, self.tables,
                        PostgresIngestion.model_validate(document), self.staged)

    def arguments(self, invocation: workloads.Invocation) -> list[str]:
        """``invocation``'s arguments, its job document in a file beside staging."""
        directory = Path(urlparse(self.staging).path).parent
        return invocation.write(directory / f"job-{uuid.uuid4().hex[:8]}.json")

    def job_input(self) -> workloads.JobInput:
        parser = apply_entry.build_parser()
        argv = self.arguments(workloads.apply_invocation(self.ingestion, self.tables))
        return workloads.job_input(parser, parser.parse_args(argv))

    def start_slot(self) -> None:
        with self.pgdb.connect() as conn:
            prepare(conn, self.tables)

    def snapshot(self) -> None:
        argv = self.arguments(workloads.snapshot_invocation(self.ingestion, self.tables))
        assert snapshot_entry.main(argv, spark=self.spark) == 0

    def copy_again(self) -> dict[TableName, str]:
        """What the control plane does next for the tables the apply job stopped for a
        re-snapshot (:func:`lakeslot.control.resnapshot.decide` on the mirrors' progress): each
        of them copied again, alone; each copied table's outcome."""
        from lakeslot.control import resnapshot
        from lakeslot.mirror import progress as mirror_progress
        from lakeslot.snapshot import job as snapshot_job

        decision = resnapshot.decide(mirror_progress.read(self.ingestion, self.tables),
                                     self.ingestion.spec.policies)
        if not decision.copy:
            return {}
        job_input = self.job_input()
        copied = snapshot_job.run(self.spark, type(job_input)(job_input.ingestion,
                                                              tuple(sorted(decision.copy))),
                                  min_snapshot_lsn=decision.min_snapshot_lsn)
        return {t.source: t.state for t in copied.tables}

    def seal(self) -> int:
        """Run the reader until everything committed so far is sealed; returns that LSN."""
        with self.pgdb.connect() as conn:
            target = current_lsn(conn)
        read_until(self.pgdb, self.staging, target)
        store = Staging(self.staging)
        for name in store.list():
            if name not in self.staged:
                self.staged[name] = list(store.read(name).rows())
        return target

    def apply(self, **options) -> apply_job.ApplyResult:
        return apply_job.run(self.spark, self.job_input(), once=True, **options)

    def target(self, table: TableName, suffix: str = "") -> str:
        catalog, ns = self.namespace.split(".", 1)
        name = self.job_input().names.mirror_table(table) + suffix
        return ".".join(f"`{p}`" for p in (catalog, *ns.split("."), name))

    def mirror_rows(self, table: TableName, columns: list[str], key: str = "id",
                    version: int | None = None) -> list[tuple]:
        travel = f" VERSION AS OF {version}" if version is not None else ""
        select = ", ".join(f"`{c.replace('`', '``')}`" for c in columns)
        rows = self.spark.sql(f"SELECT {select} FROM {self.target(table)}{travel} "
                              f"ORDER BY `{key}`").collect()
        return [tuple(normal(v) for v in row) for row in rows]

    def snapshots(self, table: TableName, suffix: str = "") -> list[tuple[int, int]]:
        """(snapshot id, lakeslot.lsn) of every snapshot of the table, oldest first."""
        rows = self.spark.sql(f"SELECT snapshot_id, summary['lakeslot.lsn'] AS lsn, committed_at "
                              f"FROM {self.target(table, suffix)}.snapshots "
                              "ORDER BY committed_at").collect()
        return [(r.snapshot_id, int(r.lsn)) for r in rows if r.lsn is not None]


def workload_pipeline(spark, warehouse, namespace: str, pgdb: Database, tmp_path, monkeypatch,
                      **spec) -> Pipeline:
    """The tables of :mod:`tests.support.apply_workload` (MAIN, KEYLESS with ``keyColumns``,
    IDLE) created in ``pgdb``, staged under ``tmp_path``; ``spec``: sections of the spec."""
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)
    with pgdb.connect() as conn:
        create_tables(conn)
    return Pipeline.create(spark, pgdb, warehouse, namespace, (tmp_path / "staging").as_uri(),
                           [MAIN, KEYLESS, IDLE], table_options={KEYLESS: {"keyColumns": ["a"]}},
                           **spec)


def source_rows(conn, table: TableName, key: str = "id") -> tuple[list[str], list[tuple]]:
    cursor = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY {}").format(table.sql(),
                                                                         sql.Identifier(key)))
    return [d.name for d in cursor.description], [tuple(normal(v) for v in row)
                                                  for row in cursor.fetchall()]


def normal(value):
    """One representation for values read from PostgreSQL and from Spark."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    if isinstance(value, decimal.Decimal):
        return value.normalize()
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, list):
        return tuple(normal(v) for v in value)
    return value


def lsn_now(pgdb) -> int:
    with pgdb.connect() as conn:
        return current_lsn(conn)


def assert_mirror_equals_source(pipeline: Pipeline, warehouse, table: TableName) -> None:
    """Every column of every row of the source table equals the mirror, read with pyiceberg
    (independently of the apply code)."""
    assert_equal_to_source(pipeline.pgdb, warehouse.as_uri(),
                           pipeline.job_input().names.mirror_identifier(table), table)


def assert_equal_to_source(pgdb: Database, warehouse_uri: str, identifier: tuple[str, ...],
                           table: TableName) -> None:
    """The same, for the mirror ``identifier`` (namespace levels, name) in a hadoop ``warehouse_uri``."""
    loaded = load_hadoop_table(warehouse_uri, identifier)
    assert loaded is not None, table
    assert_table_equals_source(pgdb, loaded, table)


def assert_table_equals_source(pgdb: Database, loaded, table: TableName) -> None:
    """Every column of every row of the source ``table`` equals the pyiceberg table ``loaded``."""
    with pgdb.connect() as conn:
        cursor = conn.execute(sql.SQL("SELECT * FROM {}").format(table.sql()))
        assert cursor.description is not None
        names = [d.name for d in cursor.description]
        expected = sorted(tuple(normal(v) for v in row) for row in cursor.fetchall())
    data = loaded.scan(selected_fields=tuple(names)).to_arrow().select(names)
    mirrored = sorted(tuple(normal(v) for v in row.values()) for row in data.to_pylist())
    assert len(mirrored) == len(expected), (table, len(mirrored), len(expected))
    assert mirrored == expected, table


def outcome(result: PassResult, table: TableName) -> TableOutcome:
    """``table``'s outcome in the pass ``result``."""
    return next(o for o in result.tables if o.source == table)
