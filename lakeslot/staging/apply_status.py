"""The apply job's status document, ``<staging>/apply-status.json``: the contract between the
apply job, which rewrites it after every pass (:meth:`lakeslot.apply.passes.Passes.run_pass`), and
its readers — local mode (``lakeslot run``, ``lakeslot status``, metrics) and the operator.

The document (JSON object): ``version``, ``ingestion``, ``updatedAt``, ``batchEnd``,
``segmentsDeleted``, ``tables`` (each table's outcome of the last pass: ``state`` applied |
advanced | current | waiting | failed | retrying, ``error``, ``lsn``...), ``totals`` (counters
since the job started) and, while passes fail as a whole, :data:`FAILED_PASSES`
(:class:`PassFailures`).

A table's ``lsn`` is the position the mirror reflects after the pass; ``committedLsn``, when
set, is the lower one the mirror itself records: an idle table whose advance the apply job keeps
in memory (:mod:`lakeslot.apply.coverage`). :func:`covered` reads them for the progress readers.

Invariants: a pass that works rewrites the document without :data:`FAILED_PASSES`; a failed pass
keeps the last tables and adds to the count, so the count survives the job's restarts (the
spark-operator restarting the application, local mode's supervisor restarting the job) — which
is how the same failure again and again is told from a hiccup. Readers need only this module.
Failure modes: a document that cannot be written (staging being what fails) is not counted; the
job's own end (a FAILED SparkApplication, the run's exit) then says what happened.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from lakeslot import lsn_text
from lakeslot.api.naming import TableName

DEGRADED_AFTER = 3  # passes failed as a whole in a row → degraded
FAILED_PASSES = "failedPasses"


@dataclass(frozen=True)
class PassFailures:
    """Passes in a row that failed as a whole, as the status document keeps them
    (``failedPasses``): the count survives the job's restarts (the operator's SparkApplication
    restarting, local mode's supervisor), which is how "the same failure again and again" is
    seen at all; the first pass that works drops it."""

    count: int = 0
    error: str = ""
    since: str | None = None

    @classmethod
    def of(cls, document: Mapping | None) -> PassFailures:
        entry = (document or {}).get(FAILED_PASSES) or {}
        return cls(int(entry.get("count", 0)), str(entry.get("error", "")), entry.get("since"))

    def failed(self, error: str, now: dt.datetime) -> PassFailures:
        since = self.since if self.count else now.strftime("%Y-%m-%dT%H:%M:%SZ")
        return PassFailures(self.count + 1, error, since)

    @property
    def degraded(self) -> bool:
        return self.count >= DEGRADED_AFTER

    def document(self) -> dict:
        return {"count": self.count, "error": self.error, "since": self.since,
                "degraded": self.degraded}


def degraded_message(document: Mapping | None) -> str | None:
    """What the apply job's status document says when its passes keep failing as a whole
    (``Streaming: ApplyDegraded``), or None. Pure: the operator and local mode both ask it."""
    failures = PassFailures.of(document)
    if not failures.degraded:
        return None
    return (f"the apply job's passes failed {failures.count} times in a row since "
            f"{failures.since} (not one table's problem: staging, the catalog or the job itself); "
            f"last error: {failures.error}")


def covered(document: Mapping | None) -> dict[TableName, tuple[int, int]]:
    """The tables the apply job's last pass reports covered above their mirror's position:
    table → (the mirror's committed ``lakeslot.lsn``, the position it reflects). Pure."""
    found: dict[TableName, tuple[int, int]] = {}
    for entry in (document or {}).get("tables", []):
        committed, position = entry.get("committedLsn"), entry.get("lsn")
        if committed is not None and position is not None:
            found[TableName(entry["schema"], entry["name"])] = (lsn_text.parse(committed),
                                                                lsn_text.parse(position))
    return found
