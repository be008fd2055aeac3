"""The processes below a process, read from ``/proc`` (Linux): how a local run makes sure it
leaves nothing behind (Spark's JVM and Python workers, the reader), and how tests check it.

Failure mode: a process that exits while the tree is read is simply not listed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def _parent(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, grandchildren, ...), zombies included."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _parent(entry)
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (not exited, not zombies)."""
    living = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    living.add(pid)
        except OSError:
            pass
    return living


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """Wait up to ``timeout`` for ``pids`` to exit; SIGTERM, then SIGKILL, what remains.
    Returns the pids that had to be signalled."""
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = alive(pids)
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive(left):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        end = time.monotonic() + 5
        while alive(left) and time.monotonic() < end:
            time.sleep(0.1)
    return left
