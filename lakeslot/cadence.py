"""One clock for the reader's seals and the apply job's passes: the wall clock's grid.

Why: a change waits in staging from its seal until a pass lists it. On independent clocks the
phase between seals and passes is arbitrary, and a sealed segment waits on average half a trigger
interval. The reader seals on the grid of its seal period (the wall clock's multiples of
``segmentMaxSeconds``) and the apply job starts its passes on the same grid, a *lag* after the
seal: the newest segment then waits only the lag, the older ones of the interval a period more
(at the defaults — seals every 0.5 s, a pass every second — 0.3 s on average instead of 0.5 s).

Invariants:

- Only timing depends on this module: what is sealed, what a pass takes and every guarantee on
  them do not.
- A segment is sealed at the first grid point after it opened (when WAL moved): never older than
  the seal period, as before; only a segment opened by a size- or stop-triggered seal between
  two grid points is shorter.
- A pass starts at the grid point nearest the trigger interval after the previous start, plus the
  lag, when the interval is a whole multiple of the seal period (with the default seal period —
  half the interval, at most 10 s — every interval up to 20 s is, and every multiple of 10 s) —
  so passes keep the interval —, else the interval after the previous start as before; a pass
  that ran longer is followed at once.
- The lag follows what the apply job sees (:class:`Lag`): how long after its grid point each new
  segment's file was last modified, per its listing (no extra request). Slow storage or a reader
  late to seal raises it, so a pass does not start just before the seal it waits for.

Failure modes: hosts whose clocks disagree (no NTP) put seals and passes at an arbitrary phase
again: freshness is then what it is without alignment, never wrong. A wall clock stepped back
or forth moves the grid: the next seal comes at most a seal period after its segment opened
(the reader's deadline runs on the monotonic clock), the next pass at most an interval and a
period after the last one (:func:`wait`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

# How long a segment stays open at most (``reader.segmentMaxSeconds``): by default half the apply
# trigger interval, within these bounds (seconds); the reader on its own seals every SEAL_MAX_S.
SEAL_MIN_S, SEAL_MAX_S = 0.5, 10.0
LAG_DEFAULT_S = 0.05  # before any seal was seen: a local seal takes a few milliseconds
LAG_MARGIN_S = 0.02  # added to the slowest recent seal
EARLY_S = 0.02  # a file's time may read this much before its seal (Linux stamps files with a
# coarse clock, a tick behind: measured up to 14 ms before the grid point the seal followed)
LAG_SEALS = 20  # the recent seals the lag follows...
LAG_OUTLIERS = 4  # ... but for this many of the slowest (of a full window)


def until_grid(wall: float, period: float) -> float:
    """Seconds from the wall time ``wall`` to the next multiple of ``period`` (after it)."""
    return period - math.fmod(wall, period) if period > 0 else 0.0


def after_grid(wall: float, period: float) -> float:
    """Seconds from the grid point (a multiple of ``period``) a seal at the wall time ``wall``
    followed: in [-:data:`EARLY_S`, ``period`` - :data:`EARLY_S`) — a file time a little before
    a grid point is a seal right at it."""
    return math.fmod(wall + EARLY_S, period) - EARLY_S


def aligned(interval: float, period: float) -> bool:
    """Whether passes every ``interval`` can follow seals every ``period``: a whole multiple."""
    return period > 0 and abs(interval / period - round(interval / period)) < 1e-6


def next_start(previous: float, interval: float, period: float, lag: float) -> float:
    """The wall time of the next pass after one that started at ``previous``: the grid point
    (a multiple of ``period``, plus ``lag``) nearest ``previous + interval`` — or that time
    itself when the interval is no multiple of the period (see :func:`aligned`)."""
    if not aligned(interval, period):
        return previous + interval
    target = previous + interval - lag
    return round(target / period) * period + lag


def wait(previous: float, interval: float, period: float, lag: float, now: float) -> float:
    """Seconds from the wall time ``now`` until :func:`next_start`: 0 when it has passed (a pass
    that ran longer is followed at once), and never more than an interval and a seal period
    (a wall clock stepped back, e.g. by NTP, does not stop the passes)."""
    return min(interval + period, max(0.0, next_start(previous, interval, period, lag) - now))


class Lag:
    """How long after its grid point a seal becomes visible to the apply job's listing: of the
    last :data:`LAG_SEALS` seals the fifth-slowest (a seal by size or at a stop is off the grid:
    a few may be; fewer seals, fewer ignored) plus a margin. A file time up to :data:`EARLY_S`
    before a grid point counts as a seal right at it."""

    def __init__(self, period: float) -> None:
        self.period = period
        self._delays: deque[float] = deque(maxlen=LAG_SEALS)

    def observe(self, modified: Iterable[float]) -> None:
        """The last-modified times (Unix seconds) of segments sealed since the last listing."""
        if self.period > 0:
            self._delays.extend(after_grid(t, self.period) for t in modified)

    @property
    def seconds(self) -> float:
        if not self._delays:
            return LAG_DEFAULT_S
        delays = sorted(self._delays)
        slow = delays[len(delays) - 1 - len(delays) * LAG_OUTLIERS // LAG_SEALS]
        return slow + LAG_MARGIN_S  # (in [0, period): delays lie in [-EARLY_S, period - EARLY_S))
