"""Catalog facts of a source table that no row change reports: which table a name denotes (its
OID), which attribute each column is (its ``attnum``), and which heaps hold its rows (the leaf
partitions and their ``relfilenode``). Recorded with each snapshot (table property
``lakeslot.source-facts``) and compared with the catalog on every apply pass, they turn DDL and
maintenance that logical decoding does not show into a definite reason to copy the table again
(DESIGN.md invariant 8: never a silent divergence).

What a difference means (:func:`divergence`):

- No table of that name any more, or another OID: the table was dropped (and re-created); the
  rows of the new table were never in the stream.
- A mirrored column whose name now belongs to another ``attnum``: it was dropped and added
  again (its old values are gone in the source) — or another column was renamed to it.
- A mirrored column whose ``attnum`` now carries another name: it was renamed (the stream shows
  only a new column from then on).
- A mirrored column of another type (``atttypid``): ALTER … TYPE rewrote the table, perhaps with
  a USING expression that changed every value.
- Partitioned tables: another set of leaf partitions (ATTACH, DETACH, DROP — rows appear or
  vanish without any change in the stream), or a leaf with another ``relfilenode`` (TRUNCATE of
  one partition is not published through the root; VACUUM FULL and CLUSTER of a partition also
  show here, and cost a needless copy).

Inheritance children (``INHERITS``) are not facts of their parent: each mirror holds only the
rows its own table stores (``ONLY``, :mod:`lakeslot.source.publication`), which attaching or
detaching a child (``ALTER TABLE … [NO] INHERIT``) does not change; a column change that recurses
from a parent to its children is DDL of each child (:mod:`lakeslot.source.ddl_capture` writes a
message for each, and the catalog comparison sees each child's own attributes).

Invariants: the facts are read in the transaction that reads the rows (the snapshot's), so they
describe exactly the copied table; a column dropped without a replacement is not a difference
(the mirror keeps it, NULL from then on); columns added later are recorded when the apply job
adds them (:meth:`TableFacts.with_columns`).

With lakeslot's event trigger (:mod:`lakeslot.source.ddl_capture`; ``capture`` records its OID
when the facts were read) the DDL messages keep the facts current at their exact place in the
stream (:mod:`lakeslot.apply.ddl`: ``stamp`` is the last message included, ``renames`` those still
above the mirror's position), and only what no DDL message shows is compared with the catalog
(:func:`rewritten_partitions`). Without it, a partition detached, changed and re-attached between
two apply passes with the same OID and heap is not seen.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import psycopg

from lakeslot.api.naming import TableName
from lakeslot.source import ddl_capture
from lakeslot.source.tables import existing


@dataclass(frozen=True)
class TableFacts:
    oid: int
    columns: Mapping[str, int]  # column name → attnum
    partitions: tuple[tuple[int, int], ...] = ()  # (leaf oid, relfilenode); () unless partitioned
    types: Mapping[str, int] = field(default_factory=dict)  # column name → atttypid
    typmods: Mapping[str, int] = field(default_factory=dict)  # column name → atttypmod
    # lakeslot's event trigger (its OID) when these facts were read: the table then follows the
    # DDL messages (lakeslot.apply.ddl) as long as the same trigger is installed
    capture: int | None = None
    # the last DDL message these facts include, and the renames among them above the mirror's
    # position (lsn, seq, old name, new name): changes before a rename carry the old name
    stamp: tuple[int, int] = (0, 0)
    renames: tuple[tuple[int, int, str, str], ...] = ()

    def to_json(self) -> str:
        return json.dumps({"oid": self.oid, "columns": dict(self.columns),
                           "partitions": [list(p) for p in self.partitions],
                           "types": dict(self.types), "typmods": dict(self.typmods),
                           "capture": self.capture, "stamp": list(self.stamp),
                           "renames": [list(r) for r in self.renames]}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TableFacts:
        document = json.loads(text)
        return cls(int(document["oid"]), {str(k): int(v) for k, v in document["columns"].items()},
                   tuple((int(o), int(f)) for o, f in document["partitions"]),
                   {str(k): int(v) for k, v in document.get("types", {}).items()},
                   {str(k): int(v) for k, v in document.get("typmods", {}).items()},
                   document.get("capture"),
                   (int(stamp[0]), int(stamp[1])) if (stamp := document.get("stamp")) else (0, 0),
                   tuple((int(a), int(b), str(o), str(n))
                         for a, b, o, n in document.get("renames", ())))

    def with_columns(self, current: TableFacts, names: Iterable[str]) -> TableFacts:
        """These facts plus the ``attnum`` and type of columns ``names`` as ``current`` has them
        (columns the apply job just added to the mirror)."""
        added = [n for n in names if n in current.columns]
        return replace(self, columns={**self.columns, **{n: current.columns[n] for n in added}},
                       types={**self.types, **{n: current.types[n] for n in added
                                               if n in current.types}},
                       typmods={**self.typmods, **{n: current.typmods[n] for n in added
                                                   if n in current.typmods}})


def read(conn: psycopg.Connection, tables: Iterable[TableName]) -> dict[TableName, TableFacts | None]:
    """The facts of each table now (None: no ordinary or partitioned table of that name)."""
    wanted = list(tables)
    oids = existing(conn, wanted)
    if not oids:
        return dict.fromkeys(wanted)
    columns: dict[int, dict[str, int]] = {oid: {} for oid in oids.values()}
    types: dict[int, dict[str, int]] = {oid: {} for oid in oids.values()}
    typmods: dict[int, dict[str, int]] = {oid: {} for oid in oids.values()}
    for relid, name, attnum, typid, typmod in conn.execute(
            """SELECT attrelid::int8, attname, attnum, atttypid::int8, atttypmod
                 FROM pg_catalog.pg_attribute
                WHERE attrelid = ANY(%s::oid[]) AND attnum > 0 AND NOT attisdropped""",
            (list(oids.values()),)).fetchall():
        columns[relid][name] = attnum
        types[relid][name] = typid
        typmods[relid][name] = typmod
    partitions: dict[int, list[tuple[int, int]]] = {}
    for root, leaf, filenode in conn.execute(
            """SELECT r.oid::int8, c.oid::int8, c.relfilenode::int8
                 FROM pg_catalog.pg_class r, pg_partition_tree(r.oid) t
                 JOIN pg_catalog.pg_class c ON c.oid = t.relid
                WHERE r.oid = ANY(%s::oid[]) AND r.relkind = 'p' AND t.isleaf
                ORDER BY 1, 2""", (list(oids.values()),)).fetchall():
        partitions.setdefault(root, []).append((leaf, filenode))
    installed = ddl_capture.state(conn)
    capture = installed.trigger if installed is not None else None
    return {t: TableFacts(oid, columns[oid], tuple(partitions.get(oid, ())), types[oid],
                          typmods[oid], capture)
            if (oid := oids.get(t)) is not None else None for t in wanted}


def divergence(recorded: TableFacts, current: TableFacts | None,
               mirrored: Iterable[str]) -> str | None:
    """Why the mirror, copied when ``recorded`` held, can no longer follow the table by its
    changes alone (see the module docstring); None when nothing the stream misses happened.
    ``mirrored``: the mirror's columns."""
    if current is None:
        return "the table no longer exists (dropped or renamed)"
    if current.oid != recorded.oid:
        return (f"the table was dropped and created again (OID {recorded.oid} → {current.oid}); "
                "the new table's rows were never in the change stream")
    by_attnum = {attnum: name for name, attnum in current.columns.items()}
    for name in mirrored:
        attnum = recorded.columns.get(name)
        if attnum is None:
            continue
        now = current.columns.get(name)
        if now is not None and now != attnum:
            return (f"column {name!r} was dropped and added again (or another column renamed to "
                    "it): its values changed without any row change")
        if now is None and attnum in by_attnum:
            return (f"column {name!r} was renamed to {by_attnum[attnum]!r}; the stream shows "
                    "only the new name from then on")
        was, is_now = recorded.types.get(name), current.types.get(name)
        if now is not None and was is not None and is_now is not None and was != is_now:
            return (f"column {name!r} changed type: ALTER … TYPE rewrites the table, and a USING "
                    "expression may have changed stored values without any row change")
    if current.partitions != recorded.partitions:
        before, after = dict(recorded.partitions), dict(current.partitions)
        what = [f"{len(set(after) - set(before))} attached",
                f"{len(set(before) - set(after))} detached or dropped",
                f"{sum(1 for o in set(before) & set(after) if before[o] != after[o])} truncated "
                "or rewritten"]
        return ("its partitions changed (" + ", ".join(what) + "); rows appeared or vanished "
                "without changes in the stream")
    return None


def rewritten_partitions(recorded: TableFacts, current: TableFacts | None) -> str | None:
    """With DDL captured by the trigger, what it cannot see: a partition whose heap changed
    (TRUNCATE of one partition is not published through the root; VACUUM FULL and CLUSTER show
    here too and cost a needless copy). Only partitions both sides know are compared: attaching,
    detaching and creating are DDL, whose messages may still be on their way."""
    if current is None or not recorded.partitions:
        return None
    now = dict(current.partitions)
    changed = [leaf for leaf, filenode in recorded.partitions
               if leaf in now and now[leaf] != filenode]
    if not changed:
        return None
    return (f"{len(changed)} partition(s) were truncated or rewritten (TRUNCATE of a partition, "
            "VACUUM FULL, CLUSTER): rows may have vanished without changes in the stream")
