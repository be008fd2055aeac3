"""The apply job: sealed segments → per-table MERGE commits, each tagged with the LSN it reflects.

:func:`run` is the whole job: ``spark_jobs/apply.py`` calls it, and local mode calls it in-process
with its own SparkSession::

    result = run(spark, job_input, once=True)          # one pass over everything sealed now
    run(spark, job_input, once=False, stop=event)      # until ``stop`` is set

A pass (:meth:`lakeslot.apply.passes.Passes.run_pass`: how a pass schedules its tables; its
collaborators, wired by :class:`Applier`: :mod:`.table_pass` is what happens to one table —
:mod:`.evolution` its schema, :mod:`.changelog` its history, :mod:`.source_tables` what it reads
from the source —, :mod:`.reduction` reduces the batch, :mod:`.failures` runs each table's work
and says how it failed, :mod:`.upkeep` expires, compacts and deletes applied segments,
:mod:`.outcomes` holds what a pass reports):

1. Each table's state comes from the catalog (``lakeslot.lsn`` of its current snapshot is its
   position ``L``). A missing mirror is created empty at position 0 (everything staged applies)
   when ``spec.snapshot.mode`` is ``never``; with ``initial`` the table waits for its snapshot
   (``waiting``, not an error). A table whose definite error is in force is skipped.
2. The batch is planned on the driver from the segments' footers and small columns
   (:func:`lakeslot.apply.spread.scan`: at most ``max_segments`` sealed segments in LSN order
   from the lowest position; a capped batch is followed at once by the next), each segment
   fetched whole once and read from memory by the driver (:mod:`.segment_cache`: on an object
   store an open is a round trip or two). Each table takes the changes above its own position
   (DESIGN.md rule 3: rewind and idempotency in one rule).
   The rows themselves are read, routed by key and reduced on the executors, one Spark job for
   every table with changes (:func:`lakeslot.apply.spread.reduce`), and parsed into the mirror's
   types there (:func:`lakeslot.apply.merge.typed_source`: by Spark's casts where they are exact,
   else by the shared Python type mapping): the driver never handles a change row by row, and
   its memory does not grow with the batch (DESIGN.md "Scale").
3. Per table: first the source facts (:mod:`lakeslot.source.facts`: dropped and re-created,
   renamed or re-added columns, partitions attached, detached, dropped or truncated — what no
   row change shows) → marked for re-snapshot; TRUNCATE per ``onTruncate``; schema changes per
   ``onSchemaChange`` (added columns added, with the value existing rows got from a constant
   default; dropped columns kept and NULL from then on; a type change, a default PostgreSQL
   wrote by rewriting the table, or anything incompatible → marked for re-snapshot: DESIGN.md
   invariant 8, never a silent divergence); the changelog table (when enabled) is appended
   first, then the mirror is MERGEd; each is one commit with ``lakeslot.lsn = batch end - 1``.
   A table without changes advances to that position without rewriting data: by an empty
   commit, or in a continuous job in memory until that commit is due
   (:mod:`lakeslot.apply.coverage`).
4. Upkeep (:mod:`lakeslot.apply.upkeep`): each table committed to has its old snapshots
   expired at most once an hour, by its ``history.expire.*`` properties (new tables also delete
   superseded metadata files, see :data:`lakeslot.mirror.contract.TABLE_DEFAULTS`), so a commit
   per pass does not pile up; and is compacted where due (``spec.sink.maintenance``,
   :mod:`lakeslot.mirror.maintenance_policy`: delete files and small files merge-on-read MERGEs leave,
   manifests, orphan files), within a time budget per pass, in commits that keep its position.
   Retention: sealed segments wholly at or below every table's position and older than
   ``spec.staging.retentionSeconds`` are deleted (never the furthest segment, where the reader
   resumes; nothing while a table waits for its snapshot).
5. The status document ``<staging>/apply-status.json`` is rewritten
   (:mod:`lakeslot.staging.apply_status`).

Exactly once: the only state is in Iceberg (each table's position, committed atomically with its
data) and in the immutable segments. A crash anywhere — between table commits, during a MERGE,
after a commit before retention — leaves every table at a position it really reflects; the next
pass reapplies exactly the changes above it. The changelog commits before its mirror, so it is
never behind it: after a crash between the two it is skipped, and the mirror catches up.

Errors (every table is its own failure domain: :mod:`lakeslot.apply.isolation`):

- Definite (:class:`lakeslot.apply.changes.TableError`, unmappable values): recorded on the table
  (``lakeslot.apply-error`` and friends, see :mod:`lakeslot.spark.tables`) and in the status
  document; that table stops, the others go on. ``resnapshot``: the way out is a re-snapshot,
  which lifts the error by moving the table's position.
- Any other error of one table's work (a Spark analysis error, an executor's exception, a failed
  MERGE or maintenance), or a transient one that keeps failing it while others pass: that table
  fails alone, recorded with when it is tried again; the first pass that works lifts it. A failed
  reduction of the whole batch is narrowed down to the tables it fails for.
- Transient (Spark/py4j, catalog and storage ``OSError``, PostgreSQL connection errors): retried
  ``max_attempts`` times with backoff within the pass, then reported as ``retrying`` and retried
  by the next pass.
- A pass that fails as a whole raises (the job ends; its supervisor restarts it) and is counted
  in the status document: repeated, it is ``ApplyDegraded`` in every status.
- A table whose position is below the first staged segment (the slot was recreated after it was
  lost, or segments were deleted by hand) is a definite error of that table: its changes are
  missing, and its re-snapshot lifts the error. A gap between staged segments
  (:class:`lakeslot.staging.segments.GapError`) fails the job: nothing is applied past it.

Hooks (:class:`lakeslot.apply.outcomes.Hooks`) are called at the named points of
:data:`lakeslot.apply.outcomes.POINTS`; tests raise from them to
simulate a crash at that point.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from lakeslot.apply import warmup
from lakeslot.apply.failures import Failures
from lakeslot.apply.outcomes import ApplyResult, Hooks, PassResult, Totals
from lakeslot.apply.passes import Passes
from lakeslot.apply.reduction import Reduction
from lakeslot.apply.segment_cache import SegmentCache
from lakeslot.apply.source_tables import SourceTables
from lakeslot.apply.table_pass import TablePass
from lakeslot.apply.upkeep import EXPIRE_INTERVAL_S, Upkeep
from lakeslot.spark.session import make_active
from lakeslot.spark.tables import Tables
from lakeslot.workloads import JobInput


def run(spark, job: JobInput, *, once: bool, stop: threading.Event | None = None,
        hooks: Hooks | None = None, max_segments: int = 256, max_attempts: int = 3,
        environ=None, expire_interval_s: float = EXPIRE_INTERVAL_S,
        on_pass: Callable[[PassResult], None] | None = None) -> ApplyResult:
    """Apply staged changes to ``job.tables`` (see the module docstring). ``once``: passes until
    everything sealed when it started is applied, then return; otherwise until ``stop`` is set,
    a pass starting every ``spec.apply.triggerIntervalSeconds`` (at once after a longer one),
    just after the reader's seals when the interval allows (:mod:`lakeslot.cadence`).
    ``on_pass`` is given each pass's outcome as it ends (benchmarks time passes with it).
    Returns the last pass's outcome."""
    stop = stop or threading.Event()
    applier = Applier(spark, job, hooks or Hooks(), max_segments, max_attempts, environ,
                      expire_interval_s, continuous=not once, stop=stop)
    result = ApplyResult()
    try:
        if not once:
            warmup.warm_up(spark)
        while True:
            started = time.time()
            try:
                result.last = applier.passes.run_pass()
            except Exception as e:
                applier.failures.pass_failed(e)  # counted in the status document
                raise
            result.passes += 1
            result.steps = applier.totals.seconds  # (every pass of this run: the applier's)
            if on_pass is not None:
                on_pass(result.last)
            if stop.is_set() or (once and not result.last.capped):
                return result
            if not result.last.capped:  # passes start every interval, on the seals' grid
                # (lakeslot.cadence); a long one is followed at once
                stop.wait(applier.passes.until_next_pass(started))
    finally:
        applier.close()


class Applier:
    """The apply job's collaborators, wired once per job: :class:`~lakeslot.apply.passes.Passes`
    schedules each pass's tables through :class:`~lakeslot.apply.table_pass.TablePass` (which
    reads the source through :class:`~lakeslot.apply.source_tables.SourceTables`) and
    :class:`~lakeslot.apply.reduction.Reduction`; :class:`~lakeslot.apply.failures.Failures` and
    :class:`~lakeslot.apply.upkeep.Upkeep` serve them all."""

    def __init__(self, spark, job: JobInput, hooks: Hooks, max_segments: int, max_attempts: int,
                 environ=None, expire_interval_s: float = EXPIRE_INTERVAL_S, *,
                 continuous: bool = True, stop: threading.Event | None = None) -> None:
        spec = job.ingestion.spec
        make_active(spark)  # (again at every pass: the JVM thread may lose it)
        tables = Tables(spark, spec.sink.catalog.name, spec.sink.namespace)
        staging = SegmentCache(spec.staging.uri)  # (what the driver reads of a pass: fetched once)
        self.totals = Totals()
        self.failures = Failures(tables, job.names, staging, self.totals, max_attempts)
        self.sources = SourceTables(job, job.source(environ))
        work = TablePass(spark, job, tables, hooks, self.failures, self.sources,
                         continuous=continuous)
        upkeep = Upkeep(spark, spec, tables, staging, hooks, self.totals, expire_interval_s, stop,
                        work.small.positions)
        self.passes = Passes(spark, job, tables, staging, hooks, self.failures, self.totals, work,
                             Reduction(spark, staging, self.failures), upkeep,
                             max_segments, continuous=continuous)

    def close(self) -> None:
        self.sources.close()
