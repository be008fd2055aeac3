"""The apply job's driver reads each sealed segment of a pass from memory: fetched whole, once.

On an object store every open of a file is a round trip or two (pyarrow's ``HEAD`` for the size,
then a ``GET`` per read), and a pass opened each segment several times — its footer and small
columns for the plan (:func:`lakeslot.apply.spread.scan`), its rows for the reduction the
driver makes itself (:func:`lakeslot.apply.spread.reduce` ``here``) —, one after the other:
at 30 ms a request, that was most of a pass. :class:`SegmentCache` is the driver's
:class:`~lakeslot.staging.store.Staging`: the scan tells it the batch's segments
(:meth:`~lakeslot.staging.store.Staging.read_ahead`), it fetches those it does not hold whole,
:data:`FETCHERS` at a time, and every later read of them in the driver — the scan's, the
driver's reduction's, the next passes' while a table's position keeps them in the batch — is
parsed from memory. A segment costs two requests in all (pyarrow's ``HEAD``, then one ``GET``:
its Python API opens a file by path only), fetched concurrently with the batch's others.

The Spark executors (the reduction of larger batches, and a MERGE's that falls back from the
driver's row delta) are other processes: each task that reads row groups of a batch is given a
:class:`TaskSegments`, which fetches the segments of its units whole first, :data:`FETCHERS` at
a time, and parses every later read of them — the compact rows', the winners', the folded
changes' — from memory (at 30 ms a request, a 6,000-change batch's row groups read part by part
one after the other cost a 200-table pass half a minute).

Invariants:

- What is held is a segment's file as it was listed: held by name with its size and time of
  modification from the pass's listing, and fetched only when the bytes fetched are that size.
  A later listing that shows another size or time (a zombie reader's copy replaced it: DESIGN.md
  rule 5 makes the content the same, not the bytes — another pyarrow writes another footer) or
  no longer shows it (retention, or deleted by hand) drops it; so does a delete through this
  object (retention).
- Memory is bounded (DESIGN.md "Scale": the driver's memory does not grow with a batch): a
  segment larger than :data:`LARGEST_BYTES` is never held, and at most :data:`BUDGET_BYTES` are
  held in all; what does not fit is read from staging as before, part by part. Only the segments
  of the current batch are held: those below it (every table's position is past them) are
  dropped when the next batch is read ahead.
- On a local filesystem nothing is held: reading a file costs no round trip.
- An executor task holds at most :data:`TASK_BUDGET_BYTES` (its Python memory is Spark's
  overhead, per core), no segment larger than :data:`LARGEST_BYTES`, and only for the task; a
  segment is held only when the bytes fetched are the size its open found (a copy replaced in
  between is read part by part, as before).

Failure modes: a fetch that fails raises the storage's ``OSError`` from the scan, as a read of
staging there did before (the pass fails as a whole; the next one lists and fetches again).
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
from pyarrow import fs as pafs

from lakeslot.staging.segments import SegmentName
from lakeslot.staging.store import Sealed, Staging

LARGEST_BYTES = 16 << 20  # a segment larger than this is read from staging part by part
BUDGET_BYTES = 96 << 20  # held at most (the driver's Python memory sits in Spark's overhead)
FETCHERS = 8  # segments fetched at a time
TASK_BUDGET_BYTES = 32 << 20  # held at most by one executor task (TaskSegments)


class SegmentCache(Staging):
    """Staging as the apply job's driver reads it (see the module docstring)."""

    def __init__(self, uri: str, *, largest: int = LARGEST_BYTES, budget: int = BUDGET_BYTES,
                 fetchers: int = FETCHERS) -> None:
        super().__init__(uri)
        self.largest, self.budget, self.fetchers = largest, budget, fetchers
        self._lock = threading.Lock()
        self._listed: dict[SegmentName, Sealed] = {}  # the last listing's, by name
        self._held: dict[SegmentName, tuple[Sealed, pa.Buffer]] = {}

    @property
    def held(self) -> dict[SegmentName, int]:
        """The segments held, with their sizes."""
        with self._lock:
            return {name: buffer.size for name, (_, buffer) in self._held.items()}

    def sealed(self) -> builtins.list[Sealed]:
        listing = super().sealed()
        with self._lock:
            self._listed = {s.name: s for s in listing}
            self._held = {n: held for n, held in self._held.items() if self._listed.get(n) == held[0]}
        return listing

    def delete(self, name: SegmentName) -> None:
        with self._lock:
            self._held.pop(name, None)
            self._listed.pop(name, None)
        super().delete(name)

    def read_ahead(self, names: Sequence[SegmentName]) -> None:
        """Hold the segments of ``names`` (a batch, in order), and only those: fetch those not
        held that fit, earliest first, :attr:`fetchers` at a time."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            return
        with self._lock:
            wanted = set(names)
            self._held = {n: held for n, held in self._held.items() if n in wanted}
            room = self.budget - sum(buffer.size for _, buffer in self._held.values())
            todo: list[Sealed] = []
            for name in names:
                listed = self._listed.get(name)
                if name in self._held or listed is None or listed.size is None:
                    continue
                if listed.size <= min(self.largest, room):
                    todo.append(listed)
                    room -= listed.size
        if not todo:
            return
        with ThreadPoolExecutor(min(self.fetchers, len(todo)),
                                thread_name_prefix="lakeslot-segments") as pool:
            fetched = list(pool.map(lambda s: self.read_whole(s.name), todo))
        with self._lock:
            for listed, buffer in zip(todo, fetched, strict=True):
                # (a copy that replaced it since the listing is read from staging, until listed)
                if buffer.size == listed.size and self._listed.get(listed.name) == listed:
                    self._held[listed.name] = (listed, buffer)

    def _input(self, name: SegmentName) -> pa.NativeFile:
        with self._lock:
            held = self._held.get(name)
        return super()._input(name) if held is None else pa.BufferReader(held[1])


class TaskSegments(Staging):
    """Staging as one executor task reads it: the segments ``names`` (its units', in order)
    fetched whole when it is made, :data:`FETCHERS` at a time (see the module docstring)."""

    def __init__(self, uri: str, names: Sequence[SegmentName], *, largest: int = LARGEST_BYTES,
                 budget: int = TASK_BUDGET_BYTES, fetchers: int = FETCHERS) -> None:
        super().__init__(uri, create=False)
        self._held: dict[SegmentName, pa.Buffer] = {}
        todo = list(dict.fromkeys(names))
        if isinstance(self.fs, pafs.LocalFileSystem) or not todo:
            return
        lock, room = threading.Lock(), [budget]

        def fetch(name: SegmentName) -> None:
            with self.fs.open_input_file(self._file(name.filename)) as f:  # (a HEAD: the size)
                size = f.size()
                with lock:
                    if size > min(largest, room[0]):
                        return
                    room[0] -= size
                buffer = f.read_buffer()
            if buffer.size == size:
                self._held[name] = buffer

        with ThreadPoolExecutor(min(fetchers, len(todo)),
                                thread_name_prefix="lakeslot-task-segments") as pool:
            list(pool.map(fetch, todo))

    def _input(self, name: SegmentName) -> pa.NativeFile:
        held = self._held.get(name)
        return super()._input(name) if held is None else pa.BufferReader(held)
