"""The DDL messages of lakeslot's event trigger, replayed onto a mirror (pure, table-driven):
which statement is applied in place and which re-snapshots the table, the renames that rename
the changes before them, and what a replay after a crash does again (nothing). The messages are
the trigger's own documents (see tests/test_ddl_capture.py for the real trigger)."""

from __future__ import annotations

import json

import pytest
from pyiceberg.types import DecimalType, IntegerType, LongType, StringType

from lakeslot.api.naming import TableName
from lakeslot.apply.ddl import epoch, replay, translations
from lakeslot.source import ddl_capture
from lakeslot.source.ddl_capture import DdlEvent, SourceColumn
from lakeslot.source.facts import TableFacts
from lakeslot.staging.relations import Column, Relation

T = TableName("public", "t")
INT4, INT8, TEXT, NUMERIC, UUID, VARCHAR = 23, 20, 25, 1700, 2950, 1043
FACTS = TableFacts(10, {"id": 1, "a": 2, "n": 3}, (), {"id": INT4, "a": TEXT, "n": INT4},
                   {"id": -1, "a": -1, "n": -1}, capture=99)
MIRROR = {"id": IntegerType(), "a": StringType(), "n": IntegerType()}


def _iceberg(column: SourceColumn):
    if column.type_oid == NUMERIC:
        precision, scale = ((column.type_modifier - 4) >> 16) & 0xFFFF, (column.type_modifier - 4) & 0xFFFF
        return DecimalType(precision, scale)
    return {INT4: IntegerType(), INT8: LongType(), TEXT: StringType(), UUID: StringType(),
            VARCHAR: StringType()}[
        column.type_oid]


def col(attnum, name, typ=INT4, typmod=-1, missing=None, generated=False):
    return SourceColumn(attnum, name, typ, typmod, missing, ",", generated)


BASE = (col(1, "id"), col(2, "a", TEXT), col(3, "n"))


def ddl(lsn, columns, *, seq=0, tag="ALTER TABLE", using=False, oid=10, name="t",
        partitions=None, root=None):
    return DdlEvent(lsn, seq, "ddl", tag, oid=oid, schema="public", name=name, kind="r",
                    root=root, using=using, columns=tuple(columns), partitions=partitions)


def rewrite(lsn, oid=10):
    return DdlEvent(lsn, 0, "rewrite", "ALTER TABLE", oid=oid)


def _replay(events, facts=FACTS, mirror=MIRROR, **kw):
    return replay(T, facts, events, mirror, _iceberg, **kw)


@pytest.mark.parametrize(("events", "reason"), [
    ([rewrite(5), ddl(5, [*BASE[:2], col(3, "n", INT8)], using=True)], "USING expression"),
    ([rewrite(5), ddl(5, [*BASE[:2], col(3, "n", TEXT)])], "rewritten"),
    ([ddl(5, [*BASE[:2], col(3, "n", TEXT)])], "cannot promote"),
    ([rewrite(5), ddl(5, [*BASE, col(4, "u", UUID)])], "'u' was added with values"),
    ([ddl(5, [*BASE, col(4, "g", generated=True)])], "generated"),
    ([ddl(5, [BASE[0], BASE[2], col(4, "a", TEXT)])], "'a' was dropped and added again"),
    ([DdlEvent(5, 0, "drop", "DROP TABLE", oid=10, schema="public", name="t")], "dropped"),
    ([ddl(5, BASE, oid=11, tag="CREATE TABLE")], "another table (OID 11)"),
    ([ddl(5, BASE, name="t2")], "renamed to public.t2"),
    ([DdlEvent(5, 0, "error", "ALTER TABLE", error="boom")], "could not describe"),
    ([ddl(5, [BASE[0], col(2, "b", TEXT), BASE[2]])], "excludeColumns or textColumns"),
])
def test_what_changes_values_is_a_resnapshot_with_the_statement(events, reason):
    plan = _replay(events, **({"excluded": ("b",)} if "excludeColumns" in reason else {}))
    assert plan.reason is not None and reason in plan.reason, plan
    assert "at 0/5" in plan.reason and not plan.changes_mirror


def test_rename_add_and_widening_are_applied_in_place():
    events = [
        ddl(5, [BASE[0], col(2, "b", TEXT), BASE[2]]),
        ddl(6, [BASE[0], col(2, "b", TEXT), BASE[2], col(4, "c", missing="{7}")]),
        rewrite(7), ddl(7, [BASE[0], col(2, "b", TEXT), col(3, "n", INT8), col(4, "c", missing="{7}")]),
        ddl(8, [BASE[0], col(2, "b", TEXT), col(3, "n", INT8), col(4, "c", missing="{7}"),
                col(5, "m", NUMERIC, (6 << 16 | 2) + 4)]),
        ddl(9, [BASE[0], col(2, "b", TEXT), col(3, "n", INT8), col(4, "c", missing="{7}"),
                col(5, "m", NUMERIC, (10 << 16 | 2) + 4)]),
        ddl(10, [BASE[0], col(2, "b", TEXT), col(3, "n", INT8)]),  # c dropped: kept
    ]
    plan = _replay(events)
    assert plan.reason is None, plan.reason
    assert plan.renames == (("a", "b"),)
    assert [(a.name, a.missing) for a in plan.add] == [("c", "7"), ("m", None)]
    assert dict(plan.promote) == {"n": LongType(), "m": DecimalType(10, 2)}
    assert plan.facts.stamp == (10, 0) and plan.facts.renames == ((5, 0, "a", "b"),)
    assert plan.facts.columns == {"id": 1, "b": 2, "n": 3}
    assert any("'a' renamed to 'b' (ALTER TABLE at 0/5)" in a for a in plan.applied)
    # the same messages again (a crash after the schema commit): nothing more to do
    again = _replay(events, facts=plan.facts,
                    mirror={"id": IntegerType(), "b": StringType(), "n": LongType()})
    assert not again.changes_mirror and again.facts == plan.facts


def test_type_changes_that_keep_values_need_nothing():
    varchar = [BASE[0], col(2, "a", VARCHAR, 14), BASE[2]]  # text → varchar(10): no rewrite
    assert not _replay([ddl(5, varchar)]).changes_mirror
    assert _replay([ddl(5, varchar)]).reason is None


def test_partitions_created_empty_are_fine_attached_or_detached_are_not():
    parts = TableFacts(10, FACTS.columns, ((20, 200),), FACTS.types, FACTS.typmods, 99)
    created = DdlEvent(5, 0, "ddl", "CREATE TABLE", oid=21, schema="public", name="t_new",
                       kind="r", root=10, relfilenode=210, columns=BASE)
    plan = _replay([created], facts=parts)
    assert plan.reason is None and plan.facts.partitions == ((20, 200), (21, 210))
    attached = ddl(6, BASE, partitions=((20, 200), (22, 220)))
    assert "attached" in (_replay([attached], facts=parts).reason or "")
    detached = ddl(6, BASE, partitions=())
    assert "detached" in (_replay([detached], facts=parts).reason or "")
    dropped = DdlEvent(6, 0, "drop", "DROP TABLE", oid=20, schema="public", name="t_old")
    assert "partition public.t_old was dropped" in (_replay([dropped], facts=parts).reason or "")


def _relation(*names):
    return Relation(10, "public", "t", "default", tuple(Column(n, TEXT, -1, n == "id")
                                                        for n in names))


def test_changes_before_a_rename_take_the_new_name_even_in_the_same_transaction():
    swap = [(5, 1, "x", "tmp"), (5, 2, "y", "x"), (5, 3, "tmp", "y")]  # one transaction
    before, between, after = _relation("id", "x", "y"), _relation("id", "tmp", "y"), _relation(
        "id", "y", "x")
    assert [c.name for c in translations(before, swap)[0].columns] == ["id", "y", "x"]
    assert [c.name for c in translations(between, swap)[1].columns] == ["id", "y", "x"]
    assert translations(after, swap)[3] == after
    assert translations(before, []) == [before]
    # a change's epoch: the renames before it in commit order, (lsn, seq)
    assert [epoch(swap, lsn, seq) for lsn, seq in [(4, 0), (5, 0), (5, 2), (5, 4), (9, 0)]] == [
        0, 0, 2, 3, 3]


def test_only_the_trigger_key_makes_a_message():
    document = {"v": 1, "key": "k", "event": "ddl", "tag": "ALTER TABLE", "oid": 10,
                "schema": "public", "name": "t", "kind": "r", "using": False,
                "columns": [[1, "id", 23, -1, None, ",", False]], "partitions": None}
    event = ddl_capture.parse(7, 2, json.dumps(document).encode(), "k")
    assert event is not None and event.position == (7, 2) and event.columns == (col(1, "id"),)
    assert ddl_capture.parse(7, 2, json.dumps({**document, "key": "forged"}).encode(), "k") is None
    assert ddl_capture.parse(7, 2, json.dumps({k: v for k, v in document.items()
                                               if k != "key"}).encode(), "k") is None
