"""An application's life while ``lakeslot run`` streams (PostgreSQL 15 and 18, lakeslot's event
trigger installed by the run): a 200,000-row transaction, key updates cascading through foreign
keys, upserts, savepoints rolled back, cascading deletes, large TOASTed values updated around
them, and migrations — a column renamed and one added with a default (applied in place), a type
widened, a type changed with USING and one partition truncated (each table copied again alone),
a new partition — while a background writer keeps going. Then ``lakeslot verify`` (the exact
check at one LSN, while the run streams) reports every table equal, and so does an independent
comparison of every column of every row (psycopg vs pyiceberg). Bounded for CI: one round of
each."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from lakeslot import workloads
from lakeslot.api.naming import TableName
from lakeslot.mirror import progress as mirror_progress
from tests.support import local_support
from tests.support.apply_support import assert_equal_to_source
from tests.support.waiting import wait_for

BIG_TRANSACTION_ROWS = 200_000
CUSTOMERS, ORDERS, ITEMS, EVENTS, LEDGER = (
    TableName("public", n) for n in ("customers", "orders", "order_items", "events", "ledger"))
TABLES = [CUSTOMERS, ORDERS, ITEMS, EVENTS, LEDGER]
COPIED_AGAIN = {LEDGER, EVENTS}  # ALTER … TYPE … USING; TRUNCATE of one partition
VERIFY_DEADLINE_S = 600

SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, email text NOT NULL UNIQUE, name text, tier text);
CREATE TABLE orders (id bigint PRIMARY KEY,
                     customer_id int NOT NULL REFERENCES customers ON UPDATE CASCADE ON DELETE CASCADE,
                     amount numeric(10,2) NOT NULL, status text NOT NULL, note text);
CREATE TABLE order_items (order_id bigint REFERENCES orders ON DELETE CASCADE, line int, sku text,
                          qty int NOT NULL, PRIMARY KEY (order_id, line));
CREATE TABLE events (id bigint, region text, payload jsonb, PRIMARY KEY (id, region))
  PARTITION BY LIST (region);
CREATE TABLE events_eu PARTITION OF events FOR VALUES IN ('eu');
CREATE TABLE events_us PARTITION OF events FOR VALUES IN ('us');
CREATE TABLE ledger (id int PRIMARY KEY, cents int NOT NULL);
INSERT INTO customers SELECT g, 'c' || g || '@example.com', 'name ' || g, 'basic'
  FROM generate_series(1, 2000) g;
INSERT INTO orders SELECT g, 1 + g % 2000, g % 997, 'new', repeat('n', 3000)
  FROM generate_series(1, 5000) g;
INSERT INTO order_items SELECT 1 + g % 5000, g, 'sku' || g % 50, 1 + g % 9
  FROM generate_series(1, 10000) g;
INSERT INTO events SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END,
  jsonb_build_object('n', g) FROM generate_series(1, 3000) g;
INSERT INTO ledger SELECT g, g * 100 FROM generate_series(1, 1000) g;
"""

# Each entry is one transaction (several statements run in one execute are one transaction).
MIGRATIONS_AND_WORK = [
    # a 200k-row transaction
    f"""INSERT INTO orders SELECT 100000 + g, 1 + g % 2000, 1, 'bulk', NULL
          FROM generate_series(1, 1000) g;
        INSERT INTO order_items SELECT 100000 + g % 1000 + 1, 1000000 + g, 'bulk', 1
          FROM generate_series(1, {BIG_TRANSACTION_ROWS - 1000}) g""",
    # key updates, cascading into orders (ON UPDATE CASCADE)
    "UPDATE customers SET id = id + 10000 WHERE id BETWEEN 1 AND 50",
    # upserts
    """INSERT INTO customers VALUES (60, 'c60@example.com', 'upserted', 'gold'),
                                    (99999, 'new@example.com', 'new', 'basic')
       ON CONFLICT (id) DO UPDATE SET name = excluded.name, tier = excluded.tier""",
    # savepoints: the rolled-back part never reaches the mirror
    """BEGIN;
       UPDATE orders SET status = 'paid' WHERE id BETWEEN 1 AND 100;
       SAVEPOINT s1;
       DELETE FROM orders WHERE id BETWEEN 1 AND 100;
       UPDATE customers SET tier = 'lost' WHERE id < 200;
       ROLLBACK TO SAVEPOINT s1;
       UPDATE orders SET status = 'shipped' WHERE id BETWEEN 50 AND 60;
       COMMIT""",
    # cascading deletes: customers → orders → order_items
    "DELETE FROM customers WHERE id BETWEEN 100 AND 150",
    # TOASTed values: unchanged in updates of other columns, then changed
    "UPDATE orders SET status = 'archived' WHERE id BETWEEN 1000 AND 1200",
    "UPDATE orders SET note = repeat('m', 5000) WHERE id BETWEEN 1100 AND 1150",
    # migrations applied in place
    """BEGIN; UPDATE customers SET name = 'before rename' WHERE id = 500;
       ALTER TABLE customers RENAME COLUMN name TO full_name;
       UPDATE customers SET full_name = 'after rename' WHERE id = 501; COMMIT""",
    "ALTER TABLE orders ADD COLUMN channel text NOT NULL DEFAULT 'web'",
    "ALTER TABLE order_items ALTER COLUMN qty TYPE bigint",
    "UPDATE order_items SET qty = 5000000000 WHERE order_id = 7",
    "CREATE TABLE events_ap PARTITION OF events FOR VALUES IN ('ap')",
    "INSERT INTO events VALUES (900001, 'ap', jsonb_build_object('n', 1))",
    # migrations and maintenance that copy a table again
    "ALTER TABLE ledger ALTER COLUMN cents TYPE bigint USING cents * 10",
    "TRUNCATE events_us",
    "UPDATE ledger SET cents = cents + 1 WHERE id <= 10",
    "INSERT INTO events VALUES (900002, 'us', jsonb_build_object('n', 2))",
]


class Writer(local_support.BackgroundWriter):
    """The application's steady traffic meanwhile: orders placed, paid and cancelled."""

    def __init__(self, db) -> None:
        super().__init__(db, seed=8, pause=0.05)

    def write(self, conn, rng: random.Random, next_id: int) -> None:
        order = 500000 + next_id
        customer = rng.randint(200, 1999)
        conn.execute("INSERT INTO orders (id, customer_id, amount, status) VALUES "
                     "(%s, %s, 10, 'new')", (order, customer))
        conn.execute("INSERT INTO order_items VALUES (%s, 1, 'sku', 2)", (order,))
        conn.execute("UPDATE orders SET status = 'paid' WHERE id = %s", (rng.randint(1, 5000),))
        conn.execute("DELETE FROM orders WHERE id = %s", (500000 + rng.randint(1, next_id),))


def _verify(path, db) -> dict:
    process = subprocess.run([local_support.LAKESLOT, "verify", "-f", str(path), "-o", "json",
                              "--rounds", "3", "--timeout", str(VERIFY_DEADLINE_S)],
                             env=local_support.run_env(db), capture_output=True, text=True,
                             timeout=VERIFY_DEADLINE_S + 60,
                             check=False)
    assert process.stdout, process.stderr[-3000:]
    return json.loads(process.stdout)


@pytest.mark.slow
def test_an_application_lives_while_streaming_and_the_mirror_equals_it(pgdb, tmp_path, spark,
                                                                       spark_warehouse,
                                                                       monkeypatch):
    with pgdb.connect() as conn:
        conn.execute(SCHEMA)
    path, state_dir = tmp_path / "ingestion.yaml", tmp_path / "state"
    local_support.write_ingestion(path, pgdb, TABLES, tmp_path, warehouse=spark_warehouse)
    local = local_support.local(path, pgdb, state_dir)
    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)
    first, _ = local_support.run_in_process(local, spark, once=True)
    assert first.caught_up

    def copied_again() -> bool:
        progress = mirror_progress.read(local.job.ingestion, TABLES)
        return all(progress[t].resnapshots_last_hour and progress[t].error is None
                   for t in COPIED_AGAIN)

    def live() -> dict:
        writer = Writer(pgdb)
        with pgdb.connect(autocommit=True) as conn:
            for statement in MIGRATIONS_AND_WORK:
                conn.execute(statement)
        writer.stop()
        # the run copies the tables it stopped by itself; verify reports a stopped table as
        # incomplete (with the reason), so it is asked once the copies are in
        wait_for(copied_again, "the automatic re-snapshots", deadline=VERIFY_DEADLINE_S)
        return _verify(path, pgdb)

    _, verification = local_support.run_in_process(local, spark, once=False, during=live)
    assert verification is not None
    results = {t["table"]: t for t in verification["tables"]}
    assert verification["equal"] is True, json.dumps(verification, indent=1)[:4000]
    assert set(results) == {str(t) for t in TABLES}
    assert all(r["result"] == "equal" for r in results.values())

    last, _ = local_support.run_in_process(local, spark, once=True)  # the source is quiet now
    assert last.caught_up
    warehouse = spark_warehouse.as_uri()
    for table in TABLES:
        assert_equal_to_source(pgdb, warehouse, local.job.names.mirror_identifier(table), table)
    progress = mirror_progress.read(local.job.ingestion, TABLES)
    assert {t for t, p in progress.items() if p.resnapshots_last_hour} == COPIED_AGAIN
    assert "renamed to 'full_name'" in (progress[CUSTOMERS].schema_change or "")
    with pgdb.connect() as conn:
        # the big transaction is there (less what the cascading delete of customers took)
        bulk = conn.execute("SELECT count(*) FROM order_items WHERE sku = 'bulk'").fetchone()[0]
        assert bulk > 0.9 * (BIG_TRANSACTION_ROWS - 1000)
