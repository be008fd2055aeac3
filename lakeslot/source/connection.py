"""Connections to the source database.

Invariants:

- The password is held only in :class:`ConnectionSettings` (never in its ``repr``) and handed
  to libpq as a keyword; it never appears in a conninfo string we log, in argv, or in errors we
  raise.
- Every session says who it is through ``application_name``: ``lakeslot-<component>`` plus the
  ingestion and, for the reader, its pod. That string is the identity the slot's stale-holder
  eviction compares against, so it must be deterministic and unique per holder. PostgreSQL keeps
  only 63 bytes of printable ASCII: longer identities end in a stable hash instead of being cut.
- A host list (``spec.source.host`` ``a,b``: a primary and its standbys on one port) reaches
  only a server that accepts writes (``target_session_attrs=read-write`` unless the options set
  ``primary``): after a failover every new session, the replication stream included, goes to the
  promoted standby; libpq tries the hosts in order.
- Sessions are in UTC with ISO dates, so the text form of every value is the same on every
  connection (snapshot COPY and pgoutput alike).
- Sessions that run long operations (slot creation waits for running transactions, COPY of a
  large table, the replication stream) disable ``statement_timeout``,
  ``idle_in_transaction_session_timeout`` and ``lock_timeout``; others keep the server's.

Failure modes: wrong host/credentials/TLS raise :class:`psycopg.OperationalError` whose message
comes from libpq (it names the user and host, never the password).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import psycopg
from psycopg import sql

if TYPE_CHECKING:  # the reader imports this module: keep pydantic models out of its start-up
    from lakeslot.api.models import SourceSpec

_Row = TypeVar("_Row")

APPLICATION_NAME_BYTES = 63
# The environment variable that carries the source password to every process (never argv).
PASSWORD_ENV = "LAKESLOT_SOURCE_PASSWORD"
SESSION_OPTIONS = ("-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres"
                   " -c extra_float_digits=3 -c bytea_output=hex")
LONG_RUNNING_OPTIONS = (" -c statement_timeout=0 -c idle_in_transaction_session_timeout=0"
                        " -c lock_timeout=0")


@dataclass(frozen=True)
class ConnectionSettings:
    """Where and as whom to connect, with the secret already resolved."""

    host: str
    port: int
    dbname: str
    user: str
    password: str | None = field(default=None, repr=False)
    sslmode: str = "prefer"
    sslrootcert: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def params(self) -> dict[str, str]:
        """libpq parameters without the password (safe to log). A host list (``a,b``) gets
        ``target_session_attrs=read-write`` unless ``extra`` sets it: only the primary will do."""
        ha = {"target_session_attrs": "read-write"} if "," in self.host else {}
        params = {"host": self.host, "port": str(self.port), "dbname": self.dbname,
                  "user": self.user, "sslmode": self.sslmode, **ha, **self.extra}
        if self.sslrootcert:
            params["sslrootcert"] = self.sslrootcert
        return params


def settings_from_spec(source: SourceSpec, *, password: str | None,
                       ca_file: str | None = None) -> ConnectionSettings:
    """Settings for ``spec.source`` once its secrets are resolved by the caller (the operator
    reads Secrets through the API, pods get them as environment variables and files, local
    mode from the environment). ``ca_file`` is where the CA from ``caSecretRef`` was written."""
    if source.ca_secret_ref is not None and ca_file is None:
        raise ValueError("source.caSecretRef is set: the CA must be written to a file first")
    return ConnectionSettings(host=source.host, port=source.port, dbname=source.database,
                              user=source.user, password=password, sslmode=source.ssl_mode,
                              sslrootcert=ca_file, extra=dict(source.options))


def application_name(component: str, ingestion: str, pod: str | None = None) -> str:
    """``lakeslot-<component> <ingestion>[ <pod>]``, at most 63 ASCII bytes, deterministic."""
    name = " ".join(p for p in (f"lakeslot-{component}", ingestion, pod) if p)
    name = name.encode("ascii", "replace").decode()
    if len(name) <= APPLICATION_NAME_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[:APPLICATION_NAME_BYTES - 11]}~{digest}"


def connect(settings: ConnectionSettings, app_name: str, *, long_running: bool = False,
            replication: bool = False, autocommit: bool = True) -> psycopg.Connection:
    """A session as ``app_name``. ``replication=True`` opens a logical replication connection
    (simple query protocol only, hence no prepared statements, always autocommit)."""
    params = settings.params()
    params["application_name"] = app_name
    params["options"] = SESSION_OPTIONS + (LONG_RUNNING_OPTIONS if long_running else "")
    kwargs: dict = {"autocommit": autocommit or replication}
    if replication:
        params["replication"] = "database"
        kwargs["prepare_threshold"] = None
    return psycopg.connect(psycopg.conninfo.make_conninfo(**params), password=settings.password,
                           **kwargs)


def render_sql(conn: psycopg.Connection, template: str, *args: sql.Composable,
               **kwargs: sql.Composable) -> str:
    """SQL text for a message (a fix to paste into psql), with identifiers quoted by psycopg."""
    return sql.SQL(template).format(*args, **kwargs).as_string(conn)


def one_row(cursor: psycopg.Cursor[_Row]) -> _Row:
    """The row of a query that always returns exactly one (an aggregate, a function call, a
    catalog lookup by a key known to exist). No row there is a bug in the query, not a state of
    the database, hence :class:`psycopg.ProgrammingError` rather than ``None``."""
    row = cursor.fetchone()
    if row is None:
        raise psycopg.ProgrammingError("the query returned no row where it always returns one")
    return row
