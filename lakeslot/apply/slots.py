"""How many tables' work a pass runs at once: ``apply.tableParallelism`` of them on the CPU, and
more of them waiting on the network — on object storage and a REST catalog, a table's commit is
a chain of requests, each tens of milliseconds where the CPU has nothing to do.

Where the tables are reached over a network (:func:`lakeslot.mirror.catalogs.on_network`), a
pass runs its tables on :data:`IN_FLIGHT` × ``tableParallelism`` threads (:func:`threads`, run
by :func:`lakeslot.spark.session.on_threads`); each table's work holds one of
``tableParallelism`` slots (:meth:`Slots.held`) and lets it go only while it waits on the network
(:meth:`Slots.waiting`): loading a table, the requests of a row delta's commit, the first read of
a snapshot's files. On local disk a pass has ``tableParallelism`` threads and nothing lets its
slot go — the work is the CPU's there, and more threads than cores only contend.

Invariants: at most ``tableParallelism`` threads are between :meth:`Slots.held`'s entry and exit
outside a :meth:`Slots.waiting` at any time; a thread gets its slot back before it goes on with
the table's work (a waiting that raises re-acquires it too, then the error goes on).

Failure modes: none of its own: a thread waits for a slot as long as others hold them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

IN_FLIGHT = 4  # threads a pass runs per CPU slot: tables whose requests are in flight at once


def threads(parallelism: int, network: bool) -> int:
    """The threads of a pass's phases run with ``parallelism`` CPU slots: :data:`IN_FLIGHT`
    times as many where the tables are reached over a ``network``, else as many (on local disk
    more threads only contend: measured, 200 busy tables' passes 6.1 s with 8 threads, 8.4 s
    with 32)."""
    return parallelism * IN_FLIGHT if network else parallelism


class Slots:
    """``size`` CPU slots shared by a pass's threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = threading.BoundedSemaphore(size)

    @contextmanager
    def held(self) -> Iterator[None]:
        """A slot for the work within (waiting for one)."""
        with self._free:
            yield

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Within :meth:`held`: the slot let go while the work within waits on the network."""
        self._free.release()
        try:
            yield
        finally:
            self._free.acquire()
