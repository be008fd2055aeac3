"""Preflight: can this database feed this ingestion? Each check says what is wrong and how to
fix it (the SQL to run or the setting to change), so a user never has to guess.

Invariants:

- Checks only read the catalog: running them never changes the database and is always safe
  to repeat (the operator runs them on every reconcile, ``lakeslot run`` on every status).
- Their cost does not grow in round trips with the tables: what the per-table checks read is
  read for all tables at once (:func:`_facts`, four queries), and a table costs a query of its
  own only where it fails (the fix to propose) or where it sets ``partitionBy``.
- Every table-level problem names the table (quoted as ``psql`` would accept it), and fixes are
  rendered with ``psycopg.sql`` so they are correct for any identifier.
- A table without a usable replica identity is reported *before* it could be added to a
  publication: once such a table is in a publication that publishes updates and deletes, the
  application's own UPDATE and DELETE statements on it fail (FACTS.md).

Privileges (least privilege: the Managed PostgreSQL page): ``REPLICATION`` (or ``rds_replication``),
``USAGE`` on each table's schema and ``SELECT`` on the columns its mirror holds — column grants
suffice, an excluded column needs none (the snapshot reads only the mirrored columns). ``CREATE`` on
the database (to create the publication) and ownership of the tables (to add them to it) are
checked only when lakeslot manages the publication; their fixes lead with the narrower way out (a
publication the DBA creates, ``publicationManagement: External``), never a grant of the owner's
role or superuser.

Failover (:func:`_failover`): whether a failover to a standby keeps the slot — a PostgreSQL 17+
failover slot with streaming standbys in ``synchronized_standby_slots`` — or loses it, and then
what ``policies.onSlotLost`` does; a passing finding either way (its message says which), except
``source.failoverSlot`` on a server older than 17, which fails.

Replica identity rules (what the mirror's key will be):

- primary key with REPLICA IDENTITY DEFAULT → the primary key;
- REPLICA IDENTITY USING INDEX → that index's columns;
- REPLICA IDENTITY FULL → the primary key if there is one, else the configured key columns
  (required then: without them the mirror cannot tell rows apart);
- configured key columns are accepted only with FULL (otherwise updates and deletes would not
  carry them); whether their values are unique (and never NULL) is checked on the data when the
  table is snapshotted (:mod:`lakeslot.source.keys`);
- DEFAULT without a primary key, or NOTHING → not usable.

Generated columns (:func:`lakeslot.source.columns.unpublished_generated_columns`): pgoutput publishes a *stored*
generated column only from PostgreSQL 18 on (lakeslot's publication sets
``publish_generated_columns = stored``), and a *virtual* one (18) never. Such a column is left out
of the mirror by snapshot and apply alike (:func:`lakeslot.source.columns.describe`), never
mirrored as NULL; the table passes with a note (:attr:`Finding.note`, shown as the table's
message) saying how to get it (upgrade to 18, or make it stored). A key column among them fails
the table.

Partition spec (:func:`_partition_by`): each ``partitionBy`` field must name a column the mirror
has (not excluded, not an unsent generated column) whose mirrored Iceberg type its transform
takes (``textColumns`` are strings); otherwise the table fails, naming the field and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from lakeslot.api import partitioning
from lakeslot.api.naming import TableName, quote_ident
from lakeslot.api.partitioning import PartitionField
from lakeslot.mirror import typemap
from lakeslot.source import columns, failover, keys
from lakeslot.source.connection import one_row, render_sql
from lakeslot.source.tables import existing

MIN_SERVER_VERSION = 130000
# Managed services grant replication through a role instead of the REPLICATION attribute.
REPLICATION_ROLES = ("rds_replication",)


@dataclass(frozen=True)
class Finding:
    """One check's outcome. ``note``: it passes, but the user should know (e.g. a column left
    out of the mirror): shown as the table's status message."""

    check: str
    ok: bool
    message: str
    fix: str = ""
    table: TableName | None = None
    note: bool = False

    def __str__(self) -> str:
        where = f"{self.table}: " if self.table else ""
        return f"{where}{self.message}" + (f" — fix: {self.fix}" if self.fix else "")


def failures(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if not f.ok]


def notes(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.ok and f.note]


def run(conn: psycopg.Connection, tables: Sequence[TableName], *,
        options: Mapping[TableName, columns.ColumnOptions] | None = None,
        partition_by: Mapping[TableName, Sequence[PartitionField]] | None = None,
        slot_name: str | None = None, manage_publication: bool = True,
        create_publication: bool | None = None,
        failover_slot: bool = False, on_slot_lost: str = "Error",
        folding_catalog: str | None = None) -> list[Finding]:
    """All checks for these tables, in the order a user should address them. ``options``: the
    tables' column options (none: a table's defaults); ``manage_publication``: lakeslot adds the
    tables to the publication (it must own them), ``create_publication``: and creates it (CREATE
    on the database; default: ``manage_publication``) — neither is checked for a publication a
    DBA manages (:func:`lakeslot.source.publication.plan`); ``failover_slot``/``on_slot_lost``: the
    spec's ``source.failoverSlot`` and ``policies.onSlotLost``, for the failover check;
    ``partition_by``: the tables' parsed ``partitionBy``, for the partition check;
    ``folding_catalog``: the catalog type when it stores names case-insensitively (columns that
    differ only in case cannot be told apart there)."""
    options, partition_by = options or {}, partition_by or {}
    findings = [_server_version(conn), _wal_level(conn), *_headroom(conn, slot_name),
                _replication_privilege(conn)]
    if slot_name is not None:
        findings.append(_failover(conn, slot_name, failover_slot, on_slot_lost))
    if manage_publication if create_publication is None else create_publication:
        findings.append(_create_privilege(conn))
    oids = existing(conn, tables)
    facts = _facts(conn, list(oids.values()))
    for table in tables:
        oid = oids.get(table)
        if oid is None or oid not in facts:  # (dropped between the two queries)
            findings.append(Finding("table_exists", False, "table does not exist (or is not a "
                                    "table)", "check the schema and table name, including case",
                                    table))
            continue
        own = options.get(table, columns.NO_OPTIONS)
        findings += _table_checks(conn, table, facts[oid], list(own.key_columns),
                                  list(own.exclude_columns), manage_publication)
        if folding_catalog is not None:
            findings.append(_case_folded_columns(table, facts[oid], list(own.exclude_columns),
                                                 folding_catalog))
        if partition_by.get(table):
            findings.append(_partition_by(conn, table, oid, own, partition_by[table]))
    return findings


# server-level ----------------------------------------------------------------------------

def _setting(conn: psycopg.Connection, name: str) -> str:
    return one_row(conn.execute("SELECT current_setting(%s)", (name,)))[0]


def _server_version(conn: psycopg.Connection) -> Finding:
    version = conn.info.server_version
    if version >= MIN_SERVER_VERSION:
        return Finding("server_version", True, f"PostgreSQL {version // 10000}")
    return Finding("server_version", False,
                   f"PostgreSQL {version // 10000} is too old: lakeslot needs 13 or newer "
                   "(slot health reporting relies on wal_status)", "upgrade the server")


def _wal_level(conn: psycopg.Connection) -> Finding:
    level = _setting(conn, "wal_level")
    if level == "logical":
        return Finding("wal_level", True, "wal_level is logical")
    return Finding("wal_level", False, f"wal_level is {level!r}, logical decoding needs 'logical'",
                   "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL (managed "
                   "services: RDS/Aurora rds.logical_replication = 1, Cloud SQL "
                   "cloudsql.logical_decoding = on, Azure wal_level = logical)")


def _headroom(conn: psycopg.Connection, slot_name: str | None) -> list[Finding]:
    """A free slot for the snapshot's temporary slot (+1 if ours does not exist yet) and free
    WAL senders for the reader and the snapshot leader."""
    max_slots = int(_setting(conn, "max_replication_slots"))
    used_slots, ours = one_row(conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE slot_name = %s) FROM pg_replication_slots",
        (slot_name,)))
    need_slots = 1 if ours else 2
    max_senders = int(_setting(conn, "max_wal_senders"))
    used_senders = one_row(conn.execute("SELECT count(*) FROM pg_stat_replication"))[0]
    findings = []
    for check, setting, limit, used, need in (
        ("replication_slots", "max_replication_slots", max_slots, used_slots, need_slots),
        ("wal_senders", "max_wal_senders", max_senders, used_senders, 2),
    ):
        free = limit - used
        if free >= need:
            findings.append(Finding(check, True, f"{free} of {setting}={limit} free"))
        else:
            findings.append(Finding(
                check, False, f"{setting}={limit} with {used} in use leaves {free}; lakeslot "
                f"needs {need} (the reader and the snapshot)",
                f"ALTER SYSTEM SET {setting} = {used + need + 2}; then restart PostgreSQL"))
    return findings


def _failover(conn: psycopg.Connection, slot_name: str, wanted: bool,
              on_slot_lost: str) -> Finding:
    """Whether a failover keeps the slot (:func:`lakeslot.source.failover.safety`: what the
    primary can tell); asking for a failover slot fails before PostgreSQL 17."""
    version = conn.info.server_version
    if wanted and version < failover.FAILOVER_SLOTS_VERSION:
        return Finding("failover", False, f"source.failoverSlot needs PostgreSQL 17 or newer, "
                       f"this is {version // 10000}",
                       "upgrade the server, or set failoverSlot: false and rely on "
                       "policies.onSlotLost after a failover")
    existing = one_row(conn.execute(
        "SELECT coalesce((SELECT (to_jsonb(s) ->> 'failover')::bool FROM pg_replication_slots s"
        " WHERE slot_name = %s), %s)", (slot_name, wanted)))[0]
    safety = failover.safety(conn, slot_name, failover=existing, on_slot_lost=on_slot_lost)
    return Finding("failover", True, safety.message)


def _replication_privilege(conn: psycopg.Connection) -> Finding:
    user, allowed = one_row(conn.execute(
        """SELECT current_user, r.rolreplication OR r.rolsuper OR EXISTS (
                  SELECT 1 FROM pg_roles m WHERE m.rolname = ANY(%s)
                     AND pg_has_role(current_user, m.oid, 'MEMBER'))
             FROM pg_roles r WHERE r.rolname = current_user""",
        (list(REPLICATION_ROLES),)))
    if allowed:
        return Finding("replication_privilege", True, f"role {user} may replicate")
    return Finding("replication_privilege", False,
                   f"role {quote_ident(user)} lacks the REPLICATION attribute",
                   render_sql(conn, "ALTER ROLE {} WITH REPLICATION;", sql.Identifier(user))
                   + " (RDS/Aurora: GRANT rds_replication TO the role)")


def _create_privilege(conn: psycopg.Connection) -> Finding:
    user, db, allowed = one_row(conn.execute(
        "SELECT current_user, current_database(), "
        "has_database_privilege(current_database(), 'CREATE')"))
    if allowed:
        return Finding("create_privilege", True, f"role {user} may create publications")
    return Finding("create_privilege", False,
                   f"role {quote_ident(user)} cannot create a publication in database "
                   f"{quote_ident(db)}",
                   "have a DBA or the tables' owner create it (CREATE PUBLICATION …, see the "
                   "Managed PostgreSQL page) and set spec.source.publicationManagement: External: "
                   "lakeslot then only verifies it — or "
                   + render_sql(conn, "GRANT CREATE ON DATABASE {} TO {};", sql.Identifier(db),
                                sql.Identifier(user)))


# table-level -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Column:
    name: str
    generated: str  # pg_attribute.attgenerated: '' (not generated), 's' stored, 'v' virtual
    selectable: bool  # SELECT on the column (a column grant or the table's)
    base_type: str  # the type, through domains and arrays to their element (typemap.classify)
    typtype: str


@dataclass(frozen=True)
class _Facts:
    """What the per-table checks read of one table, read for every table at once."""

    oid: int
    user: str
    schema_usage: bool
    identity: str  # relreplident
    identity_key: list[str]  # keys.replica_identity_key
    owner: str
    owned: bool  # current_user may act as the owner
    rows_hidden: bool  # row-level security hides rows from current_user
    columns: list[_Column]  # by attnum
    server_version: int

    def key(self, key_columns: list[str]) -> list[str]:
        """:func:`lakeslot.source.keys.key_of` (the one rule), from these facts."""
        return keys.key_of(key_columns, self.identity_key)

    def unpublished_generated(self) -> dict[str, str]:
        """:func:`lakeslot.source.columns.unpublished_generated_columns`, from these facts."""
        return {c.name: c.generated for c in self.columns if c.generated
                and not columns.publishes_generated(self.server_version, c.generated)}

    def missing(self, names: list[str]) -> list[str]:
        present = {c.name for c in self.columns}
        return [n for n in names if n not in present]


def _facts(conn: psycopg.Connection, oids: list[int]) -> dict[int, _Facts]:
    """The facts of every table checked, in four catalog queries whatever their number (one set
    of queries per table was 12,000 round trips for 1,000 tables, on every reconcile and every
    status)."""
    if not oids:
        return {}
    identity_keys = keys.replica_identity_keys(conn, oids)
    types = {(oid, name): (base, kind) for oid, name, base, kind in conn.execute(
        """WITH RECURSIVE base(attrelid, attname, typid, depth) AS (
               SELECT a.attrelid, a.attname, a.atttypid, 0 FROM pg_attribute a
                WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped
               UNION ALL
               SELECT b.attrelid, b.attname,
                      CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.typelem END, b.depth + 1
                 FROM base b JOIN pg_type t ON t.oid = b.typid
                WHERE t.typtype = 'd' OR (t.typcategory = 'A' AND t.typelem <> 0))
           SELECT DISTINCT ON (b.attrelid, b.attname) b.attrelid::int8, b.attname, t.typname,
                  t.typtype::text
             FROM base b JOIN pg_type t ON t.oid = b.typid
            ORDER BY b.attrelid, b.attname, b.depth DESC""", (oids,))}
    table_columns: dict[int, list[_Column]] = {oid: [] for oid in oids}
    for oid, name, generated, selectable in conn.execute(
            "SELECT attrelid::int8, attname, attgenerated::text,"
            " has_column_privilege(attrelid, attnum, 'SELECT')"
            " FROM pg_catalog.pg_attribute WHERE attrelid = ANY(%s::oid[]) AND attnum > 0"
            " AND NOT attisdropped ORDER BY attrelid, attnum", (oids,)):
        if (oid, name) in types:  # (a column added between the two queries: the next check's)
            table_columns[oid].append(_Column(name, generated, selectable, *types[(oid, name)]))
    version = conn.info.server_version
    return {oid: _Facts(oid, user, usage, identity_keys[oid][0], identity_keys[oid][1], owner,
                        owned, hidden, table_columns[oid], version)
            for oid, user, usage, owner, owned, hidden in conn.execute(
                """SELECT c.oid::int8, current_user, has_schema_privilege(c.relnamespace, 'USAGE'),
                          pg_get_userbyid(c.relowner), pg_has_role(current_user, c.relowner, 'USAGE'),
                          c.relrowsecurity AND NOT (r.rolsuper OR r.rolbypassrls)
                          AND (c.relforcerowsecurity OR NOT pg_has_role(current_user, c.relowner, 'USAGE'))
                     FROM pg_catalog.pg_class c, pg_catalog.pg_roles r
                    WHERE c.oid = ANY(%s::oid[]) AND r.rolname = current_user""", (oids,))
            if oid in identity_keys}


def _table_checks(conn: psycopg.Connection, table: TableName, facts: _Facts, key_columns: list[str],
                  excluded: list[str], manage_publication: bool) -> list[Finding]:
    checks = [_select_privilege(conn, table, facts, excluded),
              _replica_identity(conn, table, facts, key_columns),
              _excluded_columns(table, facts, key_columns, excluded),
              _generated_columns(table, facts, key_columns, excluded),
              _row_level_security(conn, table, facts), *_column_types(table, facts, excluded)]
    if manage_publication:
        checks.append(_ownership(table, facts))
    return checks


def _case_folded_columns(table: TableName, facts: _Facts, excluded: list[str],
                         catalog: str) -> Finding:
    """Columns whose names differ only in case, for a catalog that folds names: it would hold
    them as one column (Spark itself tells them apart: lakeslot's sessions are case-sensitive)."""
    names = [c.name for c in facts.columns if c.name not in excluded]
    folded: dict[str, list[str]] = {}
    for name in names:
        folded.setdefault(name.lower(), []).append(name)
    clashes = [group for group in folded.values() if len(group) > 1]
    if not clashes:
        return Finding("case_folded_columns", True, "no column names differ only in case", table=table)
    return Finding("case_folded_columns", False,
                   f"columns {', '.join(map(repr, clashes[0]))} differ only in case, and a "
                   f"{catalog} catalog stores column names case-insensitively: the mirror could "
                   "not tell them apart",
                   "exclude all but one of them (excludeColumns) or rename them at the source "
                   "(ALTER TABLE … RENAME COLUMN); a hadoop, jdbc or rest catalog keeps them apart",
                   table)


def _select_privilege(conn: psycopg.Connection, table: TableName, facts: _Facts,
                      excluded: list[str]) -> Finding:
    """``SELECT`` on every column the mirror holds — column grants do (the snapshot reads only
    those columns), an excluded or unsent generated column needs none — and ``USAGE`` on the
    schema."""
    left_out = set(excluded) | set(facts.unpublished_generated())
    user, usage = facts.user, facts.schema_usage
    mirrored = [(c.name, c.selectable) for c in facts.columns if c.name not in left_out]
    denied = [name for name, allowed in mirrored if not allowed]
    if usage and not denied:
        return Finding("select_privilege", True, "readable", table=table)
    role = sql.Identifier(user)
    grants = [render_sql(conn, "GRANT USAGE ON SCHEMA {} TO {};", sql.Identifier(table.schema),
                         role)] if not usage else []
    some = len(denied) < len(mirrored)  # some columns granted: grant the others, or exclude them
    if denied:
        columns_sql = (sql.SQL("({}) ").format(sql.SQL(", ").join(map(sql.Identifier, denied)))
                       if some else sql.SQL(""))
        grants.append(render_sql(conn, "GRANT SELECT {}ON {} TO {};", columns_sql, table.sql(),
                                 role))
    what = (f"columns {denied}" if some else "no column granted" if denied else "") + (
        "" if usage else f"{'; ' if denied else ''}no USAGE on schema {quote_ident(table.schema)}")
    return Finding("select_privilege", False,
                   f"role {quote_ident(user)} cannot SELECT from it ({what})",
                   " ".join(grants) + (" — or list those columns in excludeColumns" if some else ""),
                   table)


def _ownership(table: TableName, facts: _Facts) -> Finding:
    """Adding a table to a publication requires owning it (or being superuser)."""
    user, owner = facts.user, facts.owner
    if facts.owned:
        return Finding("ownership", True, "may be added to the publication", table=table)
    return Finding("ownership", False,
                   f"role {quote_ident(user)} does not own it (owner: {quote_ident(owner)}), so it "
                   "cannot add it to a publication",
                   f"have {quote_ident(owner)} (or a DBA) create the publication with the tables "
                   "(see the Managed PostgreSQL page) and set spec.source.publicationManagement: "
                   "External: lakeslot then only verifies it and needs no ownership", table)


def _replica_identity(conn: psycopg.Connection, table: TableName, facts: _Facts,
                      key_columns: list[str]) -> Finding:
    identity, key = facts.identity, facts.identity_key
    check = "replica_identity"
    full = render_sql(conn, "ALTER TABLE {} REPLICA IDENTITY FULL;", table.sql())
    if key_columns:
        missing = facts.missing(key_columns)
        if missing:
            return Finding(check, False, f"configured key columns {missing} do not exist",
                           "fix keyColumns in the spec", table)
        if identity != "f":
            return Finding(check, False, "key columns are configured but the replica identity is "
                           "not FULL, so updates and deletes would not carry them",
                           full + " — or remove keyColumns and use the table's primary key", table)
        return Finding(check, True, f"REPLICA IDENTITY FULL keyed by {key_columns}", table=table)
    if identity in ("d", "i", "f") and key:
        return Finding(check, True, f"keyed by {key}", table=table)
    if identity == "f":
        return Finding(check, False, "REPLICA IDENTITY FULL without a primary key: the mirror "
                       "needs key columns to tell rows apart", "set keyColumns for this table "
                       "in the spec (columns that identify a row)", table)
    what = "REPLICA IDENTITY NOTHING" if identity == "n" else "no primary key"
    return Finding(check, False, f"{what}: updates and deletes cannot be replicated (and adding "
                   "it to a publication would make them fail for the application)",
                   _identity_fix(conn, table, facts.oid, full), table)


def _identity_fix(conn: psycopg.Connection, table: TableName, oid: int, full: str) -> str:
    candidates = [r[0] for r in conn.execute(
        """SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
            WHERE i.indrelid = %s::oid AND i.indisunique AND i.indimmediate
              AND i.indpred IS NULL AND i.indexprs IS NULL
              AND NOT EXISTS (SELECT 1 FROM unnest(i.indkey) k(attnum)
                                JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                               WHERE NOT a.attnotnull)
            ORDER BY 1""", (oid,))]
    if candidates:
        return render_sql(conn, "ALTER TABLE {} REPLICA IDENTITY USING INDEX {};", table.sql(),
                          sql.Identifier(candidates[0]))
    return (render_sql(conn, "ALTER TABLE {} ADD PRIMARY KEY (<columns>);", table.sql())
            + f" — or {full} and set keyColumns in the spec")


def _excluded_columns(table: TableName, facts: _Facts, key_columns: list[str],
                      excluded: list[str]) -> Finding:
    check = "excluded_columns"
    missing = facts.missing(excluded)
    if missing:
        return Finding(check, False, f"excluded columns {missing} do not exist",
                       "fix excludeColumns in the spec", table)
    key = facts.key(key_columns)
    excluded_keys = [c for c in excluded if c in key]
    if excluded_keys:
        return Finding(check, False, f"key columns {excluded_keys} cannot be excluded: the mirror "
                       "needs them to tell rows apart", "remove them from excludeColumns", table)
    return Finding(check, True, f"excluding {excluded}" if excluded else "no column excluded",
                   table=table)


def _generated_columns(table: TableName, facts: _Facts, key_columns: list[str],
                       excluded: list[str]) -> Finding:
    check = "generated_columns"
    left_out = {n: k for n, k in facts.unpublished_generated().items() if n not in excluded}
    if not left_out:
        return Finding(check, True, "no generated column left out", table=table)
    major = facts.server_version // 10000
    key = facts.key(key_columns)
    generated_key = [c for c in key if c in left_out]
    if generated_key:
        return Finding(check, False, f"key columns {generated_key} are generated columns, which "
                       f"PostgreSQL {major} does not send in logical replication",
                       "choose other key columns" + ("" if major >= 18 else
                                                     " (or upgrade to PostgreSQL 18)"), table)
    stored = [n for n, k in left_out.items() if k == "s"]
    virtual = [n for n, k in left_out.items() if k == "v"]
    parts, fixes = [], []
    if stored:
        parts.append(f"stored generated columns {stored} are left out of the mirror: PostgreSQL "
                     f"{major} does not send them in logical replication (18 does)")
        fixes.append("upgrade to PostgreSQL 18, where lakeslot's publication sets "
                     "publish_generated_columns = stored, then re-snapshot the table")
    if virtual:
        parts.append(f"virtual generated columns {virtual} are left out of the mirror: "
                     "logical replication never sends them")
        fixes.append("compute them in queries over the mirror, or re-create them as "
                     "GENERATED ALWAYS AS (…) STORED and re-snapshot the table")
    return Finding(check, True, "; ".join(parts), "; ".join(fixes) + " (to silence this, list "
                   "them in excludeColumns)", table, note=True)


def _row_level_security(conn: psycopg.Connection, table: TableName, facts: _Facts) -> Finding:
    if not facts.rows_hidden:
        return Finding("row_level_security", True, "no row-level security hides rows", table=table)
    return Finding("row_level_security", False,
                   f"row-level security is enabled and role {quote_ident(facts.user)} does not "
                   "bypass it: the snapshot would silently miss rows",
                   render_sql(conn, "ALTER ROLE {} BYPASSRLS;", sql.Identifier(facts.user))
                   + " (as a superuser) — or "
                   + render_sql(conn, "ALTER TABLE {} DISABLE ROW LEVEL SECURITY;", table.sql()),
                   table)


def _column_types(table: TableName, facts: _Facts, excluded: list[str]) -> list[Finding]:
    findings = []
    for column in sorted(facts.columns, key=lambda c: c.name):
        if column.name in excluded:
            continue
        kind, reason = typemap.classify(column.base_type, column.typtype)
        if kind is typemap.Kind.UNSUPPORTED:
            findings.append(Finding(
                "column_types", False, f"column {quote_ident(column.name)}: unsupported type "
                f"{column.base_type}: {reason}", "exclude the column in the spec (excludeColumns)",
                table))
    return findings or [Finding("column_types", True, "every column type is supported",
                                table=table)]


def _partition_by(conn: psycopg.Connection, table: TableName, oid: int,
                  options: columns.ColumnOptions, fields: Sequence[PartitionField]) -> Finding:
    """Every ``partitionBy`` field names a column the mirror has, of a type its transform takes
    (decided on the mirror's Iceberg types: :func:`lakeslot.api.partitioning.type_problems`)."""
    check = "partition_by"
    try:
        mapped = columns.describe(conn, oid, options)
    except (typemap.MappingError, columns.DescribeError):
        # the key, column and type checks above report it; the spec is checked once they pass
        return Finding(check, True, "partitionBy not checked until the table's other checks pass",
                       table=table)
    left_out = dict.fromkeys(options.exclude_columns, "excluded (excludeColumns)")
    left_out.update((c, "a generated column logical replication does not send here")
                    for c in columns.unpublished_generated_columns(conn, oid) if c not in left_out)
    problems = partitioning.type_problems(
        fields, {c.name: c.iceberg(0) for c in mapped}, left_out=left_out,
        source_types={c.name: c.pg.name + "[]" * c.pg.array for c in mapped})
    if problems:
        return Finding(check, False, "; ".join(f"partitionBy {p.field}: {p.problem}"
                                               for p in problems),
                       "; ".join(dict.fromkeys(p.fix for p in problems))
                       + " (spec.source.tables[].partitionBy of this table)", table)
    return Finding(check, True, "partitioned by " + ", ".join(f.canonical for f in fields),
                   table=table)
