"""``python -m lakeslot.local.deathsig PARENT_PID -- COMMAND...``: become COMMAND, but die with
the parent.

Linux sends the process ``SIGTERM`` when the thread that forked it exits
(``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``), so a child of a local run never outlives
it, even when the run is killed with ``kill -9``. If the parent died before the signal was
armed (``getppid()`` is no longer ``PARENT_PID``), it exits at once instead of running.

Deliberately tiny (standard library only): it runs before every reader start.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        sys.exit("usage: python -m lakeslot.local.deathsig PARENT_PID -- COMMAND...")
    parent, command = int(argv[0]), argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        sys.exit(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:
        sys.exit(0)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
