"""An idle table's advance, kept in memory instead of committed every pass.

A table the batch does not change still moves with the batch end. Committing that as an empty
snapshot every pass (``advanced``) costs one Iceberg commit per idle table per pass, about
70 ms each on the hadoop catalog: with hundreds of mostly idle tables, that was most of a pass,
and the busy tables waited for it. So a continuous apply job remembers, per idle table, that no
change of it is staged between the mirror's ``lakeslot.lsn`` (``committed``) and the batch end
it has seen (``covered``), and commits the advance only when it is due.

Invariants:

- A table is covered to ``C`` above its committed position ``L`` only when passes found nothing
  of it in staging up to ``C``: no change, no TRUNCATE, no schema change to replay, and it has
  no changelog (each changelog pass is its own commit). So the mirror at ``L`` equals the
  source as of ``C``: what an empty commit at ``C`` would say, without the commit.
- The memory holds only while the mirror stays at ``L``: any commit that moves its position
  (this job's, a re-snapshot) drops it (:meth:`Coverage.state`).
- Passes read staging from ``C`` (:attr:`lakeslot.mirror.contract.TableState.position`), but
  retention keeps everything above ``L`` (:attr:`lakeslot.apply.outcomes.TableOutcome.durable`):
  after a restart the job starts again from ``L`` and finds nothing of that table up to ``C``.
- Readers learn ``C`` from the status document (each table's ``lsn`` with ``committedLsn``
  below it): :func:`lakeslot.mirror.progress.with_coverage`. So an idle table is not shown as
  behind (status, freshness, metrics), and ``lakeslot verify`` does not wait for a commit.
- Consistent reads do not wait for the commit either: the pass's cut
  (:mod:`lakeslot.apply.cut_record`) names the table's committed snapshot at ``L`` as its
  snapshot of the cut at ``C``.
- An advance is due :data:`COMMIT_AFTER_S` to twice that after the table's first uncommitted
  one, spread by the table's name so tables idle since the same pass do not all commit in the
  same later pass. A ``--once`` run commits every advance at once (nothing outlives it).

Failure modes: none of its own (memory only). A crash loses it; the restarted job reads staging
again from the committed positions.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from lakeslot.api.naming import TableName
from lakeslot.mirror.contract import TableState

COMMIT_AFTER_S = 300.0  # an idle table commits its advance after 300-600 s (see the docstring)


@dataclass(frozen=True)
class _Covered:
    committed: int  # the mirror's lakeslot.lsn
    covered: int  # nothing of the table is staged above committed up to this
    due: float  # when the advance is committed (the clock's time)


class Coverage:
    """The job's idle tables' advances not committed yet (``keep``: False in a ``--once`` run,
    which commits them all)."""

    def __init__(self, *, keep: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep, self.clock = keep, clock
        self._covered: dict[TableName, _Covered] = {}  # (each table's entry: one thread's)

    def state(self, table: TableName, state: TableState) -> TableState:
        """``state`` (the mirror as the catalog has it) with the position it is covered to, while
        its committed position is the one the coverage started from."""
        entry = self._covered.get(table)
        if entry is None:
            return state
        if entry.committed != state.lsn:  # committed since (or replaced): forgotten
            del self._covered[table]
            return state
        return replace(state, covered=entry.covered)

    def commit_due(self, table: TableName, state: TableState, lsn: int) -> bool:
        """Whether the idle table's advance to ``lsn`` is to be committed now; if not, it is
        remembered (``state.lsn`` is the mirror's committed position)."""
        if not self.keep or state.lsn is None:
            return True
        now = self.clock()
        entry = self._covered.get(table)
        due = entry.due if entry is not None else now + COMMIT_AFTER_S * (1 + spread(table))
        if now >= due:
            self._covered.pop(table, None)
            return True
        self._covered[table] = _Covered(state.lsn, lsn, due)
        return False


def spread(table: TableName | str) -> float:
    """A fraction in [0, 1) that depends only on the table's name."""
    return zlib.crc32(str(table).encode()) / 2 ** 32
