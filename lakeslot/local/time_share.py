"""A local run's periodic reads that compete with the apply job for its process: at most a share
of the run's time each.

Invariant: after a run of the work that took ``t`` seconds, the next is not due before ``t ÷
share`` seconds after that one started — so the work costs at most ``share`` of the run's
time, however many tables it reads and however large their metadata grows (a mirror aged a
day lists ten times the snapshots of a fresh one, and reading hundreds of them each pass took
half the apply job's interpreter lock). Failure modes: none; a run of the work that raises
counts as one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class TimeShare:
    """When work bounded to ``share`` of the time may run next."""

    def __init__(self, share: float) -> None:
        self.share = share
        self._next = 0.0  # (monotonic) when it is due again

    def due(self) -> bool:
        return time.monotonic() >= self._next

    @contextmanager
    def spent(self) -> Iterator[None]:
        """One run of the work: the next is due ``its time ÷ share`` after it started."""
        started = time.monotonic()
        try:
            yield
        finally:
            self._next = started + (time.monotonic() - started) / self.share
