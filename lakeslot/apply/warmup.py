"""Warm-up of a long-running apply job, before its first pass.

A new JVM runs its first MERGEs 2-4× slower than later ones (class loading, Janino code
generation, JIT of Spark's and Iceberg's scan, join, Parquet and commit paths; measured on a
2-core machine: 4.4 s, 1.9 s, 1.8 s, 1.5 s, then ≈1.2 s for the same small MERGE), its first
compaction ≈ 1.5× (1.8 s, then 1.1 s for the same 16 MERGEs' debris), and its Python workers
start cold.
Paid by real passes, that cost lands in the freshness of the first minutes (a pass waits for
the maintenance before it). :func:`warm_up` pays it before the first pass instead:

1. the executors' Python workers are started with lakeslot's executor modules imported, and
   the routing values of :mod:`lakeslot.apply.spread` are learned;
2. in local mode (executors share the driver's file system): :data:`ROUNDS` MERGEs through the
   apply path's own plan — reduced rows made by a Python task, persisted and asked for their
   ``X``/``R``/``L`` rows by the reduce's :func:`lakeslot.apply.spread.persisted` — and its own
   functions (:func:`lakeslot.apply.merge.typed_source`, ``merge_sql``,
   :meth:`lakeslot.spark.tables.Tables.commit_sql`) on a scratch table of the common column
   types, in a hadoop catalog of its own (:data:`CATALOG`) under a temporary directory —
   after :data:`DELTAS` small batches through the driver's row delta
   (:class:`lakeslot.apply.small_batches.SmallBatches`, the path most passes take) —, and the
   compaction their delete files call for, by :class:`lakeslot.spark.maintenance.Maintainer`
   as a quiet mirror's (no orphan-file removal: that runs once a day).

A local run (``lakeslot run``) starts the warm-up while its snapshot runs, so the first passes
after the snapshot are warm; the apply job's own call then asks it to end after its current
step and waits for that (the first pass is not held back by the rest of the warm-up).

Invariants: one warm-up per Spark application (a second caller hurries the first and waits
for it); the warm-up never touches the ingestion's catalog, tables or staging — the scratch
catalog is a separate Spark catalog in a directory deleted afterwards, and its conf is unset. It
writes nothing anyone reads.

Failure modes: the warm-up is an optimisation. Any error in it is logged and the job goes on
(cold); it never fails the job. On a cluster (executors in pods of their own, which cannot read
the driver's temporary directory) only step 1 runs, and the first passes are reported as
catching up while they are slow (:mod:`lakeslot.observability.freshness`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from lakeslot.api.models import MaintenanceSpec
from lakeslot.api.naming import TableName
from lakeslot.apply import latest, merge, spread
from lakeslot.apply.small_batches import SmallBatches
from lakeslot.mirror import typemap
from lakeslot.mirror.contract import table_properties
from lakeslot.spark.maintenance import Maintainer
from lakeslot.spark.tables import Tables

log = logging.getLogger(__name__)
CATALOG = "lakeslot_warmup"  # a prefix: each warm-up's catalog has a name of its own
NAMESPACE = "warmup"
TABLE = "scratch"
ROUNDS = 4  # measured: the 4th MERGE of a new JVM is within 20% of the steady cost
DELTAS = 3  # small batches through the driver's row delta after them
DELTA_ROWS = 200  # ... of this many changes each
ROWS = 2000  # per MERGE: enough rows for the per-row code paths to be compiled
# the common column types (name, PostgreSQL type, typmod, a text value as pgoutput sends it)
COLUMNS = (("id", "int8", -1, "{n}"), ("i", "int4", -1, "{n}"),
           ("amount", "numeric", (12 << 16 | 2) + 4, "{n}.25"), ("note", "text", -1, "row {n}"),
           ("at", "timestamptz", -1, "2026-11-25 19:08:22.123456+00"), ("flag", "bool", -1, "t"),
           ("ratio", "float8", -1, "0.{n}"), ("day", "date", -1, "2026-11-25"))


_WARMED: dict[str, _Warming] = {}  # the Spark applications warmed up or warming in this process
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Warmed:
    merges: int  # MERGEs run on the scratch table
    seconds: float
    compacted: bool = False  # the scratch table was compacted after them
    deltas: int = 0  # small batches committed by the driver's row delta


def merges_here(master: str) -> bool:
    """Whether a session with ``master`` can run the scratch MERGEs: its executors share the
    driver's file system (local mode)."""
    return master.startswith("local")


def warm_up(spark, directory: str | Path | None = None, *, again: bool = False) -> Warmed:
    """Warm the session up (see the module docstring), once per Spark application (a restarted
    apply job in the same JVM finds it warm) unless ``again``; the scratch catalog lives in a
    new temporary directory in ``directory`` (default: the system's), deleted afterwards. A
    caller that finds a warm-up in progress asks it to hurry (it ends after its current step)
    and waits for it. Never raises."""
    started = time.monotonic()
    application = spark.sparkContext.applicationId
    with _LOCK:
        running = _WARMED.get(application)
        mine = running is None or again
        if mine:
            running = _WARMED[application] = _Warming()
    assert running is not None
    if not mine:
        running.hurry.set()  # (the first pass is due: what is warm by now will do)
        running.done.wait()
        return Warmed(0, time.monotonic() - started)
    warmed = Warmed(0, 0.0)
    try:
        spread.warm_up(spark)
        if merges_here(spark.sparkContext.master):
            warmed = _scratch_work(spark, directory, running.hurry)
    except Exception as e:  # noqa: BLE001 - an optimisation: the job goes on cold
        log.warning("apply job warm-up failed (the first passes run cold): %s", e)
    finally:
        running.done.set()
    warmed = replace(warmed, seconds=time.monotonic() - started)
    log.info("apply job warmed up: %d row deltas, %d MERGEs%s in %.1f s", warmed.deltas,
             warmed.merges, " and a compaction" if warmed.compacted else "", warmed.seconds)
    return warmed


@dataclass(frozen=True)
class _Warming:
    """A warm-up in progress (``done`` once it ended) and the request to end it soon."""

    done: threading.Event = field(default_factory=threading.Event)
    hurry: threading.Event = field(default_factory=threading.Event)


def _scratch_work(spark, directory: str | Path | None, hurry: threading.Event) -> Warmed:
    """The row deltas, the scratch MERGEs, then the compaction (step 2), each step only while
    nobody asked to ``hurry``."""
    root = Path(tempfile.mkdtemp(prefix="lakeslot-warmup-", dir=directory))
    # (a Spark catalog, once loaded, stays with its first warehouse: a new name each time)
    catalog = f"{CATALOG}_{root.name.rsplit('-', 1)[-1]}"
    prefix = f"spark.sql.catalog.{catalog}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.type": "hadoop",
            f"{prefix}.warehouse": (root / "warehouse").as_uri()}
    for key, value in conf.items():
        spark.conf.set(key, value)
    merges, deltas, compacted = 0, 0, False
    try:
        tables = Tables(spark, catalog, NAMESPACE)
        tables.ensure_namespace(NAMESPACE)
        mapped = [typemap.map_column(name, typemap.PgType(pg, typmod=typmod), key=name == "id")
                  for name, pg, typmod, _ in COLUMNS]
        tables.create(TABLE, typemap.mirror_schema(mapped), table_properties({}), 0)
        small = SmallBatches(spark)
        for round_ in range(DELTAS):  # first: the path most passes take
            if hurry.is_set():
                break
            deltas += _row_delta(spark, tables, small, round_)
        qualified = tables.qualified(TABLE)
        for round_ in range(DELTAS, DELTAS + ROUNDS):
            if hurry.is_set():
                break
            began = time.monotonic()
            state = tables.load(TABLE)
            assert state is not None  # just created
            reduced = _reduced(spark, round_)
            try:
                source = merge.typed_source(reduced.filter(F.col("kind") == "F"), TABLE, state,
                                            spark.table(qualified).schema, (),
                                            [c[0] for c in COLUMNS], {})
                try:
                    tables.commit_sql(TABLE, merge.merge_sql(source, qualified, False),
                                      round_ + 1)
                finally:
                    merge.drop(spark, source)
            finally:
                reduced.unpersist()
            merges += 1
            log.debug("warm-up MERGE %d: %.2f s", merges, time.monotonic() - began)
        if not hurry.is_set():
            maintainer = Maintainer(spark, MaintenanceSpec(orphan_file_age_hours=0),
                                    small.positions)
            compacted = maintainer.maintain(tables.iceberg_table(TABLE), TABLE,
                                            idle=True) is not None
    finally:
        for key in conf:
            spark.conf.unset(key)
        shutil.rmtree(root, ignore_errors=True)
    return Warmed(merges, 0.0, compacted, deltas)


def _row_delta(spark, tables: Tables, small: SmallBatches, round_: int) -> int:
    """A small batch of the scratch table committed by the driver's row delta, its rows
    collected as a pass collects them: 1 (0 if it fell back to a MERGE, which it should not)."""
    state = tables.load(TABLE)
    assert state is not None  # created by the caller
    reduced = _reduced(spark, round_, DELTA_ROWS)
    try:
        rows = spread.final_rows(reduced)
    finally:
        reduced.unpersist()
    return int(small.apply(tables.iceberg_table(TABLE), TableName(NAMESPACE, TABLE), state, rows,
                           frozenset(), [c[0] for c in COLUMNS], {}, {}, round_ + 1))


def _reduced(spark, round_: int, rows: int = ROWS) -> DataFrame:
    """:data:`lakeslot.apply.spread.REDUCED` ``F`` rows for the scratch table, made by a Python
    task, persisted and asked for their ``X``/``R``/``L`` rows by
    :func:`lakeslot.apply.spread.persisted` — the plan of a real reduce, whose code Spark
    generates and compiles on its first run (the first pass after a warm-up without it reduced
    in 0.8-0.9 s, the next ones in 0.25 s). Each round updates half the previous round's keys,
    deletes a tenth of them and inserts new ones."""
    frame, _ = spread.persisted(latest.slices(spark, 1).mapInArrow(
        _Reduced(round_ * ROWS // 2, round_ * ROWS, rows), from_arrow_schema(spread.REDUCED)))
    return frame


@dataclass(frozen=True)
class _Reduced:
    """Executors: :data:`ROWS` reduced rows of the scratch table from key ``first`` on."""

    first: int
    lsn: int  # the first row's commit LSN
    rows: int = ROWS

    def __call__(self, ids: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        count = self.rows
        for _ in ids:  # (one slice)
            keys = range(self.first, self.first + count)
            yield pa.RecordBatch.from_pydict({
                "t": [0] * count, "kind": ["F"] * count,
                "lsn": [self.lsn + n for n in range(count)],
                "seq": [0] * count, "op": ["D" if n % 10 == 3 else "U" for n in keys],
                "values": [[t.replace("{n}", str(n)) for _, _, _, t in COLUMNS] for n in keys],
                "flags": ["v" * len(COLUMNS)] * count, "source": [None] * count,
                "info": [None] * count}, schema=spread.REDUCED)
