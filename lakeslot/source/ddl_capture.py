"""DDL in the change stream: lakeslot's event trigger and the messages it writes into the WAL.

Where the ingestion's role may create event triggers (a superuser), lakeslot installs one
function and three event triggers per database (:func:`install`). For every DDL command on a
table (``ddl_command_end``), every dropped table (``sql_drop``) and every table rewrite
(``table_rewrite``) the function writes a **transactional** logical message
(``pg_logical_emit_message(true, 'lakeslot', …)``): decoded at its exact place in the commit
order, inside the DDL's own transaction, between the row changes before and after it. The reader
stages it like any change; the apply job (:mod:`lakeslot.apply.ddl`) replays the table's
definition from it, so a rename, an added column or a widened type is applied to the mirror at
the very change where it happened, and everything else is a re-snapshot of that table.

A ``ddl`` message describes the table *after* the command (:class:`DdlEvent`): OID, name, kind,
partition root, every column (``attnum``, name, type OID and modifier, the "missing value"
existing rows got from an added column's constant default, generated or not), the leaf
partitions with their ``relfilenode``, and whether the statement text holds ``USING`` (then a
type change may have changed values). ``rewrite`` says the table's rows were rewritten by the
statement (a volatile default, ALTER … TYPE, SET ACCESS METHOD…); ``drop`` names a dropped table;
``error`` says the trigger could not describe a command (the apply job then checks every table
against the catalog, as without the trigger).

Invariants and failure modes:

- The trigger never breaks the user's DDL: any error inside it becomes an ``error`` message.
- Only lakeslot's own function can write a valid message: ``pg_logical_emit_message`` is
  executable by every role, so each message carries a random key held in ``_lakeslot.capture``,
  readable only by its owner and the roles lakeslot grants it to; a message with another key is
  ignored (:func:`parse`) — an ordinary user cannot fake a rename.
- The mode is decided per table by its recorded source facts: a mirror snapshotted while the
  trigger existed follows the messages only while the same trigger (OID) is still installed and
  enabled (:func:`state`); otherwise it falls back to comparing the catalog
  (:mod:`lakeslot.source.facts`), conservatively: when in doubt, re-snapshot.
- A command on an inheritance parent that recurses to its children (ADD/DROP/RENAME COLUMN,
  ALTER … TYPE) is reported by PostgreSQL for the parent only; the function describes each
  descendant too (not partitions: they are published through their root), so every child's
  mirror follows it like its parent's. The function carries :data:`VERSION_MARK`: an older one
  (without it) does not count as installed (:func:`state`), and :func:`ensure` replaces it in
  place, keeping the triggers and their OIDs (mirrors go on following the messages); a role that
  may not replace it gets the ``Catalog`` mode until a superuser installs the current one.
- ``TRUNCATE`` fires no event trigger; a plain table's TRUNCATE is in the stream anyway, a
  partition's is found by its ``relfilenode`` (:mod:`lakeslot.source.facts`).
- Installing needs a superuser (PostgreSQL's rule for event triggers); :func:`ensure` reports
  which mode applies and what would enable the precise one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

PREFIX = "lakeslot"
SCHEMA = "_lakeslot"
TRIGGERS = {"lakeslot_ddl_end": "ddl_command_end", "lakeslot_sql_drop": "sql_drop",
            "lakeslot_table_rewrite": "table_rewrite"}
MAIN_TRIGGER = "lakeslot_ddl_end"
# in the function's body: an installed function without it is an older one (see _outdated)
VERSION_MARK = "lakeslot capture_ddl v2"
Mode = Literal["EventTrigger", "Catalog"]

_FUNCTION = r"""
CREATE OR REPLACE FUNCTION _lakeslot.capture_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  -- lakeslot capture_ddl v2: inheritance descendants
  r record;
  k text := (SELECT key FROM _lakeslot.capture LIMIT 1);
BEGIN
  IF tg_event = 'table_rewrite' THEN
    PERFORM pg_logical_emit_message(true, 'lakeslot', json_build_object(
      'v', 1, 'key', k, 'event', 'rewrite', 'tag', tg_tag,
      'oid', pg_event_trigger_table_rewrite_oid()::int8,
      'reason', pg_event_trigger_table_rewrite_reason())::text);
  ELSIF tg_event = 'sql_drop' THEN
    FOR r IN SELECT d.objid, d.schema_name, d.object_name FROM pg_event_trigger_dropped_objects() d
              WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0
                AND d.object_type IN ('table') LOOP
      PERFORM pg_logical_emit_message(true, 'lakeslot', json_build_object(
        'v', 1, 'key', k, 'event', 'drop', 'tag', tg_tag, 'oid', r.objid::int8,
        'schema', r.schema_name, 'name', r.object_name)::text);
    END LOOP;
  ELSE
    -- the tables the command named, and their inheritance descendants (not partitions): an
    -- ALTER TABLE on a parent changes its children too, and reports only the parent
    FOR r IN WITH RECURSIVE touched(oid) AS (
               SELECT d.objid FROM pg_event_trigger_ddl_commands() d
                WHERE d.classid = 'pg_class'::regclass
               UNION
               SELECT i.inhrelid FROM pg_inherits i JOIN touched t ON i.inhparent = t.oid
                 JOIN pg_class k ON k.oid = i.inhrelid
                WHERE NOT k.relispartition)
             SELECT DISTINCT c.oid, c.relfilenode, c.relname, c.relkind, c.relispartition, n.nspname
               FROM touched d
               JOIN pg_class c ON c.oid = d.oid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE c.relkind IN ('r', 'p') LOOP
      PERFORM pg_logical_emit_message(true, 'lakeslot', json_build_object(
        'v', 1, 'key', k, 'event', 'ddl', 'tag', tg_tag, 'oid', r.oid::int8,
        'schema', r.nspname, 'name', r.relname, 'kind', r.relkind,
        'root', CASE WHEN r.relispartition THEN pg_partition_root(r.oid)::oid::int8 END,
        'relfilenode', r.relfilenode::int8,
        'using', coalesce(current_query() ~* '\musing\M', true),
        'columns', (SELECT coalesce(json_agg(json_build_array(
                      a.attnum, a.attname, a.atttypid::int8, a.atttypmod,
                      CASE WHEN a.atthasmissing THEN a.attmissingval::text END, t.typdelim::text,
                      a.attgenerated <> '') ORDER BY a.attnum), '[]')
                      FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                     WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped),
        'partitions', CASE WHEN r.relkind = 'p' THEN (
                       SELECT coalesce(json_agg(json_build_array(l.oid::int8, l.relfilenode::int8)
                                                ORDER BY l.oid), '[]')
                         FROM pg_partition_tree(r.oid) p JOIN pg_class l ON l.oid = p.relid
                        WHERE p.isleaf) END)::text);
    END LOOP;
  END IF;
EXCEPTION WHEN OTHERS THEN
  PERFORM pg_logical_emit_message(true, 'lakeslot', json_build_object(
    'v', 1, 'key', k, 'event', 'error', 'tag', tg_tag, 'error', SQLERRM)::text);
END
$fn$
"""


@dataclass(frozen=True)
class Capture:
    """lakeslot's event trigger in a database: the OID of its main trigger and the message key."""

    trigger: int
    key: str


@dataclass(frozen=True)
class SourceColumn:
    attnum: int
    name: str
    type_oid: int
    type_modifier: int
    missing: str | None  # attmissingval as array text ({value}); None: no missing value
    delimiter: str
    generated: bool


@dataclass(frozen=True)
class DdlEvent:
    """One message of the trigger, at its place in the stream (``lsn``: its transaction's commit
    LSN, ``seq``: its place in the transaction)."""

    lsn: int
    seq: int
    event: str  # ddl | rewrite | drop | error
    tag: str
    oid: int | None = None
    schema: str | None = None
    name: str | None = None
    kind: str | None = None  # r (table) | p (partitioned)
    root: int | None = None  # a partition's root
    relfilenode: int | None = None
    using: bool = True
    columns: tuple[SourceColumn, ...] = ()
    partitions: tuple[tuple[int, int], ...] | None = None  # (leaf, relfilenode), partitioned only
    error: str | None = None

    @property
    def position(self) -> tuple[int, int]:
        return (self.lsn, self.seq)


def parse(lsn: int, seq: int, content: bytes, key: str) -> DdlEvent | None:
    """The event of a ``lakeslot`` message; None (logged) when it does not carry ``key``."""
    document = json.loads(content)
    if not isinstance(document, dict) or document.get("key") != key:
        log.warning("a logical message with prefix %r at %X/%X does not carry this database's "
                    "capture key: ignored (not written by lakeslot's trigger)", PREFIX,
                    lsn >> 32, lsn & 0xFFFFFFFF)
        return None
    return DdlEvent(
        lsn, seq, str(document["event"]), str(document.get("tag") or ""),
        oid=document.get("oid"), schema=document.get("schema"), name=document.get("name"),
        kind=document.get("kind"), root=document.get("root"),
        relfilenode=document.get("relfilenode"),
        using=bool(document.get("using", True)),
        columns=tuple(SourceColumn(int(a), str(n), int(t), int(m), v, str(d or ","), bool(g))
                      for a, n, t, m, v, d, g in document.get("columns") or ()),
        partitions=(tuple((int(o), int(f)) for o, f in document["partitions"])
                    if document.get("partitions") is not None else None),
        error=document.get("error"))


def may_install(conn: psycopg.Connection) -> bool:
    """Whether the session's role is a superuser (who may create event triggers; managed
    services' admin roles may too: :func:`ensure` simply tries)."""
    row = conn.execute("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user"
                       ).fetchone()
    return bool(row and row[0])


def state(conn: psycopg.Connection) -> Capture | None:
    """The installed capture, when all three triggers exist and are enabled, run the current
    function (an older one misses inheritance children: :func:`ensure` replaces it) and the key
    is readable by this role; None otherwise."""
    rows = conn.execute(
        "SELECT e.evtname, e.oid::int8 FROM pg_catalog.pg_event_trigger e"
        " JOIN pg_catalog.pg_proc p ON p.oid = e.evtfoid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace"
        " WHERE e.evtname = ANY(%s) AND e.evtenabled <> 'D'"
        " AND n.nspname = %s AND p.proname = 'capture_ddl' AND strpos(p.prosrc, %s) > 0",
        (list(TRIGGERS), SCHEMA, VERSION_MARK)).fetchall()
    found: dict[str, int] = dict(rows)
    if set(found) != set(TRIGGERS):
        return None
    readable = conn.execute(
        "SELECT has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid, 'SELECT')"
        " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = 'capture'", (SCHEMA,)).fetchone()
    if not readable or not readable[0]:
        return None
    key = conn.execute("SELECT key FROM _lakeslot.capture LIMIT 1").fetchone()
    return Capture(int(found[MAIN_TRIGGER]), key[0]) if key else None


def install_statements(grant_to: str | None = None) -> list[sql.SQL | sql.Composed]:
    """The statements that install (or repair) the capture; idempotent. The key is kept when it
    exists (messages already in the WAL carry it). ``grant_to``: the ingestion's role, when
    another role (a superuser) installs it."""
    schema = sql.Identifier(SCHEMA)
    statements: list[sql.SQL | sql.Composed] = [
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema),
        sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(schema),
        sql.SQL("CREATE TABLE IF NOT EXISTS _lakeslot.capture (key text NOT NULL)"),
        sql.SQL("REVOKE ALL ON _lakeslot.capture FROM PUBLIC"),
        sql.SQL("INSERT INTO _lakeslot.capture SELECT gen_random_uuid()::text WHERE"
                " NOT EXISTS (SELECT FROM _lakeslot.capture)"),
        sql.SQL(_FUNCTION.strip()),
    ]
    for name, event in TRIGGERS.items():
        statements += [
            sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(name)),
            sql.SQL("CREATE EVENT TRIGGER {} ON {} EXECUTE FUNCTION _lakeslot.capture_ddl()")
            .format(sql.Identifier(name), sql.Identifier(event))]
    if grant_to is not None:
        role = sql.Identifier(grant_to)
        statements += [sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, role),
                       sql.SQL("GRANT SELECT ON _lakeslot.capture TO {}").format(role)]
    return statements


def uninstall_statements() -> list[sql.Composed]:
    """The statements that remove the capture (triggers, function, key). Mirrors that followed
    its messages then compare the catalog (their recorded trigger is gone)."""
    schema = sql.Identifier(SCHEMA)
    return [*(sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(name))
              for name in TRIGGERS),
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema)]


def script(statements: Sequence[sql.Composable]) -> str:
    """``statements`` as one transaction for psql (``lakeslot ddl-capture-sql``)."""
    body = ";\n".join(s.as_string(None) for s in statements)
    return f"BEGIN;\n{body};\nCOMMIT;\n"


def install(conn: psycopg.Connection) -> Capture:
    """Install (or repair) the capture in the connection's database, in one transaction.
    Raises ``psycopg.errors.InsufficientPrivilege`` when the role may not."""
    with conn.transaction():
        for statement in install_statements():
            conn.execute(statement)
    capture = state(conn)
    assert capture is not None  # just installed in one transaction
    return capture


@dataclass(frozen=True)
class ModeReport:
    mode: Mode
    message: str


CATALOG_FALLBACK = ("schema changes are detected by comparing the catalog on every apply pass: "
                    "renames, rewrites, drops and partition changes re-snapshot the table")
PRECISE = ("schema changes are captured in the stream by lakeslot's event trigger: renames, added "
           "columns and widened types are applied in place; anything that changes values "
           "re-snapshots the table")
ENABLE = ("a superuser can install the trigger once for this database: `lakeslot ddl-capture-sql "
          "--grant-to <role>` prints the statements to run in psql")


def ensure(conn: psycopg.Connection, setting: str, *, read_only: bool = False) -> ModeReport:
    """Install the capture when ``setting`` (``spec.source.ddlCapture``) asks for it and the role
    may (tried, not guessed: managed services' admin roles may); report the mode in force.
    ``EventTrigger`` that cannot be had raises :class:`CaptureUnavailable`."""
    if setting == "Catalog":
        return ModeReport("Catalog", CATALOG_FALLBACK + " (ddlCapture: Catalog)")
    outdated = _outdated(conn)
    if outdated and not read_only:
        outdated = not _replace_function(conn)
    current = state(conn)
    why = "the event trigger is not installed"
    if outdated:
        why = ("the installed event trigger's function is an older version, which does not "
               "describe the inheritance children of an altered table; "
               + ("the next run replaces it where its role may" if read_only
                  else "the role may not replace it"))
    if current is None and not read_only and not outdated:
        try:
            current = install(conn)
        except psycopg.errors.InsufficientPrivilege as e:
            why = f"the role may not install the event trigger ({str(e).strip().splitlines()[0]})"
    elif current is None and not outdated and not may_install(conn):
        why = "the role is not a superuser, who may install the event trigger"
    if current is not None:
        return ModeReport("EventTrigger", PRECISE)
    if setting == "EventTrigger":
        raise CaptureUnavailable(f"ddlCapture is EventTrigger but {why}; {ENABLE}; or set "
                                 "ddlCapture: Auto to fall back to comparing the catalog")
    return ModeReport("Catalog", f"{CATALOG_FALLBACK} ({why}; for the precise mode, {ENABLE})")


def _outdated(conn: psycopg.Connection) -> bool:
    """Whether lakeslot's function is installed in an older version (without
    :data:`VERSION_MARK`)."""
    row = conn.execute("SELECT p.prosrc FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n"
                       " ON n.oid = p.pronamespace WHERE n.nspname = %s"
                       " AND p.proname = 'capture_ddl'", (SCHEMA,)).fetchone()
    return row is not None and VERSION_MARK not in row[0]


def _replace_function(conn: psycopg.Connection) -> bool:
    """Replace an older function in place: the triggers (and their OIDs, which the mirrors
    recorded) stay, so the mirrors go on following the messages. False when the role may not
    (the function's owner or a superuser may): the mode is then ``Catalog``."""
    try:
        with conn.transaction():
            conn.execute(sql.SQL(_FUNCTION.strip()))
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


class CaptureUnavailable(Exception):
    """``ddlCapture: EventTrigger`` and the trigger cannot be installed."""
