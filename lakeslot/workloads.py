"""How an ingestion's workloads are invoked: the one definition of their command lines, shared
by the operator (container commands, SparkApplication arguments) and local mode (child
processes, in-process calls).

Contract:

- The reader is ``lakeslot reader`` with explicit flags (it needs no Spark and no catalog).
- The Spark jobs take ``--ingestion-json``: the ingestion resource (metadata name/namespace
  and spec) as JSON, from which they derive everything with the same models and naming
  functions as the operator, so operator and jobs can never disagree about a name — plus the
  tables the job should handle and job-specific flags.
- No credential is ever part of a command line: the spec holds only Secret *references*; the
  password arrives as the ``LAKESLOT_SOURCE_PASSWORD`` environment variable and the CA as a
  file at ``CA_FILE`` (both wired by the operator from the user's Secrets).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from lakeslot.api.models import PostgresIngestion
from lakeslot.source.tables import TableName

PASSWORD_ENV = "LAKESLOT_SOURCE_PASSWORD"
CA_FILE = "/etc/lakeslot/source-ca/ca.crt"
READER_METRICS_PORT = 9187


def ingestion_json(ingestion: PostgresIngestion) -> str:
    """The resource without status, as compact JSON (camelCase, unset defaults omitted)."""
    document = ingestion.to_document()
    document.pop("status", None)
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def _table_args(tables: Iterable[TableName]) -> list[str]:
    return [arg for t in tables for arg in ("--table", json.dumps([t.schema, t.name]))]


def reader_command(ingestion: PostgresIngestion, slot: str, publication: str) -> list[str]:
    source = ingestion.spec.source
    namespace = ingestion.metadata.namespace or "default"
    command = ["lakeslot", "reader", "--ingestion", f"{namespace}/{ingestion.metadata.name}",
               "--slot", slot, "--publication", publication, "--staging", ingestion.spec.staging.uri,
               "--host", source.host, "--port", str(source.port), "--dbname", source.database,
               "--user", source.user, "--sslmode", source.ssl_mode,
               "--metrics-port", str(READER_METRICS_PORT)]
    if source.ca_secret_ref is not None:
        command += ["--sslrootcert", CA_FILE]
    return command


def snapshot_arguments(ingestion: PostgresIngestion, tables: Iterable[TableName], *,
                       resnapshot: bool) -> list[str]:
    return ["--ingestion-json", ingestion_json(ingestion), *_table_args(tables),
            *(["--resnapshot"] if resnapshot else [])]


def apply_arguments(ingestion: PostgresIngestion, tables: Iterable[TableName]) -> list[str]:
    return ["--ingestion-json", ingestion_json(ingestion), *_table_args(tables)]
