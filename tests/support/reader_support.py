"""Helpers for the replication reader tests: set up a publication and slot, run the reader in
process or as a real ``lakeslot reader`` subprocess, read staged rows back, and read the same
slot position through ``test_decoding`` (an independent decoder) for comparison."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import sql

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.reader import reader
from lakeslot.reader.metrics import Metrics
from lakeslot.source import connection, slot
from lakeslot.staging import segments
from lakeslot.staging.relations import Relation
from lakeslot.staging.store import Staging
from tests.support.fixtures_pg import connection_settings

INGESTION = "tests/orders"
POD = "reader-pod-0"
APP_NAME = connection.application_name("reader", INGESTION, POD)
LAKESLOT = str(Path(sys.executable).with_name("lakeslot"))


def current_lsn(conn) -> int:
    return conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::int8").fetchone()[0]


def slot_health(conn, slot_name: str = "s") -> slot.SlotHealth:
    """What PostgreSQL knows about the slot; fails the test when it does not exist."""
    health = slot.health(conn, slot_name)
    assert health is not None, f"slot {slot_name} does not exist"
    return health


def confirmed_flush(conn, slot_name: str = "s") -> int:
    """The slot's confirmed_flush_lsn; fails the test when the slot has none."""
    lsn = slot_health(conn, slot_name).confirmed_flush_lsn
    assert lsn is not None, f"slot {slot_name} has no confirmed_flush_lsn"
    return lsn


def prepare(conn, tables: list[TableName], *, slot_name: str = "s", publication: str = "p") -> int:
    """Publication ``publication`` for ``tables`` and the permanent slot; returns its LSN."""
    conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
        sql.Identifier(publication), sql.SQL(", ").join(t.sql() for t in tables)))
    slot.ensure(conn, slot_name)
    return confirmed_flush(conn, slot_name)


def copy_slot(conn, source: str, target: str, plugin: str = "pgoutput") -> None:
    """A second slot at exactly the same position (reads the same WAL)."""
    conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s, false, %s)",
                 (source, target, plugin))


def config(pgdb, staging: str, **overrides) -> reader.ReaderConfig:
    settings = connection_settings(pgdb)
    settings = settings.__class__(**{**vars(settings), "extra": {"client_encoding": "UTF8"}})
    base = reader.ReaderConfig(ingestion=INGESTION, slot="s", publication="p", staging_uri=staging,
                               settings=settings, pod=POD, segment_max_seconds=3600.0)
    return dataclasses.replace(base, **overrides)


def read_until(pgdb, staging: str, stop_at: int, metrics: Metrics | None = None,
               **overrides) -> int:
    """Run the reader in this process until everything up to ``stop_at`` is sealed."""
    durable = reader.run(config(pgdb, staging, stop_at=stop_at, **overrides),
                         stop=threading.Event(), metrics=metrics or Metrics())
    assert durable is not None and durable >= stop_at
    return durable


@dataclass
class Background:
    """The reader in a thread of this process (for tests that need it running)."""

    thread: threading.Thread
    stop: threading.Event
    metrics: Metrics
    result: dict[str, Any] = field(default_factory=dict)

    def finish(self, timeout: float = 60.0) -> int:
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the reader did not stop"
        if "error" in self.result:
            raise self.result["error"]
        return self.result["durable"]


def start_in_background(pgdb, staging: str, **overrides) -> Background:
    stop, metrics = threading.Event(), Metrics()
    result: dict[str, Any] = {}  # "durable": int | None, or "error": BaseException

    def target():
        try:
            result["durable"] = reader.run(config(pgdb, staging, **overrides), stop=stop,
                                           metrics=metrics)
        except BaseException as e:  # noqa: BLE001 - re-raised by finish()
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return Background(thread, stop, metrics, result)


def spawn(pgdb, staging: str, log: Path, *args: str, slot_name: str = "s",
          publication: str = "p", pod: str = POD) -> subprocess.Popen:
    """``lakeslot reader`` as a real process (its JSON log lines go to ``log``); the password
    travels in the environment only."""
    env = {**os.environ, reader.PASSWORD_ENV: pgdb.cluster.password}
    env.pop("PGPASSWORD", None)
    argv = [LAKESLOT, "reader", "--ingestion", INGESTION, "--slot", slot_name,
            "--publication", publication, "--staging", staging, "--host", "127.0.0.1",
            "--port", str(pgdb.cluster.port), "--dbname", pgdb.name,
            "--user", pgdb.cluster.superuser, "--pod", pod, *args]
    assert pgdb.cluster.password not in " ".join(argv)
    with open(log, "ab") as stderr:
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def holder(conn, slot_name: str = "s") -> str | None:
    health = slot.health(conn, slot_name)
    return health.holder if health and health.active else None


# staged rows ---------------------------------------------------------------------------------

def new_tuple(row: segments.Row) -> dict:
    """``row.new``; fails the test when the row has no new tuple."""
    assert row.new is not None, f"{row.op} row without a new tuple: {row}"
    return row.new


def relation_of(row: segments.Row) -> Relation:
    """``row.relation``; fails the test when the row has no relation."""
    assert row.relation is not None, f"{row.op} row without a relation: {row}"
    return row.relation


def staged(staging: str) -> tuple[list[segments.SegmentName], list[segments.Row]]:
    """Every sealed segment (checked to chain without gap or overlap) and all their rows."""
    store = Staging(staging)
    names = store.list()
    for previous, following in itertools.pairwise(names):
        assert following.start == previous.end, f"segments {previous} and {following} do not chain"
    rows = [row for name in names for row in store.read(name).rows()]
    return names, rows


@dataclass(frozen=True)
class Change:
    """A change in a plugin-neutral form, for comparisons."""

    table: tuple[str, ...]
    op: str
    new: dict | None = None
    old: dict | None = None  # only the columns the old tuple really carries


Message = tuple[str, str | None, bytes | None]  # ("M", prefix, content)
Transaction = tuple[int | None, list[Change | Message]]


def transactions(rows: list[segments.Row]) -> list[Transaction]:
    """``(end_lsn, [Change or ('M', prefix, content)])`` per staged transaction, in order; a
    non-transactional message stands alone as ``(None, [message])``. Old tuples keep only the
    columns they carry and are not NULL (what test_decoding prints)."""
    result: list[Transaction] = []
    current: list[Change | Message] = []
    for row in rows:
        if row.op == "C":
            result.append((row.end_lsn, current))
            current = []
        elif row.op == "M":
            message = ("M", row.prefix, row.content)
            if row.transactional:
                current.append(message)
            else:
                result.append((None, [message]))
        elif row.op == "T":
            relation = relation_of(row)
            current.append(Change((relation.schema, relation.table), "T"))
        else:
            relation = relation_of(row)
            old = None if row.old is None else {
                k: v for k, v in row.old.items() if v is not segments.NOT_IN_KEY and v is not None}
            current.append(Change((relation.schema, relation.table), row.op, row.new, old))
    assert current == [], "rows after the last commit"
    return result


# test_decoding: an independent decoder over the same WAL -------------------------------------

_IDENT = r'(?:"(?:[^"]|"")*"|[^\s.:"\[]+)'
_QUALIFIED = re.compile(rf"({_IDENT})\.({_IDENT})(, |: )")


def _unquote(ident: str) -> str:
    return ident[1:-1].replace('""', '"') if ident.startswith('"') else ident


def _fields(text: str) -> dict:
    """``name[type]:value ...`` of test_decoding into ``{name: text | None | UNCHANGED}``."""
    values, pos = {}, 0
    while pos < len(text):
        m = re.compile(rf"({_IDENT})\[").match(text, pos)
        assert m, f"cannot parse test_decoding fields at {text[pos:]!r}"
        name = _unquote(m.group(1))
        pos = text.index("]:", m.end()) + 2
        value: object  # text, None or segments.UNCHANGED_TOAST
        if text[pos] == "'":
            end = pos + 1
            while True:
                end = text.index("'", end)
                if text[end + 1:end + 2] == "'":
                    end += 2
                    continue
                break
            value = text[pos + 1:end].replace("''", "'")
            pos = end + 1
        else:
            end = text.find(" ", pos)
            end = len(text) if end < 0 else end
            raw = text[pos:end]
            value = {"null": None, "unchanged-toast-datum": segments.UNCHANGED_TOAST}.get(raw, raw)
            pos = end
        values[name] = value
        pos += 1 if text[pos:pos + 1] == " " else 0
    return values


def decoded_by_test_decoding(conn, slot_name: str, upto: int,
                             published: set[tuple[str, str]]) -> list[Transaction]:
    """The transactions ``test_decoding`` decodes from ``slot_name`` up to ``upto``, restricted
    to ``published`` tables, as :func:`transactions` returns them (messages included)."""
    rows = conn.execute(
        "SELECT (lsn - '0/0')::int8, data FROM pg_logical_slot_peek_changes(%s, %s::pg_lsn, NULL,"
        " 'include-xids', '0', 'skip-empty-xacts', '1')",
        (slot_name, lsn_text.format(upto))).fetchall()
    result: list[Transaction] = []
    current: list[Change | Message] = []
    for lsn, data in rows:
        if data == "BEGIN":
            current = []
        elif data == "COMMIT":
            if current:
                result.append((lsn, current))
        elif data.startswith("message:"):
            m = re.fullmatch(r"message: transactional: (\d) prefix: (.*), sz: (\d+) content:(.*)",
                             data, re.S)
            assert m, f"cannot parse test_decoding message {data!r}"
            if m.group(1) == "1":
                current.append(("M", m.group(2), m.group(4).encode()))
            else:
                result.append((None, [("M", m.group(2), m.group(4).encode())]))
        else:
            current.extend(_change(data, published))
    return result


def _change(data: str, published: set[tuple[str, str]]) -> list[Change]:
    tables, pos = [], len("table ")
    while True:  # TRUNCATE lists several tables: "table a.b, c.d: TRUNCATE: ..."
        m = _QUALIFIED.match(data, pos)
        assert m, f"cannot parse test_decoding table name at {data[pos:]!r}"
        tables.append((_unquote(m.group(1)), _unquote(m.group(2))))
        pos = m.end()
        if m.group(3) == ": ":
            break
    op, _, rest = data[pos:].partition(": ")
    if op == "TRUNCATE":
        return [Change(t, "T") for t in tables if t in published]
    if tables[0] not in published:
        return []
    table = tables[0]
    if op == "INSERT":
        return [Change(table, "I", _fields(rest))]
    if op == "DELETE":
        return [Change(table, "D", None, _fields(rest))]
    assert op == "UPDATE", data
    if rest.startswith("old-key: "):
        old, _, new = rest[len("old-key: "):].partition(" new-tuple: ")
        return [Change(table, "U", _fields(new), _fields(old))]
    return [Change(table, "U", _fields(rest), None)]
