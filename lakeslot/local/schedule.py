"""What a streaming local run applies and what it copies, online, while the other tables stream:
the tables the apply job handles (:meth:`Schedule.apply_list`) and the next copy
(:meth:`Schedule.next_copy`), decided by the operator's functions —
:func:`lakeslot.control.resnapshot.decide` (which tables to copy again) and
:func:`lakeslot.control.scheduling.plan` (which tables, from which LSN) — with the per-table
backoff of :func:`lakeslot.control.scheduling.backoff_s`.

Invariants:

- A table that joins (created in a selected schema, or now usable: :mod:`.selection`) is in the
  apply job from its next restart (it waits for its snapshot, which holds staging's retention),
  and then it is copied alone, online (the snapshot job for that subset), from a snapshot taken
  after it joined: the rows written before it joined are in no stream. A copy that fails is
  retried after a backoff (30 s, doubled per failure, at most an hour); meanwhile the table is
  Pending and out of the apply job.
- A table that joins with a mirror already there (re-created, or selected again) is stopped at
  its position until its copy moves it (DESIGN.md invariant 8: its mirror misses what changed
  while it was out), and copied again the same way (its ``resnapshotBelowLsn``), as is any table
  the run's start found added.
- A table the user asks to copy again (``spec.source.tables[].resnapshotGeneration`` above the
  generation recorded in the state directory) or that the apply job marked for an automatic
  re-snapshot is copied again the same way; the generation is recorded once its copy committed.
- A table that left the selection leaves the apply job; its mirror is kept as it was.
- One copy at a time, and only of tables the running apply job handles: it keeps staging's
  retention from deleting the changes after the copy's snapshot. A table seen just now is copied
  after the restart that adds it, at the apply job's first pass.
- The mirrors are read once per finished apply pass, not on every supervision tick: only a pass
  marks a table, and a restarted apply job makes a pass at once — the first read waits for the
  first pass (the run's start has just read them all: at 1,000 mirrors on a network catalog a
  read before it held the first pass back by seconds); and those reads take at most
  :data:`DECISION_SHARE` of the run's time (:mod:`.time_share`: hundreds of mirrors aged a day
  took half the apply job's interpreter lock), so a decision may wait a few passes. Until the
  next pass finishes, the run's status takes its mirrors' progress from that read
  (:meth:`Schedule.progress_read`) instead of reading them all again.
- Local mode differs from the operator in one input of :func:`~lakeslot.control.scheduling.plan`
  (:data:`STREAMING`): while it streams, the snapshot's generation, cut-off and ``mode`` play no
  part — the run's start hands the snapshot job every table (under ``mode: never`` every table
  with a mirror: :meth:`Schedule.start_copies`), which copies what its generation and cut-off
  say is not done — so a table that joins while the run streams is copied even under ``mode:
  never``.

Failure modes: a copy's failure is its tables' (backoff, then tried again), never the run's. An
error reading the mirrors' progress from the catalog is not caught here: it ends the run, after
the run has stopped what it started.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.control import resnapshot, scheduling
from lakeslot.local import observe, state
from lakeslot.local.config import Local
from lakeslot.local.selection import Selection
from lakeslot.local.time_share import TimeShare
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.progress import MirrorProgress
from lakeslot.observability import status_report

log = logging.getLogger("lakeslot.local")

# The request of a copy made while streaming (see the module docstring): no generation, no
# cut-off, and tables without a mirror copied whatever spec.snapshot.mode says.
STREAMING = scheduling.Request(mode="initial")
DECISION_SHARE = 0.1  # of the run's time, at most, spent reading the mirrors for next_copy


@dataclass(frozen=True)
class Copy:
    """Tables to copy, online, in one snapshot job."""

    tables: tuple[TableName, ...]  # sorted
    min_snapshot_lsn: int


def copy_plan(apply_tables: Sequence[TableName], applied: Mapping[TableName, int | None],
              due: Set[TableName], again: Mapping[TableName, int]) -> scheduling.Plan:
    """The copy to make while streaming, :func:`lakeslot.control.scheduling.plan` under
    :data:`STREAMING`: of the tables the running apply job handles (``apply_tables``), those
    without a mirror (``applied``: each selected table's ``lakeslot.lsn``) that are ``due`` (joined,
    their backoff over) and those to copy ``again`` (each with the LSN its copy must reach)."""
    candidates = [t for t in apply_tables
                  if t in applied and (applied[t] is not None or t in due)]
    return scheduling.plan(candidates, {t: applied[t] for t in candidates}, STREAMING, again)


class Schedule:
    """The apply job's tables and the copies (see the module docstring)."""

    def __init__(self, local: Local, selection: Selection) -> None:
        self.local, self.selection = local, selection
        self.job = local.job
        self.mirrored: set[TableName] = set()  # tables known to have a mirror (a snapshot)
        self.started_empty: set[TableName] = set()  # mode never: the apply job creates their mirrors
        self.joined: set[TableName] = set()  # joined while streaming, without a mirror yet
        self.copy_failures: dict[TableName, tuple[int, float]] = {}  # failures, last (monotonic)
        self.apply_tables: tuple[TableName, ...] = ()  # the running apply job's tables
        self.copying: tuple[TableName, ...] = ()  # the running copy's tables
        self._copied: dict[TableName, str] = {}  # the last copy's outcome per table (its thread)
        self._decided_at = 0  # the apply passes when next_copy last read the mirrors
        self._read: dict[TableName, MirrorProgress] = {}  # what that read found
        self._share = TimeShare(DECISION_SHARE)

    def _progress(self, tables: list[TableName]) -> dict[TableName, MirrorProgress]:
        return mirror_progress.read(self.local.ingestion, tables,
                                    secrets=self.job.catalog_secrets(self.local.environ))

    @property
    def never(self) -> bool:
        """``snapshot.mode: never``: the run's start copies no table that has no mirror."""
        return self.local.ingestion.spec.snapshot.mode == "never"

    def start_copies(self, tables: list[TableName]) -> list[TableName]:
        """The tables the run's start hands to the snapshot job (which copies those whose
        generation or cut-off says so): all of them, or under ``snapshot.mode: never`` those with
        a mirror — the others start empty and stream (:meth:`streaming_tables`)."""
        if not self.never:
            return tables
        progress = self._progress(tables)
        return [t for t in tables if progress[t].lsn is not None]

    def streaming_tables(self, spark, tables: list[TableName]) -> list[TableName]:
        """After the start's snapshot: the tables with a mirror — under ``snapshot.mode: never``
        every table, the apply job creating the missing mirrors empty —, which the apply job
        takes (those that joined again with one are held until their copy: :meth:`_hold`)."""
        progress = self._progress(tables)
        self.started_empty = {t for t in tables if progress[t].lsn is None} if self.never else set()
        self.mirrored = {t for t in tables if progress[t].lsn is not None} | self.started_empty
        self._hold(spark, self.selection.joined_below(progress), progress)
        return [t for t in tables if t in self.mirrored]

    def join(self, spark, joined: set[TableName], left: set[TableName]) -> None:
        """Tables that joined while streaming, and those that left: those without a mirror wait
        for their first copy; those with one (created again, or selected again) are stopped until
        their copy, before the apply job that handles them starts (:meth:`_hold`)."""
        if joined:
            progress = self._progress(sorted(joined))
            with_mirror = {t for t in joined if progress[t].lsn is not None}
            self.mirrored |= with_mirror
            self.joined |= joined - with_mirror
            self._hold(spark, self.selection.joined_below(progress), progress)
        self.joined &= set(self.selection.tables)
        for table in left:
            self.copy_failures.pop(table, None)

    def apply_list(self) -> tuple[TableName, ...]:
        """The tables the apply job handles now: the selected ones with a mirror, those being
        copied, and those that joined and are due for a copy (waiting for it, they keep staging's
        retention from deleting changes the copy will need)."""
        return tuple(t for t in self.selection.tables if t in self.mirrored or t in self.copying
                     or (t in self.joined and self.copy_due(t)))

    def copy_due(self, table: TableName) -> bool:
        failures, at = self.copy_failures.get(table, (0, 0.0))
        return not failures or time.monotonic() >= at + scheduling.backoff_s(failures)

    def next_copy(self, passes: int) -> Copy | None:
        """The tables to copy now, online (no copy may be running): those
        :func:`lakeslot.control.resnapshot.decide` wants again and the joined tables without a
        mirror that the apply job already waits for; None when nothing is to be copied, when
        no apply pass finished since the last decision or the run's start (``passes``: the
        passes finished), or while the last decision's reads are more than
        :data:`DECISION_SHARE` of the time since. A request is read from the spec once, at the
        first call."""
        if self.copying:
            self._copy_finished()
        if passes == self._decided_at or not self._share.due():
            return None
        self._decided_at = passes
        with self._share.spent():
            return self._decide()

    def progress_read(self, passes: int) -> dict[TableName, MirrorProgress] | None:
        """The mirrors' progress as the last decision read it, if no apply pass finished since
        (``passes``: the passes finished) — what a read now would find but for the commits of
        the pass in flight; else None."""
        return self._read if self._read and passes == self._decided_at else None

    def _decide(self) -> Copy | None:
        spec, tables = self.local.ingestion.spec, self.selection.tables
        progress = self._read = self._progress(tables)
        self.mirrored = {t for t in tables if progress[t].lsn is not None or t in self.started_empty}
        self.joined -= self.mirrored
        rejoined = self.selection.joined_below(progress)
        generations = {t: options.resnapshot_generation for t in tables
                       if (options := self.job.table_spec(t)) is not None}
        served = resnapshot.serve_requests(self.selection.rows, progress, generations)
        if served.changed:
            state.write_tables(self.local.state_dir, self.selection.rows)
        decision = resnapshot.decide(progress, spec.policies, served.below)
        for table, why in decision.held.items():
            log.warning("%s: %s", table, why)
        new = {t for t in self.joined if self.copy_due(t)}
        # Only tables the running apply job waits for: it keeps staging's retention from
        # deleting the changes after the copy's snapshot. The others (a table that joined with
        # a mirror, seen just now) are copied after the restart that adds them, at its first pass.
        plan = copy_plan(self.apply_tables, {t: p.lsn for t, p in progress.items()}, new,
                         decision.copy)
        wanted = plan.wanted
        if not wanted:
            return None
        for table in (t for t in decision.copy if t in wanted):
            why = "requested (resnapshotGeneration)" if table in decision.requested \
                else progress[table].error or "marked for a re-snapshot"
            if table in decision.requested and table in rejoined:
                why = "it joined the publication (its mirror missed what happened meanwhile)"
            log.warning("TableResnapshot: copying %s again, online: %s", table, why)
        for table in sorted(new & set(wanted)):
            log.info("TableAdded: copying %s, online: it joined the publication", table)
        self.copying = wanted
        self._copied = {}
        return Copy(wanted, plan.min_snapshot_lsn)

    def copy(self, spark, copy: Copy) -> object:
        """Run ``copy`` (in a job thread); what each table came to is kept for
        :meth:`_copy_finished`, and the requests it served are recorded."""
        from lakeslot.snapshot import job as snapshot_job

        wanted = list(copy.tables)
        try:
            result = snapshot_job.run(spark, self.local.with_tables(wanted),
                                      progress=observe.snapshot_location(self.local),
                                      min_snapshot_lsn=copy.min_snapshot_lsn)
        except Exception as e:
            self._copied = dict.fromkeys(wanted, f"{type(e).__name__}: {status_report.first_line(e)}")
            raise
        self._copied = {t.source: t.error or t.state for t in result.tables}
        for table in result.tables:
            if table.error:
                log.warning("re-snapshot of %s failed: %s", table.source, table.error)
        return result

    def _copy_finished(self) -> None:
        """The copy's tables that did not commit wait for their backoff (a joined table leaves the
        apply job meanwhile); a finished copy lets the next apply pass decide again."""
        for table in self.copying:
            if self._copied.get(table) not in ("committed", "skipped"):
                failures, _ = self.copy_failures.get(table, (0, 0.0))
                self.copy_failures[table] = (failures + 1, time.monotonic())
            else:
                self.copy_failures.pop(table, None)
        self.copying = ()

    def _hold(self, spark, rejoined: dict[TableName, int],
              progress: dict[TableName, MirrorProgress]) -> None:
        """Stop each table that joined the publication again with a mirror, before an apply job
        that handles it starts, until its copy moves its position: a definite error at its
        position, which the copy lifts (DESIGN.md invariant 8: its mirror misses what changed
        while it was out, so changes must not be applied on top of it meanwhile)."""
        from lakeslot.spark.tables import Tables

        sink = self.local.ingestion.spec.sink
        mirrors = Tables(spark, sink.catalog.name, sink.namespace)
        for table, below in sorted(rejoined.items()):
            if progress[table].error is not None:  # stopped already: its error holds it
                continue
            mirrors.record_error(self.job.names.mirror_table(table), (
                f"{table} joined the publication again at {lsn_text.format(below)}: what changed "
                "while it was out of it is in no stream, so its mirror is copied again (alone, "
                "online) before it streams on"), progress[table].lsn, resnapshot=True)
