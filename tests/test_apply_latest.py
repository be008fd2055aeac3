"""The vectorised latest-change-per-key path (lakeslot.apply.latest) against the reference fold
(lakeslot.apply.changes.Reducer), without Spark: the executors' steps run here on Arrow rows in
the staging format, over random streams PostgreSQL could send — inserts, updates (some changing
the key, some leaving a TOASTed column unchanged), deletes, REPLICA IDENTITY DEFAULT and FULL,
composite keys whose parts would collide if joined naively, and now and then a change without
its key. Spark's part (shuffles, reading row groups back, the same steps in one task) is
covered by the apply job's tests with large batches (tests/test_apply_backlog.py: the parallel
and the one-task path) and by ``SERIAL_CHANGES = 0`` in tests/test_apply_job.py."""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lakeslot.api.naming import TableName
from lakeslot.apply import latest
from lakeslot.apply.changes import Change, Reducer, TableError
from lakeslot.apply.spread import REDUCED, TableConfig, _Output
from lakeslot.staging.relations import Column, Relation
from lakeslot.staging.segments import NOT_IN_KEY, UNCHANGED_TOAST

T = TableName("public", "t")
COLUMNS = (Column("a", 25, -1, True), Column("b", 25, -1, True), Column("v", 25, -1, False),
           Column("big", 25, -1, False))
KINDS = {None: "n", UNCHANGED_TOAST: "u", NOT_IN_KEY: "-"}


def _relation(identity: str) -> Relation:
    return Relation(1, "public", "t", identity, COLUMNS)


def _stream(rng: random.Random, identity: str, length: int) -> list[Change]:
    """Changes of a table keyed (a, b); keys like ("x:", "1") and ("x", ":1") on purpose."""
    relation = _relation(identity)
    rows: dict[tuple[str, str], dict] = {}
    stream, lsn, seq = [], 100, 0
    parts = ["x", "x:", ":1", "1", "1:", "", "é"]

    def key_only(key):
        return {"a": key[0], "b": key[1], "v": NOT_IN_KEY, "big": NOT_IN_KEY}

    for _ in range(length):
        if rng.random() < 0.4:
            lsn, seq = lsn + 10, 0
        seq += 1
        roll = rng.random()
        if roll < 0.004:  # a change that does not carry its key: a definite error
            stream.append(Change(lsn, seq, "U", relation, {"a": None, "b": "1", "v": "z",
                                                           "big": "z"}, None))
        elif roll < 0.3 or not rows:
            key = (rng.choice(parts), rng.choice(parts))
            if key in rows:
                continue
            rows[key] = {"a": key[0], "b": key[1], "v": f"i{seq}", "big": f"B{lsn}"}
            stream.append(Change(lsn, seq, "I", relation, dict(rows[key]), None))
        elif roll < 0.45:
            key = rng.choice(sorted(rows))
            old = rows.pop(key)
            stream.append(Change(lsn, seq, "D", relation, None,
                                 dict(old) if identity == "full" else key_only(key)))
        else:
            key = rng.choice(sorted(rows))
            old = rows.pop(key)
            target = key
            if rng.random() < 0.2:
                target = (rng.choice(parts), rng.choice(parts))
                if target in rows:
                    target = key
            toast = rng.random() < 0.5
            new = {"a": target[0], "b": target[1], "v": f"u{lsn}.{seq}",
                   "big": old["big"] if toast else f"b{lsn}.{seq}"}
            rows[target] = new
            sent = {**new, "big": UNCHANGED_TOAST if toast else new["big"]}
            before: dict | None = dict(old) if identity == "full" else (
                key_only(key) if target != key else None)
            stream.append(Change(lsn, seq, "U", relation, sent, before))
    return stream


def _texts(tuple_: Mapping | None) -> tuple[str | None, list | None]:
    if tuple_ is None:
        return None, None
    kinds = "".join(KINDS.get(tuple_[c.name], "t") for c in COLUMNS)
    return kinds, [v if k == "t" else None for k, v in zip(kinds, (tuple_[c.name] for c in COLUMNS),
                                                           strict=True)]


def _segment_rows(stream: list[Change]) -> pa.Table:
    new = [_texts(c.new) for c in stream]
    old = [_texts(c.old) for c in stream]
    values = pa.list_(pa.large_string())
    return pa.table({
        "commit_lsn": pa.array([c.lsn for c in stream], pa.int64()),
        "seq": pa.array([c.seq for c in stream], pa.int64()),
        "op": [c.op for c in stream], "relation": pa.array([0] * len(stream), pa.int32()),
        "new_kinds": pa.array([k for k, _ in new], pa.string()),
        "new_values": pa.array([v for _, v in new], values),
        "old_kinds": pa.array([k for k, _ in old], pa.string()),
        "old_values": pa.array([v for _, v in old], values)})


def _finals(batches) -> dict:
    """F rows by key: (op, values, flags, source, lsn)."""
    found = {}
    for batch in batches:
        for r in batch.to_pylist():
            if r["kind"] == "F":
                found[(r["values"][0], r["values"][1])] = (r["op"], r["values"], r["flags"],
                                                           r["source"], r["lsn"])
    return found


def _reference(stream: list[Change], config: TableConfig):
    reducer = Reducer(T, config.key, events=False)
    for change in stream:
        reducer.take(change)
    output = _Output(0, config)
    return _finals(output.finals(reducer)), output.keeps


def _latest(stream: list[Change], config: TableConfig, partitions: int):
    """Keys, then Group per hash partition, then Winners for W pointers and the fold for S."""
    layout = latest.covered([stream[0].relation], T, config.key, config.names, plain=True,
                            truncated=False)
    assert layout is not None
    rows = _segment_rows(stream)
    keys = latest.Keys("unused", [], 1, [0], [0], [layout])
    compact = pa.Table.from_batches(list(keys._compact(
        rows, pa.array([0] * len(rows), pa.int32()), pa.array(range(len(rows)), pa.int64()), 0)),
        schema=latest.COMPACT)
    # a shuffle delivers a partition's rows in any order: Group must not depend on it
    shuffled = compact.take(pa.array(random.Random(len(stream)).sample(range(len(compact)),
                                                                       len(compact))))
    part = [zlib.crc32(k.encode()) % partitions for k in shuffled["key"].to_pylist()]
    decided = pa.Table.from_batches(
        [b for p in range(partitions) for b in latest.Group()(
            iter(shuffled.filter(pa.array([x == p for x in part])).to_batches()))],
        schema=latest.DECIDED).sort_by([("unit", "ascending"), ("row", "ascending")])
    chosen = decided.filter(pc.equal(decided["kind"], "W"))
    kept: set[int] = set()
    winners = latest.Winners("unused", [], [layout], REDUCED)
    found = _finals([winners._finals(0, rows.take(chosen["row"]), chosen["op"], chosen["lsn"],
                                     kept)]) if len(chosen) else {}
    entangled = sorted(set(decided.filter(pc.equal(decided["kind"], "S"))["row"].to_pylist()))
    fold, keeps = _reference([stream[i] for i in entangled], config) if entangled else ({}, set())
    assert not set(found) & set(fold)  # a key is either simple or entangled
    return {**found, **fold}, kept | keeps, (len(found), len(entangled))


@pytest.mark.parametrize("identity", ["default", "full"])
def test_the_latest_change_per_key_equals_the_fold(identity):
    config = TableConfig(T, 0, ("a", "b"), ("a", "b", "v", "big"))
    compared = errors = simple = entangled = 0
    for seed in range(200):
        rng = random.Random(seed)
        stream = _stream(rng, identity, rng.randint(5, 80))
        try:
            expected, keeps = _reference(stream, config)
        except TableError as e:  # the same definite error, found by the fold of that change
            with pytest.raises(TableError, match=f"^{re.escape(str(e))}$"):
                _latest(stream, config, 3)
            errors += 1
            continue
        for partitions in (1, 3):
            found, kept, (winners, slow) = _latest(stream, config, partitions)
            assert found == expected, (seed, partitions)
            assert kept == keeps, (seed, partitions)
            simple, entangled = simple + winners, entangled + slow
            compared += 1
    assert compared > 250 and errors > 10, (compared, errors)
    assert simple > 1000 and entangled > 1000, (simple, entangled)  # both paths, often


def test_a_composite_key_is_unambiguous_text():
    kinds = pa.array(["tt", "tt", "tn"])
    values = pa.array([["ab", "c"], ["a", "bc"], ["a", None]], pa.list_(pa.large_string()))
    text, ok = latest.key_text(kinds, values, [0, 1])
    assert text.to_pylist() == ["2:ab1:c", "1:a2:bc", None]
    assert ok.to_pylist() == [True, True, False]


def test_only_tables_with_one_description_and_their_key_in_it_are_covered():
    relation = _relation("default")
    other = Relation(2, "public", "t", "default", COLUMNS[:3])
    names = ("a", "b", "v", "big")
    layout = latest.covered([relation], T, ("a", "b"), names, plain=True, truncated=False)
    assert layout == latest.Layout(0, (0, 1), (0, 1, 2, 3), (0, 1))
    assert latest.covered([relation, other], T, ("a", "b"), names, plain=True,
                          truncated=False) is None  # two descriptions (a schema change)
    assert latest.covered([relation], T, ("a", "b"), names, plain=True, truncated=True) is None
    assert latest.covered([relation], T, ("a", "b"), names, plain=False, truncated=False) is None
    assert latest.covered([relation], T, ("a", "w"), (*names, "w"), plain=True,
                          truncated=False) is None
    dropped = latest.covered([other], T, ("a", "b"), names, plain=True, truncated=False)
    assert dropped is not None and dropped.columns == (0, 1, 2, -1)  # big: absent ('a')
