"""Helpers for the local-mode tests: an ingestion file for a test database, ``lakeslot run`` as a
real process (password in its environment only) or in the test's process (on its Spark session),
a concurrent write workload, damage to a mirror as a bug would do it, and the process tree and
slots to check that nothing is left behind."""

from __future__ import annotations

import functools
import io
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from psycopg import sql

from lakeslot import workloads
from lakeslot.api.naming import TableName
from lakeslot.local import config, run, state
from lakeslot.mirror import progress
from lakeslot.mirror.contract import LSN_PROPERTY
from lakeslot.spark.session import with_commit_properties
from tests.support import operator_env
from tests.support.waiting import wait_for

LAKESLOT = str(Path(sys.executable).with_name("lakeslot"))
ACCOUNTS = TableName("public", "accounts")
ITEMS = TableName("public", "items")
RUN_DEADLINE_S = 300
T = TypeVar("T")


def create_accounts(conn, rows: int) -> TableName:
    conn.execute("CREATE TABLE accounts (id bigint PRIMARY KEY, balance int NOT NULL, "
                 "note text, changed timestamptz DEFAULT now())")
    conn.execute("INSERT INTO accounts (id, balance, note) SELECT i, mod(i, 1000), repeat('x', 40) "
                 "FROM generate_series(1, %s) AS i", (rows,))
    conn.execute("ANALYZE accounts")
    return ACCOUNTS


def create_accounts_and_items(conn, accounts: int, items: int) -> list[TableName]:
    """:func:`create_accounts` and ``public.items`` (``id int PRIMARY KEY, v text``) with that
    many rows each."""
    conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    conn.execute("INSERT INTO items SELECT g, repeat('i', 50) || g FROM generate_series(1, %s) g", (items,))
    conn.execute("ANALYZE items")
    return [create_accounts(conn, accounts), ITEMS]


def change_accounts_and_items(conn) -> None:
    """Updates, inserts (above the largest key) and deletes in the tables of
    :func:`create_accounts_and_items`."""
    conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id % 7 = 0")
    conn.execute("INSERT INTO accounts (id, balance, note) SELECT top + g, top + g, 'new' "
                 "FROM (SELECT max(id) AS top FROM accounts) m, generate_series(1, 100) g")
    conn.execute("DELETE FROM accounts WHERE id BETWEEN 100 AND 150")
    conn.execute("UPDATE items SET v = v || '!' WHERE id % 3 = 0")


def write_ingestion(path: Path, db, tables: list[TableName], tmp_path: Path,
                    source: dict | None = None, warehouse: Path | None = None) -> dict:
    """``source``: fields merged into spec.source (camelCase); ``warehouse``: default
    ``tmp_path/warehouse`` (a run in this process writes where the tests' Spark session does:
    pass its ``spark_warehouse``)."""
    document = operator_env.ingestion_document(
        "local-test", db, tables, warehouse=(warehouse or tmp_path / "warehouse").as_uri(),
        staging=(tmp_path / "staging").as_uri(),
        snapshot={"parallelism": 2, "targetRangeBytes": 1 << 20},
        apply={"triggerIntervalSeconds": 1})
    document["spec"]["staging"]["retentionSeconds"] = 0
    document["spec"]["source"].update(source or {})
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    return document


def local(path: Path, db, state_dir: Path) -> config.Local:
    return config.load(str(path), state_dir=str(state_dir),
                       environ={workloads.PASSWORD_ENV: db.cluster.password})


def run_env(db) -> dict[str, str]:
    """The environment of a lakeslot process: the password in it, and only there."""
    env = {**os.environ, workloads.PASSWORD_ENV: db.cluster.password}
    env.pop("PGPASSWORD", None)
    return env


def spawn_run(path: Path, db, state_dir: Path, log: Path, *args: str,
              environ: Mapping[str, str] | None = None) -> subprocess.Popen:
    """``lakeslot run --plain -f path`` with the password in its environment only (and
    ``environ``: further variables, e.g. object-store keys)."""
    env = {**run_env(db), **(environ or {})}
    argv = [LAKESLOT, "run", "--plain", "-f", str(path), "--state-dir", str(state_dir), *args]
    assert db.cluster.password not in " ".join(argv)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=out)


def run_in_process(local: config.Local, spark, *, once: bool,
                   during: Callable[[], T] | None = None, expect: int = 0,
                   **options: Any) -> tuple[run.Result, T | None]:
    """``lakeslot run`` in this process, on the tests' Spark session (no JVM to start). With
    ``during``: streaming while ``during`` runs in a thread, then stopped with SIGTERM as a user
    would stop it (a stand-in handler absorbs a signal that comes after the run ended) — unless
    the run ended by itself first. ``expect``: the run's exit code (asserted).
    ``options``: further :class:`run.Options` (``out``: where the run writes its lines)."""
    outcome: dict[str, Any] = {}
    finished = threading.Event()  # run.run returned or raised: no signal may follow it

    def background() -> None:
        try:
            wait_for(lambda: state.run_active(local.state_dir) or finished.is_set(),
                     "the run to start")
            assert during is not None
            if not finished.is_set():
                outcome["value"] = during()
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the test's thread
            outcome["error"] = e
        finally:
            if not finished.is_set():  # (a run that failed to start must not stop a later one)
                os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    thread = threading.Thread(target=background, daemon=True) if during else None
    try:
        if thread is not None:
            thread.start()
        result = run.run(local, run.Options(once=once, spark=spark, out=options.pop("out", None) or io.StringIO(),
                                            interactive=False, **options))
        if thread is not None:
            thread.join(RUN_DEADLINE_S)
    finally:
        finished.set()
        signal.signal(signal.SIGTERM, previous)
    if "error" in outcome:
        raise outcome["error"]
    assert result.code == expect, result.message
    return result, outcome.get("value")


def mirror_name(local: config.Local, table: TableName) -> str:
    """The mirror of ``table`` in Spark SQL (catalog ``lakeslot``)."""
    namespace, name = local.job.names.mirror_identifier(table)
    return f"lakeslot.`{namespace}`.`{name}`"


def commit_as_pipeline(spark, local: config.Local, table: TableName, statement: str) -> None:
    """Run ``statement`` (Spark SQL on the mirror of ``table``) in one commit that keeps the
    table's ``lakeslot.lsn``, so the pipeline takes it for its own: how a bug would damage it."""
    position = progress.read(local.ingestion, [table])[table].lsn
    assert position is not None
    with_commit_properties(spark, {LSN_PROPERTY: str(position)},
                           functools.partial(_collect, spark, statement))


def _collect(spark, statement: str) -> list:
    return spark.sql(statement).collect()


class BackgroundWriter:
    """One transaction (:meth:`write`, with a seeded random and a fresh key from 10,000,000 up)
    every ``pause`` seconds, in a thread, until :meth:`stop`, which re-raises its error."""

    def __init__(self, db, *, seed: int, pause: float) -> None:
        self.db, self.seed, self.pause = db, seed, pause
        self.stopping = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def write(self, conn, rng: random.Random, next_id: int) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        rng, next_id = random.Random(self.seed), 10_000_000
        try:
            with self.db.connect() as conn:
                while not self.stopping.wait(self.pause):
                    with conn.transaction():
                        self.write(conn, rng, next_id)
                    next_id += 1
                    self.transactions += 1
        except BaseException as e:  # noqa: BLE001 - re-raised by stop()
            self.error = e

    def stop(self) -> int:
        self.stopping.set()
        self.thread.join(60)
        if self.error is not None:
            raise self.error
        return self.transactions


class Workload(BackgroundWriter):
    """Inserts, updates and deletes on ``tables`` (``id`` the key) in a thread until stopped."""

    def __init__(self, db, tables: list[TableName], columns: dict[TableName, str]) -> None:
        self.tables, self.columns = tables, columns
        super().__init__(db, seed=5, pause=0.01)

    def write(self, conn, rng: random.Random, next_id: int) -> None:
        for table in self.tables:
            column = sql.Identifier(self.columns[table])
            conn.execute(sql.SQL("INSERT INTO {} (id, {}) VALUES (%s, %s)").format(
                table.sql(), column), (next_id, _value(table, rng)))
            conn.execute(sql.SQL("UPDATE {} SET {} = %s WHERE id = %s").format(
                table.sql(), column), (_value(table, rng), rng.randint(1, 2000)))
            conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(
                table.sql()), (rng.randint(1, 2000),))


def _value(table: TableName, rng: random.Random):
    return rng.randint(0, 10**6) if table == ACCOUNTS else f"v{rng.randint(0, 10**6)} ✓ \"q\""


def temporary_slots(db) -> list[str]:
    with db.connect() as conn:
        return [r[0] for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE temporary")]


def interrupt(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
