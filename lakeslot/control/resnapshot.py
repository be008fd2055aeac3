"""Which tables to copy again, each alone and online, and which the loop guard holds back — one
decision for the operator and ``lakeslot run`` (pure: progress and spec in, a decision out).

A table is copied again when

- the user asked for it: ``spec.source.tables[].resnapshotGeneration`` above the generation last
  acted on (the operator's ``status.tables[].observedResnapshotGeneration``); the request is
  recorded with the LSN the new snapshot must reach (the table's position when the request was
  seen), and it is served once the mirror's ``lakeslot.snapshot-lsn`` reaches it — so a
  reconcile that runs while the copy completes does not ask again; the same request, with the
  LSN it joined at, is made for a table that joined the publication again with a mirror
  (:func:`lakeslot.control.steps.check_source`: what changed while it was out is in no stream); or
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

from collections.abc import Mapping
from dataclasses import dataclass, field

from lakeslot.api.models import PoliciesSpec
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
