"""How an ingestion's workloads are invoked: the one definition of their inputs and command
lines, shared by the operator (container commands, SparkApplication arguments, input ConfigMaps)
and local mode (child processes, in-process calls).

Contract:

- The reader is ``lakeslot reader`` with explicit flags (it needs no Spark and no catalog).
- The Spark jobs and the operator's verification Job (``lakeslot verify``) read their input from
  a file, never from the command line: a JSON document (:func:`job_document`) holding the
  ingestion resource (metadata name/namespace and spec, from which they derive everything with
  the same models and naming functions as the operator, so operator and jobs can never disagree
  about a name) and the tables to handle. Linux caps one argument at 128 KiB, which a spec the
  CRD accepts (1,000 tables) exceeds; a ConfigMap holds 1 MiB. The operator mounts the document
  from a ConfigMap owned by the child at :data:`JOB_INPUT_FILE` (it holds no credential, so it
  needs no Secret); the arguments are
  ``--input FILE --input-sha256 DIGEST`` and job-specific flags (:class:`Invocation`). The
  digest is part of the child's spec, so a new document changes the child (the spark-operator
  resubmits it), and the job waits until the mounted file is that document (the kubelet
  refreshes a mounted ConfigMap only after a while).
- No credential is ever part of a command line or of the document: the spec holds only Secret
  *references*; the password arrives as the ``LAKESLOT_SOURCE_PASSWORD`` environment variable
  and the CA as a file at ``CA_FILE`` (both wired by the operator from the user's Secrets; local
  mode sets ``LAKESLOT_SOURCE_CA_FILE`` to where it wrote the CA). Catalog properties from
  Secrets (``sink.catalog.secretProperties``) arrive as ``LAKESLOT_CATALOG_<KEY>`` variables
  (:func:`catalog_secret_env`).

Failure modes: :func:`job_input` makes argparse exit with status 2 and a message naming the
flag when the file cannot be read, is not JSON, or the resource fails validation (the same
message ``lakeslot validate`` prints), or when the file is still not the document of
``--input-sha256`` after :data:`INPUT_WAIT_S` (a ConfigMap that was not updated); a missing file
at :data:`JOB_INPUT_FILE` says what mounts it.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pydantic

from lakeslot.api.models import PostgresIngestion, TableSpec, catalog_secret_env
from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.api.validation import parse_resource, problems_of
from lakeslot.source.connection import PASSWORD_ENV, ConnectionSettings, settings_from_spec

CA_FILE = "/etc/lakeslot/source-ca/ca.crt"
CA_FILE_ENV = "LAKESLOT_SOURCE_CA_FILE"
READER_METRICS_PORT = 9187


JOB_INPUT_DIR = "/etc/lakeslot/job-input"  # where the operator mounts a child's input ConfigMap
JOB_INPUT_KEY = "job.json"  # the ConfigMap's key, the file's name
JOB_INPUT_FILE = f"{JOB_INPUT_DIR}/{JOB_INPUT_KEY}"
INPUT_WAIT_S = 180.0  # the longest wait for a mounted input to become the expected document


def job_document(ingestion: PostgresIngestion, tables: Iterable[TableName]) -> str:
    """A job's input: the resource without status and the tables, as compact JSON (camelCase,
    unset defaults omitted; the same arguments give the same text)."""
    document = ingestion.to_document()
    document.pop("status", None)
    return json.dumps({"ingestion": document, "tables": [[t.schema, t.name] for t in tables]},
                      separators=(",", ":"), sort_keys=True)


def digest(document: str) -> str:
    return hashlib.sha256(document.encode()).hexdigest()


@dataclass(frozen=True)
class Invocation:
    """A job's input document and its own flags; :meth:`arguments` for a file holding it."""

    document: str
    flags: tuple[str, ...] = ()

    def arguments(self, path: str = JOB_INPUT_FILE) -> list[str]:
        return ["--input", path, "--input-sha256", digest(self.document), *self.flags]

    def write(self, path: str | os.PathLike) -> list[str]:
        """Write the document to ``path`` (local runs, tests) and return the arguments."""
        Path(path).write_text(self.document)
        return self.arguments(os.fspath(path))


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


def snapshot_invocation(ingestion: PostgresIngestion, tables: Iterable[TableName], *,
                        min_snapshot_lsn: int = 0) -> Invocation:
    """The snapshot job copies each listed table unless it already holds a snapshot of
    generation ≥ ``spec.snapshot.resnapshotGeneration`` taken at an LSN ≥ ``min_snapshot_lsn``
    (so a rerun after a crash resumes; a recreated slot invalidates older snapshots)."""
    return Invocation(job_document(ingestion, tables),
                      ("--min-snapshot-lsn", str(min_snapshot_lsn)) if min_snapshot_lsn else ())


def apply_invocation(ingestion: PostgresIngestion, tables: Iterable[TableName]) -> Invocation:
    return Invocation(job_document(ingestion, tables))


def verify_invocation(ingestion: PostgresIngestion, tables: Iterable[TableName], token: str
                      ) -> Invocation:
    """``lakeslot verify`` of ``tables`` (none: every selected table), writing its outcome to
    staging for the request ``token``; secrets come from the environment, as for the jobs."""
    return Invocation(job_document(ingestion, tables), ("--result-token", token))


def verify_command(invocation: Invocation, path: str = JOB_INPUT_FILE) -> list[str]:
    return ["lakeslot", "verify", *invocation.arguments(path)]


def catalog_secret_environment(secrets: Mapping[str, str]) -> dict[str, str]:
    """Secret-backed catalog properties (key → value) as the environment carries them."""
    return {catalog_secret_env(key): value for key, value in secrets.items()}


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
        return self._table_specs.get(table)

    @functools.cached_property
    def _table_specs(self) -> dict[TableName, TableSpec]:
        """The listed tables' options by table (a pass asks for each of its tables': a scan of
        the list each time was quadratic in a job of 1,000 tables)."""
        specs: dict[TableName, TableSpec] = {}
        for options in self.ingestion.spec.source.tables:  # (the first listing wins)
            specs.setdefault(TableName(options.schema_name, options.name), options)
        return specs


def ingestion_from_document(document: object) -> PostgresIngestion:
    """The resource of a job's input (ValueError saying what is wrong)."""
    try:
        return parse_resource(document)
    except pydantic.ValidationError as e:
        problems = "; ".join(f"{p.path}: {p.problem} (fix: {p.fix})" for p in problems_of(e))
        raise ValueError(f"not a valid PostgresIngestion: {problems}") from None


def read_input(path: str, expected: str | None = None, *, wait_s: float | None = None,
               sleep=time.sleep) -> JobInput:
    """The job input in the file ``path``; with ``expected`` (a sha256), once the file is that
    document, waiting up to ``wait_s`` (default :data:`INPUT_WAIT_S`; ValueError saying what is
    wrong)."""
    wait_s = INPUT_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    while True:
        try:
            text = Path(path).read_text()
        except OSError as e:
            hint = (" (a Spark driver gets its input ConfigMap from spark-operator's mutating "
                    "webhook, or from a pod template with LAKESLOT_SPARK_POD_TEMPLATES=true: "
                    "enable one of them)") if path == JOB_INPUT_FILE and not os.path.exists(path) else ""
            raise ValueError(f"cannot read the job input {path}: {e.strerror or e}{hint}") from None
        if expected is None or digest(text) == expected:
            break
        if time.monotonic() >= deadline:
            raise ValueError(f"the job input {path} is not the document this job was started "
                             f"for (sha256 {digest(text)[:12]}…, expected {expected[:12]}…) after "
                             f"{wait_s:.0f} s: its ConfigMap was not updated; the operator "
                             "rewrites it at its next reconcile")
        sleep(2.0)
    return parse_input(text, path)


def parse_input(text: str, where: str = "the job input") -> JobInput:
    """The job input in the document ``text`` (ValueError naming ``where`` and the problem)."""
    try:
        document = json.loads(text)
        tables = tuple(TableName(schema, name) for schema, name in document["tables"])
        resource = document["ingestion"]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where} is not a job document "
                         f'({{"ingestion": …, "tables": [["schema", "name"], …]}}): {e}') from None
    return JobInput(ingestion_from_document(resource), tables)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every Spark job takes (see :class:`Invocation`; ``lakeslot verify`` declares the
    same two itself, keeping the command line's start free of this module's imports)."""
    parser.add_argument("--input", metavar="FILE", help="the job document: "
                        '{"ingestion": <PostgresIngestion>, "tables": [["schema", "name"], …]}')
    parser.add_argument("--input-sha256", metavar="HEX",
                        help="wait until FILE is the document with this digest (a mounted Secret)")


def job_input(parser: argparse.ArgumentParser, args: argparse.Namespace) -> JobInput:
    """The job input the parsed ``args`` name (``parser.error`` — exit 2 — when it is bad)."""
    if args.input is None:
        parser.error("--input FILE is required")
    try:
        return read_input(args.input, args.input_sha256)
    except ValueError as e:
        parser.error(f"argument --input: {e}")
