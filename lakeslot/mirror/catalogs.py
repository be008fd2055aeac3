"""``sink.catalog`` translated for both readers of the mirror tables, side by side: Spark's
Iceberg ``SparkCatalog`` (the jobs) and pyiceberg (the operator, ``lakeslot status`` and
``lakeslot verify``, which read without a JVM).

Invariants:

- Both translations take the same spec and the same Secret-backed values (``secretProperties``,
  resolved by the caller: from the environment in jobs and local mode, from Kubernetes Secrets in
  the operator) and give the catalog the same properties.
- The warehouse's files are read with the ingestion's own storage settings. A job's Java
  ``S3FileIO`` takes what the catalog's properties leave unset from its pod's environment (the
  ingestion's ``secretEnv``); the operator's process has no such environment, so it passes the
  resolved ``secretEnv`` (``environ``) and :func:`pyiceberg_properties` turns its AWS variables
  into pyiceberg's ``s3.*`` FileIO properties — below the catalog's own properties and secrets,
  which win as they do in Java (:class:`lakeslot.filesystems.S3Access`). Nothing is read from or
  written into the operator's environment. A process that is the pod (``lakeslot run``, the
  verification Job) passes no ``environ``: its own environment's AWS variables become the same
  properties, since neither pyiceberg nor pyarrow takes ``AWS_ENDPOINT_URL`` from it.
- Secret values are never part of the static Spark conf (:func:`spark_conf`, which the operator
  writes into SparkApplications): a job's driver adds them (:func:`spark_secret_conf`) to its
  session's conf as it starts it, before the catalog's first use loads it.
- A hadoop catalog is read by pyiceberg from its metadata files (``version-hint.text`` names the
  current ``v<N>.metadata.json``): pyiceberg has no hadoop catalog, and cannot write one.
- A jdbc catalog (Iceberg's ``JdbcCatalog``) is read by pyiceberg's SQL catalog, which keeps the
  same ``iceberg_tables`` rows under the same catalog name (``sink.catalog.name``), on PostgreSQL
  only: ``sink.catalog.uri`` ``jdbc:postgresql://host[:port]/database[?…]`` becomes a SQLAlchemy
  URL (``postgresql+psycopg``) with ``jdbc.user``/``jdbc.password`` URL-encoded into it. Like the
  driver, a URL parameter wins over the ``jdbc.<name>`` property of the same name; those with a
  libpq counterpart (:data:`LIBPQ_PARAMETERS`; ``currentSchema``, where the catalog's tables are,
  as ``search_path``) are passed on, the others tune the Java driver alone. The password is in
  that URL only: SQLAlchemy masks it wherever it shows the URL, and libpq never repeats it. One
  SQL catalog (one connection pool, checked before use) per distinct translation and process.

Failure modes: :func:`load_table` returns None for a table that does not exist; a catalog or
warehouse that refuses or cannot be reached raises :class:`CatalogAccessError` naming the setting to
fix (REST: refused credentials, 401, 403, 404, no connection; JDBC: refused credentials, an
unreachable server or missing database, a URI that is not PostgreSQL's; the object store: refused
keys, a missing bucket, an unreachable endpoint), else the library's error; callers report it as a
condition. A SeaweedFS REST catalog answers an unknown warehouse like a missing table.
"""

from __future__ import annotations

import functools
import json
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import requests
import requests.adapters
from pyiceberg.catalog.noop import NoopCatalog
from pyiceberg.exceptions import (
    ForbiddenError,
    NoSuchTableError,
    OAuthError,
    RESTError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from pyiceberg.io import load_file_io
from pyiceberg.table import StaticTable, Table
from pyiceberg.table.metadata import TableMetadataUtil

from lakeslot.api.catalog_types import CATALOG_TYPES
from lakeslot.api.models import CatalogSpec
from lakeslot.filesystems import S3Access, explain

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

def on_network(catalog: CatalogSpec) -> bool:
    """Whether the tables are reached over a network: any catalog but a hadoop one on local
    disk."""
    return catalog.type != "hadoop" or not (catalog.warehouse or "").startswith(("file:", "/"))


def folding(catalog: CatalogSpec) -> str | None:
    """``catalog``'s type when its metastore stores table and column names case-insensitively
    (lower-cased): a table with columns that differ only in case cannot be mirrored there
    (preflight says so). None otherwise."""
    return catalog.type if CATALOG_TYPES[catalog.type].folds_case else None


def warehouse_uri(warehouse: str | Path) -> str:
    """A URI for the warehouse: URIs (``s3a://…``, ``file:/…``) unchanged, local paths made
    absolute ``file://`` URIs."""
    if isinstance(warehouse, str) and ":/" in warehouse:
        return warehouse
    return Path(warehouse).resolve().as_uri()


def hadoop_catalog(warehouse: str | Path, name: str = "lakeslot") -> CatalogSpec:
    return CatalogSpec(name=name, type="hadoop", warehouse=str(warehouse))


# Spark ---------------------------------------------------------------------------------------

# How long Spark's catalog holds a table object after its last use (Iceberg's default: 30 s). The
# apply job commits to and reads the mirrors it knows through the objects it holds
# (lakeslot.apply.table_pass, lakeslot.spark.tables): with passes of more than 30 s (1,000 tables
# on a network catalog) every table a pass did not change was dropped and loaded again by the next.
TABLE_CACHE_EXPIRY_MS = 600_000
TABLE_CACHE_EXPIRY_PROPERTY = "cache.expiration-interval-ms"  # (Iceberg's name for it)


def spark_conf(catalog: CatalogSpec) -> dict[str, str]:
    """``spark.sql.catalog.<name>.*`` for ``sink.catalog`` (without its Secret-backed properties;
    ``sink.catalog.properties`` override lakeslot's settings, :data:`TABLE_CACHE_EXPIRY_MS` too)."""
    prefix = f"spark.sql.catalog.{catalog.name}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog"}
    kind = CATALOG_TYPES[catalog.type]
    settings = {TABLE_CACHE_EXPIRY_PROPERTY: str(TABLE_CACHE_EXPIRY_MS), **kind.spark,
                **catalog.properties}
    if catalog.uri:
        settings["uri"] = catalog.uri
    if catalog.warehouse:
        settings["warehouse"] = warehouse_uri(catalog.warehouse) if kind.warehouse_path else catalog.warehouse
    conf.update({f"{prefix}.{key}": value for key, value in settings.items()})
    return conf


def spark_secret_conf(catalog: CatalogSpec, secrets: Mapping[str, str]) -> dict[str, str]:
    """The Secret-backed properties (``secrets``: key → value) as session conf."""
    return {f"spark.sql.catalog.{catalog.name}.{key}": value for key, value in secrets.items()}


# pyiceberg -----------------------------------------------------------------------------------

class CatalogAccessError(RuntimeError):
    """The catalog or the warehouse's storage refused or could not be reached; the message says
    which setting to fix."""


def pyiceberg_properties(catalog: CatalogSpec, secrets: Mapping[str, str],
                         environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``load_catalog`` options for ``sink.catalog`` (the FileIO properties of a hadoop one;
    pyiceberg's SQL catalog for a jdbc one); ``environ``: the ingestion's storage settings (see
    the module docstring), None: this process's environment."""
    storage = file_io_properties(os.environ if environ is None else environ)
    options = {**storage, **catalog.properties, **secrets}
    kind = CATALOG_TYPES[catalog.type].pyiceberg
    if kind is None:  # the table's files, read from the warehouse
        return options
    if kind == "sql":
        assert catalog.uri is not None  # the API requires it for jdbc catalogs
        jdbc = {k: v for k, v in options.items() if k.startswith(JDBC_PREFIX)}
        options = {k: v for k, v in options.items() if not k.startswith(JDBC_PREFIX)}
        options.update({SQL_CATALOG_OPTIONS[k]: v.lower() for k, v in jdbc.items() if k in SQL_CATALOG_OPTIONS})
        options.update(type="sql", uri=sql_catalog_uri(catalog.uri, jdbc), pool_pre_ping="true")
    else:
        options["type"] = kind
        if catalog.uri:
            options["uri"] = catalog.uri
    if catalog.warehouse:
        options["warehouse"] = catalog.warehouse
    return options


def file_io_properties(environ: Mapping[str, str]) -> dict[str, str]:
    """pyiceberg's S3 FileIO properties for what ``environ`` sets (AWS variables)."""
    access = S3Access.of(environ)
    properties = {"s3.access-key-id": access.access_key, "s3.secret-access-key": access.secret_key,
                  "s3.session-token": access.session_token, "s3.region": access.region,
                  "s3.endpoint": access.endpoint}
    return {key: value for key, value in properties.items() if value is not None}


JDBC_PREFIX = "jdbc."  # Iceberg's JdbcCatalog hands jdbc.<name> to the driver as property <name>
# Iceberg's own jdbc.* properties and pyiceberg's SQL catalog options of the same meaning (values
# lower-cased: Java's V0/V1 are pyiceberg's v0/v1); Iceberg's others mean nothing to pyiceberg.
SQL_CATALOG_OPTIONS = {"jdbc.init-catalog-tables": "init_catalog_tables", "jdbc.schema-version": "schema_version"}
ICEBERG_JDBC_PROPERTIES = (*SQL_CATALOG_OPTIONS, "jdbc.strict-mode")
# The PostgreSQL JDBC driver's connection properties that libpq has too, by their libpq names.
LIBPQ_PARAMETERS = {
    "sslmode": "sslmode", "sslrootcert": "sslrootcert", "sslcert": "sslcert", "sslkey": "sslkey",
    "sslpassword": "sslpassword", "gssEncMode": "gssencmode", "options": "options",
    "ApplicationName": "application_name", "connectTimeout": "connect_timeout",
}
JDBC_POSTGRESQL = "jdbc:postgresql://"


def sql_catalog_uri(jdbc_uri: str, properties: Mapping[str, str]) -> str:
    """The SQLAlchemy URL for pyiceberg's SQL catalog of the JDBC catalog at ``jdbc_uri``, with
    ``properties`` (``jdbc.*``: the driver's connection properties, credentials included)."""
    from sqlalchemy.engine import URL

    shown = jdbc_uri.split("?", 1)[0]  # (parameters may carry a password)
    if not jdbc_uri.startswith(JDBC_POSTGRESQL):
        raise CatalogAccessError(
            f"sink.catalog.uri {shown.split('//', 1)[0]}…: lakeslot reads a JDBC catalog on PostgreSQL "
            f"at {JDBC_POSTGRESQL}host[:port]/database[?…] only: fix sink.catalog.uri")
    parts = urllib.parse.urlsplit(jdbc_uri.removeprefix("jdbc:"))
    try:
        if "," in parts.netloc or not parts.hostname:
            raise ValueError("one host expected")
        port = parts.port
    except ValueError as e:
        raise CatalogAccessError(f"sink.catalog.uri {shown}: not {JDBC_POSTGRESQL}host[:port]/database "
                                 f"({e}): fix sink.catalog.uri") from None
    parameters = {k.removeprefix(JDBC_PREFIX): v for k, v in properties.items() if k not in ICEBERG_JDBC_PROPERTIES}
    parameters.update(urllib.parse.parse_qsl(parts.query))  # as the driver does: the URL's win
    query = {libpq: parameters[name] for name, libpq in LIBPQ_PARAMETERS.items() if name in parameters}
    if schema := parameters.get("currentSchema"):  # where the catalog's tables are
        escaped = schema.replace("\\", "\\\\").replace(" ", "\\ ")
        query["options"] = " ".join(filter(None, [query.get("options"), f"-c search_path={escaped}"]))
    url = URL.create("postgresql+psycopg", username=parameters.get("user"), password=parameters.get("password"),
                     host=parts.hostname, port=port, database=urllib.parse.unquote(parts.path.lstrip("/")) or None,
                     query=query)
    return url.render_as_string(hide_password=False)


@functools.lru_cache(maxsize=16)
def _sql_catalog(name: str, options: tuple[tuple[str, str], ...]) -> Catalog:
    """pyiceberg's SQL catalog, once per process for the same options: each holds a pool of
    connections to the catalog's database (its operator polls every table every few seconds).

    pyiceberg decides once, as it starts, which layout the catalog's tables have: it creates them
    (with the ``iceberg_type`` column) when they are absent, else probes for that column. When
    Iceberg's Java ``JdbcCatalog`` creates them (without it, its default layout) between
    pyiceberg's check and its own creation, pyiceberg would filter on a column that does not
    exist for as long as it is cached; so a new catalog's conclusion is checked once, and a
    wrong one is drawn again."""
    from pyiceberg.catalog import load_catalog
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    client = load_catalog(name, **dict(options))
    if getattr(client, "_schema_version", None) == "v1":
        try:
            with client.engine.connect() as connection:  # type: ignore[attr-defined]
                connection.execute(text("SELECT iceberg_type FROM iceberg_tables LIMIT 0"))
        except DBAPIError:
            client = load_catalog(name, **dict(options))
    return client


# Tables loaded at once by :func:`load_tables`: each load is one request (REST) or one or two file
# reads (hadoop) whose time is the round trip, so a status or a reconcile over 1,000 tables waits
# for about 1,000 / LOAD_WORKERS of them.
LOAD_WORKERS = 16


# A table's metadata as read (its JSON) → what of it to parse. pyiceberg parses a table's whole
# history: ≈ 45 µs a snapshot, 8.8 ms for a mirror aged a day (185 snapshots) against 0.4 ms for a
# fresh one, every few seconds for every table a status or a reconcile reads.
Trim = Callable[[dict[str, Any]], dict[str, Any]]


def load_table(catalog: CatalogSpec, ident: tuple[str, ...],
               secrets: Mapping[str, str] | None = None,
               environ: Mapping[str, str] | None = None) -> Table | None:
    """The current state of a mirror table, or None when it does not exist."""
    return load_tables(catalog, [ident], secrets, environ)[0]


def load_tables(catalog: CatalogSpec, idents: Sequence[tuple[str, ...]],
                secrets: Mapping[str, str] | None = None,
                environ: Mapping[str, str] | None = None,
                trim: Trim | None = None) -> list[Table | None]:
    """The current state of each of ``idents`` (None: it does not exist), in their order, through
    one catalog client, :data:`LOAD_WORKERS` at a time; the first failure is raised (explained as
    :func:`load_table`'s); ``environ``: as :func:`pyiceberg_properties`'s. With ``trim``, each
    table's metadata is what ``trim`` keeps of it (a hadoop or REST catalog; a jdbc one's is
    parsed whole): a table for the caller's reads of it only, not to be handed on."""
    options = pyiceberg_properties(catalog, secrets or {}, environ)
    kind = CATALOG_TYPES[catalog.type].pyiceberg
    try:
        if kind is None:
            assert catalog.warehouse is not None  # the API requires it for hadoop catalogs
            warehouse = catalog.warehouse

            def load(ident: tuple[str, ...]) -> Table | None:
                return load_hadoop_table(warehouse, ident, options, trim)
        else:
            if kind == "sql":
                client = _sql_catalog(catalog.name, tuple(sorted(options.items())))
            else:
                from pyiceberg.catalog import load_catalog

                client = load_catalog(catalog.name, **options)
                _pool_connections(client, LOAD_WORKERS)
                if trim is not None:
                    _trim_loads(client, trim)

            def load(ident: tuple[str, ...]) -> Table | None:
                try:
                    return client.load_table(ident)
                except NoSuchTableError:
                    return None
        if len(idents) <= 1:
            return [load(ident) for ident in idents]
        with ThreadPoolExecutor(min(LOAD_WORKERS, len(idents)), thread_name_prefix="catalog") as pool:
            return list(pool.map(load, idents))
    except NoSuchTableError:  # (a catalog may say so for an unknown warehouse: see the docstring)
        return [None] * len(idents)
    except Exception as e:  # re-raised, explained where a setting is to blame
        if (message := explain_error(catalog, e, environ)) is None:
            raise
        raise CatalogAccessError(message) from e


def _pool_connections(client: Catalog, size: int) -> None:
    """Keep ``size`` connections of a REST client open: its HTTP session keeps 10 per host, so
    :data:`LOAD_WORKERS` threads would reconnect (a round trip more each, and urllib3's "pool is
    full" warning all over the log). A signing adapter pyiceberg mounted for the catalog's own
    address stays: the longer prefix wins."""
    session = getattr(client, "_session", None)
    if isinstance(session, requests.Session):
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=size)
        for prefix in ("http://", "https://"):
            session.mount(prefix, adapter)


def _trim_loads(client: Catalog, trim: Trim) -> None:
    """Have a REST client's table loads answered with the metadata ``trim`` keeps: a hook of its
    HTTP session (the public ``requests`` API: pyiceberg's own parsing and error handling stay as
    they are) rewrites each successful ``GET …/namespaces/{ns}/tables/{table}`` answer's
    ``metadata`` before pyiceberg parses it."""
    session = getattr(client, "_session", None)
    if not isinstance(session, requests.Session):
        return

    def trimmed(response: requests.Response, *_args: Any, **_kwargs: Any) -> requests.Response:
        if (response.status_code == 200 and response.request.method == "GET"
                and _TABLE_PATH.search(urllib.parse.urlsplit(response.url).path)):
            answer = response.json()
            if isinstance(answer.get("metadata"), dict):
                answer["metadata"] = trim(answer["metadata"])
                response._content = json.dumps(answer).encode()  # (what .text and .json() read)
        return response

    session.hooks["response"].append(trimmed)


_TABLE_PATH = re.compile(r"/namespaces/[^/]+/tables/[^/]+$")


def explain_error(catalog: CatalogSpec, error: BaseException,
                  environ: Mapping[str, str] | None = None) -> str | None:
    """What a failure to read ``catalog`` (with the storage settings ``environ``) means and which
    setting fixes it, or None."""
    uri, secret_keys = catalog.uri, ", ".join(sorted(catalog.secret_properties)) or "none set"
    kind = CATALOG_TYPES[catalog.type].pyiceberg
    if kind == "sql" and isinstance(cause := getattr(error, "orig", None), psycopg.OperationalError):
        return _explain_jdbc(catalog, cause)
    credentials = f"sink.catalog.secretProperties ({secret_keys}: credential, token)"
    if isinstance(error, OAuthError):
        return (f"the catalog at {uri} refused the OAuth2 client credentials ({error}): fix the "
                f"credential (client id:secret) in {credentials}")
    if isinstance(error, UnauthorizedError):
        return (f"the catalog at {uri} answered 401 Unauthorized ({error}): set a valid credential or "
                f"token in {credentials}")
    if isinstance(error, ForbiddenError):
        return (f"the catalog at {uri} answered 403 Forbidden ({error}): grant the principal of "
                f"{credentials} access to warehouse {catalog.warehouse!r}, or fix the credential")
    if isinstance(error, RESTError) and ("NotFound" in str(error) or "404" in str(error)):
        return (f"sink.catalog.uri {uri} answered 404 ({error}): it is not an Iceberg REST catalog's "
                "base URI (the path before /v1/…); fix sink.catalog.uri")
    if isinstance(error, ServiceUnavailableError) or type(error).__name__ in ("ConnectionError", "ConnectTimeout"):
        return f"sink.catalog.uri {uri} cannot be reached ({type(error).__name__}): fix sink.catalog.uri"
    if isinstance(error, OSError):
        return explain(catalog.warehouse or "", error,
                       "sink.catalog.warehouse" if kind is None else
                       "the warehouse's object store (sink.catalog.properties s3.*, secretProperties, "
                       "spec.secretEnv)", environ)
    return None


# what PostgreSQL (or libpq) says when it refuses the user or the password
REFUSED_CREDENTIALS = re.compile(r"authentication failed|no pg_hba\.conf entry|role \".*\" does not exist")


def _explain_jdbc(catalog: CatalogSpec, error: psycopg.OperationalError) -> str:
    """A connection to a JDBC catalog's database that failed: the server's or libpq's words
    (never the password: libpq does not repeat it) and the setting to fix."""
    where = (catalog.uri or "").split("?", 1)[0]
    said = " ".join(str(error).split())
    if REFUSED_CREDENTIALS.search(said):
        return (f"the JDBC catalog's database at {where} refused the credentials ({said}): fix jdbc.user "
                f"(sink.catalog.properties) or jdbc.password (sink.catalog.secretProperties)")
    return (f"the JDBC catalog's database at {where} cannot be reached or refused the connection ({said}): "
            "fix sink.catalog.uri (host, port, database, parameters)")


def load_hadoop_table(warehouse: str, ident: tuple[str, ...],
                      properties: Mapping[str, str] | None = None,
                      trim: Trim | None = None) -> Table | None:
    """The current state of a hadoop-catalog table, or None when it does not exist (with
    ``trim``: its metadata as ``trim`` keeps it, see :func:`load_tables`)."""
    location = "/".join([warehouse.rstrip("/"), *ident])
    io = load_file_io(dict(properties or {}), location)
    hint = io.new_input(f"{location}/metadata/version-hint.text")
    if not hint.exists():
        return None
    with hint.open() as f:
        version = int(f.read().decode().strip())
    path = f"{location}/metadata/v{version}.metadata.json"
    if trim is None:
        return StaticTable.from_metadata(path, dict(properties or {}))
    with io.new_input(path).open() as f:
        metadata = TableMetadataUtil.parse_obj(trim(json.loads(f.read())))
    return StaticTable(identifier=("static-table", path), metadata_location=path,
                       metadata=metadata, io=io, catalog=NoopCatalog("static-table"))
