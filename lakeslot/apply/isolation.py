"""Failure isolation in the apply job: one table's failure never stalls another (DESIGN.md
"Isolation"), and a failure that belongs to no table is reported, not retried in silence.

Invariants:

- An error raised by one table's own work — its plan, reduction, parse, MERGE, schema evolution,
  changelog or maintenance — fails that table only; every other table's pass goes on. The failed
  table's position does not move, and retention keeps every segment above the lowest position of
  all tables (failed ones included), so its changes wait in staging: nothing is lost, and it
  catches up exactly once it works again (DESIGN.md rule 3).
- Three kinds of table failure, by what ends them:

  - *definite* (:class:`lakeslot.apply.changes.TableError`, an unmappable value): recorded on the
    mirror until a re-snapshot moves its position (:mod:`lakeslot.mirror.contract`);
  - *retryable* — any other error of the table's work (a Spark analysis error, an executor's
    exception, a MERGE Iceberg refuses), a transient error that keeps failing the table while
    others pass (:data:`TRANSIENT_STREAK` passes in a row), maintenance failing
    :data:`MAINTENANCE_STREAK` times in a row or with a non-transient error: recorded on the
    mirror with when it is tried again (:func:`retry_delay_s`: 30 s, doubled per failure in a row,
    at most 30 min), so the table is ``Failed`` in every status with the error; the job tries it
    again at that time (a new ``lakeslot run --once`` at once) and the first pass that works
    lifts the error;
  - *transient* (connection, storage, Spark executor lost:
    :func:`lakeslot.errors.transient_in_spark`): retried within the pass, then ``retrying``, and
    the next pass tries again.

- A batch's reduction runs for every table at once; when it fails it is split in halves, and
  halves again, until each failing table is found alone (:func:`halves`): the tables of every
  half that works are applied in the same pass.
- A failure of the pass itself (staging unreachable, the catalog down: nothing to do with one
  table) ends the job as before — local mode's supervisor or the spark-operator restarts it —
  and is counted in the status document (:class:`lakeslot.staging.apply_status.PassFailures`);
  after a few such failures in a row the operator and ``lakeslot status`` show
  ``Streaming: ApplyDegraded`` with the error, and ``Degraded`` is True.

Pure (no Spark session, no catalog): :mod:`lakeslot.apply.failures` does the I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TypeVar

RETRY_BASE_S = 30.0
RETRY_MAX_S = 1800.0
TRANSIENT_STREAK = 3  # passes in a row a table fails transiently while others pass → retryable
MAINTENANCE_STREAK = 3  # maintenance failures of a table in a row → retryable failure
T = TypeVar("T")


def retry_delay_s(failures: int) -> float:
    """How long a table that failed ``failures`` times in a row waits before it is tried again."""
    return min(RETRY_MAX_S, RETRY_BASE_S * 2.0 ** max(0, failures - 1))


def retry_message(error: str, failures: int, retry_at: float) -> str:
    """The status message of a retryable failure: the error, and when it is tried again."""
    when = dt.datetime.fromtimestamp(retry_at, dt.UTC).strftime("%H:%M:%S UTC")
    times = "once" if failures == 1 else f"{failures} times in a row"
    return (f"{error} (failed {times}; the other tables go on, this one's changes wait in "
            f"staging and it is tried again at {when}, or at once by a new run; nothing is lost)")


def halves(items: Sequence[T]) -> tuple[Sequence[T], Sequence[T]]:
    """``items`` split in two (the first half the smaller): how a failed reduction is narrowed
    down to the tables it fails for."""
    middle = len(items) // 2
    return items[:middle], items[middle:]


class Streaks:
    """Failures in a row per key (a table, a mirror): :meth:`failed` counts one more and says how
    many, :meth:`passed` forgets the key."""

    def __init__(self) -> None:
        self._counts: dict[object, int] = {}

    def failed(self, key: object) -> int:
        self._counts[key] = self._counts.get(key, 0) + 1
        return self._counts[key]

    def passed(self, key: object) -> None:
        self._counts.pop(key, None)
