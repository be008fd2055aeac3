"""The exact check (:func:`verify`, ``lakeslot verify``): equality at one LSN while the source is
being written and the pipeline runs. One round:

1. A source snapshot with a known LSN ``P`` — the snapshot leader's own method
   (:func:`lakeslot.source.exported_snapshot.exported_snapshot`: a temporary slot created with
   USE_SNAPSHOT, ``P = consistent point − 1``: exactly the transactions committed at or below
   ``P`` are visible). Each table is read in a session that imported it (:mod:`.source`).
2. The mirror: wait (up to ``timeout``) until the table has an Iceberg snapshot whose
   ``lakeslot.lsn`` is ``≥ P``, and read the first such snapshot (time travel); its position is
   ``L`` (:mod:`.mirror`). By DESIGN.md invariant 1 the mirror there must equal the source as of
   ``L``.
3. Staging: the keys of the table that transactions with a commit LSN in ``(P, L]`` changed
   (new and old tuples; a TRUNCATE makes the whole table in flight: :mod:`.inflight`). Every
   other key has the same content in the source at ``P`` and at ``L``, so for it
   ``source@P ≠ mirror@L`` is a real divergence (:mod:`.diff`) — no false alarm, and nothing the
   mirror got wrong there is missed. If the table's definition or storage changed after ``P``
   (DDL, TRUNCATE, a rewrite: the catalog as of ``P`` differs from the catalog after ``L`` was
   chosen), the whole table is in flight.
4. The changed ("in-flight") keys are checked again in the next round with a fresh ``P``, only
   those keys; keys still changing after the last round are reported as not compared (changing
   continuously), never as a difference (:mod:`.report`).

Limits: a pipeline must be running (the mirror must reach ``P``); a key that changes in every
round is not compared; the first round holds each whole table of both sides in memory (Arrow),
one table at a time, later rounds only the in-flight keys (the mirror side pruned by key for a
single integer or text key only). Which keys are in flight comes from staging, the pipeline's
own record of the changes: a change the reader lost inside ``(P, L]`` leaves that key looking
equal in that round, and shows as a difference in any later check, whose snapshot is past it.

Failure modes: a table the check cannot settle is ``incomplete`` with the reason (it does not
exist as of ``P``; it cannot be mirrored as configured; the mirror stayed behind ``P`` for
``timeout`` seconds, or the apply job stopped it; the whole table was in flight in the last
round); a mirror lacking source columns is ``different``. A source value that has no mapping
raises :class:`lakeslot.mirror.typemap.UnmappableValue`; connection and storage errors propagate
(``psycopg.Error``, ``OSError``, :class:`lakeslot.staging.segments.GapError`): ``lakeslot verify``
reports them (exit 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psycopg

from lakeslot import lsn_text
from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.mirror import typemap
from lakeslot.source.columns import ColumnOptions, DescribeError, describe
from lakeslot.source.connection import ConnectionSettings, application_name, connect
from lakeslot.source.exported_snapshot import exported_snapshot, import_statements
from lakeslot.source.tables import existing
from lakeslot.verify.diff import diff, differing_entry, key_of, plain, side
from lakeslot.verify.inflight import ChangedKey, SegmentCache, changed_keys
from lakeslot.verify.mirror import mirror_rows, wait_for_mirror
from lakeslot.verify.report import Round, TableResult, Verification
from lakeslot.verify.source import fingerprint, source_rows
from lakeslot.workloads import JobInput

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_ROUNDS = 3


@dataclass
class _TableState:
    result: TableResult
    pending: dict[str, ChangedKey] | None = None  # keys to check (None: the whole table)
    pending_reason: str | None = None  # why the whole table is pending
    key_names: list[str] | None = None
    done: bool = False


def verify(ingestion: PostgresIngestion, settings: ConnectionSettings, tables: list[TableName],
           *, secrets: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S,
           rounds: int = DEFAULT_ROUNDS, say: Callable[[str], None] = lambda text: None
           ) -> Verification:
    """The exact check of ``tables`` (see the module docstring); ``secrets``: the catalog's
    Secret-backed properties; ``timeout``: the longest wait for the mirror in each round;
    ``say``: progress lines for a person."""
    job = JobInput(ingestion, tuple(tables))
    app = application_name("verify", job.names.owner)
    states = [_TableState(TableResult(t)) for t in tables]
    with SegmentCache(ingestion.spec.staging.uri) as cache, connect(settings, app) as now:
        check = _Check(job, cache, now, secrets, timeout, say)
        for number in range(1, rounds + 1):
            active = [s for s in states if not s.done]
            if not active:
                break
            with exported_snapshot(settings, app) as snapshot:
                cache.need_above(snapshot.lsn)
                say(f"round {number}: source snapshot at {lsn_text.format(snapshot.lsn)}, "
                    f"{len(active)} table(s)")
                deadline = time.monotonic() + timeout
                with connect(settings, app, long_running=True) as conn:
                    for statement in import_statements(snapshot.name):
                        conn.execute(statement)
                    oids = existing(conn, [s.result.table for s in active])
                    for state in active:
                        check.round(state, number, snapshot.lsn, conn,
                                    oids.get(state.result.table), deadline)
                    conn.execute("COMMIT")
    for state in states:
        if not state.done:
            _left_over(state)
    return Verification([s.result for s in states])


def _left_over(state: _TableState) -> None:
    """What the last round left in flight: keys are listed as not compared; a whole table in
    flight means the check could not complete for it."""
    result = state.result
    note = result.rounds[-1].note if result.rounds else ""
    if state.pending is None:
        result.problem = ("not compared after the last round: "
                          + (state.pending_reason or note or "the whole table kept changing"))
        return
    names = state.key_names or []
    result.not_compared.add([{n: plain(v) for n, v in zip(names, k.values, strict=True)}
                             for k in sorted(state.pending.values(), key=repr)])
    result.not_compared_reason = note or None


@dataclass(frozen=True)
class _Check:
    """What every round of every table uses."""

    job: JobInput
    cache: SegmentCache
    now: psycopg.Connection  # autocommit: the catalog as it is now
    secrets: Mapping[str, str] | None
    timeout: float
    say: Callable[[str], None]

    def round(self, state: _TableState, number: int, position: int, conn: psycopg.Connection,
              oid: int | None, deadline: float) -> None:
        """One round of one table (``conn`` holds the snapshot at ``position``): settle what
        it can, leave the in-flight keys pending."""
        result, table = state.result, state.result.table

        def stop(problem: str, mirror_lsn: int | None = None) -> None:
            result.rounds.append(Round(number, position, mirror_lsn, 0, None, problem))
            result.problem, state.done = problem, True

        if oid is None:
            return stop("the table does not exist in the source as of the snapshot "
                        f"{lsn_text.format(position)}")
        try:
            columns = describe(conn, oid, ColumnOptions.of(self.job.table_spec(table)))
        except (typemap.MappingError, DescribeError) as e:
            return stop(f"the table cannot be mirrored as configured: {e}")
        key_names = [c.name for c in columns if c.required]
        if state.key_names not in (None, key_names):
            state.pending = None  # the key changed: compare everything again
        state.key_names = key_names
        before = fingerprint(conn, oid)
        source = source_rows(conn, table, columns, state.pending)
        reached = wait_for_mirror(self.job, table, position, deadline, self.secrets,
                                  self.timeout, self.say)
        if isinstance(reached, str):
            return stop(reached)

        def undecided(note: str, whole: str | None = None) -> None:
            result.rounds.append(Round(number, position, reached.lsn, 0, None, note))
            if whole is not None:
                state.pending, state.pending_reason = None, whole

        if fingerprint(self.now, oid) != before:
            reason = ("its definition or storage changed after the snapshot (DDL, TRUNCATE or "
                      "a rewrite)")
            return undecided(reason, reason)
        mirror = mirror_rows(reached, columns, state.pending)
        if isinstance(mirror, list):
            result.lacking_columns = mirror
            return stop(f"the mirror lacks the source columns {mirror} at "
                        f"{lsn_text.format(reached.lsn)}", reached.lsn)
        if state.pending is None:
            result.source_rows, result.mirror_rows = source.num_rows, mirror.num_rows
        segments = self.cache.changes(table, position, reached.lsn)
        if isinstance(segments, str):
            return undecided(segments)
        flight = changed_keys(segments, columns)
        if flight.whole is not None:
            return undecided(f"the whole table is in flight: {flight.whole}", flight.whole)
        scope = set(state.pending) if state.pending is not None else None
        in_flight = {k: v for k, v in flight.keys.items() if scope is None or k in scope}
        a, b = side(source, key_names), side(mirror, key_names)
        found = diff(a, b, set(in_flight), scope)
        result.compared += found.compared
        result.missing.add([key_of(a.rows, i, key_names) for i in found.missing],
                           found.missing_count)
        result.extra.add([key_of(b.rows, i, key_names) for i in found.extra], found.extra_count)
        result.differing.add([differing_entry(a.rows, b.rows, pair, key_names)
                              for pair in found.differing], found.differing_count)
        result.rounds.append(Round(number, position, reached.lsn, found.compared, len(in_flight)))
        state.pending, state.pending_reason = in_flight, None
        state.done = not in_flight
        return None
