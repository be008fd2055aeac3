"""How an ingestion's workloads are invoked: the one definition of their command lines, shared
by the operator (container commands, SparkApplication arguments) and local mode (child
processes, in-process calls).

Contract:

- The reader is ``lakeslot reader`` with explicit flags (it needs no Spark and no catalog).
- The operator's verification Job is ``lakeslot verify --ingestion-json`` with the tables as a
  person names them and the request token its result document answers (:func:`verify_command`).
- The Spark jobs take ``--ingestion-json``: the ingestion resource (metadata name/namespace
  and spec) as JSON, from which they derive everything with the same models and naming
  functions as the operator, so operator and jobs can never disagree about a name — plus the
  tables the job should handle and job-specific flags.
- No credential is ever part of a command line: the spec holds only Secret *references*; the
  password arrives as the ``LAKESLOT_SOURCE_PASSWORD`` environment variable and the CA as a
  file at ``CA_FILE`` (both wired by the operator from the user's Secrets; local mode sets
  ``LAKESLOT_SOURCE_CA_FILE`` to where it wrote the CA). Catalog properties from Secrets
  (``sink.catalog.secretProperties``) arrive as ``LAKESLOT_CATALOG_<KEY>`` variables
  (:func:`catalog_secret_env`).

Failure modes: :func:`add_job_arguments` makes argparse exit with status 2 and a message naming
the flag when the JSON is malformed or the resource fails validation (the same message
``lakeslot validate`` prints).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pydantic

from lakeslot.api.models import PostgresIngestion, TableSpec
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.api.validation import parse_resource, problems_of
from lakeslot.source.connection import PASSWORD_ENV, ConnectionSettings, settings_from_spec

CA_FILE = "/etc/lakeslot/source-ca/ca.crt"
CA_FILE_ENV = "LAKESLOT_SOURCE_CA_FILE"
READER_METRICS_PORT = 9187


def ingestion_json(ingestion: PostgresIngestion) -> str:
    """The resource without status, as compact JSON (camelCase, unset defaults omitted)."""
    document = ingestion.to_document()
    document.pop("status", None)
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def _table_args(tables: Iterable[TableName]) -> list[str]:
    return [arg for t in tables for arg in ("--table", json.dumps([t.schema, t.name]))]


def reader_command(ingestion: PostgresIngestion) -> list[str]:
    source, names = ingestion.spec.source, IngestionNames.of(ingestion)
    reader = ingestion.spec.reader
    command = ["lakeslot", "reader", "--ingestion", names.owner, "--slot", names.slot,
               "--publication", names.publication, "--staging", ingestion.spec.staging.uri,
               "--host", source.host, "--port", str(source.port), "--dbname", source.database,
               "--user", source.user, "--sslmode", source.ssl_mode,
               "--metrics-port", str(READER_METRICS_PORT),
               "--segment-max-seconds", f"{ingestion.spec.seal_seconds():g}"]
    if reader.segment_max_bytes is not None:
        command += ["--segment-max-bytes", str(reader.segment_max_bytes)]
    if source.ca_secret_ref is not None:
        command += ["--sslrootcert", CA_FILE]
    for key, value in sorted(source.options.items()):  # no secrets: the API rejects password here
        command += ["--source-option", f"{key}={value}"]
    return command


def snapshot_arguments(ingestion: PostgresIngestion, tables: Iterable[TableName], *,
                       min_snapshot_lsn: int = 0) -> list[str]:
    """The snapshot job copies each listed table unless it already holds a snapshot of
    generation ≥ ``spec.snapshot.resnapshotGeneration`` taken at an LSN ≥ ``min_snapshot_lsn``
    (so a rerun after a crash resumes; a recreated slot invalidates older snapshots)."""
    return ["--ingestion-json", ingestion_json(ingestion), *_table_args(tables),
            *(["--min-snapshot-lsn", str(min_snapshot_lsn)] if min_snapshot_lsn else [])]


def apply_arguments(ingestion: PostgresIngestion, tables: Iterable[TableName]) -> list[str]:
    return ["--ingestion-json", ingestion_json(ingestion), *_table_args(tables)]


def verify_command(ingestion: PostgresIngestion, tables: Iterable[TableName], token: str) -> list[str]:
    """``lakeslot verify`` of ``tables`` (none: every selected table), writing its outcome to
    staging for the request ``token``; secrets come from the environment, as for the jobs."""
    return ["lakeslot", "verify", "--ingestion-json", ingestion_json(ingestion),
            *[arg for t in tables for arg in ("--table", str(t))], "--result-token", token]


def catalog_secret_env(key: str) -> str:
    """The environment variable carrying the Secret-backed catalog property ``key``."""
    return "LAKESLOT_CATALOG_" + re.sub(r"[^A-Z0-9]", "_", key.upper())


# The jobs' side of the contract ------------------------------------------------------------

@dataclass(frozen=True)
class JobInput:
    """What a Spark job was asked to do: the ingestion and the tables it handles."""

    ingestion: PostgresIngestion
    tables: tuple[TableName, ...]

    @functools.cached_property
    def names(self) -> IngestionNames:
        return IngestionNames.of(self.ingestion)

    def source(self, environ: Mapping[str, str] | None = None) -> ConnectionSettings:
        """Connection settings with the password and CA file from the environment."""
        environ = os.environ if environ is None else environ
        spec = self.ingestion.spec.source
        ca_file = (environ.get(CA_FILE_ENV) or CA_FILE) if spec.ca_secret_ref is not None else None
        return settings_from_spec(spec, password=environ.get(PASSWORD_ENV) or None, ca_file=ca_file)

    def catalog_secrets(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """``sink.catalog.secretProperties`` resolved from the environment (ValueError naming
        the missing variables)."""
        environ = os.environ if environ is None else environ
        keys = self.ingestion.spec.sink.catalog.secret_properties
        missing = [catalog_secret_env(k) for k in keys if catalog_secret_env(k) not in environ]
        if missing:
            raise ValueError("sink.catalog.secretProperties are not in the environment: "
                             + ", ".join(missing))
        return {key: environ[catalog_secret_env(key)] for key in keys}

    def table_spec(self, table: TableName) -> TableSpec | None:
        """The per-table options the spec lists for ``table`` (None: selected by schema)."""
        return self.ingestion.spec.source.table_options(table.schema, table.name)


def ingestion_from_json(text: str) -> PostgresIngestion:
    """The value of ``--ingestion-json`` (argparse's ``ArgumentTypeError`` saying what is wrong)."""
    try:
        return parse_resource(json.loads(text))
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    except pydantic.ValidationError as e:
        problems = "; ".join(f"{p.path}: {p.problem} (fix: {p.fix})" for p in problems_of(e))
        raise argparse.ArgumentTypeError(f"not a valid PostgresIngestion: {problems}") from None


def _table(text: str) -> TableName:
    try:
        schema, name = json.loads(text)
    except (json.JSONDecodeError, TypeError, ValueError):
        raise argparse.ArgumentTypeError(f'expected ["schema", "table"], got {text!r}') from None
    return TableName(schema, name)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every Spark job takes (see :func:`snapshot_arguments`, :func:`apply_arguments`)."""
    parser.add_argument("--ingestion-json", required=True, type=ingestion_from_json, metavar="JSON",
                        help="the PostgresIngestion (metadata and spec) as JSON")
    parser.add_argument("--table", dest="tables", action="append", type=_table, default=[],
                        metavar='["SCHEMA","NAME"]', help="a table to handle (repeatable)")


def job_input(args: argparse.Namespace) -> JobInput:
    return JobInput(args.ingestion_json, tuple(args.tables))
