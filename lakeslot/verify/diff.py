"""The row comparison of the exact check: two sides (source rows, mirror rows) compared by key.

Invariants:

- A row is its key (the ``repr`` of its mapped key values) and a digest of all its values
  (BLAKE2b, 16 bytes, of the ``repr`` of the row's Python values): two rows are equal exactly
  when their values are, column by column, after the same mapping.
- Only keys in ``scope`` (None: all) and not in flight are compared; the others are left out of
  every count.
- Per key: in the source only is missing, in the mirror only is extra, on both sides with other
  values is differing. A key held by more rows on one side than on the other counts as missing
  (more in the source) or extra (more in the mirror); as many on both sides but other content,
  as differing.
- Counts are complete; only the first :data:`LISTED_KEYS` rows of each kind are kept (by row
  number, in key order where Arrow can sort the key's types, else in source order), and turned
  into plain keys and values for the report (:func:`key_of`, :func:`differing_entry`).

Failure modes: none of its own (no I/O); both sides must have the same columns.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from lakeslot.verify.source import FETCH_ROWS

LISTED_KEYS = 20  # keys listed per kind of difference (the counts are always complete)


@dataclass(frozen=True)
class Side:
    rows: pa.Table  # sorted by key where Arrow can sort the key's types
    table: pa.Table  # k: repr of the mapped key, h: digest of the row, i: row number in ``rows``


def side(rows: pa.Table, key_names: list[str]) -> Side:
    if rows.num_rows:
        # A key type Arrow cannot sort: listed keys then come in source order.
        with contextlib.suppress(pa.ArrowNotImplementedError, pa.ArrowTypeError):
            rows = rows.sort_by([(k, "ascending") for k in key_names])
    where = [rows.column_names.index(k) for k in key_names]
    keys: list[str] = []
    digests: list[bytes] = []
    for batch in rows.to_batches(FETCH_ROWS):
        for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            keys.append(repr(tuple(row[i] for i in where)))
            digests.append(hashlib.blake2b(repr(row).encode(), digest_size=16).digest())
    return Side(rows, pa.table({"k": pa.array(keys, pa.string()),
                                "h": pa.array(digests, pa.binary(16)),
                                "i": pa.array(range(len(keys)), pa.int64())}))


@dataclass
class Diff:
    compared: int = 0
    missing: list[int] = field(default_factory=list)  # rows of the source side
    extra: list[int] = field(default_factory=list)  # rows of the mirror side
    differing: list[tuple[int, int]] = field(default_factory=list)  # (source row, mirror row)
    missing_count: int = 0
    extra_count: int = 0
    differing_count: int = 0


def diff(source: Side, mirror: Side, in_flight: set[str], scope: set[str] | None) -> Diff:
    """Compare the rows whose key is in ``scope`` (None: all) and not in flight."""
    s, m = source.table, mirror.table
    if scope is not None:
        allowed = pa.array(sorted(scope), pa.string())
        s = s.filter(pc.is_in(s["k"], value_set=allowed))
        m = m.filter(pc.is_in(m["k"], value_set=allowed))
    if in_flight:
        skipped = pa.array(sorted(in_flight), pa.string())
        s = s.filter(pc.invert(pc.is_in(s["k"], value_set=skipped)))
        m = m.filter(pc.invert(pc.is_in(m["k"], value_set=skipped)))
    duplicated = _duplicated(s) | _duplicated(m)
    result = Diff()
    if duplicated:
        result = _diff_duplicated(s, m, duplicated)
        doubled = pa.array(sorted(duplicated), pa.string())
        s = s.filter(pc.invert(pc.is_in(s["k"], value_set=doubled)))
        m = m.filter(pc.invert(pc.is_in(m["k"], value_set=doubled)))
    joined = s.join(m, keys="k", join_type="full outer", left_suffix="_s", right_suffix="_m")
    missing = joined.filter(pc.is_null(joined["h_m"])).sort_by("i_s")
    extra = joined.filter(pc.is_null(joined["h_s"])).sort_by("i_m")
    both = joined.filter(pc.and_(pc.is_valid(joined["h_s"]), pc.is_valid(joined["h_m"])))
    differing = both.filter(pc.not_equal(both["h_s"], both["h_m"])).sort_by("i_s")
    result.compared += joined.num_rows
    result.missing_count += missing.num_rows
    result.extra_count += extra.num_rows
    result.differing_count += differing.num_rows
    result.missing += missing["i_s"].to_pylist()[:LISTED_KEYS]
    result.extra += extra["i_m"].to_pylist()[:LISTED_KEYS]
    result.differing += list(zip(differing["i_s"].to_pylist()[:LISTED_KEYS],
                                 differing["i_m"].to_pylist()[:LISTED_KEYS], strict=True))
    return result


def _duplicated(side: pa.Table) -> set[str]:
    if side.num_rows == pc.count_distinct(side["k"]).as_py():
        return set()
    counts = side.group_by("k").aggregate([("k", "count")])
    return set(counts.filter(pc.greater(counts["k_count"], 1))["k"].to_pylist())


def _diff_duplicated(s: pa.Table, m: pa.Table, keys: set[str]) -> Diff:
    """Keys held by more than one row on a side: more rows in the source is missing, more in
    the mirror extra, as many on both sides but other content differing."""
    def rows(side: pa.Table) -> dict[str, list[tuple[bytes, int]]]:
        found: dict[str, list[tuple[bytes, int]]] = {}
        for k, h, i in zip(*(side[c].to_pylist() for c in ("k", "h", "i")), strict=True):
            if k in keys:
                found.setdefault(k, []).append((h, i))
        return found

    left, right = rows(s), rows(m)
    result = Diff(compared=len(keys))
    for key in sorted(keys):
        a, b = sorted(left.get(key, [])), sorted(right.get(key, []))
        if len(a) > len(b):
            result.missing_count += 1
            result.missing.append(a[0][1])
        elif len(b) > len(a):
            result.extra_count += 1
            result.extra.append(b[0][1])
        elif [h for h, _ in a] != [h for h, _ in b]:
            result.differing_count += 1
            result.differing.append((a[0][1], b[0][1]))
    return result


def plain(value: object) -> object:
    """A value for JSON and text output: numbers, strings, booleans and None as they are (NaN
    and infinities as text), lists element-wise, bytes as PostgreSQL's hex form, else ``str``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return str(value)


def key_of(rows: pa.Table, index: int, key_names: list[str]) -> dict:
    row = rows.slice(index, 1).to_pylist()[0]
    return {k: plain(row[k]) for k in key_names}


def differing_entry(source: pa.Table, mirror: pa.Table, pair: tuple[int, int],
                    key_names: list[str]) -> dict:
    a, b = source.slice(pair[0], 1).to_pylist()[0], mirror.slice(pair[1], 1).to_pylist()[0]
    return {"key": {k: plain(a[k]) for k in key_names},
            "columns": {c: [plain(a[c]), plain(b[c])] for c in a if repr(a[c]) != repr(b[c])}}
