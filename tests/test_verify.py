"""``lakeslot verify``: exact equality at one LSN while the source is written and the pipeline
streams (real PostgreSQL 15 and 18, ``lakeslot run`` as a real process, Spark + Iceberg), planted
differences found by key, bad input refused; and the pure parts (key sets from staged changes,
the row comparison, the output) on made-up data."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from psycopg import sql

from lakeslot import cli, workloads
from lakeslot.api.naming import TableName
from lakeslot.mirror import typemap
from lakeslot.staging.relations import Column, Relation
from lakeslot.staging.segments import (
    METADATA_KEY,
    SCHEMA,
    Segment,
    SegmentMetadata,
    SegmentName,
    SourceIdentity,
    metadata_document,
)
from lakeslot.verify import diff, exact, inflight, report
from lakeslot.verify.request import parse_table
from tests.support import local_support, operator_env
from tests.support.odd_names import ODD_TABLES, create_odd_tables
from tests.support.waiting import wait_for

pytestmark = pytest.mark.one_version  # (tests/support/fixtures_pg.py: version matrix)

VERIFY_DEADLINE_S = 300
ODD = ODD_TABLES[1]  # "Sales ""EU"" 2024"."Line Items": both parts need quoting
ODD_ARG = '"Sales ""EU"" 2024"."Line Items"'
LEDGER = TableName("public", "ledger")
ACCOUNT_ROWS, ODD_ROWS, LEDGER_ROWS = 5_000, 2_000, 3_000
LEDGER_WRITTEN = 2_000  # the writer changes ledger keys up to here; the planted ones are above
PLANTED_MISSING, PLANTED_CHANGED, PLANTED_COPY, PLANTED_EXTRA = 2_001, 2_002, 2_003, -5


# end to end ----------------------------------------------------------------------------------

@pytest.fixture
def source(pgdb):
    with pgdb.connect() as conn:
        accounts = local_support.create_accounts(conn, ACCOUNT_ROWS)
        create_odd_tables(conn)
        conn.execute(sql.SQL("INSERT INTO {} (id, \"user\", \"ñ\") SELECT i, 'u' || i, 'ñ' "
                             "FROM generate_series(1, %s) AS i").format(ODD.sql()), (ODD_ROWS,))
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, amount numeric(12,2) NOT NULL, "
                     "memo text, at timestamptz NOT NULL DEFAULT now())")
        conn.execute("INSERT INTO ledger (id, amount, memo) SELECT i, i * 1.25, 'm' || i "
                     "FROM generate_series(1, %s) AS i", (LEDGER_ROWS,))
    return pgdb, [accounts, ODD, LEDGER]


class Writer(local_support.BackgroundWriter):
    """Hammers the tables until stopped: every transaction updates the hot key 1 of accounts (it
    is in flight in every round), updates a random row of each table, inserts a new key and
    deletes a random one (ledger: only keys up to LEDGER_WRITTEN)."""

    def __init__(self, db) -> None:
        super().__init__(db, seed=15, pause=0.02)

    def write(self, conn, rng: random.Random, next_id: int) -> None:
        conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        conn.execute("INSERT INTO accounts (id, balance) VALUES (%s, 1)", (next_id,))
        conn.execute("UPDATE accounts SET balance = %s, note = %s WHERE id = %s",
                     (rng.randint(0, 10**6), f"n{next_id}", rng.randint(2, ACCOUNT_ROWS)))
        conn.execute("DELETE FROM accounts WHERE id = %s", (rng.randint(2, ACCOUNT_ROWS),))
        conn.execute(sql.SQL('UPDATE {} SET "user" = %s WHERE id = %s').format(ODD.sql()),
                     (f"w{next_id} ✓", rng.randint(1, ODD_ROWS)))
        conn.execute(sql.SQL('INSERT INTO {} (id, "user") VALUES (%s, %s)').format(ODD.sql()),
                     (next_id, "new"))
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(ODD.sql()),
                     (rng.randint(1, ODD_ROWS),))
        conn.execute("UPDATE ledger SET amount = amount + 0.01 WHERE id = %s",
                     (rng.randint(1, LEDGER_WRITTEN),))


def _write_ingestion(path: Path, db, tables: list[TableName], tmp_path: Path,
                     warehouse: Path) -> None:
    document = operator_env.ingestion_document(
        "verify-test", db, tables, warehouse=warehouse.as_uri(),
        staging=(tmp_path / "staging").as_uri(),
        snapshot={"parallelism": 2, "targetRangeBytes": 1 << 20},
        apply={"triggerIntervalSeconds": 1})
    document["spec"]["staging"]["retentionSeconds"] = 0  # segments go as soon as applied
    path.write_text(yaml.safe_dump(document, allow_unicode=True))


def _env(db) -> dict[str, str]:
    env = {**os.environ, workloads.PASSWORD_ENV: db.cluster.password}
    env.pop("PGPASSWORD", None)
    return env


def _verify(path: Path, db, *args: str) -> subprocess.Popen:
    return subprocess.Popen([local_support.LAKESLOT, "verify", "-f", str(path), *args], env=_env(db),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=VERIFY_DEADLINE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"lakeslot verify did not finish:\n{err[-3000:]}")
    return process.returncode, out, err


def _tables(document: dict) -> dict[str, dict]:
    return {t["table"]: t for t in document["tables"]}


def _plant(spark, local, table: TableName) -> None:
    """Damage the mirror as a bug would: a row deleted, a value changed, a row added."""
    target = local_support.mirror_name(local, table)
    local_support.commit_as_pipeline(spark, local, table, f"""
        MERGE INTO {target} t
        USING (SELECT CASE id WHEN {PLANTED_COPY} THEN {PLANTED_EXTRA} ELSE id END AS new_id, *
                 FROM {target} WHERE id IN ({PLANTED_MISSING}, {PLANTED_CHANGED}, {PLANTED_COPY})) s
        ON t.id = s.new_id
        WHEN MATCHED AND s.id = {PLANTED_MISSING} THEN DELETE
        WHEN MATCHED THEN UPDATE SET amount = -7
        WHEN NOT MATCHED THEN INSERT (id, amount, memo, at, _lakeslot_lsn)
            VALUES (s.new_id, s.amount, s.memo, s.at, s._lakeslot_lsn)""")


@pytest.mark.slow
def test_exact_under_write_load_and_planted_differences_are_found(source, tmp_path, spark,
                                                                  spark_warehouse, monkeypatch):
    db, tables = source
    path, state_dir = tmp_path / "ingestion.yaml", tmp_path / "state"
    _write_ingestion(path, db, tables, tmp_path, spark_warehouse)
    local = local_support.local(path, db, state_dir)
    monkeypatch.setenv(workloads.PASSWORD_ENV, db.cluster.password)  # run.run exports it
    first, _ = local_support.run_in_process(local, spark, once=True)
    assert first.caught_up
    _plant(spark, local, LEDGER)

    def both_checks() -> tuple[tuple[int, str, str], tuple[int, str, str]]:
        # (a) tables the writer hammers: equal, whatever is in flight; (b) every table: the
        # planted differences and nothing else. Both at once, against the same pipeline.
        hammered = _verify(path, db, "--table", "public.accounts", "--table", ODD_ARG,
                           "-o", "json", "--rounds", "2")
        everything = _verify(path, db, "-o", "json", "--rounds", "1")
        return _finish(hammered), _finish(everything)

    writer = Writer(db)
    _, checks = local_support.run_in_process(local, spark, once=False, during=both_checks)
    assert checks is not None
    (code, out, err), (code_all, out_all, err_all) = checks

    assert code == 0, err[-3000:] + out
    document = json.loads(out)
    assert document["equal"] is True
    assert set(_tables(document)) == {"public.accounts", str(ODD)}
    for table in document["tables"]:
        assert table["result"] == "equal", table
        assert table["missing"]["count"] == table["extra"]["count"] == 0
        assert table["differing"]["count"] == 0
        assert table["rowsCompared"] > table["sourceRows"] / 2
        rounds = table["rounds"]
        assert rounds[0]["compared"] > 0
        # Keys the writer changed in (P, L] of a round are compared again in the next one (a
        # round whose window held no commit has none: rare, but not an error).
        assert len(rounds) == (2 if rounds[0]["inFlight"] else 1)
        assert table["notCompared"]["count"] == rounds[-1]["inFlight"]

    assert code_all == 1, err_all[-3000:] + out_all
    document = json.loads(out_all)
    assert document["equal"] is False
    results = _tables(document)
    assert results["public.accounts"]["result"] == results[str(ODD)]["result"] == "equal"
    ledger = results["public.ledger"]
    assert ledger["result"] == "different"
    assert ledger["missing"] == {"count": 1, "keys": [{"id": PLANTED_MISSING}]}
    assert ledger["extra"] == {"count": 1, "keys": [{"id": PLANTED_EXTRA}]}
    assert ledger["differing"] == {"count": 1, "keys": [{
        "key": {"id": PLANTED_CHANGED}, "columns": {"amount": ["2502.50", "-7.00"]}}]}

    # No pipeline any more while the writer goes on: the mirror stays behind, said so, exit 1.
    code, out, err = _finish(_verify(path, db, "--table", "public.ledger", "--timeout", "2"))
    writer.stop()
    assert code == 1, err
    assert "the mirror is behind" in out and "verify needs a running pipeline" in out
    assert db.cluster.password not in out + err + err_all


# bad input -----------------------------------------------------------------------------------

def test_bad_input_exits_2_with_the_reason(pgdb, tmp_path, monkeypatch, capsys):
    with pgdb.connect() as conn:
        accounts = local_support.create_accounts(conn, 10)
    path = tmp_path / "ingestion.yaml"
    _write_ingestion(path, pgdb, [accounts], tmp_path, tmp_path / "warehouse")
    monkeypatch.delenv(workloads.PASSWORD_ENV, raising=False)
    assert cli.main(["verify", "-f", str(path)]) == 2
    assert workloads.PASSWORD_ENV in capsys.readouterr().err

    monkeypatch.setenv(workloads.PASSWORD_ENV, pgdb.cluster.password)
    assert cli.main(["verify", "-f", str(path), "--table", "public.nope"]) == 2
    err = capsys.readouterr().err
    assert "not selected by this ingestion: public.nope" in err and "public.accounts" in err
    assert cli.main(["verify", "-f", str(path), "--table", "accounts"]) == 2
    assert "expected SCHEMA.NAME" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["verify", "-f", str(path), "--timeout", "0"])
    assert exit_info.value.code == 2
    assert cli.main(["verify", "-f", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_table_arguments_parse_like_postgresql():
    assert parse_table("public.accounts") == TableName("public", "accounts")
    assert parse_table("Public.Accounts") == TableName("public", "accounts")
    assert parse_table(ODD_ARG) == ODD
    assert parse_table('public."say ""hi"""') == TableName("public", 'say "hi"')
    assert parse_table('"a.b".c') == TableName("a.b", "c")
    for bad in ("accounts", "a.b.c", "a.", '"a.b', ".b", ""):
        with pytest.raises(ValueError, match=r"SCHEMA\.NAME"):
            parse_table(bad)


# the pure parts ------------------------------------------------------------------------------

def _columns() -> tuple[typemap.ColumnMapping, ...]:
    return (typemap.map_column("id", typemap.PgType("int4", "b"), key=True),
            typemap.map_column("v", typemap.PgType("text", "b")))


RELATION = Relation(1, "public", "t", "default", (Column("id", 23, -1, True), Column("v", 25, -1, False)))
OTHER = Relation(2, "public", "u", "default", (Column("id", 23, -1, True), Column("v", 25, -1, False)))


def _segment(rows: list[dict]) -> Segment:
    relations = (RELATION, OTHER)
    full = [{"commit_lsn": r["lsn"], "seq": i, "op": r["op"], "relation": r.get("relation", 0),
             "schema": relations[r.get("relation", 0)].schema,
             "table": relations[r.get("relation", 0)].table,
             "new_kinds": r.get("new_kinds"), "new_values": r.get("new"),
             "old_kinds": r.get("old_kinds"), "old_values": r.get("old")} for i, r in enumerate(rows)]
    table = pa.Table.from_pylist(full, schema=SCHEMA)
    name = SegmentName(0, 100)
    return Segment(SegmentMetadata(name, SourceIdentity("1", 1), relations), table)


def test_changed_keys_come_from_new_and_old_tuples():
    segment = _segment([
        {"lsn": 10, "op": "I", "new_kinds": "tt", "new": ["1", "a"]},
        {"lsn": 11, "op": "U", "new_kinds": "tt", "new": ["2", "b"]},  # key unchanged: no old
        {"lsn": 12, "op": "U", "new_kinds": "tu", "new": ["4", None], "old_kinds": "t-",
         "old": ["3", None]},  # key 3 → 4
        {"lsn": 13, "op": "D", "old_kinds": "t-", "old": ["5", None]},
        {"lsn": 14, "op": "I", "new_kinds": "tt", "new": ["9", "other table"], "relation": 1},
    ])
    found = inflight.changed_keys(iter([Segment(segment.metadata, segment.table.slice(0, 4))]),
                                  _columns())
    assert found.whole is None
    assert sorted(k.values for k in found.keys.values()) == [(1,), (2,), (3,), (4,), (5,)]
    assert found.keys[repr((4,))].texts == ("4",)

    truncated = _segment([{"lsn": 10, "op": "I", "new_kinds": "tt", "new": ["1", "a"]},
                          {"lsn": 11, "op": "T"}])
    assert inflight.changed_keys(iter([truncated]), _columns()).whole == "truncated at 0/B"
    keyless = _segment([{"lsn": 10, "op": "D", "old_kinds": "-t", "old": [None, "x"]}])
    assert "does not carry its key" in (inflight.changed_keys(iter([keyless]), _columns()).whole or "")


def _rows(pairs: list[tuple[int, str | None]]) -> pa.Table:
    return pa.table({"id": pa.array([p[0] for p in pairs], pa.int32()),
                     "v": pa.array([p[1] for p in pairs], pa.string())})


def test_the_comparison_reports_missing_extra_differing_and_skips_keys_in_flight():
    source = diff.side(_rows([(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e"), (7, "x")]), ["id"])
    mirror = diff.side(_rows([(1, "a"), (2, "B"), (4, "d"), (6, "f"), (5, "E"), (7, "x"), (7, "x")]),
                       ["id"])
    found = diff.diff(source, mirror, in_flight={repr((5,))}, scope=None)
    assert (found.missing_count, found.extra_count, found.differing_count) == (1, 2, 1)
    assert [source.rows["id"][i].as_py() for i in found.missing] == [3]
    assert sorted(mirror.rows["id"][i].as_py() for i in found.extra) == [6, 7]  # 7: twice
    assert [(source.rows["id"][a].as_py(), mirror.rows["id"][b].as_py())
            for a, b in found.differing] == [(2, 2)]
    assert found.compared == 6  # 1, 2, 3, 4, 6, 7 (5 is in flight)
    entry = diff.differing_entry(source.rows, mirror.rows, found.differing[0], ["id"])
    assert entry == {"key": {"id": 2}, "columns": {"v": ["b", "B"]}}

    scoped = diff.diff(source, mirror, in_flight=set(), scope={repr((5,)), repr((8,))})
    assert (scoped.compared, scoped.differing_count, scoped.missing_count) == (1, 1, 0)


def test_output_lists_keys_with_counts_and_says_why():
    table = report.TableResult(TableName("public", "t"), 10, 9, compared=9)
    table.missing.add([{"id": i} for i in range(30)])
    table.differing.add([{"key": {"id": 2}, "columns": {"v": ["b", "B"]}}])
    table.not_compared.add([{"id": 5}])
    table.rounds.append(report.Round(1, 0x100, 0x180, 9, 1))
    behind = report.TableResult(TableName("s p", "T"), problem="the mirror is behind: at 0/1")
    result = report.Verification([table, behind])
    assert result.exit_code == 1
    document = report.to_document(result)
    first, second = document["tables"]
    assert first["missing"]["count"] == 30 and len(first["missing"]["keys"]) == diff.LISTED_KEYS
    assert first["notCompared"] == {"count": 1, "keys": [{"id": 5}], "reason": "changing continuously"}
    assert second["result"] == "incomplete" and second["table"] == '"s p"."T"'
    text = "\n".join(report.render_text(result))
    assert "missing (in the source, not in the mirror): 30 (first 20): id=0; id=1" in text
    assert 'id=2: v: source "b" ≠ mirror "B"' in text
    assert "not compared (changing continuously): 1: id=5" in text
    assert "the mirror is behind" in text
    assert text.endswith("1 table(s) differ, 1 could not be checked")
    assert report.Verification([report.TableResult(TableName("a", "b"))]).exit_code == 0


def test_what_the_last_round_leaves_in_flight():
    keys = exact._TableState(report.TableResult(TableName("public", "t")), key_names=["id"],
                             pending={repr((5,)): inflight.ChangedKey((5,), ("5",))})
    keys.result.rounds.append(report.Round(2, 0x200, 0x280, 0, None, "staging does not cover it"))
    exact._left_over(keys)
    assert keys.result.result == "equal"  # listed, not counted as a difference
    assert report.to_document(report.Verification([keys.result]))["tables"][0]["notCompared"] == {
        "count": 1, "keys": [{"id": 5}], "reason": "staging does not cover it"}

    whole = exact._TableState(report.TableResult(TableName("public", "t")), pending=None,
                              pending_reason="truncated at 0/2A0")
    exact._left_over(whole)
    assert whole.result.result == "incomplete"
    assert whole.result.problem == "not compared after the last round: truncated at 0/2A0"


def _seal(directory: Path, start: int, end: int, rows: list[dict]) -> SegmentName:
    """A sealed segment file as the reader writes it (rows and footer metadata)."""
    name = SegmentName(start, end)
    table = _segment(rows).table
    metadata = metadata_document(start, end, SourceIdentity("1", 1), [RELATION, OTHER])
    table = table.replace_schema_metadata({METADATA_KEY: metadata})
    pq.write_table(table, directory / f".tmp-{name.filename}")
    (directory / f".tmp-{name.filename}").rename(directory / name.filename)
    return name


def test_segment_cache_keeps_what_retention_deletes_and_notices_gaps(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    _seal(staging, 0x10, 0x20, [{"lsn": 0x11, "op": "I", "new_kinds": "tt", "new": ["1", "old"]}])
    with inflight.SegmentCache(staging.as_uri(), interval=0.01) as cache:
        cache.need_above(0x1F)
        first = _seal(staging, 0x20, 0x30, [
            {"lsn": 0x21, "op": "I", "new_kinds": "tt", "new": ["2", "a"]},
            {"lsn": 0x22, "op": "I", "new_kinds": "tt", "new": ["8", "b"], "relation": 1}])
        second = _seal(staging, 0x30, 0x40, [
            {"lsn": 0x31, "op": "D", "old_kinds": "t-", "old": ["3", None]},
            {"lsn": 0x3A, "op": "D", "old_kinds": "t-", "old": ["4", None]}])
        wait_for(lambda: cache.copies.list() == [first, second], "both segments copied")
        for name in (first, second):  # retention: applied, so deleted
            (staging / name.filename).unlink()
        segments = cache.changes(TableName("public", "t"), 0x1F, 0x31)
        assert not isinstance(segments, str)
        assert sorted(k.values for k in inflight.changed_keys(segments, _columns()).keys.values()) \
            == [(2,), (3,)]  # 8 is another table's, 4 committed after 0x31
        assert "does not cover" in str(cache.changes(TableName("public", "t"), 0x1F, 0x45))
        assert cache.changes(TableName("public", "t"), 0x45, 0x45) == []  # the mirror exactly at P
        cache.need_above(0x3F)
        assert cache.copies.list() == []
