"""The reduction of a table's changes and the schema-change plan, without Spark or PostgreSQL."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest
from pyiceberg.types import DecimalType, IcebergType, IntegerType, ListType, LongType, StringType

from lakeslot.api.naming import TableName
from lakeslot.apply.changes import KEEP, Change, Reducer, TableError, reduce, start_position
from lakeslot.apply.columns import parser, plan_schema
from lakeslot.apply.spread import routes
from lakeslot.staging.relations import Column, Relation
from lakeslot.staging.segments import NOT_IN_KEY, UNCHANGED_TOAST, SegmentName

T = TableName("public", "t")
REL = Relation(1, "public", "t", "default", (Column("id", 23, -1, True), Column("v", 25, -1, False),
                                             Column("big", 25, -1, False)))


def change(lsn, op, new=None, old=None, seq=0):
    return Change(lsn, seq, op, REL, new, old)


def row(i, v, big):
    return {"id": i, "v": v, "big": big}


def test_latest_change_per_key_wins_and_a_key_change_deletes_the_old_key():
    r = reduce(T, ["id"], [
        change(10, "I", row("1", "a", "B1")),
        change(10, "U", row("1", "b", UNCHANGED_TOAST), seq=1),
        change(20, "U", row("2", "c", UNCHANGED_TOAST), {"id": "1", "v": NOT_IN_KEY,
                                                         "big": NOT_IN_KEY}),
        change(30, "I", row("3", "x", None)),
        change(40, "D", None, {"id": "3", "v": NOT_IN_KEY, "big": NOT_IN_KEY}),
    ])
    assert {k: (f.image.values if f.image else None, f.lsn) for k, f in r.finals.items()} == {
        ("1",): (None, 20), ("2",): ({"id": "2", "v": "c", "big": "B1"}, 20), ("3",): (None, 40)}
    assert [e.op for e in r.events] == ["I", "U", "U", "I", "D"]
    assert r.events[1].image.values["big"] == "B1"  # the changelog never holds a placeholder
    assert not r.truncated


def test_unchanged_toast_keeps_the_mirror_value_of_the_row_it_came_from():
    r = reduce(T, ["id"], [
        change(10, "U", row("1", "b", UNCHANGED_TOAST)),
        change(20, "U", row("5", "c", UNCHANGED_TOAST), {"id": "1", "v": NOT_IN_KEY,
                                                         "big": NOT_IN_KEY}),
    ])
    image = r.finals[("5",)].image
    assert image is not None
    assert image.values == {"id": "5", "v": "c", "big": KEEP} and image.source == ("1",)


def test_full_old_tuple_supplies_the_unchanged_value():
    r = reduce(T, ["id"], [change(10, "U", row("1", "b", UNCHANGED_TOAST), row("1", "a", "OLD"))])
    image = r.finals[("1",)].image
    assert image is not None
    assert image.values["big"] == "OLD" and image.source is None


def test_truncate_drops_earlier_changes_and_a_kept_value_after_it_is_an_error():
    r = reduce(T, ["id"], [change(10, "I", row("1", "a", "B")), change(20, "T"),
                           change(20, "I", row("2", "b", "C"), seq=1)])
    assert r.truncated and list(r.finals) == [("2",)]
    with pytest.raises(TableError, match="REPLICA IDENTITY FULL") as e:
        reduce(T, ["id"], [change(20, "T"), change(30, "U", row("1", "b", UNCHANGED_TOAST))])
    assert e.value.resnapshot


def test_a_change_without_the_configured_key_is_a_clear_error():
    with pytest.raises(TableError, match="need REPLICA IDENTITY FULL"):
        reduce(T, ["v"], [change(10, "D", None, {"id": "1", "v": NOT_IN_KEY, "big": NOT_IN_KEY})])


def _stream(rng: random.Random, length: int) -> list[Change]:
    """A stream PostgreSQL could send for REL (primary key id, DEFAULT identity): inserts of new
    keys, updates (some changing the key, some leaving the TOASTed column unchanged), deletes,
    truncates, several changes per transaction."""
    rows: dict[str, tuple[str, str]] = {str(i): ("v", f"B{i}") for i in range(6)}  # in the mirror
    stream, lsn, seq, fresh = [], 100, 0, 100
    for _ in range(length):
        if rng.random() < 0.4:
            lsn, seq = lsn + 10, 0
        seq += 1
        roll = rng.random()
        if roll < 0.03:
            stream.append(change(lsn, "T", seq=seq))
            rows.clear()
        elif roll < 0.25 or not rows:
            fresh += 1
            key = str(fresh)
            rows[key] = (f"i{seq}", f"B{key}")
            stream.append(change(lsn, "I", row(key, *rows[key]), seq=seq))
        elif roll < 0.4:
            key = rng.choice(sorted(rows))
            del rows[key]
            stream.append(change(lsn, "D", None, {"id": key, "v": NOT_IN_KEY, "big": NOT_IN_KEY},
                                 seq=seq))
        else:
            key = rng.choice(sorted(rows))
            _, big = rows.pop(key)
            toast = rng.random() < 0.5
            big = big if toast else f"b{lsn}.{seq}"
            target = key
            if rng.random() < 0.3:
                fresh += 1
                target = str(fresh)
            rows[target] = (f"u{seq}", big)
            old = {"id": key, "v": NOT_IN_KEY, "big": NOT_IN_KEY} if target != key else None
            stream.append(change(lsn, "U", row(target, f"u{seq}", UNCHANGED_TOAST if toast else big),
                                 old, seq=seq))
    return stream


def _spread(stream: list[Change], partitions: int):
    """What the executors do (lakeslot.apply.spread): route, sort, fold per partition."""
    copies = []
    for c in stream:
        new = c.new["id"] if c.new else None
        old = c.old["id"] if c.old else new
        for index, role in routes(0, c.op, old, new, partitions):
            copies.append((index, c.lsn, c.seq, role, c))
    reducers = [Reducer(T, ["id"]) for _ in range(partitions)]
    failed: list[TableError] = []
    stopped: set[int] = set()
    redo = False
    for index, _, _, role, c in sorted(copies, key=lambda x: x[:4]):
        if index in stopped:
            continue
        try:
            if reducers[index].take(c, role):
                redo = True  # the table is reduced again in one partition
                stopped.add(index)
        except TableError as e:  # the partition stops; a redo request wins over it
            failed.append(e)
            stopped.add(index)
    if redo:
        return None
    if failed:
        raise failed[0]
    finals = {k: f for r in reducers for k, f in r.finals.items()}
    events = sorted((e for r in reducers for e in r.result().events), key=lambda e: (e.lsn, e.seq))
    return finals, events, any(r.truncated for r in reducers)


def test_the_reduction_spread_over_partitions_equals_the_serial_one_or_asks_for_it():
    compared = redone = 0
    for seed in range(300):
        rng = random.Random(seed)
        stream = _stream(rng, rng.randint(5, 60))
        try:
            expected = reduce(T, ["id"], stream)
        except TableError:
            continue  # an unrecoverable TOAST value: test_truncate_drops_earlier…
        for partitions in (1, 2, 3):
            spread = _spread(stream, partitions)
            if spread is None:  # then the table is reduced serially: reduce() itself
                assert partitions > 1  # in one partition a key change is never split
                redone += 1
                continue
            finals, events, truncated = spread
            assert finals == expected.finals, (seed, partitions)
            assert events == expected.events and truncated == expected.truncated, (seed, partitions)
            compared += 1
    assert compared > 500 and redone > 10, (compared, redone)  # both paths exercised


def test_a_key_change_needing_an_image_from_earlier_in_the_batch_asks_for_one_partition():
    stream = [change(10, "U", row("1", "b", "NEW")),
              change(20, "U", row("2", "c", UNCHANGED_TOAST), {"id": "1", "v": NOT_IN_KEY,
                                                               "big": NOT_IN_KEY})]
    partitions = next(n for n in range(2, 50)
                      if len({i for i, _ in routes(0, "U", "1", "2", n)}) == 2)
    assert _spread(stream, partitions) is None
    assert reduce(T, ["id"], stream).finals[("2",)].image.values["big"] == "NEW"  # type: ignore[union-attr]


def test_reading_starts_above_the_position_or_at_the_first_segment_for_position_zero():
    names = [SegmentName(100, 200)]
    assert (start_position(names, 0), start_position(names, 150)) == (100, 151)


def test_schema_plan_adds_promotes_keeps_dropped_and_refuses_narrowing():
    mirror = {"id": IntegerType(), "n": IntegerType(), "d": DecimalType(10, 2), "gone": StringType()}
    plan = plan_schema(mirror, [{"id": IntegerType(), "n": LongType(), "d": DecimalType(12, 2),
                                 "new": ListType(1, StringType())}])
    assert plan.add == (("new", ListType(1, StringType())),)
    assert [n for n, _ in plan.promote] == ["n", "d"] and plan.dropped == ("gone",)
    assert not plan.incompatible
    narrowed = plan_schema({"n": LongType()}, [{"n": IntegerType()}])
    assert narrowed.incompatible and "cannot promote" in narrowed.incompatible[0]
    # changes described before a widening the mirror already has (ALTER … TYPE bigint applied
    # in place): their values fit; only the latest description can narrow
    before_widening: list[dict[str, IcebergType | str]] = [{"n": IntegerType()}, {"n": LongType()}]
    assert not plan_schema({"n": LongType()}, before_widening, widened_in_place=True).changes
    assert plan_schema({"n": LongType()}, before_widening).incompatible  # no DDL messages
    assert plan_schema({"n": LongType()}, [{"n": LongType()}, {"n": IntegerType()}],
                       widened_in_place=True).incompatible
    assert not plan_schema(mirror, []).changes


def test_values_parse_by_the_mirror_columns_type():
    assert parser("d", DecimalType(5, 2)).from_text(["1.50", None]).to_pylist() == \
        [Decimal("1.50"), None]
    assert parser("l", ListType(1, LongType())).from_text(["{1,NULL,3}"]).to_pylist() == \
        [[1, None, 3]]
