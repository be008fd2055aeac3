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
   types, in a hadoop catalog of its own (:data:`CATALOG`) under a temporary directory, then
   the compaction their delete files call for, by :class:`lakeslot.spark.maintenance.Maintainer`
   as a quiet mirror's (no orphan-file removal: that runs once a day).

Invariants: the warm-up never touches the ingestion's catalog, tables or staging — the scratch
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
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from lakeslot.api.models import MaintenanceSpec
from lakeslot.apply import latest, merge, spread
from lakeslot.mirror import typemap
from lakeslot.mirror.contract import table_properties
from lakeslot.spark.maintenance import Maintainer
from lakeslot.spark.tables import Tables

log = logging.getLogger(__name__)
CATALOG = "lakeslot_warmup"  # a prefix: each warm-up's catalog has a name of its own
NAMESPACE = "warmup"
TABLE = "scratch"
ROUNDS = 4  # measured: the 4th MERGE of a new JVM is within 20% of the steady cost
ROWS = 2000  # per MERGE: enough rows for the per-row code paths to be compiled
# the common column types (name, PostgreSQL type, typmod, a text value as pgoutput sends it)
COLUMNS = (("id", "int8", -1, "{n}"), ("i", "int4", -1, "{n}"),
           ("amount", "numeric", (12 << 16 | 2) + 4, "{n}.25"), ("note", "text", -1, "row {n}"),
           ("at", "timestamptz", -1, "2026-11-25 19:08:22.123456+00"), ("flag", "bool", -1, "t"),
           ("ratio", "float8", -1, "0.{n}"), ("day", "date", -1, "2026-11-25"))


_WARMED: set[str] = set()  # the Spark applications warmed up in this process


@dataclass(frozen=True)
class Warmed:
    merges: int  # MERGEs run on the scratch table
    seconds: float
    compacted: bool = False  # the scratch table was compacted after them


def merges_here(master: str) -> bool:
    """Whether a session with ``master`` can run the scratch MERGEs: its executors share the
    driver's file system (local mode)."""
    return master.startswith("local")


def warm_up(spark, directory: str | Path | None = None, *, again: bool = False) -> Warmed:
    """Warm the session up (see the module docstring), once per Spark application (a restarted
    apply job in the same JVM finds it warm) unless ``again``; the scratch catalog lives in a
    new temporary directory in ``directory`` (default: the system's), deleted afterwards. Never
    raises."""
    started = time.monotonic()
    merges, compacted = 0, False
    application = spark.sparkContext.applicationId
    if application in _WARMED and not again:
        return Warmed(0, 0.0)
    _WARMED.add(application)
    try:
        spread.warm_up(spark)
        if merges_here(spark.sparkContext.master):
            merges, compacted = _scratch_work(spark, directory)
    except Exception as e:  # noqa: BLE001 - an optimisation: the job goes on cold
        log.warning("apply job warm-up failed (the first passes run cold): %s", e)
    warmed = Warmed(merges, time.monotonic() - started, compacted)
    log.info("apply job warmed up: %d MERGEs%s in %.1f s", warmed.merges,
             " and a compaction" if compacted else "", warmed.seconds)
    return warmed


def _scratch_work(spark, directory: str | Path | None) -> tuple[int, bool]:
    """The scratch MERGEs, then the compaction (step 2): (MERGEs run, whether compacted)."""
    root = Path(tempfile.mkdtemp(prefix="lakeslot-warmup-", dir=directory))
    # (a Spark catalog, once loaded, stays with its first warehouse: a new name each time)
    catalog = f"{CATALOG}_{root.name.rsplit('-', 1)[-1]}"
    prefix = f"spark.sql.catalog.{catalog}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.type": "hadoop",
            f"{prefix}.warehouse": (root / "warehouse").as_uri()}
    for key, value in conf.items():
        spark.conf.set(key, value)
    merges = 0
    try:
        tables = Tables(spark, catalog, NAMESPACE)
        tables.ensure_namespace(NAMESPACE)
        mapped = [typemap.map_column(name, typemap.PgType(pg, typmod=typmod), key=name == "id")
                  for name, pg, typmod, _ in COLUMNS]
        tables.create(TABLE, typemap.mirror_schema(mapped), table_properties({}), 0)
        qualified = tables.qualified(TABLE)
        for round_ in range(ROUNDS):
            began = time.monotonic()
            state = tables.load(TABLE)
            assert state is not None  # just created
            reduced = _reduced(spark, round_)
            try:
                source = merge.typed_source(reduced.filter(F.col("kind") == "F"), TABLE, state,
                                            spark.table(qualified).schema, (),
                                            [c[0] for c in COLUMNS], {})
                try:
                    lsn = round_ + 1
                    tables.commit_sql(TABLE, merge.merge_sql(source, qualified, False), lsn)
                finally:
                    merge.drop(spark, source)
            finally:
                reduced.unpersist()
            merges += 1
            log.debug("warm-up MERGE %d: %.2f s", merges, time.monotonic() - began)
        maintainer = Maintainer(spark, MaintenanceSpec(orphan_file_age_hours=0))
        compacted = maintainer.maintain(tables.iceberg_table(TABLE), TABLE, idle=True) is not None
    finally:
        for key in conf:
            spark.conf.unset(key)
        shutil.rmtree(root, ignore_errors=True)
    return merges, compacted


def _reduced(spark, round_: int) -> DataFrame:
    """:data:`lakeslot.apply.spread.REDUCED` ``F`` rows for the scratch table, made by a Python
    task, persisted and asked for their ``X``/``R``/``L`` rows by
    :func:`lakeslot.apply.spread.persisted` — the plan of a real reduce, whose code Spark
    generates and compiles on its first run (the first pass after a warm-up without it reduced
    in 0.8-0.9 s, the next ones in 0.25 s). Each round updates half the previous round's keys,
    deletes a tenth of them and inserts new ones."""
    frame, _ = spread.persisted(latest.slices(spark, 1).mapInArrow(
        _Reduced(round_ * ROWS // 2, round_ * ROWS), from_arrow_schema(spread.REDUCED)))
    return frame


@dataclass(frozen=True)
class _Reduced:
    """Executors: :data:`ROWS` reduced rows of the scratch table from key ``first`` on."""

    first: int
    lsn: int  # the first row's commit LSN

    def __call__(self, ids: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in ids:  # (one slice)
            keys = range(self.first, self.first + ROWS)
            yield pa.RecordBatch.from_pydict({
                "t": [0] * ROWS, "kind": ["F"] * ROWS, "lsn": [self.lsn + n for n in range(ROWS)],
                "seq": [0] * ROWS, "op": ["D" if n % 10 == 3 else "U" for n in keys],
                "values": [[t.replace("{n}", str(n)) for _, _, _, t in COLUMNS] for n in keys],
                "flags": ["v" * len(COLUMNS)] * ROWS, "source": [None] * ROWS,
                "info": [None] * ROWS}, schema=spread.REDUCED)
