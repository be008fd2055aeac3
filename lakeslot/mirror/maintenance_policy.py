"""What maintenance a mirror table is due, and when (pure: a snapshot summary, a record and the
spec in, a decision out). :class:`lakeslot.spark.maintenance.Maintainer` runs what is decided here.

Why: mirror tables are written merge-on-read (:data:`lakeslot.mirror.contract.TABLE_DEFAULTS`),
so a MERGE costs what its changes cost, not what the table costs; but every pass leaves small
data files and position-delete files that every reader must merge, and a commit per pass grows
the manifest list. Compaction rewrites the data files that carry deletes or are too small, which
applies the deletes and drops the delete files; manifests are rewritten with it.

Invariants:

- What is due is decided by :func:`due` from the current snapshot's summary totals
  (:class:`Health`), and when maintenance last ran and how long it took (:class:`Record`, kept
  on the table as properties: no snapshot, the position is untouched), so a restarted job does
  not compact again at once. Its cost is bounded by ``maxTimeShare``: after a run of d seconds
  the table waits d × (1 − share) ÷ share — small tables are compacted often (their readers see
  little debris), big ones rarely (their debris is small beside them). A table idle in a pass
  has its delete files compacted away as soon as that allows, so readers of a quiet table merge
  nothing.
- Orphan files are looked for with a compaction once a day (:data:`ORPHAN_INTERVAL_S`), the
  first time a day after the table's first compaction (that one starts the clock).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from lakeslot.api.models import MaintenanceSpec
from lakeslot.mirror.contract import (
    MAINTENANCE_AT_PROPERTY,
    MAINTENANCE_SECONDS_PROPERTY,
    ORPHANS_AT_PROPERTY,
)

DELETED_ROWS_RATIO = 0.2  # compact once position deletes exceed this share of the live rows
DELETED_ROWS_MIN = 10_000  # ... and this many (merging a few deletes costs a reader nothing)
ORPHAN_INTERVAL_S = 86400.0  # orphan files are looked for once a day per table
MANIFESTS_PER_SNAPSHOT = 8  # rewrite the manifests with a compaction once there are more


@dataclass(frozen=True)
class Health:
    """A table's file statistics: the totals of its current snapshot's summary."""

    data_files: int
    delete_files: int
    records: int
    position_deletes: int
    bytes: int

    @classmethod
    def of(cls, summary: Mapping[str, str]) -> Health:
        def total(name: str) -> int:
            return int(summary.get(f"total-{name}") or 0)
        return cls(total("data-files"), total("delete-files"), total("records"),
                   total("position-deletes"), total("files-size"))


@dataclass(frozen=True)
class Record:
    """When maintenance last ran, when it last removed orphan files (Unix seconds) and how long
    its last run took, from the table's properties (:data:`MAINTENANCE_AT_PROPERTY`,
    :data:`ORPHANS_AT_PROPERTY`, :data:`MAINTENANCE_SECONDS_PROPERTY`)."""

    at: float = -math.inf
    orphans_at: float = -math.inf
    took: float = 0.0

    @classmethod
    def of(cls, properties: Mapping[str, str]) -> Record:
        def seconds(name: str, absent: float = -math.inf) -> float:
            try:
                value = float(properties[name])
            except (KeyError, ValueError):
                return absent  # absent or unreadable: as if it never ran
            return value if math.isfinite(value) else absent
        return cls(seconds(MAINTENANCE_AT_PROPERTY), seconds(ORPHANS_AT_PROPERTY),
                   max(0.0, seconds(MAINTENANCE_SECONDS_PROPERTY, 0.0)))

    def next_at(self, spec: MaintenanceSpec) -> float:
        """The earliest time of the next run: ``intervalSeconds`` after this one, and late
        enough that maintenance takes at most ``maxTimeShare`` of the time."""
        share = spec.max_time_share
        return self.at + max(float(spec.interval_seconds), self.took * (1 - share) / share)


@dataclass(frozen=True)
class Due:
    """What a table needs: compaction (why, for the outcome), and orphan-file removal with it."""

    why: str = ""  # empty: nothing is due
    orphans: bool = False

    def __bool__(self) -> bool:
        return bool(self.why)


def due(health: Health, last: Record, spec: MaintenanceSpec, target_file_bytes: int,
        now: float, *, idle: bool = False) -> Due:
    """What maintenance a table needs now: compaction once delete files, deleted rows or surplus
    small files pass their thresholds — or, when the table was ``idle`` (no change in the pass),
    once it has any delete file — never before :meth:`Record.next_at`; orphan files are looked
    for with a compaction, at most once a day and not before a day after the first one (a table
    that never needs compacting writes none)."""
    if not spec.enabled or now < last.next_at(spec):
        return Due()
    needed = max(1, math.ceil(health.bytes / max(target_file_bytes, 1)))
    reasons = []
    if health.delete_files >= spec.delete_file_threshold:
        reasons.append(f"{health.delete_files} delete files")
    if health.position_deletes >= max(DELETED_ROWS_MIN, DELETED_ROWS_RATIO * health.records):
        reasons.append(f"{health.position_deletes} deleted rows of {health.records}")
    if health.data_files - needed >= spec.small_file_threshold:
        reasons.append(f"{health.data_files} data files where {needed} would do")
    if idle and health.delete_files and not reasons:
        reasons.append(f"idle with {health.delete_files} delete files")
    orphans = (bool(reasons) and spec.orphan_file_age_hours > 0
               and math.isfinite(last.orphans_at) and now - last.orphans_at >= ORPHAN_INTERVAL_S)
    return Due(", ".join(reasons), orphans)
