"""A reader whose parent died ends, even when its main thread cannot notice.

Local mode starts the reader through :mod:`lakeslot.local.deathsig`: Linux sends it SIGTERM when
the run dies, and the reader stops gracefully. But Python runs a signal handler only when the
main thread is back in the interpreter, and a main thread blocked in a C call that retries on
``EINTR`` (libpq waiting on its socket does) may not get there. Seen once in 64 rounds of the
chaos soak: a killed run's reader logged nothing more, did not exit, and held the slot for a
minute until the next run stopped it.

Invariant: once the parent at start is gone (``getppid()`` changed), the reader has
``grace_s`` to stop by itself; then this watcher writes every thread's stack to stderr (the
reader's log: where the stop hung) and ends the process with exit 1 (:func:`os._exit`: no
clean-up can hang it). It is not armed when the parent at start is PID 0 or 1 (a container's
first process, or already adopted): there is nothing to outlive.

Failure modes: none of its own. A stack dump in the reader's log is the evidence of a hung stop.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from lakeslot.exits import EXIT_FAILED

log = logging.getLogger(__name__)
GRACE_S = 10.0  # a graceful stop takes well under a second: seals or aborts one segment


def watch(grace_s: float = GRACE_S, *, interval_s: float = 1.0,
          getppid: Callable[[], int] = os.getppid,
          dump: Callable[[], None] = lambda: faulthandler.dump_traceback(sys.stderr),
          end: Callable[[int], None] = os._exit) -> threading.Thread | None:
    """Start the watcher (a daemon thread) for this process's current parent; None when not
    armed (see the module docstring)."""
    parent = getppid()
    if parent <= 1:
        return None

    def run() -> None:
        while getppid() == parent:
            time.sleep(interval_s)
        time.sleep(grace_s)
        log.error("the reader's parent (pid %d) is gone and the reader did not stop within "
                  "%.0f s: ending it; every thread's stack follows", parent, grace_s)
        dump()
        end(EXIT_FAILED)

    thread = threading.Thread(target=run, name="reader-orphan-watch", daemon=True)
    thread.start()
    return thread
