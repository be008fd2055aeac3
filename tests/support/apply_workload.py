"""A seeded random workload for the apply tests: inserts, updates that leave a TOASTed column
unchanged, updates of the TOASTed value, deletes, key updates and multi-statement transactions on
a table with an odd name (quotes, space, non-ASCII, a reserved word as a column), and on a keyless
REPLICA IDENTITY FULL table."""

from __future__ import annotations

import random

from psycopg import sql

from lakeslot.api.naming import TableName

MAIN = TableName("public", 'Odd "Tab" é')
KEYLESS = TableName("public", "plain rows")
IDLE = TableName("public", "idle")


def create_tables(conn, rows: int = 30) -> None:
    conn.execute(sql.SQL(
        """CREATE TABLE {} (id int PRIMARY KEY, "select" text, amount numeric(12,2),
                            ts timestamptz, flag bool, big text, tags int[])""").format(MAIN.sql()))
    conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN big SET STORAGE EXTERNAL").format(MAIN.sql()))
    conn.execute(sql.SQL("CREATE TABLE {} (a int NOT NULL, b text, big text)").format(KEYLESS.sql()))
    conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN big SET STORAGE EXTERNAL").format(KEYLESS.sql()))
    conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(KEYLESS.sql()))
    conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(IDLE.sql()))
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'still')").format(IDLE.sql()))
    workload = Workload(conn, random.Random(0))
    for _ in range(rows):
        workload.insert()
        workload.insert_keyless()


class Workload:
    def __init__(self, conn, rng: random.Random) -> None:
        self.conn, self.rng = conn, rng
        self.columns = {"flag": True, "extra": False}
        self.next_id = 1 + (conn.execute(sql.SQL("SELECT coalesce(max(id), 0) FROM {}").format(
            MAIN.sql())).fetchone()[0])
        self.next_a = 1 + (conn.execute(sql.SQL("SELECT coalesce(max(a), 0) FROM {}").format(
            KEYLESS.sql())).fetchone()[0])

    def _big(self) -> str:
        return "".join(self.rng.choice("0123456789abcdef") for _ in range(self.rng.randint(3000, 9000)))

    def _pick(self, table: TableName, key: str) -> int | None:
        keys = [r[0] for r in self.conn.execute(sql.SQL("SELECT {} FROM {}").format(
            sql.Identifier(key), table.sql()))]
        return self.rng.choice(keys) if keys else None

    def insert(self) -> None:
        values = {"id": self.next_id, "select": self.rng.choice(["x", "y", None, "ü ' \" `"]),
                  "amount": f"{self.rng.randint(-10**8, 10**8) / 100:.2f}",
                  "ts": f"2024-0{self.rng.randint(1, 9)}-1{self.rng.randint(0, 9)} 12:34:56.789+02",
                  "big": self._big(), "tags": [self.rng.randint(0, 9), None]}
        if self.columns["flag"]:
            values["flag"] = self.rng.choice([True, False, None])
        if self.columns["extra"]:
            values["extra"] = self.rng.randint(0, 100)
        self.next_id += 1
        self.conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            MAIN.sql(), sql.SQL(", ").join(map(sql.Identifier, values)),
            sql.SQL(", ").join([sql.Placeholder()] * len(values))), list(values.values()))

    def update_small(self) -> None:
        """Leaves ``big`` unchanged: pgoutput sends it as an unchanged TOAST value."""
        key = self._pick(MAIN, "id")
        if key is not None:
            self.conn.execute(sql.SQL('UPDATE {} SET "select" = %s, amount = amount + 1 '
                                      "WHERE id = %s").format(MAIN.sql()),
                              (f"u{self.rng.randint(0, 999)}", key))

    def update_big(self) -> None:
        key = self._pick(MAIN, "id")
        if key is not None:
            self.conn.execute(sql.SQL("UPDATE {} SET big = %s, tags = %s WHERE id = %s").format(
                MAIN.sql()), (self._big(), [self.rng.randint(0, 9)], key))

    def update_key(self) -> None:
        key = self._pick(MAIN, "id")
        if key is not None:
            self.conn.execute(sql.SQL("UPDATE {} SET id = %s WHERE id = %s").format(MAIN.sql()),
                              (self.next_id, key))
            self.next_id += 1

    def delete(self) -> None:
        key = self._pick(MAIN, "id")
        if key is not None:
            self.conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(MAIN.sql()), (key,))

    def insert_keyless(self) -> None:
        self.conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(KEYLESS.sql()),
                          (self.next_a, f"b{self.rng.randint(0, 99)}", self._big()))
        self.next_a += 1

    def update_keyless(self) -> None:
        key = self._pick(KEYLESS, "a")
        if key is not None:
            self.conn.execute(sql.SQL("UPDATE {} SET b = %s WHERE a = %s").format(KEYLESS.sql()),
                              (f"c{self.rng.randint(0, 99)}", key))

    def delete_keyless(self) -> None:
        key = self._pick(KEYLESS, "a")
        if key is not None:
            self.conn.execute(sql.SQL("DELETE FROM {} WHERE a = %s").format(KEYLESS.sql()), (key,))

    def transaction(self, statements: int) -> None:
        """One transaction of ``statements`` random changes (same keys touched repeatedly)."""
        operations = [self.insert, self.update_small, self.update_small, self.update_big,
                      self.update_key, self.delete, self.insert_keyless, self.update_keyless,
                      self.delete_keyless]
        with self.conn.transaction():
            for _ in range(statements):
                self.rng.choice(operations)()

    def run(self, transactions: int) -> None:
        for _ in range(transactions):
            self.transaction(self.rng.randint(1, 4))

    def truncate(self) -> None:
        with self.conn.transaction():
            self.insert()
            self.conn.execute(sql.SQL("TRUNCATE {}").format(MAIN.sql()))
            self.insert()
            self.update_small()

    def add_column(self) -> None:
        self.conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN extra int").format(MAIN.sql()))
        self.columns["extra"] = True

    def drop_column(self) -> None:
        self.conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN flag").format(MAIN.sql()))
        self.columns["flag"] = False
