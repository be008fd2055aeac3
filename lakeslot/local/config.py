"""What a local run needs before it touches anything: the ingestion, its secrets, its state.

Invariants:

- The ingestion file is validated exactly like ``lakeslot validate`` (same messages); a file
  must hold exactly one PostgresIngestion (other kinds, e.g. a Secret, are skipped).
- Secrets never come from the command line. In local mode each Secret *reference* of the spec
  maps to an environment variable (from the process environment, else from ``--env-file``; the
  process environment wins):

  =================================  =====================================================
  spec field                         local mode
  =================================  =====================================================
  ``source.passwordSecretRef``       ``LAKESLOT_SOURCE_PASSWORD`` (the password itself)
  ``source.caSecretRef``             ``LAKESLOT_SOURCE_CA_FILE`` (path of the PEM CA file)
  ``sink.catalog.secretProperties``  ``LAKESLOT_CATALOG_<KEY>`` (``jdbc.password`` →
                                     ``LAKESLOT_CATALOG_JDBC_PASSWORD``)
  =================================  =====================================================

  These are the same variables the operator sets in its pods (:mod:`lakeslot.workloads`), so
  the reader and the Spark jobs read them unchanged. Values are never printed: errors name the
  variable, never its content.
- State that is not data (the reader's status file, the snapshot's progress, logs, the run
  lock) lives in a state directory per ingestion (``--state-dir``, default
  ``$XDG_STATE_HOME/lakeslot/<namespace>/<name>``, i.e. ``~/.local/state/...``). The data itself
  is only in staging and in Iceberg, so deleting the state directory loses nothing.

Failure modes: every problem is a :class:`ConfigError` whose message says what is wrong and how
to fix it; nothing has been started or changed when it is raised.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lakeslot import workloads
from lakeslot.api import validation
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import IngestionNames, TableName

_ENV_LINE = re.compile(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)")


class ConfigError(Exception):
    """The local run cannot start; the message says what to fix."""


def load_ingestion(path: str) -> PostgresIngestion:
    """The one PostgresIngestion of the YAML file at ``path`` (``-``: stdin is not accepted,
    the file is read again by ``lakeslot status``)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    reports = validation.validate_text(text)
    resources = [r.resource for r in reports if r.resource is not None]
    if not validation.all_valid(reports):
        raise ConfigError(validation.render(path, reports)
                          + f"\n(check it with: lakeslot validate -f {path})")
    if len(resources) != 1:
        raise ConfigError(f"{path}: holds {len(resources)} PostgresIngestions; a local run takes "
                          "exactly one: put each in its own file")
    return resources[0]


def read_env_file(path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (``export`` allowed, ``#`` comments, blank lines, values optionally
    in single or double quotes taken literally)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"--env-file {path}: cannot read: {e.strerror}") from None
    values = {}
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _ENV_LINE.fullmatch(stripped)
        if match is None:
            raise ConfigError(f"--env-file {path}, line {number}: not KEY=VALUE (the line is not "
                              "shown: it may hold a secret); write it as NAME=value")
        key, value = match.groups()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def environment(ingestion: PostgresIngestion, env_file: str | None,
                environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the run (the process environment over the env file), checked to hold
    every secret the spec references."""
    environ = os.environ if environ is None else environ
    merged = {**(read_env_file(env_file) if env_file else {}), **environ}
    source = ingestion.spec.source
    missing = []
    if source.password_secret_ref is not None and not merged.get(workloads.PASSWORD_ENV):
        missing.append(f"{workloads.PASSWORD_ENV} (the password of user {source.user!r}, for "
                       "source.passwordSecretRef)")
    if source.ca_secret_ref is not None:
        ca_file = merged.get(workloads.CA_FILE_ENV)
        if not ca_file:
            missing.append(f"{workloads.CA_FILE_ENV} (path of the CA certificate file, for "
                           "source.caSecretRef)")
        elif not os.access(ca_file, os.R_OK):
            raise ConfigError(f"{workloads.CA_FILE_ENV} names {ca_file}, which cannot be read: "
                              "point it at the PEM file of the CA that signed the server's "
                              "certificate")
    missing += [f"{workloads.catalog_secret_env(key)} (sink.catalog.secretProperties.{key})"
                for key in ingestion.spec.sink.catalog.secret_properties
                if workloads.catalog_secret_env(key) not in merged]
    missing += [f"{env.name} (spec.secretEnv)" for env in ingestion.spec.secret_env
                if env.name not in merged]
    if missing:
        raise ConfigError("local mode reads secrets from the environment (or --env-file), never "
                          "from the command line; not set: " + "; ".join(missing))
    return merged


@dataclass(frozen=True)
class Local:
    """One ingestion as a local run sees it."""

    ingestion: PostgresIngestion
    environ: dict[str, str]
    state_dir: Path

    @property
    def job(self) -> workloads.JobInput:
        """The ingestion with no tables yet (names: slot, publication, owner, targets)."""
        return workloads.JobInput(self.ingestion, ())

    def with_tables(self, tables: list[TableName]) -> workloads.JobInput:
        return workloads.JobInput(self.ingestion, tuple(tables))

    def path(self, name: str) -> Path:
        return self.state_dir / name


def default_state_dir(ingestion: PostgresIngestion, environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    names = IngestionNames.of(ingestion)
    return Path(base) / "lakeslot" / names.namespace / names.name


def load(path: str, *, env_file: str | None = None, state_dir: str | None = None,
         environ: Mapping[str, str] | None = None) -> Local:
    ingestion = load_ingestion(path)
    merged = environment(ingestion, env_file, environ)
    directory = Path(state_dir) if state_dir else default_state_dir(ingestion, merged)
    return Local(ingestion, merged, directory)
