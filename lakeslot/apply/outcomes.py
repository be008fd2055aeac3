"""What the apply job reports: each table's outcome of a pass, the pass's, the run's, the
counters since the job started, and where a pass spends its time — plus the hook points tests
raise from to simulate a crash (or plant a failure) at a named point.

Plain data: :mod:`lakeslot.apply.passes` and :mod:`lakeslot.apply.table_pass` fill them in,
:mod:`lakeslot.staging.apply_status`'s readers see them as the status document
(:meth:`TableOutcome.document`, :meth:`Totals.document`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.apply import spread

# the outcomes of a table its pass went through: its catalog and staging answered, and its mirror
# reflects the pass's batch end (applied, or advanced to it) or already did (current)
WENT_THROUGH = ("applied", "advanced", "current")
POINTS = ("batch-read", "after-evolve", "after-changelog", "before-merge", "after-merge",
          "after-tables", "before-maintenance", "after-retention")


@dataclass(frozen=True)
class Hooks:
    """``point(name, table)`` is called at each point of :data:`POINTS` (table: None for the
    pass-wide points)."""

    point: Callable[[str, TableName | None], None] | None = None

    def __call__(self, name: str, table: TableName | None = None) -> None:
        if self.point is not None:
            self.point(name, table)


@dataclass(frozen=True)
class TableOutcome:
    source: TableName
    target: str
    state: str  # applied | advanced | current | waiting | failed | retrying
    lsn: int | None  # the table's position after the pass
    changes: int = 0
    error: str | None = None
    resnapshot: bool = False
    ddl: tuple[str, ...] = ()  # schema changes applied in place this pass, with their DDL
    committed: int | None = None  # the mirror's lakeslot.lsn when lower than ``lsn``: an idle
    # table's advance not committed yet (lakeslot.apply.coverage)

    @property
    def durable(self) -> int | None:
        """The position the mirror itself records (what a restarted job starts from)."""
        return self.committed if self.committed is not None else self.lsn

    def document(self) -> dict:
        return {"schema": self.source.schema, "name": self.source.name, "target": self.target,
                "state": self.state, "lsn": None if self.lsn is None else lsn_text.format(self.lsn),
                "committedLsn": None if self.committed is None else lsn_text.format(self.committed),
                "changes": self.changes, "error": self.error, "resnapshotRequired": self.resnapshot,
                "schemaChanges": list(self.ddl)}


@dataclass(frozen=True)
class PassResult:
    end: int | None  # end of the batch's last segment (None: nothing sealed)
    capped: bool  # more sealed segments were left for the next batch
    tables: tuple[TableOutcome, ...]
    deleted: int  # segments removed by retention
    steps: dict[str, float] = field(default_factory=dict)  # seconds per step (Steps)
    wall: float = 0.0  # seconds the pass took (its steps add up each thread's time)


@dataclass
class ApplyResult:
    passes: int = 0
    last: PassResult | None = None
    steps: dict[str, float] = field(default_factory=dict)  # seconds per step, every pass

    @property
    def tables(self) -> tuple[TableOutcome, ...]:
        return self.last.tables if self.last else ()

    @property
    def ok(self) -> bool:
        return all(t.state not in ("failed", "retrying") for t in self.tables)


@dataclass
class Totals:
    """What the job did since it started, for counters (the status document's ``totals``; the
    operator exports them, :mod:`lakeslot.observability.metrics`): they only grow while the job
    lives and start again at 0 with a new job (``startedAt`` says when), as Prometheus counters
    do after a restart."""

    started_at: str = field(default_factory=lambda: now_text())
    passes: int = 0
    wall: float = 0.0  # seconds the passes took
    seconds: dict[str, float] = field(default_factory=dict)  # per step of a pass (threads added up)
    changes: dict[str, dict[str, int]] = field(default_factory=dict)  # table → op → changes applied
    retries: dict[str, int] = field(default_factory=dict)  # what → transient failures retried
    maintenance: dict[str, int] = field(default_factory=dict)  # ran | failed → table maintenance runs

    def add_pass(self, result: PassResult, scanned: dict[TableName, spread.TableScan]) -> None:
        self.passes += 1
        self.wall += result.wall
        for step, seconds in result.steps.items():
            self.seconds[step] = self.seconds.get(step, 0.0) + seconds
        for outcome in result.tables:
            if outcome.state == "applied" and outcome.source in scanned:
                ops = self.changes.setdefault(str(outcome.source), {})
                for op, count in scanned[outcome.source].by_op:
                    ops[op] = ops.get(op, 0) + count

    def document(self) -> dict:
        return {"startedAt": self.started_at, "passes": self.passes,
                "wallSeconds": round(self.wall, 6),
                "seconds": {k: round(v, 6) for k, v in self.seconds.items()},
                "changes": self.changes, "retries": self.retries, "maintenance": self.maintenance}


class Steps:
    """Where a pass spends its time: seconds per named step, in the order first timed (a step
    timed in several threads at once adds up each thread's time)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - started


def now_text() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
