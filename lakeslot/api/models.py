"""The PostgresIngestion API (``lakeslot.io/v1alpha1``): the single source of truth.

Field names, types, constraints, enums, defaults, descriptions and validation rules live here and
only here; the CRD (``lakeslot.api.crd``), the reference page (docs/reference.md) and the offline validator are
derived from these classes. Python uses snake_case, documents use camelCase (aliases).

Invariants:

- every field has a description (the CRD generator refuses a field without one);
- a section with defaults (``snapshot``, ``spark``, ...) has no required field, so the CRD can
  default it to ``{}`` and Kubernetes fills in the same defaults pydantic does;
- credentials are only ever references to Secrets (:class:`SecretKeyRef`), never values;
- cross-field and immutability constraints are :class:`~lakeslot.api.rules.Rule` rows in the
  ``rules`` attribute of the class they constrain, enforced by both Kubernetes and pydantic;
- names computed by the operator (publication and slot defaults, see ``lakeslot.api.naming``) are
  not CRD defaults: the spec field stays empty and the status reports the effective name.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

from lakeslot import cadence
from lakeslot.api import catalog_types, cluster
from lakeslot.api.catalog_types import cel_type_in, listed
from lakeslot.api.partitioning import PartitionField, PartitionSpecError, parse_all
from lakeslot.api.rules import ApiModel, ListKeys, Rule, violations_error
from lakeslot.api.types import (
    Identifier,
    KubeLabel,
    KubeName,
    KubeTime,
    Lsn,
    Quantity,
    SecretKey,
    SlotName,
    SparkMemory,
)

GROUP = "lakeslot.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PostgresIngestion"
PLURAL = "postgresingestions"
SINGULAR = "postgresingestion"
SHORT_NAMES = ("pgi",)
CATEGORIES = ("lakeslot",)

MiB = 1 << 20
KiB = 1 << 10
# The largest spec (metadata and spec as compact JSON) lakeslot accepts. The API server stores an
# object of at most 1.5 MiB (etcd's default request limit) and the operator keeps a copy of the
# spec in the status (lastHandledConfiguration, kopf's) next to a row per table: half a MiB for the
# spec leaves the rest room. 1,000 listed tables with 63-byte names take about 150 KiB.
SPEC_MAX_BYTES = 512 * KiB
SPEC_SIZE_FIX = ("select whole schemas (spec.source.schemas) instead of listing every table, and "
                 "list a table only where it needs options of its own")


def section(model: type[ApiModel], description: str) -> Any:
    """A nested object that may be omitted: pydantic and the CRD (``default: {}``) fill it in."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


def optional(description: str, **constraints: Any) -> Any:
    """An optional field: absent (``None`` in Python) unless the document sets it."""
    return Field(None, description=description, **constraints)


def listing(description: str, **constraints: Any) -> Any:
    """A list or map field that may be omitted; absent means empty (no CRD default is stored)."""
    return Field(default_factory=list, description=description, **constraints)


def mapping(description: str) -> Any:
    return Field(default_factory=dict, description=description)


StringMap = dict[str, str]


# --------------------------------------------------------------------------------------- spec


class SecretKeyRef(ApiModel):
    """A key of a Secret in the PostgresIngestion's namespace (like a container's secretKeyRef)."""

    name: KubeName = Field(description="Name of the Secret, in the namespace of the PostgresIngestion.")
    key: SecretKey = Field(description="Key within the Secret whose value is used.")


class SecretEnvVar(ApiModel):
    """An environment variable of the reader and the Spark jobs whose value comes from a Secret."""

    name: Annotated[str, StringConstraints(max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = Field(
        description="Name of the variable, for example AWS_ACCESS_KEY_ID."
    )
    secret_key_ref: SecretKeyRef = Field(description="The Secret key holding its value.")

    rules = (
        Rule(
            cel="!self.name.startsWith('LAKESLOT_') && self.name != 'POD_NAME'",
            message="the name is reserved by lakeslot",
            fix="use another name; the source password and CA are set with source.passwordSecretRef "
            "and source.caSecretRef",
            check=lambda env: not env.name.startswith("LAKESLOT_") and env.name != "POD_NAME",
            field_path=".name",
        ),
    )


def _partition_fields(entries: list[str]) -> list[str]:
    """Refuses a partitionBy that does not parse, with the parser's message."""
    try:
        parse_all(entries)
    except PartitionSpecError as e:
        raise PydanticCustomError("partition_by", "{reason}", {"reason": str(e)}) from None
    return entries


MirrorName = Annotated[str, StringConstraints(max_length=255, pattern=r"^[a-z_][a-z0-9_]*$")]


class TableSpec(ApiModel):
    """One source table, named by schema and table exactly as PostgreSQL stores them."""

    schema_name: Identifier = Field(
        "public",
        alias="schema",
        description="Schema of the table, unquoted and case-sensitive as stored by PostgreSQL "
        "(`Sales` and `sales` are different schemas).",
    )
    name: Identifier = Field(
        description="Name of the table, unquoted and case-sensitive as stored by PostgreSQL; any "
        "identifier is allowed (spaces, quotes, upper case, non-ASCII), at most 63 bytes."
    )
    key_columns: Annotated[list[Identifier], ListKeys(), Field(max_length=32)] = listing(
        "Columns that identify a row, for a table without a primary key. Empty: the table's "
        "replica identity (its primary key). These columns require REPLICA IDENTITY FULL on the "
        "table (otherwise updates and deletes would not carry them); preflight checks it."
    )
    exclude_columns: Annotated[list[Identifier], ListKeys(), Field(max_length=100)] = listing(
        "Columns left out of the Iceberg table (for example large or sensitive ones). Key "
        "columns cannot be excluded (checked at preflight, where the columns are known)."
    )
    text_columns: Annotated[list[Identifier], ListKeys(), Field(max_length=100)] = listing(
        "Columns kept as PostgreSQL's text form (an Iceberg string column) instead of their mapped "
        "type: the way out for values the type mapping cannot hold (infinite timestamps, NaN or "
        "infinite numerics, years outside 1-9999). Changing "
        "this list of an existing table takes effect at its next re-snapshot; a column also in "
        "excludeColumns is excluded."
    )
    partition_by: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=200)]],
        AfterValidator(_partition_fields),
        Field(max_length=16),
    ] = listing(
        "Partition spec of the mirror table, one Iceberg transform per entry, in order: a column "
        "(identity), bucket(N, column), truncate(W, column), years(column), months(column), "
        "days(column) or hours(column), e.g. [\"bucket(16, id)\", \"days(created_at)\"]. A column "
        "is written as PostgreSQL stores it, in double quotes when it has spaces or punctuation "
        "(days(\"Created At\")). Preflight checks each column exists and suits its transform "
        "(years/months/days: date or timestamp[tz]; hours: timestamp[tz]; truncate: integer, "
        "numeric, text, bytea; bucket: not boolean, floating point or arrays); a bad entry fails "
        "the table with the reason, as does a listed column later renamed or dropped at the "
        "source, until partitionBy is fixed. Changing it for an existing mirror evolves the "
        "mirror's partition spec in place at the next apply pass (files already written keep "
        "their layout until rewritten or re-snapshotted). Empty: a table lakeslot creates or "
        "re-snapshots is unpartitioned, and emptying a list lakeslot applied makes later writes "
        "unpartitioned. See Partitioned mirrors."
    )
    mirror_name: MirrorName | None = optional(
        "Name of this table's mirror inside sink.namespace, instead of the one "
        "sink.tableNameTemplate gives (lower-case letters, digits and _, starting with a letter or "
        "_). The way out when two tables would map to one mirror name, or to keep a mirror's "
        "existing name. Changing it for a mirrored table starts a new mirror (copied afresh); the "
        "old one is kept, never deleted by lakeslot."
    )
    resnapshot_generation: int = Field(
        0,
        ge=0,
        description="Increase this counter to request a new snapshot of this table alone (online: "
        "the other tables keep streaming, and the mirror is replaced in one commit). The operator "
        "records the value it acted on in status.tables[].observedResnapshotGeneration.",
    )


    def partition_fields(self) -> tuple[PartitionField, ...]:
        """``partitionBy`` parsed (valid: the model checked it)."""
        return parse_all(self.partition_by)


SslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]
VERIFYING_SSL_MODES = ("verify-ca", "verify-full")
# libpq target_session_attrs that reach only a primary (a host list needs one of them).
HA_SESSION_ATTRS = ("read-write", "primary")
RESERVED_OPTIONS = (
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "sslmode",
    "sslrootcert",
    "replication",
)

reserved_options = Rule(
    cel=" && ".join(f"!('{key}' in self)" for key in RESERVED_OPTIONS),
    message="options set a connection parameter that has its own field",
    fix=f"remove {', '.join(RESERVED_OPTIONS)} from options and use host, port, database, user, "
    "passwordSecretRef, sslMode and caSecretRef",
    check=lambda options: not set(options) & set(RESERVED_OPTIONS),
)


def _unchanged_once_set(field: str, attribute: str) -> Rule:
    return Rule(
        cel=f"!has(oldSelf.{field}) || (has(self.{field}) && self.{field} == oldSelf.{field})",
        message=f"{field} cannot be changed or removed once set",
        fix=f"restore the previous {field}; to move to a new one, create a new PostgresIngestion",
        check=lambda new, old: getattr(old, attribute) is None or getattr(new, attribute) == getattr(old, attribute),
        field_path=f".{field}",
    )


class SourceSpec(ApiModel):
    """The PostgreSQL database to read, how to connect, and what to replicate."""

    host: Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^\S+$")] = Field(
        description="Host name or IP address of the PostgreSQL server (the primary: logical "
        "replication slots live on the primary before PostgreSQL 17), or a comma-separated libpq "
        "host list of a primary and its standbys, all on `port` (e.g. pg-a,pg-b): every "
        "connection then goes to the one that accepts writes (target_session_attrs=read-write "
        "unless options set read-write or primary), so lakeslot follows a failover."
    )
    port: int = Field(5432, ge=1, le=65535, description="TCP port of the PostgreSQL server.")
    database: Identifier = Field(description="Database to replicate. Immutable: the slot and publication belong to it.")
    user: Identifier = Field(
        description="Role to connect as; it needs the REPLICATION attribute (or rds_replication) "
        "and SELECT on the mirrored columns of the tables; to manage the publication also CREATE "
        "on the database (unless the publication exists) and ownership of the tables (see "
        "publicationManagement and the Managed PostgreSQL page)."
    )
    password_secret_ref: SecretKeyRef | None = optional(
        "Secret key holding the password of `user`. Omit for password-less authentication "
        "(trust, peer or certificate)."
    )
    ssl_mode: SslMode = Field(
        "prefer",
        description="libpq sslmode: disable, allow, prefer, require, verify-ca (check the server "
        "certificate against caSecretRef) or verify-full (also check the host name).",
    )
    ca_secret_ref: SecretKeyRef | None = optional(
        "Secret key holding the PEM CA certificate(s) that sign the server certificate (libpq "
        "sslrootcert). Required by verify-ca and verify-full."
    )
    options: Annotated[StringMap, reserved_options] = mapping(
        "Extra libpq connection parameters, such as connect_timeout or application_name. "
        "Parameters that have their own field (host, port, dbname, user, password, sslmode, ...) "
        "are rejected."
    )
    publication_name: Identifier | None = optional(
        "Publication to use; created with the selected tables when missing, unless "
        "publicationManagement is External (then a DBA creates it). Default: derived from "
        "namespace and name (see Names). The effective name is reported in "
        "status.publicationName. Cannot be changed or removed once set."
    )
    publication_management: Literal["Auto", "Lakeslot", "External"] = Field(
        "Auto",
        description="Who manages the publication. Lakeslot: lakeslot creates it when missing and "
        "keeps its table list equal to the selection (needs CREATE on the database and ownership "
        "of the tables). External: a DBA or the tables' owner created it; lakeslot only verifies "
        "it (publishes insert, update, delete and truncate, holds every selected table with the "
        "key and every mirrored column, publish_via_partition_root for partitioned tables), never "
        "creates, alters or drops it, and a table it lacks is Failed alone with the ALTER "
        "PUBLICATION to run (picked up once run). Auto: Lakeslot when the publication is missing or "
        "lakeslot created it, else External. status.publicationManagedBy reports which applies.",
    )
    slot_name: SlotName | None = optional(
        "Permanent logical replication slot (lower-case letters, digits and underscore, at most "
        "63 bytes). Default: derived from namespace and name (see Names). The effective name is "
        "reported in status.slot.name. Cannot be changed or removed once set."
    )
    failover_slot: bool = Field(
        False,
        description="Create the slot as a failover slot (PostgreSQL 17+), which standbys running "
        "with sync_replication_slots = on synchronize, so that it survives a promotion; list the "
        "standbys' physical slots in the primary's synchronized_standby_slots. Point host at the "
        "HA endpoint (a Service, or a host list: see host). status.slot.failoverSafe and the "
        "SlotReady message say whether a failover keeps the slot. Takes effect when the slot is "
        "created: an existing slot without failover is reported (SlotUnusable) until dropped.",
    )
    ddl_capture: Literal["Auto", "EventTrigger", "Catalog"] = Field(
        "Auto",
        description="How schema changes are seen. EventTrigger: lakeslot's event trigger writes "
        "each DDL into the WAL as a transactional logical message, at its exact place among the "
        "row changes, so renames, added columns and widened types are applied in place (needs a "
        "role that may create event triggers, a superuser, once per database; lakeslot "
        "ddl-capture-sql prints the statements for a DBA). Catalog: the catalog is compared with "
        "what the mirror recorded on every apply pass; renames and rewrites then re-snapshot the "
        "table. Auto: EventTrigger where the role may install it, else Catalog; "
        "status.ddlCapture reports the mode in force.",
    )
    tables: Annotated[list[TableSpec], ListKeys(("schema", "name")), Field(max_length=1000)] = listing(
        "Tables to replicate, each at most once. An entry here also sets per-table options for a "
        "table that `schemas` selects."
    )
    schemas: Annotated[list[Identifier], ListKeys(), Field(max_length=100)] = listing(
        "Whole schemas to replicate: every table in them, including tables created later. "
        "Resolved to an explicit table list on every reconcile (lakeslot run: at start, then "
        "whenever one catalog query every 10 s sees the tables or their replica identities "
        "change); a new table joins the publication and is copied alone, online, from a snapshot "
        "taken after it joined, while the others keep streaming. A new table without a usable "
        "replica identity is reported (Failed) instead of breaking the application's UPDATE and "
        "DELETE; a dropped one becomes Removed, its mirror kept."
    )

    rules = (
        Rule(
            cel="(has(self.tables) && size(self.tables) > 0) || (has(self.schemas) && size(self.schemas) > 0)",
            message="no tables selected",
            fix="list tables in source.tables or whole schemas in source.schemas",
            check=lambda source: bool(source.tables or source.schemas),
            field_path=".tables",
        ),
        Rule(
            cel="!self.host.matches(',') || !has(self.options) || "
            "!('target_session_attrs' in self.options) || "
            "self.options['target_session_attrs'] in ['read-write', 'primary']",
            message="a host list must lead every connection to the primary",
            fix="remove target_session_attrs from options (lakeslot sets read-write for a host "
            "list) or set it to read-write or primary",
            check=lambda source: "," not in source.host
            or source.options.get("target_session_attrs", "read-write") in HA_SESSION_ATTRS,
            field_path=".options",
        ),
        Rule(
            cel="!has(self.sslMode) || !(self.sslMode in ['verify-ca', 'verify-full']) || has(self.caSecretRef)",
            message="sslMode verify-ca and verify-full need the CA certificate",
            fix="set caSecretRef to the Secret key holding the CA certificate, or use sslMode require",
            check=lambda source: source.ssl_mode not in VERIFYING_SSL_MODES or source.ca_secret_ref is not None,
            field_path=".caSecretRef",
        ),
        Rule(
            cel="!has(self.caSecretRef) || !has(self.sslMode) || self.sslMode != 'disable'",
            message="caSecretRef is set but sslMode is disable",
            fix="use sslMode verify-full (or verify-ca) with the CA, or remove caSecretRef",
            check=lambda source: source.ca_secret_ref is None or source.ssl_mode != "disable",
            field_path=".sslMode",
        ),
        cluster.ca_secret_volume_name,
        Rule(
            cel="self.database == oldSelf.database",
            message="database cannot be changed",
            fix="restore the previous database; to replicate another database, create a new PostgresIngestion",
            check=lambda new, old: new.database == old.database,
            field_path=".database",
        ),
        _unchanged_once_set("publicationName", "publication_name"),
        _unchanged_once_set("slotName", "slot_name"),
    )


CatalogType = Literal["hadoop", "rest", "jdbc", "glue", "hive"]  # = catalog_types.CATALOG_TYPES
_WAREHOUSE, _URI = catalog_types.needing("needs_warehouse"), catalog_types.needing("needs_uri")
_RENAMING = catalog_types.needing("renames_metadata")
# Object-store URIs (S3 and its Hadoop names, GCS, ADLS/Azure Blob, OSS, COS), case-insensitively:
CATALOG_SECRET_ENV_PREFIX = "LAKESLOT_CATALOG_"
# A catalog property key that looks like a credential (case-insensitive; one expression for CEL's
# RE2 and Python): it belongs in secretProperties, not in the resource for anyone to read.
CREDENTIAL_KEY = r"(?i)(secret|password)|(credential|token)$"
CATALOG_PROPERTIES_MAX = 256


def catalog_secret_env(key: str) -> str:
    """The environment variable carrying the Secret-backed catalog property ``key`` (in the Spark
    pods and the verification Job; keys that differ only in case or punctuation would share one,
    which :func:`_one_variable_per_key` refuses)."""
    return CATALOG_SECRET_ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", key.upper())


def _one_variable_per_key(properties: dict[str, SecretKeyRef]) -> dict[str, SecretKeyRef]:
    """Refuses secretProperties keys that share an environment variable. Checked offline and by
    the operator (InvalidSpec), not by the API server: comparing every pair of keys in CEL costs
    more than its budget for a map of unbounded keys."""
    keys: dict[str, list[str]] = {}
    for key in properties:
        keys.setdefault(catalog_secret_env(key), []).append(key)
    clashes = [(variable, sorted(names)) for variable, names in sorted(keys.items()) if len(names) > 1]
    if clashes:
        raise violations_error("secretProperties", properties, [((), (
            "keys that differ only in case or punctuation would share one environment variable: "
            + "; ".join(f"{', '.join(names)} → {variable}" for variable, names in clashes)),
            "keep one key of each (catalog property keys are case-sensitive: use the one the "
            "catalog reads)")])
    return properties


credential_properties = Rule(
    cel=f"self.all(k, !k.matches('{CREDENTIAL_KEY}'))",
    message="a key that looks like a credential (credential, token, *secret*, *password*) is in "
    "properties, where anyone who can read the resource sees its value",
    fix="put its value in a Secret and reference it under sink.catalog.secretProperties "
    "(key: {name: <Secret>, key: <key in it>}) instead",
    check=lambda properties: not any(re.search(CREDENTIAL_KEY, key) for key in properties),
)


# where a hadoop catalog is refused. One expression for CEL (RE2) and Python.
OBJECT_STORE_URI = r"(?i)^(s3|s3a|s3n|gs|abfs|abfss|wasb|wasbs|oss|cosn)://"
SparkName = Annotated[str, StringConstraints(max_length=63, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class CatalogSpec(ApiModel):
    """The Iceberg catalog, configured as a Spark catalog (spark.sql.catalog.<name>.*)."""

    name: SparkName = Field("lakeslot", description="Name of the catalog inside the Spark jobs.")
    type: CatalogType = Field(description="Catalog implementation: hadoop, rest, jdbc, glue or hive.")
    uri: Annotated[str, StringConstraints(min_length=1)] | None = optional(
        "Catalog URI (REST endpoint, JDBC URL or Hive metastore thrift URI). Required by rest, jdbc and hive."
    )
    warehouse: Annotated[str, StringConstraints(min_length=1)] | None = optional(
        "Warehouse location, for example s3://bucket/warehouse. Required by hadoop and glue."
    )
    properties: Annotated[StringMap, Field(max_length=CATALOG_PROPERTIES_MAX), credential_properties] = mapping(
        "Further catalog properties, passed through as spark.sql.catalog.<name>.<key>. No "
        "credentials: keys that look like one (credential, token, *secret*, *password*) are "
        "refused; use secretProperties. A rest catalog gets rest-metrics-reporting-enabled: "
        "'false' unless set here (Iceberg's client would post a metrics report after every "
        "commit, on the committing thread), and every catalog cache.expiration-interval-ms: "
        "'600000' (Spark holds the mirrors the apply job commits to for 10 minutes after their "
        "last use, not Iceberg's 30 s: a longer pass would load every table it did not change "
        "again)."
    )
    secret_properties: Annotated[dict[str, SecretKeyRef], Field(max_length=64),
                                 AfterValidator(_one_variable_per_key)] = mapping(
        "Catalog properties whose values come from Secrets (for example jdbc.password or token), "
        "passed like `properties`. Each reaches the jobs as the environment variable "
        "LAKESLOT_CATALOG_<KEY> (upper case, other characters _), so two keys may not differ only "
        "in case or punctuation."
    )

    rules = (
        Rule(
            cel=f"!({cel_type_in(_WAREHOUSE)}) || has(self.warehouse)",
            message=f"{listed(_WAREHOUSE)} catalogs need a warehouse",
            fix="set sink.catalog.warehouse to the warehouse location, for example s3://bucket/warehouse",
            check=lambda catalog: catalog.type not in _WAREHOUSE or catalog.warehouse is not None,
            field_path=".warehouse",
        ),
        Rule(
            cel=f"!({cel_type_in(_RENAMING)}) || !has(self.warehouse) || "
            f"!self.warehouse.matches('{OBJECT_STORE_URI}')",
            message=f"a {listed(_RENAMING)} catalog cannot keep its warehouse on an object store: it "
            "commits by renaming the metadata file, which no object store does atomically, so two "
            "writers or a crash can lose a commit",
            fix="use a catalog that commits atomically (rest: Polaris, Nessie, Lakekeeper, Glue's or S3 "
            "Tables' REST endpoint; jdbc; glue; hive) with this warehouse, or a hadoop catalog on a "
            "filesystem (file://, hdfs://)",
            check=lambda catalog: catalog.type not in _RENAMING or catalog.warehouse is None
            or re.match(OBJECT_STORE_URI, catalog.warehouse) is None,
            field_path=".warehouse",
        ),
        Rule(
            cel=f"!({cel_type_in(_URI)}) || has(self.uri)",
            message=f"{listed(_URI)} catalogs need a uri",
            fix="set sink.catalog.uri to the catalog endpoint",
            check=lambda catalog: catalog.type not in _URI or catalog.uri is not None,
            field_path=".uri",
        ),
    )


class ChangelogSpec(ApiModel):
    """An optional append-only history table next to each mirror table."""

    enabled: bool = Field(
        False,
        description="Also write every change to <table><suffix> (source columns plus "
        "_lakeslot_lsn, _lakeslot_op and _lakeslot_seq).",
    )
    suffix: Annotated[str, StringConstraints(min_length=1, max_length=32, pattern=r"^[a-z0-9_]+$")] = Field(
        "__changes", description="Suffix appended to the mirror table name to name the changelog table."
    )


class MaintenanceSpec(ApiModel):
    """Table maintenance the apply job runs between passes (compaction, manifests, orphan files)."""

    enabled: bool = Field(
        True,
        description="Compact the mirror tables lakeslot writes (merge-on-read leaves delete files "
        "and small data files behind every pass), rewrite their manifests and remove orphan files. "
        "Off: readers slow down as delete files pile up; run Iceberg's procedures yourself.",
    )
    interval_seconds: int = Field(
        0, ge=0, le=86400,
        description="At least this long between two maintenance runs of the same table (0: as "
        "often as maxTimeShare allows).",
    )
    max_time_share: float = Field(
        0.2, ge=0.01, le=1,
        description="Largest share of the time maintenance may take, for each table and for the "
        "job: after a run that took d seconds, the table waits at least d × (1 − share) ÷ share "
        "seconds before the next (at 0.2: a table compacted in 2 s may be compacted again 8 s "
        "later, one that takes a minute, 4 minutes later); and a pass that applied changes for "
        "t seconds maintains tables for at most t × share ÷ (1 − share) seconds (at least one "
        "table; the tables take turns).",
    )
    budget_seconds: int = Field(
        120, ge=1, le=3600,
        description="Time per apply pass for maintenance: no further table is started once it is "
        "spent (a started compaction finishes); the rest waits for the next pass.",
    )
    delete_file_threshold: int = Field(
        8, ge=1,
        description="Compact a table once it has at least this many delete files.",
    )
    small_file_threshold: int = Field(
        16, ge=2,
        description="Compact a table once it has this many data files more than its size needs "
        "at write.target-file-size-bytes.",
    )
    orphan_file_age_hours: int = Field(
        72, ge=0,
        description="Once a day with a compaction (the first time a day after the table's first "
        "compaction), delete files under a table's location that no snapshot references and that "
        "are older than this (0: never). Keep it longer than any snapshot or write takes.",
    )


class SinkSpec(ApiModel):
    """Where the Iceberg mirror tables live."""

    catalog: CatalogSpec = Field(description="The Iceberg catalog.")
    namespace: Annotated[
        str, StringConstraints(max_length=255, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
    ] = Field(description="Iceberg namespace of the mirror tables; dots separate levels (a.b).")
    table_name_template: Annotated[str, StringConstraints(max_length=255, pattern=r"\{table\}")] = Field(
        "{schema}__{table}",
        description="Name of each mirror table, with {schema} and {table} replaced by the source "
        "names; the result is lower-cased and every character other than a-z, 0-9 and _ becomes _. "
        "A name that this changed (upper case, spaces, punctuation, non-ASCII), or whose schema "
        "contains the separator (a__b.c against a.b__c), gets _ and 8 hex digits of a hash of the "
        "exact schema and table names appended, so two tables never share a mirror. Under a "
        "template without {schema} or with a one-character separator, tables that still map to "
        "one name fail at validation or preflight, each naming the other: give one a mirrorName "
        "(source.tables[]).",
    )
    changelog: ChangelogSpec = section(ChangelogSpec, "Optional changelog (history) tables.")
    maintenance: MaintenanceSpec = section(
        MaintenanceSpec, "Compaction and clean-up of the mirror tables, run by the apply job.")
    table_properties: StringMap = mapping(
        "Iceberg table properties set when lakeslot creates a table (for example "
        "write.parquet.compression-codec: zstd). Defaults: write.metadata.delete-after-commit."
        "enabled: 'true', write.metadata.previous-versions-max: '100', and write.merge.mode, "
        "write.update.mode, write.delete.mode: merge-on-read (a MERGE writes the changed rows and "
        "position deletes, its cost follows the changes; maintenance compacts). The apply job expires "
        "old snapshots by history.expire.max-snapshot-age-ms and history.expire.min-snapshots-to-keep "
        "(default: 1; time travel reaches that far back). Without max-snapshot-age-ms it keeps every "
        "snapshot of the last 100 passes (at most Iceberg's 5 days) and, for 5 days, those of one "
        "retained cut an hour, tagged (every commit rewrites the metadata file listing every "
        "snapshot kept: the count stays bounded)."
    )


class StagingSpec(ApiModel):
    """Durable storage between the reader and the apply job (sealed change segments)."""

    uri: Annotated[str, StringConstraints(max_length=1024, pattern=r"^(file|s3|gs|abfs|hdfs)://\S+$")] = Field(
        description="Location of the change segments: file:///path (local mode or a shared "
        "volume), s3://, gs://, abfs:// or hdfs://."
    )
    retention_seconds: int = Field(
        86400,
        ge=0,
        description="How long segments stay after every table has applied them (for audit and "
        "re-apply); 0 deletes them as soon as they are applied.",
    )


class SnapshotSpec(ApiModel):
    """The initial copy of every table (a Spark job reading one exported snapshot in parallel)."""

    mode: Literal["initial", "never"] = Field(
        "initial",
        description="initial: copy every table, then stream; never: start the mirror tables empty "
        "and only stream changes made after the slot was created.",
    )
    parallelism: int = Field(4, ge=1, le=256, description="Maximum number of ctid ranges read at the same time.")
    target_range_bytes: int = Field(
        256 * MiB,
        ge=MiB,
        description="Target size of one ctid range, in bytes of table heap; a table is split "
        "into about relpages * 8 KiB / targetRangeBytes ranges (the last one open-ended).",
    )
    statement_timeout_seconds: int = Field(
        0, ge=0, description="statement_timeout of the snapshot's COPY statements; 0: none."
    )
    resnapshot_generation: int = Field(
        0,
        ge=0,
        description="Increase this counter to request a new snapshot of every table (for example "
        "after the mirror was changed by hand, or an onSchemaChange re-snapshot). The operator "
        "records the generation it acted on in status.observedResnapshotGeneration. It may not "
        "decrease.",
    )

    rules = (
        Rule(
            cel="!has(oldSelf.resnapshotGeneration) || (has(self.resnapshotGeneration) && "
            "self.resnapshotGeneration >= oldSelf.resnapshotGeneration)",
            message="resnapshotGeneration cannot decrease",
            fix="set it to a value at least as large as before; increase it to request a re-snapshot",
            check=lambda new, old: new.resnapshot_generation >= old.resnapshot_generation,
            field_path=".resnapshotGeneration",
        ),
    )


class DriverSpec(ApiModel):
    """Resources of one Spark JVM process."""

    cores: int = Field(1, ge=1, le=64, description="CPU cores of the process.")
    memory: SparkMemory = Field(
        "1g", description="JVM heap in Spark's format (512m, 2g); Spark adds its memory overhead on top."
    )


class ExecutorSpec(DriverSpec):
    """Resources and count of the Spark executors."""

    instances: int = Field(1, ge=1, le=1000, description="Number of executors.")


class SparkSpec(ApiModel):
    """How the Spark jobs (snapshot and apply) run, as spark-operator SparkApplications."""

    image: Annotated[str, StringConstraints(min_length=1)] | None = optional(
        "Container image of the Spark jobs. Default: the operator's configured Spark image."
    )
    spark_version: Annotated[str, StringConstraints(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")] = Field(
        "3.5.9", description="Spark version of the image (SparkApplication sparkVersion)."
    )
    service_account: KubeName | None = optional(
        "Service account of the Spark driver. Default: the operator's configured Spark service account."
    )
    driver: DriverSpec = section(
        DriverSpec, "Driver resources (in the snapshot job the driver holds the exported snapshot)."
    )
    executor: ExecutorSpec = section(ExecutorSpec, "Executor resources and count.")
    spark_conf: Annotated[StringMap, Field(max_length=256), cluster.denied_spark_conf] = mapping(
        "Extra Spark configuration (sparkConf), for example spark.sql.shuffle.partitions. Keys that "
        "spark-operator denies and keys lakeslot sets itself are refused (see Spark configuration keys)."
    )
    jars: Annotated[list[Annotated[str, StringConstraints(min_length=1)]], ListKeys(), Field(max_length=100)] = listing(
        "Extra jars on the driver and executor class path (local:///..., s3://...)."
    )


class ResourceRequirements(ApiModel):
    """Container resources, as in a Pod (cpu, memory, ephemeral-storage)."""

    requests: dict[str, Quantity] = mapping("Minimum resources, for example cpu: 100m, memory: 256Mi.")
    limits: dict[str, Quantity] = mapping("Maximum resources, for example memory: 512Mi.")


class ReaderSpec(ApiModel):
    """The single replication reader (a Deployment with one replica)."""

    image: Annotated[str, StringConstraints(min_length=1)] | None = optional(
        "Container image of the reader. Default: the operator's configured reader image."
    )
    resources: ResourceRequirements | None = optional(
        "Container resources of the reader. Default: the operator's reader defaults (requests "
        "cpu 250m, memory 256Mi; limit memory 512Mi: the reader benchmark peaked at 156 MB "
        "through a 1 GiB transaction)."
    )
    service_account: KubeName | None = optional(
        "Service account of the reader pod (workload identity for the object store, e.g. IRSA or GKE "
        "Workload Identity). Default: the operator's configured reader service account, else the "
        "namespace's default."
    )
    feedback_interval_ms: int | None = optional(
        "Interval of standby status updates to PostgreSQL. Default: min(1 s, wal_sender_timeout / 2).",
        ge=100,
        le=60000,
    )
    segment_max_seconds: float | None = optional(
        "Seal the open change segment at the wall clock's next multiple of this period (once WAL "
        "moved), so the apply job can see it: freshness is at least this. When "
        "apply.triggerIntervalSeconds is a multiple of it (with the default, any interval up to "
        "20 s and any multiple of 10 s), the apply job starts its passes just after these seals "
        "(with the reader's and the apply job's clocks in sync, e.g. NTP). Default: half of "
        "apply.triggerIntervalSeconds, between 0.5 and 10 s (no more segments than the apply job "
        "has passes; an idle source seals none).",
        ge=0.1,
        le=3600,
    )
    segment_max_bytes: int | None = optional(
        "Seal the open change segment once it holds this many bytes of pgoutput data, whatever its "
        "age: under high load segments stay large instead of many small files. Default: 128 MiB.",
        ge=MiB,
        le=1024 * MiB,
    )


class ApplySpec(ApiModel):
    """The long-running Spark job that merges staged changes into the mirror tables."""

    trigger_interval_seconds: int = Field(
        60, ge=1, le=86400, description="How often the apply job starts a pass over new sealed "
        "segments (a pass that takes longer is followed at once by the next). Changes become "
        "visible in Iceberg within about this interval plus a pass; 1 for freshness in seconds.",
    )
    table_parallelism: int = Field(
        8, ge=1, le=64, description="How many tables' work a pass runs on the CPU at once (their "
        "MERGEs or row deltas, and the mirrors loaded at its start; each table's commit stays its "
        "own). Where the catalog or the tables' files are reached over a network, a table waiting "
        "on a request lets its turn go: up to four times as many tables have requests in flight "
        "(a pass on object storage is bound by round trips, not by the CPU). 1 handles the tables "
        "one after the other.",
    )
    driver: DriverSpec | None = optional("Driver resources of the apply job. Default: spark.driver.")
    executor: ExecutorSpec | None = optional("Executor resources of the apply job. Default: spark.executor.")


class PoliciesSpec(ApiModel):
    """What lakeslot does in situations with more than one reasonable answer."""

    deletion_policy: Literal["Retain", "Delete"] = Field(
        "Retain",
        description="On deleting the PostgresIngestion: Retain keeps the slot and publication in "
        "PostgreSQL (the slot keeps holding WAL until dropped by hand); Delete drops both. The "
        "Iceberg tables are never deleted.",
    )
    on_slot_lost: Literal["Error", "Resnapshot"] = Field(
        "Error",
        description="When the slot is lost or invalidated (changes are missing): Error stops with "
        "SlotReady=False; Resnapshot creates a new slot and snapshots every table again.",
    )
    on_truncate: Literal["Apply", "Error"] = Field(
        "Apply", description="On TRUNCATE of a source table: Apply empties the mirror table; Error stops that table."
    )
    on_schema_change: Literal["Resnapshot", "Evolve", "Error"] = Field(
        "Resnapshot",
        description="On a schema change of a source table (DDL, a rewrite, partition maintenance, "
        "drop and re-create): changes Iceberg can mirror faithfully are applied (added columns, "
        "a constant default filled in; with source.ddlCapture EventTrigger also column renames "
        "and widened types); for anything else Resnapshot copies that table alone "
        "again, online, while the others keep streaming; Evolve stops the table instead (until "
        "its resnapshotGeneration is raised); Error stops the table on any schema change.",
    )
    max_resnapshots_per_hour: int = Field(
        3,
        ge=0,
        le=60,
        description="Automatic re-snapshots of one table within an hour, at most (a guard against "
        "a loop, e.g. a migration that rewrites the table again and again); beyond it the table "
        "stops with the reason in its status until the hour has passed or its "
        "resnapshotGeneration is raised. 0: never re-snapshot automatically.",
    )


class PostgresIngestionSpec(ApiModel):
    """The desired change-data-capture pipeline."""

    source: SourceSpec = Field(description="The PostgreSQL source.")
    sink: SinkSpec = Field(description="The Iceberg destination.")
    staging: StagingSpec = Field(description="Staging storage for change segments.")
    snapshot: SnapshotSpec = section(SnapshotSpec, "The initial snapshot.")
    spark: SparkSpec = section(SparkSpec, "Spark settings shared by the snapshot and apply jobs.")
    reader: ReaderSpec = section(ReaderSpec, "The replication reader.")
    apply: ApplySpec = section(ApplySpec, "The apply job.")
    policies: PoliciesSpec = section(PoliciesSpec, "Policies for deletion and definite errors.")
    secret_env: Annotated[list[SecretEnvVar], ListKeys(("name",)), Field(max_length=64)] = listing(
        "Environment variables from Secrets for the reader and the Spark jobs (driver and "
        "executors): credentials of the object store holding staging and the warehouse, for "
        "example AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, which pyarrow, Hadoop s3a and "
        "Iceberg's S3FileIO read. The operator reads staging and the warehouse with the AWS "
        "variables here too (keys, session token, region, AWS_ENDPOINT_URL), never with its own "
        "environment. Prefer workload identity (a service account) where the platform offers it."
    )
    suspend: bool = Field(
        False,
        description="Stop the reader and the Spark jobs, keeping the slot (which then retains "
        "WAL) and all state; set back to false to resume where it stopped.",
    )

    rules = (cluster.reserved_spark_conf,)

    def seal_seconds(self) -> float:
        """The reader's seal period: ``reader.segmentMaxSeconds``, or its default for
        ``apply.triggerIntervalSeconds``. Its one derivation: the reader is given it on its
        command line (:func:`lakeslot.workloads.reader_command`), the apply job starts its passes
        on its grid (:mod:`lakeslot.cadence`), and the status judges freshness by it."""
        if self.reader.segment_max_seconds is not None:
            return self.reader.segment_max_seconds
        interval = self.apply.trigger_interval_seconds
        return min(cadence.SEAL_MAX_S, max(cadence.SEAL_MIN_S, interval / 2))


# ------------------------------------------------------------------------------------- status

CONDITION_TYPES = {
    "Ready": "The summary: True when every selected table is streaming into Iceberg.",
    "SourceReady": "Preflight against PostgreSQL passed: connection, wal_level=logical, replication "
    "privilege, replica identity of every table, publication present and covering the tables.",
    "SlotReady": "The permanent slot exists, is not lost (wal_status) and is held by the current reader only.",
    "SnapshotComplete": "Every table has a snapshot committed to Iceberg; False while a snapshot or re-snapshot runs.",
    "Streaming": "The reader receives changes and the apply job commits them.",
    "Degraded": "Something needs attention while data may still flow (a failed table, WAL retention "
    "growing, transient errors being retried); the reason says what.",
    "Verified": "The last verification requested with the lakeslot.io/verify annotation: True when "
    "every table it checked equals its source at one LSN; False when rows differ (Diverged) or "
    "the check could not settle (NotCompared, Failed, InvalidRequest); Unknown while it runs. "
    "Absent until a verification is requested; not part of Ready.",
}

Phase = Literal["Pending", "Snapshotting", "Streaming", "Suspended", "Failed", "Deleting"]
TableState = Literal["Pending", "Snapshotting", "Streaming", "Failed", "Removed"]
ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """A condition shaped like metav1.Condition."""

    type: Annotated[str, StringConstraints(max_length=316, pattern=r"^[A-Z][A-Za-z0-9]*$")] = Field(
        description="Condition type (see Conditions)."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: Annotated[
        str, StringConstraints(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    ] = Field(description="Why the condition has this status, as one CamelCase word (for example SlotLost).")
    message: Annotated[str, StringConstraints(max_length=32768)] = Field(
        "", description="What happened and what to do, for humans."
    )
    last_transition_time: KubeTime = Field(description="When the status last changed.")
    observed_generation: int | None = optional("metadata.generation the condition was computed for.", ge=0)


class SlotStatus(ApiModel):
    """The permanent replication slot, from pg_replication_slots."""

    name: str | None = optional("Effective slot name (spec.source.slotName or the derived default).")
    active_pid: int | None = optional("Backend PID of the process holding the slot; absent when free.", ge=1)
    holder: str | None = optional(
        "Who holds the slot: the reader Pod (namespace/name), or an unknown client lakeslot will terminate."
    )
    confirmed_flush_lsn: Lsn | None = optional("LSN up to which the reader confirmed durable receipt.")
    restart_lsn: Lsn | None = optional("Oldest WAL position the slot retains.")
    wal_status: Literal["reserved", "extended", "unreserved", "lost"] | None = optional(
        "pg_replication_slots.wal_status; lost means changes are gone (see policies.onSlotLost)."
    )
    safe_wal_size: int | None = optional(
        "Bytes of WAL that can still be written before the slot is in danger of being lost; absent without a limit."
    )
    retained_bytes: int | None = optional("Bytes of WAL retained by the slot (current WAL LSN - restart LSN).", ge=0)
    failover_safe: bool | None = optional(
        "Whether a failover to a standby keeps the slot: a PostgreSQL 17+ failover slot "
        "(source.failoverSlot) with the standbys in synchronized_standby_slots, all streaming. "
        "False: the SlotReady message says what a failover would do (policies.onSlotLost)."
    )


class TableStatus(ApiModel):
    """Progress of one source table."""

    schema_name: str = Field(alias="schema", description="Schema of the source table.")
    name: str = Field(description="Name of the source table.")
    state: TableState = Field(
        description="Pending, Snapshotting, Streaming, Failed, or Removed: no longer selected (dropped, "
        "renamed or moved out of the selected schemas, or taken out of the spec), no longer "
        "replicated; its mirror is kept as of appliedLsn (the latest 20 such rows are kept)."
    )
    snapshot_lsn: Lsn | None = optional("LSN of the snapshot the mirror table started from.")
    applied_lsn: Lsn | None = optional("LSN the mirror table reflects (its last commit's lakeslot.lsn).")
    rows_known: int | None = optional("Rows in the mirror table as of appliedLsn.", ge=0)
    rows_staged: int | None = optional("Changes sealed in staging and not yet applied.", ge=0)
    lag_seconds: int | None = optional(
        "Freshness: seconds since the commit of the first source transaction sealed in staging and "
        "not yet applied to this table (0 when none is pending); absent when staging cannot be read.",
        ge=0,
    )
    message: str = Field("", description="Why the table is Failed or Pending, and what to do.")
    last_schema_change: str | None = optional(
        "The last schema change applied to the mirror in place (rename, added column, widened "
        "type), with the DDL and its LSN."
    )
    data_files: int | None = optional("Data files of the mirror table as of appliedLsn.", ge=0)
    delete_files: int | None = optional(
        "Position-delete files of the mirror table as of appliedLsn: every reader merges them; "
        "maintenance compacts them away (spec.sink.maintenance).", ge=0
    )
    last_maintenance: str | None = optional(
        "When the apply job last compacted or cleaned the mirror table, and what it did or why it "
        "failed."
    )
    observed_resnapshot_generation: int = Field(
        0, ge=0, description="The spec's per-table resnapshotGeneration the operator last acted on."
    )
    resnapshot_below_lsn: Lsn | None = optional(
        "A requested re-snapshot of this table is served once the mirror's snapshot LSN reaches this."
    )


class ReaderStatus(ApiModel):
    """The replication reader."""

    pod: str | None = optional("Name of the reader Pod.")
    durable_lsn: Lsn | None = optional("End of the last sealed segment: everything below is durable in staging.")
    lag_bytes: int | None = optional("Bytes of WAL between the server's current position and durableLsn.", ge=0)


class ApplyStatus(ApiModel):
    """The apply job."""

    applied_lsn: Lsn | None = optional("Lowest appliedLsn over all streaming tables.")
    last_commit_time: KubeTime | None = optional("Time of the last Iceberg commit.")
    lag_seconds: int | None = optional(
        "Freshness: the largest lagSeconds of the streaming tables (printer column Behind).", ge=0
    )


class SnapshotStatus(ApiModel):
    """The current (re-)snapshot, kept in status because the SparkApplication is deleted by
    its time-to-live after it finished."""

    application: str | None = optional("Name of the snapshot SparkApplication.")
    generation: str | None = optional(
        "Snapshot generation: the resnapshotGeneration and a digest of the tables it copies."
    )
    tables: Annotated[list[str], ListKeys()] = listing("The tables it copies (schema.table, quoted like psql).")
    state: str | None = optional("SparkApplication state: SUBMITTED, RUNNING, COMPLETED, FAILED, ...")
    attempts: int = Field(0, ge=0, description="Failed attempts of this generation so far.")
    message: str = Field("", description="The last failure, as the Spark job reported it.")
    finished_at: KubeTime | None = optional("When the last attempt finished (COMPLETED or FAILED).")


VerificationState = Literal["Verifying", "Equal", "Diverged", "NotCompared", "Failed", "InvalidRequest"]


class TableVerification(ApiModel):
    """One table's result in a verification."""

    schema_name: str = Field(alias="schema", description="Schema of the source table.")
    name: str = Field(description="Name of the source table.")
    result: Literal["equal", "different", "incomplete"] = Field(
        description="equal, different (rows differ, or the mirror lacks source columns) or "
        "incomplete (the check could not settle it: see message)."
    )
    rows_compared: int = Field(0, ge=0, description="Keys compared and settled, over every round.")
    missing: int = Field(0, ge=0, description="Rows in the source that the mirror lacks.")
    extra: int = Field(0, ge=0, description="Rows in the mirror that the source lacks.")
    differing: int = Field(0, ge=0, description="Rows held by both whose values differ.")
    not_compared: int = Field(
        0, ge=0, description="Keys still changing after the last round: not compared, not counted as differences."
    )
    keys: Annotated[list[str], Field(max_length=10)] = listing(
        "The first keys that differ, for example `missing id=7` or `differing id=9 (amount)`; the "
        "result document in staging lists more, with values."
    )
    message: str = Field("", description="Why the table is incomplete, or which source columns the mirror lacks.")


class VerificationStatus(ApiModel):
    """The last verification requested with the lakeslot.io/verify annotation."""

    token: str = Field(description="The lakeslot.io/verify annotation value this verification answers.")
    state: VerificationState = Field(
        description="Verifying, Equal, Diverged, NotCompared, Failed or InvalidRequest (the reason of "
        "the Verified condition)."
    )
    tables: Annotated[list[str], ListKeys()] = listing(
        "The tables requested with lakeslot.io/verify-tables (schema.table, quoted like psql); "
        "empty: every selected table."
    )
    job: str | None = optional("Name of the verification Job.")
    started_at: KubeTime | None = optional("When the operator created the Job.")
    finished_at: KubeTime | None = optional("When the check finished.")
    lsn: Lsn | None = optional(
        "The LSN the tables were compared at: the source snapshot of the first round (keys changing "
        "then were compared again at later snapshots)."
    )
    message: str = Field("", description="The outcome and what to do (the Verified condition's message).")
    results: Annotated[list[TableVerification], ListKeys(("schema", "name"))] = listing("Per-table results.")


class PostgresIngestionStatus(ApiModel):
    """The observed state, written by the operator only."""

    observed_generation: int | None = optional("metadata.generation of the spec this status describes.", ge=0)
    phase: Phase | None = optional(
        "Pending (preflight, waiting), Snapshotting, Streaming, Suspended, Failed (a definite error, "
        "see conditions) or Deleting."
    )
    conditions: Annotated[list[Condition], ListKeys(("type",))] = listing("Conditions (see Conditions).")
    publication_name: str | None = optional(
        "Effective publication name (spec.source.publicationName or the derived default)."
    )
    publication_managed_by: Literal["Lakeslot", "External"] | None = optional(
        "Who manages the publication now (see spec.source.publicationManagement): Lakeslot keeps "
        "its table list; External is only verified, never altered or dropped by lakeslot."
    )
    ddl_capture: Literal["EventTrigger", "Catalog"] | None = optional(
        "How schema changes are seen now (see spec.source.ddlCapture; the SourceReady message "
        "says why and what would enable EventTrigger)."
    )
    slot: SlotStatus | None = optional("The replication slot.")
    tables: Annotated[list[TableStatus], ListKeys(("schema", "name"))] = listing("Per-table progress.")
    table_details_omitted: int | None = optional(
        "Rows of tables without their details (rowsKnown, rowsStaged, lagSeconds, dataFiles, "
        "deleteFiles, lastMaintenance): the resource keeps them for the first 100 rows only, "
        "failed and pending tables first, so that its size stays bounded; `lakeslot status` and "
        "the operator's metrics have every table's.", ge=0)
    table_count: int | None = optional("Number of tables replicated (printer column Tables).", ge=0)
    lag_bytes: int | None = optional(
        "End-to-end lag: bytes of WAL between the server's current position and apply.appliedLsn "
        "(printer column Lag).",
        ge=0,
    )
    reader: ReaderStatus | None = optional("The replication reader.")
    apply: ApplyStatus | None = optional("The apply job.")
    observed_resnapshot_generation: int | None = optional(
        "The spec.snapshot.resnapshotGeneration the last (re-)snapshot was started for.", ge=0
    )
    snapshot: SnapshotStatus | None = optional("The current or last (re-)snapshot.")
    resnapshot_below_lsn: Lsn | None = optional(
        "Set when a lost slot was recreated (policies.onSlotLost: Resnapshot): the new slot's "
        "creation LSN. Every table whose mirror is below it is copied again; cleared when none is."
    )
    verification: VerificationStatus | None = optional(
        "The last verification (requested with the lakeslot.io/verify annotation; see the Verified condition)."
    )
    last_handled_configuration: str | None = optional(
        "The spec the operator last handled, as JSON (what the next change is compared with; "
        "written by kopf). Kept in status, not in an annotation: an object's annotations are "
        "limited to 256 KiB in total, which a spec listing many tables exceeds."
    )


# ----------------------------------------------------------------------------------- resource


class ObjectMeta(ApiModel):
    """Kubernetes object metadata; only the fields lakeslot reads are checked."""

    model_config = ConfigDict(extra="allow")

    name: KubeName = Field(description="Name of the PostgresIngestion.")
    namespace: KubeLabel | None = optional("Namespace of the PostgresIngestion. Default: default.")


class PostgresIngestion(ApiModel):
    """A PostgreSQL to Apache Iceberg change-data-capture ingestion."""

    api_version: Literal["lakeslot.io/v1alpha1"] = Field(
        description="API version of the resource: lakeslot.io/v1alpha1."
    )
    kind: Literal["PostgresIngestion"] = Field(description="Kind of the resource: PostgresIngestion.")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: PostgresIngestionSpec = Field(description="The desired ingestion.")
    status: PostgresIngestionStatus | None = optional("The observed state, written by the operator.")

    rules = (cluster.ingestion_name, cluster.reserved_secret_names)

    @model_validator(mode="after")
    def bounded(self) -> PostgresIngestion:
        """Refuses a spec over :data:`SPEC_MAX_BYTES` (offline and by the operator; the API server
        refuses the whole object only at 1.5 MiB, status included)."""
        size = spec_bytes(self)
        if size > SPEC_MAX_BYTES:
            raise violations_error("PostgresIngestion", self, [(("spec",), (
                f"the spec is {size / KiB:,.0f} KiB as JSON, over the {SPEC_MAX_BYTES // KiB} KiB "
                "lakeslot accepts: the API server stores at most 1.5 MiB per object, and the "
                "status holds a copy of the spec and a row per table"), SPEC_SIZE_FIX)])
        return self


def spec_bytes(ingestion: PostgresIngestion) -> int:
    """The size of ``ingestion``'s spec as compact JSON (UTF-8), as documents carry it."""
    document = ingestion.model_dump(mode="json", by_alias=True, exclude_unset=True, include={"spec"})
    return len(json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode())
