"""Staging for the exact check: which keys of a table changed between the source snapshot ``P``
and the mirror position ``L`` (the "in-flight" keys), read from the sealed segments.

Invariants:

- Segments may be deleted by retention as soon as every table applied them, so a watcher copies
  each segment that appears in staging while the check runs (:class:`SegmentCache`); a segment
  that existed before the check started ends at or below every ``P`` (its end was a WAL position
  already written then) and is not needed. Copies of segments ending at or below the current
  ``P`` are dropped (:meth:`SegmentCache.need_above`).
- The changes of ``(P, L]`` are read from a gap-free chain of segments (:func:`lakeslot.staging.segments.chain`);
  rows a zombie's overlapping segment repeats below the previous segment's end are read once.
- A key is in flight when a change committed in ``(P, L]`` carries it in its new or its old
  tuple, mapped like the rows' keys (so it compares with them). A TRUNCATE, or a change that
  does not carry its key, puts the whole table in flight.

Failure modes: if staging does not cover ``(P, L]`` after all (a gap, segments already deleted,
one deleted while read), :meth:`SegmentCache.changes` says so instead of answering, and that
round decides nothing for that table (the next one tries again). Listing staging in the watcher
may fail briefly (logged; a gap is detected when reading). Which keys are in flight comes from
staging, the pipeline's own record of the changes: a change the reader lost inside ``(P, L]``
leaves that key looking equal in that round (the mirror still matches the source at ``P``
there), and shows as a difference in any later check, whose snapshot is past it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow.compute as pc
from pyarrow import fs as pafs

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.mirror import typemap
from lakeslot.staging.segments import CHANGE_OPS, GapError, Segment, SegmentName, chain
from lakeslot.staging.store import Staging

log = logging.getLogger(__name__)

SEGMENT_POLL_S = 0.1  # how often staging is listed for new segments


class SegmentCache:
    """Local copies of the sealed segments that appear in staging while a check runs, so that
    retention (which may delete a segment once every table applied it) cannot take away the
    changes of ``(P, L]`` before they are read. Segments present when the cache starts are not
    copied: they end at or below every later snapshot's ``P`` (see the module docstring) and are
    read from staging if ever asked for. Use as a context manager: a thread polls staging."""

    def __init__(self, staging_uri: str, interval: float = SEGMENT_POLL_S) -> None:
        self.staging = Staging(staging_uri)
        self._directory = tempfile.TemporaryDirectory(prefix="lakeslot-verify-")
        self.copies = Staging(self._directory.name)
        self._initial = set(self.staging.list())
        self._copied: set[SegmentName] = set()
        self._floor = 0  # segments ending at or below it are no longer needed
        self._interval = interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="verify-segments", daemon=True)

    def __enter__(self) -> SegmentCache:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._directory.cleanup()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except OSError as e:  # staging briefly unreachable: a gap is detected when reading
                log.warning("listing staging failed: %s", e)

    def need_above(self, position: int) -> None:
        """From now on only segments with commits above ``position`` are needed."""
        with self._lock:
            self._floor = max(self._floor, position + 1)
            for name in [n for n in self._copied if n.end <= self._floor]:
                self._copied.discard(name)
                os.unlink(f"{self.copies.path}/{name.filename}")

    def poll(self) -> None:
        """Copy every new segment that may still be needed."""
        with self._lock:
            for name in self.staging.list():
                if name in self._initial or name in self._copied or name.end <= self._floor:
                    continue
                final = f"{self.copies.path}/{name.filename}"
                partial = f"{self.copies.path}/.partial-{name.filename}"
                try:
                    pafs.copy_files(f"{self.staging.path}/{name.filename}", partial,
                                    source_filesystem=self.staging.fs,
                                    destination_filesystem=pafs.LocalFileSystem())
                except OSError:  # deleted by retention first: reading (P, L] will see the gap
                    continue
                os.replace(partial, final)
                self._copied.add(name)

    def changes(self, table: TableName, low: int, high: int) -> list[Segment] | str:
        """The segments with the changes of ``table`` committed in ``(low, high]``, each
        holding only those rows; or why staging does not cover that range. An empty range (the
        mirror exactly at the snapshot: ``high == low``) holds no change and needs no segment."""
        if high <= low:
            return []
        self.poll()
        with self._lock:
            copied = set(self._copied)
        staged = set(self.staging.list())
        try:
            names = [n for n in chain(sorted(copied | staged), low + 1) if n.start <= high]
        except GapError as e:
            return f"staging does not cover {_range(low, high)}: {e}"
        if not names or names[0].start > low + 1 or names[-1].end <= high:
            return f"staging does not cover {_range(low, high)} (segments already deleted)"
        try:
            return list(self._read(names, table, low, high, copied))
        except OSError as e:  # a staged segment deleted by retention since it was listed
            return f"staging does not cover {_range(low, high)}: {e}"

    def _read(self, names: list[SegmentName], table: TableName, low: int, high: int,
              copied: set[SegmentName]) -> Iterator[Segment]:
        floor = 0  # rows of a zombie's overlapping segment below the previous end: already read
        for name in names:
            segment = (self.copies if name in copied else self.staging).read(name)
            rows = segment.table
            commit = rows["commit_lsn"]
            mask = pc.and_(pc.and_(pc.equal(rows["schema"], table.schema),
                                   pc.equal(rows["table"], table.name)),
                           pc.and_(pc.greater(commit, max(low, floor - 1)),
                                   pc.less_equal(commit, high)))
            yield Segment(segment.metadata, rows.filter(pc.fill_null(mask, False)))
            floor = name.end


def _range(low: int, high: int) -> str:
    return f"({lsn_text.format(low)}, {lsn_text.format(high)}]"


@dataclass(frozen=True)
class InFlight:
    """The keys changed in ``(P, L]``: ``keys`` (repr of the mapped key → the key), or ``whole``
    (why the whole table is in flight)."""

    keys: dict[str, ChangedKey]
    whole: str | None = None


@dataclass(frozen=True, order=True)
class ChangedKey:
    values: tuple  # mapped like the rows' keys
    texts: tuple[str, ...]  # PostgreSQL text forms (how the source is asked for the row)


def changed_keys(segments: Iterable[Segment], columns: tuple[typemap.ColumnMapping, ...]
                 ) -> InFlight:
    """The keys that the changes in ``segments`` touched, from new and old tuples, mapped like
    the rows (so they compare with the rows' keys); a TRUNCATE, or a change that does not carry
    its key, puts the whole table in flight."""
    key_columns = [c for c in columns if c.required]
    names = [c.name for c in key_columns]
    texts: list[tuple] = []
    for segment in segments:
        for row in segment.rows():
            if row.op == "T":
                return InFlight({}, f"truncated at {lsn_text.format(row.commit_lsn)}")
            if row.op not in CHANGE_OPS:
                continue
            tuples = ([row.new] if row.op in "IU" else []) + ([row.old] if row.op in "UD" else [])
            for values in tuples:
                if values is None and row.op == "U":
                    continue  # no old tuple: the key did not change
                key = tuple((values or {}).get(n) for n in names)
                if not all(isinstance(v, str) for v in key):
                    return InFlight({}, f"a change at {lsn_text.format(row.commit_lsn)} does not "
                                        "carry its key")
                texts.append(key)
    if not texts:
        return InFlight({})
    try:
        mapped = [c.from_text([t[i] for t in texts]).to_pylist() for i, c in enumerate(key_columns)]
    except typemap.UnmappableValue as e:
        return InFlight({}, f"a changed key cannot be mapped: {e}")
    return InFlight({repr(tuple(k)): ChangedKey(tuple(k), t)
                     for k, t in zip(zip(*mapped, strict=True), texts, strict=True)})
