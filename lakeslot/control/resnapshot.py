"""Which tables to copy again, each alone and online, and which the loop guard holds back — one
decision for the operator and ``lakeslot run`` (pure: progress and spec in, a decision out).

A table is copied again when

- the user asked for it: ``spec.source.tables[].resnapshotGeneration`` above the generation last
  acted on (``status.tables[].observedResnapshotGeneration``); the request is recorded at once
  with the LSN the new snapshot must reach (the table's position when the request was seen), and
  it is served once the mirror's ``lakeslot.snapshot-lsn`` reaches it — so a reconcile that runs
  while the copy completes does not ask again; the same request, with the LSN it joined at, is
  made for a table that joined the publication again with a mirror
  (:func:`lakeslot.control.steps.check_source`: what changed while it was out is in no stream).
  One rule, :func:`serve_requests`, on the status rows, for the operator and ``lakeslot run``
  (which keeps the rows in its state directory); or
- the apply job stopped it with an error whose way out is a re-snapshot it may start by itself
  (``policies.onSchemaChange: Resnapshot``: DDL, a rewrite, partition maintenance, a drop and
  re-create — see :mod:`lakeslot.apply.evolution`), and fewer than
  ``policies.maxResnapshotsPerHour`` re-snapshots of it were committed within the last hour.

Invariants:

- Online: only the wanted tables are copied; the others keep streaming. The copy replaces the
  mirror in one Iceberg commit at a new snapshot LSN ``s`` greater than the table's position, so
  the apply rule (DESIGN.md rule 3) takes over from ``s`` without a gap or a duplicate, and the
  apply job's error (in force only at the old position) is lifted by the move itself.
- Each wanted table maps to the LSN its new snapshot must reach (its position + 1): the snapshot
  job's ``min_snapshot_lsn``, so a table copied once by the job is not copied again by its retry.
- Tables without a snapshot are not this module's business (the ordinary snapshot takes them).

Failure modes: none (no I/O). A table held back by the guard stays stopped with the reason in
``held``; it is copied again once the hour has passed or on the user's request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from lakeslot import lsn_text
from lakeslot.api.models import PoliciesSpec, TableStatus
from lakeslot.api.naming import TableName
from lakeslot.mirror.progress import MirrorProgress


@dataclass(frozen=True)
class Decision:
    copy: dict[TableName, int] = field(default_factory=dict)  # table → min snapshot LSN
    held: dict[TableName, str] = field(default_factory=dict)  # held back by the guard: why
    requested: frozenset[TableName] = frozenset()  # copied because the user asked

    @property
    def min_snapshot_lsn(self) -> int:
        return max(self.copy.values(), default=0)


def decide(progress: Mapping[TableName, MirrorProgress], policies: PoliciesSpec,
           requested: Mapping[TableName, int] | None = None) -> Decision:
    """The re-snapshots to start now (see the module docstring); ``requested``: the tables the
    user asked to copy again, each with the LSN its new snapshot must reach."""
    asked = {t: below for t, below in (requested or {}).items()
             if t in progress and (progress[t].snapshot_lsn or 0) < below}
    copy: dict[TableName, int] = {}
    held: dict[TableName, str] = {}
    for table, p in sorted(progress.items()):
        if p.lsn is None:
            continue
        if table in asked:
            copy[table] = asked[table]
        elif p.error is not None and p.resnapshot_automatic:
            if p.resnapshots_last_hour < policies.max_resnapshots_per_hour:
                copy[table] = p.lsn + 1
            else:
                held[table] = (
                    f"{p.error} — not copied again automatically: {p.resnapshots_last_hour} "
                    f"re-snapshot(s) within the last hour (policies.maxResnapshotsPerHour: "
                    f"{policies.max_resnapshots_per_hour}); raise the table's "
                    "resnapshotGeneration to copy it now")
    return Decision(copy, held, frozenset(set(asked) & set(copy)))


@dataclass(frozen=True)
class Requests:
    """The per-table requests recorded in the status rows (:func:`serve_requests`)."""

    below: dict[TableName, int]  # table → the LSN its new snapshot must reach (for decide)
    new: frozenset[TableName]  # the user's requests recorded just now
    changed: bool  # a row was updated: keep the rows


def serve_requests(rows: Iterable[TableStatus], progress: Mapping[TableName, MirrorProgress],
                   generations: Mapping[TableName, int],
                   copying: Callable[[TableName], bool] = lambda _table: False) -> Requests:
    """The one rule for recording and serving a table's re-snapshot request, the operator's and
    ``lakeslot run``'s alike, on the ``status.tables`` rows (updated in place; ``lakeslot run``
    keeps them in its state directory). For each row of a table in ``progress``:

    - no mirror yet: there is nothing to copy again (its ordinary snapshot, taken after it
      joined, copies it): its ``resnapshotBelowLsn`` is cleared — unless a copy of it runs now
      (``copying``), which serves it;
    - ``generations[table]`` (``spec.source.tables[].resnapshotGeneration``) above the row's
      ``observedResnapshotGeneration``: a new request, recorded at once — the generation
      observed, ``resnapshotBelowLsn`` the mirror's position + 1 —, so it is asked once however
      often this runs and whatever stops in between;
    - ``resnapshotBelowLsn`` (the user's request, or a table that joined the publication again:
      :func:`lakeslot.control.steps.check_source`) is served once the mirror's snapshot LSN
      reaches it, then cleared; until then the table is requested with it."""
    below: dict[TableName, int] = {}
    new: set[TableName] = set()
    changed = False
    for row in rows:
        table = TableName(row.schema_name, row.name)
        p = progress.get(table)
        if p is None:
            continue
        if p.lsn is None:
            if row.resnapshot_below_lsn is not None and not copying(table):
                row.resnapshot_below_lsn, changed = None, True
            continue
        generation = generations.get(table, 0)
        if generation > row.observed_resnapshot_generation:
            row.observed_resnapshot_generation = generation
            row.resnapshot_below_lsn = lsn_text.format(p.lsn + 1)
            new.add(table)
            changed = True
        if row.resnapshot_below_lsn is not None:
            lsn = lsn_text.parse(row.resnapshot_below_lsn)
            if (p.snapshot_lsn or 0) >= lsn:
                row.resnapshot_below_lsn, changed = None, True
            else:
                below[table] = lsn
    return Requests(below, frozenset(new), changed)
