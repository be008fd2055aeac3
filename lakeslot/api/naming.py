"""Names: a source table's name, and the names lakeslot derives from the resource — default
publication and slot names, and Iceberg table names.

Pure functions, no I/O.

A :class:`TableName` is a pair of raw identifiers (no quoting inside): ``schema`` and ``name``
may hold quotes, spaces, upper case, unicode or reserved words. Rendering for SQL goes through
``psycopg.sql.Identifier`` only; rendering for humans (messages, status) quotes like PostgreSQL's
``quote_ident`` (:func:`quote_ident`) so that the text can be pasted into ``psql``.

Default publication and slot name (when the spec leaves them empty): ``lakeslot_<namespace>_<name>``
with every character outside ``[a-z0-9_]`` replaced by ``_``. Invariants:

- the result is a valid slot name (``[a-z0-9_]``, at most 63 bytes), so the same default serves
  the publication and the slot (PostgreSQL keeps them in separate namespaces);
- it depends only on namespace and name (stable across operator restarts and versions);
- two different resources get different names: when a replacement made the mapping lossy
  (``a-b/c`` and ``a/b-c`` would both read ``lakeslot_a_b_c``) or the name had to be cut to 63
  bytes, a hash of the exact ``namespace/name`` is appended (``_`` + 8 hex digits). Names without
  ``-`` or ``.`` stay readable: ``prod/orders`` → ``lakeslot_prod_orders``.

Not covered: two Kubernetes clusters whose resources share namespace and name and point at the
same database would share the default; set ``slotName`` explicitly in that case.

The operator reports the effective names in ``status.publicationName`` and ``status.slot.name``.

:class:`IngestionNames` is the one place every component takes these names from (operator,
local mode, the Spark jobs, the reader's command line): namespace (``default`` when the resource
has none), owner (``namespace/name``, the ingestion's identity in ``application_name``, logs and
the publication's ownership comment), slot, publication, and the mirror table of a source table.

Mirror names (:func:`iceberg_table_name`, a table's ``mirrorName``) are injective or refused:
under a template naming schema and table apart (the default ``{schema}__{table}``: see
:func:`iceberg_table_name`) every table gets a name of its own;
:meth:`IngestionNames.collisions` finds what remains — tables that would share a mirror under
another template, a ``mirrorName`` equal to another table's mirror, a mirror and a changelog
table —; validation refuses them for listed tables, preflight for the tables a schema selection
finds (each is ``Failed``, naming the other, and left out of the publication). A mirror
also records which ingestion and source table own it (:mod:`lakeslot.mirror.contract`), and the
jobs refuse to write one owned by another. Names starting with :data:`CUTS_TABLE` are lakeslot's
own, never a mirror's: each ingestion's cuts record (:attr:`IngestionNames.cuts_table`,
:mod:`lakeslot.mirror.cuts`).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from psycopg import sql

from lakeslot.api.models import PostgresIngestion, SourceSpec
from lakeslot.api.types import IDENTIFIER_MAX_BYTES

# the prefix of the cuts records' names (reserved for them); a letter first: REST catalogs (S3
# Tables, SeaweedFS) refuse a table name that does not start with a letter or a digit
CUTS_TABLE = "lakeslot_cuts"
_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]*")


def quote_ident(name: str) -> str:
    """Quote for humans like PostgreSQL's ``quote_ident``: plain lower-case names that are not
    reserved stay bare, everything else is double-quoted with inner quotes doubled. (SQL we run
    never uses this: it uses ``psycopg.sql.Identifier``.)"""
    if _PLAIN_IDENTIFIER.fullmatch(name) and name not in _RESERVED:
        return name
    return '"' + name.replace('"', '""') + '"'


# PostgreSQL's reserved and type/function-name keywords: plain-looking, yet quoted by quote_ident.
_RESERVED = frozenset(
    "all analyse analyze and any array as asc asymmetric authorization binary both case cast "  # noqa: SIM905 - words read best as words
    "check collate collation column concurrently constraint create cross current_catalog "
    "current_date current_role current_schema current_time current_timestamp current_user "
    "default deferrable desc distinct do else end except false fetch for foreign freeze from "
    "full grant group having ilike in initially inner intersect into is isnull join lateral "
    "leading left like limit localtime localtimestamp natural not notnull null offset on only or "
    "order outer overlaps placing primary references returning right select session_user "
    "similar some symmetric system_user table tablesample then to trailing true union unique "
    "user using variadic verbose when where window with".split())


class TableName(NamedTuple):
    schema: str
    name: str

    def sql(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    def __str__(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"


PREFIX = "lakeslot"
HASH_DIGITS = 8
_UNSAFE = re.compile(r"[^a-z0-9_]")


def default_replication_name(namespace: str, name: str) -> str:
    """The default publication and slot name of the resource ``namespace/name``."""
    readable = f"{PREFIX}_{namespace}_{name}".lower()
    safe = _UNSAFE.sub("_", readable)
    if safe == readable and len(safe) <= IDENTIFIER_MAX_BYTES:
        return safe
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:HASH_DIGITS]
    return f"{safe[: IDENTIFIER_MAX_BYTES - HASH_DIGITS - 1]}_{digest}"


def effective_publication_name(namespace: str, name: str, source: SourceSpec) -> str:
    return source.publication_name or default_replication_name(namespace, name)


def effective_slot_name(namespace: str, name: str, source: SourceSpec) -> str:
    return source.slot_name or default_replication_name(namespace, name)


def iceberg_table_name(template: str, schema: str, table: str) -> str:
    """The mirror table name for a source table (see ``sink.tableNameTemplate``).

    Lower-cased, and every character outside ``[a-z0-9_]`` becomes ``_``, so the name is valid
    in every catalog type (Glue accepts only lower case) without quoting. The readable name is
    kept only when it tells the table apart: both names plain (the rewrite changed nothing) and
    the schema unambiguous at the template's separator (:func:`_separable`). Otherwise ``_`` +
    8 hex digits of a hash of the exact ``schema`` and ``table`` are appended: ``"Users"`` and
    ``users`` (or two Cyrillic names of one length) get different mirrors, and so do ``a__b``.``c``
    and ``a``.``b__c``. The names of plain tables in plain schemas are what they always were.
    Under a template that names both the schema and the table with a separator of two or more
    characters between them (the default's ``__``), two tables therefore never share a name
    (short of a table named with another's hash); under one without ``{schema}`` or with a
    one-character separator, they can, and :func:`collisions` refuses them.
    """
    if _separable(template, schema):
        return earlier_table_name(template, schema, table)
    return hashed_table_name(template, schema, table)


def earlier_table_name(template: str, schema: str, table: str) -> str:
    """The name :func:`iceberg_table_name` gave before names ambiguous at the separator were
    hashed (the readable name of plain names, whatever the schema). A mirror created under it
    keeps it: the snapshot job finds such a mirror and says how (``mirrorName``)."""
    filled = template.replace("{schema}", schema).replace("{table}", table)
    if all(_UNSAFE.sub("_", part.lower()) == part for part in (schema, table)):
        return _UNSAFE.sub("_", filled.lower())
    return hashed_table_name(template, schema, table)


def _separable(template: str, schema: str) -> bool:
    """Whether the schema can be read back from a filled template whatever the table: for
    ``…{schema}SEP{table}…`` the first ``SEP`` after the prefix must end the schema (``a__b``
    and ``a_`` are not separable by ``__``: ``a__b``.``c`` and ``a``.``b__c`` fill alike); for
    ``…{table}SEP{schema}…`` the last one must begin it (``SEP`` as the name shows it: a ``.``
    becomes ``_``). A template without both placeholders, with either twice, or with less than
    two characters between them is left as it was (its collisions are refused)."""
    if template.count("{schema}") != 1 or template.count("{table}") != 1:
        return True
    schema_at, table_at = template.index("{schema}"), template.index("{table}")
    between = template[min(schema_at, table_at):max(schema_at, table_at)]
    separator = _UNSAFE.sub("_", between.removeprefix("{schema}").removeprefix("{table}").lower())
    if len(separator) < 2:  # hashing every schema with a "_" in it would rename most mirrors
        return True
    if schema_at < table_at:
        return (schema + separator).find(separator) == len(schema)
    return (separator + schema).rfind(separator) == 0


def hashed_table_name(template: str, schema: str, table: str) -> str:
    """The template's readable name with ``_`` + 8 hex digits of a hash of the exact names: what
    :func:`iceberg_table_name` gives a name it changed, and the ``mirrorName`` a refused pair's
    message proposes (:func:`collision_fix`)."""
    filled = template.replace("{schema}", schema).replace("{table}", table)
    digest = hashlib.sha256(f"{schema}\x00{table}".encode()).hexdigest()[:HASH_DIGITS]
    return f"{_UNSAFE.sub('_', filled.lower())}_{digest}"


def namespace_of(namespace: str | None) -> str:
    """The resource's namespace; ``default`` when it has none (a manifest without one)."""
    return namespace or "default"


@dataclass(frozen=True)
class IngestionNames:
    """Every name derived from one PostgresIngestion (see the module docstring)."""

    namespace: str
    name: str
    slot: str
    publication: str
    sink_namespace: str  # spec.sink.namespace: dot-separated Iceberg namespace levels
    table_template: str  # spec.sink.tableNameTemplate
    # (schema, table, mirrorName) of every source.tables entry that sets mirrorName
    overrides: tuple[tuple[str, str, str], ...] = ()
    changelog_suffix: str | None = None  # spec.sink.changelog.suffix when changelogs are written

    @classmethod
    def of(cls, ingestion: PostgresIngestion) -> IngestionNames:
        namespace = namespace_of(ingestion.metadata.namespace)
        name, spec = ingestion.metadata.name, ingestion.spec
        return cls(namespace, name,
                   effective_slot_name(namespace, name, spec.source),
                   effective_publication_name(namespace, name, spec.source),
                   spec.sink.namespace, spec.sink.table_name_template,
                   tuple((t.schema_name, t.name, t.mirror_name) for t in spec.source.tables
                         if t.mirror_name),
                   spec.sink.changelog.suffix if spec.sink.changelog.enabled else None)

    @property
    def owner(self) -> str:
        """``namespace/name``: the ingestion's identity in application_name, logs and events."""
        return f"{self.namespace}/{self.name}"

    def mirror_table(self, table: TableName) -> str:
        """The mirror table's name inside ``spec.sink.namespace``: the table's ``mirrorName``,
        else :func:`iceberg_table_name` of the template."""
        mirror = self._mirror_names.get((table.schema, table.name))
        return mirror if mirror is not None else iceberg_table_name(self.table_template,
                                                                    table.schema, table.name)

    @functools.cached_property
    def _mirror_names(self) -> dict[tuple[str, str], str]:
        """``overrides`` by table, the first one listed winning (a scan each time was quadratic
        over 1,000 tables that each set mirrorName)."""
        names: dict[tuple[str, str], str] = {}
        for schema, name, mirror in self.overrides:
            names.setdefault((schema, name), mirror)
        return names

    def earlier_mirror_table(self, table: TableName) -> str | None:
        """The name an earlier lakeslot gave the table's mirror when it differs from
        :meth:`mirror_table` (:func:`earlier_table_name`; never with a ``mirrorName``)."""
        earlier = earlier_table_name(self.table_template, table.schema, table.name)
        return None if earlier == self.mirror_table(table) or any(
            (schema, name) == (table.schema, table.name) for schema, name, _ in self.overrides) \
            else earlier

    @property
    def cuts_table(self) -> str:
        """The ingestion's cuts record in ``spec.sink.namespace`` (:mod:`lakeslot.mirror.cuts`):
        :data:`CUTS_TABLE`, then the resource's namespace and name (``-`` and ``.`` as ``_``)."""
        return CUTS_TABLE + re.sub(r"[^a-z0-9]+", "_", f"_{self.namespace}_{self.name}".lower())

    def cuts_identifier(self) -> tuple[str, ...]:
        """The cuts record's Iceberg identifier: namespace levels + table name."""
        return (*self.sink_namespace.split("."), self.cuts_table)

    def mirror_identifier(self, table: TableName) -> tuple[str, ...]:
        """The mirror table's Iceberg identifier: namespace levels + table name."""
        return (*self.sink_namespace.split("."), self.mirror_table(table))

    def collisions(self, tables: Iterable[TableName], established: Collection[TableName] = ()
                   ) -> dict[TableName, str]:
        """The tables of ``tables`` that cannot have the mirror name they map to, each with why
        and the fix (pure). Two tables collide when their mirrors — or a mirror and another's
        changelog table — would have one name; a mirror or changelog table whose name starts
        with :data:`CUTS_TABLE` is refused whatever else. In a group of colliding tables, the one table of
        ``established`` (mirrored before: it keeps its mirror) is left alone when there is
        exactly one; otherwise every table of the group is refused: never a shared mirror."""
        claims: dict[str, list[tuple[TableName, str]]] = {}
        for table in tables:
            mirror = self.mirror_table(table)
            claims.setdefault(mirror, []).append((table, "mirror"))
            if self.changelog_suffix:
                claims.setdefault(mirror + self.changelog_suffix, []).append((table, "changelog"))
        refused: dict[TableName, str] = {}
        for name, claimants in claims.items():
            for table, role in claimants if name.startswith(CUTS_TABLE) else ():
                refused[table] = (f"its {role} table would be {self.sink_namespace}.{name}: names "
                                  f"starting with {CUTS_TABLE} are reserved for lakeslot's cuts "
                                  "records")
        for name, claimants in claims.items():
            group = list(dict.fromkeys(t for t, _ in claimants))
            if len(group) < 2:
                continue
            keeper = [t for t in group if t in established]
            for table, role in claimants:
                if len(keeper) == 1 and table == keeper[0]:
                    continue
                others = ", ".join(f"{t} ({r})" for t, r in claimants if t != table)
                refused.setdefault(table, (
                    f"its {role} table would be {self.sink_namespace}.{name}, the same Iceberg "
                    f"table as that of {others}: two source tables never share a mirror"))
        return refused


def collision_fix(table: TableName, template: str) -> str:
    """What to do about a refused mirror name (:meth:`IngestionNames.collisions`), with a name
    that is free of the ambiguity (the template's ``template``, hashed as a changed name is)."""
    return (f"set mirrorName for {table} in spec.source.tables (an entry with schema "
            f"{table.schema!r}, name {table.name!r} and mirrorName, for example "
            f"{hashed_table_name(template, table.schema, table.name)!r}), or change "
            "sink.tableNameTemplate")
