"""Staging or the catalog unreachable during a local run: waited for, never the end of the run.

Invariants (DESIGN.md rule 7: an unreachable staging or catalog is transient):

- Where the run cannot go on without them — its start, the mirrors' progress after the snapshot
  (:mod:`lakeslot.local.run`) — and when the streaming apply job ends on an outage
  (:mod:`lakeslot.local.apply_loop`), the run waits with backoff (:data:`OUTAGE_BACKOFF_S`
  doubling, at most :data:`OUTAGE_BACKOFF_MAX_S`) for as long as the outage lasts, each attempt a
  line saying what it waits for and why. Nothing is lost meanwhile: the mirrors keep their
  positions and the reader confirms nothing it has not sealed.
- What counts as an outage: storage I/O (:data:`lakeslot.errors.TRANSIENT_IO`, with
  :class:`lakeslot.filesystems.StorageError`), a catalog that refuses or cannot be reached
  (:class:`lakeslot.mirror.catalogs.CatalogAccessError`), and the source steps' conditions of
  :data:`OUTAGE_REASONS`.

Failure modes: none of its own; the run stopped while waiting ends the wait (``False``/None).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import TextIO, TypeVar

from lakeslot.errors import TRANSIENT_IO
from lakeslot.local.config import Local
from lakeslot.mirror.catalogs import CatalogAccessError
from lakeslot.observability import status_report

log = logging.getLogger("lakeslot.local")
T = TypeVar("T")

OUTAGE_REASONS = frozenset({"StagingUnreachable"})  # take_control's conditions that mean it
OUTAGE_ERRORS: tuple[type[Exception], ...] = (*TRANSIENT_IO, CatalogAccessError)
OUTAGE_BACKOFF_S, OUTAGE_BACKOFF_MAX_S = 1.0, 60.0


def kind(error: BaseException) -> str:
    """Which outage ``error`` (one of :data:`OUTAGE_ERRORS`) is: ``catalog`` or ``staging``."""
    return "catalog" if isinstance(error, CatalogAccessError) else "staging"


class Outages:
    """Staging or the catalog unreachable where the run cannot go on without them (its start,
    the mirrors' progress after the snapshot): waited for with backoff (:data:`OUTAGE_BACKOFF_S`
    doubling, at most :data:`OUTAGE_BACKOFF_MAX_S`), each attempt a line saying what the run waits
    for and why, until it is back or the run is stopped. The reader and the apply job ride out
    outages themselves once they run (their own retries)."""

    def __init__(self, local: Local, out: TextIO | None, stop: threading.Event) -> None:
        self.out, self.stop = out, stop
        spec = local.ingestion.spec
        self.named = {"staging": f"staging (spec.staging.uri {spec.staging.uri})",
                      "catalog": f"the catalog (sink.catalog {spec.sink.catalog.name})"}

    def announce(self, what: str, why: str, attempt: int) -> float:
        """Say what the run waits for (``what``: staging or catalog) and why; the seconds
        attempt ``attempt`` waits."""
        delay = min(OUTAGE_BACKOFF_MAX_S, OUTAGE_BACKOFF_S * 2 ** (attempt - 1))
        line = f"waiting for {self.named[what]}: {why}; retrying in {delay:.0f} s (attempt {attempt})"
        log.warning("%s", line)
        print(f"lakeslot run: {line}", file=self.out or sys.stderr, flush=True)
        return delay

    def wait(self, what: str, why: str, attempt: int) -> bool:
        """:meth:`announce`, then wait out its backoff; False when the run was stopped meanwhile."""
        return not self.stop.wait(self.announce(what, why, attempt))

    def retrying(self, what: str, action: Callable[[], T]) -> T | None:
        """``action()``, tried again after each outage (:data:`OUTAGE_ERRORS`) of ``what``;
        None when the run was stopped while waiting."""
        attempt = 0
        while True:
            try:
                return action()
            except OUTAGE_ERRORS as e:
                attempt += 1
                if not self.wait(what, status_report.first_line(e), attempt):
                    return None
